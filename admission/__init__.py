"""Provider and host-group admission (bulkheads, lanes, the durable lease store).

Declared as a package now so the shared table reserves its bulkhead records and the
dispatch path has a seam for it; the rules land with the provider-admission work.
"""
__all__: list[str] = []
