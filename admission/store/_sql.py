"""The store written once over SQL; `sqlite` and `postgres` supply the connection and dialect.

A mutating call that decides anything runs in one transaction that first takes the
store lock (SQLite: ``BEGIN IMMEDIATE`` holds the database's write lock; PostgreSQL:
a transaction-scoped advisory lock of the store's schema), reads the schema version,
the policy and the live records, then reconciles: it asks `rules.plan` what must
change at the store clock's `now` and writes exactly that, with an audit row per
decision. The lock makes these transactions run one at a time across every process
and host that shares the store, so the quotas hold.

Two calls need no store lock, because they cannot make any quota overflow:

- a release of the owner's current, unexpired lease (it only frees capacity; when
  requests are queued, the same call then reconciles under the lock, so the freed
  capacity goes to the next of them at once), and
- a submit that no level of the policy limits (it competes with nothing, so it is
  admitted at once), written only while the stored policy is still the one it was
  judged under (a policy change excludes it).

Either falls back to the locked path when its precondition does not hold. A backend
may also decide a limited submit in the database (`SqlStore._submit_at_once`) in the
one case where `rules.plan` could only admit it and change nothing else: nothing is
queued, no lease is past its expiry, and each of its limited quotas has room.
"""
from __future__ import annotations

import abc
import json
import math
import threading
import time
from contextlib import contextmanager
from typing import Callable

from admission.records import field, record, replace
from admission.store import rules
from admission.vocab import APPROVED, POLICY, REJECTED, RENEWED, sql_list
from admission.store.base import (
    ADMITTED,
    AWAITING_APPROVAL,
    CANCELLED,
    DEFAULT_HEARTBEAT_WINDOW,
    DENIED,
    HOLDING_STATES,
    MAX_HEARTBEAT_S,
    PREEMPTED,
    RELEASED,
    TIMED_OUT,
    LIVE_STATES,
    QUEUED,
    AdmissionStore,
    BadRequest,
    DEFAULT_POLICY,
    Event,
    Health,
    IdentityConflict,
    Lease,
    LeaseLost,
    NotAwaitingApproval,
    NotOwner,
    Orchestrator,
    Policy,
    QuotaConfigInvalid,
    Record,
    Request,
    SchemaTooNew,
    StoreError,
    StoreTimeout,
    StoreUnreachable,
    UnknownRequest,
    lease_lost,
    seconds_problem,
)
from admission.store.base import checked_text as _text

from admission.store._closure_rows import ClosureRows
from admission.store._schema import MIGRATIONS, SCHEMA_VERSION  # noqa: F401 - read by the backends and tests

_REQ_COLS = ("id, orchestrator, environment, provider, tier, priority, queue_timeout, preemptible, lease_ttl, "
             "submitted_at, state, revision, lease_expires, decided_at, reason, runtime, approval")
_LIVE = sql_list(LIVE_STATES)
_LIVE_SQL = f"SELECT {_REQ_COLS} FROM requests WHERE state IN ({_LIVE})"
# the live records and the one a call is about, in one statement
_READ_SQL = f"{_LIVE_SQL} UNION ALL SELECT {_REQ_COLS} FROM requests WHERE id = ? AND state NOT IN ({_LIVE})"
_INSERT_SQL = f"INSERT INTO requests ({_REQ_COLS}) VALUES ({', '.join('?' * len(_REQ_COLS.split(',')))})"
# A lock-free release: only of the owner's current, unexpired lease at its revision.
_RELEASE_SQL = ("UPDATE requests SET state = ?, decided_at = ?, reason = ? WHERE id = ? AND orchestrator = ? "
                f"AND state = '{ADMITTED}' AND revision = ? AND lease_expires > ? RETURNING {_REQ_COLS}")
# Asked after a lock-free release, as a statement of its own (so that it sees every request
# queued before the release's row was free): must the freed capacity be handed on?
_ANY_QUEUED_SQL = f"SELECT EXISTS (SELECT 1 FROM requests WHERE state = '{QUEUED}')"
_VERSION_POLICY_SQL = "SELECT v.version, p.body FROM schema_version v LEFT JOIN policy p ON p.id = 1 WHERE v.id = 1"
_INSERT_NEW_SQL = _INSERT_SQL + f" ON CONFLICT (id) DO NOTHING RETURNING {_REQ_COLS}"
# the heartbeats that bear on this transaction: those of orchestrators with queued requests
_BEATS_SQL = ("SELECT id, lapses_at FROM orchestrators "
              f"WHERE id IN (SELECT orchestrator FROM requests WHERE state = '{QUEUED}')")
