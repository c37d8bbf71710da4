"""Posture FSM rules with a fake clock: thresholds, hysteresis, causes, the table, retune."""
import itertools
import logging

import pytest

from fleet.rules import posture as P
from fleet.rules.fsm import CORDONED, NOMINAL
from fleet.rules.vocab import CAUSE_CODES

POLICY = P.DEFAULT_POLICY
MS = 1_000_000  # ns per ms


def run(readings, policy=POLICY, state=None):
    """Feed (now_ms, nr_throttled, throttled_ns) readings; return (state, transitions)."""
    state = state or P.initial(readings[0][0])
    changes = []
    for now, nr, ns in readings:
        state, change = P.observe(state, policy, now, nr, ns)
        if change:
            changes.append(change)
    return state, changes


def enter(now=200):
    """A state just cordoned at `now` by two throttled periods (baseline at 0)."""
    state, changes = run([(0, 0, 0), (now - 100, 1, 0), (now, 2, 0)])
    assert state.posture == CORDONED and len(changes) == 1
    return state


# --- entering by events ----------------------------------------------------------------


def test_first_reading_is_a_baseline_not_events():
    state, changes = run([(0, 798, 10**12)])
    assert state.posture == NOMINAL and not changes and state.window == ()


def test_one_event_below_threshold_stays_nominal():
    state, _ = run([(0, 0, 0), (100, 1, 0), (900, 1, 0)])
    assert state.posture == NOMINAL


def test_enter_events_threshold_reached():
    state, changes = run([(0, 0, 0), (100, 1, 0), (900, 2, 0)])
    assert state.posture == CORDONED and state.enter_count == 1
    assert changes[0].old == NOMINAL and changes[0].at_ms == 900 and "2 throttled periods" in changes[0].reason


def test_one_reading_with_a_jump_of_two_periods_enters():
    assert run([(0, 5, 0), (250, 7, 0)])[0].posture == CORDONED


def test_events_exactly_one_window_apart_do_not_add_up():
    # window is (now - 1000, now]: the event stamped at 100 is out at 1100
    assert run([(0, 0, 0), (100, 1, 0), (1100, 2, 0)])[0].posture == NOMINAL
    assert run([(0, 0, 0), (101, 1, 0), (1100, 2, 0)])[0].posture == CORDONED


def test_enter_events_follow_the_policy():
    policy = P.PosturePolicy(cordon_enter_events=3)
    assert run([(0, 0, 0), (100, 2, 0)], policy)[0].posture == NOMINAL
    assert run([(0, 0, 0), (100, 3, 0)], policy)[0].posture == CORDONED


# --- entering by duty -----------------------------------------------------------------------


def test_duty_exactly_at_threshold_does_not_enter():
    # 2% of 5000 ms = 100 ms throttled; strictly greater enters
    assert run([(0, 0, 0), (4000, 1, 100 * MS)])[0].posture == NOMINAL


def test_duty_just_over_threshold_enters():
    state, changes = run([(0, 0, 0), (4000, 1, 100 * MS + 1)])
    assert state.posture == CORDONED and "duty" in changes[0].reason


def test_duty_counts_only_the_trailing_window():
    # at 6000 the window is (1000, 6000]: the 60 ms stamped at 1000 is out, 41 ms < 100 ms
    assert run([(0, 0, 0), (1000, 1, 60 * MS), (6000, 1, 101 * MS)])[0].posture == NOMINAL
    assert run([(0, 0, 0), (1001, 1, 60 * MS), (6000, 1, 101 * MS)])[0].posture == CORDONED


def test_window_figures_use_half_open_windows():
    window = (P.Delta(1000, 1, 60 * MS), P.Delta(5000, 1, 40 * MS), P.Delta(5100, 1, 0))
    assert P.window_figures(window, POLICY, 6000) == (1, 0.8)  # (5000, 6000] and (1000, 6000]
    assert P.window_figures(window, POLICY, 5999) == (2, 2.0)


# --- exit and hysteresis ---------------------------------------------------------------------------


