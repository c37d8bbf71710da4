"""What a posture does to work (fleet.rules.cordon), against tables written out here, and the
posture's cause as the table stores it (fleet.rules.posture.cause_code)."""
from __future__ import annotations

import itertools

import pytest

from fleet.rules import cordon
from fleet.rules import posture as P

NOMINAL, CORDONED = 0, 1
NEVER, FLOOR, DEFERRABLE = 0, 1, 2
CLASSES = (NEVER, FLOOR, DEFERRABLE)


def test_only_a_deferrable_role_under_cordon_takes_no_new_work():
    halted = {(p, k) for p, k in itertools.product((NOMINAL, CORDONED), CLASSES) if cordon.halts(p, k)}
    assert halted == {(CORDONED, DEFERRABLE)}
    assert [cordon.halts_any(p) for p in (NOMINAL, CORDONED)] == [False, True]


def test_a_posture_word_this_version_does_not_know_halts_nothing():
    assert not cordon.halts_any(2) and not cordon.halts_any(-1)


@pytest.mark.parametrize("klass, grows, in_use, floor, expected", [
    (NEVER, True, 9, 1, True),  # never shed
    (FLOOR, True, 1, 2, True),  # below its floor
    (FLOOR, True, 2, 2, False),  # at its floor: nothing that puts one more slot in use
    (FLOOR, False, 5, 2, True),  # on a slot already in use (a unit sent ahead, a RESUME)
    (DEFERRABLE, False, 0, 9, False),
    (DEFERRABLE, True, 0, 9, False),
])
def test_intake_under_cordon(klass, grows, in_use, floor, expected):
    assert cordon.admits(CORDONED, klass, grows, in_use, floor) is expected


@pytest.mark.parametrize("klass", CLASSES)
def test_nominal_admits_everything(klass):
    assert cordon.admits(NOMINAL, klass, True, 10, 0)
    assert not cordon.restricts(NOMINAL) and cordon.restricts(CORDONED)


def test_the_intake_floor_is_the_setting_else_half_the_slot_cap():
    assert [cordon.intake_floor(None, cap) for cap in (1, 2, 4, 7)] == [1, 1, 2, 3]
    assert cordon.intake_floor(3, 8) == 3
    assert P.PosturePolicy(cordon_sim_intake_floor=None).intake_floor(6) == 3


def test_drains_and_close():
    assert [cordon.yields(k) for k in CLASSES] == [False, False, True]
    shed = {(p, k) for p, k in itertools.product((NOMINAL, CORDONED), CLASSES) if cordon.sheds_at_close(p, k)}
    assert shed == {(CORDONED, DEFERRABLE)}


def test_the_tables_the_kernel_compiles_in():
    assert cordon.HALTS == ((False, False, False), (False, False, True))
    assert cordon.YIELDING == (False, False, True)


# --- the posture's cause, as the table's P_CAUSE stores it ------------------------------
CAUSE = {"none": 0, "throttle-events": 1, "throttle-duty": 2, "lane-death": 3, "operator": 4, "cpu-pressure": 5}
POLICY = P.PosturePolicy(cordon_enter_events=2, cordon_enter_window_ms=1000, cordon_duty_percent=2.0,
                         cordon_duty_window_ms=5000, cordon_exit_clean_ms=10_000)


def _observe(readings):
    state, change = P.initial(0), None
    for at, events, ns in readings:
        state, c = P.observe(state, POLICY, at, events, ns)
        change = c or change
    return state, change


def test_a_throttle_trip_by_events_and_one_by_duty_are_told_apart_by_their_cause():
    state, change = _observe([(0, 0, 0), (100, 5, 0)])  # 5 throttled periods in 100 ms
    assert state.posture == CORDONED and P.cause_code(state, change) == CAUSE["throttle-events"]
    state, change = _observe([(0, 0, 0), (100, 0, 200_000_000)])  # 200 ms throttled in 5 s: 4 %
    assert state.posture == CORDONED and P.cause_code(state, change) == CAUSE["throttle-duty"]


@pytest.mark.parametrize("cause", ["lane-death", "operator", "cpu-pressure"])
def test_a_held_cause_is_the_cause_and_stays_it_through_the_exit_window(cause):
    state, change = P.hold(P.initial(0), cause, 10)
    assert P.cause_code(state, change) == CAUSE[cause]
    state, none = P.release(state, cause, 20)  # released, still Cordoned for the exit window
    assert none is None and state.posture == CORDONED
    assert P.cause_code(state, change) == CAUSE[cause]


def test_held_causes_rank_lane_death_then_operator_then_pressure():
    state, change = P.hold(P.initial(0), "cpu-pressure", 1)
    state, _ = P.hold(state, "operator", 2)
    assert P.cause_code(state, change) == CAUSE["operator"]
    state, _ = P.hold(state, "lane-death", 3)
    assert P.cause_code(state, change) == CAUSE["lane-death"]


def test_nominal_has_no_cause():
    assert P.cause_code(P.initial(0), None) == CAUSE["none"]
    state, change = P.hold(P.initial(0), "operator", 0)
    state, _ = P.release(state, "operator", 1)
    state, change = P.observe(state, POLICY, 20_000, 0, 0)
    state, change = P.observe(state, POLICY, 20_001, 0, 0)
    assert state.posture == NOMINAL and P.cause_code(state, change) == CAUSE["none"]


def test_the_cause_is_not_read_from_the_human_reason():
    """A transition's reason is for people: rewording it changes nothing the table stores."""
    state, change = P.hold(P.initial(0), "operator", 0)
    state, _ = P.release(state, "operator", 1)
    reworded = P.Transition(change.old, change.new, change.at_ms, "throttled duty by the lane-death", change.cause)
    assert P.cause_code(state, reworded) == CAUSE["operator"]
