"""Benchmark: does fleet-burst's scheduler keep arrivals on time at 5,000 arrivals/s?

Replays a synthetic trace of `--rate` arrivals/s for `--seconds` against a real embedded
fleet (a pooled CPU role whose units burn `--cpu-ms`, or with `--provider` an I/O role
calling the simulator, in its own process, over HTTP) and prints the arrival lag (real ms:
when the replay called ``submit`` for an arrival minus when it was due) p50/p99/max, against
the issue's bound (2 ms p99). ``lag_ms.driver`` says whether the replay's threads ran in the
real-time class (root) or not; a non-root run measures the normal class.

    python tools/bench/burst_bench.py --json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import time  # noqa: E402
from concurrent.futures import Future  # noqa: E402

from fleet.burst.clock import ReplayClock  # noqa: E402
from fleet.burst.gen import _write  # noqa: E402
from fleet.burst.replay import Driver  # noqa: E402
from fleet.burst.report import summarize  # noqa: E402
from fleet.burst.runner import replay  # noqa: E402
from fleet.burst.trace import Arrival, Route, load  # noqa: E402


class NullSink:
    """Stands in for the fleet to time the scheduler alone: each submit resolves at once."""

    def __init__(self):
        self.n = 0

    def ledger(self):
        return {"submitted": self.n, "solved": self.n, "suppressed": 0, "failed": 0, "inflight": 0}

    def submit(self, role, payload, key=None, lane=None):
        self.n += 1
        f = Future()
        now = time.monotonic()
        f.set_result({"status": 0, "started": now, "ended": now})
        return f


class NoSimulator:
    base_url = "http://127.0.0.1:0"

    def reset(self, *a):
        pass

    def counts(self):
        return {}

    def events(self):
        return []

    def key_closures(self):
        return {}


def scheduler_only(trace):
    """The scheduler and the driver's bookkeeping alone, against the null sink."""
    clock = ReplayClock(1.0, trace.header.start)
    result = Driver(trace, NullSink(), NoSimulator(), clock, "none").run()
    return summarize(result, trace)


def trace_file(path, rate, seconds, cpu_ms, provider):
    header = {"name": "bench", "start": "2026-01-01T00:00:00Z", "seed": 1, "modes": ["none"], "horizon_s": seconds + 30}
    route = None
    if provider:
        header["pools"] = [{"model": "m", "provider": "p", "k": 100000, "latency": {"median_s": 0.005, "sigma": 0.0}}]
        route = Route("m", "p", None)
    n = int(rate * seconds)
    arrivals = [Arrival(round(i / rate, 6), f"a{i}", "work", None, route, None, None, None, (), cpu_ms) for i in range(n)]
    _write(path, header, arrivals)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=5000.0)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--cpu-ms", type=float, default=0.0)
    ap.add_argument("--provider", action="store_true", help="provider rounds over HTTP instead of CPU units")
    ap.add_argument("--sink", choices=("fleet", "null"), default="fleet",
                    help="fleet: a real embedded fleet runs every unit; null: time the scheduler alone")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = f"/tmp/burst-bench-{os.getpid()}.jsonl"
    trace_file(path, args.rate, args.seconds, args.cpu_ms, args.provider)
    try:
        trace = load(path)
        m = scheduler_only(trace) if args.sink == "null" else replay(trace, speed=1.0, progress=False)["modes"][0]
    finally:
        os.unlink(path)
    out = {"sink": args.sink, "rate": args.rate, "arrivals": m["rounds"], "lag_ms": m["lag_ms"], "bound_p99_ms": 2.0,
           "within_bound": m["lag_ms"]["p99"] is not None and m["lag_ms"]["p99"] <= 2.0,
           "ledger_exact": m["ledger"]["exact"], "makespan_s": m["makespan_s"], "ok": m["ok"]}
    print(json.dumps(out, indent=1) if args.json else out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
