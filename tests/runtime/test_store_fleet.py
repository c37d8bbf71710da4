"""A fleet as one orchestrator of its host group: the lease gate, and fleets sharing a store."""
from __future__ import annotations

import json
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from admission.store import Policy, Request, open_store
from admission.store.sqlite import SqliteStore
from fleet.runtime.config import ConfigError, StoreConfig, StoreRole, load_config
from fleet.runtime.lease_gate import LeaseGate

from ..quotas import DEFAULT_LIMITS
from ..store_backends import backend, pg_dsn, quota_history_violations, store_url, stores  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent.parent
BOUND_S = 60.0


def make_gate(url, roles, name, *, ttl=2.0, renew=None, poll=0.02, opener=None, policy=None):
    cfg = StoreConfig(url=url, orchestrator=name, lease_ttl=ttl, renew_every=renew, poll_every=poll, policy=policy,
                      roles=tuple(roles.items()))
    seen: queue.Queue = queue.Queue()
    gate = LeaseGate(cfg, "fleet", on_admitted=lambda u: seen.put(("admitted", u, "")),
                     on_lost=lambda u, reason, d: seen.put(("lost", u, f"{reason}: {d}")), open_store=opener)
    return gate.start(), seen


def next_event(seen, timeout=BOUND_S):
    return seen.get(timeout=timeout)


def quiet(seen, seconds):
    """True if the gate said nothing for `seconds` (it must not admit)."""
    try:
        seen.get(timeout=seconds)
    except queue.Empty:
        return True
    return False


def requests_of(url, orchestrator):
    with open_store(url, actor="observer") as s:
        return {e.request_id: s.get(e.request_id) for e in s.events() if e.request_id.startswith(orchestrator + "/")}


