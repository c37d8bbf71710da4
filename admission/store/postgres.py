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

from admission.store import rules
from admission.store._sql import (
    _ANY_QUEUED_SQL,
    _BEAT_SQL,
    _BEATS_SQL,
    _ORCH_COLS,
    _RELEASE_SQL,
    _REQ_COLS,
    _VERSION_POLICY_SQL,
    SCHEMA_VERSION,
    SqlStore,
    _admitted_row,
    _queued_reason,
    _record,
)
from admission.store.base import DEFAULT_HEARTBEAT_WINDOW, SchemaMissing, StoreTimeout, StoreUnreachable
from admission.vocab import ADMITTED, HOLDING_STATES, LIVE_STATES, QUEUED, RELEASED, sql_list

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
# The heartbeat a lock-free write carries, as a CTE over the rows it wrote (`{rows}`): written
# only when the write happened and the handle's beat is due (the last parameter).
_BEAT_CTE = ("b AS ({insert} SELECT %s, %s, %s, %s FROM {rows} WHERE %s {upsert})".format(
    insert=f"INSERT INTO orchestrators ({_ORCH_COLS})", rows="{rows}",
    upsert=_BEAT_SQL[_BEAT_SQL.index("ON CONFLICT"):]))
_ROW_PARAMS = ", ".join(["%s"] * len(_REQ_COLS.split(",")))
_SUBMIT_UNCONSTRAINED = (
    f"WITH ok AS ({_VERSION_POLICY_SQL} AND v.version = %s AND p.body IS NOT DISTINCT FROM %s), "
    f"i AS (INSERT INTO requests ({_REQ_COLS}) SELECT {_ROW_PARAMS} "
    f"FROM ok ON CONFLICT (id) DO NOTHING RETURNING {_REQ_COLS}), "
    "e AS (INSERT INTO events (at, kind, request_id, actor, reason) "
    "SELECT %s, ev.kind, i.id, %s, CASE ev.n WHEN 1 THEN %s ELSE 'capacity' END FROM i, "
    f"(VALUES (1, '{QUEUED}'), (2, '{ADMITTED}')) AS ev (n, kind) ORDER BY ev.n), "
    f"{_BEAT_CTE.format(rows='i')} "
    f"SELECT {_REQ_COLS} FROM i")
# The rows that hold capacity (admitted, awaiting approval), which a locked transaction may time out.
_HOLDING_FOR_UPDATE = f"SELECT {_REQ_COLS} FROM requests WHERE state IN ({sql_list(HOLDING_STATES)}) FOR UPDATE"
_QUEUED_AND_ONE = (f"SELECT {_REQ_COLS} FROM requests WHERE state = '{QUEUED}' UNION ALL "
                   f"SELECT {_REQ_COLS} FROM requests WHERE id = %s AND state NOT IN ({sql_list(LIVE_STATES)})")
_RELEASE_FAST = (f"WITH u AS ({_RELEASE_SQL.replace('?', '%s')}), "
                 "e AS (INSERT INTO events (at, kind, request_id, actor, reason) "
                 f"SELECT %s, '{RELEASED}', id, %s, %s FROM u), "
                 f"{_BEAT_CTE.format(rows='u')} "
                 f"SELECT {_REQ_COLS} FROM u")


def _beat_params(beat: tuple | None) -> tuple:
    """The parameters of `_BEAT_CTE`: the beat's row and whether to write it."""
    return (*beat, True) if beat is not None else (None, None, None, None, False)


