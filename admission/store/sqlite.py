"""The embedded store: one SQLite file in WAL mode, shared by every process on one host.

``sqlite:///var/lib/fleet/store.db`` names the file ``/var/lib/fleet/store.db`` (what
follows ``sqlite://`` is the path). ``BEGIN IMMEDIATE`` takes the database's write
lock at the start of each transaction, which is the serialization boundary; a
process waits for it up to ``busy_timeout`` seconds (`open_store`'s ``call_timeout``),
then gets StoreTimeout.
"""
from __future__ import annotations

import os
import sqlite3
import time
from typing import Callable

from admission.store._sql import SqlStore
from admission.store.base import DEFAULT_HEARTBEAT_WINDOW, StoreUnreachable

PREFIX = "sqlite://"
_NOT_A_STORE = (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT)
_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def path_of(url: str) -> str:
    """The file a ``sqlite://`` url names."""
    if not url.startswith(PREFIX) or len(url) == len(PREFIX):
        raise ValueError(f"not a sqlite url: {url!r} (want sqlite:///path/to/store.db)")
    return url[len(PREFIX):]


class SqliteStore(SqlStore):
    """The admission store in one SQLite file (WAL). See `admission.store.base.AdmissionStore`."""

    db_time_sql = "SELECT (julianday('now') - 2440587.5) * 86400.0"

    def __init__(self, url: str, actor: str = "fleet", clock: Callable[[], float] = time.time,
                 busy_timeout: float = 30.0, create: bool = True, heartbeat_window: float = DEFAULT_HEARTBEAT_WINDOW):
        self.path = path_of(url)
        self.busy_timeout = busy_timeout
        if not create and not os.path.exists(self.path):
            raise StoreUnreachable(f"{url}: no store at {self.path}")
        super().__init__(url, actor, clock, create, heartbeat_window)

    def _connect(self):
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a committed transaction survives a process crash; the last ones may
            # be lost on power loss, after which expired leases are simply reconciled.
            conn.execute("PRAGMA synchronous=NORMAL")
        except Exception:
            conn.close()
            raise
        return conn

    def _begin(self, cur) -> None:
        cur.execute("BEGIN IMMEDIATE")

    def _migration_lock(self, cur) -> None:
        pass  # BEGIN IMMEDIATE already excludes every other writer

    def _unreachable(self, exc: BaseException) -> bool:
        # a file that is not a database (or is damaged) can no more be used than a missing one
        return isinstance(exc, sqlite3.OperationalError) or (
            isinstance(exc, sqlite3.DatabaseError) and getattr(exc, "sqlite_errorcode", None) in _NOT_A_STORE)

    def _timed_out(self, exc: BaseException) -> bool:
        # the write lock stayed taken past busy_timeout
        return isinstance(exc, sqlite3.OperationalError) and getattr(exc, "sqlite_errorcode", None) in _BUSY

    def _has_schema(self, cur) -> bool:
        cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'")
        return cur.fetchone() is not None
