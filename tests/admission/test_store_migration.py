"""A store that schema-2 code made, opened by this code: migrated to schema 3 with everything it held.

The schema-2 tables are written out here as that code left them (not taken from the
migrations under test), on both backends; the store then holds a lease, a queued
request, audit rows, a policy and a provider closure, as a running host group would.
"""
from __future__ import annotations

import sqlite3

import pytest

from admission.store import ADMITTED, QUEUED, LeaseLost, Policy, Request, open_store

from ..store_backends import FakeClock, backend, pg_dsn, store_url, stores  # noqa: F401

NOW = 1_000_000.0


def _schema_2(serial: str) -> list[str]:
    """The tables of a store at schema version 2, as its code created them."""
    return [
        "CREATE TABLE schema_version (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL)",
        """CREATE TABLE requests (
            id TEXT PRIMARY KEY, orchestrator TEXT NOT NULL, environment TEXT NOT NULL, provider TEXT NOT NULL,
            tier TEXT NOT NULL, priority BIGINT NOT NULL, queue_timeout DOUBLE PRECISION,
            preemptible INTEGER NOT NULL, lease_ttl DOUBLE PRECISION NOT NULL,
            submitted_at DOUBLE PRECISION NOT NULL, state TEXT NOT NULL, revision BIGINT NOT NULL,
            lease_expires DOUBLE PRECISION, decided_at DOUBLE PRECISION, reason TEXT NOT NULL)""",
        "CREATE INDEX requests_live ON requests (state) WHERE state IN ('queued', 'admitted')",
        f"""CREATE TABLE events (seq {serial}, at DOUBLE PRECISION NOT NULL, kind TEXT NOT NULL,
            request_id TEXT NOT NULL, actor TEXT NOT NULL, reason TEXT NOT NULL)""",
        "CREATE INDEX events_request ON events (request_id)",
        """CREATE TABLE policy (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL, updated_by TEXT NOT NULL)""",
        """CREATE TABLE closures (
            provider TEXT NOT NULL, credential TEXT NOT NULL, until DOUBLE PRECISION NOT NULL, cause TEXT NOT NULL,
            daily INTEGER NOT NULL, since DOUBLE PRECISION NOT NULL, message TEXT NOT NULL,
            written_at DOUBLE PRECISION NOT NULL, written_by TEXT NOT NULL, PRIMARY KEY (provider, credential))""",
        "INSERT INTO schema_version (id, version) VALUES (1, 2)",
    ]


_POLICY = ('{"aging_interval": 3600.0, "environments": {"prod": 1}, "global_limit": null, "preemption": false, '
           '"providers": {}, "tiers": {}}')
_ROWS = [
    # a lease at revision 3 (granted, renewed twice) with 100 s left, and a request queued behind it
    "INSERT INTO requests VALUES ('lease', 'orch-a', 'prod', 'openai', 'container', 2, NULL, 0, 30.0, "
    f"{NOW - 50}, 'admitted', 3, {NOW + 100}, {NOW - 20}, 'revision 3')",
    "INSERT INTO requests VALUES ('waiting', 'orch-b', 'prod', 'openai', 'container', 1, NULL, 0, 30.0, "
    f"{NOW - 40}, 'queued', 0, NULL, {NOW - 40}, 'submitted')",
    f"INSERT INTO events (at, kind, request_id, actor, reason) VALUES ({NOW - 50}, 'queued', 'lease', 'orch-a', 'x')",
    f"INSERT INTO events (at, kind, request_id, actor, reason) VALUES ({NOW - 50}, 'admitted', 'lease', 'orch-a', 'y')",
    f"INSERT INTO policy VALUES (1, '{_POLICY}', {NOW - 60}, 'orch-a')",
    f"INSERT INTO closures VALUES ('anthropic', '', {NOW + 3600}, 'daily-limit', 1, {NOW - 10}, '403', "
    f"{NOW - 10}, 'orch-b')",
]


def _make_schema_2_store(url: str) -> None:
    if url.startswith("sqlite://"):
        with sqlite3.connect(url[len("sqlite://"):]) as c:
            for statement in _schema_2("INTEGER PRIMARY KEY AUTOINCREMENT") + _ROWS:
                c.execute(statement)
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as c:
            for statement in _schema_2("BIGSERIAL PRIMARY KEY") + _ROWS:
                c.execute(statement)


@pytest.fixture
def clock():
    return FakeClock(NOW)


def test_a_schema_2_store_is_migrated_and_keeps_its_leases(store_url, clock):
    _make_schema_2_store(store_url)
    with open_store(store_url, actor="orch-a", clock=clock) as a, \
            open_store(store_url, actor="orch-b", clock=clock) as b:
        assert a.check().schema_version == 3
        records, policy, _ = a.snapshot()  # as stored, before any transaction of this code
        assert [(r.id, r.state, r.revision, r.lease_expires) for r in records] == [
            ("lease", ADMITTED, 3, NOW + 100), ("waiting", QUEUED, 0, None)]
        assert policy == Policy.build(environments={"prod": 1}, aging_interval=3600)
        # the lease is current under the new code: renewed at its stored revision, it holds its quota
        assert a.renew("lease", 3).revision == 4
        assert a.get("waiting").state == QUEUED
        with pytest.raises(LeaseLost):
            a.renew("lease", 3)
        # the audit trail goes on from where it was
        assert [(e.seq, e.kind, e.request_id) for e in a.events()][:2] == [(1, "queued", "lease"),
                                                                            (2, "admitted", "lease")]
        assert [(e.kind, e.request_id) for e in a.events(since=2)] == [("renewed", "lease")]
        assert [(c.provider, c.credential, c.until, c.written_by) for c in a.closures()] == [
            ("anthropic", None, NOW + 3600, "orch-b")]
        # schema 3's heartbeats work on it: orch-b beats, and is judged by its beat from then on
        b.heartbeat(5.0)
        assert [(o.id, o.lapses_at) for o in a.orchestrators()] == [("orch-b", NOW + 5.0)]
        clock.advance(6.0)
        assert a.get("waiting").state == "cancelled"
        # the freed quota admits a new limited request (on PostgreSQL through the database function)
        a.release("lease", 4)
        assert a.submit(Request("new", "orch-a", "prod", "openai", "container")).state == ADMITTED
