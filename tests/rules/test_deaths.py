"""What a seat's death means for each unit it owed (`fleet.runtime.deaths`): the pure rule."""
from __future__ import annotations

import itertools

import pytest

from fleet.runtime.deaths import Owed, cause, verdict

WORKER = "worker pid 41 of seat serial-0 died (signal 9)"


def test_a_unit_that_never_started_gets_no_outcome_it_goes_back_to_its_queue():
    assert verdict(Owed(7, started=False), WORKER) is None


def test_a_unit_that_had_started_fails_lane_death_naming_the_worker():
    outcome = verdict(Owed(7, started=True), WORKER)
    assert (outcome.kind, outcome.reason) == ("failed", "LaneDeath")
    assert outcome.detail == f"{WORKER} while the unit ran"


def test_the_unit_whose_timeout_killed_the_worker_fails_timeout():
    outcome = verdict(Owed(7, started=True, timed_out=True), WORKER)
    assert (outcome.kind, outcome.reason) == ("failed", "Timeout")


@pytest.mark.parametrize("started", [True, False])
@pytest.mark.parametrize("reason", ["LeaseExpired", "LeaseDenied", "LeasePreempted"])
def test_a_unit_whose_lease_ended_fails_with_the_lease_reason_started_or_not(started, reason):
    """No unit runs without its host-group lease: one that never started does not go back."""
    outcome = verdict(Owed(7, started=started, timed_out=started, lease_lost=(reason, "lease 3 ended")), WORKER)
    assert (outcome.kind, outcome.reason, outcome.detail) == ("failed", reason, "lease 3 ended")


def test_every_combination_has_exactly_one_verdict_by_precedence():
    """Lease lost, then timeout, then started, then back to the queue."""
    for started, timed_out, lost in itertools.product((False, True), repeat=3):
        outcome = verdict(Owed(1, started, timed_out, ("LeaseExpired", "gone") if lost else None), WORKER)
        expected = "LeaseExpired" if lost else "Timeout" if timed_out else "LaneDeath" if started else None
        assert (outcome.reason if outcome else None) == expected, (started, timed_out, lost)


def test_how_a_worker_died_names_the_signal_or_exit_code_and_the_unit_whose_timeout_killed_it():
    assert cause(-9) == "signal 9"
    assert cause(3) == "exit code 3"
    assert cause(-9, [12, 13]) == "signal 9, killed because unit 12 ran past its timeout"