def test_exit_after_exactly_the_clean_window():
    state = enter(200)
    state, changes = run([(10199, 2, 0)], state=state)
    assert state.posture == CORDONED and not changes
    state, changes = run([(10200, 2, 0)], state=state)
    assert state.posture == NOMINAL and state.exit_count == 1 and "clean for 10000" in changes[0].reason


def test_a_throttled_sample_restarts_the_clean_clock():
    state = enter(200)
    state, _ = run([(5000, 3, 0), (14999, 3, 0)], state=state)
    assert state.posture == CORDONED
    state, _ = run([(15000, 3, 0)], state=state)
    assert state.posture == NOMINAL


def test_throttled_time_alone_is_not_clean():
    state = enter(200)
    state, _ = run([(9000, 2, 1), (10200, 2, 1)], state=state)
    assert state.posture == CORDONED


def test_no_flapping_on_a_signal_faster_than_the_exit_window():
    # a burst that trips every 3 s, quiet in between: one cordon, held throughout
    readings, nr = [(0, 0, 0)], 0
    for t in range(100, 60_000, 100):
        if t % 3000 in (100, 200):
            nr += 1
        readings.append((t, nr, 0))
    state, changes = run(readings)
    assert [c.new for c in changes] == [CORDONED]
    assert state.enter_count == 1 and state.exit_count == 0


def test_dwell_and_counts_accumulate_over_stays():
    state = enter(200)
    state, _ = run([(10200, 2, 0), (20000, 3, 0), (20100, 4, 0), (30100, 4, 0)], state=state)
    assert (state.enter_count, state.exit_count, state.posture) == (2, 2, NOMINAL)
    assert P.cordoned_dwell_ms(state, 40_000) == 10_000 + 10_000
    state, _ = run([(40000, 5, 0), (40100, 6, 0)], state=state)
    assert P.cordoned_dwell_ms(state, 40_600) == 20_000 + 500


def test_counters_going_back_rebase_instead_of_counting():
    state, _ = run([(0, 100, 5 * MS), (100, 0, 0)])
    assert state.window == () and state.last == (0, 0)
    state, _ = run([(200, 2, 0)], state=state)  # two new periods after the reset
    assert state.posture == CORDONED


# --- sticky causes -------------------------------------------------------------------------------------


def test_lane_death_cordons_and_holds_past_the_clean_window():
    state = P.initial(0)
    state, change = P.hold(state, "lane-death", 50)
    assert state.posture == CORDONED and change.reason == "held by lane-death"
    state, _ = run([(100, 0, 0), (60_000, 0, 0)], state=state)
    assert state.posture == CORDONED


def test_release_restarts_the_clean_clock_then_exits():
    state, _ = P.hold(P.initial(0), "lane-death", 0)
    state, _ = run([(100, 0, 0), (20_000, 0, 0)], state=state)
    state, change = P.release(state, "lane-death", 20_000)
    assert state.posture == CORDONED and change is None
    state, _ = run([(29_999, 0, 0)], state=state)
    assert state.posture == CORDONED
    state, _ = run([(30_000, 0, 0)], state=state)
    assert state.posture == NOMINAL


def test_releasing_an_absent_cause_changes_nothing():
    state = P.initial(0)
    assert P.release(state, "lane-death", 10) == (state, None)


# --- the table -------------------------------------------------------------------------------------------


# Written out from 002 §6, not taken from P.TRANSITIONS: (posture, event) -> next posture.
# Releasing a cause while Nominal is the one illegal pair (no cause can be held there).
EXPECTED_POSTURE = {
    (NOMINAL, P.TRIPPED): CORDONED,
    (NOMINAL, P.UNSETTLED): NOMINAL,
    (NOMINAL, P.SETTLED): NOMINAL,
    (NOMINAL, P.HOLD): CORDONED,
    (CORDONED, P.TRIPPED): CORDONED,
    (CORDONED, P.UNSETTLED): CORDONED,
    (CORDONED, P.SETTLED): NOMINAL,
    (CORDONED, P.HOLD): CORDONED,
    (CORDONED, P.RELEASE): CORDONED,
}
EXPECTED_EVENTS = ("tripped", "unsettled", "settled", "hold", "release")


