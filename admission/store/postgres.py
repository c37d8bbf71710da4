"""The host-group store on PostgreSQL (psycopg 3), for orchestrators on several machines.

``postgresql://user:password@host:5432/dbname`` (any libpq URI; add
``?options=-csearch_path%3Dmyschema`` to keep the store in its own schema). Each
locked transaction starts with a transaction-scoped advisory lock keyed on the
schema (``pg_advisory_xact_lock``), which serializes every such transaction of the
host group, whatever host it comes from, and schema creation too; under READ
COMMITTED each later statement then sees everything committed before the lock was
granted. A second advisory key guards the policy: a policy change takes it
exclusively, an unconstrained submit shares it. Every call is one or two round
trips: statements are sent together and values bound on the client.
"""
from __future__ import annotations

import time
from typing import Callable

from admission.store._sql import (
    _BEATS_SQL,
    _RELEASE_SQL,
    _REQ_COLS,
    _VERSION_POLICY_SQL,
    SCHEMA_VERSION,
    SqlStore,
    _admitted_row,
    _queued_reason,
    _record,
)
from admission.store.base import SchemaMissing, StoreUnreachable
from admission.vocab import ADMITTED, LIVE_STATES, QUEUED, RELEASED, sql_list

PREFIXES = ("postgresql://", "postgres://")

# A store transaction's commit does not wait for the WAL flush, so the store lock is
# released without holding every other orchestrator through an fsync.
_BEGIN_STATEMENTS = ("BEGIN", "SET LOCAL synchronous_commit = off")
_BEGIN = "; ".join(_BEGIN_STATEMENTS)
# Then a second, tiny transaction that writes one WAL record (a logical message, which any
# user may emit and nothing consumes) commits under the server's own synchronous_commit.
# Its flush covers all WAL before it, so our decision - and every decision it read - is
# durable before the caller may act on it; the flushes of several orchestrators group into
# one fsync. (A transaction that only takes an xid writes no WAL and would not wait.) The
# statement after COMMIT is a transaction of its own, committed at the end of the query
# string: one statement, not BEGIN, SELECT and COMMIT.
_DURABLE = "SELECT pg_logical_emit_message(true, 'fleet.admission.store', '')"
_COMMIT_DURABLY = f"COMMIT; {_DURABLE}"

_GROUP_LOCK = "SELECT pg_advisory_xact_lock(hashtext('fleet.admission.store:' || current_schema()))"
# Taken exclusively by a transaction that may change the policy, shared by an admission that
# relies on it (see `SqlStore._submit_unconstrained`).
_POLICY_LOCK = "SELECT pg_advisory_xact_lock(hashtext('fleet.admission.policy:' || current_schema()))"
_POLICY_LOCK_SHARED = "SELECT pg_advisory_xact_lock_shared(hashtext('fleet.admission.policy:' || current_schema()))"
_SUBMIT_UNCONSTRAINED = (
    f"WITH ok AS ({_VERSION_POLICY_SQL} AND v.version = %s AND p.body IS NOT DISTINCT FROM %s), "
    f"i AS (INSERT INTO requests ({_REQ_COLS}) SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s "
    f"FROM ok ON CONFLICT (id) DO NOTHING RETURNING {_REQ_COLS}), "
    "e AS (INSERT INTO events (at, kind, request_id, actor, reason) "
    "SELECT %s, ev.kind, i.id, %s, CASE ev.n WHEN 1 THEN %s ELSE 'capacity' END FROM i, "
    f"(VALUES (1, '{QUEUED}'), (2, '{ADMITTED}')) AS ev (n, kind) ORDER BY ev.n) "
    f"SELECT {_REQ_COLS} FROM i")