def wait_for(predicate, timeout=BOUND_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


HOST = {"w": StoreRole(environment="prod", tier="host")}


def test_gate_admits_renews_and_releases(store_url):
    gate, seen = make_gate(store_url, HOST, "orch-a", ttl=6.0)
    try:
        gate.hold(1, "w")
        assert next_event(seen) == ("admitted", 1, "")
        time.sleep(7.0)  # past the first ttl: only renewals (every 2 s) keep it
        (rec,) = requests_of(store_url, "orch-a").values()
        assert rec.state == "admitted" and rec.revision > 1
        gate.done(1)
        wait_for(lambda: all(r.state == "released" for r in requests_of(store_url, "orch-a").values()))
    finally:
        gate.stop()


def test_two_gates_share_the_host_tier_quota(store_url):
    a, seen_a = make_gate(store_url, HOST, "orch-a", ttl=30.0)
    b, seen_b = make_gate(store_url, HOST, "orch-b", ttl=30.0)
    try:
        a.hold(1, "w")
        assert next_event(seen_a) == ("admitted", 1, "")
        b.hold(1, "w")
        assert quiet(seen_b, 1.0)  # host tier: one lease in the whole group
        a.done(1)
        assert next_event(seen_b) == ("admitted", 1, "")
    finally:
        a.stop()
        b.stop()


def test_a_denied_request_fails_the_unit(store_url):
    roles = {"w": StoreRole(environment="blocked", tier="container")}
    gate, seen = make_gate(store_url, roles, "orch-a", policy=Policy.build(environments={"blocked": 0}))
    try:
        gate.hold(7, "w")
        kind, unit, detail = next_event(seen)
        assert (kind, unit) == ("lost", 7) and detail.startswith("LeaseDenied") and "blocked" in detail
    finally:
        gate.stop()


def test_a_preempted_lease_is_lost(store_url):
    roles = {"w": StoreRole(environment="prod", tier="host", preemptible=True)}
    gate, seen = make_gate(store_url, roles, "orch-a", ttl=9.0, renew=0.3, policy=Policy.build(preemption=True))
    try:
        gate.hold(1, "w")
        assert next_event(seen)[0] == "admitted"
        with open_store(store_url, actor="orch-b") as other:
            assert other.submit(Request("urgent", "orch-b", "prod", "x", "host", priority=5)).state == "admitted"
        kind, unit, detail = next_event(seen)
        assert (kind, unit) == ("lost", 1) and detail.startswith("LeasePreempted:") and "preempted" in detail
    finally:
        gate.stop()


def test_an_unreachable_store_fails_closed_and_recovers(tmp_path):
    """SQLite held locked by another writer: the store does not answer in time."""
    url = f"sqlite://{tmp_path}/store.db"
    open_store(url).close()
    opener = lambda u, actor, clock, call_timeout: SqliteStore(u, actor, clock, busy_timeout=0.1)  # noqa: E731
    gate, seen = make_gate(url, HOST, "orch-a", ttl=1.0, opener=opener)
    blocker = sqlite3.connect(str(tmp_path / "store.db"), isolation_level=None)
    try:
        gate.hold(1, "w")
        assert next_event(seen) == ("admitted", 1, "")
        blocker.execute("BEGIN IMMEDIATE")  # the store stops answering
        kind, unit, detail = next_event(seen)
        # lost once its ttl ran out unrenewed, whichever of the gate's checks sees it first
        assert (kind, unit) == ("lost", 1) and detail.startswith("LeaseExpired:")
        gate.hold(2, "w")
        assert quiet(seen, 1.0)  # nothing is admitted while the store is away
        blocker.execute("ROLLBACK")  # it answers again
        assert next_event(seen) == ("admitted", 2, "")  # once unit 1's lease has expired
    finally:
        blocker.close()
        gate.stop()


# ----------------------------------------------------------------------------- config


def test_store_config_section():
    roles = {"w": {"kind": "pooled", "handler": "fleet.api.examples:square", "slots": 1}}
    cfg = load_config({"roles": roles, "store": {"url": "sqlite:///tmp/s.db", "tiers": {"host": 2},
                                                 "roles": {"w": {"environment": "prod"}}}}, env={})
    assert cfg.store.policy.tier_limit("host") == 2 and cfg.store.role("w").tier == "host"
    assert load_config({"roles": roles}, env={}).store.url is None
    env = {"FLEET_STORE__URL": "sqlite:///tmp/e.db", "FLEET_STORE__LEASE_TTL": "9"}
    assert load_config({"roles": roles}, env=env).store.lease_ttl == 9


@pytest.mark.parametrize("store,path", [
    ({"url": "mysql://x"}, "store.url"),
    ({"lease_ttl": 3}, "store.url"),
    ({"url": "sqlite:///x", "lease_ttl": 0}, "store.lease_ttl"),
    ({"url": "sqlite:///x", "renew_every": 5, "lease_ttl": 5}, "store.renew_every"),
    ({"url": "sqlite:///x", "tiers": {"vm": -1}}, "store.tiers.vm"),
    ({"url": "sqlite:///x", "aging_interval": 0}, "store.aging_interval"),
    ({"url": "sqlite:///x", "bogus": 1}, "store.bogus"),
    ({"url": "sqlite:///x", "roles": {"nope": {"environment": "e"}}}, "store.roles.nope"),
    ({"url": "sqlite:///x", "roles": {"w": {"tier": "host"}}}, "store.roles.w.environment"),
    ({"url": "sqlite:///x", "roles": {"w": {"environment": "e", "tier": "metal"}}}, "store.roles.w.tier"),
    ({"url": "sqlite:///x", "roles": {"w": {"environment": "e", "priority": "high"}}}, "store.roles.w.priority"),
])
def test_bad_store_config_is_named(store, path):
    roles = {"w": {"kind": "pooled", "handler": "fleet.api.examples:square", "slots": 1}}
    with pytest.raises(ConfigError) as err:
        load_config({"roles": roles, "store": store}, env={})
    assert err.value.path == path


# ----------------------------------------------------------------------------- fleets sharing a store


def _unlink_segments(name):
    from fleet.shm import dataplane
    from fleet.shm.table import segment

    segment.unlink(name)
    dataplane.unlink(name)


def _fleet(url, actor, count, payload_ms, ttl):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "tests.store_procs", "fleet", url, actor, str(count),
                             str(payload_ms), str(ttl)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_two_fleets_share_a_host_tier_quota_of_one(store_url, reaper):
    procs = [_fleet(store_url, f"fleet-{i}", 3, 200, 10.0) for i in range(2)]
    reaper.extend(procs)
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        result = json.loads(out.strip().splitlines()[-1])
        assert [o[0] for o in result["outcomes"]] == ["solved"] * 3
    with open_store(store_url, actor="observer") as s:
        admitted = [e for e in s.events() if e.kind == "admitted"]
        assert len(admitted) == 6 and {e.request_id.split("/")[0] for e in admitted} == {"fleet-0", "fleet-1"}
        assert quota_history_violations(s, DEFAULT_LIMITS) == []  # host tier: never two at once
        assert s.active() == []  # every lease was given back


def test_a_killed_fleets_lease_is_reclaimed(store_url, reaper):
    dead = _fleet(store_url, "fleet-dead", 1, 60_000, 2.0)
    reaper.append(dead)
    with open_store(store_url, actor="observer") as s:
        wait_for(lambda: any(e.kind == "admitted" for e in s.events()))
    live = _fleet(store_url, "fleet-live", 1, 10, 2.0)
    reaper.append(live)
    time.sleep(0.5)
    os.kill(dead.pid, signal.SIGKILL)
    dead.wait(30)
    _unlink_segments(f"stfleet-dead-{dead.pid}")  # a SIGKILLed fleet cannot remove its own
    out, err = live.communicate(timeout=300)
    assert live.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["outcomes"][0][0] == "solved"
    with open_store(store_url, actor="observer") as s:
        (held,) = [e.request_id for e in s.events() if e.request_id.startswith("fleet-dead/")][:1]
        rec = s.get(held)
        assert (rec.state, rec.reason) == ("timed-out", "lease expired")


def test_a_running_unit_whose_lease_is_lost_fails_by_name(store_url, fleet_name):
    import fleet

    config = {
        "fleet": {"name": fleet_name},
        "roles": {"w": {"kind": "pooled", "handler": "fleet.api.examples:slow_square", "slots": 1}},
        "store": {"url": store_url, "orchestrator": "orch-a", "lease_ttl": 9.0, "renew_every": 0.3, "poll_every": 0.05,
                  "preemption": True,
                  "roles": {"w": {"environment": "prod", "tier": "host", "preemptible": True}}},
    }
    with fleet.Fleet.from_config(config, env={}) as f, open_store(store_url, actor="orch-b") as other:
        fut = f.submit("w", 30_000)
        wait_for(lambda: fut.running())
        urgent = other.submit(Request("urgent", "orch-b", "prod", "x", "host", priority=5))
        assert urgent.state == "admitted"
        with pytest.raises(fleet.UnitFailed) as err:
            fut.result(timeout=BOUND_S)
        assert err.value.outcome.reason == "LeasePreempted" and "preempted" in err.value.outcome.detail
        assert "request orch-a/" in err.value.outcome.detail and "lease revision" in err.value.outcome.detail
        # while orch-b holds the host tier, a new unit waits for its lease; then it runs
        nxt = f.submit("w", 10)
        time.sleep(0.5)
        assert not nxt.done()
        other.release("urgent", urgent.revision)
        assert nxt.result(timeout=BOUND_S) == 100
        counts = f.ledger()
    assert (counts["submitted"], counts["solved"], counts["failed"]) == (2, 1, 1)


def test_a_unit_whose_lease_ends_while_it_waits_for_a_slot_never_runs(store_url, fleet_name):
    import fleet

    config = {
        "fleet": {"name": fleet_name},
        "roles": {"w": {"kind": "pooled", "handler": "fleet.api.examples:slow_square", "slots": 1}},
        "store": {"url": store_url, "orchestrator": "orch-a", "lease_ttl": 9.0, "renew_every": 0.3, "poll_every": 0.05,
                  "preemption": True,
                  "tiers": {"container": 2},
                  "roles": {"w": {"environment": "prod", "tier": "container", "preemptible": True}}},
    }
    with fleet.Fleet.from_config(config, env={}) as f, open_store(store_url, actor="orch-b") as other:
        running = f.submit("w", 6000)
        wait_for(lambda: running.running())
        waiting = f.submit("w", 10)  # admitted by the store, queued behind the one slot
        wait_for(lambda: sum(e.kind == "admitted" for e in other.events()) == 2)
        # the newest of the two equal leases is the victim
        assert other.submit(Request("urgent", "orch-b", "prod", "x", "container", priority=5)).state == "admitted"
        with pytest.raises(fleet.UnitFailed) as err:
            waiting.result(timeout=BOUND_S)
        assert err.value.outcome.reason == "LeasePreempted" and "preempted" in err.value.outcome.detail
        assert running.result(timeout=BOUND_S) == 36_000_000


def _gated_fleet(store_url, fleet_name):
    import fleet

    return fleet.Fleet.from_config({
        "fleet": {"name": fleet_name},
        "roles": {"w": {"kind": "pooled", "handler": "fleet.api.examples:slow_square", "slots": 1}},
        "store": {"url": store_url, "orchestrator": "orch-a", "lease_ttl": 5.0, "poll_every": 0.05,
                  "roles": {"w": {"environment": "prod", "tier": "host"}}},
    }, env={})


def _orch_a_requests(store):
    return [store.get(e.request_id) for e in store.events() if e.kind == "queued" and e.request_id.startswith("orch-a/")]


def test_every_unit_of_a_map_over_a_gated_role_takes_its_own_lease(store_url, fleet_name):
    # map submits in batches (submit_many): each unit of a batch still waits for its lease
    with open_store(store_url, actor="orch-b") as other, _gated_fleet(store_url, fleet_name) as f:
        assert list(f.map("w", [1, 2, 3])) == [1, 4, 9]
        assert sorted(f.map_unordered("w", [4, 5], chunksize=2)) == [16, 25]
        wait_for(lambda: [r.state for r in _orch_a_requests(other)] == ["released"] * 4)


def test_a_chunk_an_item_of_which_raised_still_gives_its_lease_back(store_url, fleet_name):
    # A chunk of a map is one unit: its end reaches the lease gate whatever its outcome,
    # including the one that carries its items back (here, one raised).
    with open_store(store_url, actor="orch-b") as other, _gated_fleet(store_url, fleet_name) as f:
        results = f.map("w", [2, "x"], chunksize=2)
        assert next(results) == 4
        with pytest.raises(TypeError):
            next(results)
        wait_for(lambda: [r.state for r in _orch_a_requests(other)] == ["released"])
        assert f.ledger()["failed"] == 1


def test_shutdown_waits_for_a_unit_waiting_for_its_lease(store_url, fleet_name):
    import threading

    with open_store(store_url, actor="orch-b") as other:
        blocker = other.submit(Request("blocker", "orch-b", "prod", "x", "host", lease_ttl=300))
        f = _gated_fleet(store_url, fleet_name)
        fut = f.submit("w", 10)
        wait_for(lambda: _orch_a_requests(other))
        closer = threading.Thread(target=f.shutdown)  # wait=True: pending work still runs
        closer.start()
        time.sleep(0.5)
        assert not fut.done() and closer.is_alive()
        other.release("blocker", blocker.revision)
        assert fut.result(timeout=BOUND_S) == 100
        closer.join(BOUND_S)
        assert not closer.is_alive()
        assert [r.state for r in _orch_a_requests(other)] == ["released"]


def test_cancelling_shutdown_withdraws_waiting_requests(store_url, fleet_name):
    from concurrent.futures import CancelledError

    with open_store(store_url, actor="orch-b") as other:
        other.submit(Request("blocker", "orch-b", "prod", "x", "host", lease_ttl=300))
        f = _gated_fleet(store_url, fleet_name)
        fut = f.submit("w", 10)
        wait_for(lambda: _orch_a_requests(other))
        f.shutdown(wait=True, cancel_futures=True)
        with pytest.raises(CancelledError):
            fut.result(timeout=0)
        assert f.ledger()["failed"] == 1
        wait_for(lambda: [r.state for r in _orch_a_requests(other)] == ["cancelled"])


def test_a_stopping_fleet_fails_units_still_waiting_for_a_lease(store_url, fleet_name):
    import fleet

    with open_store(store_url, actor="orch-b") as other:
        other.submit(Request("blocker", "orch-b", "prod", "x", "host", lease_ttl=300))
        f = _gated_fleet(store_url, fleet_name)
        fut = f.submit("w", 10)
        wait_for(lambda: _orch_a_requests(other))
        f._sup.stop(grace_s=0.0)  # what fleetd does on SIGTERM
        with pytest.raises(fleet.UnitFailed) as err:
            fut.result(timeout=BOUND_S)
        assert err.value.outcome.reason == "Shutdown"
        wait_for(lambda: [r.state for r in _orch_a_requests(other)] == ["cancelled"])


# ----------------------------------------------------------------------------- the gate's own rules


def test_a_restarted_orchestrator_cancels_what_its_earlier_run_left_queued(store_url):
    with open_store(store_url, actor="orch-b") as other, open_store(store_url, actor="orch-a") as earlier:
        other.submit(Request("blocker", "orch-b", "prod", "x", "host", lease_ttl=300))
        left = earlier.submit(Request("orch-a/previous-run/1", "orch-a", "prod", "x", "host"))
        assert left.state == "queued"
        gate, seen = make_gate(store_url, HOST, "orch-a")
        try:
            wait_for(lambda: other.get(left.id).state == "cancelled")
            assert "restarted" in other.get(left.id).reason
            assert other.get("blocker").state == "admitted"
        finally:
            gate.stop()


def test_the_expiry_margin_keeps_a_tenth_within_bounds():
    from fleet.runtime.lease_gate import call_timeout, expiry_margin

    assert expiry_margin(30.0) == 3.0  # a tenth
    assert expiry_margin(0.6) == 0.1  # at least 0.1 s
    assert expiry_margin(0.2) == 0.05  # at most a quarter of the lease
    assert call_timeout(30.0, 10.0) == 7.5 and call_timeout(2.0, 0.5) == 0.5 and call_timeout(0.1, 0.03) == 0.05


def test_the_watchdog_reports_a_unit_once_and_never_after_it_was_taken():
    import threading

    from fleet.runtime.lease_gate import _Watchdog

    fired: list = []
    done = threading.Event()

    def on_expired(unit, lease):
        fired.append((unit, lease))
        done.set()

    dog = _Watchdog(on_expired, time.monotonic)
    dog.start()
    try:
        dog.track(1)
        dog.track(2)
        assert dog.arm(2, time.monotonic() + 0.05, "lease of 2")
        assert dog.claim(2)  # ended before its stop time: never reported
        assert dog.arm(1, time.monotonic() + 0.05, "lease of 1")
        assert done.wait(BOUND_S)
        assert fired == [(1, "lease of 1")]
        assert not dog.claim(1) and not dog.arm(1, time.monotonic() + 60, "again")  # taken by the watchdog
        assert not dog.arm(3, time.monotonic(), "never tracked")
    finally:
        dog.stop()
    assert fired == [(1, "lease of 1")]
