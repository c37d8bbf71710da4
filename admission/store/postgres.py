"""The host-group store on PostgreSQL (psycopg 3), for orchestrators on several machines.

``postgresql://user:password@host:5432/dbname`` (any libpq URI; add
``?options=-csearch_path%3Dmyschema`` to keep the store in its own schema). Each
transaction starts by locking the one schema_version row (``SELECT ... FOR UPDATE``),
which serializes every store transaction of the host group, whatever host it comes
from; under READ COMMITTED each later statement then sees everything committed
before the lock was granted. Schema creation takes a transaction-scoped advisory
lock keyed on the schema, so fleets opening a fresh store at once do not race.
"""
from __future__ import annotations

import time
from typing import Callable

from ._sql import SqlStore
from .base import StoreUnreachable

PREFIXES = ("postgresql://", "postgres://")

# A store transaction's commit does not wait for the WAL flush, so the store lock is
# released without holding every other orchestrator through an fsync.
_BEGIN = "BEGIN; SET LOCAL synchronous_commit = off"
# Then a second, tiny transaction that writes one WAL record (a logical message, which any
# user may emit and nothing consumes) commits under the server's own synchronous_commit.
# Its flush covers all WAL before it, so our decision - and every decision it read - is
# durable before the caller may act on it; the flushes of several orchestrators group into
# one fsync. (A transaction that only takes an xid writes no WAL and would not wait.)
_COMMIT_DURABLY = "COMMIT; BEGIN; SELECT pg_logical_emit_message(true, 'fleet.admission.store', ''); COMMIT"


class PostgresStore(SqlStore):
    """The admission store in PostgreSQL. See `admission.store.base.AdmissionStore`."""

    lock_suffix = " FOR UPDATE OF v"
    ddl_types = {"serial": "BIGSERIAL PRIMARY KEY", "float": "DOUBLE PRECISION"}
    db_time_sql = "SELECT extract(epoch FROM clock_timestamp())::float8"
    paramstyle = "%s"

    def __init__(self, url: str, actor: str = "fleet", clock: Callable[[], float] = time.time,
                 connect_timeout: int = 10, create: bool = True):
        try:
            import psycopg  # imported here so that SQLite users need not have it
        except ImportError as exc:
            raise StoreUnreachable(f"{url}: the PostgreSQL driver is not installed "
                                   f"(pip install 'fleet[postgres]'): {exc}") from None

        self._psycopg = psycopg
        self.connect_timeout = connect_timeout
        super().__init__(url, actor, clock, create)

    def _connect(self):
        kwargs = {} if "connect_timeout" in self.url else {"connect_timeout": self.connect_timeout}
        # Transactions are begun and committed by the statements themselves, and values are
        # bound on the client, so that one round trip can carry several statements.
        return self._psycopg.connect(self.url, autocommit=True, cursor_factory=self._psycopg.ClientCursor,
                                     **kwargs)

    def _begin(self, cur) -> None:
        cur.execute(_BEGIN)

    def _lock_and_read(self, cur, request_id: str):
        # One round trip: begin, take the lock (the read, a later statement, then sees every
        # commit before the lock was granted), read.
        cur.execute(f"{_BEGIN}; {self._lock_sql}; {self._read_sql}", (request_id,))
        cur.nextset()  # past BEGIN
        cur.nextset()  # past SET
        row = cur.fetchone()
        cur.nextset()
        return row, cur.fetchall()

    def _write_and_commit(self, conn, cur, writes) -> None:
        # One round trip: every write, the commit, and the wait for durability.
        parts = [cur.mogrify(sql, params) for sql, rows in writes for params in rows]
        cur.execute("; ".join(parts + [_COMMIT_DURABLY]))

    def _commit(self, conn, cur) -> None:
        cur.execute(_COMMIT_DURABLY)

    def _migration_lock(self, cur) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('fleet.admission.store:' || current_schema()))")

    def _unreachable(self, exc: BaseException) -> bool:
        return isinstance(exc, (self._psycopg.OperationalError, self._psycopg.InterfaceError))

    def _has_schema(self, cur) -> bool:
        cur.execute("SELECT to_regclass('schema_version') IS NOT NULL")
        return bool(cur.fetchone()[0])
