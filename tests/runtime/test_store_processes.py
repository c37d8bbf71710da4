"""Independent orchestrator processes sharing one store, on SQLite and on PostgreSQL."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from admission.store import ADMITTED, QUEUED, TIMED_OUT, Policy, Request, open_store

from ..store_backends import FakeClock, backend, pg_dsn, quota_history_violations, store_url, stores  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent.parent


def _spawn(*args) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "tests.store_procs", *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_independent_schedulers_share_quotas(store_url, reaper):
    policy = Policy.build(global_limit=3, environments={"prod": 1, "dev": 2}, providers={"openai": 2},
                          tiers={"host": 1, "vm": 1})
    limits = {"global": 3, "environment": {"prod": 1, "dev": 2}, "provider": {"openai": 2},
              "tier": {"host": 1, "vm": 1}}  # the same, as the quota rule written out in tests.quotas takes them
    with open_store(store_url, actor="operator") as s:
        s.set_policy(policy)
    count = 15
    procs = [_spawn("scheduler", store_url, f"orch-{i}", count, i, json.dumps(limits)) for i in range(3)]
    reaper.extend(procs)
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    for r in results:
        assert r["violations"] == []
        assert len(r["admitted"]) == count
    with open_store(store_url, actor="operator") as s:
        # every quota held after every step of every orchestrator, replayed from the audit trail
        assert quota_history_violations(s, limits) == []
        assert s.active() == []
        admitted_events = [e for e in s.events() if e.kind == "admitted"]
        assert len(admitted_events) == 3 * count
        # the decisions were taken by more than one orchestrator's transactions
        assert len({e.actor for e in admitted_events}) > 1


def test_a_killed_orchestrators_lease_is_reclaimed_after_expiry(store_url, reaper):
    clock = FakeClock()
    holder = _spawn("holder", store_url, "orch-dead", clock.now)
    reaper.append(holder)
    held = json.loads(holder.stdout.readline())
    assert held["state"] == ADMITTED
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(30)
    with open_store(store_url, actor="orch-live", clock=clock) as s:
        mine = s.submit(Request("live-1", "orch-live", "prod", "openai", "host"))
        assert mine.state == QUEUED  # the dead holder's lease still counts until it expires
        clock.advance(held["lease_ttl"] - 0.001)
        assert s.get("live-1").state == QUEUED
        clock.advance(0.001)
        # a restarted or surviving orchestrator reconciles before it dispatches
        live = {r.id: r for r in s.reconcile()}
        assert live["live-1"].state == ADMITTED
        dead = s.get(held["id"])
        assert (dead.state, dead.reason) == (TIMED_OUT, "lease expired")