_ORCH_COLS = "id, beat_at, lapses_at, started_at"
# A beat: (id, beat_at, lapses_at, started_at). `started_at` moves only for an orchestrator
# back from a lapse (it came up again).
_BEAT_SQL = (f"INSERT INTO orchestrators ({_ORCH_COLS}) VALUES (?, ?, ?, ?) ON CONFLICT (id) DO UPDATE "
             "SET beat_at = excluded.beat_at, lapses_at = excluded.lapses_at, started_at = CASE "
             "WHEN orchestrators.lapses_at <= excluded.beat_at THEN excluded.started_at "
             "ELSE orchestrators.started_at END")
_HEARTBEAT_SQL = f"{_BEAT_SQL} RETURNING {_ORCH_COLS}"
_UPDATE_SQL = "UPDATE requests SET state = ?, revision = ?, lease_expires = ?, decided_at = ?, reason = ? WHERE id = ?"


def _queued_reason(r: Request) -> str:
    return f"{r.environment}/{r.provider}/{r.tier} priority {r.priority}"


def _row(r: Record) -> tuple:
    """The requests row of record `r`, in `_REQ_COLS` order."""
    q = r.request
    return (q.id, q.orchestrator, q.environment, q.provider, q.tier, q.priority, q.queue_timeout, int(q.preemptible),
            q.lease_ttl, r.submitted_at, r.state, r.revision, r.lease_expires, r.decided_at, r.reason, q.runtime,
            int(q.approval))


def _admitted_row(q: Request, now: float) -> tuple:
    """The requests row of `q` (no approval wait) admitted at once at `now` (what the locked path would write)."""
    return _row(Record(q, submitted_at=now, state=ADMITTED, revision=1, lease_expires=now + q.lease_ttl,
                       decided_at=now, reason="capacity"))


def _record(row) -> Record:
    (rid, orch, env, prov, tier, prio, qt, pre, ttl, sub, state, rev, exp, dec, reason, runtime, approval) = row
    req = Request(id=rid, orchestrator=orch, environment=env, provider=prov, tier=tier, priority=int(prio),
                  queue_timeout=qt, preemptible=bool(pre), lease_ttl=ttl, approval=bool(approval),
                  runtime=runtime or tier)  # a row from before runtimes were kept: its tier
    return Record(request=req, submitted_at=sub, state=state, revision=int(rev), lease_expires=exp,
                  decided_at=dec, reason=reason)


@record(frozen=False)
class _Tx:
    """One transaction's view: the live records (and the one it is about), changed in memory.

    The transaction reads once and writes once: `change` and `insert` collect the
    rows, `event` the audit rows, and the store flushes them together before commit.
    """

    cur: object
    now: float
    policy: Policy
    body: str | None = None  # the policy as stored (None: the default)
    beat: tuple | None = None  # this handle's heartbeat row, written with the transaction (None: not due)
    heartbeats: dict = field(default_factory=dict)  # orchestrator -> when its heartbeat lapses
    records: dict = field(default_factory=dict)
    changed: dict = field(default_factory=dict)
    inserted: list = field(default_factory=list)
    audit: list = field(default_factory=list)

    def change(self, rec: Record, kind: str, reason: str, **fields) -> Record:
        new = replace(rec, decided_at=self.now, reason=reason, **fields)
        self.records[rec.id] = new
        if rec.id not in self.inserted:
            self.changed[rec.id] = new
        self.event(kind, rec.id, reason)
        return new

    def insert(self, rec: Record, reason: str) -> None:
        self.records[rec.id] = rec
        self.inserted.append(rec.id)
        self.event(QUEUED, rec.id, reason)

    def event(self, kind: str, request_id: str, reason: str) -> None:
        self.audit.append((kind, request_id, reason))

    def live(self) -> list[Record]:
        return [r for r in self.records.values() if r.state in LIVE_STATES]


