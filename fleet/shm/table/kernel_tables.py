"""The constants and tables the transition kernels embed, and the digests that key them.

numba freezes every module-level constant a kernel reads into its compiled code, so
these values are part of each kernel. They live here, apart from `kernels` (which
imports numba), so that a process running the ahead-built kernels
(fleet.shm.table.kernel_load) can tell whether they were built from these very tables
and sources without importing numba or numpy: plain ints and tuples, and the pure rules.

The kernels read the names below as their own globals (`kernels` imports them all, and
makes numpy arrays of the tables and uint64 scalars of the masks: what numba freezes).
"""
from __future__ import annotations

import os

try:  # hashlib's own BLAKE2, without hashlib's import of OpenSSL (~3 ms of each process's start)
    from _blake2 import blake2b
except ImportError:  # an interpreter built without its bundled hashes
    from hashlib import blake2b

from fleet.rules import cordon, fsm
from fleet.shm.table import layout as L

_HERE = os.path.dirname(os.path.realpath(__file__))  # os.path: pathlib is ~3 ms of each process's start


def _tables():
    """(next state, allowed kinds, gated) by (state, event): rows of ints."""
    nxt = [[-1] * fsm.N_EVENTS for _ in range(fsm.N_STATES)]
    kinds = [[0] * fsm.N_EVENTS for _ in range(fsm.N_STATES)]
    gated = [[0] * fsm.N_EVENTS for _ in range(fsm.N_STATES)]
    for (state, event), (to, _tid, allowed, is_gated) in fsm.TRANSITIONS.items():
        nxt[state][event] = to
        kinds[state][event] = sum(1 << k for k in allowed)
        gated[state][event] = int(is_gated)
    return tuple(map(tuple, nxt)), tuple(map(tuple, kinds)), tuple(map(tuple, gated))


_NEXT, _KIND_MASK, _GATED = _tables()

SLOT_FIELDS = L.SLOT_SIZE // L.U64
ROLE_FIELDS = L.ROLE_SIZE // L.U64

# Masks and shifts of the slot word: uint64 in the kernels (`kernels.UINT64_NAMES`).
_STATE_MASK = L.STATE_MASK
_ROLE_MASK = L.ROLE_MASK
_KEY_MASK = L.KEY_MASK
_GEN_MASK = L.GEN_MASK
_ROLE_SHIFT = L.ROLE_SHIFT
_KEY_SHIFT = L.KEY_SHIFT
_GEN_SHIFT = L.GEN_SHIFT

_N_STATES = fsm.N_STATES
_N_EVENTS = fsm.N_EVENTS
_ANY_ROLE = fsm.ANY_ROLE
_LEASE, _RESUME = fsm.LEASE, fsm.RESUME
_IDLE = fsm.IDLE
_KIND_PINNED = fsm.KIND_PINNED
# The cordon's rule (fleet.rules.cordon), compiled in: HALTS by (posture, class), and by class
# whether any posture halts it (so a class no posture halts never loads the posture word).
_HALTS = tuple(tuple(int(h) for h in row) for row in cordon.HALTS)
_MAY_HALT = tuple(max(column) for column in zip(*_HALTS))
_N_POSTURES, _N_CLASSES = len(_HALTS), len(_MAY_HALT)
_MAX_KEY = fsm.MAX_KEY
_OK, _R_ILLEGAL, _R_WRONG_ROLE, _R_WRONG_KIND = fsm.OK, fsm.R_ILLEGAL, fsm.R_WRONG_ROLE, fsm.R_WRONG_KIND
_R_KEY_MISMATCH, _R_CORDONED, _R_BAD_SLOT = fsm.R_KEY_MISMATCH, fsm.R_CORDONED, fsm.R_BAD_SLOT
_R_BAD_EVENT, _R_BAD_ROLE, _R_BAD_KEY, _R_STALE = fsm.R_BAD_EVENT, fsm.R_BAD_ROLE, fsm.R_BAD_KEY, fsm.R_STALE
_R_NOT_TRIED = fsm.R_NOT_TRIED
OP_FIELDS = L.OP_FIELDS
_P_STATE = L.P_STATE
_S_UNIT, _S_DONE = L.S_UNIT, L.S_DONE
_LEASE, _START = fsm.LEASE, fsm.START
_S_LAST_ROLE, _S_SWITCHES = L.S_LAST_ROLE, L.S_SWITCHES
_DRAINING, _DRAINED = fsm.DRAINING, fsm.DRAINED
_R_KIND, _R_CLASS = L.R_KIND, L.R_CLASS


def tables_digest(embedded: dict) -> int:
    """A 60-bit digest of named constants and tables (name -> int, or a table: a tuple of
    ints or of such tuples, or anything with ``tolist()``: a numpy array or scalar)."""
    h = blake2b(digest_size=8)
    for name in sorted(embedded):
        value = embedded[name]
        value = value.tolist() if hasattr(value, "tolist") else value
        raw = repr(_as_tuples(value)).encode()
        h.update(name.encode() + b"=" + raw + b";")
    return int(h.hexdigest()[:15], 16)


def _as_tuples(value):
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else int(value)


def _source_digest(module) -> int:
    return file_digest(module.__file__)


def file_digest(path: str) -> int:
    """A 60-bit digest of a file's bytes."""
    with open(path, "rb") as f:
        return int(blake2b(f.read(), digest_size=8).hexdigest()[:15], 16)


def _embedded() -> dict:
    return {name: value for name, value in globals().items()
            if not name.startswith("__") and isinstance(value, (int, tuple)) and not isinstance(value, bool)}


def build_digest() -> int:
    """What ahead-built kernels must have been built from to be these kernels: every
    constant and table above, and the sources of the kernels (kernels.py), of the atomics
    compiled into them (atomics.py), of their C entry points (kernel_entry.py) and of their
    build (kernel_build.py).
    An edit of any of them, or of a rule whose value lands in a table (fsm.py, cordon.py),
    changes it; `kernel_load` then refuses the stale build and compiles instead."""
    sources = {name: file_digest(os.path.join(_HERE, name))
               for name in ("kernels.py", "atomics.py", "kernel_entry.py", "kernel_build.py")}
    return tables_digest({**_embedded(), **sources})


#: The embedded names, for `kernels` to import as its own globals.
__all__ = sorted(_embedded())
