"""The slot FSM as data: every state x event pair, the listed illegal transitions,
and the guards — against expectations written out here, not derived from the table."""
from __future__ import annotations

import itertools

import pytest

from fleet.rules import fsm
from fleet.rules.fsm import (
    ANY_ROLE,
    CLASS_DEFERRABLE,
    CLASS_FLOOR,
    CLASS_NEVER,
    CORDONED,
    DRAIN,
    DRAINED,
    DRAINING,
    IDLE,
    KIND_PINNED,
    KIND_POOLED,
    KIND_SINGLETON,
    LEASE,
    LEASED,
    NOMINAL,
    PIN_KEYED,
    PIN_SINGLETON,
    PINNED,
    RELEASE,
    RESUME,
    RUNNING,
    START,
    UNPIN,
    VACATE,
)

# The reference's T1..T9 (and T10, the lost lease), written out independently of fsm.TRANSITIONS.
EXPECTED_LEGAL = {
    (IDLE, LEASE): (LEASED, "T1"),
    (LEASED, START): (RUNNING, "T2"),
    (RUNNING, PIN_KEYED): (PINNED, "T3"),
    (RUNNING, PIN_SINGLETON): (PINNED, "T4"),
    (RUNNING, RELEASE): (IDLE, "T5"),
    (PINNED, RESUME): (RUNNING, "T6"),
    (RUNNING, DRAIN): (DRAINING, "T7"),
    (DRAINING, DRAINED): (IDLE, "T8"),
    (PINNED, UNPIN): (IDLE, "T9"),
    (LEASED, VACATE): (IDLE, "T10"),
}
ALL_PAIRS = list(itertools.product(range(fsm.N_STATES), range(fsm.N_EVENTS)))

# The guard columns, written out from 002 §3.3: which role kinds each transition takes,
# and whether it is posture-gated (refused for a deferrable role under cordon). Only
# T1 (a new lease), T2 (starting) and T6 (resuming a pin) take new work, so only they
# are gated; completions (T3, T4, T5) and draining (T7, T8) always go through, or
# in-flight work could not finish under cordon. One row per legal edge: a new edge
# adds a row here (and to EXPECTED_LEGAL).
ALL = ("pinned", "pooled", "singleton")
EXPECTED_GUARDS = {
    "T1": (ALL, True),
    "T2": (ALL, True),
    "T3": (("pinned",), False),
    "T4": (("singleton",), False),
    "T5": (("pooled",), False),
    "T6": (("pinned", "singleton"), True),
    "T7": (ALL, False),
    "T8": (ALL, False),
    "T9": (("pinned", "singleton"), False),
    "T10": (ALL, False),  # a lost lease goes home whatever the posture (a dead seat's reset)
}
KIND_OF = {"pinned": KIND_PINNED, "pooled": KIND_POOLED, "singleton": KIND_SINGLETON}


def test_table_has_exactly_the_reference_transitions_and_the_lost_lease():
    got = {pair: (to, tid) for pair, (to, tid, _k, _g) in fsm.TRANSITIONS.items()}
    assert got == EXPECTED_LEGAL


def test_kinds_and_gating_columns_are_the_reference_ones():
    got = {tid: (frozenset(fsm.KIND_NAMES[k] for k in kinds), gated) for (_to, tid, kinds, gated) in fsm.TRANSITIONS.values()}
    assert got == {tid: (frozenset(kinds), gated) for tid, (kinds, gated) in EXPECTED_GUARDS.items()}


def _args(state, event, kind):
    key = 3 if kind == KIND_PINNED else 0
    return state, 1, key, event, (1 if event == LEASE else ANY_ROLE), key


@pytest.mark.parametrize("pair", list(EXPECTED_LEGAL), ids=[v[1] for v in EXPECTED_LEGAL.values()])
def test_every_legal_edge_by_kind_class_and_posture(pair):
    """decide() against the literal guard columns, for every kind x cordon class x posture."""
    to, tid = EXPECTED_LEGAL[pair]
    kinds, gated = EXPECTED_GUARDS[tid]
    for kind_name, klass, posture in itertools.product(KIND_OF, (CLASS_NEVER, CLASS_FLOOR, CLASS_DEFERRABLE),
                                                       (NOMINAL, CORDONED)):
        reason, nxt, *_ = fsm.decide(*_args(*pair, KIND_OF[kind_name]), KIND_OF[kind_name], klass, posture)
        if kind_name not in kinds:
            want = fsm.R_WRONG_KIND
        elif gated and klass == CLASS_DEFERRABLE and posture == CORDONED:
            want = fsm.R_CORDONED
        else:
            want = fsm.OK
        assert reason == want, (tid, kind_name, fsm.CLASS_NAMES[klass], fsm.POSTURE_NAMES[posture])
        assert nxt == (to if want == fsm.OK else pair[0])


def test_a_pinned_deferrable_unit_completes_under_cordon():
    """T3 is not gated: a keyed deferrable unit running when the cordon came must finish."""
    assert fsm.decide(RUNNING, 0, 4, PIN_KEYED, ANY_ROLE, 0, KIND_PINNED, CLASS_DEFERRABLE, CORDONED)[:2] == (fsm.OK, PINNED)


