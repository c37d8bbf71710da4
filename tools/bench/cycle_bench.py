#!/usr/bin/env python3
"""Cycle benchmark: the solve cycle (keyed bins that walk, fan out sims and join, a resolve
and a merge) on fleet, bins submitting their own sims from inside, against
ProcessPoolExecutor driven from outside.

    python tools/bench/cycle_bench.py [--json] [--runs 3] [--cycles 40] [--loads 0.3,0.6]

The cycle, as measured on an 8-core host (per cycle: 6 keyed bins, each ~86 ms of walk
CPU in three segments, parked about half its window on its sims' joins; 85-105 sims of
3.3 ms CPU each; a resolve of 12.4 ms; one merge, taken as long as the resolve), is
scaled to this machine so:
  shape     kept: 6 bins keyed bin-0..bin-5, 3 walk segments each, the cycle's sims split
            between the 12 gaps (two per bin, between its segments; seeded: 85-105 sims a
            cycle, each sim to a gap drawn at random), resolve first, merge after every
            bin has joined
  period    a cycle starts every 250 ms (--period-ms), whether the one before ended or not
  cost      every part's CPU is the measured one times one factor, chosen so a cycle of
            the mean 95 sims offers LOAD x CPUS x period of CPU: at 0.6 of 2 CPUs, 300 ms a
            cycle (a walk segment 10.1 ms, a sim 1.16 ms, resolve and merge 4.35 ms each);
            at 0.3 half that. Parts burn CPU time (thread_time), not wall time, so a part
            preempted by its neighbours still costs what the plan says.
A cycle's latency runs from its scheduled start to its merge's result in the driver; a
cycle is missed when it ends after the next one was due to start (latency > period).

Contenders, each fed the same seeded plan (run r: seed + r) and every one open for the
whole bench; within a run, every load runs on each contender in turn (the order turns
each run, so a slow stretch of a shared machine falls on all of them):
  fleet_inside_auto     roles bin (pinned by key, 6 slots), sim (pooled, 2 slots, 2 cores),
                        resolve and merge (singletons), the default profile (on 2-5 CPUs:
                        the serial binding); the driver submits resolve, the 6 bins and
                        merge; each bin walks and submits its gaps' sims through
                        fleet.current_fleet() and joins them itself
  fleet_inside_pinned   the same, forced to the pinned binding ([fleet] profile = "pinned")
  fleet_outside_auto    the same roles, the bins walked from outside: the driver submits
  fleet_outside_pinned  each walk segment (key bin-N) and each sim, and joins them itself
  process_pool_executor ProcessPoolExecutor(CPUS) walked from outside the same way
One driver thread walks every cycle (futures' callbacks hand it their completions); a
contender whose face is missing (no fleet.current_fleet) is reported absent.
Figures per load: p50/p95/max cycle latency (ms), missed cycles, and the drift (ms each
cycle ends later than the one before: the least-squares slope of the latencies; ~0 for a
contender that keeps up), per run; the summary takes the median p50, p95 and drift of the
runs, the max of their max, and sums the missed.
Target: fleet_inside_pinned's p95 at or below process_pool_executor's at every load.
--note-dir DIR makes every sim append its id to DIR/<contender>-<load>-<run>.log (the
smoke test counts them: each ran exactly once).
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import contextlib
import json
import math
import os
import queue
import random
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_handlers as H  # noqa: E402

import fleet  # noqa: E402

CPUS = 2
PERIOD_MS = 250.0
LOADS = (0.3, 0.6)
BINS, SEGMENTS = 6, 3
GAPS = SEGMENTS - 1  # the sims' fan-outs of a bin: between its segments
SIMS = (85, 105)  # sims per cycle, inclusive
#: the measured cycle (8-core host), in ms of CPU: a bin's walk (its three segments), a sim,
#: the resolve, the merge (not measured apart: taken as the resolve)
MEASURED_MS = {"walk": 86.0, "sim": 3.3, "resolve": 12.4, "merge": 12.4}
MEASURED_CYCLE_MS = BINS * MEASURED_MS["walk"] + sum(SIMS) / 2 * MEASURED_MS["sim"] \
    + MEASURED_MS["resolve"] + MEASURED_MS["merge"]
#: how long one load on one contender may take past its schedule before the bench gives up
STALL_S = 120.0
CONTENDERS = ("fleet_inside_auto", "fleet_inside_pinned", "fleet_outside_auto", "fleet_outside_pinned",
              "process_pool_executor")


def costs(load: float, period_s: float) -> dict:
    """Seconds of CPU of each part at `load` (a fraction of CPUS), every measured part
    times the one factor that makes the mean cycle offer load x CPUS x period."""
    factor = load * CPUS * period_s * 1000 / MEASURED_CYCLE_MS
    return {"segment": MEASURED_MS["walk"] / SEGMENTS * factor / 1000, "sim": MEASURED_MS["sim"] * factor / 1000,
            "resolve": MEASURED_MS["resolve"] * factor / 1000, "merge": MEASURED_MS["merge"] * factor / 1000}


def make_plan(seed: int, cycles: int) -> list:
    """plan[c][b][g]: the sim ids of cycle c's bin b's gap g (85-105 sims a cycle, each in
    a gap drawn at random)."""
    rng = random.Random(seed)
    plan = []
    for c in range(cycles):
        gaps = [[[] for _ in range(GAPS)] for _ in range(BINS)]
        for _ in range(rng.randint(*SIMS)):
            b, g = rng.randrange(BINS), rng.randrange(GAPS)
            gaps[b][g].append(f"{c}.{b}.{g}.{len(gaps[b][g])}")
        plan.append(gaps)
    return plan


def percentile(sorted_values: list, q: float) -> float:
    """Nearest rank."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


