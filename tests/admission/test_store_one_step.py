"""The store's one-step paths against the rule they shortcut.

- On PostgreSQL a limited submit is decided by a database function under the group
  lock (`PostgresStore._submit_at_once`). It restates one case of `rules.plan` in SQL,
  so generated stores check it against `plan`: where it admits, `plan` admits that
  request and changes nothing else; where it declines, it wrote nothing, and the case
  is one it leaves to the locked path (something queued, a lease past its expiry, or
  `plan` would not simply admit it).
- A lock-free release hands its capacity to the queue in the same call (both backends).
"""
from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import math

from admission.store import ADMITTED, AWAITING_APPROVAL, QUEUED, RELEASED, Policy, Record, Request, open_store, rules

from ..store_backends import FakeClock, GroupLockHeld, backend, pg_dsn, pg_stores, store_url, stores  # noqa: F401

ME, OTHER = "orch-me", "orch-other"
ENVS, PROVS, TIERS = ("prod", "dev"), ("p1", "p2"), ("host", "container")
NOW = 1_000_000.0

policies = st.builds(
    lambda g, env, prov, tiers: Policy.build(global_limit=g, environments=env, providers=prov, tiers=tiers,
                                             aging_interval=30.0),
    st.one_of(st.none(), st.integers(0, 4)),
    st.dictionaries(st.sampled_from(ENVS), st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(PROVS), st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(TIERS), st.integers(0, 3), max_size=2),
)

live_rows = st.lists(st.fixed_dictionaries({
    "orchestrator": st.sampled_from([ME, OTHER]),
    "environment": st.sampled_from(ENVS),
    "provider": st.sampled_from(PROVS),
    "tier": st.sampled_from(TIERS),
    "priority": st.integers(0, 3),
    # queued, or holding capacity (admitted, awaiting approval) with a lease that ends before, at or after now
    "state": st.sampled_from([QUEUED, ADMITTED, ADMITTED, ADMITTED, AWAITING_APPROVAL]),
    "lease_left": st.sampled_from([-5.0, 0.0, 5.0, 60.0, 60.0]),
    "waited": st.sampled_from([0.0, 10.0, 100.0]),
    "queue_timeout": st.sampled_from([None, None, 5.0]),
}), max_size=6)

new_requests = st.builds(
    lambda env, prov, tier, prio, ttl: Request(f"new-{uuid.uuid4().hex[:8]}", ME, env, prov, tier, prio,
                                               lease_ttl=ttl),
    st.sampled_from(ENVS), st.sampled_from(PROVS), st.sampled_from(TIERS + ("Docker",)), st.integers(0, 3),
    st.sampled_from([1.0, 30.0]))


def _record_of(i: int, row: dict) -> Record:
    req = Request(f"live-{i}", row["orchestrator"], row["environment"], row["provider"], row["tier"],
                  row["priority"], row["queue_timeout"], lease_ttl=30.0, approval=row["state"] == AWAITING_APPROVAL,
                  runtime=row["tier"])
    submitted = NOW - row["waited"]
    if row["state"] == QUEUED:
        return Record(req, submitted_at=submitted, state=QUEUED, decided_at=submitted, reason="submitted")
    return Record(req, submitted_at=submitted, state=row["state"], revision=1,
                  lease_expires=NOW + row["lease_left"], decided_at=submitted, reason="capacity")


@pytest.fixture
def pg(pg_stores):
    """A PostgreSQL store of ME at NOW, and a connection to its schema to set its rows by hand."""
    import psycopg

    url = pg_stores.new_url()
    with open_store(url, actor=ME, clock=FakeClock(NOW)) as store, psycopg.connect(url, autocommit=True) as conn:
        yield store, conn


def _load(conn, policy: Policy, records: list[Record]) -> str:
    """Make the store hold exactly `records` under `policy`; returns the stored policy body."""
    body = json.dumps(policy.to_dict(), sort_keys=True)
    conn.execute("DELETE FROM requests")
    conn.execute("DELETE FROM events")
    conn.execute("INSERT INTO policy (id, body, updated_at, updated_by) VALUES (1, %s, 0, 'test') "
                 "ON CONFLICT (id) DO UPDATE SET body = excluded.body", (body,))
    for r in records:
        q = r.request
        conn.execute("INSERT INTO requests (id, orchestrator, environment, provider, tier, priority, queue_timeout, "
                     "preemptible, lease_ttl, submitted_at, state, revision, lease_expires, decided_at, reason, "
                     "runtime, approval) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                     (q.id, q.orchestrator, q.environment, q.provider, q.tier, q.priority, q.queue_timeout,
                      int(q.preemptible), q.lease_ttl, r.submitted_at, r.state, r.revision, r.lease_expires,
                      r.decided_at, r.reason, q.runtime, int(q.approval)))
    return body


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(policy=policies, rows=live_rows, new=new_requests, other_lapses=st.sampled_from([NOW - 1, NOW + 100]),
       stale_policy=st.booleans())
