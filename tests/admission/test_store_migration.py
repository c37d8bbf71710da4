"""Stores that older code made, opened by this code: migrated to the current schema with everything they held.

The schema-2 and schema-3 tables are written out here as that code left them (not taken
from the migrations under test), on both backends; the store then holds a lease, a queued
request, audit rows, a policy and a provider closure, as a running host group would.
"""
from __future__ import annotations

import sqlite3

import pytest

from admission.store import ADMITTED, CANCELLED, QUEUED, LeaseLost, Policy, Request, open_store
from admission.store._sql import SCHEMA_VERSION

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


def _schema_3(serial: str) -> list[str]:
    """Schema 2 and the heartbeats schema-3 code added."""
    return _schema_2(serial) + [
        """CREATE TABLE orchestrators (id TEXT PRIMARY KEY, beat_at DOUBLE PRECISION NOT NULL,
            lapses_at DOUBLE PRECISION NOT NULL, started_at DOUBLE PRECISION NOT NULL)""",
        "UPDATE schema_version SET version = 3",
    ]


def _make_store(url: str, schema, extra=()) -> None:
    statements = lambda serial: schema(serial) + _ROWS + list(extra)  # noqa: E731
    if url.startswith("sqlite://"):
        with sqlite3.connect(url[len("sqlite://"):]) as c:
            for statement in statements("INTEGER PRIMARY KEY AUTOINCREMENT"):
                c.execute(statement)
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as c:
            for statement in statements("BIGSERIAL PRIMARY KEY"):
                c.execute(statement)


def _make_schema_2_store(url: str) -> None:
    _make_store(url, _schema_2)


@pytest.fixture
def clock():
    return FakeClock(NOW)


def test_a_schema_2_store_is_migrated_and_keeps_its_leases(store_url, clock):
    _make_schema_2_store(store_url)
    with open_store(store_url, actor="orch-a", clock=clock) as a, \
            open_store(store_url, actor="orch-b", clock=clock) as b:
        assert a.check().schema_version == SCHEMA_VERSION == 4
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
        # the rows keep their tier, and name their runtime by it
        assert (a.get("lease").request.tier, a.get("lease").request.runtime) == ("container", "container")
        # schema 3's heartbeats work on it: orch-b beats, and is judged by its beat from then on
        # (orch-a, the caller, beat with its calls; both had a heartbeat from the migration on)
        b.heartbeat(5.0)
        assert [(o.id, o.lapses_at) for o in a.orchestrators()] == [("orch-a", NOW + 30.0), ("orch-b", NOW + 5.0)]
        clock.advance(6.0)
        assert a.get("waiting").state == "cancelled"
        # the freed quota admits a new limited request (on PostgreSQL through the database function)
        a.release("lease", 4)
        assert a.submit(Request("new", "orch-a", "prod", "openai", "container")).state == ADMITTED


def test_a_schema_3_orchestrator_that_never_beat_holds_its_queue_one_window_at_most(store_url, clock):
    # Under schema 3 an orchestrator that never heartbeat was never judged: its queued
    # requests would each be admitted to nobody for a whole lease. The migration gives it a
    # heartbeat from then on, so if it never calls again its queue is cancelled one window later.
    _make_store(store_url, _schema_3)
    with open_store(store_url, actor="orch-a", clock=clock, heartbeat_window=10.0) as a:
        assert a.check().schema_version == SCHEMA_VERSION
        assert {o.id: o.lapses_at for o in a.orchestrators()} == {"orch-a": NOW + 10.0, "orch-b": NOW + 10.0}
        clock.advance(9.0)
        a.release("lease", 3)  # the capacity frees while orch-b still counts as alive: it is admitted ...
        rec = a.get("waiting")
        assert rec.state == ADMITTED and rec.lease_expires == NOW + 10.0  # ... only until orch-b's lapse
        clock.advance(1.0)
        assert a.get("waiting").state == "timed-out"


def test_a_schema_3_orchestrator_with_only_a_queue_has_it_cancelled_at_its_lapse(store_url, clock):
    _make_store(store_url, _schema_3)
    with open_store(store_url, actor="orch-a", clock=clock, heartbeat_window=10.0) as a:
        clock.advance(9.0)
        assert a.get("waiting").state == QUEUED  # control: inside the window it keeps its place
        clock.advance(1.0)
        assert a.get("waiting").state == CANCELLED


def test_a_store_of_schema_1_is_migrated_with_its_closures(store_url, clock):
    from admission.store._sql import MIGRATIONS

    with open_store(store_url, actor="orch-a", clock=clock):
        pass  # the schema exists; rebuild it as version 1 had it
    sqlite = store_url.startswith("sqlite://")
    drop = [f"DROP TABLE {t}{'' if sqlite else ' CASCADE'}"  # CASCADE: the database function returns its rows
            for t in ("orchestrators", "closures", "events", "policy", "requests")]
    types = {"serial": "INTEGER PRIMARY KEY AUTOINCREMENT" if sqlite else "BIGSERIAL PRIMARY KEY",
             "float": "DOUBLE PRECISION"}
    _exec(store_url, drop + [statement.format(**types) for statement in MIGRATIONS[1]] + [
        "INSERT INTO closures VALUES ('openai', 2000000.0, 'daily limit', 1, 1000.0, 'orch-x')",
        "UPDATE schema_version SET version = 1"])
    with open_store(store_url, actor="orch-a", clock=clock) as s:
        assert s.check().schema_version == SCHEMA_VERSION == 4
        assert [(c.provider, c.credential, c.until, c.cause, c.daily, c.written_by) for c in s.closures()] == [
            ("openai", None, 2000000.0, "daily limit", True, "orch-x")]


def _exec(url: str, statements) -> None:
    if url.startswith("sqlite://"):
        with sqlite3.connect(url[len("sqlite://"):]) as c:
            for statement in statements:
                c.execute(statement)
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as c:
            for statement in statements:
                c.execute(statement)
