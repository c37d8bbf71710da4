"""A seat's death fails only the units that started on it (`fleet.runtime.deaths`); the others go
back to the head of their queue, in order, and run once on the seat's successor.

Real fleets: the worker is SIGKILLed while one unit (or, on an I/O seat, each of its
slots' units) sleeps in its handler, with more units granted to the seat's other slots
or sent ahead behind it. The handlers note every run in a file per unit
(`tests.handlers.note_run`), so "ran once" and "never ran" are read from what the
handlers did, not from the fleet's own books.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

import fleet
from tests.fleets import config, role, running, worker_pids

WAIT_S = 120.0  # generous: an "eventually", never a timing assertion
LONG_S = 3600  # a unit that sleeps until its worker is killed


def eventually(predicate, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.005)


def runs(directory, tag) -> int:
    """How many times unit `tag` ran (lines its handler wrote)."""
    path = os.path.join(directory, str(tag))
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return len(f.read().splitlines())


def run_order(directory) -> list[str]:
    with open(os.path.join(directory, "order")) as f:
        return f.read().split()


def in_flight(f) -> int:
    return f._sup.inspect(lambda sup: sup.dispatcher.inflight_count())


def kill_worker(f) -> int:
    (pid,) = worker_pids(f)
    os.kill(pid, signal.SIGKILL)
    return pid


def hold_grants(f) -> None:
    """The loop's dispatcher grants nothing until `release_grants`: every unit stays queued
    (a drain no longer holds the queues; on the loop, as every touch of its state)."""
    f._sup.inspect(lambda sup: setattr(sup.dispatcher, "grant", list))  # list(): no grant


def release_grants(f) -> None:
    def release(sup):
        del sup.dispatcher.grant
        sup.dispatch()

    f._sup.inspect(release)


def _one_seat(name: str, profile: str, roles: dict) -> dict:
    cfg = config(name, roles, profile=profile, restart={"max_restarts": 100, "within_seconds": 10})
    cfg["fleet"]["cpus"] = 2  # one seat for the role on either binding, whatever the host
    return cfg


@pytest.mark.parametrize("profile, binding", [("serial", "logical"), ("pinned", "pinned")])
def test_a_killed_seat_fails_the_unit_that_ran_and_runs_the_others_once_in_order(fleet_name, tmp_path, profile,
                                                                                  binding):
    """1 unit started + 7 granted to the seat's other slots + 4 queued when the worker is
    SIGKILLed: exactly 1 LaneDeath; the 11 others solve, each run once, in submit order."""
    d = str(tmp_path)
    cfg = _one_seat(fleet_name, profile, {"w": role("marked", slots=8)})
    with running(cfg) as f:
        assert [s.binding for s in f.layout.seats] == [binding]
        first = f.submit("w", (d, 0, LONG_S))
        eventually(lambda: runs(d, 0) == 1, "the first unit runs")
        rest = [f.submit("w", (d, tag, 0)) for tag in range(1, 12)]
        eventually(lambda: in_flight(f) == 8, "the seat's other slots are granted units")
        pid = kill_worker(f)
        with pytest.raises(fleet.UnitFailed) as err:
            first.result(WAIT_S)
        assert err.value.outcome.reason == "LaneDeath" and f"worker pid {pid}" in err.value.outcome.detail
        assert [fut.result(WAIT_S) for fut in rest] == list(range(1, 12))
        assert [runs(d, tag) for tag in range(12)] == [1] * 12  # the one that started never ran again
        assert run_order(d) == [str(tag) for tag in range(12)]  # back at the head, in their order
        ledger = f.ledger()
        assert (ledger["submitted"], ledger["solved"], ledger["failed"], ledger["inflight"]) == (12, 11, 1, 0)
        assert ledger["failed_by_reason"] == {"LaneDeath": 1}


def test_an_io_seat_fails_the_units_it_ran_and_runs_those_waiting_on_it_once(fleet_name, tmp_path):
    """An I/O role's two slots each run a unit, with one sent ahead behind each (its slot
    was busy: not started); a CPU role's unit runs on the seat's serial lane with the
    role's next unit waiting for that lane; more are queued. The worker dies: the three
    that ran fail LaneDeath, every other unit solves, each run once."""
    d = str(tmp_path)
    spec = {"kind": "pooled", "handler": "tests.io_handlers:marked_async", "slots": 2, "peak_cpus": 0,
            "io_bound": True, "queue_bound": 1000}
    with running(_one_seat(fleet_name, "serial", {"io": spec, "w": role("marked", slots=2)})) as f:
        ran = [f.submit("io", (d, tag, LONG_S)) for tag in ("io0", "io1")] + [f.submit("w", (d, "w0", LONG_S))]
        eventually(lambda: all(runs(d, tag) == 1 for tag in ("io0", "io1", "w0")), "both I/O slots and the lane run")
        waiting = [f.submit("w", (d, "w1", 0))] + [f.submit("io", (d, f"io{tag}", 0)) for tag in range(2, 8)]
        eventually(lambda: f._sup.inspect(lambda sup: sup.dispatcher.sent_ahead_total) == 2, "one is sent ahead per slot")
        eventually(lambda: in_flight(f) == 6, "the CPU role's second slot is granted its unit")
        kill_worker(f)
        for fut in ran:
            with pytest.raises(fleet.UnitFailed) as err:
                fut.result(WAIT_S)
            assert err.value.outcome.reason == "LaneDeath"
        assert [fut.result(WAIT_S) for fut in waiting] == ["w1"] + [f"io{tag}" for tag in range(2, 8)]
        assert [runs(d, tag) for tag in ["w0", "w1"] + [f"io{tag}" for tag in range(8)]] == [1] * 10
        ledger = f.ledger()
        assert (ledger["submitted"], ledger["solved"], ledger["failed"], ledger["inflight"]) == (10, 7, 3, 0)


def test_a_chunk_that_started_fails_with_its_worker_and_the_chunks_granted_behind_it_run_once(fleet_name, tmp_path):
    """A chunk of a map is one unit: started once its first item ran (its later items fail
    with it, unrun); the chunks granted to the seat's other slots never started and run."""
    d = str(tmp_path)
    with running(_one_seat(fleet_name, "serial", {"w": role("marked", slots=4)})) as f:
        sup = f._sup
        first = sup.submit("w", [(d, "0.0", LONG_S), (d, "0.1", 0)], chunk=True)
        eventually(lambda: runs(d, "0.0") == 1, "the first chunk runs")
        chunks = [[(d, f"{c}.{i}", 0) for i in range(3)] for c in range(1, 6)]
        rest = [sup.submit("w", items, chunk=True) for items in chunks]
        eventually(lambda: in_flight(f) == 4, "the seat's other slots are granted chunks")
        kill_worker(f)
        with pytest.raises(fleet.UnitFailed) as err:
            first.result(WAIT_S)
        assert err.value.outcome.reason == "LaneDeath"
        for fut, items in zip(rest, chunks):
            values, failures, seconds = fut.result(WAIT_S)
            assert (values, failures) == ([tag for _d, tag, _s in items], {}) and seconds >= 0
        assert runs(d, "0.0") == 1 and runs(d, "0.1") == 0
        assert all(runs(d, tag) == 1 for items in chunks for _d, tag, _s in items)
        ledger = f.ledger()
        assert (ledger["submitted"], ledger["solved"], ledger["failed"], ledger["inflight"]) == (6, 5, 1, 0)