def test_the_posture_events_are_the_five_written_here():
    assert P.EVENTS == EXPECTED_EVENTS


@pytest.mark.parametrize("posture, event", list(itertools.product((NOMINAL, CORDONED), EXPECTED_EVENTS)))
def test_every_posture_event_pair(posture, event):
    state = P.PostureState(posture, 0, 0, causes=frozenset({"x"}) if posture == CORDONED else frozenset())
    expected = EXPECTED_POSTURE.get((posture, event))
    if expected is None:
        with pytest.raises(P.PostureError):
            P._apply(state, event, "test", 5)
        return
    new, change = P._apply(state, event, "test", 5)
    assert new.posture == expected
    assert (change is None) == (expected == posture)


def test_only_release_in_nominal_is_illegal():
    missing = {(s, e) for s in (NOMINAL, CORDONED) for e in EXPECTED_EVENTS} - set(P.TRANSITIONS)
    assert missing == {(NOMINAL, "release")}


# --- retune ---------------------------------------------------------------------------------------------


def owner_cordoned():
    owner = P.PostureOwner(now_ms=0)
    for now, nr in ((0, 0), (100, 1), (200, 2)):
        owner.observe(now, nr, 0)
    assert owner.posture == CORDONED
    return owner


def test_retune_keeps_posture_and_window_and_returns_the_effective_policy(caplog):
    owner = owner_cordoned()
    window = owner.state.window
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fleet.rules.posture"):
        view = owner.retune({"cordon_exit_clean_ms": 500, "cordon_duty_percent": 5}, now_ms=300)
    assert view["posture"] == "Cordoned" and view["policy"]["cordon_exit_clean_ms"] == 500
    assert view["policy"]["cordon_enter_events"] == 2 and view["window_events"] == 2
    assert owner.state.window == window and owner.state.enter_count == 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert "cordon_exit_clean_ms 10000 -> 500" in line and "cordon_duty_percent 2.0 -> 5" in line


def test_retuned_exit_window_takes_effect_on_the_next_reading():
    owner = owner_cordoned()
    owner.retune({"cordon_exit_clean_ms": 1000, "cordon_enter_window_ms": 100, "cordon_duty_window_ms": 100}, 300)
    assert owner.observe(1199, 2, 0) is None
    assert owner.observe(1200, 2, 0).new == NOMINAL


def test_retune_with_the_live_values_logs_nothing(caplog):
    owner = P.PostureOwner()
    with caplog.at_level(logging.WARNING, logger="fleet.rules.posture"):
        owner.retune({"cordon_enter_events": 2}, 0)
    assert not caplog.records


def test_floor_null_restores_half_the_slot_cap():
    owner = P.PostureOwner()
    owner.retune({"cordon_sim_intake_floor": 3}, 0)
    assert owner.policy.intake_floor(4) == 3
    owner.retune({"cordon_sim_intake_floor": None}, 0)
    assert owner.policy.intake_floor(4) == 2 and owner.policy.intake_floor(1) == 1


BAD_PATCHES = [
    ({}, "patch"),
    (None, "patch"),
    ({"cordon_duty_pct": 1}, "cordon_duty_pct"),
    ({"cordon_enter_events": 0}, "cordon_enter_events"),
    ({"cordon_enter_events": 1.5}, "cordon_enter_events"),
    ({"cordon_enter_events": True}, "cordon_enter_events"),
    ({"cordon_enter_window_ms": 0}, "cordon_enter_window_ms"),
    ({"cordon_duty_window_ms": -5}, "cordon_duty_window_ms"),
    ({"cordon_exit_clean_ms": "10s"}, "cordon_exit_clean_ms"),
    ({"cordon_duty_percent": 0}, "cordon_duty_percent"),
    ({"cordon_duty_percent": 100.01}, "cordon_duty_percent"),
    ({"cordon_duty_percent": float("nan")}, "cordon_duty_percent"),
    ({"cordon_sim_intake_floor": 0}, "cordon_sim_intake_floor"),
    ({"cordon_exit_clean_ms": 500, "cordon_enter_events": 0}, "cordon_enter_events"),
]


