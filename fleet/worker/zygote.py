"""The zygote: a single-threaded process that forks the fleet's workers.

Starting a Python worker from scratch costs the interpreter, fleet's own
modules, the transition kernels and the handler modules: a few tenths of a second.
The supervisor cannot fork itself (it is multi-threaded, and embedded in somebody's program), so it starts
this process once; the zygote pays the start-up cost, and every worker — at boot
and at every restart after a death — is a fork of it, ready in milliseconds.

Protocol: JSON lines over a socketpair with the supervisor.
  supervisor -> zygote: {"op": "boot", ...} once, then {"op": "fork", "seat": i, "cpus": [...]}, {"op": "exit"},
                        {"op": "check", "roles": [...], "sys_path": [...]} with a file descriptor passed
                        alongside (SCM_RIGHTS), where the answer goes (`check_handlers`)
  zygote -> supervisor: {"op": "ready", "pid": p, "fleet": the directory fleet was imported from}
                        | {"op": "error", "type": ..., "message": ...}
                        {"op": "forked", "seat": i, "pid": p} | {"op": "exited", "pid": p, "status": s}
The zygote reaps its children and reports each exit, then rings the supervisor's
bell so its loop wakes. It dies with the supervisor (parent-death signal), and its
workers die with it.
"""
from __future__ import annotations

import gc
import importlib
import json
import logging
import math
import os
import selectors
import signal
import socket
import sys

from fleet._root import FLEET_ROOT  # said back at boot: the supervisor checks it runs the same copy

log = logging.getLogger(__name__)


