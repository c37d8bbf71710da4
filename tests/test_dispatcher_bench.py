"""tools/bench/dispatcher_bench.py at a tiny size: it drives the real dispatcher through a
whole burst (every unit granted and completed, or it fails), reports its figures, and
refuses bad arguments."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "tools", "bench", "dispatcher_bench.py")


def run_bench(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, BENCH, *argv], capture_output=True, text=True, timeout=120, cwd=REPO)


@pytest.mark.parametrize("depth, grants_per_pass", [(0, 2.0), (16, 8.0)])
def test_a_burst_through_the_dispatcher_reports_its_cost_and_pass_size(depth, grants_per_pass):
    out = run_bench("--units", "400", "--repeat", "1", "--depth", str(depth), "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    assert (res["units"], res["seats"], res["depth"]) == (400, 2, depth)
    # nothing ahead: a pass refills the two seats' slots; 16 ahead: a pass refills what a
    # result slice (8) freed (the first pass fills both slots and their 32 ahead)
    assert res["grants_per_pass"] == pytest.approx(grants_per_pass, abs=0.5)
    assert res["us_per_unit"] > 0 and len(res["us_per_unit_runs"]) == 1
    assert 5 < res["python_calls_per_unit"] < 500


@pytest.mark.parametrize("args, says", [(["--units", "0"], "--units must be at least 1"),
                                        (["--depth", "-1"], "--depth must be at least 0")])
def test_a_bad_argument_is_refused(args, says):
    out = run_bench(*args)
    assert out.returncode == 2 and says in out.stderr
