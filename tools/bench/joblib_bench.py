#!/usr/bin/env python3
"""joblib's Parallel on the fleet backend against joblib's own default, loky.

    python tools/bench/joblib_bench.py [--json] [--n-jobs J] [--repeat R]

One workload, ``Parallel(n_jobs=J)(delayed(f)(i) for i in range(N))`` with joblib's
defaults (auto-batching, pre_dispatch="2*n_jobs"), at two sizes and two functions:
  square_N     f(i) = i * i: what a call costs besides its work (N = 1,000 and 100,000)
  spin50_N     f spins 50 µs of CPU: N = 20,000 is a second of work spread over the workers
Both backends are warm (each ran a Parallel call first: loky's reusable executor and
the fleet backend's shared fleet are up); the rounds are interleaved (loky, fleet,
loky, fleet, ...) so a slow stretch of a shared machine falls on both; a figure is the
median round in calls per second. ``first_call_s``: a fresh interpreter's first
Parallel call of 1,000 squares, imports and the workers' start included (median of 3).
Ratios are fleet / loky (higher is better for fleet).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import joblib

import fleet.api.joblib_backend as fleet_backend

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZES = {"square": (1_000, 100_000), "spin50": (20_000,)}
FIRST_CALL = """
import time
t0 = time.perf_counter()
import joblib
{imports}
def square(x):
    return x * x
if __name__ == "__main__":
    with joblib.parallel_config(backend={backend!r}, n_jobs={n_jobs}):
        joblib.Parallel()(joblib.delayed(square)(i) for i in range(1000))
    print(time.perf_counter() - t0)
"""


def square(x):
    return x * x


def spin50(x):
    end = time.perf_counter() + 50e-6
    while time.perf_counter() < end:
        pass
    return x


FUNCTIONS = {"square": square, "spin50": spin50}


def calls_per_s(backend: str, n_jobs: int, fn, n: int) -> float:
    t0 = time.perf_counter()
    with joblib.parallel_config(backend=backend, n_jobs=n_jobs):
        joblib.Parallel()(joblib.delayed(fn)(i) for i in range(n))
    return n / (time.perf_counter() - t0)


def first_call_s(backend: str, n_jobs: int) -> float:
    imports = "import fleet.api.joblib_backend" if backend == "fleet" else ""
    code = FIRST_CALL.format(imports=imports, backend=backend, n_jobs=n_jobs)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=REPO))
    return float(out.stdout.split()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--n-jobs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds (default %(default)s)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    backends = ("loky", "fleet")
    for b in backends:  # warm: both pools up before the first timed round
        calls_per_s(b, args.n_jobs, square, 1000)
    runs = {b: {f"{name}_{n}": [] for name, sizes in SIZES.items() for n in sizes} for b in backends}
    for _ in range(args.repeat):
        for name, sizes in SIZES.items():
            for n in sizes:
                for b in backends:
                    runs[b][f"{name}_{n}"].append(calls_per_s(b, args.n_jobs, FUNCTIONS[name], n))
    fleet_backend.shutdown()
    from joblib.externals.loky import get_reusable_executor

    get_reusable_executor().shutdown(wait=True)
    res = {"n_jobs": args.n_jobs, "rounds": args.repeat, "joblib": joblib.__version__}
    for b in backends:
        res[b] = {key: round(statistics.median(r)) for key, r in runs[b].items()}
        res[b]["first_call_s"] = round(statistics.median(first_call_s(b, args.n_jobs) for _ in range(3)), 3)
    res["ratios"] = {key: round(res["fleet"][key] / res["loky"][key], 2) for key in runs["fleet"]}
    res["ratios"]["first_call_s"] = round(res["fleet"]["first_call_s"] / res["loky"]["first_call_s"], 2)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"n_jobs={args.n_jobs}, {args.repeat} interleaved rounds, joblib {joblib.__version__}: calls/s (median)")
    print(f"{'':16} {'loky':>12} {'fleet':>12} {'fleet/loky':>11}")
    for key in runs["fleet"]:
        print(f"{key:16} {res['loky'][key]:>12,} {res['fleet'][key]:>12,} {res['ratios'][key]:>11}")
    print(f"{'first_call_s':16} {res['loky']['first_call_s']:>12} {res['fleet']['first_call_s']:>12} "
          f"{res['ratios']['first_call_s']:>11}  (seconds: lower is better)")


if __name__ == "__main__":
    main()
