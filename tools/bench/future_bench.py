#!/usr/bin/env python3
"""Benchmark `fleet.runtime.future.UnitFuture` against `concurrent.futures.Future`.

    python tools/bench/future_bench.py [--json] [--n N] [--rounds R] [--threads T]

Each figure is futures per second through one life, for both classes in the same
run, rounds interleaved (unit, stdlib, unit, stdlib, ...) so drift in the host's load
falls on both alike; the figure is the median round, `best` the fastest one:
  create_resolve_result        f = F(); f.set_result(i); f.result()
  create_start_resolve_result  the supervisor's path: set_running_or_notify_cancel()
                               before set_result
  create_only                  F()
  waited_on                    as create_resolve_result, but something asks for
                               f._condition first (what a blocked result() or wait()
                               does), so a UnitFuture pays for its Condition too
  threads_T                    create_resolve_result on T threads at once, n in all
                               (each future has its own lock: none is shared)
`ratio` is unit / stdlib (higher is better for UnitFuture). The garbage collector
stays on: the stdlib's extra objects cost it collections, as they do in service.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import platform
import statistics
import sys
import threading
import time

from fleet.runtime.future import UnitFuture

KINDS = {"unit": UnitFuture, "stdlib": cf.Future}


def create_resolve_result(F, n):
    for i in range(n):
        f = F()
        f.set_result(i)
        f.result()


def create_start_resolve_result(F, n):
    for i in range(n):
        f = F()
        f.set_running_or_notify_cancel()
        f.set_result(i)
        f.result()


def create_only(F, n):
    for _ in range(n):
        F()


def waited_on(F, n):
    for i in range(n):
        f = F()
        f._condition
        f.set_result(i)
        f.result()


def threaded(threads):
    def run(F, n):
        share = n // threads
        go = threading.Barrier(threads + 1)

        def work():
            go.wait()
            create_resolve_result(F, share)

        pool = [threading.Thread(target=work) for _ in range(threads)]
        for t in pool:
            t.start()
        go.wait()  # the timer starts when the threads do
        for t in pool:
            t.join()
    return run


def rate(case, F, n):
    t0 = time.perf_counter()
    case(F, n)
    return n / (time.perf_counter() - t0)


def measure(case, n, rounds):
    """{kind: [per-second figures, one per round]}, kinds interleaved round by round."""
    out = {kind: [] for kind in KINDS}
    for F in KINDS.values():
        case(F, n // 10)  # warm up
    for _ in range(rounds):
        for kind, F in KINDS.items():
            out[kind].append(rate(case, F, n))
    return out


def summary(rates):
    med = {kind: statistics.median(r) for kind, r in rates.items()}
    return {
        "unit_per_s": round(med["unit"]),
        "stdlib_per_s": round(med["stdlib"]),
        "ratio": round(med["unit"] / med["stdlib"], 2),
        "unit_best_per_s": round(max(rates["unit"])),
        "stdlib_best_per_s": round(max(rates["stdlib"])),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--n", type=int, default=200_000, help="futures per round and case")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args(argv)
    cases = {
        "create_resolve_result": create_resolve_result,
        "create_start_resolve_result": create_start_resolve_result,
        "create_only": create_only,
        "waited_on": waited_on,
        f"threads_{args.threads}": threaded(args.threads),
    }
    results = {name: summary(measure(case, args.n, args.rounds)) for name, case in cases.items()}
    report = {"python": platform.python_version(), "n": args.n, "rounds": args.rounds,
              "threads": args.threads, "cases": results}
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
        return
    print(f"python {report['python']}, {args.n} futures x {args.rounds} rounds (median; best)")
    print(f"{'case':30} {'UnitFuture/s':>14} {'Future/s':>12} {'ratio':>7}")
    for name, r in results.items():
        print(f"{name:30} {r['unit_per_s']:>14,} {r['stdlib_per_s']:>12,} {r['ratio']:>6.2f}x"
              f"   (best {r['unit_best_per_s']:,} / {r['stdlib_best_per_s']:,})")


if __name__ == "__main__":
    main()
