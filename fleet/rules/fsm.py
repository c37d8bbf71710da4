"""The worker-slot state machine, as data.

A slot is a persistent worker seat. Its whole state is one 64-bit word in the
shared table (see `fleet.shm.table.layout` for the bit layout): a state, the role it
is leased to, the pin key and a generation that every accepted transition bumps.

Rules this table keeps:

* Idle -> Leased -> Running -> (Pinned | Idle); Running -> Draining -> Idle.
* Leased -> Idle when the lease is lost (T10, beyond the reference's T1..T9): the
  seat's worker died before it started the unit. Without this edge a dead seat's
  lease of a deferrable role could only be walked home through START, which cordon
  refuses: the slot stayed Leased and refused every later grant.
* A transition is legal only if (state, event) is a key of TRANSITIONS. A missing
  key IS the illegal transition: the kernel rejects it and leaves the word as it
  was. In particular: Idle -> Running (a lease is required), Running -> Idle for a
  role that does not return to the pool, Pinned(r, k) -> Pinned(r, k') (re-keying
  is UNPIN then LEASE), Draining -> Leased.
* Guards beyond the table (applied in this order by `decide` and by the kernel):
  the event's role, when given, must be the slot's role; the role's kind must be
  one the transition allows; RESUME must name the pinned key; a role whose cordon
  class the posture halts (`fleet.rules.cordon`: `deferrable` while Cordoned) cannot
  be leased or start running (in-flight work is never touched: DRAIN and DRAINED stay legal).

The numba kernel's lookup arrays, the conformance tests' cases and the docs'
transition list are all generated from TRANSITIONS, so they cannot drift apart.
This module imports only the vocabulary and the cordon's rule: it is the slot vocabulary
every other module shares.
"""
from fleet.rules import cordon
from fleet.rules.vocab import (  # noqa: F401 - re-exported: the slot FSM's callers read them here
    CLASS_DEFERRABLE,
    CLASS_FLOOR,
    CLASS_NAMES,
    CLASS_NEVER,
    CORDONED,
    NOMINAL,
    POSTURE_NAMES,
)

# --- slot states ----------------------------------------------------------------
IDLE = 0
LEASED = 1
RUNNING = 2
PINNED = 3
DRAINING = 4

STATE_NAMES = ("Idle", "Leased", "Running", "Pinned", "Draining")
N_STATES = len(STATE_NAMES)

#: States in which a slot holds a role (everything but Idle).
HELD_STATES = frozenset({LEASED, RUNNING, PINNED, DRAINING})
#: States in which a slot owes an outcome for a unit.
BUSY_STATES = frozenset({RUNNING, DRAINING})

# --- events ---------------------------------------------------------------------
LEASE = 0  # T1  dispatch grants a unit (or a pin claim) to an idle slot
START = 1  # T2  the worker dequeues the unit / claims the pin
PIN_KEYED = 2  # T3  a keyed unit completes; the pin survives for the next cycle
PIN_SINGLETON = 3  # T4  the singleton's unit completes; it stays pinned
RELEASE = 4  # T5  a pooled unit completes; back to the pool
RESUME = 5  # T6  the next unit for the same key on a pinned slot
DRAIN = 6  # T7  cordon onset / resize mid-unit: finish, take nothing new
DRAINED = 7  # T8  the draining unit is done
UNPIN = 8  # T9  explicit rebalance at an epoch boundary
VACATE = 9  # T10 the lease is lost before its unit started (the seat's worker died)

EVENT_NAMES = (
    "LEASE",
    "START",
    "PIN_KEYED",
    "PIN_SINGLETON",
    "RELEASE",
    "RESUME",
    "DRAIN",
    "DRAINED",
    "UNPIN",
    "VACATE",
)
N_EVENTS = len(EVENT_NAMES)
#: The start event of a child that rides its parked parent's slot (fleet.rules.dispatch):
#: no slot transition, so outside the events above; a grant and a worker both read it.
RIDE = 0xFF

# --- role kinds (shared with fleet.rules.roles) ------------------------------------------
KIND_PINNED = 0  # keyed: one persistent pin per key (solver bins)
KIND_POOLED = 1  # any free slot; back to the pool after each unit
KIND_SINGLETON = 2  # exactly one, always pinned (merge)
KIND_NAMES = ("pinned", "pooled", "singleton")
ALL_KINDS = frozenset({KIND_PINNED, KIND_POOLED, KIND_SINGLETON})

# Cordon classes and postures are fleet.rules.vocab's; what a posture does to a class is
# fleet.rules.cordon's (the gate on T1/T2/T6 for the classes it halts).

