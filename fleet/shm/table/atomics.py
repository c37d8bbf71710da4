"""CPU atomics for numba kernels, emitted as LLVM instructions.

numba has no atomics of its own. These intrinsics emit `load atomic acquire`,
`store atomic release`, `cmpxchg` and `atomicrmw add` on an element of a uint64
array that lives in shared memory. They compile into the caller, so kernels stay
cacheable (`cache=True`) and cost a few ns.

They do NO bounds check (an out-of-range index writes wherever it points): callers
check indices first; the kernels in `fleet.shm.table.kernels` do.

A plain array read in a loop may be hoisted by the optimiser and never re-read;
spin or poll only through `load_acquire`.
"""
from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _check(arr, idx):
    return (
        isinstance(arr, types.Array)
        and arr.dtype == types.uint64
        and isinstance(idx, types.Integer)
    )


def _pointer(context, builder, arr_t, idx_t, aryval, idxval):
    ary = context.make_array(arr_t)(context, builder, aryval)
    index = context.cast(builder, idxval, idx_t, types.intp)
    return cgutils.get_item_pointer(context, builder, arr_t, ary, [index], wraparound=False)


@intrinsic
def load_acquire(typingctx, arr, idx):
    """arr[idx] with acquire ordering."""
    if not _check(arr, idx):
        return None

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig.args[0], sig.args[1], *args)
        return builder.load_atomic(ptr, ordering="acquire", align=8)

    return types.uint64(arr, idx), codegen


@intrinsic
def store_release(typingctx, arr, idx, value):
    """arr[idx] = value with release ordering."""
    if not _check(arr, idx) or not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig.args[0], sig.args[1], args[0], args[1])
        val = context.cast(builder, args[2], sig.args[2], types.uint64)
        builder.store_atomic(val, ptr, ordering="release", align=8)
        return context.get_dummy_value()

    return types.void(arr, idx, value), codegen


@intrinsic
def compare_and_swap(typingctx, arr, idx, expected, desired):
    """If arr[idx] == expected, set it to desired; True when it did (seq_cst)."""
    if not _check(arr, idx) or not isinstance(expected, types.Integer) or not isinstance(desired, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig.args[0], sig.args[1], args[0], args[1])
        exp = context.cast(builder, args[2], sig.args[2], types.uint64)
        des = context.cast(builder, args[3], sig.args[3], types.uint64)
        pair = builder.cmpxchg(ptr, exp, des, "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)

    return types.boolean(arr, idx, expected, desired), codegen


@intrinsic
def fetch_add(typingctx, arr, idx, delta):
    """arr[idx] += delta atomically (seq_cst); returns the old value."""
    if not _check(arr, idx) or not isinstance(delta, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig.args[0], sig.args[1], args[0], args[1])
        val = context.cast(builder, args[2], sig.args[2], types.uint64)
        return builder.atomic_rmw("add", ptr, val, "seq_cst")

    return types.uint64(arr, idx, delta), codegen


__all__ = ["compare_and_swap", "fetch_add", "load_acquire", "store_release"]
