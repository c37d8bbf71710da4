"""fleet-burst stopped mid-replay: SIGTERM and SIGINT (also when the process started with SIGINT
ignored, as a background job of a script does) unwind it, and it leaves nothing: no shared segment
of its fleet in /dev/shm, no process of its own (zygote, workers, the provider simulator)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from fleet.shm import dataplane
from fleet.burst.trace import FORMAT, VERSION
from fleet.shm.table import segment

from tests.fleets import unique_name

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": REPO}
BOUND_S = 120


def long_trace(path):
    """Rounds every 0.5 s for 100 s at speed 1 (4 s each on a pool of 3): still running when stopped."""
    header = {"format": FORMAT, "version": VERSION, "name": "long", "start": "2026-10-07T09:00:00Z", "seed": 1,
              "speed": 1, "horizon_s": 400, "modes": ["none", "cap"],
              "pools": [{"model": "m", "provider": "p", "k": 3, "latency": {"median_s": 4, "sigma": 0.1}}]}
    arrivals = [{"t": i * 0.5, "id": f"r{i}", "role": "review", "route": {"model": "m", "provider": "p"}}
                for i in range(200)]
    arrivals += [{"t": 1.25 + i, "id": f"c{i}", "role": "crunch", "cpu_ms": 20.0} for i in range(50)]
    rows = [json.dumps(header)] + [json.dumps(a) for a in sorted(arrivals, key=lambda a: a["t"])]
    path.write_text("\n".join(rows) + "\n")


def segments_of(name):
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"fleet.{name}"))


def ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("signum, sigint_ignored", [(signal.SIGTERM, False), (signal.SIGINT, False),
                                                    (signal.SIGINT, True)],
                         ids=["sigterm", "sigint", "sigint-started-ignored"])
def test_a_signal_mid_replay_stops_it_and_leaves_nothing(tmp_path, signum, sigint_ignored):
    trace = tmp_path / "long.jsonl"
    long_trace(trace)
    name = unique_name(f"burstsig{signum}{int(sigint_ignored)}-")
    proc = subprocess.Popen([sys.executable, "-m", "fleet.burst.cli", "replay", str(trace), "--no-progress",
                             "--report", str(tmp_path / "rep"), "--name", name],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=ignore_sigint if sigint_ignored else None)
    children = []
    try:
        said = []
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:  # the console says when the rounds start
            line = proc.stderr.readline()
            said.append(line)
            if not line or "replaying" in line:
                break
        assert "replaying" in said[-1], "".join(said)
        assert "booting the fleet" in said[0] and "warming up" in said[-2], said  # the seconds before a round
        time.sleep(3)  # mid-replay: rounds in flight, CPU units running
        assert segments_of(name), "the replay fleet's segments exist while it runs"
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 3  # the zygote, a worker, the simulator
        proc.send_signal(signum)
        err = proc.stderr.read()
        assert proc.wait(BOUND_S) == 128 + signum, err
        left = segments_of(name)  # before the cleanup below unlinks what a failing run left
        _gone, alive = psutil.wait_procs(children, timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for child in children:
            if child.is_running():
                child.kill()
        segment.unlink(name)
        dataplane.unlink(name)
    assert f"stopped by {signal.Signals(signum).name}" in err and "Traceback" not in err, err
    assert left == []
    assert alive == [], [c.pid for c in alive]
