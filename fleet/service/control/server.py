"""`ControlServer`: serves the control protocol on a Unix stream socket from one
thread (admission of connections by uid, frame deadlines, replies in order)."""
from __future__ import annotations

import array
import collections
import errno
import logging
import os
import selectors
import socket
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from pathlib import Path
from typing import Any

from admission.records import field, record
from fleet.host import affinity
from fleet.host.proctitle import name_thread
from fleet.rules import titles
from fleet.rules.errors import FleetError
from fleet.service.control import fds as fdpass
from fleet.service.control.calls import Answered, Call, Peer
from fleet.service.control.errors import (
    E_BUSY,
    E_INTERNAL,
    E_INVALID_ARGS,
    E_MALFORMED,
    E_OUTCOME_UNKNOWN,
    E_PERMISSION,
    E_SHUTTING_DOWN,
    E_TIMEOUT,
    E_TOO_LARGE,
    ControlError,
    ProtocolError,
    ShuttingDown,
)
from fleet.service.control.ops import COLLECT_REPLY_BUDGET, OPS, OpRegistry
from fleet.service.control.wire import MAX_FRAME, decode_request, encode_error, encode_reply


log = logging.getLogger(__name__)

#: How long a connection may take to send a complete frame: from accept until its
#: first frame ends, and from a frame's first byte until its newline. Every client
#: writes a request at once, so only a stalled or hostile peer ever reaches this.
FRAME_TIMEOUT_S = 10.0
#: How long a reply may sit unsent because the peer does not read it.
WRITE_TIMEOUT_S = 30.0
#: Reply bytes waiting for the peer beyond which no further request of that
#: connection is read: a peer that never reads its replies holds one reply, no more.
_WRITE_HIGH = 64 * 1024
#: Room beyond `_WRITE_HIGH` that pushes may take before a streaming connection's requests
#: are held back: a push is made only below the mark, but one may pass it by up to its
#: size (`COLLECT_REPLY_BUDGET` and its envelope), and one more written from another
#: thread meanwhile. Holding requests back for pushes would deadlock a client whose one
#: reader writes its next frame: it reads no push while that write waits on us.
_PUSH_ROOM = 2 * (COLLECT_REPLY_BUDGET + 64 * 1024)
#: At most this many connections are accepted per wake-up, so a connect flood
#: cannot starve the connections already being served.
_ACCEPT_BURST = 64
#: After accept() fails for want of file descriptors, it is retried this much later.
_ACCEPT_PAUSE_S = 0.1
#: Longest the server loop sleeps without a deadline due (it also wakes on I/O).
_TICK_S = 1.0


@record(frozen=False, eq=False)
class _Conn:
    """One accepted connection; owned by the server loop thread."""

    sock: socket.socket
    peer: Peer
    opened: float
    rbuf: bytearray = field(default_factory=bytearray)
    scanned: int = 0  # bytes of rbuf known to hold no newline
    wbuf: bytearray = field(default_factory=bytearray)
    #: Bytes of the connection written to the socket so far (the stream position of wbuf[0]).
    wpos: int = 0
    #: The descriptors of the frames in wbuf that name memfds: (start, end, fds), stream
    #: positions; each goes out with its frame's first bytes, in a message of that frame alone.
    wfds: collections.deque = field(default_factory=collections.deque)
    call: Call | None = None  # the request being answered
    inflight: Future | None = None
    call_deadline: float = 0.0
    spoke: bool = False  # sent at least one complete frame
    frame_deadline: float | None = None  # an incomplete frame must end by then
    last_active: float = 0.0  # last complete frame or reply
    write_stalled_since: float | None = None
    eof: bool = False
    closing: bool = False  # close once wbuf is sent
    events: int = 0  # what the selector watches for it
    stream: "Stream | None" = None  # its push side, made for the first op that streams
    #: Held by every change of wbuf, every write to the socket and its close: a push may
    #: be written from another thread (`Stream.write`). Every frame joins wbuf whole, at
    #: its end, so frames never interleave whichever thread adds them.
    wlock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False
    pulls: collections.deque = field(default_factory=collections.deque)  # pushes asked, not yet written
    closers: list = field(default_factory=list)  # told when it closes (Stream.on_close)
    #: Descriptors received (SCM_RIGHTS) and not yet claimed by a frame, by stream position.
    arrivals: fdpass.Arrivals = field(default_factory=fdpass.Arrivals)

    @property
    def idle(self) -> bool:
        """Nothing asked, nothing owed: closing it loses no request and no reply."""
        return self.inflight is None and not self.wbuf and not self.rbuf


