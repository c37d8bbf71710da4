"""Dispatch priority: the supervisor's loop runs `[fleet] dispatch_priority` nice levels
above its workers; raised itself where the process may, the workers lowered where not."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from fleet.host import priority
from fleet.cli.cmd_status import render
from fleet.host.priority import CAP_SYS_NICE, decide, may_lower_nice
from tests.fleets import config, role, running

CAP = 1 << CAP_SYS_NICE


# --- the rule (pure) ----------------------------------------------------------------------
def test_with_cap_sys_nice_the_loop_goes_up_and_the_workers_keep_the_process_nice():
    assert decide(10, 0, CAP, 0) == (10, 0, -10, 0)
    assert decide(10, 5, CAP, 0) == (10, 5, -5, 5)


def test_without_the_privilege_the_workers_go_down_instead():
    assert decide(10, 0, 0, 0) == (10, 0, 0, 10)
    assert decide(10, 0, CAP - 1 | CAP << 1, 0) == (10, 0, 0, 10)  # every other capability: not enough


def test_rlimit_nice_lets_an_unprivileged_process_raise_its_loop_as_far_as_it_allows():
    assert may_lower_nice(-10, 0, 30) and not may_lower_nice(-11, 0, 30)
    assert decide(10, 0, 0, 30) == (10, 0, -10, 0)
    assert decide(10, 0, 0, 29) == (10, 0, 0, 10)  # not the whole way: the workers move instead


def test_the_levels_are_kept_at_the_ends_of_the_nice_range_as_far_as_they_fit():
    assert decide(10, -15, CAP, 0) == (10, -15, -20, -10)  # loop at the floor, workers take the rest
    assert decide(10, 15, 0, 0) == (10, 15, 15, 19)  # workers at the ceiling
    assert decide(39, 0, CAP, 0) == (39, 0, -20, 19)


def test_zero_levels_changes_nothing():
    p = decide(0, 3, CAP, 0)
    assert (p.loop_nice, p.worker_nice, p.raises_loop) == (3, 3, False)
    assert "loop and workers at nice 3" in p.describe()


def test_the_description_says_which_side_moved_and_why():
    assert decide(10, 0, CAP, 0).describe() == "loop at nice -10, workers at nice 0 (loop raised)"
    assert "no CAP_SYS_NICE" in decide(10, 0, 0, 0).describe()


# --- real fleets ----------------------------------------------------------------------------
def _nice_of(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def test_as_root_the_loop_thread_alone_runs_above_the_workers(fleet_name):
    assert os.geteuid() == 0, "CI runs as root (see PLATFORM.md)"
    base = _nice_of(0)
    with running(config(fleet_name, {"work": role("my_nice", slots=2, peak_cpus=2)}, profile="pinned")) as f:
        nices = {f.submit("work", i).result(30) for i in range(20)}
        loop = next(t for t in threading.enumerate() if t.name == f"fleet-{fleet_name}")
        assert _nice_of(loop.native_id) == base - 10
        assert nices == {base}  # every worker at the process's nice
        assert _nice_of(threading.get_native_id()) == base  # the caller's thread is left alone
        doc = f.status()
        assert doc["dispatch_priority"] == {"levels": 10, "loop_nice": base - 10, "worker_nice": base}
        assert f"priority  loop at nice {base - 10}, workers at nice {base} (dispatch_priority = 10)" in render(doc)


def test_dispatch_priority_zero_leaves_every_thread_and_worker_at_the_process_nice(fleet_name):
    base = _nice_of(0)
    cfg = config(fleet_name, {"work": role("my_nice", slots=2, peak_cpus=2)}, profile="pinned")
    cfg["fleet"]["dispatch_priority"] = 0
    with running(cfg) as f:
        assert {f.submit("work", i).result(30) for i in range(20)} == {base}
        loop = next(t for t in threading.enumerate() if t.name == f"fleet-{fleet_name}")
        assert _nice_of(loop.native_id) == base


_UNPRIVILEGED = """
import json, os, sys, threading
sys.path.insert(0, {root!r})
from tests.fleets import config, role, running
with running(config({name!r}, {{"work": role("my_nice", slots=2, peak_cpus=2)}}, profile="pinned")) as f:
    workers = sorted({{f.submit("work", i).result(30) for i in range(20)}})
    loop = next(t for t in threading.enumerate() if t.name == "fleet-" + {name!r})
    print(json.dumps({{"workers": workers, "loop": os.getpriority(os.PRIO_PROCESS, loop.native_id),
                      "status": f.status()["dispatch_priority"]}}))
"""


def test_without_cap_sys_nice_the_workers_run_below_the_loop_instead(fleet_name):
    # A real fleet whose process lacks CAP_SYS_NICE (dropped from its bounding set before
    # exec; RLIMIT_NICE stays 0): it cannot raise its loop, so its workers go down.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = _UNPRIVILEGED.format(root=root, name=fleet_name)
    out = subprocess.run(["setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    base = _nice_of(0)
    assert got == {"workers": [base + 10], "loop": base,
                   "status": {"levels": 10, "loop_nice": base, "worker_nice": base + 10}}


def test_this_process_reads_the_callers_nice_and_privilege():
    p = priority.this_process(4)
    assert p.base == _nice_of(0) and p.levels == 4
    assert p.raises_loop == (os.geteuid() == 0)  # CI runs as root: CAP_SYS_NICE


def test_a_worker_raises_its_oom_score_adj_by_500_up_to_the_kernels_maximum(tmp_path):
    """Raising needs no privilege; lowering would. Mutation that turns it red: subtracting."""
    from fleet.host.priority import oom_score_adj_after, raise_oom_score

    assert [oom_score_adj_after(v) for v in (0, 200, 600, -1000)] == [500, 700, 1000, -500]
    path = tmp_path / "oom_score_adj"
    path.write_text("100\n")
    assert raise_oom_score(str(path)) == 600 and path.read_text() == "600"
    assert raise_oom_score(str(tmp_path / "absent")) is None  # logged, never raised
