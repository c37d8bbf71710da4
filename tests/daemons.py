"""Real fleetd processes for tests: each with its own name, runtime dir, config file and
sd_notify socket; driven only through its socket, fleetctl and signals; and nothing of
it (fleetd, zygote, workers) left running when the test ends, even when it failed."""
from __future__ import annotations

import contextlib
import itertools
import resource
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager

import psutil

import fleet
from fleet.shm import dataplane
from fleet.rules.errors import FleetError
from fleet.service import control
from fleet.shm.table import segment
from tests.fleets import unique_name

#: Generous bound for anything a test waits on (boot, a unit, a stop).
BOUND_S = 60.0
_instances = itertools.count(1)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def to_toml(cfg: dict) -> str:
    """The TOML text of a config dict (tables of scalars, nested tables)."""
    lines: list[str] = []

    def emit(prefix: str, table: dict) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if prefix and (scalars or not table):
            lines.append(f"[{prefix}]")
        for key, value in scalars.items():
            if value is not None:
                lines.append(f"{key} = {json.dumps(value)}")  # JSON scalars are TOML scalars
        for key, value in table.items():
            if isinstance(value, dict):
                emit(f"{prefix}.{key}" if prefix else key, value)

    emit("", cfg)
    return "\n".join(lines) + "\n"


