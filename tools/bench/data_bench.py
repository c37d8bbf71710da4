#!/usr/bin/env python3
"""Data benchmark: bytes and numpy arrays in (an argument) and out (a result), fleet.Executor
against ProcessPoolExecutor, multiprocessing.Pool, loky and joblib.Parallel.

    python tools/bench/data_bench.py [--json] [--workers N] [--sizes 1K,64K,...] [--repeat R]

Sizes 1 KiB, 64 KiB, 1 MiB, 8 MiB, 64 MiB and 256 MiB (default). At each size, for bytes
and arrays, in and out, every contender runs once, one right after another (interleaved:
a slow stretch of a shared machine falls on all of them), --repeat rounds (default 1);
a figure is the median of its rounds.

  in   `calls` distinct objects (made before the clock starts) mapped through `nbytes`:
       each crosses to a worker once, a few bytes come back
  out  `calls` results made in the workers (`make_bytes`, `make_array`) come back
  MiB/s          bytes moved / seconds, all calls in flight at once (each contender's map)
  peak_rss_mib   the parent's peak RSS during the measure over its RSS before (VmHWM, reset
                 by /proc/self/clear_refs; the inputs are made before the reset)
  calls          enough to move ~256 MiB (2..1000)
Each contender runs with its defaults and --workers processes: fleet.Executor(max_workers=N)
(map without chunksize: it batches short calls itself, fleet.rules.pace.Batches),
ProcessPoolExecutor(N), Pool(N) (map, chunksize 1), loky's reusable executor(N),
joblib.Parallel(n_jobs=N) (its loky backend, which memory-maps arrays over 1 MB). Peers
loky and joblib come with `pip install '.[bench]'`; an absent one is reported so.
Ratios: fleet over the best peer at each size and kind (higher is better), and fleet's
peak RSS over the bytes the measure moved (an `out` map holds every result it returns).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_handlers as H  # noqa: E402

import numpy as np  # noqa: E402

import fleet  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20
SIZES = {"1K": KIB, "64K": 64 * KIB, "1M": MIB, "8M": 8 * MIB, "64M": 64 * MIB, "256M": 256 * MIB}
#: bytes a measure moves (its calls: this over the size, within CALLS_RANGE)
MOVED = 256 * MIB
CALLS_RANGE = (2, 1000)


def calls_for(size: int) -> int:
    lo, hi = CALLS_RANGE
    return max(lo, min(hi, MOVED // size))


def inputs(kind: str, size: int, n: int) -> list:
    """`n` distinct objects of `size` bytes (each its own memory: nothing is sent twice)."""
    if kind == "bytes":
        return [bytes([i % 251 + 1]) * size for i in range(n)]
    return [np.full(size // 8, float(i)) for i in range(n)]


# --- peak RSS of this process ------------------------------------------------------------------
def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def measure(run, moved: int) -> tuple[float, float]:
    """(MiB/s, peak RSS over the RSS before, MiB) of `run()`."""
    _reset_peak()
    before = _status_kib("VmRSS")
    t0 = time.perf_counter()
    run()
    seconds = time.perf_counter() - t0
    peak = _status_kib("VmHWM")
    return moved / MIB / seconds, max(0, peak - before) / 1024


# --- contenders: each a way to map a function over items ---------------------------------------
def open_fleet(stack, workers):
    ex = stack.enter_context(fleet.Executor(max_workers=workers))
    return lambda fn, items: list(ex.map(fn, items))


def open_ppe(stack, workers):
    ex = stack.enter_context(cf.ProcessPoolExecutor(workers))
    return lambda fn, items: list(ex.map(fn, items))


def open_pool(stack, workers):
    pool = stack.enter_context(mp.Pool(workers))
    return lambda fn, items: pool.map(fn, items, chunksize=1)


def open_loky(stack, workers):
    try:
        from loky import get_reusable_executor
    except ImportError:
        return None
    ex = get_reusable_executor(workers)
    stack.callback(ex.shutdown, wait=True)
    return lambda fn, items: list(ex.map(fn, items))


def open_joblib(stack, workers):
    try:
        import joblib
    except ImportError:
        return None
    par = stack.enter_context(joblib.Parallel(n_jobs=workers))  # the pool stays up across calls
    return lambda fn, items: par(joblib.delayed(fn)(x) for x in items)


OPENERS = {"fleet_executor": open_fleet, "process_pool_executor": open_ppe, "multiprocessing_pool": open_pool,
           "loky": open_loky, "joblib_parallel": open_joblib}


def one_size(runners: dict, size: int, rounds: int) -> dict:
    """Every contender's figures at `size`: {kind: {direction: {contender: {...}}}}."""
    n = calls_for(size)
    out: dict = {}
    for kind in ("bytes", "numpy"):
        make = H.make_bytes if kind == "bytes" else H.make_array
        for direction in ("in", "out"):
            runs: dict = {name: [] for name in runners}
            for _ in range(rounds):
                for name, run in runners.items():
                    if direction == "in":
                        items = inputs(kind, size, n)
                        got = measure(lambda: run(H.nbytes, items), size * n)
                        del items
                    else:
                        got = measure(lambda: run(make, [size] * n), size * n)
                    runs[name].append(got)
            out.setdefault(kind, {})[direction] = {
                name: {"mib_per_s": round(statistics.median(r[0] for r in rs), 1),
                       "peak_rss_mib": round(max(r[1] for r in rs), 1), "calls": n}
                for name, rs in runs.items()}
    return out


