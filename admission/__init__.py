"""Provider and host-group admission (bulkheads, lanes, the durable lease store).

The provider admission core (reference 000): `policy` (the declared catalog and
policy), `state` (bulkheads and their pure transitions), `scheduler` (pure
decisions) and `pool` (the live pool). Names load on first use.

`store` is the host-group lease store (reference 001): ``admission.store.open_store(url)``.
"""
_LAZY = {
    "Policy": "policy",
    "PolicyError": "policy",
    "PolicyHolder": "policy",
    "AdmissionPool": "pool",
    "FileClosureStore": "pool",
    "ManualClock": "pool",
    "ScaledClock": "pool",
    "SystemClock": "pool",
    "signal_for": "pool",
    "decide": "scheduler",
    "decide_batch": "scheduler",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'admission' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__: list[str] = sorted(_LAZY)