_ADMITTED_FOR_UPDATE = f"SELECT {_REQ_COLS} FROM requests WHERE state = '{ADMITTED}' FOR UPDATE"
_QUEUED_AND_ONE = (f"SELECT {_REQ_COLS} FROM requests WHERE state = '{QUEUED}' UNION ALL "
                   f"SELECT {_REQ_COLS} FROM requests WHERE id = %s AND state NOT IN ({sql_list(LIVE_STATES)})")
_RELEASE_FAST = (f"WITH u AS ({_RELEASE_SQL.replace('?', '%s')}), "
                 "e AS (INSERT INTO events (at, kind, request_id, actor, reason) "
                 f"SELECT %s, '{RELEASED}', id, %s, %s FROM u) "
                 f"SELECT {_REQ_COLS} FROM u")


class PostgresStore(SqlStore):
    """The admission store in PostgreSQL. See `admission.store.base.AdmissionStore`."""

    ddl_types = {"serial": "BIGSERIAL PRIMARY KEY", "float": "DOUBLE PRECISION"}
    db_time_sql = "SELECT extract(epoch FROM clock_timestamp())::float8"
    paramstyle = "%s"

    def __init__(self, url: str, actor: str = "fleet", clock: Callable[[], float] = time.time,
                 connect_timeout: int = 10, create: bool = True, call_timeout: float = 30.0):
        try:
            import psycopg  # imported here so that SQLite users need not have it
        except ImportError as exc:
            raise StoreUnreachable(f"{url}: the PostgreSQL driver is not installed "
                                   f"(pip install 'fleet[postgres]'): {exc}") from None

        import psycopg.sql  # noqa: F401 - quotes the schema name on creation

        self._psycopg = psycopg
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        super().__init__(url, actor, clock, create)

    def _connect(self):
        kwargs = {} if "connect_timeout" in self.url else {"connect_timeout": self.connect_timeout}
        # Transactions are begun and committed by the statements themselves, and values are
        # bound on the client, so that one round trip can carry several statements.
        conn = self._psycopg.connect(self.url, autocommit=True, cursor_factory=self._psycopg.ClientCursor,
                                     **kwargs)
        # Every call has a deadline: a lock held by another session (lock_timeout), a statement
        # that does not end (statement_timeout), and a transaction left open by a client that
        # stopped mid-way (idle_in_transaction_session_timeout, so its group lock is freed).
        ms = max(1, int(self.call_timeout * 1000))
        try:
            conn.execute(f"SET lock_timeout = {ms}; SET statement_timeout = {ms}; "
                         f"SET idle_in_transaction_session_timeout = {ms}")
        except Exception:
            conn.close()
            raise
        return conn

    def _begin(self, cur) -> None:
        cur.execute(_BEGIN)

    def _lock_and_read(self, cur, request_id: str, policy_write: bool = False):
        # One round trip, pipelined: begin, take the lock (the reads, later statements, then see
        # every commit before the lock was granted), read. The admitted rows are read FOR UPDATE:
        # a lock-free release (see `_release_fast`) of one of them then waits for this
        # transaction and re-checks its row, so what this transaction decided about an
        # admitted lease (timed out, preempted, renewed) cannot be overtaken by a release.
        # Pipelined statements are prepared once per connection and then only executed: the
        # store lock is held for as short a time as the reads take, not their planning too.
        conn = cur.connection
        with conn.pipeline():
            run = [self._psycopg.Cursor(conn) for _ in range(4)]
            for statement in _BEGIN_STATEMENTS:  # a pipeline takes one statement per query
                cur.execute(statement)
            for lock in ((_GROUP_LOCK, _POLICY_LOCK) if policy_write else (_GROUP_LOCK,)):
                cur.execute(lock)
            run[0].execute(_VERSION_POLICY_SQL)
            run[1].execute(_ADMITTED_FOR_UPDATE)
            run[2].execute(_QUEUED_AND_ONE, (request_id,))
            run[3].execute(_BEATS_SQL)
        row = run[0].fetchone()
        rows = run[1].fetchall() + run[2].fetchall()
        return row, rows, run[3].fetchall()

    def _submit_unconstrained(self, request, policy_body):
        # One round trip, holding the policy lock shared: it keeps the policy put (set_policy
        # takes it exclusively before it reads) but lets these admissions run side by side.
        # Committed synchronously: no transaction waits on a row it inserts, so there is no
        # lock to hand on before the flush.
        with self._guard() as conn:
            now = self.clock()
            cur = conn.cursor()
            cur.execute(f"BEGIN; {_POLICY_LOCK_SHARED}; {_SUBMIT_UNCONSTRAINED}; COMMIT",
                        (SCHEMA_VERSION, policy_body, *_admitted_row(request, now),
                         now, self.actor, _queued_reason(request)))
            for _ in range(2):
                cur.nextset()  # past BEGIN and the lock
            row = cur.fetchone()
            return None if row is None else _record(row)

    def _release_fast(self, request_id: str, revision: int, reason: str):
        # One round trip: the guarded update and its audit row in one statement, committed
        # without waiting for the WAL flush (so that a locked transaction waiting on this row
        # does not wait through an fsync), then made durable like every store transaction.
        with self._guard() as conn:
            now = self.clock()
            cur = conn.cursor()
            cur.execute(f"{_BEGIN}; {_RELEASE_FAST}; {_COMMIT_DURABLY}",
                        (RELEASED, now, reason, request_id, self.actor, revision, now, now, self.actor, reason))
            cur.nextset()  # past BEGIN
            cur.nextset()  # past SET
            row = cur.fetchone()
            return None if row is None else _record(row)

    def _write_and_commit(self, conn, cur, writes) -> None:
        # One round trip, pipelined like the reads: every write, the commit, and the wait for
        # durability (the statement after COMMIT is a transaction of its own, ended at the sync).
        with conn.pipeline():
            run = self._psycopg.Cursor(conn)
            for sql, rows in writes:
                run.executemany(sql, rows)
            run.execute("COMMIT")
            run.execute(_DURABLE)

    def _commit(self, conn, cur) -> None:
        cur.execute(_COMMIT_DURABLY)

    def _ensure_schema(self, cur) -> None:
        # A search_path naming a schema that does not exist leaves current_schema() NULL:
        # create the first schema it names (serialized by a lock of its own, since the group
        # lock is keyed on the schema), or say exactly what to run.
        cur.execute("SELECT current_schema()")
        if cur.fetchone()[0] is not None:
            return
        cur.execute("SELECT current_setting('search_path')")
        names = [n.strip() for n in cur.fetchone()[0].split(",") if n.strip() and n.strip() != '"$user"']
        if not names:
            raise StoreUnreachable(f"{self.redacted_url()}: the search_path names no schema to keep the store in")
        name = names[0][1:-1].replace('""', '"') if names[0].startswith('"') else names[0]
        ident = self._psycopg.sql.Identifier(name).as_string(cur)
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('fleet.admission.store.schema'))")
        try:
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {ident}")
        except self._psycopg.errors.InsufficientPrivilege as exc:
            cur.connection.rollback()
            cur.execute("SELECT current_user")
            user = self._psycopg.sql.Identifier(cur.fetchone()[0]).as_string(cur)
            raise SchemaMissing(self.redacted_url(), name, f"CREATE SCHEMA {ident} AUTHORIZATION {user}", exc) from None

    def _migration_lock(self, cur) -> None:
        cur.execute(_GROUP_LOCK)

    def _timed_out(self, exc: BaseException) -> bool:
        errors = self._psycopg.errors
        return isinstance(exc, (errors.LockNotAvailable, errors.QueryCanceled))

    def _unreachable(self, exc: BaseException) -> bool:
        return isinstance(exc, (self._psycopg.OperationalError, self._psycopg.InterfaceError))

    def _has_schema(self, cur) -> bool:
        cur.execute("SELECT to_regclass('schema_version') IS NOT NULL")
        return bool(cur.fetchone()[0])
