"""The contention rule (fleet.rules.contention): the wait share of a window, every state
against every kind of reading, the hold that doubles for a neighbour that stays, the
share a contended seat may widen to, and the policy's validation."""
from __future__ import annotations

import itertools

import pytest

from fleet.rules import contention as C
from fleet.rules.errors import ConfigError

P = C.ContentionPolicy(enter_share=0.25, exit_share=0.10, min_demand=0.05, calm_windows=2, hold_max=8)
S = C.SeatContention

#: states: fresh; re-pinned a window ago (hold 2); re-pinned a hold ago (ages out now);
#: re-pinned this window at the longest hold; contended; contended one calm window short
STATES = {
    "fresh": S(False, 0, 2, None, 0),
    "repinned_1_ago": S(False, 0, 2, 1, 1),
    "repinned_hold_ago": S(False, 0, 2, 2, 1),
    "repinned_now_max": S(False, 0, 8, 0, 3),
    "contended": S(True, 0, 2, None, 1),
    "contended_calm_1": S(True, 1, 2, None, 1),
}
#: readings: no evidence, calm, exactly the exit share, between, exactly the enter share, far above
READINGS = {"none": None, "calm": 0.05, "exit": 0.10, "between": 0.2, "enter": 0.25, "high": 0.9}

NOTHING = ("none", "calm", "exit", "between")  # below the enter share
CALM = ("none", "calm")  # below the exit share, or no evidence
EXPECTED = {
    **{("fresh", r): (S(False, 0, 2, None, 0), None) for r in NOTHING},
    **{("fresh", r): (S(True, 0, 2, None, 1), C.WIDEN) for r in ("enter", "high")},
    **{("repinned_1_ago", r): (S(False, 0, 2, 2, 1), None) for r in NOTHING},
    # back within the hold: the neighbour stayed, the next re-pin waits twice as long
    **{("repinned_1_ago", r): (S(True, 0, 4, None, 2), C.WIDEN) for r in ("enter", "high")},
    **{("repinned_hold_ago", r): (S(False, 0, 2, None, 1), None) for r in NOTHING},
    # back after a longer calm: the hold starts again from calm_windows
    **{("repinned_hold_ago", r): (S(True, 0, 2, None, 2), C.WIDEN) for r in ("enter", "high")},
    **{("repinned_now_max", r): (S(False, 0, 8, 1, 3), None) for r in NOTHING},
    **{("repinned_now_max", r): (S(True, 0, 8, None, 4), C.WIDEN) for r in ("enter", "high")},  # at hold_max
    **{("contended", r): (S(True, 1, 2, None, 1), None) for r in CALM},
    **{("contended", r): (S(True, 0, 2, None, 1), None) for r in ("exit", "between", "enter", "high")},
    **{("contended_calm_1", r): (S(False, 0, 2, 0, 1), C.REPIN) for r in CALM},
    # a window at or above the exit share breaks the calm streak
    **{("contended_calm_1", r): (S(True, 0, 2, None, 1), None) for r in ("exit", "between", "enter", "high")},
}


@pytest.mark.parametrize("state, reading", list(itertools.product(STATES, READINGS)))
def test_every_state_against_every_reading(state, reading):
    assert C.step(STATES[state], READINGS[reading], P) == EXPECTED[(state, reading)]


def test_the_table_covers_the_whole_product():
    assert set(EXPECTED) == set(itertools.product(STATES, READINGS))


def test_a_neighbour_that_stays_doubles_the_hold_up_to_its_most():
    """Widened, the worker runs where it is not waited for, looks calm and is re-pinned; the
    neighbour is still there: each return within the hold doubles it, up to hold_max."""
    state, holds = S(), []
    for _ in range(5):
        state, action = C.step(state, 0.5, P)
        assert action == C.WIDEN
        holds.append(state.hold)
        for _ in range(state.hold - 1):
            state, action = C.step(state, None, P)
            assert action is None
        state, action = C.step(state, 0.0, P)
        assert action == C.REPIN
    assert holds == [2, 4, 8, 8, 8] and state.episodes == 5


def test_a_calm_spell_as_long_as_the_hold_resets_it():
    state, _ = C.step(S(), 0.5, P)
    state, _ = C.step(state, 0.5, P)
    for _ in range(2):
        state, action = C.step(state, None, P)
    assert action == C.REPIN
    state, _ = C.step(state, 0.5, P)  # back at once: hold 4
    assert state.hold == 4
    for _ in range(4):
        state, action = C.step(state, 0.0, P)
    assert action == C.REPIN
    for _ in range(4):  # a whole hold of calm after the re-pin
        state, action = C.step(state, 0.0, P)
    state, action = C.step(state, 0.5, P)
    assert action == C.WIDEN and state.hold == 2


