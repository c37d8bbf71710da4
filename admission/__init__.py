"""Provider and host-group admission (bulkheads, lanes, the durable lease store).

`admission.store` is the host-group lease store (reference 001): ``open_store(url)``.
The provider admission's rules land with the provider-admission work; the package is
declared now so the shared table reserves its bulkhead records and the dispatch path
has a seam for it.
"""
__all__: list[str] = []