class SqlStore(ClosureRows, AdmissionStore):
    """The store over a DB-API connection; subclasses give the dialect and the driver errors."""

    #: Dialect pieces for the DDL.
    ddl_types = {"serial": "INTEGER PRIMARY KEY AUTOINCREMENT", "float": "DOUBLE PRECISION"}
    db_time_sql = ""
    paramstyle = "?"

    def __init__(self, url: str, actor: str = "fleet", clock: Callable[[], float] = time.time, create: bool = True,
                 heartbeat_window: float = DEFAULT_HEARTBEAT_WINDOW):
        self.url, self.actor, self.clock = url, actor, clock
        self.create = create
        self.heartbeat_window = heartbeat_window
        # This handle's heartbeat: when its last beat lapses (store clock) and the window its
        # calls renew (see `_due_beat`).
        self._beat_until, self._beat_window = -math.inf, heartbeat_window
        self._conn = None
        self._mutex = threading.Lock()  # one connection, one transaction at a time per store object
        self._policy_cache: tuple[str | None, Policy] = (None, DEFAULT_POLICY)
        self._version_policy_sql = self._sql(_VERSION_POLICY_SQL)
        self._insert_new_sql = self._sql(_INSERT_NEW_SQL)
        self._read_sql = self._sql(_READ_SQL)
        self._insert_sql = self._sql(_INSERT_SQL)
        self._update_sql = self._sql(_UPDATE_SQL)
        self._release_sql = self._sql(_RELEASE_SQL)
        self._heartbeat_sql = self._sql(_HEARTBEAT_SQL)
        self._beat_sql = self._sql(_BEAT_SQL)
        self._event_sql = self._sql("INSERT INTO events (at, kind, request_id, actor, reason) VALUES (?, ?, ?, ?, ?)")
        self._migrate()

    # ------------------------------------------------------------- dialect hooks

    @abc.abstractmethod
    def _connect(self):
        """A new DB-API connection (raising the driver's error when unreachable)."""

    @abc.abstractmethod
    def _begin(self, cur) -> None:
        """Start a write transaction."""

    def _commit(self, conn, cur) -> None:
        """Commit a store transaction; return only once it is durable."""
        conn.commit()

    @abc.abstractmethod
    def _migration_lock(self, cur) -> None:
        """Serialize schema creation among processes opening a fresh store at once."""

    def _ensure_schema(self, cur) -> None:
        """Make the namespace the store lives in exist (a database schema named in the url)."""

    @abc.abstractmethod
    def _has_schema(self, cur) -> bool:
        """Whether the schema_version table exists (in the schema in use)."""

    @abc.abstractmethod
    def _unreachable(self, exc: BaseException) -> bool:
        """Whether a driver error means the database is gone (as opposed to a bug)."""

    @abc.abstractmethod
    def _timed_out(self, exc: BaseException) -> bool:
        """Whether a driver error is a call that passed its deadline (the connection is still good)."""

    def _sql(self, text: str) -> str:
        return text if self.paramstyle == "?" else text.replace("?", "%s")

    def redacted_url(self) -> str:
        """The url without a password, for reports and errors."""
        return redact(self.url)

    # ------------------------------------------------------------- connection and transactions

    def _connection(self):
        if self._conn is None:
            try:
                self._conn = self._connect()
            except Exception as exc:
                if self._unreachable(exc):
                    raise StoreUnreachable(f"{self.redacted_url()}: {exc}".strip()) from exc
                raise
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # a dead connection may refuse even to close; it is dropped either way
                pass

    @contextmanager
    def _guard(self):
        """Map a lost database to StoreUnreachable, rolling back whatever was begun."""
        with self._mutex:
            conn = self._connection()
            try:
                yield conn
            except BaseException as exc:
                try:
                    conn.rollback()
                except Exception:
                    self._drop_connection()
                if isinstance(exc, Exception) and self._timed_out(exc):
                    raise StoreTimeout(f"{self.redacted_url()}: the call passed its deadline: {exc}".strip()) from exc
                if isinstance(exc, Exception) and self._unreachable(exc):
                    self._drop_connection()
                    raise StoreUnreachable(f"{self.redacted_url()}: {exc}".strip()) from exc
                raise

    @contextmanager
    def _tx(self, request_id: str = "", policy_write: bool = False, beat: bool = True):
        """One serialized write transaction at the store clock's now, under the stored policy.

        Reads the live records and `request_id`'s record into memory; what the body
        changes there is written back in one batch, then committed. `beat`: the call is
        this orchestrator's own, so it heartbeats with it when a beat is due; an operator's
        call (a policy, an approval) does not. `policy_write`: a stored policy that no
        longer passes the checks does not stop the transaction (it is about to be replaced).
        """
        with self._guard() as conn:
            cur = conn.cursor()
            row, rows, beats = self._lock_and_read(cur, request_id, policy_write)
            if row is None:
                raise StoreError(f"{self.redacted_url()}: the store's schema_version row is missing")
            version, body = row
            if version != SCHEMA_VERSION:
                # newer code migrated it meanwhile (or it was rolled back under us): refuse to write
                raise SchemaTooNew(version, SCHEMA_VERSION)
            now = self.clock()
            try:
                policy = self._parse_policy(body)
            except QuotaConfigInvalid:
                if not policy_write:
                    raise
                policy = DEFAULT_POLICY
            tx = _Tx(cur, now, policy, body, self._due_beat(now) if beat else None)
            tx.records = {r.id: r for r in map(_record, rows)}
            tx.heartbeats = dict(beats)
            yield tx
            self._write_and_commit(conn, cur, self._writes(tx))
            self._beaten(tx.beat)

    def _due_beat(self, now: float) -> tuple | None:
        """The heartbeat row a call of this handle writes at `now`: when less than half of its
        window is left (so an orchestrator that calls is never taken for gone), else None."""
        if now < self._beat_until - self._beat_window / 2:
            return None
        return (self.actor, now, now + self._beat_window, now)

    def _beaten(self, beat: tuple | None) -> None:
        """A transaction that carried `beat` committed: the handle's beat now lapses then."""
        if beat is not None:
            self._beat_until = max(self._beat_until, beat[2])

    def _lock_and_read(self, cur, request_id: str, policy_write: bool = False):
        """Begin, take the store lock, then read: (schema_version row, request rows, heartbeat rows).

        `policy_write`: the transaction may change the policy, so it also excludes the
        lock-free admissions that rely on the policy staying put."""
        self._begin(cur)
        cur.execute(self._version_policy_sql)  # under the lock _begin took (SQLite: BEGIN IMMEDIATE)
        row = cur.fetchone()
        cur.execute(self._read_sql, (request_id,))
        rows = cur.fetchall()
        cur.execute(_BEATS_SQL)
        return row, rows, cur.fetchall()

    def _writes(self, tx: _Tx) -> list[tuple[str, list]]:
        """The transaction's writes: (statement, [parameter rows])."""
        out = []
        if tx.inserted:
            out.append((self._insert_sql, [_row(tx.records[rid]) for rid in tx.inserted]))
        if tx.changed:
            out.append((self._update_sql, [(r.state, r.revision, r.lease_expires, r.decided_at, r.reason, r.id)
                                           for r in tx.changed.values()]))
        if tx.audit:
            out.append((self._event_sql, [(tx.now, kind, rid, self.actor, reason) for kind, rid, reason in tx.audit]))
        if tx.beat is not None:
            out.append((self._beat_sql, [tx.beat]))
        return out

    def _write_and_commit(self, conn, cur, writes) -> None:
        for sql, rows in writes:
            cur.executemany(sql, rows)
        self._commit(conn, cur)

    @contextmanager
    def _read(self):
        with self._guard() as conn:
            cur = conn.cursor()
            yield cur
            conn.commit()

    def _parse_policy(self, body: str | None) -> Policy:
        """The stored policy `body` as a Policy (cached). One that no longer passes the checks
        (written by other code, or by hand) is QuotaConfigInvalid naming it: every decision
        waits until a valid one is set (`set_policy` replaces it)."""
        if body == self._policy_cache[0]:
            return self._policy_cache[1]
        try:
            policy = DEFAULT_POLICY if body is None else Policy.build(json.loads(body))
        except ValueError as exc:  # QuotaConfigInvalid, or no JSON at all
            path = getattr(exc, "path", "")
            raise QuotaConfigInvalid(f"stored policy{'.' + path if path else ''}",
                                     f"{exc}; set a valid policy to go on") from None
        self._policy_cache = (body, policy)
        return policy

    def _migrate(self) -> None:
        with self._guard() as conn:
            cur = conn.cursor()
            self._begin(cur)
            self._ensure_schema(cur)
            self._migration_lock(cur)
            if not self.create and not self._has_schema(cur):
                raise StoreUnreachable(f"{self.redacted_url()}: no admission store there (it has no schema_version)")
            cur.execute("CREATE TABLE IF NOT EXISTS schema_version "
                        "(id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL)")
            cur.execute("SELECT version FROM schema_version WHERE id = 1")
            row = cur.fetchone()
            found = 0 if row is None else row[0]
            if found > SCHEMA_VERSION:
                raise SchemaTooNew(found, SCHEMA_VERSION)
            now = self.clock()
            for version in range(found + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version]:
                    cur.execute(statement.format(now=repr(float(now)), lapses=repr(float(now + self.heartbeat_window)),
                                                 **self.ddl_types))
            if row is None:
                cur.execute(self._sql("INSERT INTO schema_version (id, version) VALUES (1, ?)"), (SCHEMA_VERSION,))
            elif found != SCHEMA_VERSION:
                cur.execute(self._sql("UPDATE schema_version SET version = ? WHERE id = 1"), (SCHEMA_VERSION,))
            self._install_functions(cur)
            self._commit(conn, cur)

    def _install_functions(self, cur) -> None:
        """Create the database functions this code calls, if missing (under the migration lock)."""

    # ------------------------------------------------------------- decisions inside a transaction

    def _reconcile(self, tx: _Tx) -> None:
        """Apply `rules.plan` at tx.now to the records in memory."""
        # The caller is alive (it is making this call): only the other orchestrators are
        # judged by their heartbeats.
        beats = {o: lapses_at for o, lapses_at in tx.heartbeats.items() if o != self.actor}
        p = rules.plan(tx.policy, tx.live(), tx.now, beats)
        if p.empty():
            return
        admitted_now = {r.id for r, _ in p.admissions}
        # a victim that held before this pass gives its place up before the admissions; one
        # admitted in this pass and preempted later in it is preempted after its admission
        earlier = [(r, reason) for r, reason in p.preemptions if r.id not in admitted_now]
        later = [(r, reason) for r, reason in p.preemptions if r.id in admitted_now]
        for pairs, state in ((p.lease_timeouts, TIMED_OUT), (p.queue_timeouts, TIMED_OUT), (p.denials, DENIED),
                             (p.cancellations, CANCELLED), (earlier, PREEMPTED)):
            for r, reason in pairs:
                tx.change(tx.records[r.id], state, reason, state=state)
        for r, reason in p.admissions:
            rec = tx.records[r.id]
            state = rules.granted_state(rec.request)
            tx.change(rec, state, reason, state=state, revision=rec.revision + 1,
                      lease_expires=rules.lease_end(rec.request, tx.now, beats))
        for r, reason in later:
            tx.change(tx.records[r.id], PREEMPTED, reason, state=PREEMPTED)

    def _must_get(self, tx: _Tx, request_id: str) -> Record:
        rec = tx.records.get(request_id)
        if rec is None:
            raise UnknownRequest(request_id)
        return rec

    def _owned(self, tx: _Tx, request_id: str, verb: str) -> Record:
        rec = self._must_get(tx, request_id)
        if rec.request.orchestrator != self.actor:
            raise NotOwner(f"{self.actor!r} may not {verb} {request_id!r}: it belongs to {rec.request.orchestrator!r}")
        return rec

    # ------------------------------------------------------------- the contract

    def submit(self, request: Request) -> Record:
        rules.validate_request(request)
        if request.orchestrator != self.actor:
            raise BadRequest("orchestrator", f"this store speaks for {self.actor!r}, not {request.orchestrator!r}")
        request = rules.normalized(request)
        body, policy = self._policy_cache
        rec = None
        if request.approval:
            pass  # it waits for an approval once granted: only the locked path grants that
        elif rules.unconstrained(policy, request):
            # Admitted at once under the policy last seen, if it is still the stored one and
            # the id is new; anything else (a replay, a changed policy) takes the locked path.
            rec = self._submit_unconstrained(request, body)
        else:
            rec = self._submit_at_once(request, body, policy)
        if rec is not None:
            return rec
        with self._tx(request.id) as tx:
            stored = tx.records.get(request.id)
            if stored is not None:
                mismatch = rules.identity_mismatch(stored.request, request)
                if mismatch:
                    raise IdentityConflict(request.id, mismatch)
            else:
                r = request
                tx.insert(Record(r, submitted_at=tx.now, state=QUEUED, decided_at=tx.now, reason="submitted"),
                          _queued_reason(r))
            self._reconcile(tx)
            return tx.records[request.id]

    def get(self, request_id: str) -> Record:
        _text("request_id", request_id)
        with self._tx(request_id) as tx:
            self._reconcile(tx)
            return self._must_get(tx, request_id)

    def renew(self, request_id: str, revision: int) -> Lease:
        _text("request_id", request_id)
        _whole("revision", revision)
        # The reconcile must commit even when the lease turns out lost, so raise after the transaction.
        with self._tx(request_id) as tx:
            self._reconcile(tx)
            rec = self._owned(tx, request_id, "renew")
            lease = None
            if rec.state in HOLDING_STATES and rec.revision == revision:
                rec = tx.change(rec, RENEWED, f"revision {revision + 1}", revision=revision + 1,
                                lease_expires=tx.now + rec.request.lease_ttl)
                lease = rec.lease
        if lease is None:
            raise lease_lost(request_id, rec.state, rec.reason if rec.state not in HOLDING_STATES
                             else f"revision {revision} is stale (current {rec.revision})")
        return lease

    def release(self, request_id: str, revision: int, reason: str = "done") -> Record:
        # A release only frees capacity, so the common case (the owner gives back its current,
        # unexpired lease) needs no store lock: one guarded update, audited in the same
        # transaction. When requests are queued, a locked reconcile follows in the same call,
        # so the freed capacity goes to the next of them now, not at some later call.
        # Everything else (expired, stale, not ours, unknown) takes the locked path.
        _text("request_id", request_id)
        _whole("revision", revision)
        _text("reason", reason)
        released = self._release_fast(request_id, revision, reason)
        if released is not None:
            rec, any_queued = released
            if any_queued:
                self._hand_on()
            return rec
        with self._tx(request_id) as tx:
            self._reconcile(tx)
            rec = self._owned(tx, request_id, "release")
            if rec.state in HOLDING_STATES:
                if rec.revision != revision:
                    raise LeaseLost(request_id, rec.state, f"revision {revision} is stale (current {rec.revision})")
                tx.change(rec, RELEASED, reason, state=RELEASED)
                self._reconcile(tx)
            return tx.records[request_id]

    def approve(self, request_id: str, reason: str = "approved") -> Record:
        return self._decide_approval(request_id, reason, APPROVED)

    def reject(self, request_id: str, reason: str = "rejected") -> Record:
        return self._decide_approval(request_id, reason, REJECTED)

    def _decide_approval(self, request_id: str, reason: str, kind: str) -> Record:
        """Approve (kind APPROVED) or reject (REJECTED) a request awaiting approval, as anyone."""
        _text("request_id", request_id)
        _text("reason", reason)
        verb, state = ("approve", ADMITTED) if kind == APPROVED else ("reject", DENIED)
        with self._tx(request_id, beat=False) as tx:
            self._reconcile(tx)
            rec = self._must_get(tx, request_id)
            if rec.state == AWAITING_APPROVAL:
                # approved: the lease it holds goes on as it is (its owner renews it at its revision)
                tx.change(rec, kind, f"{kind} by {self.actor}: {reason}", state=state)
                if state == DENIED:
                    self._reconcile(tx)  # its capacity goes to the next request
                return tx.records[request_id]
            decided = rec.request.approval and rec.state == state and rec.revision > 0
        if decided:
            return rec  # decided so already: a replay of the same decision
        raise NotAwaitingApproval(request_id, rec.state, verb)

    def _hand_on(self) -> None:
        """Reconcile after a lock-free release, so that its capacity goes to the queue now.

        The release is committed already: a store that does not answer in time here
        leaves the hand-on to the next reconciling call (any orchestrator's), as a
        release without a queue does, rather than report a release that happened as failed.
        """
        try:
            with self._tx() as tx:
                self._reconcile(tx)
        except (StoreTimeout, StoreUnreachable):
            pass

    def _submit_at_once(self, request: Request, policy_body: str | None, policy: Policy) -> Record | None:
        """Admit a limited `request` in one step where `rules.plan` could do nothing else; None to
        take the locked path. This backend has no such step (its locked path is the one)."""
        return None

    def _submit_unconstrained(self, request: Request, policy_body: str | None) -> Record | None:
        """Insert `request` admitted, without the store lock; None unless the id is new and
        the stored policy is `policy_body` (under which nothing limits the request)."""
        with self._guard() as conn:
            cur = conn.cursor()
            now = self.clock()
            self._begin(cur)
            cur.execute(self._version_policy_sql)
            if cur.fetchone() != (SCHEMA_VERSION, policy_body):
                conn.rollback()
                return None
            cur.execute(self._insert_new_sql, _admitted_row(request, now))
            row = cur.fetchone()
            if row is None:
                conn.rollback()
                return None
            cur.executemany(self._event_sql, [(now, QUEUED, request.id, self.actor, _queued_reason(request)),
                                              (now, ADMITTED, request.id, self.actor, "capacity")])
            beat = self._due_beat(now)
            if beat is not None:
                cur.execute(self._beat_sql, beat)
            self._commit(conn, cur)
            self._beaten(beat)
            return _record(row)

    def _release_fast(self, request_id: str, revision: int, reason: str) -> tuple[Record, bool] | None:
        """Release a current lease of ours without the store lock: (its record, whether any
        request is queued); None when it is not one."""
        with self._guard() as conn:
            cur = conn.cursor()
            now = self.clock()
            self._begin(cur)
            cur.execute(self._release_sql, (RELEASED, now, reason, request_id, self.actor, revision, now))
            row = cur.fetchone()
            if row is None:
                conn.rollback()
                return None
            cur.execute(self._event_sql, (now, RELEASED, request_id, self.actor, reason))
            beat = self._due_beat(now)
            if beat is not None:
                cur.execute(self._beat_sql, beat)
            cur.execute(_ANY_QUEUED_SQL)
            any_queued = bool(cur.fetchone()[0])
            self._commit(conn, cur)
            self._beaten(beat)
            return _record(row), any_queued

    def cancel(self, request_id: str, reason: str = CANCELLED) -> Record:
        _text("request_id", request_id)
        _text("reason", reason)
        with self._tx(request_id) as tx:
            self._reconcile(tx)
            rec = self._owned(tx, request_id, "cancel")
            if rec.state in LIVE_STATES:
                tx.change(rec, CANCELLED, reason, state=CANCELLED)
                self._reconcile(tx)
            return tx.records[request_id]

    def reconcile(self) -> list[Record]:
        with self._tx() as tx:
            self._reconcile(tx)
        return _ordered(tx.live(), tx.policy, tx.now)

    def active(self) -> list[Record]:
        return self.reconcile()

    def snapshot(self) -> tuple[list[Record], Policy, float]:
        """The live records as stored, the policy and the clock's now, read without writing.

        For listings (``fleetctl leases``): nothing is reconciled, so a lease past its
        expiry still shows as admitted until the next store transaction times it out.
        """
        with self._read() as cur:
            cur.execute("SELECT body FROM policy WHERE id = 1")
            row = cur.fetchone()
            cur.execute(_LIVE_SQL)
            live = [_record(r) for r in cur.fetchall()]
        policy, now = self._parse_policy(None if row is None else row[0]), self.clock()
        return _ordered(live, policy, now), policy, now

    def events(self, request_id: str | None = None, since: int = 0, limit: int | None = None) -> list[Event]:
        if request_id is not None:
            _text("request_id", request_id)
        _whole("since", since)
        if limit is not None:
            _whole("limit", limit)
        sql = "SELECT seq, at, kind, request_id, actor, reason FROM events WHERE seq > ?"
        args: list = [since]
        if request_id is not None:
            sql += " AND request_id = ?"
            args.append(request_id)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        with self._read() as cur:
            cur.execute(self._sql(sql), args)
            return [Event(*row) for row in cur.fetchall()]

    def heartbeat(self, window: float) -> Orchestrator:
        _check_window(window)
        with self._guard() as conn:
            cur = conn.cursor()
            now = self.clock()
            self._begin(cur)
            cur.execute(self._heartbeat_sql, (self.actor, now, now + window, now))
            beat = Orchestrator(*cur.fetchone())
            self._commit(conn, cur)
            # this handle's calls renew this window from now on (and beat again past half of it)
            self._beat_until, self._beat_window = beat.lapses_at, float(window)
            return beat

    def orchestrators(self) -> list[Orchestrator]:
        with self._read() as cur:
            cur.execute(f"SELECT {_ORCH_COLS} FROM orchestrators ORDER BY id")
            return [Orchestrator(*row) for row in cur.fetchall()]

    def policy(self) -> Policy:
        with self._read() as cur:
            cur.execute("SELECT body FROM policy WHERE id = 1")
            row = cur.fetchone()
        return self._parse_policy(None if row is None else row[0])

    def set_policy(self, policy: Policy) -> Policy:
        if not isinstance(policy, Policy):
            raise QuotaConfigInvalid("policy", f"must be an admission.store.Policy, got {type(policy).__name__}")
        checked = policy.checked()  # every value in range, or QuotaConfigInvalid: nothing written
        body = json.dumps(checked.to_dict(), sort_keys=True)
        with self._tx(policy_write=True, beat=False) as tx:
            if tx.body != body:
                tx.cur.execute(self._sql(
                    "INSERT INTO policy (id, body, updated_at, updated_by) VALUES (1, ?, ?, ?) "
                    "ON CONFLICT (id) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at, "
                    "updated_by = excluded.updated_by"), (body, tx.now, self.actor))
                tx.event(POLICY, "", body)
                tx.policy = checked
            self._reconcile(tx)
        # This handle's next calls judge under it at once (its lock-free paths read the cache).
        self._policy_cache = (body, checked)
        return checked


    def check(self) -> Health:
        with self._read() as cur:
            cur.execute("SELECT version FROM schema_version WHERE id = 1")
            version = cur.fetchone()[0]
            before = time.time()
            cur.execute(self.db_time_sql)
            db_time = float(cur.fetchone()[0])
            after = time.time()
        return Health(self.redacted_url(), version, SCHEMA_VERSION, (before + after) / 2, db_time)

    def close(self) -> None:
        with self._mutex:
            self._drop_connection()