def ratios(results: dict) -> dict:
    """fleet / the best peer, per size, kind and direction; and fleet's peak RSS over the bytes moved."""
    out = {}
    for label, by_kind in results.items():
        size = SIZES[label]
        for kind, by_dir in by_kind.items():
            for direction, figures in by_dir.items():
                mine = figures["fleet_executor"]
                peers = {k: v["mib_per_s"] for k, v in figures.items() if k != "fleet_executor"}
                best = max(peers, key=peers.get)
                out[f"{kind}_{direction}_{label}"] = {
                    "fleet_over_best_peer": round(mine["mib_per_s"] / peers[best], 2), "best_peer": best,
                    # over every byte the measure moved: an `out` map holds all its results
                    "fleet_rss_over_moved": round(mine["peak_rss_mib"] * MIB / (size * mine["calls"]), 2),
                }
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sizes", default=",".join(SIZES), help="of " + ",".join(SIZES))
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    labels = args.sizes.split(",")
    unknown = [s for s in labels if s not in SIZES]
    if unknown or args.repeat < 1:
        parser.error(f"unknown size {unknown[0]!r}" if unknown else "--repeat must be at least 1")
    results, absent = {}, []
    with contextlib.ExitStack() as stack:
        runners = {}
        for name, opener in OPENERS.items():
            run = opener(stack, args.workers)
            if run is None:
                absent.append(name)
                continue
            run(H.nbytes, [b"warm"] * 8)  # every contender's workers up before the clock
            runners[name] = run
        for label in labels:
            results[label] = one_size(runners, SIZES[label], args.repeat)
            if not args.json:
                print(f"{label}: done", file=sys.stderr, flush=True)
    report = {"workers": args.workers, "rounds": args.repeat, "absent": absent, "results": results,
              "ratios": ratios(results)}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    for label, by_kind in results.items():
        for kind, by_dir in by_kind.items():
            for direction, figures in by_dir.items():
                cells = "  ".join(f"{name.split('_')[0]} {f['mib_per_s']:>7.1f} MiB/s rss {f['peak_rss_mib']:>6.1f}"
                                  for name, f in figures.items())
                r = report["ratios"][f"{kind}_{direction}_{label}"]
                print(f"{label:>5} {kind:>5} {direction:>3}: {cells}  | fleet/best {r['fleet_over_best_peer']:.2f} "
                      f"({r['best_peer']})")
    if absent:
        print("absent peers:", ", ".join(absent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
