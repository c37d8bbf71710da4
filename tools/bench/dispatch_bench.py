#!/usr/bin/env python3
"""Dispatch benchmark: fleet against ProcessPoolExecutor, multiprocessing.Pool, mpire and loky.

    python tools/bench/dispatch_bench.py [--json] [--workers N] [--units N]

Peers mpire and loky come with `pip install '.[bench]'`; an absent peer is reported as
such and its ratios are left out. Same worker count, same machine, same run, same no-op
and ~50 µs CPU handlers:
  submit_units_per_s     one future per unit (fleet.submit / executor.submit / apply_async)
  map_chunkC_units_per_s fleet.map / Pool.imap_unordered at chunksize C = 1, 64, 1000
  spin50_map_units_per_s 50 µs units through map; `of_limit` = share of N workers x 20,000/s
  latency_us             single-submit round trip p50/p99 (one unit in flight at a time)
  idle_cpu_percent       fleet (supervisor thread + zygote + workers) over an idle period
  io_fleet               1,000 units that each `await asyncio.sleep(0.01)` on one I/O-bound
                         role with 100 slots; `io_fleet_of_ideal` = 0.1 s / the median run
Fleet runs N worker processes (forced pinned, one role of N cores) in two configurations:
`slots` = N (what users write) and 32 slots per worker (the tuned one). Each throughput
ratio under "ratios" is the LOWER of the two; "ratios_by_config" keeps both figures.
Ratios are fleet / peer (higher is better for throughput, lower for latency). Every
throughput, fleet's and the peers' alike, is the median of --repeat runs (3).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_handlers as H  # noqa: E402

import fleet  # noqa: E402

CHUNKS = (1, 64, 1000)
#: items per chunk-C map run: enough for a stable rate, small enough for chunk 1
MAP_ITEMS = {1: 1, 64: 5, 1000: 20}  # x --units
IO_UNITS, IO_SLOTS, IO_WAIT_S, IO_RUNS = 1000, 100, 0.01, 5
#: fleet configurations: slots per worker process
CONFIGS = {"slots_eq_workers": 1, "slots_32_per_worker": 32}
THROUGHPUT = ("submit_units_per_s", "map_chunk1_units_per_s", "map_chunk64_units_per_s",
              "map_chunk1000_units_per_s", "spin50_map_units_per_s")


#: each throughput is the median of this many back-to-back runs (--repeat): one run of
#: 100,000 units at chunk 64 lasts ~30 ms, short enough for a scheduler hiccup to halve it
REPEAT = 3


def rate(n, fn):
    runs = []
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        fn()
        runs.append(n / (time.perf_counter() - t0))
    return statistics.median(runs)


def latencies(submit_one, n=2000):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        submit_one()
        out.append(time.perf_counter() - t0)
    out.sort()
    return {"p50": round(out[len(out) // 2] * 1e6, 1), "p99": round(out[int(len(out) * 0.99)] * 1e6, 1)}


def bench_fleet(workers, units, slots_per_worker, *, extras=True):
    cfg = {
        "fleet": {"name": f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}", "profile": "pinned"},
        "roles": {
            # one role of `workers` declared cores, forced pinned: exactly `workers` processes
            "work": {"kind": "pooled", "handler": "bench_handlers:unit_work", "slots": slots_per_worker * workers,
                     "peak_cpus": workers, "queue_bound": 10 * units},
        },
    }
    out = {}
    with fleet.Fleet.from_config(cfg, env={}) as f:
        out["binding"] = f.plan.binding
        out["seats"] = len(f.layout.seats)
        out["slots"] = slots_per_worker * workers
        list(f.map("work", range(2000)))  # warm
        out["submit_units_per_s"] = rate(units, lambda: [x.result() for x in [f.submit("work", i) for i in range(units)]])
        for c in CHUNKS:
            n = units * MAP_ITEMS[c]
            out[f"map_chunk{c}_units_per_s"] = rate(n, lambda: list(f.map("work", range(n), chunksize=c)))
        n50 = max(20_000, units)
        out["spin50_map_units_per_s"] = rate(n50, lambda: list(f.map("work", ["spin"] * n50, chunksize=64)))
        out["latency_us"] = latencies(lambda: f.submit("work", 0).result())
        if extras:
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
        for c in CHUNKS:
            n = units * MAP_ITEMS[c]
            out[f"imap_chunk{c}_units_per_s"] = rate(n, lambda: list(pool.imap_unordered(H.work, range(n), chunksize=c)))
        n50 = max(20_000, units)
        out["spin50_imap_units_per_s"] = rate(n50, lambda: list(pool.imap_unordered(H.work, ["spin"] * n50, chunksize=64)))
    return out


def bench_mpire(workers, units):
    """mpire's WorkerPool: its default `map` (it picks the chunk size) and one
    `apply_async` per unit (the per-unit submit shape)."""
    try:
        from mpire import WorkerPool
    except ImportError:
        return {"absent": "pip install '.[bench]'"}
    out = {}
    with WorkerPool(n_jobs=workers) as pool:
        pool.map(H.work, range(2000), progress_bar=False)
        out["map_default_units_per_s"] = rate(units, lambda: pool.map(H.work, range(units), progress_bar=False))
        n50 = max(20_000, units)
        # mpire unpacks an iterable item into arguments: a tuple keeps "spin" one argument
        out["spin50_map_units_per_s"] = rate(n50, lambda: pool.map(H.work, [("spin",)] * n50, progress_bar=False))
    # a pool of its own: mpire 2.10's map fails on a pool that has run apply_async
    with WorkerPool(n_jobs=workers) as pool:
        [r.get() for r in [pool.apply_async(H.work, (i,)) for i in range(200)]]
        out["apply_async_units_per_s"] = rate(
            units, lambda: [r.get() for r in [pool.apply_async(H.work, (i,)) for i in range(units)]])
    return out


def bench_loky(workers, units):
    """loky's reusable executor: one future per unit, and map at chunksize 64."""
    try:
        from loky import get_reusable_executor
    except ImportError:
        return {"absent": "pip install '.[bench]'"}
    out = {}
    ex = get_reusable_executor(max_workers=workers)
    try:
        list(ex.map(H.work, range(2000)))
        out["submit_units_per_s"] = rate(units, lambda: [x.result() for x in [ex.submit(H.work, i) for i in range(units)]])
        out["map_chunk64_units_per_s"] = rate(units * 5, lambda: list(ex.map(H.work, range(units * 5), chunksize=64)))
        out["latency_us"] = latencies(lambda: ex.submit(H.work, 0).result())
    finally:
        ex.shutdown(wait=True, kill_workers=True)
    return out