# `SqlStore._submit_at_once` on PostgreSQL: one call that takes the group lock, admits the
# request if nothing else could happen in its place, and returns its row (no row: take the
# locked path). The group lock is held only while the server runs it, never across a round
# trip to the client, which is what lets limited submits of several orchestrators follow each
# other closely. It answers one question of `rules.plan`, in the one case where the answer
# is "admit it, change nothing else": the stored version and policy are those the caller
# judged under, no request is queued (so none is ahead of it, nor held places, nor is due a
# timeout, a denial or a cancellation), no admitted lease is past its expiry (so none is due
# a timeout), and each quota the caller names as limited (`p_limits`, as `rules.limit_of`
# gives them for `rules.quota_slots`: global, environment, provider, tier) has room for one
# more. The lease is the caller's (its orchestrator is the caller, never judged by its own
# heartbeat), so it lasts its ttl. Where the function's name changes, so does its body.
ADMIT_AT_ONCE = "fleet_admit_at_once_v2"
_HOLDING = sql_list(HOLDING_STATES)
_ADMIT_AT_ONCE_DDL = f"""CREATE OR REPLACE FUNCTION {ADMIT_AT_ONCE}(
    p_version integer, p_policy text, p_limits bigint[], p_actor text, p_queued_reason text,
    p_id text, p_orchestrator text, p_environment text, p_provider text, p_tier text, p_priority bigint,
    p_queue_timeout double precision, p_preemptible integer, p_lease_ttl double precision, p_now double precision,
    p_runtime text, p_beat_lapses double precision)
RETURNS SETOF requests LANGUAGE plpgsql AS $fn$
DECLARE
    n_queued bigint; n_expired bigint; n_global bigint; n_env bigint; n_provider bigint; n_tier bigint;
    admitted requests%ROWTYPE;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('fleet.admission.store:' || current_schema()));
    PERFORM 1 FROM schema_version v LEFT JOIN policy p ON p.id = 1
        WHERE v.id = 1 AND v.version = p_version AND p.body IS NOT DISTINCT FROM p_policy;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT count(*) FILTER (WHERE state = '{QUEUED}'),
           count(*) FILTER (WHERE state IN ({_HOLDING}) AND coalesce(lease_expires <= p_now, true)),
           count(*) FILTER (WHERE state IN ({_HOLDING})),
           count(*) FILTER (WHERE state IN ({_HOLDING}) AND environment = p_environment),
           count(*) FILTER (WHERE state IN ({_HOLDING}) AND provider = p_provider),
           count(*) FILTER (WHERE state IN ({_HOLDING}) AND tier = p_tier)
      INTO n_queued, n_expired, n_global, n_env, n_provider, n_tier
      FROM requests WHERE state IN ({sql_list(LIVE_STATES)});
    IF n_queued > 0 OR n_expired > 0
       OR (p_limits[1] IS NOT NULL AND n_global + 1 > p_limits[1])
       OR (p_limits[2] IS NOT NULL AND n_env + 1 > p_limits[2])
       OR (p_limits[3] IS NOT NULL AND n_provider + 1 > p_limits[3])
       OR (p_limits[4] IS NOT NULL AND n_tier + 1 > p_limits[4]) THEN
        RETURN;
    END IF;
    INSERT INTO requests ({_REQ_COLS})
        VALUES (p_id, p_orchestrator, p_environment, p_provider, p_tier, p_priority, p_queue_timeout,
                p_preemptible, p_lease_ttl, p_now, '{ADMITTED}', 1, p_now + p_lease_ttl, p_now, 'capacity',
                p_runtime, 0)
        ON CONFLICT (id) DO NOTHING RETURNING * INTO admitted;
    IF NOT FOUND THEN
        RETURN;  -- a replay, or an id in use: the locked path tells which
    END IF;
    INSERT INTO events (at, kind, request_id, actor, reason)
        VALUES (p_now, '{QUEUED}', p_id, p_actor, p_queued_reason), (p_now, '{ADMITTED}', p_id, p_actor, 'capacity');
    IF p_beat_lapses IS NOT NULL THEN  -- the caller's heartbeat, when its handle has one due
        INSERT INTO orchestrators ({_ORCH_COLS}) VALUES (p_actor, p_now, p_beat_lapses, p_now)
            {_BEAT_SQL[_BEAT_SQL.index("ON CONFLICT"):]};
    END IF;
    RETURN NEXT admitted;
END
$fn$"""
_ADMIT_AT_ONCE_CALL = f"SELECT {_REQ_COLS} FROM {ADMIT_AT_ONCE}(%s, %s, %s::bigint[], %s, %s, " \
                      "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"


