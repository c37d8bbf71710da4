#!/usr/bin/env python3
"""Where a single-submit round trip's time goes: p50 of each stage, in microseconds.

    python tools/bench/latency_stages.py [--json] [--units N] [--slots-per-worker K]

A diagnostic, not a ratio: it times `f.submit(role, 0).result()` one unit at a time (the
shape of dispatch_bench's latency key) on 2 pinned workers, and stamps the supervisor's
own steps by wrapping them (each wrapper adds well under a microsecond):

  caller: submit -> post     the caller's checks, pickling and queue room, up to its post
  post -> loop accepts       waking the loop thread (and it taking the GIL)
  accept -> granted          the loop's accept and the dispatcher's grant
  granted -> pushed          the slot's transition and the push that wakes the worker
  pushed -> result read      waking the worker, the handler, its result, the loop seeing it
  result read -> delivered   the outcome recorded, the freed slot granted, the future set
  delivered -> caller back   waking the caller (and it taking the GIL)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fleet  # noqa: E402
from fleet.rules import dispatch
from fleet.runtime import accept, books, intake, results, seats  # noqa: E402

STAGES = (
    ("caller: submit -> post", None, "post"),
    ("post -> loop accepts", "post", "accept"),
    ("accept -> granted", "accept", "granted"),
    ("granted -> pushed", "granted", "pushed"),
    ("pushed -> result read", "pushed", "collect"),
    ("result read -> delivered", "collect", "delivered"),
    ("delivered -> caller back", "delivered", None),
)


class Stamps:
    """The first time each step ran since `clear` (a round trip is one unit at a time)."""

    def __init__(self):
        self.at: dict[str, int] = {}

    def clear(self) -> None:
        self.at.clear()

    def wrap(self, owner, name: str, key: str, after: bool = False, once_after: str | None = None) -> None:
        original, at, now = getattr(owner, name), self.at, time.perf_counter_ns

        def stamped(*args, **kwargs):
            if not after:
                at.setdefault(key, now())
            out = original(*args, **kwargs)
            if after and (once_after is None or once_after in at):
                at.setdefault(key, now())
            return out

        setattr(owner, name, stamped)


def measure(units: int, slots_per_worker: int) -> dict:
    stamps = Stamps()
    stamps.wrap(intake.Intake, "post", "post")
    stamps.wrap(accept.Acceptor, "accept", "accept")
    stamps.wrap(dispatch.Dispatcher, "grant", "granted", after=True)
    stamps.wrap(seats.Seats, "send", "pushed", after=True)
    stamps.wrap(results.Results, "handle", "collect")
    stamps.wrap(books.Books, "deliver", "delivered", after=True, once_after="collect")
    cfg = {
        "fleet": {"name": f"stages-{os.getpid()}-{uuid.uuid4().hex[:6]}", "profile": "pinned"},
        "roles": {"work": {"kind": "pooled", "handler": "bench_handlers:unit_work",
                           "slots": 2 * slots_per_worker, "peak_cpus": 2, "queue_bound": 1000}},
    }
    rows = []
    with fleet.Fleet.from_config(cfg, env={}) as f:
        list(f.map("work", range(2000)))  # warm
        for _ in range(units):
            stamps.clear()
            t0 = time.perf_counter_ns()
            f.submit("work", 0).result()
            t1 = time.perf_counter_ns()
            at = dict(stamps.at, start=t0, end=t1)
            if all(k in at for _, a, b in STAGES for k in (a or "start", b or "end")):
                rows.append(at)
    out = {}
    for label, a, b in STAGES:
        out[label] = p50([r[b or "end"] - r[a or "start"] for r in rows])
    out["total"] = p50([r["end"] - r["start"] for r in rows])
    return {"units_timed": len(rows), "slots": 2 * slots_per_worker, "p50_us": out}


def p50(ns: list) -> float:
    ns = sorted(ns)
    return round(ns[len(ns) // 2] / 1e3, 1) if ns else float("nan")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--units", type=int, default=3000)
    parser.add_argument("--slots-per-worker", type=int, default=1)
    args = parser.parse_args(argv)
    res = measure(args.units, args.slots_per_worker)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        for label, value in res["p50_us"].items():
            print(f"{label:28} {value:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
