#!/usr/bin/env python3
"""What waiting costs: the CPU of idle waiters, and how late an I/O seat's timers fire.

    python tools/bench/idle_bench.py [--json] [--idle-s S] [--n N]

Figures (measured in this run, on this host):
  idle waiters, % of a core and wake-ups/s over S idle seconds, each a forked process
  asleep in one wait with no timeout:
    ring     Ring.wait on an empty tasks ring
    space    Ring.wait_space on a full one
    bell     Bell.wait on a bell nobody rings
  io_worker  the workers of an idle fleet with an async and a plain I/O role (their
             event loop, pool threads and ring relay; the relay looks for a stop five
             times a second by design)
  timer lateness, µs p50/p99 over N asyncio.sleep(0.01) calls: the loop on
  `PreciseEpollSelector` (epoll_pwait2, nanosecond timeouts) and on the stdlib's
  `EpollSelector` (whole milliseconds, rounded up).
The tests assert the behaviour behind these (an idle waiter is never switched in; the
kernel is handed the timeout to the nanosecond); the figures themselves live here.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import selectors
import signal
import statistics
import sys
import time
import uuid

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from fleet.worker.io.selector import PreciseEpollSelector  # noqa: E402
from fleet.shm.dataplane import DataSegment, unlink  # noqa: E402
from tests.wakeups import switches_by_thread  # noqa: E402


def _cost(pids: list[int], idle_s: float) -> dict:
    """CPU share (% of a core) and wake-ups per second of `pids` over `idle_s` seconds."""
    procs = [psutil.Process(pid) for pid in pids]
    t0, c0 = time.monotonic(), sum(sum(p.cpu_times()[:2]) for p in procs)
    s0 = sum(sum(switches_by_thread(pid).values()) for pid in pids)
    time.sleep(idle_s)
    t1, c1 = time.monotonic(), sum(sum(p.cpu_times()[:2]) for p in procs)
    s1 = sum(sum(switches_by_thread(pid).values()) for pid in pids)
    return {"cpu_percent": round(100 * (c1 - c0) / (t1 - t0), 3), "wakeups_per_s": round((s1 - s0) / (t1 - t0), 1)}


def idle_waiter(what: str, idle_s: float) -> dict:
    name = f"idlebench{os.getpid()}-{uuid.uuid4().hex[:6]}"
    seg = DataSegment.create(name, 1, 4096, 4096)
    ring = seg.tasks(0)
    if what == "space":
        while ring.push(0, bytes(1000)):
            pass
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            s = DataSegment.attach(name)
            r, bell = s.tasks(0), s.bell
            seen = bell.value
            if what == "ring":
                while r.pop() is None:
                    r.wait(None)
            elif what == "space":
                while not r.push(1, bytes(1000)):
                    r.wait_space(1000, None)
            else:
                while bell.value == seen:
                    bell.wait(seen, None)
            code = 0
        finally:
            os._exit(code)
    try:
        time.sleep(0.2)  # let it reach its futex
        return _cost([pid], idle_s)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        unlink(name)


def idle_io_worker(idle_s: float) -> dict:
    import fleet

    def io(handler: str) -> dict:
        return {"kind": "pooled", "handler": f"tests.io_handlers:{handler}", "slots": 8, "io_bound": True}

    name = f"idlebench{os.getpid()}-{uuid.uuid4().hex[:6]}"
    cfg = {"fleet": {"name": name}, "roles": {"io": io("sleep_async"), "pool": io("sleep_plain")}}
    with fleet.Fleet.from_config(cfg, env={}) as f:
        for fut in [f.submit(r, 0.01) for r in ("io", "pool") for _ in range(16)]:
            fut.result(120)
        pids = sorted(set(f._sup.pids().values()))
        time.sleep(0.3)
        return {"workers": len(pids), **_cost(pids, idle_s)}


def timer_lateness(selector_class, n: int) -> dict:
    loop = asyncio.SelectorEventLoop(selector_class())
    late = []

    async def run():
        for _ in range(n):
            t0 = time.perf_counter()
            await asyncio.sleep(0.01)
            late.append((time.perf_counter() - t0 - 0.01) * 1e6)

    try:
        loop.run_until_complete(run())
    finally:
        loop.close()
    late.sort()
    return {"p50_us": round(statistics.median(late), 1), "p99_us": round(late[int(len(late) * 0.99) - 1], 1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--idle-s", type=float, default=2.0, help="idle seconds per waiter")
    ap.add_argument("--n", type=int, default=200, help="timer waits per selector")
    args = ap.parse_args(argv)
    report = {"python": platform.python_version(), "idle_s": args.idle_s, "n": args.n,
              "idle": {what: idle_waiter(what, args.idle_s) for what in ("ring", "space", "bell")},
              "timers": {"precise": timer_lateness(PreciseEpollSelector, args.n),
                         "stdlib": timer_lateness(selectors.EpollSelector, args.n)}}
    report["idle"]["io_worker"] = idle_io_worker(args.idle_s)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
        return
    print(f"python {report['python']}; idle {args.idle_s:g} s per waiter; {args.n} timer waits per selector")
    print(f"{'idle waiter':12} {'% of a core':>12} {'wake-ups/s':>11}")
    for what, r in report["idle"].items():
        print(f"{what:12} {r['cpu_percent']:>12.3f} {r['wakeups_per_s']:>11.1f}")
    print(f"{'timer (10 ms)':14} {'late p50 us':>11} {'p99 us':>8}")
    for what, r in report["timers"].items():
        print(f"{what:14} {r['p50_us']:>11.1f} {r['p99_us']:>8.1f}")


if __name__ == "__main__":
    main()