class Stream:
    """The push side of one connection: frames written to it unasked, between its
    replies (the outcomes of a token a ``submit_batch`` v2 attached here,
    `fleet.service.daemon.OutcomeStore.attach`). Any thread may ask for a push
    (`ready`); the control thread, which owns the connection, makes the frame then
    (``pull()``) and writes it, so every record held until that moment rides one frame
    and one wake-up. A peer that does not read its pushes holds at most `_WRITE_HIGH`
    bytes of them here; the rest wait with their owner (``pull`` is called again once
    the peer reads)."""

    __slots__ = ("_server", "_conn")

    def __init__(self, server: "ControlServer", conn: _Conn):
        self._server, self._conn = server, conn

    def ready(self, pull: Callable[[], bytes | None]) -> None:
        """Ask for a push: the control thread calls ``pull`` soon and writes the frame it
        returns (None: nothing). Never called when the connection has closed."""
        self._server._pushes.append((self._conn, pull))
        self._server._wake()

    def write(self, pull: Callable[[], bytes | None]) -> None:
        """Make a push frame (``pull()``) and write it now, from any thread: straight onto the
        socket when nothing else waits to go out on the connection, else after what went
        before (the control thread writes what the socket does not take at once). The frame
        is made and queued under the connection's write lock, so pushes go out in the order
        they were made, whichever thread made them. Nothing when the connection has closed."""
        conn = self._conn
        with conn.wlock:
            if conn.closed:
                return
            data = pull()
            if not data:
                return
            conn.last_active = self._server._clock()
            first = not conn.wbuf
            _queue(conn, data)
            if first:
                try:
                    _send_queued(conn)
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    return  # the peer went away: the control thread sees it and closes
                if not conn.wbuf:
                    return
        self.ready(_NOTHING)  # the control thread writes the rest when the socket takes it

    def room(self) -> bool:
        """Whether a push written now would not pass the connection's high-water mark
        (the peer keeps up); else ask with `ready`, and the control thread makes it when
        the peer has read."""
        conn = self._conn
        return not conn.closed and len(conn.wbuf) < _WRITE_HIGH

    def on_close(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` (on the control thread) when the connection closes. Call it on the
        control thread (from a direct op of this connection)."""
        self._conn.closers.append(fn)


def _NOTHING() -> None:
    """A pull with no frame of its own: the control thread only writes what waits."""
    return None


class _PressureLog:
    """Refused and evicted connections, logged at most once per ``every_s``.

    A flood of connection attempts must not become a flood of log lines: the first
    event logs at once, later ones are counted and summed up in one line per
    interval (by uid). ``clock`` is injected for tests.
    """

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.every_s = every_s
        self._clock = clock
        self._next = 0.0
        self._refused: collections.Counter = collections.Counter()
        self._evicted: collections.Counter = collections.Counter()
        self._last = ""

    def refused(self, peer: Peer, why: str) -> None:
        self._refused[peer.uid] += 1
        self._last = f"uid {peer.uid} pid {peer.pid}: {why}"
        self.flush()

    def evicted(self, peer: Peer) -> None:
        self._evicted[peer.uid] += 1
        self.flush()

    def flush(self) -> None:
        """Log what was counted, if the interval allows."""
        if not (self._refused or self._evicted):
            return
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self.every_s
        parts = []
        if self._refused:
            parts.append(f"refused {sum(self._refused.values())} connection(s) as busy "
                         f"({_by_uid(self._refused)}; last: {self._last})")
        if self._evicted:
            parts.append(f"closed {sum(self._evicted.values())} idle connection(s) to make room "
                         f"({_by_uid(self._evicted)})")
        log.warning("control socket under pressure: %s", "; ".join(parts))
        self._refused.clear()
        self._evicted.clear()


def _by_uid(counts: collections.Counter) -> str:
    return ", ".join(f"uid {uid}: {n}" for uid, n in counts.most_common())


class ControlServer:
    """Serves the control protocol on a Unix stream socket, from one thread.

    One thread multiplexes the listener and every connection (selectors). Each
    request is decoded, its op looked up, the peer's right to run it checked, its
    args validated, and only then handed to ``dispatch`` as a `Call`; the Future it
    returns is not waited on: its completion wakes the loop, which sends the reply.
    So a long poll (``collect``) holds no thread, and one connection never delays
    another. A connection has one request in flight at a time, so replies keep
    request order. Use as a context manager, or `start` / `close`.

    Who gets a connection. At most ``max_connections`` at once; the last
    ``reserved`` of them only the owner uid and root may hold, and any other uid at
    most ``max_per_uid``. A uid at its limit gets room by closing its own longest
    idle connection (one with no request in flight, no partial frame, no reply
    pending): idle sockets never deny service, not even to their own uid. When
    nothing can be closed the new connection gets a ``Busy`` error reply and is
    closed (the client raises `ControlBusy`); refusals are logged, rate-limited.

    Hostile peers. A connection must send a complete frame within
    ``frame_timeout`` of connecting or of starting that frame (a half frame, a
    never-ending line), else it gets a ``Timeout`` error and is closed; a frame over
    ``max_frame`` gets ``FrameTooLarge`` and is closed; a peer that leaves a reply
    unread for ``write_timeout`` is closed, and none of its later requests is read
    meanwhile. Connections idle between requests close after ``idle_timeout``.

    Args:
        path: socket path; its directory must exist (see `prepare_runtime_dir`).
        dispatch: ``Call -> Future`` (normally ``CallQueue.submit``), or the call's
            `calls.Answered` when it ran at once (a direct op's).
        registry: the ops served (default `OPS`).
        group: gid or group name the socket file is given; default the owner's group.
        mode: socket file mode; 0660 lets the group connect and no one else.
        owner_uid: the uid allowed mutating ops besides root; default our euid.
        reply_timeout: seconds a call may take before a ``Timeout`` reply.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        dispatch: Callable[[Call], Future | Answered],
        *,
        registry: OpRegistry = OPS,
        group: int | str | None = None,
        mode: int = 0o660,
        owner_uid: int | None = None,
        reply_timeout: float = 30.0,
        max_frame: int = MAX_FRAME,
        max_connections: int = 256,
        max_per_uid: int = 32,
        reserved: int = 32,
        frame_timeout: float = FRAME_TIMEOUT_S,
        write_timeout: float = WRITE_TIMEOUT_S,
        idle_timeout: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        cpus: Callable[[], tuple[int, ...] | None] | None = None,
    ):
        if max_connections < 1 or max_per_uid < 1 or not 0 <= reserved <= max_connections:
            raise ValueError(
                f"need max_connections >= 1, max_per_uid >= 1 and 0 <= reserved <= max_connections; "
                f"got {max_connections}, {max_per_uid}, {reserved}"
            )
        self.path = Path(path)
        self.dispatch = dispatch
        self.registry = registry
        self.group = group
        self.mode = mode
        self.owner_uid = os.geteuid() if owner_uid is None else owner_uid
        self.reply_timeout = reply_timeout
        self.max_frame = max_frame
        self.max_connections = max_connections
        self.max_per_uid = max_per_uid
        self.reserved = reserved
        self.frame_timeout = frame_timeout
        self.write_timeout = write_timeout
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._cpus = cpus
        self._pinned: tuple[int, ...] | None = None  # where this server's thread was put (None: as inherited)
        self._listener: socket.socket | None = None
        self._inode: tuple[int, int] | None = None
        self._sel: selectors.BaseSelector | None = None
        self._wake_r = self._wake_w = -1
        self._wake_lock = threading.Lock()  # a Future may complete after close(): never write a closed fd
        self._thread: threading.Thread | None = None
        self._conns: set[_Conn] = set()
        self._done: collections.deque[tuple[_Conn, Future]] = collections.deque()
        self._pushes: collections.deque[tuple[_Conn, Callable]] = collections.deque()  # Stream.ready
        self._stopping = threading.Event()
        self._accept_paused_until: float | None = None
        self._emfile_logged = float("-inf")
        self._pressure = _PressureLog(clock=clock)

    # -- lifecycle
    def start(self) -> ControlServer:
        """Bind, set the socket file's mode and group, listen, start the server thread."""
        self._clear_stale()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            listener.bind(str(self.path))
            # Mode and group before listen(): no one can connect until they are right.
            os.chmod(self.path, self.mode)
            if self.group is not None:
                os.chown(self.path, -1, self._gid(self.group))
            st = os.stat(self.path)
            self._inode = (st.st_dev, st.st_ino)
            listener.listen(128)
        except BaseException:
            listener.close()
            self._unlink_own()
            raise
        self._listener = listener
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ, "listener")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._serve, name="fleet-control", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving: cancel calls in flight (answered ``ShuttingDown`` where the peer
        still reads), close every connection, join the thread, unlink the socket."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join()
        with self._wake_lock:
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r = self._wake_w = -1
        self._unlink_own()

    def __enter__(self) -> ControlServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connections(self) -> int:
        """Connections being served now."""
        return len(self._conns)

    def connections_by_uid(self) -> dict[int, int]:
        """Connections being served now, per peer uid."""
        return dict(collections.Counter(c.peer.uid for c in list(self._conns)))

    # -- socket file
    @staticmethod
    def _gid(group: int | str) -> int:
        from fleet.host.groups import resolve_gid

        try:
            return resolve_gid(group)
        except ValueError as exc:
            raise ControlError(f"socket {exc}") from None

    def _clear_stale(self) -> None:
        """Remove a socket left by a dead daemon; refuse to touch a live one or a non-socket."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise ControlError(f"{self.path} exists and is not a socket; not removing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            probe.connect(str(self.path))
        except ConnectionRefusedError:
            os.unlink(self.path)  # nobody listens: a crashed daemon's leftover
            return
        except OSError as exc:
            raise ControlError(f"{self.path}: cannot probe existing socket: {exc}") from exc
        finally:
            probe.close()
        raise ControlError(f"{self.path}: another daemon is serving on this socket")

    def _unlink_own(self) -> None:
        # Only the inode we bound: a successor may already have bound a new one here.
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if self._inode is None or (st.st_dev, st.st_ino) == self._inode:
            os.unlink(self.path)

    # -- the loop
    def _wake(self) -> None:
        with self._wake_lock:
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:
                pass  # the pipe is full: the loop is due to wake anyway

    def _serve(self) -> None:
        assert self._sel is not None
        name_thread(titles.CONTROL_THREAD)  # top -H; and where it runs: `_follow_cpus`
        try:
            while not self._stopping.is_set():
                self._follow_cpus()
                for key, events in self._sel.select(self._sleep_for()):
                    if key.data == "listener":
                        self._accept_burst()
                    elif key.data == "wake":
                        _drain(self._wake_r)
                    else:
                        self._guarded(key.data, self._on_ready, events)
                self._finish_calls()
                self._run_pushes()
                self._expire()
                self._pressure.flush()
        except Exception:  # noqa: BLE001 - logged loudly; close() still cleans up
            log.exception("control server loop failed; no more control requests are served")
        finally:
            self._teardown()

    def _follow_cpus(self) -> None:
        """Run this thread on the CPUs ``cpus()`` names, once they change (None: wherever the
        process may run). fleetd names its supervisor loop's: the reserve the budget sets
        aside for the loop, off the workers' seats. A request's way from this thread to the
        loop is then a hand-over on one CPU, and a worker's CPU is not shared with the
        control plane (measured in docs/internals.md)."""
        if self._cpus is None:
            return
        want = self._cpus()
        if want == self._pinned:
            return
        try:
            os.sched_setaffinity(0, want if want is not None else affinity.process_cpus())
        except OSError as exc:
            log.warning("cannot run the control thread on CPUs %s: %s", list(want or ()), exc)
        self._pinned = want  # tried once per change: a refusal is not logged at every pass

    def _guarded(self, conn: _Conn, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn`` for one connection; a bug or I/O error there closes that one only."""
        try:
            fn(conn, *args)
        except OSError:
            self._drop(conn)  # the peer went away: nothing to answer
        except Exception:  # noqa: BLE001 - one connection's failure must not stop the others
            log.exception("control connection from pid %d failed", conn.peer.pid)
            self._drop(conn)

    def _sleep_for(self) -> float:
        wait = _TICK_S
        now = self._clock()
        if self._accept_paused_until is not None:
            wait = min(wait, self._accept_paused_until - now)
        for conn in self._conns:
            for due in (conn.frame_deadline, conn.call_deadline if conn.inflight is not None else None):
                if due is not None:
                    wait = min(wait, due - now)
        return max(0.0, wait)

    def _teardown(self) -> None:
        for conn in list(self._conns):
            fut = conn.inflight
            if fut is not None and fut.cancel():
                conn.inflight = None
                self._send_now(conn, encode_error(conn.call.request_id, E_SHUTTING_DOWN,
                                                  f"{conn.call.op.name} not executed: the server is closing"))
            self._drop(conn)
        if self._listener is not None:
            self._listener.close()
        if self._sel is not None:
            self._sel.close()

    # -- accepting
    def _accept_burst(self) -> None:
        assert self._listener is not None
        for _ in range(_ACCEPT_BURST):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: the listener stays readable, so stop watching
                    # it for a moment rather than spin.
                    now = self._clock()
                    if now >= self._emfile_logged + self._pressure.every_s:  # not a line per retry
                        log.error("control socket cannot accept: %s; pausing accepts for %gs at a time",
                                  exc, _ACCEPT_PAUSE_S)
                        self._emfile_logged = now
                    self._sel.unregister(self._listener)
                    self._accept_paused_until = self._clock() + _ACCEPT_PAUSE_S
                return
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        try:
            peer = Peer.of(sock)
        except OSError:
            sock.close()
            return
        refusal = self._make_room(peer)
        if refusal is not None:
            self._pressure.refused(peer, refusal)
            try:
                sock.send(encode_error(None, E_BUSY, refusal))
            except OSError:
                pass
            sock.close()
            return
        now = self._clock()
        conn = _Conn(sock, peer, opened=now, last_active=now, frame_deadline=now + self.frame_timeout)
        self._conns.add(conn)
        self._watch(conn)

    def _privileged(self, peer: Peer) -> bool:
        return peer.uid in (0, self.owner_uid)

    def _make_room(self, peer: Peer) -> str | None:
        """None if ``peer`` may have a new connection now (after closing one of its own
        idle ones if need be), else the reason it is refused."""
        mine = [c for c in self._conns if c.peer.uid == peer.uid]
        if self._privileged(peer):
            full = len(self._conns) >= self.max_connections
            why = f"all {self.max_connections} control connections are busy"
        else:
            shared = sum(1 for c in self._conns if not self._privileged(c.peer))
            pool = self.max_connections - self.reserved
            if len(mine) >= self.max_per_uid:
                full, why = True, f"uid {peer.uid} already has {len(mine)} busy control connections (the most one uid may hold)"
            else:
                full, why = shared >= pool, f"all {pool} control connections open to other users are busy"
        if not full:
            return None
        for victim in sorted((c for c in mine if c.idle), key=lambda c: c.last_active):
            # Idle as far as the loop knows; but a request may be waiting unread in
            # its socket (accepted just before this flood): read first, close only
            # a connection that really has nothing to say.
            self._guarded(victim, self._read)
            if victim not in self._conns:
                return None  # it had gone away: that made room
            if victim.idle:
                self._pressure.evicted(victim.peer)
                self._drop(victim)  # frees a place in whichever limit was full: it counted in all
                return None
        return why

    def _resume_accepting(self) -> None:
        assert self._sel is not None and self._listener is not None
        self._accept_paused_until = None
        self._sel.register(self._listener, selectors.EVENT_READ, "listener")

    # -- one connection's I/O
    def _watch(self, conn: _Conn) -> None:
        """Point the selector at what ``conn`` waits for now."""
        assert self._sel is not None
        events = 0
        if not conn.eof and not conn.closing and len(conn.rbuf) <= self.max_frame:
            events |= selectors.EVENT_READ
        if conn.wbuf or (conn.pulls and not conn.closing):
            # Pushes held back while the peer was behind are made once it reads: writable
            # with wbuf empty, `_flush` makes them (whichever path emptied wbuf).
            events |= selectors.EVENT_WRITE
        if events == conn.events:
            return
        if conn.events == 0:
            self._sel.register(conn.sock, events, conn)
        elif events == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _on_ready(self, conn: _Conn, events: int) -> None:
        if events & selectors.EVENT_WRITE:
            self._flush(conn)
        if events & selectors.EVENT_READ and conn in self._conns:
            self._read(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            # Descriptors that come with these bytes wait for the frame holding the last of
            # them (`fds.Arrivals`, `_advance`).
            data = conn.arrivals.recv(conn.sock, 65536, len(conn.rbuf))
        except (BlockingIOError, InterruptedError):
            return
        arrivals = conn.arrivals
        if len(arrivals) > fdpass.MAX_HELD_FDS:
            self._reply(conn, encode_error(None, E_INVALID_ARGS, f"the connection holds {len(arrivals)} file "
                                           f"descriptors no frame has claimed (at most {fdpass.MAX_HELD_FDS})"))
            conn.closing = True
            arrivals.close()
        if data:
            conn.rbuf += data
        else:
            conn.eof = True
        self._advance(conn)

    def _advance(self, conn: _Conn) -> None:
        """Answer the frames ``conn`` sent, one at a time, while nothing is in flight
        and the peer keeps up with its replies."""
        now = self._clock()
        high = _WRITE_HIGH + (_PUSH_ROOM if conn.stream is not None else 0)
        held = consumed = False
        while conn.inflight is None and not conn.closing:
            if len(conn.wbuf) >= high:
                self._send_some(conn)
                if len(conn.wbuf) >= high:
                    held = True
                    break  # the peer does not read: nothing more of it is read until it does
            nl = conn.rbuf.find(b"\n", conn.scanned)
            if nl < 0:
                conn.scanned = len(conn.rbuf)
                if len(conn.rbuf) > self.max_frame:
                    self._reply(conn, encode_error(None, E_TOO_LARGE, f"frame exceeds {self.max_frame} bytes"))
                    conn.closing = True  # the stream cannot be resynced without reading the rest
                elif conn.eof:
                    if conn.rbuf.strip():
                        self._reply(conn, encode_error(None, E_MALFORMED, "connection closed mid-frame (no newline)"))
                    conn.closing = True
                break
            frame = bytes(conn.rbuf[:nl])
            del conn.rbuf[: nl + 1]
            fds = conn.arrivals.take(nl + 1)
            conn.scanned = 0
            conn.spoke = True
            consumed = True
            conn.last_active = now
            self._start(conn, frame, *fds)
            if len(frame) > self.max_frame:
                conn.closing = True  # the reply said FrameTooLarge; that connection is done
        # The deadline for a complete frame: from accept until the first one, and
        # from the first byte of any later one (counted from the end of the frame
        # before it, at the latest). None while its frames wait on us: a peer that does
        # not read its replies meets the write timeout instead.
        tail = len(conn.rbuf) - (conn.rbuf.rfind(b"\n") + 1)
        if held:
            conn.frame_deadline = None
        elif tail:
            if conn.frame_deadline is None or consumed:
                conn.frame_deadline = now + self.frame_timeout
        elif conn.spoke:
            conn.frame_deadline = None
        if conn.wbuf:
            self._send_some(conn)  # one write for the replies of every frame just read
        if conn.closing and not conn.wbuf:
            self._drop(conn)
            return
        self._watch(conn)

    def _reply(self, conn: _Conn, data: bytes) -> None:
        """Queue a reply; `_advance` sends it, with every other reply to the frames of the
        same read, in one write (the caller updates the selector)."""
        with conn.wlock:
            _queue(conn, data)
        conn.last_active = self._clock()

    def _send_some(self, conn: _Conn) -> None:
        with conn.wlock:
            try:
                sent = _send_queued(conn)
            except (BlockingIOError, InterruptedError):
                sent = 0
        if sent or not conn.wbuf:
            conn.write_stalled_since = None
        if conn.wbuf and conn.write_stalled_since is None:
            conn.write_stalled_since = self._clock()

    def _flush(self, conn: _Conn) -> None:
        """EVENT_WRITE: send more; once all is sent, the pushes held back, then the requests."""
        self._send_some(conn)
        if not conn.wbuf and conn.pulls:
            self._push_some(conn)
        if conn.wbuf:
            self._watch(conn)
        else:
            self._advance(conn)

    def _run_pushes(self) -> None:
        """Write the pushes asked since the last pass (`Stream.ready`)."""
        while self._pushes:
            conn, pull = self._pushes.popleft()
            if conn in self._conns:
                conn.pulls.append(pull)
                self._guarded(conn, self._push_some)

    def _push_some(self, conn: _Conn) -> None:
        """Make and write ``conn``'s pushes while the peer keeps up with them."""
        while conn.pulls and len(conn.wbuf) < _WRITE_HIGH and not conn.closing:
            pull = conn.pulls.popleft()
            with conn.wlock:  # made and queued in one hold: pushes keep the order they were made in
                data = pull()
                if data:
                    _queue(conn, data)
                    conn.last_active = self._clock()
        if conn.wbuf:
            self._send_some(conn)
        self._watch(conn)

    def _send_now(self, conn: _Conn, data: bytes) -> None:
        """Best effort, never blocking: a notice sent just before closing."""
        with conn.wlock:
            _queue(conn, data)
            try:
                _send_queued(conn, until_blocked=True)
            except OSError:
                pass

    def _drop(self, conn: _Conn) -> None:
        if conn not in self._conns:
            return
        self._conns.discard(conn)
        if conn.events and self._sel is not None:
            try:
                self._sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        conn.events = 0
        if conn.inflight is not None:
            conn.inflight.cancel()  # not started: it never runs; started: its reply has no reader
            conn.inflight = None
        with conn.wlock:
            conn.closed = True
            conn.sock.close()
            while conn.wfds:
                fdpass.close_all(conn.wfds.popleft()[2])
        conn.arrivals.close()
        conn.pulls.clear()
        closers, conn.closers = conn.closers, []
        for fn in closers:
            try:
                fn()
            except Exception:  # noqa: BLE001 - one owner's fault must not keep the others untold
                log.exception("control connection from pid %d: a close callback failed", conn.peer.pid)

    # -- deadlines
    def _expire(self) -> None:
        now = self._clock()
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._resume_accepting()
        for conn in list(self._conns):
            if conn.inflight is not None and now >= conn.call_deadline:
                self._guarded(conn, self._call_timed_out)
            elif conn.frame_deadline is not None and now >= conn.frame_deadline:
                self._send_now(conn, encode_error(
                    None, E_TIMEOUT, f"no complete request frame within {self.frame_timeout:g}s; closing"))
                self._drop(conn)
            elif conn.wbuf and conn.write_stalled_since is not None \
                    and now - conn.write_stalled_since >= self.write_timeout:
                log.info("control connection from pid %d uid %d closed: it left a reply unread for %gs",
                         conn.peer.pid, conn.peer.uid, self.write_timeout)
                self._drop(conn)
            elif now - conn.last_active >= self.idle_timeout and conn.idle:
                self._drop(conn)

    def _call_timed_out(self, conn: _Conn) -> None:
        fut, call = conn.inflight, conn.call
        conn.inflight = None  # its completion, if it ever comes, is ignored
        if fut.cancel():
            reply = encode_error(call.request_id, E_TIMEOUT, f"{call.op.name} not executed: the daemon's loop "
                                 f"did not take it within {self.reply_timeout:g}s")
        else:
            reply = encode_error(call.request_id, E_OUTCOME_UNKNOWN, f"{call.op.name} still running after "
                                 f"{self.reply_timeout:g}s; its outcome is unknown")
        self._reply(conn, reply)
        if conn in self._conns:
            self._advance(conn)

    # -- requests
    def _start(self, conn: _Conn, frame: bytes, fds: list[int] = (), cut: bool = False) -> None:
        """Check one request frame and dispatch it; errors are answered at once. ``fds``:
        the descriptors that came with it (this call owns them: each is claimed by the
        call, or closed); ``cut``: some were cut on the way (MSG_CTRUNC)."""
        checked = self._check(conn, frame, list(fds), cut)
        if isinstance(checked, bytes):
            self._reply(conn, checked)
            return
        try:
            fut = self.dispatch(checked)
        except Exception as exc:  # noqa: BLE001 - a dispatch bug is this request's InternalError
            _release(checked)
            log.error("dispatching op %s failed", checked.op.name, exc_info=exc)
            self._reply(conn, encode_error(checked.request_id, E_INTERNAL, f"{checked.op.name} failed: "
                                           f"{type(exc).__name__}: {exc}"))
            return
        if checked.held:
            # What the frame's descriptors hold is the op's until its call ends (a direct op's
            # has ended here already: a unit it admitted holds a descriptor of its payload's
            # memfd of its own, `fleet.shm.handoff`).
            fut.add_done_callback(lambda _f, call=checked: _release(call))
        conn.call = checked
        if fut.done():
            # Answered on this thread already (an op that runs here, `Op.direct`): its reply
            # joins the others of this read, with no trip through the wake-up pipe.
            self._reply(conn, self.reply_for(checked, fut))
            return
        conn.inflight = fut
        conn.call_deadline = self._clock() + self.reply_timeout
        # Runs on whichever thread completes the Future (at once if it is done):
        # it only queues the completion and wakes the loop.
        fut.add_done_callback(lambda f, conn=conn: (self._done.append((conn, f)), self._wake()))

    def _check(self, conn: _Conn, frame: bytes, fds: list[int], cut: bool) -> Call | bytes:
        """The validated `Call` for one request frame, or the error reply (every one of
        ``fds`` closed then). Never raises for bad input."""
        rid = None
        held: list = []
        try:
            request = decode_request(frame, max_frame=self.max_frame)
            rid = request.id
            op = self.registry.get(request.op)
            if op.mutating and not self._privileged(conn.peer):
                log.warning(
                    "refused mutating op %s from pid %d uid %d", op.name, conn.peer.pid, conn.peer.uid
                )
                raise ProtocolError(
                    E_PERMISSION,
                    f"op {op.name!r} changes the fleet; only uid {self.owner_uid} or root may run it "
                    f"(you are uid {conn.peer.uid})",
                )
            args = op.validate(request.args)
            if cut or len(fds) > fdpass.MAX_FRAME_FDS:
                raise fdpass.refused(f"{op.name}: a frame carries at most {fdpass.MAX_FRAME_FDS} file "
                                     f"descriptors; this one brought {len(fds)}{' and more, cut' if cut else ''}")
            claimed, fds = fds, []  # the op's now: each is mapped (in held) or closed by it
            held = op.take_fds(args, claimed)
        except ProtocolError as exc:
            return encode_error(exc.request_id if rid is None else rid, exc.code, exc.message)
        finally:
            fdpass.close_all(fds)
        if op.streams and conn.stream is None:
            conn.stream = Stream(self, conn)
        return Call(op, args, conn.peer, rid, conn.stream if op.streams else None, tuple(held))

    def _finish_calls(self) -> None:
        while self._done:
            conn, fut = self._done.popleft()
            if conn.inflight is not fut or conn not in self._conns:
                continue  # timed out or dropped meanwhile: already answered or unanswerable
            conn.inflight = None
            self._guarded(conn, self._answer, fut)

    def _answer(self, conn: _Conn, fut: Future) -> None:
        self._reply(conn, self.reply_for(conn.call, fut))
        if conn in self._conns:
            self._advance(conn)

    @staticmethod
    def reply_for(call: Call, fut: Future | Answered) -> bytes:
        """The reply frame of ``call`` once ``fut`` is done: its result, or its error as the
        wire says it."""
        return ControlServer.reply_of(call.request_id, call.op.name, fut.result, 0)

    @staticmethod
    def reply_of(rid, op: str, fn: Callable[..., Any], *args: Any) -> bytes:
        """The reply frame to request ``rid`` of op ``op``: what ``fn(*args)`` returns, or the
        error it raises, as the wire says it (a call's answer, or an op run on another thread
        as a direct op's would be: fleet.service.inlets)."""
        try:
            result = fn(*args)
        except CancelledError:
            return encode_error(rid, E_SHUTTING_DOWN, f"{op} not executed: the server is closing")
        except ShuttingDown as exc:
            return encode_error(rid, E_SHUTTING_DOWN, str(exc))
        except FleetError as exc:
            return encode_error(rid, type(exc).__name__, str(exc))
        except Exception as exc:
            log.error("op %s failed", op, exc_info=exc)
            return encode_error(rid, E_INTERNAL, f"{op} failed: {type(exc).__name__}: {exc}")
        try:
            return encode_reply(rid, result)
        except (TypeError, ValueError) as exc:
            log.error("op %s returned a result that is not JSON: %s", op, exc)
            return encode_error(rid, E_INTERNAL, f"{op} returned a result that is not JSON: {exc}")


def _queue(conn: _Conn, data: bytes) -> None:
    """Add one frame to ``conn``'s wbuf, its descriptors (`wire.WithFds`) to go with its first
    bytes (wlock held). A closed connection's are closed."""
    fds = getattr(data, "fds", None)
    if fds:
        if conn.closed:
            fdpass.close_all(fds)
            return
        start = conn.wpos + len(conn.wbuf)
        conn.wfds.append((start, start + len(data), fds))
    conn.wbuf += data


def _send_queued(conn: _Conn, until_blocked: bool = False) -> int:
    """Write what the socket takes of wbuf now, without blocking (wlock held): a frame's
    descriptors in one sendmsg with its first bytes, that frame's bytes alone, so the peer
    reads them with that frame (`fds.Arrivals`); plain bytes up to the next such frame, then
    the next message while the socket takes them all (or, ``until_blocked``, any). Returns the
    bytes sent; BlockingIOError when none."""
    total = 0
    while conn.wbuf:
        wfds = conn.wfds
        try:
            with memoryview(conn.wbuf) as view:
                if not wfds:
                    want = len(view)
                    sent = conn.sock.send(view)
                else:
                    start, end, fds = wfds[0]
                    if start == conn.wpos:
                        want = end - start
                        sent = conn.sock.sendmsg([view[:want]],
                                                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                        wfds.popleft()
                        fdpass.close_all(fds)  # the peer holds its own now
                    else:
                        want = start - conn.wpos
                        sent = conn.sock.send(view[:want])
        except (BlockingIOError, InterruptedError):
            if total:
                break
            raise
        del conn.wbuf[:sent]
        conn.wpos += sent
        total += sent
        if sent < want and not until_blocked:
            break  # the socket is full: the rest when it is writable
    return total


def _release(call: Call) -> None:
    """Unmap what a call's descriptors held (its op is done with it)."""
    for mapped in call.held:
        mapped.close()


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
