"""Orchestrator processes for the store tests: ``python -m tests.store_procs ROLE ...``.

``scheduler URL ACTOR COUNT SEED LIMITS``: submit COUNT requests one after another with
random placements; wait for each to be admitted, check that the admitted set is
within every quota of LIMITS (JSON, as `tests.quotas.breaches` takes them), release it.
Prints one JSON line: ids admitted, violations.

``fleet URL ACTOR COUNT PAYLOAD_MS TTL``: an embedded fleet configured with the store;
submit COUNT units of a host-tier role and print their outcomes as JSON.

``holder URL ACTOR NOW``: with the clock stopped at NOW, submit one host-tier
request, print its record as JSON, then sleep until killed.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time

from admission.store import ADMITTED, QUEUED, Request, open_store
from tests.quotas import breaches

ENVIRONMENTS = ("prod", "dev", "ci")
PROVIDERS = ("openai", "anthropic")
TIERS = ("host", "container", "vm")


def scheduler(url: str, actor: str, count: int, seed: int, limits: dict) -> dict:
    rnd = random.Random(seed)
    store = open_store(url, actor=actor)
    admitted, violations = [], []
    for i in range(count):
        r = Request(f"{actor}-{i}", actor, rnd.choice(ENVIRONMENTS), rnd.choice(PROVIDERS), rnd.choice(TIERS),
                    priority=rnd.randint(0, 3), lease_ttl=600.0)
        rec = store.submit(r)
        deadline = time.monotonic() + 120
        while rec.state == QUEUED and time.monotonic() < deadline:
            time.sleep(0.002)
            rec = store.get(r.id)
        if rec.state != ADMITTED:
            violations.append(f"{r.id} ended {rec.state}")
            continue
        live = [x for x in store.active() if x.state == ADMITTED]
        over = breaches(limits, live)
        if over:
            violations.append(f"after admitting {r.id}: {over}")
        admitted.append(r.id)
        store.release(r.id, rec.revision)
    store.close()
    return {"actor": actor, "admitted": admitted, "violations": violations}


def holder(url: str, actor: str, now: float) -> None:
    store = open_store(url, actor=actor, clock=lambda: now)
    rec = store.submit(Request(f"{actor}-held", actor, "prod", "openai", "host", lease_ttl=30.0))
    print(json.dumps(rec.to_dict()), flush=True)
    while True:
        time.sleep(60)


def fleet_run(url: str, actor: str, count: int, payload_ms: int, ttl: float) -> dict:
    """An embedded fleet whose role ``w`` (host tier) holds a store lease per unit."""
    import fleet

    config = {
        # its own pid names it: unique on the host, and the test that SIGKILLs it can find its segments
        "fleet": {"name": f"st{actor}-{os.getpid()}"},
        "roles": {"w": {"kind": "pooled", "handler": "fleet.api.examples:slow_square", "slots": 1}},
        "store": {"url": url, "orchestrator": actor, "lease_ttl": ttl, "poll_every": 0.05,
                  "roles": {"w": {"environment": "prod", "tier": "host"}}},
    }
    outcomes = []
    with fleet.Fleet.from_config(config, env={}) as f:
        futures = [f.submit("w", payload_ms) for _ in range(count)]
        for fut in futures:
            try:
                outcomes.append(["solved", fut.result(timeout=300)])
            except fleet.UnitFailed as exc:
                outcomes.append([exc.outcome.reason, exc.outcome.detail])
    return {"actor": actor, "outcomes": outcomes}


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    if role == "scheduler":
        print(json.dumps(scheduler(args[0], args[1], int(args[2]), int(args[3]), json.loads(args[4]))), flush=True)
    elif role == "fleet":
        print(json.dumps(fleet_run(args[0], args[1], int(args[2]), int(args[3]), float(args[4]))), flush=True)
    elif role == "holder":
        holder(args[0], args[1], float(args[2]))
    else:
        sys.exit(f"unknown role {role!r}")