class PostgresStore(SqlStore):
    """The admission store in PostgreSQL. See `admission.store.base.AdmissionStore`."""

    ddl_types = {"serial": "BIGSERIAL PRIMARY KEY", "float": "DOUBLE PRECISION"}
    db_time_sql = "SELECT extract(epoch FROM clock_timestamp())::float8"
    paramstyle = "%s"

    def __init__(self, url: str, actor: str = "fleet", clock: Callable[[], float] = time.time,
                 connect_timeout: int = 10, create: bool = True, call_timeout: float = 30.0,
                 heartbeat_window: float = DEFAULT_HEARTBEAT_WINDOW):
        try:
            import psycopg  # imported here so that SQLite users need not have it
        except ImportError as exc:
            raise StoreUnreachable(f"{url}: the PostgreSQL driver is not installed "
                                   f"(pip install 'fleet[postgres]'): {exc}") from None

        import psycopg.sql  # noqa: F401 - quotes the schema name on creation

        self._psycopg = psycopg
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self._has_admit_at_once = False  # until _migrate finds or creates the function
        self._read_done = time.monotonic()  # when the locked transaction's reads were answered
        super().__init__(url, actor, clock, create, heartbeat_window)

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
        # every commit before the lock was granted), read. The rows holding capacity are read FOR
        # UPDATE: a lock-free release (see `_release_fast`) of one of them then waits for this
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
            run[1].execute(_HOLDING_FOR_UPDATE)
            run[2].execute(_QUEUED_AND_ONE, (request_id,))
            run[3].execute(_BEATS_SQL)
        # psycopg ends a pipeline with a Sync and then a Flush. The server arms its
        # idle_in_transaction_session_timeout as it answers the Sync and disarms it as it reads
        # the Flush, so after a pipeline the session would idle in its transaction, the group
        # lock held for the whole group, as long as this client stalls (stopped, swapped out,
        # kept off a busy host's CPU). An empty query, the last message the server reads, arms
        # it again: a client stalled past its deadline loses its session and the lock with it.
        # One round trip more under the lock, the price of that bound.
        cur.execute("")
        self._read_done = time.monotonic()
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
            beat = self._due_beat(now)
            cur = conn.cursor()
            cur.execute(f"BEGIN; {_POLICY_LOCK_SHARED}; {_SUBMIT_UNCONSTRAINED}; COMMIT",
                        (SCHEMA_VERSION, policy_body, *_admitted_row(request, now),
                         now, self.actor, _queued_reason(request), *_beat_params(beat)))
            for _ in range(2):
                cur.nextset()  # past BEGIN and the lock
            row = cur.fetchone()
            if row is None:
                return None
            self._beaten(beat)
            return _record(row)

    def _submit_at_once(self, request, policy_body, policy):
        # One round trip: the function decides and writes under the group lock, committed
        # without waiting for the WAL flush (the lock is freed at once), then made durable.
        if not self._has_admit_at_once:
            return None
        with self._guard() as conn:
            now = self.clock()
            beat = self._due_beat(now)
            cur = conn.cursor()
            limits = [rules.limit_of(policy, level, key) for level, key in rules.quota_slots(request)]
            cur.execute(f"{_BEGIN}; {_ADMIT_AT_ONCE_CALL}; {_COMMIT_DURABLY}",
                        (SCHEMA_VERSION, policy_body, limits, self.actor, _queued_reason(request),
                         *_admitted_row(request, now)[:10], request.runtime, None if beat is None else beat[2]))
            cur.nextset()  # past BEGIN
            cur.nextset()  # past SET
            row = cur.fetchone()
            if row is None:
                return None
            self._beaten(beat)
            return _record(row)

    def _install_functions(self, cur) -> None:
        cur.execute("SELECT 1 FROM pg_proc WHERE proname = %s AND pronamespace = current_schema()::regnamespace",
                    (ADMIT_AT_ONCE,))
        if cur.fetchone() is None:
            try:
                cur.execute("SAVEPOINT fleet_functions")
                cur.execute(_ADMIT_AT_ONCE_DDL)
                cur.execute("RELEASE SAVEPOINT fleet_functions")
            except self._psycopg.errors.InsufficientPrivilege:
                # a user who may use the store but not create in its schema: the locked path decides
                cur.execute("ROLLBACK TO SAVEPOINT fleet_functions")
                self._has_admit_at_once = False
                return
        self._has_admit_at_once = True

    def _release_fast(self, request_id: str, revision: int, reason: str):
        # One round trip: the guarded update and its audit row in one statement, committed
        # without waiting for the WAL flush (so that a locked transaction waiting on this row
        # does not wait through an fsync), then made durable like every store transaction.
        # Whether anything is queued is asked in a statement of its own, after the update: it
        # then sees every request queued by a transaction the update had to wait for.
        with self._guard() as conn:
            now = self.clock()
            beat = self._due_beat(now)
            cur = conn.cursor()
            cur.execute(f"{_BEGIN}; {_RELEASE_FAST}; {_ANY_QUEUED_SQL}; {_COMMIT_DURABLY}",
                        (RELEASED, now, reason, request_id, self.actor, revision, now, now, self.actor, reason,
                         *_beat_params(beat)))
            cur.nextset()  # past BEGIN
            cur.nextset()  # past SET
            row = cur.fetchone()
            cur.nextset()
            any_queued = bool(cur.fetchone()[0])
            if row is None:
                return None
            self._beaten(beat)
            return _record(row), any_queued

    def _write_and_commit(self, conn, cur, writes) -> None:
        # One round trip, pipelined like the reads: every write, the commit, and the wait for
        # durability (the statement after COMMIT is a transaction of its own, ended at the sync).
        kept = time.monotonic() - self._read_done
        try:
            with conn.pipeline():
                run = self._psycopg.Cursor(conn)
                for sql, rows in writes:
                    run.executemany(sql, rows)
                run.execute("COMMIT")
                run.execute(_DURABLE)
        except self._psycopg.OperationalError as exc:
            if kept <= self.call_timeout:
                raise
            # The server ended the session this client left idle in its transaction past the
            # deadline (see `_lock_and_read`); libpq tells it as a lost connection.
            self._drop_connection()
            raise StoreTimeout(f"{self.redacted_url()}: the call passed its deadline: this client was kept "
                               f"{kept:.3f} s inside its transaction (call_timeout {self.call_timeout:g} s) and "
                               f"the server ended its session; nothing was decided") from exc

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
        # IdleInTransactionSessionTimeout: the server ended this session, left idle in its
        # transaction past the deadline (see `_lock_and_read`); the connection is gone with it
        return isinstance(exc, (errors.LockNotAvailable, errors.QueryCanceled, errors.IdleInTransactionSessionTimeout))

    def _unreachable(self, exc: BaseException) -> bool:
        return isinstance(exc, (self._psycopg.OperationalError, self._psycopg.InterfaceError))

    def _has_schema(self, cur) -> bool:
        cur.execute("SELECT to_regclass('schema_version') IS NOT NULL")
        return bool(cur.fetchone()[0])
