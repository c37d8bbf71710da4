"""tools/bench/latency_stages.py's map view at a tiny size: a real fleet.Executor maps through
it, and it reports each thread's CPU per item and the loop's Python calls per unit; bad
arguments are refused."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "tools", "bench", "latency_stages.py")


def run_bench(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, BENCH, *argv], capture_output=True, text=True, timeout=240, cwd=REPO)


def test_the_map_view_reports_each_threads_cpu_per_item():
    out = run_bench("--map", "8", "--units", "800", "--rounds", "1", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    assert (res["items"], res["chunksize"], res["rounds"]) == (800, 8, 1)
    assert set(res["ns_per_item"]) == {"wall", "caller", "loop", "workers (all)"}
    assert all(v > 0 for v in res["ns_per_item"].values()) and res["items_per_s"] > 0
    assert 5 < res["loop_python_calls_per_unit"] < 1000


@pytest.mark.parametrize("args, says", [(["--map", "0"], "--map (a chunksize) must be at least 1"),
                                        (["--map", "4", "--burst"], "--map and --burst are two views"),
                                        (["--rounds", "0"], "--rounds must be at least 1")])
def test_a_bad_argument_is_refused(args, says):
    out = run_bench(*args)
    assert out.returncode == 2 and says in out.stderr
