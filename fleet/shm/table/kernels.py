"""numba transition kernels over the shared table.

These functions are the one source of the kernels. Each is called through a C entry
point over raw pointers (`kernel_entry`), compiled two ways: ahead at install into
object code (`kernel_build`: the module a fleet runs, without numba or numpy), and by
numba at run time, the fallback when that module is missing or stale (`kernel_load`
chooses). An argument is never reassigned (its type is fixed by the entry point's
signature: assign a local instead).

`apply_transition` validates (old word, event) against the slot FSM and installs the
new word with one compare-and-swap. On a lost race it re-reads and re-validates, so
a word the FSM forbids is never written. It returns a reason code (fleet.rules.fsm.OK or
an R_* code) and never raises: bad indices are reason codes, not segfaults.

The FSM's lookup arrays are generated from `fleet.rules.fsm.TRANSITIONS`, and the cordon's
gate from `fleet.rules.cordon.HALTS`; numba freezes
them (and every other module-level constant a kernel reads) into the compiled code,
while its on-disk cache is keyed only on this file's timestamp and each kernel's
bytecode and closure. So every kernel that embeds the FSM is made by a factory and
closes over `TABLES_DIGEST`, a digest of everything embedded: numba puts a closure's
contents in the cache key, and a changed table (an upgrade, an edit of fsm.py) is a
cache miss that recompiles, never a stale kernel enforcing the old rules.

Kernels are compiled without numba's reference-counting runtime (`_nrt=False`): with
it, every call between njit functions increments and decrements each array argument's
refcount with locked instructions, which costs more than the transition itself
(~80 ns against ~19 ns). An njit loop that calls these kernels should be compiled the
same way, or use `apply_batch` (many events, one call from Python).

Kernels keep the GIL (``nogil=False``). Each runs for well under a microsecond; giving
the GIL up around it lets another thread of the process take it, and the caller then
waits a whole switch interval (5 ms) to get it back — the supervisor's loop, which
calls a kernel per grant, would crawl while a caller thread submits.

Field writers (`seq_write`, `add_field`) keep the seqlock discipline for records that
have a single writer: bump the sequence to odd, store the fields, bump it to even,
all with release stores, so a lock-free reader can detect and retry a torn read.
"""
from __future__ import annotations

from fleet.shm.table.numba_env import ensure_cache_dir

#: Whether the kernels go to numba's on-disk cache: False when no cache dir is writable
#: (numba would refuse to compile a ``cache=CACHED`` function without one).
CACHED = ensure_cache_dir() is not None

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from fleet.shm.table import atomics as _atomics  # noqa: E402
from fleet.shm.table.atomics import compare_and_swap, fetch_add, load_acquire, store_release  # noqa: E402
# The constants and tables the kernels embed, defined where a process that loads the
# ahead-built kernels (fleet.shm.table.kernel_load) can digest them without numba.
from fleet.shm.table.kernel_tables import *  # noqa: E402,F403
from fleet.shm.table.kernel_tables import _source_digest, tables_digest  # noqa: E402,F401

# What numba freezes: the tables as int64 arrays, the slot word's masks and shifts as
# uint64 (an int64 in a bitwise expression with a uint64 word would make it a float).
_NEXT, _KIND_MASK, _GATED, _HALTS, _MAY_HALT = (np.array(table, dtype=np.int64)
                                                for table in (_NEXT, _KIND_MASK, _GATED, _HALTS, _MAY_HALT))  # noqa: F405
_STATE_MASK, _ROLE_MASK, _KEY_MASK, _GEN_MASK, _ROLE_SHIFT, _KEY_SHIFT, _GEN_SHIFT = (
    np.uint64(v) for v in (_STATE_MASK, _ROLE_MASK, _KEY_MASK, _GEN_MASK, _ROLE_SHIFT, _KEY_SHIFT, _GEN_SHIFT))  # noqa: F405


