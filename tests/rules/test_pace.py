"""What is sent ahead to a busy slot follows the units' measured run time (fleet.rules.pace):
enough to keep a worker busy, never more out of cancel's reach than needed."""
from __future__ import annotations

import pytest

from fleet.rules.pace import FIRST_AHEAD, IDLE_SHARE, ROUND_TRIP_S, Pace, depth_for


@pytest.mark.parametrize("run_s, depth", [
    (None, FIRST_AHEAD),  # not measured yet: none ahead
    (0.0, 16), (5e-6, 16), (ROUND_TRIP_S / 4, 4), (ROUND_TRIP_S / 3.5, 4),  # short: a round trip's worth
    (ROUND_TRIP_S, 1), (0.01, 1),  # in between: one
    (ROUND_TRIP_S / IDLE_SHARE, 0), (0.5, 0), (10.0, 0),  # long: none, cancel reaches all but the running one
])
def test_the_depth_covers_a_round_trip_and_no_more(run_s, depth):
    assert depth_for(run_s, 16) == depth


def test_the_depth_never_passes_the_roles_cap():
    assert depth_for(1e-7, 3) == 3 and depth_for(None, 0) == 0 and depth_for(1e-7, 0) == 0


def test_what_waits_ahead_of_a_worker_runs_about_a_round_trip_or_one_unit():
    """The bound cancel relies on: the units ahead of a worker run at most a round trip
    plus one unit, or one unit when units are longer than a trip (ProcessPoolExecutor
    queues one per worker, and one more)."""
    for run_s in (1e-7, 1e-6, 3e-5, 2e-4, 9e-4, 1e-3, 0.004, 0.03, 0.05, 1.0, 60.0):
        depth = depth_for(run_s, 64)
        assert depth <= 1 or depth * run_s <= ROUND_TRIP_S + run_s


def test_pace_reports_a_roles_depth_only_when_it_changes_and_smooths_one_odd_unit():
    pace = Pace([16, 0])
    assert pace.depths == [FIRST_AHEAD, 0]
    assert pace.ran(0, 5e-6) == 16
    assert pace.ran(0, 5e-6) is None  # unchanged: nothing to tell the dispatcher
    assert pace.ran(1, 1e-6) is None  # a role that sends nothing ahead is never paced
    # one 10 ms unit among microsecond ones moves the smoothed time, not to 10 ms
    assert pace.ran(0, 0.01) == 1 and pace.run_s(0) < 0.01
    for _ in range(40):
        pace.ran(0, 5e-6)
    assert pace.depths[0] == 16
    for _ in range(40):
        pace.ran(0, 0.5)
    assert pace.depths[0] == 0
    assert pace.ran(0, float("nan")) is None and pace.depths[0] == 0  # no measure: no change
