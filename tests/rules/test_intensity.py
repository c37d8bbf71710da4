"""Restart intensity (fleet.rules.intensity): OTP's MaxR deaths within MaxT seconds, with
time passed in, so the window's expiry is tested without waiting."""
from __future__ import annotations

import pytest

from fleet.rules.intensity import Deaths, note_death


def test_deaths_up_to_the_limit_are_restarted_one_more_stops():
    d = Deaths(max_restarts=3, within_seconds=10.0)
    assert [d.died(0, t) for t in (1.0, 2.0, 3.0)] == [False, False, False]
    assert d.died(0, 4.0) is True


def test_the_window_expires_old_deaths():
    d = Deaths(max_restarts=2, within_seconds=10.0)
    assert not d.died(0, 0.0)
    assert not d.died(0, 5.0)
    # 0.0 is now older than the window (11 - 10 = 1): only 5.0 and 11.0 count.
    assert not d.died(0, 11.0)
    assert d.recent(0) == (5.0, 11.0)
    # 5.0 is still inside at 14: three deaths in the window.
    assert d.died(0, 14.0)


def test_a_death_exactly_on_the_window_edge_still_counts():
    assert note_death((0.0, 5.0), 10.0, max_restarts=2, within_seconds=10.0).exceeded
    assert not note_death((0.0, 5.0), 10.001, max_restarts=2, within_seconds=10.0).exceeded


def test_deaths_spaced_wider_than_the_window_never_stop():
    d = Deaths(max_restarts=1, within_seconds=1.0)
    assert not any(d.died(0, 2.0 * i) for i in range(100))
    assert d.recent(0) == (198.0,)  # the history stays bounded by the window


def test_zero_restarts_stops_at_the_first_death():
    assert Deaths(0, 60.0).died(0, 0.0)


def test_roles_count_apart():
    d = Deaths(max_restarts=1, within_seconds=60.0)
    assert not d.died(0, 1.0)
    assert not d.died(1, 1.0)
    assert d.died(0, 2.0)
    assert not d.died(2, 2.0)


@pytest.mark.parametrize("history", [(), (1.0,), (1.0, 2.0, 3.0)])
def test_the_rule_is_pure(history):
    before = tuple(history)
    v1 = note_death(history, 4.0, 2, 10.0)
    v2 = note_death(history, 4.0, 2, 10.0)
    assert v1 == v2 and history == before