@pytest.mark.parametrize("state,event", ALL_PAIRS, ids=[f"{fsm.STATE_NAMES[s]}-{fsm.EVENT_NAMES[e]}" for s, e in ALL_PAIRS])
def test_every_state_event_pair(state, event):
    """Legal pairs reach the expected state for some kind; illegal ones are refused unchanged."""
    results = []
    for kind in (KIND_PINNED, KIND_POOLED, KIND_SINGLETON):
        key = 3 if kind == KIND_PINNED else 0
        results.append(fsm.decide(state, 1, key, event, ANY_ROLE if event != LEASE else 1, key, kind, CLASS_NEVER, NOMINAL))
    if (state, event) in EXPECTED_LEGAL:
        assert any(r[0] == fsm.OK and r[1] == EXPECTED_LEGAL[(state, event)][0] for r in results)
    else:
        for reason, nxt, role, key in results:
            assert reason == fsm.R_ILLEGAL
            assert nxt == state and role == 1


# --- the illegal transitions the reference lists -------------------------------------
def test_idle_to_running_needs_a_lease():
    assert fsm.decide(IDLE, 0, 0, START, ANY_ROLE, 0, KIND_POOLED, CLASS_NEVER, NOMINAL)[0] == fsm.R_ILLEGAL


@pytest.mark.parametrize("kind", [KIND_PINNED, KIND_SINGLETON])
def test_running_to_idle_mid_unit_is_refused_for_pinned_kinds(kind):
    reason, nxt, *_ = fsm.decide(RUNNING, 0, 0, RELEASE, ANY_ROLE, 0, kind, CLASS_NEVER, NOMINAL)
    assert (reason, nxt) == (fsm.R_WRONG_KIND, RUNNING)


def test_pinned_rekeying_is_refused():
    # No event takes Pinned(k) to Pinned(k'): LEASE is illegal there and RESUME checks the key.
    assert fsm.decide(PINNED, 0, 5, LEASE, 0, 6, KIND_PINNED, CLASS_NEVER, NOMINAL)[0] == fsm.R_ILLEGAL
    assert fsm.decide(PINNED, 0, 5, RESUME, ANY_ROLE, 6, KIND_PINNED, CLASS_NEVER, NOMINAL)[0] == fsm.R_KEY_MISMATCH
    assert fsm.decide(PINNED, 0, 5, RESUME, ANY_ROLE, 5, KIND_PINNED, CLASS_NEVER, NOMINAL)[:2] == (fsm.OK, RUNNING)


def test_rekeying_goes_through_unpin_then_lease():
    reason, state, role, key = fsm.decide(PINNED, 0, 5, UNPIN, ANY_ROLE, 0, KIND_PINNED, CLASS_NEVER, NOMINAL)
    assert (reason, state) == (fsm.OK, IDLE)
    assert fsm.decide(state, role, key, LEASE, 0, 6, KIND_PINNED, CLASS_NEVER, NOMINAL) == (fsm.OK, LEASED, 0, 6)


def test_draining_to_leased_is_refused():
    assert fsm.decide(DRAINING, 0, 0, LEASE, 0, 0, KIND_POOLED, CLASS_NEVER, NOMINAL)[0] == fsm.R_ILLEGAL


@pytest.mark.parametrize("state,event", [(IDLE, LEASE), (LEASED, START), (PINNED, RESUME)])
def test_deferrable_role_cannot_lease_or_run_under_cordon(state, event):
    kind = KIND_PINNED if state == PINNED else KIND_POOLED
    key = 2 if kind == KIND_PINNED else 0
    role = 0 if event == LEASE else ANY_ROLE
    assert fsm.decide(state, 0, key, event, role, key, kind, CLASS_DEFERRABLE, CORDONED)[0] == fsm.R_CORDONED
    assert fsm.decide(state, 0, key, event, role, key, kind, CLASS_DEFERRABLE, NOMINAL)[0] == fsm.OK
    # Floor and never classes are not refused by the FSM under cordon (floor is a capacity rule).
    for klass in (CLASS_NEVER, CLASS_FLOOR):
        assert fsm.decide(state, 0, key, event, role, key, kind, klass, CORDONED)[0] == fsm.OK


@pytest.mark.parametrize("state,event", [(RUNNING, DRAIN), (DRAINING, DRAINED), (RUNNING, RELEASE)])
def test_in_flight_work_always_completes_under_cordon(state, event):
    assert fsm.decide(state, 0, 0, event, ANY_ROLE, 0, KIND_POOLED, CLASS_DEFERRABLE, CORDONED)[0] == fsm.OK


def test_event_for_another_role_is_refused():
    assert fsm.decide(RUNNING, 2, 0, RELEASE, 3, 0, KIND_POOLED, CLASS_NEVER, NOMINAL)[0] == fsm.R_WRONG_ROLE
    assert fsm.decide(RUNNING, 2, 0, RELEASE, 2, 0, KIND_POOLED, CLASS_NEVER, NOMINAL)[0] == fsm.OK


