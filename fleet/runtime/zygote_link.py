"""The supervisor's end of the zygote: starting it, its protocol, fork requests, and
noticing its death (the zygote's own end is fleet.worker.zygote, which documents the
protocol: JSON lines over a socketpair).

A boot launches the zygote first thing (`fleet.runtime.zygote_launch`, which imports
next to nothing), before the supervisor imports its runtime, this module included;
`ZygoteLink.adopt` takes that process over. `ZygoteLink.start` (a zygote started
again) launches `python -m fleet.worker.zygote` the same way, sends the boot message and
waits for `ready` (a handler that cannot be imported comes back as the ConfigError
naming the role). After boot the socket is non-blocking: `fork(seat, cpus)` asks
for a worker, `read()` returns the `Forked` and `Exited` events received so far
(None once the zygote is gone), `exit()` asks it to stop and waits for it, `kill()`
ends one that stopped answering. No send waits longer than `answer_s`: a stopped
zygote that reads nothing never blocks the supervisor's loop.
`check(roles)` asks it to check a reload's handlers as its boot resolved them, answered
on a channel of its own that `await_check` reads on any thread.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import socket
import subprocess
import sys
import time

from fleet.rules.errors import BootRefused, ConfigError, UnguardedMain
from fleet.runtime.zygote_launch import FLEET_ROOT, Launched, spawn
from fleet.worker import zygote as _zygote

log = logging.getLogger(__name__)

#: How long boot waits for the zygote to import handlers and load kernels.
BOOT_TIMEOUT_S = 120.0



class WorkerStartError(BootRefused):
    """The worker fork server could not start (it says why)."""


#: The zygote forked the worker of `seat`.
Forked = collections.namedtuple("Forked", "seat pid")
#: A worker exited (status: exit code, or minus the signal that killed it).
Exited = collections.namedtuple("Exited", "pid status")


def _role_doc(role) -> dict:
    """A role (`fleet.rules.roles.Role`) as the zygote's messages carry it."""
    from admission.records import asdict  # here: the launch, before the runtime's imports, does without it

    return asdict(role)


