"""The lease gate's retry of a request that timed out before its unit ran, within the role's budget."""
from __future__ import annotations

import queue
import time

import pytest

from admission.store import Request, open_store
from fleet.runtime.config import ConfigError, StoreConfig, StoreRole, load_config
from fleet.runtime.lease_gate import LeaseGate

from ..store_backends import FakeClock, backend, pg_dsn, store_url, stores  # noqa: F401
from .test_store_fleet import BOUND_S, next_event, quiet, wait_for

QUEUE_TIMEOUT = 5.0


def _gate(url, clock, retries):
    roles = {"w": StoreRole(environment="prod", tier="host", queue_timeout=QUEUE_TIMEOUT, retries=retries)}
    # lease_ttl far above what the clock is stepped by: the gate's heartbeat never lapses
    cfg = StoreConfig(url=url, orchestrator="orch-a", lease_ttl=300.0, poll_every=0.02, roles=tuple(roles.items()))
    seen: queue.Queue = queue.Queue()
    gate = LeaseGate(cfg, "fleet", on_admitted=lambda u: seen.put(("admitted", u, "")),
                     on_lost=lambda u, reason, d: seen.put(("lost", u, f"{reason}: {d}")), clock=clock)
    return gate.start(), seen


def _blocker(url, clock=time.time):
    """orch-b holds the host tier (a quota of one) with a long lease: orch-a's requests queue."""
    other = open_store(url, actor="orch-b", clock=clock)
    rec = other.submit(Request("blocker", "orch-b", "prod", "x", "host", lease_ttl=86_400.0))
    assert rec.state == "admitted"
    return other, rec


def _orch_a(store):
    """orch-a's requests in the store, by id, in the order they were first queued."""
    ids = []
    for e in store.events():
        if e.request_id.startswith("orch-a/") and e.request_id not in ids:
            ids.append(e.request_id)
    return {i: store.get(i) for i in ids}


def _queued(store, n):
    """Wait until orch-a has `n` requests and the newest is queued; return them."""
    return wait_for(lambda: (lambda r: len(r) == n and list(r.values())[-1].state == "queued" and r)(_orch_a(store)))


def test_a_request_timed_out_once_is_asked_again_and_granted(store_url):
    clock = FakeClock()
    other, blocker = _blocker(store_url, clock)
    gate, seen = _gate(store_url, clock, retries=2)
    try:
        gate.hold(1, "w")
        (first,) = _queued(other, 1)
        clock.advance(QUEUE_TIMEOUT + 1)  # its queue timeout passes: the gate's next poll times it out
        recs = _queued(other, 2)
        assert list(recs) == [first, f"{first}~1"]  # the store's retry id (rules.retry_of)
        assert recs[first].state == "timed-out"
        assert quiet(seen, 0.3)  # the unit is still waiting: no outcome yet
        other.release("blocker", blocker.revision)
        assert next_event(seen) == ("admitted", 1, "")
        assert other.get(f"{first}~1").state == "admitted"
        gate.done(1)
        wait_for(lambda: other.get(f"{first}~1").state == "released")
        assert len(_orch_a(other)) == 2  # one retry, no more
    finally:
        gate.stop()
        other.close()


def test_a_spent_retry_budget_fails_the_unit_by_name(store_url):
    clock = FakeClock()
    other, _ = _blocker(store_url, clock)
    gate, seen = _gate(store_url, clock, retries=2)
    try:
        gate.hold(1, "w")
        for n in (1, 2, 3):
            _queued(other, n)
            assert quiet(seen, 0.1) if n < 3 else True
            clock.advance(QUEUE_TIMEOUT + 1)
        kind, unit, detail = next_event(seen)
        assert (kind, unit) == ("lost", 1)
        assert detail.startswith("LeaseExpired:") and "retry budget of 2 spent" in detail and "~2" in detail
        recs = _orch_a(other)
        first = next(iter(recs))
        assert list(recs) == [first, f"{first}~1", f"{first}~2"]
        assert [r.state for r in recs.values()] == ["timed-out"] * 3
        assert quiet(seen, 0.3)  # one outcome only
    finally:
        gate.stop()
        other.close()


def test_a_budget_of_zero_fails_at_the_first_timeout(store_url):
    clock = FakeClock()
    other, _ = _blocker(store_url, clock)
    gate, seen = _gate(store_url, clock, retries=0)
    try:
        gate.hold(1, "w")
        (first,) = _queued(other, 1)
        clock.advance(QUEUE_TIMEOUT + 1)
        kind, unit, detail = next_event(seen)
        assert (kind, unit) == ("lost", 1) and detail.startswith("LeaseExpired:") and "timed-out" in detail
        assert "retry budget" not in detail
        assert quiet(seen, 0.3)
        assert list(_orch_a(other)) == [first]  # never asked again
    finally:
        gate.stop()
        other.close()


def _config(retries):
    return {"roles": {"w": {"kind": "pooled", "handler": "fleet.api.examples:square", "slots": 1}},
            "store": {"url": "sqlite:///tmp/never-opened.db",
                      "roles": {"w": {"environment": "prod", **({} if retries is None else {"retries": retries})}}}}


def test_the_retry_budget_is_a_role_key_with_a_default():
    assert load_config(_config(None), env={}).store.role("w").retries == 2
    assert load_config(_config(0), env={}).store.role("w").retries == 0


@pytest.mark.parametrize("bad", [-1, 101, 1.5, True, "2"])
def test_a_bad_retry_budget_is_named(bad):
    with pytest.raises(ConfigError) as err:
        load_config(_config(bad), env={})
    assert "store.roles.w.retries" in str(err.value)


def test_a_fleet_unit_whose_request_timed_out_is_solved_under_its_retry(store_url, fleet_name):
    """End to end: the unit gets one outcome (solved) and the ledger balances; the store
    keeps the lineage. Real clocks here: a short queue timeout and the widest budget, so
    that the retry is certain to be still waiting when the blocker lets go."""
    import fleet

    config = {
        "fleet": {"name": fleet_name},
        "roles": {"w": {"kind": "pooled", "handler": "fleet.api.examples:slow_square", "slots": 1}},
        "store": {"url": store_url, "orchestrator": "orch-a", "lease_ttl": 30.0, "poll_every": 0.05,
                  "roles": {"w": {"environment": "prod", "tier": "host", "queue_timeout": 1.0, "retries": 100}}},
    }
    other, blocker = _blocker(store_url)
    try:
        with fleet.Fleet.from_config(config, env={}) as f:
            fut = f.submit("w", 10)
            recs = wait_for(lambda: (lambda r: len(r) >= 2 and r)(_orch_a(other)))
            first = next(iter(recs))
            assert recs[first].state == "timed-out" and f"{first}~1" in recs
            assert not fut.done()
            other.release("blocker", blocker.revision)
            assert fut.result(timeout=BOUND_S) == 100
            counts = f.ledger()
        assert (counts["submitted"], counts["solved"], counts["failed"]) == (1, 1, 0)
        recs = _orch_a(other)
        *timed_out, last = recs.values()
        assert [r.state for r in timed_out] == ["timed-out"] * len(timed_out)
        assert last.state == "released" and last.id == f"{first}~{len(timed_out)}"
    finally:
        other.close()
