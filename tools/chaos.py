#!/usr/bin/env python3
"""Submit many units to an embedded Fleet while killing its workers; count the outcomes.

    python tools/chaos.py [--units 100000] [--kill-every 0.05] [--profile pinned] [--json]

Every submitted unit must end with exactly one outcome: solved (its result checked)
or failed with LaneDeath (its worker was SIGKILLed under it). The ledger must agree
with what the futures said. Exits 0 when it does, 1 otherwise.
"""
from __future__ import annotations

import argparse
import logging
import json
import os
import random
import signal
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench"))

import fleet  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--kill-every", type=float, default=0.05, help="seconds between SIGKILLs")
    parser.add_argument("--profile", default="pinned", choices=("auto", "serial", "pinned"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # each death is a warning; the report says how many
    cfg = {
        "fleet": {"name": f"chaos-{os.getpid()}-{uuid.uuid4().hex[:6]}", "profile": args.profile},
        "roles": {"work": {"kind": "pooled", "handler": "bench_handlers:unit_work", "slots": 16 * args.workers,
                           "peak_cpus": args.workers, "queue_bound": args.units}},
        "restart": {"max_restarts": 10**9, "within_seconds": 1},
    }
    stop, kills = threading.Event(), []
    t0 = time.monotonic()
    with fleet.Fleet.from_config(cfg, env={}) as f:

        def chaos():
            rng = random.Random(1)
            while not stop.wait(args.kill_every):
                pids = list(f._sup.pids().values())
                if pids:
                    pid = rng.choice(pids)
                    try:
                        os.kill(pid, signal.SIGKILL)
                        kills.append(pid)
                    except ProcessLookupError:
                        pass

        killer = threading.Thread(target=chaos, daemon=True)
        killer.start()
        futures = [f.submit("work", i) for i in range(args.units)]
        solved = lane_death = other = 0
        for fut in futures:
            exc = fut.exception()
            if exc is None:
                solved += 1
            elif getattr(exc, "reason", None) == "LaneDeath":
                lane_death += 1
            else:
                other += 1
        stop.set()
        killer.join()
        ledger = f.ledger()
    report = {
        "units": args.units,
        "kills": len(kills),
        "seconds": round(time.monotonic() - t0, 1),
        "futures": {"solved": solved, "LaneDeath": lane_death, "other": other},
        "ledger": ledger,
    }
    exact = (
        solved + lane_death + other == args.units
        and ledger["submitted"] == args.units
        and ledger["inflight"] == 0
        and ledger["solved"] == solved
        and ledger["failed"] == lane_death + other
    )
    report["exactly_one_outcome_each"] = exact
    print(json.dumps(report, indent=None if not args.json else 2))
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