#: Digest of every module-level constant and table here (fleet.shm.table.kernel_tables'): the
#: FSM arrays, the fsm codes and the layout's fields, all frozen into the kernels that read them; and
#: of the atomics' source, whose intrinsics are compiled into the kernels too (numba
#: does not notice a change in a callee's module either).
TABLES_DIGEST = tables_digest({
    **{name: value for name, value in globals().items()
       if not name.startswith("__") and isinstance(value, (int, np.integer, np.ndarray)) and not isinstance(value, bool)},
    "atomics.py": _source_digest(_atomics),
})

# How a kernel that embeds the tables is written: a factory taking the digest, whose
# inner function names it once (a no-op statement that puts it in the closure, i.e.
# in numba's cache key). Calls between kernels go through module globals, never
# through a closure (a Dispatcher in a closure would be pickled into the key).


@njit(cache=CACHED, inline="always", _nrt=False)
def pack(state, role, key, gen):
    return (
        (np.uint64(state) & _STATE_MASK)
        | ((np.uint64(role) & _ROLE_MASK) << _ROLE_SHIFT)
        | ((np.uint64(key) & _KEY_MASK) << _KEY_SHIFT)
        | ((np.uint64(gen) & _GEN_MASK) << _GEN_SHIFT)
    )


def _make_decide(tables_digest):
    @njit(cache=CACHED, inline="always", _nrt=False)
    def _decide(old, event, role, key, expected_gen, roles, n_roles, posture):
        """(reason, new word) for `event` on a slot whose word is `old`."""
        tables_digest  # noqa: B018 - in the closure, so in numba's cache key
        state = np.int64(old & _STATE_MASK)
        slot_role = np.int64((old >> _ROLE_SHIFT) & _ROLE_MASK)
        slot_key = np.int64((old >> _KEY_SHIFT) & _KEY_MASK)
        gen = np.int64((old >> _GEN_SHIFT) & _GEN_MASK)
        if expected_gen >= 0 and gen != expected_gen:
            return _R_STALE, old
        if state >= _N_STATES:
            return _R_ILLEGAL, old  # a word no transition could have written
        nxt = _NEXT[state, event]
        if nxt < 0:
            return _R_ILLEGAL, old
        if event != _LEASE and role != _ANY_ROLE and role != slot_role:
            return _R_WRONG_ROLE, old
        r = role if event == _LEASE else slot_role
        if r >= n_roles:
            return _R_BAD_ROLE, old
        kind = np.int64(roles[r * ROLE_FIELDS + _R_KIND])
        klass = np.int64(roles[r * ROLE_FIELDS + _R_CLASS])
        if (_KIND_MASK[state, event] >> kind) & 1 == 0:
            return _R_WRONG_KIND, old
        if event == _LEASE and (key < 0 or key > _MAX_KEY or (key != 0 and kind != _KIND_PINNED)):
            return _R_BAD_KEY, old
        if event == _RESUME and key != slot_key:
            return _R_KEY_MISMATCH, old
        if _GATED[state, event] != 0 and 0 <= klass < _N_CLASSES and _MAY_HALT[klass] != 0:
            p = np.int64(load_acquire(posture, _P_STATE))
            if 0 <= p < _N_POSTURES and _HALTS[p, klass] != 0:
                return _R_CORDONED, old
        new_gen = gen + 1
        if event == _LEASE:
            return _OK, pack(nxt, r, key, new_gen)
        if nxt == _IDLE:
            return _OK, pack(nxt, 0, 0, new_gen)
        return _OK, pack(nxt, slot_role, slot_key, new_gen)

    return _decide


_decide = _make_decide(TABLES_DIGEST)