def resolve_handler(spec: str, where: str):
    """'module:function' -> the callable; ConfigError naming the role when it cannot be had."""
    from fleet.rules.errors import ConfigError

    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:  # noqa: BLE001 - any import failure is a config error to report
        raise ConfigError(where, f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        hint = ""
        if module_name == "__main__":
            hint = (f"; define {attr!r} at the top level of the script (outside its "
                    "`if __name__ == \"__main__\":` block), which the workers import as multiprocessing's spawn does")
        raise ConfigError(where, f"{spec!r}: module {module_name!r} has no callable {attr!r}{hint}")
    return fn


#: Most descriptors one message from the supervisor passes (a check's answer channel, the
#: seats' descriptor channels of a batch of forks); it sends no more per write.
MAX_PASSED = 64
#: How long a reload's check of the handlers may take in the fork server (`Zygote.check`):
#: past it the checking process is ended by SIGALRM and the reload is refused. Short: the
#: daemon waits for it before it pings the watchdog again (WatchdogSec=30s pings each 15 s).
#: The supervisor sends it with each check (`fleet.runtime.zygote_link.ZygoteLink.check`).
CHECK_BOUND_S = 10


def resolve_handlers(roles) -> list:
    """Each role's handler (None for a role without one), as boot resolves them: imported,
    callable, an async one only for an I/O-bound role; else the ConfigError naming the role."""
    handlers = [resolve_handler(r.handler, f"roles.{r.name}.handler") if r.handler else None for r in roles]
    for role, handler in zip(roles, handlers):
        check_async_handler(role, handler)
    return handlers


def check_handlers(roles, out) -> None:
    """A reload's check, in a process forked off the fork server: `resolve_handlers` as boot
    does, saying on `out` (a binary stream) which role it is at before each import, then
    the outcome: ``{"ok": true}`` or ``{"ok": false, "type", "message", "path"}``. A line
    per step, so an import that never returns (or ends the process) is named by the last."""
    def say(**msg):
        out.write(json.dumps(msg).encode() + b"\n")
        out.flush()

    try:
        for role in roles:
            if role.handler:
                say(at=f"roles.{role.name}.handler", handler=role.handler)
                resolve_handlers([role])
    except BaseException as exc:  # noqa: BLE001 - any failure is the answer, never this process's end
        say(ok=False, type=type(exc).__name__, message=str(exc), path=getattr(exc, "path", None))
        return
    say(ok=True)


def check_async_handler(role, handler) -> None:
    """An `async def` handler needs an event loop: only I/O-bound roles run one."""
    from fleet.rules.errors import ConfigError
    from fleet.worker.process import is_coroutine_function  # the worker's own rule (no inspect at boot)

    if handler is not None and not role.io_bound and is_coroutine_function(handler):
        raise ConfigError(f"roles.{role.name}.handler",
                          f"{role.handler!r} is an async def handler; declare the role io_bound = true to run it")


class Zygote:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""
        self.children: dict[int, int] = {}  # pid -> seat
        self.checkers: set[int] = set()  # processes checking a reload's handlers (`check`): no worker's
        self.fds: list[int] = []  # descriptors passed with messages not yet read (a check's answer)
        self.table = self.data = self.roles = None
        self.handlers: list = []
        self.worker_nice: int | None = None
        self.setup = None  # fleet.worker.prepare.WorkerSetup
        self.name = ""  # the fleet's
        self.seat_names: list[str] = []  # each seat's, as status shows it (fleet.rules.titles)
        self.init = None  # the initializer each worker calls first, (callable, args)
        self.seat_workers: list = []  # each seat's fleet.worker.process.Worker, made at boot, run by its forks

    def send(self, **msg) -> None:
        self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def read_messages(self) -> list | None:
        """Every complete message received so far (None once the supervisor is gone).
        Reads what the socket has; several messages may arrive in one read."""
        chunk, fds, _flags, _addr = socket.recv_fds(self.sock, 65536, MAX_PASSED)
        self.fds.extend(fds)
        if not chunk:
            return None
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return [json.loads(line) for line in lines if line]

    def read_one(self) -> dict:
        """Block for the next message (boot time only)."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                return {}
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def boot(self, msg: dict) -> None:
        from fleet.rules.roles import Role, RoleSet
        from fleet.shm.table import SlotTable
        from fleet.shm.dataplane import DataSegment

        from fleet.host.proctitle import name_process
        from fleet.rules import titles
        from fleet.worker.prepare import WorkerSetup, prepare_zygote

        self.name = msg["name"]
        name_process(titles.fork_server(self.name))
        sys.path[:] = msg["sys_path"]
        # The environment the workers (and whatever they start) inherit is the caller's:
        # the PYTHONPATH this process was started with put fleet's root first for its own
        # start only.
        if "pythonpath" in msg:
            if msg["pythonpath"] is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = msg["pythonpath"]
        self.worker_nice = msg.get("worker_nice")
        self.setup = WorkerSetup.from_boot(msg.get("workers"))
        self.init = prepare_zygote(self.setup)  # the main module first: handlers and pickles may name it
        self.roles = RoleSet(tuple(Role(**r) for r in msg["roles"]))
        self.handlers = resolve_handlers(self.roles)
        preload_io(self.roles)
        self.table = SlotTable.attach(msg["name"])
        self.seat_names = [seat["name"] for seat in self.table.meta.get("seats", ())]
        self.table.load_kernels()  # once, here, for every fork to inherit
        self.data = DataSegment.attach(msg["name"])
        # Each seat's Worker, made here before any fork rather than in each worker after
        # its own: what it allocates (its rings, locks, books) would land in free blocks
        # spread over pages still shared with this process, each write copying a page
        # (~0.5 MiB of a worker's own memory). The zygote never runs them; each fork runs
        # its copy, as pristine at a seat's re-fork as at its first.
        from fleet.worker.process import Worker

        if not self.setup.lend:  # service mode: each worker takes payloads' memfds (fleet.shm.handoff)
            import fleet.shm.handoff  # noqa: F401 - imported for every fork to inherit
        self.seat_workers = [Worker(seat, self.table, self.data, self.roles, self.handlers,
                                    max_tasks=self.setup.max_tasks, init=self.init,
                                    lend=self.setup.lend)
                             for seat in range(self.data.n_seats)]
        # Everything imported so far (numba, the handlers' modules) lives as long as the
        # process: out of the collector's sight, a worker's full collections walk only
        # what it made itself (and forked pages stay shared, untouched by the collector).
        # `settle` froze the preloads' before the boot message: this one walks only what
        # boot made since.
        settle()

    def rehearse(self) -> None:
        """A worker's loop run here over scratch memory before the first fork
        (`fleet.worker.rehearsal`: why), once the supervisor has this process's `ready`:
        its turnaround to the first forks (reading the answer, sending the forks) runs
        meanwhile, so the rehearsal's ~0.7 ms is mostly off the first result's path. One that
        fails costs the workers some memory, never their start: it is logged and the forks
        go on. Its garbage (the scratch Worker's cycles) is collected here, not in each fork."""
        try:
            from fleet.worker import rehearsal

            rehearsal.rehearse(self.name, lend=self.setup.lend)
        except Exception:  # noqa: BLE001 - an unrehearsed worker is a whole worker
            log.warning("the workers' rehearsal failed; they start without it", exc_info=True)
        settle()

    def fork(self, seat: int, cpus, channel: int | None = None) -> int:
        """Fork the worker of `seat`, pinned to `cpus`; ``channel``: its end of the seat's
        descriptor channel (`fleet.shm.handoff`: service mode), the worker's alone after."""
        zygote = os.getpid()
        try:
            pid = os.fork()
        except BaseException:
            if channel is not None:
                os.close(channel)
            raise
        if pid == 0:
            from fleet.rules.errors import EXIT_WORKER_BROKEN

            code = EXIT_WORKER_BROKEN
            try:
                from fleet.worker.process import Worker, child_setup

                self.sock.close()
                self._close_passed()
                child_setup(cpus, self.worker_nice, self._title(seat))
                if os.getppid() != zygote:
                    os._exit(1)  # the zygote died before our death signal was armed: never an orphan
                worker = self.seat_workers[seat] if seat < len(self.seat_workers) else Worker(
                    seat, self.table, self.data, self.roles, self.handlers, max_tasks=self.setup.max_tasks,
                    init=self.init, lend=self.setup.lend)
                if channel is not None:
                    from fleet.shm.handoff import Inbox
                    from fleet.worker import codec

                    codec.set_inbox(Inbox(socket.socket(fileno=channel)))
                code = worker.run()
            except BaseException:  # noqa: BLE001 - a crashing worker must still exit, never return here
                logging.getLogger("fleet.worker.process").exception("worker for seat %d crashed", seat)
            finally:
                _flush_std()  # what its units printed is theirs: os._exit would drop it
                os._exit(code)
        if channel is not None:
            os.close(channel)
        self.children[pid] = seat
        return pid

    def check(self, msg: dict, fd: int | None) -> None:
        """A reload's check of its roles' handlers, answered on `fd` (`check_handlers`), in a
        process forked off this one: what a worker would inherit is here (the main module,
        sys.path, the modules imported), while an import's top-level code (which may hang,
        exit or leave state behind) runs where nothing a worker inherits can see it, bounded
        by `CHECK_BOUND_S`. The checker is reaped here and reported to nobody."""
        if fd is None:
            log.warning("fork server: a handler check came without its answer channel")
            return
        pid = os.fork()
        if pid == 0:
            try:
                from fleet.host.proctitle import name_process
                from fleet.rules import titles

                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                self.sock.close()
                self._close_passed()
                name_process(titles.fork_server_check(self.name))
                # SIGALRM's default ends a check that runs past its bound (whole seconds, at least 1)
                signal.alarm(max(1, math.ceil(msg.get("bound_s") or CHECK_BOUND_S)))
                from fleet.rules.roles import Role, RoleSet

                sys.path[:] = msg.get("sys_path") or sys.path
                with os.fdopen(fd, "wb") as out:
                    check_handlers(RoleSet(tuple(Role(**r) for r in msg["roles"])), out)
            finally:
                _flush_std()
                os._exit(0)
        os.close(fd)
        self.checkers.add(pid)

    def _close_passed(self) -> None:
        """In a child: close the answer channels of checks not yet made, so that a check's
        asker sees its channel end when its own checker does, not when some worker exits."""
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()

    def _title(self, seat: int):
        from fleet.rules import titles

        name = self.seat_names[seat] if seat < len(self.seat_names) else f"seat-{seat}"
        return titles.worker(self.name, name)

    def reap(self) -> None:
        while self.children or self.checkers:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.checkers:
                self.checkers.discard(pid)
                continue
            self.children.pop(pid, None)
            self.send(op="exited", pid=pid, status=os.waitstatus_to_exitcode(status))
            self.tell()

    def tell(self) -> None:
        """Wake the supervisor's loop for an event just sent: news first, then the bell."""
        self.data.zygote_news.bump()
        self.data.bell.ring()

    def handle(self, msgs: list) -> int | None:
        """Act on a batch of messages, in order; 0 once one asks this process to exit.
        The forks of a batch are made first and reported after (`_tell_forked`)."""
        forked = []
        for msg in msgs:
            if msg["op"] == "fork":
                channel = self.fds.pop(0) if msg.get("channel") and self.fds else None
                forked.append((msg["seat"], self.fork(msg["seat"], msg.get("cpus"), channel)))
                continue
            self._tell_forked(forked)
            if msg["op"] == "check":
                self.check(msg, self.fds.pop(0) if self.fds else None)
            elif msg["op"] == "exit":
                return 0
        self._tell_forked(forked)
        return None

    def _tell_forked(self, forked: list) -> None:
        """Report the forks made (and empty `forked`), then ring once. A batch's forks come
        first, their reports after: a page this process writes between two forks is copied
        for it, and the original is left to the earlier worker alone, its own memory."""
        if forked:
            for seat, pid in forked:
                self.send(op="forked", seat=seat, pid=pid)
            forked.clear()
            self.tell()

    def serve(self) -> int:
        rsig, wsig = os.pipe()
        os.set_blocking(wsig, False)
        os.set_blocking(rsig, False)
        signal.set_wakeup_fd(wsig)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the wakeup fd
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ, "sock")
        sel.register(rsig, selectors.EVENT_READ, "sig")
        while True:
            for key, _ in sel.select():
                if key.data == "sig":
                    os.read(rsig, 4096)
                    self.reap()
                    continue
                msgs = self.read_messages()
                if msgs is None:
                    return 0  # the supervisor is gone
                if self.handle(msgs) is not None:
                    return 0
            self.reap()  # a SIGCHLD may have raced the registration


def preload_kernels() -> None:
    """Load the transition kernels (fleet.shm.table.kernel_load): the ones built at
    install, a ~1 ms import (no numpy); without them numba's, compiled or from its cache
    (~0.3-0.5 s). It needs nothing of the boot message, so it runs while the supervisor
    loads its own copy, and the table attached at boot finds them loaded. A failure here
    is left to boot, which loads them again and reports it."""
    try:
        from fleet.shm.table import kernel_load

        kernel_load.load()
    except Exception:  # noqa: BLE001 - boot's own load says what is wrong
        pass


def preload_worker() -> None:
    """Import what a worker runs (fleet.worker.process: its loop; what its set-up after
    the fork calls: fleet.host.priority; `preload_io` adds asyncio for I/O-bound roles) here,
    once, before any fork: imported after the fork, each worker would hold its own copy
    of those modules' objects (~7 MiB of USS a worker), and even one small module
    imported there costs ~1 MiB (the import machinery's own objects and caches it
    writes, pages shared with the zygote until then)."""
    import fleet.host.priority  # noqa: F401 - child_setup's; imported for every fork to inherit
    import fleet.worker.process  # noqa: F401 - imported for every fork to inherit
    # and what the boot message's preparation runs (fleet.worker.prepare.prepare_zygote
    # imports the main module as multiprocessing's spawn does): here, while the supervisor
    # makes its table, rather than once the boot message has come
    import multiprocessing.spawn  # noqa: F401


def preload_io(roles) -> None:
    """What a seat with I/O slots runs (asyncio, its event loop, the I/O runner:
    `fleet.worker.process.IO_MODULES`), imported before any fork when a role is I/O-bound,
    for the reason `preload_worker` gives. Not for the others: asyncio is ~25 ms of
    the zygote's start, and the Executor's roles are CPU-bound."""
    if any(role.io_bound for role in roles):
        from fleet.worker.process import IO_MODULES

        for name in IO_MODULES:
            importlib.import_module(name)


#: The block `warm_allocator` makes and frees once, before any fork.
WARM_ALLOCATOR_BYTES = 8 << 20


def warm_allocator() -> None:
    """Set glibc's malloc where a worker that moves large values needs it, once, for every
    fork to inherit. glibc maps a block above its mmap threshold (128 KiB at start) on its
    own and unmaps it when freed, then raises the threshold to that block's size (and the
    heap's trim threshold to twice that). A worker that starts from the defaults maps,
    faults in and unmaps every payload of a few MiB, or grows and trims its heap around
    them: ~100 page faults per 1 MiB unit, against ~6 once warm (a quarter of a map of
    1 MiB `bytes` went to it). One block of 8 MiB made and freed here (`calloc`'s fresh
    mapping: no page touched) leaves the thresholds at 8 and 16 MiB, where glibc itself
    would settle after such a block; larger ones still raise them, as glibc does."""
    block = bytes(WARM_ALLOCATOR_BYTES)
    del block


def settle(collect: bool = True) -> None:
    """Collect, then put what is alive out of the collector's sight (`gc.freeze`): at
    boot's end, where the collection walks only what boot made (the main module, the
    handlers' modules: a few ms, not ~20). At the preloads' end without the collection:
    what they leave for it is fleet's and the standard library's (~180 objects, a few
    KiB, measured), and the ~3 ms it took are on the first result's path (the fork server
    is its critical path: docs/executor.md, "What a boot costs")."""
    if collect:
        gc.collect()
    gc.freeze()


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed or replaced stream: nothing to keep
            pass


#: The fork server's command line, which only its supervisor writes (`zygote_link`).
USAGE = ("usage: python -m fleet.worker.zygote --fd FD --parent PID [--nofile N]\n"
         "Fork server for fleet workers (internal: started by its supervisor).\n"
         "  --fd FD       the socketpair end inherited from the supervisor\n"
         "  --parent PID  the supervisor's pid\n"
         "  --nofile N    the soft limit on open files for this process and its workers (fleet.host.open_files)")


def _usage_error(message: str):
    sys.stderr.write(f"{USAGE}\nfleet.worker.zygote: error: {message}\n")
    raise SystemExit(2)


def parse_args(argv: list[str]) -> dict:
    """``{"fd", "parent", "nofile"}`` from the command line (`USAGE`); SystemExit(2) naming
    what is wrong, as argparse's. Parsed by hand: argparse (with gettext, and shutil with
    the compression modules, for its help's width) is ~8 ms of the fork server's start,
    which the first result waits for."""
    args: dict = {"fd": None, "parent": None, "nofile": None}
    words = list(argv)
    while words:
        word = words.pop(0)
        if word in ("-h", "--help"):
            print(USAGE)
            raise SystemExit(0)
        name, eq, value = word.partition("=")
        key = name[2:] if name.startswith("--") else None
        if key not in args:
            _usage_error(f"unrecognized argument {word!r}")
        if not eq:
            if not words:
                _usage_error(f"{name} expects a number")
            value = words.pop(0)
        try:
            args[key] = int(value)
        except ValueError:
            _usage_error(f"{name} expects a number, got {value!r}")
    missing = [f"--{k}" for k in ("fd", "parent") if args[k] is None]
    if missing:
        _usage_error(f"{' and '.join(missing)} required")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args["nofile"] is not None:  # fleetd raised its own: user code gets the limit fleetd found
        from fleet.host import open_files

        open_files.restore_soft(args["nofile"])
    # No collections while it loads and boots (~100k objects, all kept: numpy, the kernels,
    # fleet's modules, the handlers'), but the full one of each `settle`; on again before the
    # first fork, so every worker runs with the collector on (fleet.runtime.collector says more).
    gc.disable()
    from fleet._native import lib

    lib.fleet_set_pdeathsig(signal.SIGKILL)
    if os.getppid() != args["parent"]:
        return 1  # the supervisor died before the death signal was armed
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=args["fd"])
    zygote = Zygote(sock)
    preload_kernels()  # while the supervisor loads its own: its boot message comes after
    preload_worker()
    warm_allocator()
    settle(collect=False)
    boot = zygote.read_one()
    if boot.get("op") != "boot":
        return 0  # launched, then stopped before its boot (the supervisor's boot failed)
    logging.basicConfig(level=boot.get("log_level", logging.WARNING), format="%(asctime)s %(name)s %(message)s")
    try:
        zygote.boot(boot)
    except BaseException as exc:  # noqa: BLE001 - report any boot failure to the supervisor
        zygote.send(op="error", type=type(exc).__name__, message=str(exc), path=getattr(exc, "path", None))
        return 1
    gc.enable()
    zygote.send(op="ready", pid=os.getpid(), fleet=FLEET_ROOT)  # the supervisor checks it runs the same copy
    zygote.rehearse()
    code = zygote.serve()
    # Served (asked to exit, or the supervisor is gone): it ends as its workers do, without
    # the interpreter's finalization (the teardown of every module it loaded, numpy's
    # included, and a collection of them all: 30-60 ms a supervisor's shutdown waited for).
    # What it printed goes out first; it holds nothing else to flush or remove.
    _flush_std()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