# --- contenders: a way to run each part of a cycle -------------------------------------------
class Contender:
    """`submit(part, payload, key)` -> a Future, for part resolve, merge, sim, and walk
    (one segment; outside) or bin (a whole bin; inside)."""

    def __init__(self, name: str, inside: bool, submit, facts: dict):
        self.name, self.inside, self.submit, self.facts = name, inside, submit, facts


def fleet_config(inside: bool, profile: str) -> dict:
    burn = "bench_handlers:cycle_burn_unit"
    return {
        "fleet": {"name": f"cycle-{os.getpid()}-{uuid.uuid4().hex[:6]}", "profile": profile},
        "roles": {
            "bin": {"kind": "pinned", "handler": "bench_handlers:cycle_bin_unit" if inside else burn,
                    "slots": BINS, "queue_bound": 100_000},
            "sim": {"kind": "pooled", "handler": "bench_handlers:cycle_sim_unit", "slots": CPUS, "peak_cpus": CPUS,
                    "queue_bound": 100_000},
            "resolve": {"kind": "singleton", "handler": burn, "slots": 1, "queue_bound": 100_000},
            "merge": {"kind": "singleton", "handler": burn, "slots": 1, "queue_bound": 100_000},
        },
    }


def open_fleet(stack, name: str) -> Contender:
    inside = "_inside_" in name
    profile = name.rsplit("_", 1)[1]
    f = stack.enter_context(fleet.Fleet.from_config(fleet_config(inside, profile), env={}))
    roles = {"walk": "bin", "bin": "bin", "sim": "sim", "resolve": "resolve", "merge": "merge"}

    def submit(part, payload, key=None):
        return f.submit(roles[part], payload) if key is None else f.submit(roles[part], payload, key=key)
    seats = [{"name": s.name, "roles": list(s.roles), "cpus": list(s.cpus)} for s in f.layout.seats]
    return Contender(name, inside, submit, {"binding": f.plan.binding, "oversubscribed": f.plan.oversubscribed,
                                            "seats": seats, "status": f.status})


def open_ppe(stack, name: str) -> Contender:
    ex = stack.enter_context(cf.ProcessPoolExecutor(CPUS))

    def submit(part, payload, key=None):
        return ex.submit(H.cycle_sim if part == "sim" else H.cycle_burn, payload)
    return Contender(name, False, submit, {"workers": CPUS})


def absent(name: str) -> str | None:
    """Why `name` cannot run here, or None."""
    if "_inside_" in name and not hasattr(fleet, "current_fleet"):
        return "fleet.current_fleet is not in this fleet"
    return None


# --- the driver --------------------------------------------------------------------------------
class Stalled(RuntimeError):
    pass