@njit(cache=CACHED, inline="always", _nrt=False)
def _count_lease(slots, idx, role):
    """The role census of a slot just leased (T1) for `role`: a lease for another role
    than the last one is a role switch. The runtime has one leaser (the supervisor's
    dispatch), so it is the census's one writer and a read-then-store is safe; leasers
    racing on one slot could at worst miscount the census, never the slot word."""
    last = load_acquire(slots, idx + _S_LAST_ROLE)
    now = np.uint64(role + 1)
    if last != now:
        if last != np.uint64(0):
            fetch_add(slots, idx + _S_SWITCHES, np.uint64(1))
        store_release(slots, idx + _S_LAST_ROLE, now)


def _make_apply_transition(tables_digest):
    @njit(cache=CACHED, nogil=False, _nrt=False)
    def apply_transition(slots, roles, n_roles, posture, slot, event, role, key, expected_gen):
        """Apply one event to one slot; returns fsm.OK or the reason it was refused.

        Args:
            slots: uint64 view of the slots region; roles: of the roles region;
            posture: of the posture record. n_roles: declared roles.
            role: the role the event concerns (fsm.ANY_ROLE: the slot's own).
            key: pin key for LEASE / RESUME, else ignored.
            expected_gen: apply only if the slot's generation is this (-1: any).
        """
        tables_digest  # noqa: B018 - in the closure, so in numba's cache key
        n_slots = slots.size // SLOT_FIELDS
        if slot < 0 or slot >= n_slots:
            return _R_BAD_SLOT
        if event < 0 or event >= _N_EVENTS:
            return _R_BAD_EVENT
        if role != _ANY_ROLE and (role < 0 or role >= n_roles):
            return _R_BAD_ROLE
        if event == _LEASE and role == _ANY_ROLE:
            return _R_BAD_ROLE
        idx = slot * SLOT_FIELDS
        while True:
            old = load_acquire(slots, idx)
            reason, new = _decide(old, event, role, key, expected_gen, roles, n_roles, posture)
            if reason != _OK:
                return reason
            if compare_and_swap(slots, idx, old, new):
                if event == _LEASE:
                    _count_lease(slots, idx, role)
                return _OK
            # Lost the race: somebody changed the word; re-read and re-validate.

    return apply_transition


apply_transition = _make_apply_transition(TABLES_DIGEST)