def test_a_unit_killed_for_its_timeout_fails_timeout_and_the_units_behind_it_run(fleet_name, tmp_path):
    d = str(tmp_path)
    with running(_one_seat(fleet_name, "serial", {"w": role("marked", slots=4)})) as f:
        late = f.submit("w", (d, 0, LONG_S), timeout=2.0)
        eventually(lambda: runs(d, 0) == 1, "the first unit runs")
        rest = [f.submit("w", (d, tag, 0)) for tag in range(1, 4)]
        with pytest.raises(fleet.UnitFailed) as err:
            late.result(WAIT_S)
        assert err.value.outcome.reason == "Timeout"
        assert [fut.result(WAIT_S) for fut in rest] == [1, 2, 3]
        assert [runs(d, tag) for tag in range(4)] == [1] * 4
        assert f.ledger()["failed_by_reason"] == {"Timeout": 1}


def test_shutdown_cancelling_futures_still_runs_a_unit_that_came_back_from_a_dead_seat(fleet_name, tmp_path):
    """A unit put back unrun was running from its caller's view (its future cannot be
    cancelled): `shutdown(cancel_futures=True)` runs it rather than leave it unresolved."""
    d = str(tmp_path)
    cfg = _one_seat(fleet_name, "serial", {"w": role("marked", slots=2)})
    with running(cfg) as f:
        f.submit("w", (d, 0, LONG_S))
        eventually(lambda: runs(d, 0) == 1, "the first unit runs")
        behind = f.submit("w", (d, 1, 0))
        eventually(lambda: in_flight(f) == 2, "the second slot is granted a unit")
        assert behind.running()
        hold_grants(f)  # nothing is granted from here on: it stays queued once it is back
        kill_worker(f)
        eventually(lambda: f._sup.inspect(lambda sup: sup.dispatcher.queued(0)) == 1, "it is back in its queue")
        f._sup.shutdown(wait=False, cancel_futures=True)  # applied on the loop before it returns
        release_grants(f)
        assert behind.result(WAIT_S) == 1 and runs(d, 1) == 1
        ledger = f.ledger()
        assert (ledger["submitted"], ledger["solved"], ledger["failed"]) == (2, 1, 1)