def run_cycles(c: Contender, plan: list, cost: dict, period_s: float, note: str | None) -> dict:
    """Every cycle of `plan` on `c`, one started every `period_s`, walked by this thread:
    futures' callbacks put their completions on a queue, and the thread takes them (or
    starts the next cycle when it is due). Returns the latencies and the sims' tally."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    n = len(plan)
    ends: list = [None] * n
    bins_left = [BINS] * n
    sims_left: dict = {}
    seen: collections.Counter = collections.Counter()

    def send(part, payload, tag, key=None):
        c.submit(part, payload, key).add_done_callback(lambda fut: events.put((tag, fut)))

    def walk(cy, b, g):
        send("walk", cost["segment"], ("walk", cy, b, g), key=f"bin-{b}")

    def sims(cy, b, g):
        ids = plan[cy][b][g]
        if not ids:
            return walk(cy, b, g + 1)
        sims_left[cy, b] = len(ids)
        for sim_id in ids:
            send("sim", (sim_id, cost["sim"], note), ("sim", cy, b, g))

    def bin_done(cy):
        bins_left[cy] -= 1
        if bins_left[cy] == 0:
            send("merge", cost["merge"], ("merge", cy))

    t0 = time.monotonic() + 0.01
    started = done = 0
    while done < n:
        now = time.monotonic()
        if started < n and now >= t0 + started * period_s:
            send("resolve", cost["resolve"], ("resolve", started))
            started += 1
            continue
        wait = t0 + started * period_s - now if started < n else STALL_S
        try:
            tag, fut = events.get(timeout=wait)
        except queue.Empty:
            if started < n:
                continue
            raise Stalled(f"{c.name}: no part of a cycle ended in {STALL_S:.0f} s ({done} of {n} cycles done)")
        fut.result()  # a part that failed ends the bench, loudly
        kind, cy = tag[0], tag[1]
        if kind == "resolve":
            for b in range(BINS):
                if c.inside:
                    gaps = [[(sim_id, cost["sim"], note) for sim_id in plan[cy][b][g]] for g in range(GAPS)]
                    send("bin", (cost["segment"], gaps), ("bin", cy, b), key=f"bin-{b}")
                else:
                    walk(cy, b, 0)
        elif kind == "walk":
            b, g = tag[2], tag[3]
            if g == SEGMENTS - 1:
                bin_done(cy)
            else:
                sims(cy, b, g)
        elif kind == "sim":
            b, g = tag[2], tag[3]
            seen[fut.result()] += 1
            sims_left[cy, b] -= 1
            if sims_left[cy, b] == 0:
                walk(cy, b, g + 1)
        elif kind == "bin":
            seen.update(fut.result())
            bin_done(cy)
        else:  # merge
            ends[cy] = time.monotonic()
            done += 1
    latencies = [ends[cy] - (t0 + cy * period_s) for cy in range(n)]
    planned = [sim_id for cycle in plan for gaps in cycle for ids in gaps for sim_id in ids]
    return {"latencies": latencies, "sims_planned": len(planned),
            "sims_returned": sum(seen.values()), "sims_twice": sum(1 for v in seen.values() if v > 1),
            "sims_missing": len(set(planned) - set(seen))}


def figures(latencies: list, period_s: float) -> dict:
    """p50/p95/max, missed cycles, and the drift: how much later each cycle ended than the
    one before, on the least-squares line through the latencies (~0 when the contender
    keeps up; the backlog's growth per cycle when it falls behind)."""
    s = sorted(latencies)
    drift = statistics.linear_regression(range(len(latencies)), latencies).slope if len(latencies) > 1 else 0.0
    return {"p50_ms": round(percentile(s, 0.5) * 1000, 1), "p95_ms": round(percentile(s, 0.95) * 1000, 1),
            "max_ms": round(s[-1] * 1000, 1), "missed": sum(1 for x in latencies if x > period_s),
            "cycles": len(latencies), "drift_ms_per_cycle": round(drift * 1000, 1)}


def summary(runs: list) -> dict:
    return {"p50_ms": round(statistics.median(r["p50_ms"] for r in runs), 1),
            "p95_ms": round(statistics.median(r["p95_ms"] for r in runs), 1),
            "max_ms": max(r["max_ms"] for r in runs), "missed": sum(r["missed"] for r in runs),
            "cycles": sum(r["cycles"] for r in runs),
            "drift_ms_per_cycle": round(statistics.median(r["drift_ms_per_cycle"] for r in runs), 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--runs", type=int, default=3, help="runs (default %(default)s); run r's plan has seed + r")
    parser.add_argument("--cycles", type=int, default=40, help="measured cycles per load, run and contender")
    parser.add_argument("--loads", default=",".join(map(str, LOADS)), help="fractions of the %d CPUs" % CPUS)
    parser.add_argument("--period-ms", type=float, default=PERIOD_MS)
    parser.add_argument("--seed", type=int, default=47)
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="of " + ",".join(CONTENDERS))
    parser.add_argument("--note-dir", help="every sim appends its id to DIR/<contender>-<load>-<run>.log")
    args = parser.parse_args(argv)
    names = args.contenders.split(",")
    try:
        loads = [float(x) for x in args.loads.split(",")]
    except ValueError:
        parser.error(f"--loads: not numbers: {args.loads!r}")
    if unknown := [n for n in names if n not in CONTENDERS]:
        parser.error(f"unknown contender {unknown[0]!r}")
    if args.runs < 1 or args.cycles < 1 or args.period_ms <= 0 or not all(0 < x < 1 for x in loads):
        parser.error("--runs and --cycles must be at least 1, --period-ms above 0, each load in (0, 1)")
    period_s = args.period_ms / 1000
    res: dict = {"cpus": CPUS, "period_ms": args.period_ms, "cycles": args.cycles, "runs": args.runs,
                 "seed": args.seed, "loadavg_before": os.getloadavg(),
                 "scaling": {f"{load:g}": {k: round(v * 1000, 3) for k, v in costs(load, period_s).items()}
                             for load in loads},
                 "absent": {}, "contenders": {}}
    res["scaling"]["unit"] = "ms of CPU per part"
    with contextlib.ExitStack() as stack:
        contenders = []
        for name in names:
            if why := absent(name):
                res["absent"][name] = why
                continue
            c = (open_ppe if name == "process_pool_executor" else open_fleet)(stack, name)
            run_cycles(c, make_plan(args.seed - 1, 2), costs(loads[0], period_s), period_s, None)  # warm
            contenders.append(c)
        rows = {c.name: {f"{load:g}": [] for load in loads} for c in contenders}
        tallies = {c.name: {f"{load:g}": [] for load in loads} for c in contenders}
        for r in range(args.runs):
            plan = make_plan(args.seed + r, args.cycles)
            for load in loads:
                turn = r % len(contenders) if contenders else 0
                for c in contenders[turn:] + contenders[:turn]:
                    note = None
                    if args.note_dir:
                        note = os.path.join(args.note_dir, f"{c.name}-{load:g}-{r}.log")
                    got = run_cycles(c, plan, costs(load, period_s), period_s, note)
                    rows[c.name][f"{load:g}"].append(figures(got.pop("latencies"), period_s))
                    tallies[c.name][f"{load:g}"].append(got)
                if not args.json:
                    print(f"run {r + 1} load {load:g}: done", file=sys.stderr, flush=True)
        for c in contenders:
            facts = dict(c.facts)
            status = facts.pop("status", None)
            if status is not None:  # a fleet: its ledger, and the saturation episodes it read per role
                doc = status()
                facts["ledger"] = {k: doc["ledger"][k] for k in ("submitted", "solved", "failed", "suppressed")}
                facts["saturation_episodes"] = {q["name"]: q["saturation"]["episodes"] for q in doc["queues"]}
            res["contenders"][c.name] = {**facts, "loads": {
                load: {"summary": summary(runs), "runs": runs, "sims": tallies[c.name][load]}
                for load, runs in rows[c.name].items()}}
    res["loadavg_after"] = os.getloadavg()
    res["target"] = target(res, loads)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    print_table(res, loads)
    return 0


def target(res: dict, loads: list) -> dict:
    """fleet_inside_pinned's p95 over the pool's, per load (<= 1 meets the target)."""
    got = res["contenders"]
    out: dict = {"rule": "fleet_inside_pinned p95 <= process_pool_executor p95 at every load"}
    if "fleet_inside_pinned" not in got or "process_pool_executor" not in got:
        out["met"] = None
        return out
    for load in loads:
        key = f"{load:g}"
        mine = got["fleet_inside_pinned"]["loads"][key]["summary"]["p95_ms"]
        theirs = got["process_pool_executor"]["loads"][key]["summary"]["p95_ms"]
        out[f"p95_over_pool_{key}"] = round(mine / theirs, 3)
    out["met"] = all(out[f"p95_over_pool_{load:g}"] <= 1 for load in loads)
    return out


def print_table(res: dict, loads: list) -> None:
    print(f"cycle every {res['period_ms']:g} ms, {res['cycles']} cycles x {res['runs']} runs per load, "
          f"{res['cpus']} CPUs; load average before {res['loadavg_before'][0]:.2f}, after {res['loadavg_after'][0]:.2f}")
    for load in loads:
        key = f"{load:g}"
        parts = res["scaling"][key]
        print(f"\nload {key}: segment {parts['segment']:.2f} ms, sim {parts['sim']:.3f} ms, "
              f"resolve {parts['resolve']:.2f} ms, merge {parts['merge']:.2f} ms (CPU)")
        print(f"  {'contender':<22} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'missed':>9} {'drift ms':>9}   "
              "per run p95")
        for name, row in res["contenders"].items():
            s = row["loads"][key]["summary"]
            per_run = " ".join(f"{r['p95_ms']:.0f}" for r in row["loads"][key]["runs"])
            print(f"  {name:<22} {s['p50_ms']:>8.1f} {s['p95_ms']:>8.1f} {s['max_ms']:>8.1f} "
                  f"{s['missed']:>4}/{s['cycles']:<4} {s['drift_ms_per_cycle']:>9.1f}   {per_run}")
    print()
    for name, row in res["contenders"].items():
        if "binding" in row:
            seats = ", ".join(f"{s['name']}@{','.join(map(str, s['cpus']))}" for s in row["seats"])
            print(f"{name}: {row['binding']}{' (oversubscribed)' if row['oversubscribed'] else ''}: {seats}; "
                  f"saturation episodes {row['saturation_episodes']}")
    for name, why in res["absent"].items():
        print(f"absent: {name}: {why}")
    print("\ntarget:", json.dumps(res["target"]))


if __name__ == "__main__":
    sys.exit(main())