def test_the_database_decision_is_the_rules(pg, policy, rows, new, other_lapses, stale_policy):
    store, conn = pg
    live = [_record_of(i, row) for i, row in enumerate(rows)]
    body = _load(conn, policy, live)
    conn.execute("DELETE FROM orchestrators")
    conn.execute("INSERT INTO orchestrators VALUES (%s, %s, %s, %s)", (OTHER, NOW - 10, other_lapses, NOW - 10))
    judged_under = body + " " if stale_policy else body
    new = rules.normalized(new)  # as `submit` hands it on
    store._beat_until = -math.inf  # this handle's beat is due (each example starts afresh)

    got = store._submit_at_once(new, judged_under, policy)

    fresh = Record(new, submitted_at=NOW, state=QUEUED, decided_at=NOW, reason="submitted")
    p = rules.plan(policy, live + [fresh], NOW, {OTHER: other_lapses})
    only_admits_it = ([r.id for r, _ in p.admissions] == [new.id] and not (
        p.lease_timeouts or p.queue_timeouts or p.denials or p.cancellations or p.preemptions))
    events = conn.execute("SELECT kind, request_id, actor FROM events ORDER BY seq").fetchall()
    if got is not None:
        assert not stale_policy, "admitted under a policy that is not the stored one"
        assert only_admits_it, f"the database admitted {new} where the rule decides {p}"
        assert (got.state, got.revision, got.lease_expires, got.submitted_at) == (ADMITTED, 1, NOW + new.lease_ttl, NOW)
        assert got.request == new
        assert events == [("queued", new.id, ME), ("admitted", new.id, ME)]
    else:
        assert events == [] and conn.execute("SELECT count(*) FROM requests").fetchone()[0] == len(live)
        waiting = any(r.state == QUEUED for r in live)
        overdue = any(r.state != QUEUED and r.lease_expires <= NOW for r in live)
        assert stale_policy or waiting or overdue or not only_admits_it, (
            f"declined {new} where the rule only admits it ({policy}, {live})")
    # the caller's heartbeat is written with its admission, and only then
    beats = dict(conn.execute("SELECT id, lapses_at FROM orchestrators").fetchall())
    assert beats == ({OTHER: other_lapses, ME: NOW + store.heartbeat_window} if got is not None
                     else {OTHER: other_lapses})


def test_a_replayed_id_is_left_to_the_locked_path(pg):
    store, conn = pg
    policy = Policy.build(environments={"prod": 5})
    body = _load(conn, policy, [])
    new = Request("again", ME, "prod", "p1", "container")
    assert store._submit_at_once(new, body, policy).state == ADMITTED
    assert store._submit_at_once(new, body, policy) is None
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 2


# ----------------------------------------------------------------------------- a release hands on


def test_a_release_admits_the_next_queued_request_in_the_same_call(stores):
    url = stores.new_url()
    clock = FakeClock()
    with open_store(url, actor="orch-a", clock=clock) as a, open_store(url, actor="orch-b", clock=clock) as b:
        a.set_policy(Policy.build(environments={"prod": 1}))
        held = a.submit(Request("held", "orch-a", "prod", "p1", "container"))
        waiting = b.submit(Request("waiting", "orch-b", "prod", "p1", "container"))
        assert (held.state, waiting.state) == (ADMITTED, QUEUED)
        assert a.release("held", held.revision).state == RELEASED
        # read as stored, without a reconcile: the release itself handed the capacity on
        records, _, _ = a.snapshot()
        assert [(r.id, r.state) for r in records] == [("waiting", ADMITTED)]
        assert [(e.kind, e.request_id, e.actor) for e in a.events(since=0)][-2:] == [
            ("released", "held", "orch-a"), ("admitted", "waiting", "orch-a")]


def test_a_release_without_a_queue_reconciles_nothing(stores):
    url = stores.new_url()
    clock = FakeClock()
    with open_store(url, actor="orch-a", clock=clock) as a:
        a.set_policy(Policy.build(environments={"prod": 1}))
        held = a.submit(Request("held", "orch-a", "prod", "p1", "container", lease_ttl=5))
        other = a.submit(Request("other", "orch-a", "dev", "p1", "container", lease_ttl=1))
        clock.advance(2)  # `other` is past its expiry; only a reconcile would time it out
        assert a.release("held", held.revision).state == RELEASED
        records, _, _ = a.snapshot()
        assert [(r.id, r.state) for r in records] == [("other", ADMITTED)]
        assert other.state == ADMITTED


def test_a_release_that_cannot_hand_on_in_time_still_reports_the_release(pg_stores):
    # PostgreSQL: the lock-free release goes through a held group lock; its hand-on does not,
    # and is left to the next reconciling call
    url = pg_stores.new_url()
    with open_store(url, actor="orch-a", call_timeout=0.3) as a:
        a.set_policy(Policy.build(environments={"prod": 1}))
        held = a.submit(Request("held", "orch-a", "prod", "p1", "container"))
        a.submit(Request("waiting", "orch-a", "prod", "p1", "container"))
        with GroupLockHeld(url):
            assert a.release("held", held.revision).state == RELEASED
            records, _, _ = a.snapshot()
            assert [(r.id, r.state) for r in records] == [("waiting", QUEUED)]
        assert a.get("waiting").state == ADMITTED
