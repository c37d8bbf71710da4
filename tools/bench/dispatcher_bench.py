#!/usr/bin/env python3
"""What the dispatcher alone costs per unit, in fleet.Executor's steady state of a burst.

    python tools/bench/dispatcher_bench.py [--json] [--units N] [--repeat R] [--seats S] [--depth D]

A diagnostic, not a ratio: `fleet.rules.dispatch.Dispatcher` driven in one thread, no
processes, as the supervisor's loop drives it through a burst of no-op submits. One pooled
role with one slot on each of `--seats` seats (the Executor's layout on that many cores),
paced to send `--depth` units ahead to a busy slot (what a role of microsecond units is
paced to: its lookahead); every unit queued at once; then grant passes, each followed by
the completion of a result slice (`fleet.runtime.results.RESULT_SLICE`) of the oldest units
in flight, until every unit has ended. What the loop does around it (books, futures, the
table's events, the rings) is not here: this is the dispatcher's own share of the loop.

Figures: ``us_per_unit`` (the median of --repeat rounds: queueing, granting and completing
one unit), ``python_calls_per_unit`` (cProfile's count over one more round: fixed for a
given tree, whatever the machine is doing) and ``grants_per_pass``. The loop's whole cost
per unit (`latency_stages.py --burst`) is the number to set this beside: docs/internals.md,
"Below the profiler". ``PYTHONPATH=<another tree>`` runs the same against that tree.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time

from fleet.rules import fsm
from fleet.rules.dispatch import Dispatcher, Pending
from fleet.rules.roles import Role, RoleSet
from fleet.rules.seats import Seat, SeatLayout, SlotSpec
from fleet.runtime.results import RESULT_SLICE


def dispatcher(seats: int, depth: int) -> Dispatcher:
    """The Executor's pooled role on `seats` seats of one slot each, paced to `depth` ahead."""
    roles = RoleSet((Role("work", kind="pooled", handler="m:f", slots=seats, lookahead=max(depth, 1)),))
    layout = SeatLayout(tuple(Seat(i, f"work-{i}", ("work",), (i,), "pinned") for i in range(seats)),
                        tuple(SlotSpec(i, "work", i) for i in range(seats)))
    d = Dispatcher(roles, layout)
    d.pace(0, depth)
    d.skip = lambda unit_id: False  # the books' check at a grant: nothing cancelled
    return d


def one_round(units: int, seats: int, depth: int) -> tuple[float, float]:
    """(seconds per unit, grants per pass) of one burst of `units`."""
    d = dispatcher(seats, depth)
    inflight: list[int] = []
    passes = 0
    t0 = time.perf_counter()
    d.enqueue_many([Pending(i + 1, 0, None, 0) for i in range(units)])
    done = 0
    while done < units:
        grants = d.grant()
        passes += 1
        inflight.extend(g.unit_id for g in grants)
        ended, inflight = inflight[:RESULT_SLICE], inflight[RESULT_SLICE:]
        if not ended:
            raise RuntimeError(f"the dispatcher granted nothing with {units - done} units queued")
        for unit_id in ended:
            d.complete(unit_id, fsm.RUNNING)
        done += len(ended)
    return (time.perf_counter() - t0) / units, units / passes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--seats", type=int, default=2)
    parser.add_argument("--depth", type=int, default=16, help="units sent ahead to a busy slot (default 16)")
    args = parser.parse_args(argv)
    for name in ("units", "repeat", "seats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.depth < 0:
        parser.error("--depth must be at least 0")
    rounds = [one_round(args.units, args.seats, args.depth) for _ in range(args.repeat)]
    prof = cProfile.Profile()
    prof.enable()
    one_round(args.units, args.seats, args.depth)
    prof.disable()
    calls = sum(cc for cc, _nc, _tt, _ct, _callers in pstats.Stats(prof).stats.values())
    out = {"units": args.units, "seats": args.seats, "depth": args.depth, "repeat": args.repeat,
           "us_per_unit": round(statistics.median(r[0] for r in rounds) * 1e6, 3),
           "us_per_unit_runs": [round(r[0] * 1e6, 3) for r in rounds],
           "python_calls_per_unit": round(calls / args.units, 2),
           "grants_per_pass": round(statistics.median(r[1] for r in rounds), 2)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['us_per_unit']} us a unit (runs {out['us_per_unit_runs']}); "
              f"{out['python_calls_per_unit']} Python calls a unit; {out['grants_per_pass']} grants a pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