class ZygoteLink:
    """One running zygote, from the supervisor's side."""

    def __init__(self, proc: subprocess.Popen, sock: socket.socket, answer_s: float = 5.0):
        self._proc = proc
        self._sock = sock
        self._buf = b""
        self.answer_s = answer_s  # longest a send may wait (a zygote that reads nothing)

    @property
    def pid(self) -> int:
        return self._proc.pid

    # --- start -------------------------------------------------------------------------
    @classmethod
    def start(cls, name: str, roles, spawner, worker_nice: int | None = None, workers=None,
              answer_s: float = 5.0, place=None) -> "ZygoteLink":
        """Start a zygote for fleet `name` and boot it with `roles`; its workers run at
        `worker_nice` (None: the zygote's own; see fleet.host.priority), set up as
        `workers` says (a `fleet.worker.prepare.WorkerSetup`; None: nothing more).

        `spawner` is a one-thread executor that lives as long as the fleet: the
        zygote's parent-death signal fires when the *thread* that started it exits,
        so it must not be whichever caller thread booted the fleet.

        Raises:
            ConfigError: a role's handler cannot be imported (named by its path).
            WorkerStartError: the zygote failed, exited or did not answer in time.
        """
        link = cls.launch(spawner, answer_s, place)
        link.boot(name, roles, worker_nice, workers)
        return link

    @classmethod
    def launch(cls, spawner, answer_s: float = 5.0, place=None) -> "ZygoteLink":
        """Start the zygote process, not yet booted (`boot`): `fleet.runtime.zygote_launch.spawn`."""
        proc, sock = spawn(spawner, place)
        return cls(proc, _wrapped(sock), answer_s)

    @classmethod
    def adopt(cls, launched: Launched, answer_s: float = 5.0) -> "ZygoteLink":
        """The link to a zygote launched ahead of the runtime (`fleet.runtime.zygote_launch.launch`),
        not yet booted. From here on the link's socket is the one `launched.stop` closes."""
        launched.sock = sock = _wrapped(launched.sock)  # one object owns the descriptor
        return cls(launched.proc, sock, answer_s)

    def boot(self, name: str, roles, worker_nice: int | None = None, workers=None, meanwhile=None) -> None:
        """Boot a launched zygote with `roles` (see `start`); on any failure it is stopped.
        `meanwhile()`, when given, runs once the boot message is sent, while the zygote boots."""
        try:
            self._boot(name, roles, worker_nice, workers, meanwhile)
        except BaseException:
            self.exit(timeout=0.5)
            raise

    def _boot(self, name: str, roles, worker_nice: int | None, workers=None, meanwhile=None) -> None:
        boot = {
            "op": "boot",
            "name": name,
            "worker_nice": worker_nice,
            "roles": [_role_doc(r) for r in roles],
            "sys_path": list(sys.path),
            "pythonpath": os.environ.get("PYTHONPATH"),  # zygote_env's is for the zygote's own start
            "log_level": logging.getLogger("fleet").getEffectiveLevel(),
            "workers": None if workers is None else workers.to_boot(),
        }
        self._sock.sendall(json.dumps(boot).encode() + b"\n")
        if meanwhile is not None:
            meanwhile()
        reply = self._reply(time.monotonic() + BOOT_TIMEOUT_S)
        if reply.get("op") == "error":
            if reply.get("path"):
                raise ConfigError(reply["path"], reply["message"].split(": ", 1)[-1])
            if reply.get("type") == UnguardedMain.__name__:  # the main module makes a fleet at its top level
                raise UnguardedMain(reply.get("message"))
            raise WorkerStartError(f"worker fork server failed to boot: {reply.get('type')}: {reply.get('message')}")
        if reply.get("op") != "ready":
            raise WorkerStartError(f"worker fork server said {reply!r} at boot")
        theirs = reply.get("fleet")
        if theirs is None or os.path.realpath(theirs) != os.path.realpath(FLEET_ROOT):
            raise WorkerStartError(f"worker fork server imports fleet from {theirs!r}, "
                                   f"this process from {FLEET_ROOT!r}: they must run one copy")
        self._sock.setblocking(False)

    def _reply(self, deadline: float) -> dict:
        self._sock.settimeout(max(0.0, deadline - time.monotonic()))
        while b"\n" not in self._buf:
            try:
                chunk = self._sock.recv(65536)
            except TimeoutError:
                raise WorkerStartError("worker fork server did not answer in time") from None
            except ConnectionError:  # it died with our boot message unread: a reset, not an end of file
                chunk = b""
            if not chunk:
                raise WorkerStartError(f"worker fork server exited at boot (code {self._proc.wait()})")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    # --- running -----------------------------------------------------------------------
    def fork(self, seat: int, cpus) -> None:
        """Ask for a worker for `seat`, pinned to `cpus` (answered by a `Forked` event)."""
        self.fork_many([(seat, cpus)])

    def fork_many(self, forks, channels=None) -> None:
        """Ask for a worker for each ``(seat, cpus)`` of `forks`, in one write: the zygote
        reads them as one batch, and makes a batch's forks before it reports any
        (`fleet.worker.zygote.Zygote.handle`: its own writes between two forks would be
        the earlier worker's own memory). ``channels``: each fork's end of its seat's
        descriptor channel (`fleet.shm.handoff`), passed along (SCM_RIGHTS), in order;
        the caller keeps its copies until each worker is forked (a fork asked again of a
        new zygote passes the same ends)."""
        try:
            if channels is None:
                self._send(*({"op": "fork", "seat": seat, "cpus": list(cpus)} for seat, cpus in forks))
            else:
                # at most MAX_PASSED descriptors a write: the zygote takes as many with one read
                for at in range(0, len(forks), _zygote.MAX_PASSED):
                    part = range(at, min(at + _zygote.MAX_PASSED, len(forks)))
                    self._send(*({"op": "fork", "seat": forks[i][0], "cpus": list(forks[i][1]), "channel": True}
                                 for i in part), fds=[channels[i].fileno() for i in part])
        except OSError as exc:
            # The zygote is gone (its end of the socket closed under us). The next read
            # says so, and the supervisor forks every seat again, these ones included.
            log.warning("cannot ask the worker fork server for seat(s) %s: %s", [seat for seat, _ in forks], exc)

    def read(self, block_until: float | None = None) -> list | None:
        """The events received so far; None when the zygote is gone.

        With `block_until` (a time.monotonic deadline), waits for at least one event.

        Raises:
            WorkerStartError: nothing came before `block_until`.
        """
        while b"\n" not in self._buf:
            try:
                if block_until is not None:
                    self._sock.settimeout(max(0.001, block_until - time.monotonic()))
                chunk = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return []
            except TimeoutError:
                raise WorkerStartError("worker fork server did not fork the workers in time") from None
            except ConnectionError:
                # A zygote killed with our fork requests unread resets the socket
                # instead of closing it: it is gone all the same.
                return None
            finally:
                if block_until is not None:
                    self._sock.setblocking(False)
            if not chunk:
                return None
            self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        return [e for e in map(_event, lines) if e is not None]

    def check(self, roles) -> socket.socket:
        """Ask the zygote to check `roles`' handlers as its boot resolved them (importable,
        callable, an async one only on an I/O-bound role: `fleet.worker.zygote.check_handlers`);
        returns the end of the channel its answer comes on, for `await_check`, which may run
        on another thread: only the request goes over the link. The link's owner calls it.

        Raises WorkerStartError when the zygote cannot be asked (it is gone)."""
        ours, theirs = socket.socketpair()
        msg = {"op": "check", "roles": [_role_doc(r) for r in roles], "sys_path": list(sys.path),
               "bound_s": _zygote.CHECK_BOUND_S}
        try:
            self._send(msg, fds=[theirs.fileno()])
        except OSError as exc:
            ours.close()
            raise WorkerStartError(f"the worker fork server cannot check the handlers: {exc}") from None
        finally:
            theirs.close()
        return ours

    def wait(self) -> int:
        """The zygote's exit code (it is gone or going)."""
        return self._proc.wait()

    def exit(self, timeout: float = 5.0) -> None:
        """Ask the zygote to exit; kill it if it has not within `timeout`. Idempotent."""
        try:
            self._send({"op": "exit"})
        except OSError:
            pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self._sock.close()

    def close(self) -> None:
        """Close this end of the link (the zygote is gone: `exit`, `kill`)."""
        self._sock.close()

    def kill(self) -> None:
        """SIGKILL the zygote (stopped or not) and reap it; its workers die with it."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()

    def _send(self, *msgs: dict, fds=()) -> None:
        """Send `msgs` in one write, `fds` passed with its first bytes (SCM_RIGHTS), waiting
        at most `answer_s` for room (OSError past that)."""
        data = b"".join(json.dumps(msg).encode() + b"\n" for msg in msgs)
        self._sock.settimeout(self.answer_s)
        try:
            sent = socket.send_fds(self._sock, [data], fds) if fds else 0
            if sent < len(data):
                self._sock.sendall(data[sent:])
        finally:
            self._sock.setblocking(False)


def await_check(sock: socket.socket, bound_s: float | None = None) -> None:
    """Read the zygote's answer to `ZygoteLink.check` (closing `sock`): None when every
    handler resolves; else the ConfigError naming the role, as boot would raise it. An
    answer that never comes (an import that hangs past the checker's bound or ends its
    process, a fork server that does not answer within `bound_s`, by default a little past
    the checker's) is a ConfigError naming the role being imported then, or
    WorkerStartError when none was."""
    checker_s = _zygote.CHECK_BOUND_S
    bound_s = checker_s + 5.0 if bound_s is None else bound_s
    deadline = time.monotonic() + bound_s
    buf, at, answer = b"", None, None
    with sock:
        while answer is None:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionError):
                chunk = b""
            *lines, buf = (buf + chunk).split(b"\n")
            for line in map(json.loads, filter(None, lines)):
                if "ok" in line:
                    answer = line
                else:
                    at = line
            if not chunk and answer is None:
                break
    if answer is None:
        if at is None:
            raise WorkerStartError(f"the worker fork server gave no answer to the handler check (it is gone, "
                                   f"or did not answer within {bound_s:g} s)")
        raise ConfigError(at["at"], f"importing {at['handler']!r} in the worker fork server did not finish: "
                                    f"it ended the process or ran past {checker_s:g} s")
    if not answer["ok"]:
        if answer.get("path"):
            raise ConfigError(answer["path"], answer["message"].split(": ", 1)[-1])
        raise ConfigError(at["at"] if at else "roles", f"{answer['type']}: {answer['message']}")


def _wrapped(sock) -> socket.socket:
    """The launch's raw ``_socket.socket`` (`fleet.runtime.zygote_launch`) as a
    `socket.socket`: the same descriptor, which the raw object no longer owns."""
    return sock if isinstance(sock, socket.socket) else socket.socket(fileno=sock.detach())


def _event(line: bytes):
    msg = json.loads(line)
    if msg["op"] == "forked":
        return Forked(msg["seat"], msg["pid"])
    if msg["op"] == "exited":
        return Exited(msg["pid"], msg["status"])
    return None