@pytest.mark.parametrize("patch, key", BAD_PATCHES)
def test_bad_patch_is_rejected_whole_and_never_clamped(patch, key, caplog):
    owner = owner_cordoned()
    before = (owner.policy, owner.state)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fleet.rules.posture"), pytest.raises(P.PostureRetuneError) as info:
        owner.retune(patch, 300)
    assert key in info.value.problems
    assert (owner.policy, owner.state) == before and not caplog.records


@pytest.mark.parametrize(
    "patch",
    [{"cordon_duty_percent": 100}, {"cordon_duty_percent": 0.01}, {"cordon_enter_events": 1}, {"cordon_exit_clean_ms": 1}],
)
def test_edge_values_are_accepted(patch):
    assert P.validate_patch(POLICY, patch) != POLICY


def test_policy_itself_rejects_bad_values():
    with pytest.raises(P.PostureRetuneError):
        P.PosturePolicy(cordon_duty_window_ms=0)


def test_show_reports_counters():
    owner = owner_cordoned()
    view = owner.show(1200)
    assert (view["posture"], view["enter_count"], view["cordoned_dwell_ms"]) == ("Cordoned", 1, 1000)


@pytest.mark.parametrize("cause", ["lane_death", "", None, 3, "Operator"])
def test_a_cause_outside_the_vocabulary_is_refused_and_changes_nothing(cause):
    state, _ = P.hold(P.initial(0), "lane-death", 0)
    with pytest.raises(P.PostureCauseError) as err:
        P.release(state, cause, 10)
    assert err.value.exit_code == 2 and "lane-death, operator" in str(err.value)
    with pytest.raises(P.PostureCauseError):
        P.hold(state, cause, 10)
    owner = P.PostureOwner(now_ms=0)
    owner.hold("lane-death", 0)
    before = owner.state
    with pytest.raises(P.PostureCauseError):
        owner.release(cause, 10)
    assert owner.state is before


def test_the_sticky_causes_are_lane_death_and_operator():
    assert P.STICKY_CAUSES == ("lane-death", "operator")


def test_cpu_pressure_is_a_held_cause_its_input_releases_but_not_an_operator_cause():
    state, change = P.hold(P.initial(0), "cpu-pressure", 0)
    assert state.posture == CORDONED and state.causes == {"cpu-pressure"}
    assert "cpu-pressure" not in P.STICKY_CAUSES  # fleetctl posture release refuses it
    with pytest.raises(P.PostureCauseError):
        P.check_cause("cpu-pressure")
    state, change = P.release(state, "cpu-pressure", 10)
    assert state.causes == frozenset()  # released; the clean window then brings Nominal back


def test_memory_pressure_is_held_and_released_apart_from_cpu_pressure():
    """Both pressures may hold at once; each is released by its own input, and the cause the
    table shows is the held one's. Mutations that turn it red: MEMORY_PRESSURE left out of
    HELD_CAUSES (hold raises), or made sticky (check_cause takes it)."""
    state, change = P.hold(P.initial(0), "memory-pressure", 0)
    assert state.posture == CORDONED and change.cause == CAUSE_CODES["memory-pressure"]
    assert P.cause_code(state, change) == CAUSE_CODES["memory-pressure"]
    with pytest.raises(P.PostureCauseError):
        P.check_cause("memory-pressure")  # not an operator's
    state, _ = P.hold(state, "cpu-pressure", 5)
    state, _ = P.release(state, "memory-pressure", 10)
    assert state.causes == {"cpu-pressure"} and state.posture == CORDONED
    assert P.cause_code(state, change) == CAUSE_CODES["cpu-pressure"]
