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
        return self._psycopg.connect(self.url, autocommit=False, **kwargs)

    def _begin(self, cur) -> None:
        # psycopg opens the transaction here. Its commit does not wait for the WAL flush,
        # so the store lock is released without holding every other orchestrator
        # through an fsync; `_commit` waits for durability after the lock is gone.
        cur.execute("SET LOCAL synchronous_commit = off")

    def _commit(self, conn, cur) -> None:
        conn.commit()
        # A second, tiny transaction that writes one WAL record (a logical message, which
        # any user may emit and nothing consumes) commits under the server's own
        # synchronous_commit. Its flush covers all WAL before it, so our decision - and
        # every decision it read - is durable before the caller may act on it; the
        # flushes of several orchestrators group into one fsync. (A transaction that
        # only takes an xid writes no WAL and would not wait for the flush.)
        cur.execute("SELECT pg_logical_emit_message(true, 'fleet.admission.store', '')")
        conn.commit()

    def _pipeline(self, conn):
        # the lock and the read go out together, then the writes and the commit: two round trips
        return conn.pipeline()

    def _migration_lock(self, cur) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('fleet.admission.store:' || current_schema()))")

    def _unreachable(self, exc: BaseException) -> bool:
        return isinstance(exc, (self._psycopg.OperationalError, self._psycopg.InterfaceError))

    def _has_schema(self, cur) -> bool:
        cur.execute("SELECT to_regclass('schema_version') IS NOT NULL")
        return bool(cur.fetchone()[0])