def test_keys_only_for_pinned_roles_and_within_the_word():
    assert fsm.decide(IDLE, 0, 0, LEASE, 1, 4, KIND_POOLED, CLASS_NEVER, NOMINAL)[0] == fsm.R_BAD_KEY
    assert fsm.decide(IDLE, 0, 0, LEASE, 1, fsm.MAX_KEY + 1, KIND_PINNED, CLASS_NEVER, NOMINAL)[0] == fsm.R_BAD_KEY
    assert fsm.decide(IDLE, 0, 0, LEASE, 1, fsm.MAX_KEY, KIND_PINNED, CLASS_NEVER, NOMINAL)[0] == fsm.OK


def test_kind_guards_per_completion():
    # T3 only pinned, T4 only singleton, T5 only pooled.
    cases = {PIN_KEYED: KIND_PINNED, PIN_SINGLETON: KIND_SINGLETON, RELEASE: KIND_POOLED}
    for event, allowed in cases.items():
        for kind in (KIND_PINNED, KIND_POOLED, KIND_SINGLETON):
            reason = fsm.decide(RUNNING, 0, 0, event, ANY_ROLE, 0, kind, CLASS_NEVER, NOMINAL)[0]
            assert (reason == fsm.OK) == (kind == allowed), (event, kind)


def test_leaving_to_idle_clears_role_and_key():
    assert fsm.decide(PINNED, 3, 9, UNPIN, ANY_ROLE, 0, KIND_PINNED, CLASS_NEVER, NOMINAL) == (fsm.OK, IDLE, 0, 0)


def test_bad_event_code():
    assert fsm.decide(IDLE, 0, 0, 99, 0, 0, KIND_POOLED, CLASS_NEVER, NOMINAL)[0] == fsm.R_BAD_EVENT
    assert fsm.transition_id(IDLE, START) is None
    assert fsm.transition_id(IDLE, LEASE) == "T1"


# --- paths other modules walk (fsm.COMPLETION, fsm.RESET_PATHS) -------------------
def _walk_decide(state, path, kind, cls=CLASS_NEVER, posture=NOMINAL):
    """Walk `path` through the full guarded rule; (reason of the first refusal, state)."""
    for event in path:
        reason, state, _r, _k = fsm.decide(state, 0, 0, event, ANY_ROLE, 0, kind, cls, posture)
        if reason != fsm.OK:
            return reason, state
    return fsm.OK, state


@pytest.mark.parametrize("kind, expected", [(KIND_PINNED, PINNED), (KIND_SINGLETON, PINNED), (KIND_POOLED, IDLE)])
def test_each_kind_completes_a_running_slot_legally(kind, expected):
    assert _walk_decide(RUNNING, (fsm.COMPLETION[kind],), kind) == (fsm.OK, expected)


@pytest.mark.parametrize("state, kind", [(s, k) for s in range(fsm.N_STATES) for k in (KIND_PINNED, KIND_POOLED, KIND_SINGLETON)
                                         if not (s == PINNED and k == KIND_POOLED)])
def test_a_dead_seats_slot_walks_back_to_idle_from_every_state(state, kind):
    path = fsm.RESET_PATHS.get(state, ())
    assert (state == IDLE) == (path == ())
    assert _walk_decide(state, path, kind) == (fsm.OK, IDLE)
    assert fsm.walk(state, path) == IDLE


def test_walk_stops_at_an_illegal_step():
    assert fsm.walk(IDLE, (START,)) is None
    assert fsm.walk(IDLE, (LEASE, START, RELEASE)) == IDLE


@pytest.mark.parametrize("kind", [KIND_PINNED, KIND_POOLED, KIND_SINGLETON])
def test_a_dead_seats_slot_walks_back_to_idle_under_cordon_too(kind):
    """A deferrable role's lost lease or drained unit must get home while Cordoned."""
    for state, path in fsm.RESET_PATHS.items():
        if state == PINNED and kind == KIND_POOLED:
            continue
        assert _walk_decide(state, path, kind, CLASS_DEFERRABLE, CORDONED) == (fsm.OK, IDLE)


# --- T10: a lost lease goes home in any posture ------------------------------------------
@pytest.mark.parametrize("kind", [KIND_PINNED, KIND_POOLED, KIND_SINGLETON])
@pytest.mark.parametrize("klass", [CLASS_NEVER, CLASS_FLOOR, CLASS_DEFERRABLE])
def test_a_lost_lease_is_vacated_to_idle_even_under_cordon(kind, klass):
    key = 3 if kind == KIND_PINNED else 0
    assert fsm.decide(LEASED, 1, key, VACATE, ANY_ROLE, 0, kind, klass, CORDONED) == (fsm.OK, IDLE, 0, 0)


@pytest.mark.parametrize("state", [IDLE, RUNNING, PINNED, DRAINING])
def test_only_a_lease_can_be_vacated(state):
    """A started unit is never vacated: it ends through its completion or DRAIN/DRAINED."""
    assert fsm.decide(state, 1, 0, VACATE, ANY_ROLE, 0, KIND_POOLED, CLASS_NEVER, NOMINAL)[0] == fsm.R_ILLEGAL
