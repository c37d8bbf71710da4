#!/usr/bin/env python3
"""Submit many units to an embedded Fleet while killing its workers; count the outcomes.

    python tools/chaos.py [--units 100000] [--kill-every 0.05] [--profile pinned] [--json]

Every submitted unit must end with exactly one outcome: solved (its result checked)
or failed with LaneDeath (its worker was SIGKILLed under it). The ledger must agree
with what the futures said, and no unit's handler may run twice (each run is noted in
a file). Exits 0 when they do, 1 otherwise. The report also counts the LaneDeaths whose
handler never ran: a unit granted to a dead seat and not started goes back to its
queue, so only a kill that lands after a unit's START and before its handler's first
line (where the fleet rightly counts it as started) leaves one, at most one per kill.

    python tools/chaos.py --storm [--seed 1] [--units 3000] [--kill-every 0.03] [--kill-zygote] [--lenient]

The storm: two pooled roles `a` and `b` (2 slots each, pinned profile, 2 CPUs, the
default restart intensity unless --lenient), payloads of 1 B-64 KiB submitted as fast
as they go (a role stopped by restart intensity refuses with RoleStopped: correct),
and SIGKILLs that go on while `shutdown()` drains the queues. Shutdown must return
within --shutdown-deadline seconds, every future must be resolved, and the ledger
exact; exits 1 (with the fleet's state) when shutdown wedged.
"""
from __future__ import annotations

import argparse
import collections
import logging
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench"))

import fleet  # noqa: E402
from fleet.rules.ranges import CONFIG  # noqa: E402