# --- the transition table ---------------------------------------------------------
# (state, event) -> (next state, transition id, role kinds allowed, posture-gated)
# posture-gated: rejected for a role of a class the posture halts (fleet.rules.cordon.halts).
TRANSITIONS = {
    (IDLE, LEASE): (LEASED, "T1", ALL_KINDS, True),
    (LEASED, START): (RUNNING, "T2", ALL_KINDS, True),
    (RUNNING, PIN_KEYED): (PINNED, "T3", frozenset({KIND_PINNED}), False),
    (RUNNING, PIN_SINGLETON): (PINNED, "T4", frozenset({KIND_SINGLETON}), False),
    (RUNNING, RELEASE): (IDLE, "T5", frozenset({KIND_POOLED}), False),
    (PINNED, RESUME): (RUNNING, "T6", frozenset({KIND_PINNED, KIND_SINGLETON}), True),
    (RUNNING, DRAIN): (DRAINING, "T7", ALL_KINDS, False),
    (DRAINING, DRAINED): (IDLE, "T8", ALL_KINDS, False),
    (PINNED, UNPIN): (IDLE, "T9", frozenset({KIND_PINNED, KIND_SINGLETON}), False),
    # Not posture-gated: a lost lease must reach Idle in any posture (it starts nothing).
    (LEASED, VACATE): (IDLE, "T10", ALL_KINDS, False),
}

# --- paths: the sequences of events other modules walk --------------------------
#: How a unit's completion ends its slot, by the role's kind: a keyed unit leaves
#: its pin (T3), the singleton stays pinned (T4), a pooled unit returns the slot to
#: the pool (T5).
COMPLETION = {KIND_PINNED: PIN_KEYED, KIND_SINGLETON: PIN_SINGLETON, KIND_POOLED: RELEASE}

#: How a slot whose worker died walks back to Idle, from each state, through legal
#: transitions only (Idle needs nothing), in any posture. A lost lease is VACATEd
#: (T10), not STARTed: START is posture-gated, so under cordon a deferrable role's
#: lost lease could not get home and would refuse every later grant.
RESET_PATHS = {
    LEASED: (VACATE,),
    RUNNING: (DRAIN, DRAINED),
    DRAINING: (DRAINED,),
    PINNED: (UNPIN,),
}


def walk(state, path):
    """The state a path of events leads to from `state` by the table alone (no
    guards), or None if a step is illegal."""
    for event in path:
        entry = TRANSITIONS.get((state, event))
        if entry is None:
            return None
        state = entry[0]
    return state


# --- why a transition was refused (0 = applied) ----------------------------------
OK = 0
R_ILLEGAL = 1  # (state, event) is not in the table
R_WRONG_ROLE = 2  # the event names a role other than the slot's
R_WRONG_KIND = 3  # the transition does not apply to this role's kind
R_KEY_MISMATCH = 4  # RESUME for a key other than the pinned one
R_CORDONED = 5  # a deferrable role under cordon
R_BAD_SLOT = 6  # slot index out of range
R_BAD_EVENT = 7  # no such event
R_BAD_ROLE = 8  # no such role
R_BAD_KEY = 9  # key does not fit the word, or a key for a role that takes none
R_STALE = 10  # the caller's expected generation is no longer current
R_NOT_TRIED = 11  # chained to an earlier event of a batch that was refused: not attempted

REASON_NAMES = (
    "ok",
    "illegal transition",
    "wrong role",
    "wrong role kind",
    "key mismatch",
    "cordoned",
    "slot out of range",
    "no such event",
    "no such role",
    "bad key",
    "stale generation",
    "not tried: an earlier event of its grant was refused",
)

#: Role argument meaning "whatever role the slot holds" (events other than LEASE).
ANY_ROLE = 255
#: Largest pin key a slot word can carry (24 bits); see fleet.shm.table.layout.
MAX_KEY = (1 << 24) - 1


def decide(state, slot_role, slot_key, event, role, key, kind, cordon_class, posture):
    """Pure reference rule: (reason, next state, next role, next key).

    `kind` and `cordon_class` are those of the role the transition concerns (the
    event's role for LEASE, the slot's otherwise). The numba kernel implements the
    same decision on arrays generated from TRANSITIONS; the conformance tests hold
    the two to each other.
    """
    if not 0 <= event < N_EVENTS:
        return R_BAD_EVENT, state, slot_role, slot_key
    entry = TRANSITIONS.get((state, event))
    if entry is None:
        return R_ILLEGAL, state, slot_role, slot_key
    nxt, _tid, kinds, gated = entry
    if event != LEASE and role != ANY_ROLE and role != slot_role:
        return R_WRONG_ROLE, state, slot_role, slot_key
    if kind not in kinds:
        return R_WRONG_KIND, state, slot_role, slot_key
    if event == LEASE:
        if key < 0 or key > MAX_KEY or (key != 0 and kind != KIND_PINNED):
            return R_BAD_KEY, state, slot_role, slot_key
    if event == RESUME and key != slot_key:
        return R_KEY_MISMATCH, state, slot_role, slot_key
    if gated and cordon.halts(posture, cordon_class):
        return R_CORDONED, state, slot_role, slot_key
    if event == LEASE:
        return OK, nxt, role, key
    if nxt == IDLE:
        return OK, nxt, 0, 0
    return OK, nxt, slot_role, slot_key


def transition_id(state, event):
    """'T1'..'T10' for a legal pair, None for an illegal one."""
    entry = TRANSITIONS.get((state, event))
    return None if entry is None else entry[1]
