"""The seats follow the quota (002 §3.4, §5; T9 at the epoch boundary): a real fleetd in a
real v1 cpu cgroup this test makes (and removes), its quota changed live under a steady
load of submits. After each change: as many workers as the new budget lays out, each
pinned (every thread of it) to the CPUs it lays out, the retired worker gone, every unit
one outcome and none failed, the ledger balanced, no lane death, /dev/shm clean."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from fleet.rules import titles
from tests import require
from tests.cgroups import FleetdInGroup, cpu_group
from tests.daemons import BOUND_S, alive, segments, wait_until

#: 20 ms of CPU a unit: long enough that units are in flight on a seat as it retires
SPIN_US = 20_000
WINDOW = 8  # units in flight at once from the load


def _cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _workers(doc) -> dict[int, list[int]]:
    """pid -> the CPUs its census rows say, for the workers the census shows."""
    return {r["pid"]: sorted(r["cpus"]) for r in doc["census"] if r["pid"]}


def _retired_rows(doc, live_pids) -> dict:
    """slot -> (state, units done) of the slots of seats no live worker runs."""
    live = {r["seat"] for r in doc["census"] if r["pid"] in live_pids}
    return {r["slot"]: (r["state"], r["done"]) for r in doc["census"] if r["seat"] not in live}


def _affinity(pid: int) -> set[tuple[int, ...]]:
    """The affinity of every thread of `pid` (one entry when they all agree)."""
    return {tuple(sorted(os.sched_getaffinity(int(tid)))) for tid in os.listdir(f"/proc/{pid}/task")}


class Load:
    """Submits units without pause, WINDOW in flight, until stopped; keeps every future."""

    def __init__(self, client):
        self.client, self.futures, self.stop = client, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        gate = threading.Semaphore(WINDOW)
        while not self.stop.is_set():
            if not gate.acquire(timeout=0.1):
                continue
            future = self.client.submit("w", SPIN_US)
            future.add_done_callback(lambda _f: gate.release())
            self.futures.append(future)

    def end(self):
        self.stop.set()
        self.thread.join(BOUND_S)
        return self.futures


def _settled(d, epoch: int, want: list[list[int]]):
    """Status once epoch `epoch` is in force and its workers are exactly `want` (CPUs per
    worker, sorted): the census's, and each worker's own affinity, every thread of it."""
    def probe():
        doc = d.ctl_json("status")
        if doc["quota"]["epoch"] != epoch:
            return None
        workers = _workers(doc)
        if sorted(workers.values()) != want:
            return None
        try:
            seen = sorted(list(a) for pid in workers for a in _affinity(pid))
        except FileNotFoundError:
            return None  # a worker left between the status and the read
        return doc if seen == want else None
    return wait_until(probe, f"epoch {epoch} on workers {want}")


def _loop_affinity(d) -> list[int]:
    """The supervisor loop thread's affinity (its thread is named `titles.LOOP_THREAD`)."""
    for tid in os.listdir(f"/proc/{d.proc.pid}/task"):
        with open(f"/proc/{d.proc.pid}/task/{tid}/comm") as f:
            if f.read().strip() == titles.LOOP_THREAD[:15]:
                return sorted(os.sched_getaffinity(int(tid)))
    raise AssertionError("no loop thread")


@pytest.mark.root
@pytest.mark.parametrize("loop, at_two, at_one, loop_at_two", [
    # the loop ahead of its workers by priority: a worker per CPU, then one; the loop not pinned
    ("priority", [[0], [1]], [[0]], [0, 1]),
    # a core reserved for the loop at 2 CPUs (serial-0 on CPU 1); none at 1: the worker moves
    # to CPU 0 and the loop may run anywhere
    ("auto", [[1]], [[0]], [0]),
])
def test_the_seats_follow_a_live_quota_change_under_load(fleet_name, loop, at_two, at_one, loop_at_two):
    if _cpus() != [0, 1]:
        require.lacking("laid out for a 2-CPU host")  # the expected CPUs below are this host's
    roles = {"w": {"kind": "pooled", "handler": "tests.handlers:spin", "slots": 4, "queue_bound": 100_000}}
    with cpu_group(2.0) as group:
        # the epoch's pins exactly, under load: no worker widened by contention meanwhile
        # (fleet.rules.contention; tests/runtime/test_contention.py has that)
        d = FleetdInGroup(fleet_name, roles, group, fleet={"contention": "pin"}, extra={"budget": {"loop": loop}})
        try:
            d.start()
            booted = _settled(d, 0, at_two)
            assert _loop_affinity(d) == loop_at_two
            pids = {0: set(_workers(booted))}
            with d.connect() as client:
                load = Load(client)
                wait_until(lambda: len(load.futures) > 3 * WINDOW, "the load running")

                group.set_quota(1.0)
                doc = _settled(d, 1, at_one)
                pids[1] = set(_workers(doc))
                assert _loop_affinity(d) == [0, 1]  # no core reserved for it at 1 CPU
                gone = pids[0] - pids[1]
                assert len(gone) == len(at_two) - len(at_one)
                wait_until(lambda: not alive(gone), "the retired worker gone")
                retired = _retired_rows(d.ctl_json("status"), pids[1])
                done = len(load.futures)
                wait_until(lambda: len(load.futures) > done + 2 * WINDOW, "the load served on one worker")
                # a retired seat is granted nothing: its slots stay Idle, their run counts still
                assert _retired_rows(d.ctl_json("status"), pids[1]) == retired
                assert all(state == "Idle" for state, _done in retired.values()), retired

                group.set_quota(2.0)
                doc = _settled(d, 2, at_two)
                assert _loop_affinity(d) == loop_at_two
                done = len(load.futures)
                wait_until(lambda: len(load.futures) > done + 2 * WINDOW, "the load served on the grown seats")
                futures = load.end()
                results = [f.result(BOUND_S) for f in futures]  # every unit solved: none lost, none failed
                assert results == [None] * len(futures)

            doc = d.ctl_json("status")
            ledger = doc["ledger"]
            assert ledger["submitted"] == ledger["solved"] == len(futures), ledger
            assert ledger["failed"] == ledger["inflight"] == 0 and ledger["fsm_refused"] == 0, ledger
            # no lane death: the retired worker's leaving was the supervisor's own (throttling
            # under the shrunk quota may cordon: that is the posture's to say)
            assert "lane-death" not in str(doc["posture"]), doc["posture"]
            assert "lane death" not in d.stderr().lower()
            err = d.stderr()
            assert "epoch 1: seats: " in err and "epoch 2: seats: " in err, err
            if len(at_two) > len(at_one):
                assert "retiring w-1" in err and "adding w-1 on CPUs [1]" in err, err
            else:
                assert "moving serial-0 to CPUs [0]" in err and "moving serial-0 to CPUs [1]" in err, err
            d.signal(signal.SIGTERM)
            assert d.wait() == 0
            assert not segments(fleet_name)
        finally:
            d.cleanup()