#: Restarts without end, as far as the config allows: the most restarts it takes in a window.
NO_INTENSITY = {"max_restarts": CONFIG["restart.max_restarts"].hi, "within_seconds": 1}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--units", type=int, default=None, help="default 100000 (--storm: 3000)")
    parser.add_argument("--kill-every", type=float, default=None, help="seconds between SIGKILLs (0.05; --storm: 0.03)")
    parser.add_argument("--profile", default="pinned", choices=("auto", "serial", "pinned"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--storm", action="store_true", help="two small roles; kills go on through shutdown")
    parser.add_argument("--seed", type=int, default=1, help="storm: the kill and payload seed")
    parser.add_argument("--kill-zygote", action="store_true", help="storm: now and then kill the zygote too")
    parser.add_argument("--lenient", action="store_true", help="storm: no restart intensity (roles never stop)")
    parser.add_argument("--shutdown-deadline", type=float, default=120.0, help="storm: seconds shutdown may take")
    args = parser.parse_args(argv)
    if args.units is None:
        args.units = 3000 if args.storm else 100_000
    if args.kill_every is None:
        args.kill_every = 0.03 if args.storm else 0.05
    logging.basicConfig(level=os.environ.get("CHAOS_LOG", "ERROR"), format="%(asctime)s %(message)s")  # each death is a warning; the report says how many
    if args.storm:
        return storm(args)
    cfg = {
        "fleet": {"name": f"chaos-{os.getpid()}-{uuid.uuid4().hex[:6]}", "profile": args.profile},
        "roles": {"work": {"kind": "pooled", "handler": "bench_handlers:noted_unit_work", "slots": 16 * args.workers,
                           "peak_cpus": args.workers, "queue_bound": args.units}},
        "restart": NO_INTENSITY,
    }
    stop, kills = threading.Event(), []
    run_log = tempfile.NamedTemporaryFile(prefix="fleet-chaos-ran-", delete=False)  # a line per handler run
    run_log.close()
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
        futures = [f.submit("work", (run_log.name, i)) for i in range(args.units)]
        solved = other = 0
        lane_deaths = []
        for i, fut in enumerate(futures):
            exc = fut.exception()
            if exc is None:
                solved += 1
            elif getattr(exc, "reason", None) == "LaneDeath":
                lane_deaths.append(i)
            else:
                other += 1
        stop.set()
        killer.join()
        ledger = f.ledger()
    with open(run_log.name) as log:
        ran = collections.Counter(int(line) for line in log)
    os.unlink(run_log.name)
    report = {
        "units": args.units,
        "kills": len(kills),
        "seconds": round(time.monotonic() - t0, 1),
        "binding": f.layout.seats[0].binding,
        "futures": {"solved": solved, "LaneDeath": len(lane_deaths), "other": other},
        "ledger": ledger,
        "LaneDeath_never_ran": sum(1 for i in lane_deaths if not ran[i]),
        "ran_twice": sum(1 for n in ran.values() if n > 1),
    }
    exact = (
        solved + len(lane_deaths) + other == args.units
        and ledger["submitted"] == args.units
        and ledger["inflight"] == 0
        and ledger["solved"] == solved
        and ledger["failed"] == len(lane_deaths) + other
        and report["ran_twice"] == 0
    )
    report["exactly_one_outcome_each"] = exact
    print(json.dumps(report, indent=None if not args.json else 2))
    return 0 if exact else 1


#: How long a zygote serves (has workers) before the storm may kill it.
ZYGOTE_SERVES_S = 3.0


def storm(args) -> int:
    from fleet.rules.unit import RoleStopped

    role = {"kind": "pooled", "handler": "bench_handlers:echo_unit", "slots": 2, "peak_cpus": 1, "queue_bound": 10**6}
    cfg = {"fleet": {"name": f"storm-{os.getpid()}-{uuid.uuid4().hex[:6]}", "profile": "pinned", "cpus": 2},
           "roles": {"a": role, "b": role}}
    if args.lenient:
        cfg["restart"] = NO_INTENSITY
    rng, kills, stop = random.Random(args.seed), [], threading.Event()
    f = fleet.Fleet.from_config(cfg, env={})

    def chaos():
        krng = random.Random(args.seed)
        serving_since: dict[int, float] = {}  # zygote pid -> when it was first seen with workers
        while not stop.wait(args.kill_every):
            sup = f._sup
            pids = list(sup.pids().values())
            victim = krng.choice(pids) if pids else None
            zygote, now = sup.seats.workers.zygote, time.monotonic()
            if args.kill_zygote and pids and zygote is not None:
                # Only a zygote that has served for a while: a reboot takes ~1-2 s on a quiet
                # host and longer on a busy one, and a storm that kills each new zygote
                # before it forks tests nothing but the restart's patience.
                if now - serving_since.setdefault(zygote.pid, now) >= ZYGOTE_SERVES_S:
                    victim = zygote.pid
                    serving_since[zygote.pid] = float("inf")  # one kill per zygote
            if victim is not None:
                try:
                    os.kill(victim, signal.SIGKILL)
                    kills.append(victim)
                except ProcessLookupError:
                    pass

    threading.Thread(target=chaos, daemon=True).start()
    t0, futures, live = time.monotonic(), [], ["a", "b"]
    for _ in range(args.units):
        if not live:
            break
        name = rng.choice(live)
        payload = rng.randbytes(rng.randint(1, 64 * 1024 - 256))
        try:
            futures.append((f.submit(name, payload), payload))
        except RoleStopped:
            live.remove(name)
    closer = threading.Thread(target=f.shutdown, daemon=True)
    closer.start()
    closer.join(args.shutdown_deadline)
    stop.set()
    report = {"seed": args.seed, "submitted": len(futures), "kills": len(kills), "ledger": f.ledger()}
    if closer.is_alive():
        sup = f._sup
        try:  # a wedged loop may not answer
            inside = sup.inspect(lambda s: {"pids": dict(s.seats.workers.pids), "posture": sorted(s.posture.causes),
                                            "queued": [s.dispatcher.queued(c) for c in range(len(s.roles))]},
                                 timeout=2)
        except TimeoutError:
            inside = {"loop": "did not answer"}
        report["wedged"] = {"slots": [sup.table.snapshot().slot(i) for i in range(len(sup.layout.slots))], **inside}
        print(json.dumps(report, indent=2, default=str))
        sup.kill()
        return 1
    outcomes = {}
    for fut, payload in futures:
        exc = fut.exception(0)
        key = "solved" if exc is None and fut.result() == payload else getattr(exc, "reason", "wrong value")
        outcomes[key] = outcomes.get(key, 0) + 1
    ledger = report["ledger"]
    report.update(futures=outcomes, seconds=round(time.monotonic() - t0, 1))
    report["exactly_one_outcome_each"] = exact = (
        ledger["submitted"] == len(futures) and ledger["inflight"] == 0 and ledger["solved"] == outcomes.get("solved", 0)
        and ledger["solved"] + ledger["suppressed"] + ledger["failed"] == ledger["submitted"]
        and "wrong value" not in outcomes
    )
    print(json.dumps(report, indent=None if not args.json else 2))
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
