"""A process forked off a worker by a unit's code is not the worker (fleet.worker.strays).

A unit that forks and whose child returns, raises, calls sys.exit or returns after a
while: the child ends there with the status a Python process would have, the unit's
outcome is its parent's and arrives once, the worker goes on serving (no death, no
second worker), and nothing is left in /dev/shm. On both faces: the Executor in a real
program of its own (the fuse's default action would abort it), the Fleet on a plain
seat and on an I/O seat (a thread's unit and a coroutine's). A chunk of a map whose
item forks: the child runs none of the items after it.

And what a unit can do behind its worker's back (write to the result ring from a child
of its own) never trips the fuse: the supervisor drops and counts every message that is
no owed unit's outcome.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import psutil
import pytest

from fleet.rules.ledger import FuseTripped
from tests import forking
from tests.daemons import BOUND_S, REPO, wait_until
from tests.fleets import config, running, unique_name, worker_pids


def _ended_or_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


_live_children = forking.live_children


def _map_records(path) -> dict[int, list[int]]:
    runs: dict[int, list[int]] = {}
    with open(path) as f:
        for line in f:
            i, pid = map(int, line.split())
            runs.setdefault(i, []).append(pid)
    return runs


def _check_outcomes(results: dict) -> None:
    for how in forking.HOWS:
        parent, what = results[how]
        assert parent == "parent", (how, results[how])
        if how != "sleep":
            assert what == forking.STATUS[how], f"the child of {how!r} ended with status {what} (None: it ran on)"


def _check_map(values, path, workers) -> None:
    assert values == [(0, None), (1, 0), (2, None), (3, None)]
    runs = _map_records(path)
    # every item ran once, in the worker; the forked child of item 1 ran none after it
    assert {i: len(p) for i, p in runs.items()} == {0: 1, 1: 1, 2: 1, 3: 1}, runs
    assert {p for pids in runs.values() for p in pids} <= set(workers)


# --- the Executor, in a program of its own --------------------------------------------
SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {repo!r})
    import psutil
    import fleet
    from tests import forking

    if __name__ == "__main__":
        out = {{}}
        with fleet.Executor(max_workers=1) as ex:
            out["workers"] = sorted(ex._sup.pids().values())
            for how in forking.HOWS:
                out[how] = ex.submit(forking.fork_then, how).result(60)
            out["map"] = list(ex.map(forking.record_then_fork, [{path!r}] * 4, range(4), chunksize=4, timeout=60))
            out["next"] = ex.submit(pow, 2, 5).result(60)
            sleeper = out["sleep"][1]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if psutil.Process(sleeper).status() == psutil.STATUS_ZOMBIE:
                        break
                except psutil.NoSuchProcess:
                    break
                time.sleep(0.01)
            out["workers_after"] = sorted(ex._sup.pids().values())
            out["live_children"] = forking.live_children(out["workers"])
            out["ledger"] = ex._sup.ledger_counts().to_dict()
            out["name"] = ex._sup.name
        print(json.dumps(out))
""")


def test_an_executor_task_that_forks_keeps_its_parents_outcome_and_the_program_lives(tmp_path):
    path = tmp_path / "map.txt"
    script = tmp_path / "forks.py"
    script.write_text(SCRIPT.format(repo=REPO, path=str(path)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stderr[-3000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    _check_outcomes({how: tuple(out[how]) for how in forking.HOWS})
    _check_map([tuple(v) for v in out["map"]], path, out["workers"])
    assert out["next"] == 32
    assert out["workers_after"] == out["workers"], "a worker died"
    assert out["live_children"] == [], "a forked child still runs"
    ledger = out["ledger"]
    assert (ledger["submitted"], ledger["solved"], ledger["failed"]) == (6, 6, 0), ledger
    assert (ledger["fsm_refused"], ledger["stray_results"]) == (0, 0), ledger
    assert "came back into fleet's worker" in proc.stderr  # each child says why it ended
    assert not [p for p in os.listdir("/dev/shm") if p.startswith(f"fleet.{out['name']}")]


# --- the Fleet: a plain seat, an I/O seat's thread and its coroutine ----------------------
ROLES = {
    "plain": {"handler": "tests.forking:fork_unit"},
    "thread": {"handler": "tests.forking:fork_unit", "io_bound": True},
    "coroutine": {"handler": "tests.forking:fork_unit_async", "io_bound": True},
}


@pytest.mark.parametrize("kind", sorted(ROLES))
def test_a_fleet_unit_that_forks_keeps_its_parents_outcome(kind, tmp_path):
    tripped: list = []
    role = {"kind": "pooled", "slots": 2, "peak_cpus": 0 if ROLES[kind].get("io_bound") else 1,
            **ROLES[kind]}
    roles = {"f": role, "m": {"kind": "pooled", "handler": "tests.forking:record_then_fork_unit", "slots": 1,
                              "peak_cpus": 1}}
    with running(config(unique_name("fk"), roles), on_fuse=tripped.append) as f:
        workers = worker_pids(f)
        results = {how: f.submit("f", how).result(BOUND_S) for how in forking.HOWS}
        path = str(tmp_path / "map.txt")
        values = list(f.map("m", [(path, i) for i in range(4)], chunksize=4, timeout=BOUND_S))
        wait_until(lambda: _ended_or_zombie(results["sleep"][1]), "the sleeping child ended")
        _check_outcomes(results)
        _check_map(values, path, workers)
        assert set(f._sup.pids().values()) == workers, "a worker died"
        assert _live_children(workers) == [], "a forked child still runs"
        ledger = f.ledger()
        assert (ledger["submitted"], ledger["solved"], ledger["failed"]) == (5, 5, 0), ledger
        assert (ledger["fsm_refused"], ledger["stray_results"]) == (0, 0), ledger
    assert tripped == []


def test_messages_no_owed_unit_sent_are_dropped_and_counted_never_a_fuse_trip():
    tripped: list[FuseTripped] = []
    roles = {"s": {"kind": "pooled", "handler": "tests.forking:scribble", "slots": 2, "peak_cpus": 1}}
    with running(config(unique_name("st"), roles), on_fuse=tripped.append) as f:
        workers = worker_pids(f)
        first = f.submit("s", 10**9)  # a unit id never handed out
        assert first.result(BOUND_S) == ("parent", 0)
        # the first unit's id, which has its outcome: a duplicate
        assert f.submit("s", first.unit_id).result(BOUND_S) == ("parent", 0)
        ledger = wait_until(lambda: (c := f.ledger())["stray_results"] == 8 and c, "8 strays counted")
        assert (ledger["submitted"], ledger["solved"], ledger["failed"], ledger["fsm_refused"]) == (2, 2, 0, 0)
        assert f.status()["ledger"]["stray_results"] == 8  # the table shows it to fleetctl status
        assert set(f._sup.pids().values()) == workers
    assert tripped == []