def _make_apply_batch(tables_digest):
    @njit(cache=CACHED, nogil=False, _nrt=False)
    def apply_batch(slots, roles, n_roles, posture, ops, out):
        """Apply a batch of events in order, in one call; returns how many were applied.

        `ops` is flat int64, OP_FIELDS per row: slot, event, role, key, chained. A
        chained row is tried only if the row before it was applied (out: R_NOT_TRIED
        otherwise), so a grant of two events (UNPIN then LEASE) never half-happens past
        a refusal. out[i] gets row i's reason; `out` holds at least one per row.
        """
        tables_digest  # noqa: B018 - in the closure, so in numba's cache key
        applied = 0
        n = min(len(ops) // OP_FIELDS, out.size)
        previous = _OK
        for i in range(n):
            base = i * OP_FIELDS
            if ops[base + 4] != 0 and previous != _OK:
                reason = _R_NOT_TRIED
            else:
                reason = apply_transition(slots, roles, n_roles, posture, ops[base], ops[base + 1], ops[base + 2],
                                          ops[base + 3], -1)
            out[i] = reason
            previous = reason
            if reason == _OK:
                applied += 1
        return applied

    return apply_batch


apply_batch = _make_apply_batch(TABLES_DIGEST)


def _make_start_unit(tables_digest):
    @njit(cache=CACHED, nogil=False, _nrt=False)
    def start_unit(slots, roles, n_roles, posture, slot, event, role, key, unit_id):
        """A worker begins a unit: START or RESUME, then record the unit id. One call.
        LEASE: a unit sent ahead (fleet.rules.dispatch), which the worker leases the Idle slot
        for itself (T1) and then STARTs (T2); a refused LEASE leaves the slot Idle."""
        tables_digest  # noqa: B018 - in the closure, so in numba's cache key
        then = event  # never the argument reassigned: its type is the signature's when built ahead
        if event == _LEASE:
            reason = apply_transition(slots, roles, n_roles, posture, slot, _LEASE, role, key, -1)
            if reason != _OK:
                return reason
            then = np.int64(_START)
        reason = apply_transition(slots, roles, n_roles, posture, slot, then, role, key, -1)
        if reason == _OK:
            store_release(slots, slot * SLOT_FIELDS + _S_UNIT, np.uint64(unit_id))
        return reason

    return start_unit


start_unit = _make_start_unit(TABLES_DIGEST)


def _make_finish_unit(tables_digest):
    @njit(cache=CACHED, nogil=False, _nrt=False)
    def finish_unit(slots, roles, n_roles, posture, slot, event, role):
        """A worker ends a unit with its role's completion event — DRAINED instead when the
        supervisor drained the slot meanwhile — and counts it. Returns reason * 16 + the
        slot's state afterwards (one call instead of three)."""
        tables_digest  # noqa: B018 - in the closure, so in numba's cache key
        reason = apply_transition(slots, roles, n_roles, posture, slot, event, role, 0, -1)
        if reason == _R_ILLEGAL:
            if np.int64(load_acquire(slots, slot * SLOT_FIELDS) & _STATE_MASK) == _DRAINING:
                reason = apply_transition(slots, roles, n_roles, posture, slot, _DRAINED, role, 0, -1)
        if reason == _OK:
            fetch_add(slots, slot * SLOT_FIELDS + _S_DONE, np.uint64(1))
        if slot < 0 or slot >= slots.size // SLOT_FIELDS:
            return reason * 16
        return reason * 16 + np.int64(load_acquire(slots, slot * SLOT_FIELDS) & _STATE_MASK)

    return finish_unit


finish_unit = _make_finish_unit(TABLES_DIGEST)


@njit(cache=CACHED, nogil=False, _nrt=False)
def seq_write(arr, seq_idx, field_idx, values):
    """Seqlocked write of arr[field_idx[i]] = values[i] by the record's single writer."""
    if seq_idx < 0 or seq_idx >= arr.size:
        return False
    for i in range(field_idx.size):
        if field_idx[i] < 0 or field_idx[i] >= arr.size:
            return False
    seq = load_acquire(arr, seq_idx)
    store_release(arr, seq_idx, seq + np.uint64(1))  # odd: write in progress
    for i in range(field_idx.size):
        store_release(arr, field_idx[i], values[i])
    store_release(arr, seq_idx, seq + np.uint64(2))  # even: consistent again
    return True


@njit(cache=CACHED, nogil=False, _nrt=False)
def add_field(arr, idx, delta):
    """Atomic arr[idx] += delta; returns the old value (0 when idx is out of range)."""
    if idx < 0 or idx >= arr.size:
        return np.uint64(0)
    return fetch_add(arr, idx, delta)


@njit(cache=CACHED, nogil=False, _nrt=False)
def store_field(arr, idx, value):
    """Release-store arr[idx] = value (a single-word field with one writer)."""
    if idx < 0 or idx >= arr.size:
        return False
    store_release(arr, idx, value)
    return True


def warm_up(slots, roles, n_roles, posture) -> None:
    """Compile (or load from cache) every kernel with the table's argument types."""
    apply_transition(slots, roles, n_roles, posture, -1, 0, 0, 0, -1)
    ids = np.zeros(0, dtype=np.int64)
    apply_batch(slots, roles, n_roles, posture, ids, ids)
    start_unit(slots, roles, n_roles, posture, -1, 0, 0, 0, 0)
    finish_unit(slots, roles, n_roles, posture, -1, 0, 0)
    seq_write(slots, -1, ids, np.zeros(0, dtype=np.uint64))
    add_field(slots, -1, np.uint64(0))
    store_field(slots, -1, np.uint64(0))
