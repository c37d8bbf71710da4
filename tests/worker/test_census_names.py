"""Every process fleet starts shows a name of its own where operators look
(fleet.rules.titles): read from /proc/<pid>/comm and /proc/<pid>/cmdline of real workers,
a real fork server and a real fleetd."""
from __future__ import annotations

import os
import threading

from fleet.rules import titles
from tests import forking
from tests.daemons import Fleetd, wait_until
from tests.fleets import config, running, unique_name, worker_pids


def comm(pid: int, task: int | None = None) -> str:
    path = f"/proc/{pid}/comm" if task is None else f"/proc/{pid}/task/{task}/comm"
    with open(path) as f:
        return f.read().rstrip("\n")


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().rstrip(b"\0").decode()


def _names_by_seat(f) -> dict:
    """(comm, cmdline) of each seat's worker, once each has served a unit (a worker
    names itself as it starts, after the fork server said it forked it)."""
    for role in f.config.roles:
        assert f.submit(role.name, 1).result(60) == 1
    worker_pids(f)
    return {f.layout.seats[seat].name: (comm(pid), cmdline(pid)) for seat, pid in f._sup.pids().items()}


def test_each_worker_is_named_for_its_fleet_role_and_seat_and_the_fork_server_for_its_fleet():
    name = unique_name("nm")
    roles = {
        "solver": {"kind": "pooled", "handler": "tests.handlers:echo", "slots": 1, "peak_cpus": 1},
        "pool_state_updater": {"kind": "pooled", "handler": "tests.handlers:echo", "slots": 1, "peak_cpus": 1},
    }
    with running(config(name, roles, profile="pinned")) as f:
        names = _names_by_seat(f)
        assert names == {
            "solver-0": ("fleet-solver-0", f"fleet-{name}-solver-0"),
            "pool_state_updater-0": ("fleet-pool_st-0", f"fleet-{name}-pool_state_updater-0"),
        }
        zygote = f._sup.inspect(lambda sup: sup.seats.workers.zygote.pid)
        assert (comm(zygote), cmdline(zygote)) == ("fleet-forksrv", f"fleet-{name}-forkserver")
        # the program that embeds the fleet keeps its name; its loop thread is named
        assert comm(os.getpid()) != "fleet-loop"
        (loop,) = [t for t in threading.enumerate() if t.name == f"fleet-{name}"]
        assert comm(os.getpid(), loop.native_id) == titles.LOOP_THREAD


def test_the_serial_seat_that_runs_every_role_is_named_serial():
    name = unique_name("ns")
    roles = {r: {"kind": "pooled", "handler": "tests.handlers:echo", "slots": 1, "peak_cpus": 1} for r in ("a", "b")}
    with running(config(name, roles, profile="serial")) as f:
        assert _names_by_seat(f) == {"serial-0": ("fleet-serial-0", f"fleet-{name}-serial-0")}


def test_a_child_a_unit_forked_is_told_from_its_worker(tmp_path):
    name = unique_name("nc")
    roles = {"w": {"kind": "pooled", "handler": "tests.forking:fork_and_wait", "slots": 1, "peak_cpus": 1}}
    go = str(tmp_path / "go")
    with running(config(name, roles)) as f:
        (worker,) = worker_pids(f)
        child = f.submit("w", go).result(forking.CHILD_BOUND_S)
        try:
            wait_until(lambda: os.path.exists(go + ".ready"), "the child runs")
            assert cmdline(child) == cmdline(worker) + "-child"
            assert cmdline(worker).startswith(f"fleet-{name}-")
        finally:
            open(go, "w").close()
        wait_until(lambda: not os.path.exists(f"/proc/{child}/cmdline") or cmdline(child) == "",
                   "the child ended")


def test_fleetd_is_named_for_its_fleet_with_its_arguments(fleet_name):
    roles = {"w": {"kind": "pooled", "handler": "tests.handlers:echo", "slots": 1, "peak_cpus": 1}}
    with Fleetd(fleet_name, roles) as d:
        pid = d.proc.pid
        assert comm(pid) == f"fleetd-{fleet_name}"[:titles.COMM_BYTES]
        assert cmdline(pid).startswith(f"fleetd-{fleet_name} ") and d.config_path in cmdline(pid)
        workers = {p for p in d.descendants() if cmdline(p).startswith(f"fleet-{fleet_name}-")}
        assert {cmdline(p) for p in workers} >= {f"fleet-{fleet_name}-forkserver"}
        assert len(workers) >= 2  # the fork server and the workers
