#!/usr/bin/env python3
"""What the unit watch (fleet.runtime.spans) costs the loop: off, makespans only, spans.

    python tools/bench/spans_bench.py [--json] [--units N] [--repeat R] [--only off,...]

Three fleets of one pooled no-op role, open side by side for the whole run:
  off        no [metrics], no spans: the books hold no watch (one attribute check per
             place a unit moves)
  makespans  [metrics] enabled: the watch stamps each unit, the exporter's histogram
  spans      [metrics] spans: the watch and a span per unit, on an SDK tracer provider
             with no exporter (the span is made and ended, then dropped)
Measures, each the median of --repeat rounds, every contender once per round, one
right after another (a slow stretch of a shared machine falls on all alike):
  submit_units_per_s   --units single submits, then every result
  round_trip_us_p50    one unit in flight at a time
  loop_cpu_us_per_unit the supervisor loop thread's CPU time (schedstat, ns) over the
                       submit runs, per unit: the loop's own cost, which a busy shared
                       machine's waits do not inflate as they do throughput
  check_ns             the off path's own cost: one ``watch is not None`` check, timed
                       alone (the loop makes four per unit)
Ratios are contender / off. ``--only off`` runs just the off fleet, so the same command
run against another checkout (PYTHONPATH=<tree>) compares the trees, round for round.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import timeit
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fleet  # noqa: E402

CONTENDERS = ("off", "makespans", "spans")
ROUND_TRIPS = 1000


def config(kind: str) -> dict:
    cfg = {"fleet": {"name": f"spb{os.getpid()}{kind[:2]}{uuid.uuid4().hex[:6]}"},
           "roles": {"w": {"kind": "pooled", "handler": "bench_handlers:unit_work", "slots": 2, "peak_cpus": 1,
                           "queue_bound": 1_000_000}}}
    if kind == "makespans":
        cfg["metrics"] = {"enabled": True, "host": "127.0.0.1", "port": 0}
    elif kind == "spans":
        cfg["metrics"] = {"spans": True}
    return cfg


def loop_cpu_ns(f) -> int:
    """CPU ns the fleet's supervisor loop thread has run (/proc/self/task/TID/schedstat)."""
    import threading

    (tid,) = [t.native_id for t in threading.enumerate() if t.name == f"fleet-{f.name}"]
    with open(f"/proc/self/task/{tid}/schedstat") as fh:
        return int(fh.read().split()[0])


def submit_rate(f, n: int) -> tuple[float, float]:
    """(units per second, the loop's CPU us per unit) of n submits and their results."""
    c0 = loop_cpu_ns(f)
    t0 = time.perf_counter()
    futures = [f.submit("w") for _ in range(n)]
    for fut in futures:
        fut.result()
    elapsed = time.perf_counter() - t0
    return n / elapsed, (loop_cpu_ns(f) - c0) / n / 1e3


def round_trip_us(f, n: int = ROUND_TRIPS) -> list:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        f.submit("w").result()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def check_ns() -> float:
    """One ``books.watch is not None`` check as the loop makes it, in ns (best of 5)."""
    class Books:
        watch = None

    books = Books()
    n = 2_000_000
    loop = min(timeit.repeat("pass", globals={}, number=n, repeat=5))
    check = min(timeit.repeat("if books.watch is not None: pass", globals={"books": books}, number=n, repeat=5))
    return max(0.0, check - loop) / n * 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", default=",".join(CONTENDERS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    kinds = [k for k in args.only.split(",") if k]
    if "spans" in kinds:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())  # spans made and ended, exported nowhere
    rates = {k: [] for k in kinds}
    cpu = {k: [] for k in kinds}
    trips = {k: [] for k in kinds}
    with contextlib.ExitStack() as stack:
        fleets = {k: stack.enter_context(fleet.Fleet.from_config(config(k), env={})) for k in kinds}
        for f in fleets.values():
            submit_rate(f, 200)  # warm: workers forked, first imports done
        for _ in range(args.repeat):
            for k, f in fleets.items():
                rate, per_unit = submit_rate(f, args.units)
                rates[k].append(rate)
                cpu[k].append(per_unit)
                trips[k].extend(round_trip_us(f))
    out = {
        "units": args.units, "repeat": args.repeat, "check_ns": round(check_ns(), 2),
        "submit_units_per_s": {k: round(statistics.median(v)) for k, v in rates.items()},
        "round_trip_us_p50": {k: round(statistics.median(v), 1) for k, v in trips.items()},
        "loop_cpu_us_per_unit": {k: round(statistics.median(v), 2) for k, v in cpu.items()},
        "runs": {k: [round(r) for r in v] for k, v in rates.items()},
        "loop_cpu_runs": {k: [round(c, 2) for c in v] for k, v in cpu.items()},
    }
    if "off" in kinds:
        out["ratios_vs_off"] = {
            k: {"submit": round(out["submit_units_per_s"][k] / out["submit_units_per_s"]["off"], 3),
                "round_trip_p50": round(out["round_trip_us_p50"][k] / out["round_trip_us_p50"]["off"], 3),
                "loop_cpu": round(out["loop_cpu_us_per_unit"][k] / out["loop_cpu_us_per_unit"]["off"], 3)}
            for k in kinds if k != "off"}
    if args.json:
        print(json.dumps(out))
    else:
        for key, val in out.items():
            print(f"{key}: {val}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
