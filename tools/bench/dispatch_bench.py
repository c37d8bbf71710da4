#!/usr/bin/env python3
"""Dispatch benchmark: fleet against ProcessPoolExecutor and multiprocessing.Pool.

    python tools/bench/dispatch_bench.py [--json] [--workers N] [--units N]

Same worker count, same machine, same run, same no-op and ~50 µs CPU handlers:
  submit_units_per_s     one future per unit (fleet.submit / executor.submit)
  map_units_per_s        fleet.map / Pool.imap_unordered at chunksize 1 and a tuned chunksize
  spin50_map_units_per_s 50 µs units through map; `of_limit` = share of N workers x 20,000/s
  latency_us             single-submit round trip p50/p99 (one unit in flight at a time)
  idle_cpu_percent       fleet (supervisor thread + zygote + workers) over an idle period
  io_fleet               1,000 units that each `await asyncio.sleep(0.01)` on one I/O-bound
                         role with 100 slots; `io_fleet_of_ideal` = 0.1 s / the median run
Ratios are fleet / peer (higher is better for throughput, lower for latency).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import sys
import time
import uuid

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_handlers as H  # noqa: E402

import fleet  # noqa: E402

TUNED_CHUNK = 1000
IO_UNITS, IO_SLOTS, IO_WAIT_S, IO_RUNS = 1000, 100, 0.01, 5


def rate(n, fn):
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def latencies(submit_one, n=2000):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        submit_one()
        out.append(time.perf_counter() - t0)
    out.sort()
    return {"p50": round(out[len(out) // 2] * 1e6, 1), "p99": round(out[int(len(out) * 0.99)] * 1e6, 1)}


def bench_fleet(profile, workers, units):
    cfg = {
        "fleet": {"name": f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}", "profile": profile},
        "roles": {
            # one role, so forced pinned runs exactly `workers` worker processes
            "work": {"kind": "pooled", "handler": "bench_handlers:unit_work", "slots": 32 * workers,
                     "peak_cpus": workers, "queue_bound": 10 * units},
        },
    }
    out = {}
    with fleet.Fleet.from_config(cfg, env={}) as f:
        out["binding"] = f.plan.binding
        out["seats"] = len(f.layout.seats)
        list(f.map("work", range(2000)))  # warm
        out["submit_units_per_s"] = rate(units, lambda: [x.result() for x in [f.submit("work", i) for i in range(units)]])
        out["map_chunk1_units_per_s"] = rate(units, lambda: list(f.map("work", range(units))))
        big = units * 20
        out["map_tuned_units_per_s"] = rate(big, lambda: list(f.map("work", range(big), chunksize=TUNED_CHUNK)))
        n50 = max(20_000, units)
        out["spin50_map_units_per_s"] = rate(n50, lambda: list(f.map("work", ["spin"] * n50, chunksize=64)))
        out["latency_us"] = latencies(lambda: f.submit("work", 0).result())
        out["idle_cpu_percent"] = idle_cpu(f)
    return out


def bench_io_fleet():
    """I/O-bound units on one role: the time to run IO_UNITS waits of IO_WAIT_S with
    IO_SLOTS at once, against the ideal IO_UNITS / IO_SLOTS * IO_WAIT_S."""
    cfg = {
        "fleet": {"name": f"bench-io-{os.getpid()}-{uuid.uuid4().hex[:6]}"},
        "roles": {
            "io": {"kind": "pooled", "handler": "bench_handlers:unit_sleep_async", "slots": IO_SLOTS,
                   "peak_cpus": 0, "io_bound": True, "queue_bound": 10 * IO_UNITS},
        },
    }
    runs = []
    with fleet.Fleet.from_config(cfg, env={}) as f:
        [x.result() for x in [f.submit("io", IO_WAIT_S) for _ in range(IO_SLOTS)]]  # warm
        for _ in range(IO_RUNS):
            t0 = time.perf_counter()
            [x.result() for x in [f.submit("io", IO_WAIT_S) for _ in range(IO_UNITS)]]
            runs.append(time.perf_counter() - t0)
        binding = f.plan.binding
    runs.sort()
    return {"binding": binding, "units": IO_UNITS, "slots": IO_SLOTS, "wait_s": IO_WAIT_S,
            "ideal_s": IO_UNITS / IO_SLOTS * IO_WAIT_S, "median_s": round(runs[len(runs) // 2], 4),
            "runs_s": [round(r, 4) for r in runs]}


def idle_cpu(f, seconds=10.0):
    """CPU used by the whole fleet while it has nothing to do, in % of one core."""
    me = psutil.Process()
    procs = [me] + me.children(recursive=True)

    def total():
        s = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                s += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return s

    time.sleep(0.5)
    c0, t0 = total(), time.monotonic()
    time.sleep(seconds)
    return round((total() - c0) / (time.monotonic() - t0) * 100, 3)


def bench_ppe(workers, units):
    out = {}
    with cf.ProcessPoolExecutor(workers) as ex:
        list(ex.map(H.work, range(2000)))
        out["submit_units_per_s"] = rate(units, lambda: [x.result() for x in [ex.submit(H.work, i) for i in range(units)]])
        out["latency_us"] = latencies(lambda: ex.submit(H.work, 0).result())
        n50 = max(20_000, units)
        out["spin50_map_units_per_s"] = rate(n50, lambda: list(ex.map(H.work, ["spin"] * n50, chunksize=64)))
    return out


def bench_pool(workers, units):
    out = {}
    with mp.Pool(workers) as pool:
        list(pool.imap_unordered(H.work, range(2000)))
        out["imap_chunk1_units_per_s"] = rate(units, lambda: list(pool.imap_unordered(H.work, range(units), chunksize=1)))
        big = units * 20
        out["imap_tuned_units_per_s"] = rate(big, lambda: list(pool.imap_unordered(H.work, range(big), chunksize=TUNED_CHUNK)))
        n50 = max(20_000, units)
        out["spin50_imap_units_per_s"] = rate(n50, lambda: list(pool.imap_unordered(H.work, ["spin"] * n50, chunksize=64)))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--units", type=int, default=20_000)
    args = parser.parse_args(argv)
    w, n = args.workers, args.units
    res = {
        "workers": w,
        "fleet_pinned": bench_fleet("pinned", w, n),
        "fleet_auto": bench_fleet("auto", w, n),
        "process_pool_executor": bench_ppe(w, n),
        "multiprocessing_pool": bench_pool(w, n),
        "io_fleet": bench_io_fleet(),
    }
    fp, ppe, pool = res["fleet_pinned"], res["process_pool_executor"], res["multiprocessing_pool"]
    limit = w * 20_000
    res["ratios"] = {
        "submit_fleet_over_ppe": round(fp["submit_units_per_s"] / ppe["submit_units_per_s"], 2),
        "map_chunk1_fleet_over_pool": round(fp["map_chunk1_units_per_s"] / pool["imap_chunk1_units_per_s"], 2),
        "map_tuned_fleet_over_pool": round(fp["map_tuned_units_per_s"] / pool["imap_tuned_units_per_s"], 2),
        "spin50_fleet_of_limit": round(fp["spin50_map_units_per_s"] / limit, 3),
        "spin50_pool_of_limit": round(pool["spin50_imap_units_per_s"] / limit, 3),
        "latency_p50_fleet_over_ppe": round(fp["latency_us"]["p50"] / ppe["latency_us"]["p50"], 3),
        "idle_cpu_percent_fleet": fp["idle_cpu_percent"],
        "io_fleet_of_ideal": round(res["io_fleet"]["ideal_s"] / res["io_fleet"]["median_s"], 3),
    }
    res["targets"] = {
        "submit_fleet_over_ppe": ">= 10",
        "map_tuned_fleet_over_pool": ">= 1",
        "spin50_fleet_of_limit": ">= 0.9",
        "latency_p50_fleet_over_ppe": "<= 0.25",
        "idle_cpu_percent_fleet": "< 1",
        "io_fleet_of_ideal": ">= 0.8",
    }
    for section in ("fleet_pinned", "fleet_auto", "process_pool_executor", "multiprocessing_pool"):
        for k, v in list(res[section].items()):
            if isinstance(v, float) and k.endswith("_per_s"):
                res[section][k] = round(v)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        for section, values in res.items():
            print(section, values)
    return 0


if __name__ == "__main__":
    sys.exit(main())
