"""Provider and host-group admission (bulkheads, lanes, the durable lease store).

A package of its own: it imports nothing of fleet (fleet builds on it, and re-exports
`Route` and `Refused` as `fleet.Route` and `fleet.Refused`). The names below are its
public face; everything else may move.

The provider admission core (reference 000): `policy` (the declared catalog and
policy), `state` (bulkheads and their pure transitions), `scheduler` (pure
decisions) and `pool` (the live pool). Names load on first use.

`store` is the host-group lease store (reference 001): ``admission.store.open_store(url)``.
"""
_LAZY = {
    "AdmissionPool": "admission.pool",
    "ManualClock": "admission.pool",
    "ScaledClock": "admission.pool",
    "Policy": "admission.policy",
    "Refused": "admission.errors",
    "Route": "admission.route",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'admission' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["AdmissionPool", "ManualClock", "Policy", "Refused", "Route", "ScaledClock"]