def redact(url: str) -> str:
    """`url` with the password (if any) replaced by ``***``."""
    head, sep, tail = url.partition("://")
    authority, slash, rest = tail.partition("/")
    if "@" in authority:
        cred, _, host = authority.rpartition("@")
        user = cred.split(":", 1)[0]
        return f"{head}{sep}{user}{':***' if ':' in cred else ''}@{host}{slash}{rest}"
    return url


def _check_window(window) -> float:
    """A heartbeat window: seconds in (0, a day]."""
    problem = seconds_problem(window, MAX_HEARTBEAT_S)
    if problem:
        raise BadRequest("window", problem)
    return float(window)


def _whole(name: str, value) -> int:
    """A whole number >= 0 that both databases take (a 63-bit integer)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise BadRequest(name, f"must be a whole number >= 0, got {value!r}")
    return value


def _ordered(live: list[Record], policy: Policy, now: float) -> list[Record]:
    """Those holding capacity first (admitted or awaiting approval, by lease expiry), then the queue in queue order."""
    admitted = sorted((r for r in live if r.state in HOLDING_STATES), key=lambda r: (r.lease_expires, r.id))
    queued = sorted((r for r in live if r.state == QUEUED), key=lambda r: rules.queue_key(r, now, policy.aging_interval))
    return admitted + queued