@pytest.mark.parametrize("run, wait, window, share", [
    (50, 50, 100, 0.5),  # half a core beside one busy loop
    (100, 0, 100, 0.0),  # ran whenever it asked
    (0, 100, 100, 1.0),  # never ran
    (3, 2, 100, 0.4),  # demand of exactly min_demand: evidence
    (2, 2, 100, None),  # demand below min_demand: an idle seat says nothing
    (0, 0, 100, None),
    (50, 50, 0, None),  # no window
    (-1, 50, 100, None),  # counters that went back: a new worker's
    (50, -1, 100, None),
])
def test_the_wait_share_of_a_window(run, wait, window, share):
    got = C.wait_share(run, wait, window, P)
    assert got == (pytest.approx(share) if share is not None else None)


@pytest.mark.parametrize("run, wait, looked, share", [
    (20, 60, (10, 55), 0.333),  # a worker that waited mostly in its looks: its units' wait is 5 of 15
    (10, 55, (10, 55), None),  # all of it looking: no demand of its own, no evidence
    (60, 60, (0, 0), 0.5),  # no looks: the plain reading
    (60, 60, (10, 10), 0.5),  # looks beside a busy loop: the units still waited half their demand
    (60, 60, (80, 0), 1.0),  # a look counted past the window's run (a torn read): none of it run
    (60, 60, (-5, 0), None),  # look counts that went back (a ring made anew): no evidence
])
def test_a_workers_looks_for_its_next_task_are_left_out_of_its_wait_share(run, wait, looked, share):
    got = C.wait_share(run, wait, 100, P, looked)
    assert got == (pytest.approx(share, abs=1e-3) if share is not None else None)


ROLES = [frozenset({"call"}), frozenset({"call"}), frozenset({"call"}), frozenset({"resolve"})]


@pytest.mark.parametrize("placement, seat, share", [
    ([(0,), (1,), (2,), (3,)], 0, (0, 1, 2)),  # the role's seats, not the other role's
    ([(0,), (1,), (2,), (3,)], 3, (3,)),  # a role of one seat has nowhere to go
    ([(0,), None, (2,), (3,)], 0, (0, 2)),  # a retired seat's CPUs are not the role's now
    ([(0,), (1,), None, (3,)], 1, (0, 1)),
    ([(0, 1), (1, 2), (4,), (3,)], 0, (0, 1, 2, 4)),  # seats of several CPUs
])
def test_a_contended_seat_widens_to_its_roles_share_only(placement, seat, share):
    assert C.share_cpus(ROLES, placement, seat) == share


@pytest.mark.parametrize("kwargs, path", [
    ({"enter_share": 1.5}, "contention.enter_share"),
    ({"exit_share": -0.1}, "contention.exit_share"),
    ({"min_demand": 2.0}, "contention.min_demand"),
    ({"enter_share": 0.1, "exit_share": 0.2}, "contention.exit_share"),
    ({"calm_windows": 0}, "contention.calm_windows"),
    ({"calm_windows": 9, "hold_max": 8}, "contention.calm_windows"),
])
def test_a_bad_policy_is_refused_naming_its_key(kwargs, path):
    with pytest.raises(ConfigError) as err:
        C.ContentionPolicy(**kwargs)
    assert err.value.path == path


@pytest.mark.parametrize("contended, spin", [(False, 2e-4), (True, 0.0)])
def test_a_thread_spins_for_its_next_message_only_on_calm_cpus(contended, spin):
    assert C.spin_for(2e-4, contended) == spin


# --- the loop's look before it sleeps (LookBeforeSleep) --------------------------------
def test_events_that_come_within_a_look_keep_the_look_whole():
    look = C.LookBeforeSleep(150e-6, 20e-6)
    for seconds in (3e-6, 40e-6, 150e-6):
        look.waited(seconds, came=True)
        assert look.look_s == 150e-6


def test_waits_longer_than_a_look_halve_it_to_none():
    # a result every 1.6 ms (a map's chunks on 2 workers): three waits and the loop looks no more
    look = C.LookBeforeSleep(150e-6, 20e-6)
    seen = []
    for _ in range(4):
        look.waited(1.6e-3, came=True)
        seen.append(look.look_s)
    assert seen == [75e-6, 37.5e-6, 0.0, 0.0]


def test_one_event_soon_after_the_sleep_began_brings_the_whole_look_back():
    look = C.LookBeforeSleep(150e-6, 20e-6)
    for _ in range(4):
        look.waited(5e-3, came=True)
    assert look.look_s == 0.0
    look.waited(60e-6, came=True)  # woken from its sleep 60 us in: a look would have caught it
    assert look.look_s == 150e-6


def test_a_wait_that_timed_out_is_no_event():
    look = C.LookBeforeSleep(150e-6, 20e-6)
    look.waited(10e-6, came=False)  # a short timeout ran out: nothing came
    assert look.look_s == 75e-6
