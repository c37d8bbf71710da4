"""Store backends for the tests: a SQLite file per test, a PostgreSQL schema per test.

PostgreSQL comes from ``FLEET_PG_DSN`` (a ``postgresql://`` URI) when it is set;
otherwise a throwaway cluster is started from the installed server binaries
(as the ``postgres`` user when we are root, on a unix socket in a temp dir) and
stopped at the end of the session, or, when the test process dies without its
teardown (killed, or aborted by a fleet's fuse), by its reaper. With ``FLEET_REQUIRE_PG=1`` a PostgreSQL that
cannot be had fails the test instead of skipping it. Each test gets its own
schema, dropped afterwards even when the test fails, so tests run in parallel.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid

import pytest

from admission.store import Request, open_store
from tests.quotas import breaches

BACKENDS = ("sqlite", "postgresql")


def _unavailable(why: str):
    if os.environ.get("FLEET_REQUIRE_PG") == "1":
        pytest.fail(f"PostgreSQL is required (FLEET_REQUIRE_PG=1) but unavailable: {why}")
    pytest.skip(f"PostgreSQL unavailable: {why}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: A throwaway cluster's reaper: a process that waits on a pipe from the test process and,
#: when the pipe ends without the word that the cluster was stopped (the test process died:
#: killed, or aborted by a fleet's fuse, and no fixture ran), stops it and removes its dir.
#: A pipe's end is seen whatever killed the writer; nothing but the test process holds it.
REAPER = """
import os, shutil, subprocess, sys
prefix_len = int(sys.argv[1])
prefix, (pg_ctl, data, folder) = sys.argv[2:2 + prefix_len], sys.argv[2 + prefix_len:]
if sys.stdin.read() != "stopped":
    subprocess.run(prefix + [pg_ctl, "-D", data, "-m", "immediate", "stop"], capture_output=True, timeout=120)
    shutil.rmtree(folder, ignore_errors=True)