def fleet_ratios(fl, ppe, pool, mpire, workers) -> dict:
    """Throughput ratios of one fleet configuration against the peers."""
    out = {
        "submit_fleet_over_ppe": round(fl["submit_units_per_s"] / ppe["submit_units_per_s"], 2),
        "spin50_fleet_of_limit": round(fl["spin50_map_units_per_s"] / (workers * 20_000), 3),
    }
    if "map_default_units_per_s" in mpire:
        out["submit_fleet_over_mpire"] = round(fl["submit_units_per_s"] / mpire["map_default_units_per_s"], 3)
    for c in CHUNKS:
        out[f"map_chunk{c}_fleet_over_pool"] = round(fl[f"map_chunk{c}_units_per_s"] / pool[f"imap_chunk{c}_units_per_s"], 2)
    out["latency_p50_fleet_over_ppe"] = round(fl["latency_us"]["p50"] / ppe["latency_us"]["p50"], 3)
    return out


def main(argv=None):
    global REPEAT
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--units", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=REPEAT,
                        help="runs per throughput figure, of which the median is kept (default %(default)s)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    REPEAT = args.repeat
    w, n = args.workers, args.units
    res = {"workers": w}
    for name, per_worker in CONFIGS.items():
        res[f"fleet_{name}"] = bench_fleet(w, n, per_worker, extras=name == "slots_eq_workers")
    res["process_pool_executor"] = bench_ppe(w, n)
    res["multiprocessing_pool"] = bench_pool(w, n)
    res["mpire"] = bench_mpire(w, n)
    res["loky"] = bench_loky(w, n)
    res["io_fleet"] = bench_io_fleet()
    ppe, pool, mpire = res["process_pool_executor"], res["multiprocessing_pool"], res["mpire"]
    by_config = {name: fleet_ratios(res[f"fleet_{name}"], ppe, pool, mpire, w) for name in CONFIGS}
    res["ratios_by_config"] = by_config
    ratios = {}
    for key in by_config["slots_eq_workers"]:
        values = [by_config[name][key] for name in CONFIGS]
        # the headline is the worse configuration: lower throughput, higher latency
        ratios[key] = max(values) if key.startswith("latency") else min(values)
    natural = res["fleet_slots_eq_workers"]
    ratios["spin50_pool_of_limit"] = round(pool["spin50_imap_units_per_s"] / (w * 20_000), 3)
    if "spin50_map_units_per_s" in mpire:
        ratios["spin50_mpire_of_limit"] = round(mpire["spin50_map_units_per_s"] / (w * 20_000), 3)
        ratios["mpire_map_over_ppe_submit"] = round(mpire["map_default_units_per_s"] / ppe["submit_units_per_s"], 2)
    if "submit_units_per_s" in res["loky"]:
        ratios["submit_fleet_over_loky"] = min(
            round(res[f"fleet_{name}"]["submit_units_per_s"] / res["loky"]["submit_units_per_s"], 2) for name in CONFIGS)
    ratios["idle_cpu_percent_fleet"] = natural["idle_cpu_percent"]
    ratios["io_fleet_of_ideal"] = round(res["io_fleet"]["ideal_s"] / res["io_fleet"]["median_s"], 3)
    res["ratios"] = ratios
    res["targets"] = {
        "submit_fleet_over_ppe": ">= 5 (aim 10)",
        "submit_fleet_over_mpire": "reported (aim >= 1)",
        "map_chunk1_fleet_over_pool": ">= 1",
        "map_chunk64_fleet_over_pool": ">= 1",
        "map_chunk1000_fleet_over_pool": ">= 1",
        "latency_p50_fleet_over_ppe": "<= 0.5 (aim 0.25)",
        "spin50_fleet_of_limit": ">= 0.9",
        "io_fleet_of_ideal": ">= 0.8",
        "idle_cpu_percent_fleet": "< 1",
    }
    for section in [k for k in res if isinstance(res[k], dict) and k not in ("ratios", "ratios_by_config", "targets")]:
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