def wait_until(predicate, what: str, timeout: float = BOUND_S, every: float = 0.02):
    """Poll ``predicate`` until it returns a truthy value (returned); AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


class NotifyListener:
    """A real AF_UNIX datagram socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self, path: str):
        self.path = path
        self.messages: list[dict] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(path)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._recv, name="notify-listener", daemon=True)
        self._thread.start()

    def _recv(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append(fields)

    def with_key(self, key: str, value: str | None = None) -> list[dict]:
        return [m for m in list(self.messages) if key in m and (value is None or m[key] == value)]

    def wait_for(self, key: str, value: str | None = None, count: int = 1) -> list[dict]:
        return wait_until(lambda: len(self.with_key(key, value)) >= count and self.with_key(key, value),
                          f"{count} x {key}={value or '*'} on NOTIFY_SOCKET (got {self.messages[-5:]})")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class Fleetd:
    """One fleetd process. Use as a context manager (or `start` / `cleanup`)."""

    def __init__(self, name: str, roles: dict, *, posture: dict | None = None, limits: dict | None = None,
                 args: tuple = (), env: dict | None = None, base_dir: str | None = None, extra: dict | None = None,
                 as_nobody: bool = False, nofile: tuple[int, int] | None = None):
        self.name = name
        self.nofile = nofile  # (soft, hard): fleetd's limit on open files as it starts (prlimit)
        self.as_nobody = as_nobody  # run as uid 65534 (tests.uids): another local user's fleetd
        self.extra = dict(extra or {})  # more config sections (e.g. [store]), written as they are
        self.args = list(args)
        self.dir = base_dir or tempfile.mkdtemp(prefix="fd-", dir="/tmp")  # short: AF_UNIX paths <= 107 bytes
        self._own_dir = base_dir is None
        os.chmod(self.dir, 0o755)  # another uid may need to reach the socket inside
        self.runtime_dir = os.path.join(self.dir, "run")
        self.socket_path = os.path.join(self.runtime_dir, f"{name}.sock")  # its control socket (RUNTIME_DIRECTORY)
        self.config_path = os.path.join(self.dir, "fleet.toml")
        self.write_config(roles, posture=posture, limits=limits)
        # STATE_DIRECTORY: the closure file of the provider admission stays in the test's dir
        self.env = {**os.environ, "RUNTIME_DIRECTORY": self.runtime_dir, "STATE_DIRECTORY": os.path.join(self.dir, "state"),
                    "PYTHONPATH": REPO}
        for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "FLEET_NAME"):
            self.env.pop(key, None)
        self.env.update(env or {})
        # one per instance: a second daemon in the same dir (a restart) has its own
        self.notify = NotifyListener(os.path.join(self.dir, f"notify-{next(_instances)}.sock"))
        self.env["NOTIFY_SOCKET"] = self.notify.path
        if as_nobody:
            self._give_to_nobody()
        self.proc: subprocess.Popen | None = None
        self.stderr_path = os.path.join(self.dir, "fleetd.stderr")
        self.children: set[int] = set()

    # --- config
    def write_config(self, roles: dict, *, posture: dict | None = None, limits: dict | None = None,
                     text: str | None = None) -> None:
        cfg = {"fleet": {"name": self.name}, "roles": roles}
        if posture:
            cfg["posture"] = posture
        if limits:
            cfg["limits"] = limits
        cfg.update(self.extra)
        tmp = self.config_path + ".new"
        with open(tmp, "w") as f:
            f.write(text if text is not None else to_toml(cfg))
        os.replace(tmp, self.config_path)  # a reload never reads half a file

    def _give_to_nobody(self) -> None:
        """What a fleetd of uid 65534 writes: its runtime, state and numba cache dirs, and
        the sd_notify socket it sends to."""
        from tests.uids import NOBODY, NOGROUP

        self.env.setdefault("NUMBA_CACHE_DIR", os.path.join(self.dir, "numba"))
        for path in (self.runtime_dir, self.env["STATE_DIRECTORY"], self.env["NUMBA_CACHE_DIR"]):
            os.makedirs(path, mode=0o755, exist_ok=True)
            os.chown(path, NOBODY, NOGROUP)
        os.chown(self.notify.path, NOBODY, NOGROUP)

    # --- lifecycle
    def start(self, *, wait_ready: bool = True) -> "Fleetd":
        from tests.uids import as_nobody_argv

        self._stderr = open(self.stderr_path, "ab")
        argv = [sys.executable, "-m", "fleet.cli.fleetd", "--config", self.config_path, "--name", self.name,
                *self.args]
        argv = as_nobody_argv(argv) if self.as_nobody else ["setpriv", "--", *argv]
        # A test process that dies without its teardown (pytest-timeout's thread method ends
        # it with os._exit) takes its fleetd along: SIGTERM, so the daemon still drains,
        # reaps its workers and unlinks its segments. setpriv sets it after any change of uid
        # (which would clear it) and execs: the pid stays fleetd's.
        argv.insert(1, "--pdeathsig=TERM")
        if self.nofile is not None:
            argv = ["prlimit", f"--nofile={self.nofile[0]}:{self.nofile[1]}", "--", *argv]  # execs: the pid stays fleetd's
        self.proc = subprocess.Popen(
            argv,
            env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr, cwd=self.dir,
        )
        if wait_ready:
            self.wait_ready()
        return self

    def wait_ready(self, count: int = 1) -> None:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"fleetd exited {self.proc.returncode} before READY=1: {self.stderr()}")
            return len(self.notify.with_key("READY", "1")) >= count

        wait_until(ready, "READY=1")
        self.children |= self.descendants()

    def descendants(self) -> set[int]:
        try:
            return {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = BOUND_S) -> int:
        return self.proc.wait(timeout)

    def stderr(self) -> str:
        with open(self.stderr_path, "rb") as f:
            return f.read().decode(errors="replace")

    def cleanup(self) -> None:
        """Kill whatever of this daemon still runs; remove its directory."""
        if self.proc is not None:
            self.children |= self.descendants()
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(BOUND_S)
            self._stderr.close()
        _reap(self.children)
        self.notify.close()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Fleetd":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()

    # --- talking to it
    def ctl(self, *argv: str, uid: int | None = None) -> subprocess.CompletedProcess:
        """Run ``fleetctl ARGV --name NAME`` as a separate process (as ``uid`` if given)."""
        preexec = None
        if uid is not None:
            def preexec():
                os.setgid(uid)
                os.setgroups([])
                os.setuid(uid)
        return subprocess.run(
            [sys.executable, "-m", "fleet.cli.fleetctl", *argv, "--name", self.name],
            env=self.env, capture_output=True, text=True, timeout=BOUND_S, preexec_fn=preexec, cwd="/",
        )

    def ctl_json(self, *argv: str):
        out = self.ctl(*argv, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def connect(self, **kwargs) -> fleet.Client:
        return fleet.connect(self.name, env=self.env, **kwargs)

    def submitted(self) -> int:
        """Units its ledger counts as submitted (admitted), read over its control socket."""
        with control.ControlClient(self.socket_path) as c:
            return c.call("ledger")["submitted"]


def segments(name: str) -> list[str]:
    return [p for p in os.listdir("/dev/shm") if p.startswith(f"fleet.{name}")]


def remove_segments(name: str) -> None:
    """Remove everything under fleet `name`'s names in /dev/shm -- each kind's plain name and
    its alternates -- whoever made it (a test's leftovers, the plants of a test's other uid):
    `fleet.shm.segments.unlink` removes only what is this uid's and not in use."""
    from fleet.shm.segments import ALTERNATE, SHM_DIR

    plain = f"fleet.{name}"
    for entry in os.listdir(SHM_DIR):
        base = entry.split(ALTERNATE, 1)[0]
        if base == plain or base.startswith(plain + "."):
            where = os.path.join(SHM_DIR, entry)
            if os.path.isdir(where) and not os.path.islink(where):
                shutil.rmtree(where, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(where)


def alive(pids) -> set[int]:
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _reap(pids) -> None:
    deadline = time.monotonic() + 10
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in alive(pids):  # a test that failed may leave one behind: never let it leak
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def running_slot(client) -> dict | None:
    """A census row in state Running, read through the daemon's status op."""
    for row in client.status()["census"]:
        if row.get("state") == "Running":
            return row
    return None


def outcome_of(future, timeout: float = BOUND_S):
    """("solved", value) or (kind, reason) of a settled future."""
    try:
        return "solved", future.result(timeout)
    except fleet.UnitError as exc:
        return exc.outcome.kind, exc.outcome.reason
    except FleetError as exc:
        return "error", type(exc).__name__


@contextmanager
def idle_connections(path, n, uid=None, gid=None, *, send=b""):
    """``n`` connections to ``path`` held open by a forked child (as ``uid`` if given),
    each having sent ``send`` (default nothing) and then nothing more, until the block ends.

    The child raises its own RLIMIT_NOFILE to hold them (the hard limit too, as root).
    Yields how many connects succeeded.
    """
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            os.close(ready_r)
            os.close(go_w)
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            want = n + 64
            if soft < want:
                try:  # root may raise the hard limit too (CI runs as root)
                    resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(want, hard)))
                except (ValueError, OSError):
                    resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
            if uid is not None:
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
            held, connected = [], 0
            for _ in range(n):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.connect(path)  # blocking: waits while the listen backlog is full
                    connected += 1
                    if send:
                        sock.sendall(send)
                except OSError:
                    pass  # not connected; or connected and already refused (busy) before the send
                held.append(sock)
            os.write(ready_w, str(connected).encode())
            os.read(go_r, 1)  # until the parent closes its end
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(go_r)
    try:
        connected = int(os.read(ready_r, 64) or b"0")
        yield connected
    finally:
        os.close(go_w)
        os.close(ready_r)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


class _OneWay:
    """Pickles in the worker, but what it unpickles into (a lock) cannot be pickled
    again: a value that survives only if nobody between worker and client re-pickles it."""

    def __reduce__(self):
        return (threading.Lock, ())


def one_way(unit):
    """A handler (``tests.daemons:one_way``) returning a `_OneWay`."""
    return _OneWay()


@contextmanager
def served_fleetd(prefix: str, roles: dict, **kwargs):
    """A real fleetd under a name unique to this process, for a module's tests to share;
    its table and data segments are unlinked afterwards, even when it never booted."""
    name = unique_name(prefix)
    try:
        with Fleetd(name, roles, **kwargs) as d:
            yield d
    finally:
        segment.unlink(name)
        dataplane.unlink(name)
        remove_segments(name)  # what unlink leaves: a creator killed before it wrote who it is
