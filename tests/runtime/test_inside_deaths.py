"""Deaths and cancels of units that submit units (issue 47, item 3): a parent that dies or
is stopped takes its children that have not started with it (Cancelled), its children
that run finish, a child that dies fails alone and its parent sees LaneDeath as its
outcome; every unit gets exactly one outcome and the ledger balances.

Real fleets on two seats (the pinned binding, forced on 2 CPUs): the parent's role on
one, the children's on the other, so a child runs apart from its parent's process; the
parent's other children ride the parent's slot (fleet.rules.dispatch). The handlers note
what they did in files (`tests.inside_handlers`), so "ran" and "never ran" are read from
them, not from the fleet's books.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

import fleet
from tests.fleets import config, running

WAIT_S = 120.0


def role(handler: str, **fields) -> dict:
    spec = {"kind": "pooled", "handler": f"tests.inside_handlers:{handler}", "slots": 1, "queue_bound": 1000}
    spec.update(fields)
    return spec


def two_seats(name: str, parent: str) -> dict:
    cfg = config(name, {"parent": role(parent), "sim": role("held_child")}, profile="pinned",
                 restart={"max_restarts": 100, "within_seconds": 10})
    cfg["fleet"]["cpus"] = 2
    cfg["budget"] = {"oversubscribe": True}  # a seat per role on 2 CPUs: the point is the two processes
    return cfg


def eventually(predicate, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


def lines(directory, name) -> list[list[str]]:
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.split() for line in f.read().splitlines()]


def settled(f) -> dict:
    eventually(lambda: f.ledger()["inflight"] == 0, "every unit has its outcome")
    ledger = f.ledger()
    assert ledger["submitted"] == ledger["solved"] + ledger["failed"] + ledger["suppressed"]
    return ledger


def parent_waiting_with_children_running_and_queued(f, directory, **submit) -> tuple:
    """A parent with 5 children: child 0 runs on the sim seat, child 1 runs on the parent's
    slot (a rider), child 2 waits on the parent's seat behind it, 3 and 4 queued."""
    parent = f.submit("parent", (str(directory), 5, "sim"), **submit)
    eventually(lambda: lines(directory, "parent") and lines(directory, "child-0") and lines(directory, "child-1"),
               "child 0 runs on the sim seat and child 1 on its parent's slot")
    parent_pid = int(lines(directory, "parent")[0][1])
    assert int(lines(directory, "child-1")[0][1]) == parent_pid  # it rides its parent's slot
    assert int(lines(directory, "child-0")[0][1]) != parent_pid  # it runs apart
    return parent, parent_pid


def test_a_parent_sigkilled_cancels_its_queued_children_and_its_running_child_finishes(fleet_name, tmp_path):
    with running(two_seats(fleet_name, "held_parent")) as f:
        parent, parent_pid = parent_waiting_with_children_running_and_queued(f, tmp_path)
        os.kill(parent_pid, signal.SIGKILL)
        with pytest.raises(fleet.UnitBroken) as info:
            parent.result(WAIT_S)
        assert info.value.reason == "LaneDeath"
        (tmp_path / "release").touch()  # child 0, on the other seat, finishes
        ledger = settled(f)
        assert ledger["submitted"] == 6
        assert ledger["solved"] == 1  # child 0
        # the parent and the child that ran in its process; the three that never started
        assert ledger["failed_by_reason"] == {"LaneDeath": 2, "Cancelled": 3}
        assert [w for w, _pid in lines(tmp_path, "child-0")] == ["start", "end"]
        assert [w for w, _pid in lines(tmp_path, "child-1")] == ["start"]
        assert all(not lines(tmp_path, f"child-{i}") for i in (2, 3, 4))  # cancelled: never ran


def test_a_parent_stopped_by_its_timeout_cancels_its_queued_children(fleet_name, tmp_path):
    # The fleet stops a parent that ran past its timeout (its worker is killed): the same rule.
    with running(two_seats(fleet_name, "held_parent")) as f:
        parent, _pid = parent_waiting_with_children_running_and_queued(f, tmp_path, timeout=1.0)
        with pytest.raises(fleet.UnitFailed) as info:
            parent.result(WAIT_S)
        assert info.value.reason == "Timeout"
        (tmp_path / "release").touch()
        ledger = settled(f)
        assert ledger["submitted"] == 6 and ledger["solved"] == 1
        assert ledger["failed_by_reason"] == {"Timeout": 1, "LaneDeath": 1, "Cancelled": 3}
        assert all(not lines(tmp_path, f"child-{i}") for i in (2, 3, 4))


def test_the_operators_cancel_of_a_running_parent_cancels_its_queued_children(fleet_name, tmp_path):
    # The cancel op (fleetctl cancel, Client.cancel, the embedded fleet's operations) on a
    # running parent: it runs on; its children that have not started are cancelled (they
    # never run), those that run finish; the parent hears Cancelled as their outcomes.
    n = 8
    with running(two_seats(fleet_name, "held_parent_outcomes")) as f:
        parent = f.submit("parent", (str(tmp_path), n, "sim"))
        eventually(lambda: lines(tmp_path, "parent") and lines(tmp_path, "child-0") and lines(tmp_path, "child-1"),
                   "child 0 runs on the sim seat and child 1 on its parent's slot")
        try:
            reply = f.operations.cancel(parent.unit_id)
        finally:
            (tmp_path / "release").touch()  # the children that run end, whatever the reply
        assert (reply["state"], reply["cancelled"]) == ("running", False)
        cancelled = reply["children"]
        # 0 and 1 run, and at most two more wait behind them on the seats: the rest were queued
        assert n - 4 <= cancelled <= n - 2
        seen = parent.result(WAIT_S)
        ran = [i for i in range(n) if lines(tmp_path, f"child-{i}")]
        assert len(ran) == n - cancelled and {0, 1} <= set(ran)
        assert all([w for w, _pid in lines(tmp_path, f"child-{i}")] == ["start", "end"] for i in ran)
        assert seen == [i if i in ran else "Cancelled" for i in range(n)]
        ledger = settled(f)
        assert (ledger["submitted"], ledger["solved"]) == (1 + n, 1 + len(ran))
        assert ledger["failed_by_reason"] == {"Cancelled": cancelled}
        assert f.operations.cancel(parent.unit_id)["children"] == 0  # ended: nothing left to cancel


def test_a_child_sigkilled_fails_alone_and_its_parent_sees_lane_death(fleet_name, tmp_path):
    with running(two_seats(fleet_name, "watch_child")) as f:
        parent = f.submit("parent", str(tmp_path))
        eventually(lambda: lines(tmp_path, "child-0") and lines(tmp_path, "parent"), "the child runs")
        child_pid = int(lines(tmp_path, "child-0")[0][1])
        assert child_pid != int(lines(tmp_path, "parent")[0][1])
        os.kill(child_pid, signal.SIGKILL)
        assert parent.result(WAIT_S) == ("UnitBroken", "LaneDeath", True)
        ledger = settled(f)
        assert (ledger["submitted"], ledger["solved"], ledger["failed_by_reason"]) == (2, 1, {"LaneDeath": 1})
