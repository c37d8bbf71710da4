"""tools/bench/service_data_bench.py at a tiny size: it measures both faces in both
directions (a number for each, not an error's text) and leaves no fleetd or segment behind."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "tools", "bench", "service_data_bench.py")


def test_a_tiny_run_measures_fleetd_and_the_executor_both_ways_and_leaves_nothing():
    bench = subprocess.Popen([sys.executable, BENCH, "--sizes", "512K", "--repeat", "1", "--calls", "2", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        out, err = bench.communicate(timeout=240)
    finally:
        bench.kill()
        bench.wait()
    assert bench.returncode == 0, err[-3000:]
    res = json.loads(out)
    for face in ("fleetd", "executor"):
        for way in ("in", "out"):
            figure = res[f"{face} {way} 512K"]
            assert isinstance(figure, float) and figure > 0, (face, way, figure)
    assert not [p for p in psutil.Process().children(recursive=True) if "fleetd" in " ".join(p.cmdline())]
    # the segments of its fleetd, which the bench names after its own pid
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"fleet.bench-data-{bench.pid}-")]