"""


class _Cluster:
    """A throwaway PostgreSQL cluster in a temp dir, reachable only on its unix socket."""

    def __init__(self):
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            raise RuntimeError("no /usr/lib/postgresql/*/bin/initdb")
        self.bin = os.path.dirname(bins[-1])
        self.dir = tempfile.mkdtemp(prefix="fleet-pg-")
        self.port = _free_port()
        self.prefix: list[str] = []
        if os.geteuid() == 0:  # initdb and the server refuse to run as root
            user = pwd.getpwnam("postgres")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        data = os.path.join(self.dir, "data")
        # the reaper first: from here on a dying test process leaves nothing behind
        self._reaper = subprocess.Popen(
            [sys.executable, "-c", REAPER, str(len(self.prefix)), *self.prefix, f"{self.bin}/pg_ctl", data, self.dir],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
            start_new_session=True)  # not in the test's process group: a signal to the group spares it
        self._run([f"{self.bin}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "-N"])
        self._run([f"{self.bin}/pg_ctl", "-D", data, "-w", "-l", os.path.join(self.dir, "log"),
                   "-o", f"-k {self.dir} -c listen_addresses='' -p {self.port} -c fsync=off", "start"])
        self.data = data
        self.dsn = f"postgresql://postgres@/postgres?host={self.dir}&port={self.port}"

    def _run(self, argv):
        subprocess.run(self.prefix + argv, check=True, capture_output=True, timeout=120)

    def stop(self):
        try:
            self._run([f"{self.bin}/pg_ctl", "-D", self.data, "-m", "immediate", "stop"])
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            self._reaper.communicate("stopped", timeout=60)  # it has nothing left to do


@pytest.fixture(scope="session")
def pg_dsn():
    """An admin URI of a reachable PostgreSQL (see the module docstring)."""
    try:
        import psycopg
    except ImportError as exc:
        _unavailable(f"psycopg is not installed ({exc})")
    cluster = None
    dsn = os.environ.get("FLEET_PG_DSN")
    if not dsn:
        try:
            cluster = _Cluster()
        except Exception as exc:  # no server binaries, no postgres user, initdb failed...
            detail = getattr(exc, "stderr", b"") or b""
            _unavailable(f"could not start a throwaway cluster: {exc} {detail.decode(errors='replace')}")
        dsn = cluster.dsn
    try:
        psycopg.connect(dsn, connect_timeout=10).close()
    except Exception as exc:
        if cluster:
            cluster.stop()
        _unavailable(f"{dsn}: {exc}")
    yield dsn
    if cluster:
        cluster.stop()


def with_schema(dsn: str, schema: str) -> str:
    """`dsn` with its search_path set to `schema`."""
    sep = "&" if "?" in dsn else "?"
    return f"{dsn}{sep}options=-csearch_path%3D{schema}"


class Stores:
    """Makes fresh, empty store urls for one test and removes them all afterwards."""

    def __init__(self, backend: str, tmp_path, request):
        self.backend, self.tmp_path, self.request = backend, tmp_path, request
        self.schemas: list[str] = []
        self.admin = None

    def new_url(self) -> str:
        if self.backend == "sqlite":
            return f"sqlite://{self.tmp_path / ('store-' + uuid.uuid4().hex[:8] + '.db')}"
        import psycopg

        if self.admin is None:
            self.dsn = self.request.getfixturevalue("pg_dsn")
            self.admin = psycopg.connect(self.dsn, autocommit=True)
        schema = f"t_{uuid.uuid4().hex[:16]}"
        self.admin.execute(f"CREATE SCHEMA {schema}")
        self.schemas.append(schema)
        return with_schema(self.dsn, schema)

    def cleanup(self):
        if self.admin is None:
            return
        try:
            for schema in self.schemas:
                # end any backend still in it (a killed holder's), then drop it
                self.admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        finally:
            self.admin.close()


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
def stores(backend, tmp_path, request):
    s = Stores(backend, tmp_path, request)
    yield s
    s.cleanup()


@pytest.fixture
def pg_stores(tmp_path, request):
    """Fresh PostgreSQL store urls for one test whatever the backend: for what only
    PostgreSQL has (a connection to lose, a schema, sessions the server ends)."""
    s = Stores("postgresql", tmp_path, request)
    yield s
    s.cleanup()


@pytest.fixture
def store_url(stores):
    """One fresh store url for this test, on the parametrized backend."""
    return stores.new_url()


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store(store_url, clock):
    """Orchestrator orch-a's handle on this test's store, on the fake clock."""
    s = open_store(store_url, actor="orch-a", clock=clock)
    yield s
    s.close()


def req(rid, **kw) -> Request:
    """A request of orch-a's (prod, openai, container) unless `kw` says otherwise."""
    fields = dict(orchestrator="orch-a", environment="prod", provider="openai", tier="container")
    fields.update(kw)
    return Request(rid, **fields)


class FakeClock:
    """A clock the test steps by hand."""

    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def quota_history_violations(store, limits: dict) -> list:
    """Replay the audit trail: after every event, does the admitted set exceed one of
    `limits` (`tests.quotas.breaches`, the rule written out apart from the store's)?

    Returns the list of (event seq, breaches) where one did; [] when every quota held at
    every step.
    """
    admitted: dict = {}
    bad = []
    records = {}
    for ev in store.events():
        if not ev.request_id or ev.kind in ("policy", "closure", "reopened"):
            continue
        if ev.kind in ("admitted", "awaiting-approval"):  # a reservation awaiting approval holds capacity too
            if ev.request_id not in records:
                records[ev.request_id] = store.get(ev.request_id)
            admitted[ev.request_id] = records[ev.request_id]
        elif ev.kind in ("released", "timed-out", "preempted", "cancelled", "rejected"):
            admitted.pop(ev.request_id, None)
        over = breaches(limits, admitted.values())
        if over:
            bad.append((ev.seq, over))
    return bad


class GroupLockHeld:
    """Another session holding the store's group lock, as a stalled peer or a long
    transaction would: every locked transaction of the store at `url` waits meanwhile."""

    def __init__(self, url: str):
        self.url = url

    def __enter__(self):
        if self.url.startswith("sqlite://"):
            import sqlite3

            self.conn = sqlite3.connect(self.url[len("sqlite://"):], isolation_level=None)
            self.conn.execute("BEGIN IMMEDIATE")
        else:
            import psycopg

            self.conn = psycopg.connect(self.url, autocommit=True)
            self.conn.execute("SELECT pg_advisory_lock(hashtext('fleet.admission.store:' || current_schema()))")
        return self

    def __exit__(self, *exc):
        self.conn.close()  # ends the transaction or the session, and with it the lock
