"""The transition kernels' C entry points: numba ``cfunc``s over raw pointers.

Each kernel of `kernels` takes the table's regions as arrays; its entry point here takes
them as (pointer, length in words) pairs, makes the arrays over them (no copy) and calls
the kernel, which numba inlines. So a kernel is callable as a plain C function, with no
numpy on either side of the call: `fleet._table` (native/fleet_table.c) calls it with the
GIL held, over the table's mapping, from the address the process chose (`kernel_load`):

- built at install: `kernel_build` compiles these very entry points to machine code, into
  the extension module ``fleet.shm.table._kernels``, which holds their addresses; a
  process that runs them loads neither numba nor numpy;
- else, at run time: numba compiles them (from its on-disk cache when warm) and gives
  each one's address (`addresses`).

The C side declares the same signatures (``fleet_kernel_*_fn`` in native/fleet_table.c):
a change here is a change there. `tests/shm/test_table_kernels.py` runs every FSM
vector through both builds.

Only the run-time fallback and the build import this module (it imports numba).
"""
from __future__ import annotations

from numba import carray, cfunc
from numba import types as t

from fleet.shm.table import kernel_load, kernel_tables
from fleet.shm.table import kernels as K
from fleet.shm.table.kernels import CACHED

_U64P, _I64P, _I64, _U64 = t.CPointer(t.uint64), t.CPointer(t.int64), t.int64, t.uint64
# A table: (slots, words), (roles, words), n_roles, (posture, words).
_TABLE = (_U64P, _I64, _U64P, _I64, _I64, _U64P, _I64)

#: Every entry point and its C signature (native/fleet_table.c's ``*_fn`` types), in the
#: order of `kernel_load.NAMES`.
SIGNATURES = {
    "apply_transition": _I64(*_TABLE, _I64, _I64, _I64, _I64, _I64),
    "apply_batch": _I64(*_TABLE, _I64P, _I64, _I64P, _I64),
    "start_unit": _I64(*_TABLE, _I64, _I64, _I64, _I64, _I64),
    "finish_unit": _I64(*_TABLE, _I64, _I64, _I64),
    "seq_write": _I64(_U64P, _I64, _I64, _I64P, _U64P, _I64),
    "add_field": _U64(_U64P, _I64, _I64, _U64),
    "store_field": _I64(_U64P, _I64, _I64, _U64),
}
NAMES = kernel_load.NAMES
assert tuple(SIGNATURES) == NAMES

# The kernels the entry points call, as module globals (numba inlines a global
# dispatcher; a dispatcher in a closure would be pickled into the cache key).
_apply_transition, _apply_batch, _start_unit, _finish_unit = (K.apply_transition, K.apply_batch, K.start_unit,
                                                              K.finish_unit)
_seq_write, _add_field, _store_field = K.seq_write, K.add_field, K.store_field


def _make(digest):
    # numba keys its cache of an entry point on this file and the closure, not on the
    # kernels it calls: the digest of every source and table they are built from
    # (kernel_tables.build_digest) is in the closure, so an edit of any is a cache miss.
    def entry(sig):
        return cfunc(sig, cache=CACHED)

    @entry(SIGNATURES["apply_transition"])
    def apply_transition(sp, sn, rp, rn, n_roles, pp, pn, slot, event, role, key, expected_gen):
        digest  # noqa: B018 - in the closure, so in numba's cache key
        return _apply_transition(carray(sp, (sn,)), carray(rp, (rn,)), n_roles, carray(pp, (pn,)),
                                 slot, event, role, key, expected_gen)

    @entry(SIGNATURES["apply_batch"])
    def apply_batch(sp, sn, rp, rn, n_roles, pp, pn, ops, n_ops, out, n_out):
        digest  # noqa: B018
        return _apply_batch(carray(sp, (sn,)), carray(rp, (rn,)), n_roles, carray(pp, (pn,)),
                            carray(ops, (n_ops,)), carray(out, (n_out,)))

    @entry(SIGNATURES["start_unit"])
    def start_unit(sp, sn, rp, rn, n_roles, pp, pn, slot, event, role, key, unit_id):
        digest  # noqa: B018
        return _start_unit(carray(sp, (sn,)), carray(rp, (rn,)), n_roles, carray(pp, (pn,)),
                           slot, event, role, key, unit_id)

    @entry(SIGNATURES["finish_unit"])
    def finish_unit(sp, sn, rp, rn, n_roles, pp, pn, slot, event, role):
        digest  # noqa: B018
        return _finish_unit(carray(sp, (sn,)), carray(rp, (rn,)), n_roles, carray(pp, (pn,)), slot, event, role)

    @entry(SIGNATURES["seq_write"])
    def seq_write(ap, an, seq_idx, idx, values, n_fields):
        digest  # noqa: B018
        return 1 if _seq_write(carray(ap, (an,)), seq_idx, carray(idx, (n_fields,)), carray(values, (n_fields,))) else 0

    @entry(SIGNATURES["add_field"])
    def add_field(ap, an, idx, delta):
        digest  # noqa: B018
        return _add_field(carray(ap, (an,)), idx, delta)

    @entry(SIGNATURES["store_field"])
    def store_field(ap, an, idx, value):
        digest  # noqa: B018
        return 1 if _store_field(carray(ap, (an,)), idx, value) else 0

    return {"apply_transition": apply_transition, "apply_batch": apply_batch, "start_unit": start_unit,
            "finish_unit": finish_unit, "seq_write": seq_write, "add_field": add_field, "store_field": store_field}


#: name -> numba cfunc, compiled (or loaded from numba's cache) at import.
ENTRY_POINTS = _make(kernel_tables.build_digest())


def addresses() -> tuple[int, ...]:
    """Each entry point's address, in the order of `NAMES` (numba's run-time build)."""
    return tuple(ENTRY_POINTS[name].address for name in NAMES)
