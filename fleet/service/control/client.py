"""`ControlClient`: one connection to a daemon's control socket, reused across
calls, that sends a request and turns its reply into a result or a typed error."""
from __future__ import annotations

import itertools
import os
import select
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fleet.rules.errors import NotRunning
from fleet.host.trust import check_owner, trusted_uids
from fleet.service.control import fds as fdpass
from fleet.service.control.calls import Peer
from fleet.service.control.errors import (
    E_BUSY,
    E_INVALID_REPLY,
    E_PERMISSION,
    ControlBusy,
    ControlTimeout,
    PermissionDenied,
    ProtocolError,
    RemoteError,
    ReplyLost,
)
from fleet.service.control.ops import OPS, OpRegistry
from fleet.service.control.paths import find_socket
from fleet.service.control.wire import Reply, decode_reply, encode_request


_REMOTE_TYPES: dict[str, Callable[[str], RemoteError]] = {E_PERMISSION: PermissionDenied, E_BUSY: ControlBusy}


class ControlClient:
    """Talks to one daemon's control socket. One connection, reused across calls.

    A connection the daemon closed while it sat unused (an idle timeout, a restart)
    is replaced by a new one before the next request is sent: no request is lost on
    it, since none was sent.

    It talks only to a daemon of a trusted uid (ours, root, or one of ``trust_uids``;
    see `fleet.host.trust`): each connection's peer (SO_PEERCRED) is checked before anything
    is sent on it or read from it, and another uid's daemon is UntrustedPeer.

    ``ControlClient(path)`` or ``ControlClient.for_fleet(name)``; use as a context
    manager or call `close`. Not thread-safe: one client per thread.
    """

    def __init__(self, path: str | os.PathLike, *, timeout: float | None = 60.0, registry: OpRegistry = OPS,
                 trust_uids=()):
        self.path = Path(path)
        self.timeout = timeout
        self.registry = registry
        self.trust = trusted_uids(trust_uids)
        self._sock: socket.socket | None = None
        self._server_pid: int | None = None
        self._buf = bytearray()
        self._arrivals = fdpass.Arrivals()  # descriptors received, by the frame that claims them
        self._ids = itertools.count(1)

    @classmethod
    def for_fleet(cls, name: str, env: Mapping[str, str] | None = None, *, trust_uids=(),
                  **kwargs: Any) -> ControlClient:
        """A client for the running fleet ``name`` (see `find_socket`); NotRunning if none,
        UntrustedPeer if only a directory of an untrusted uid holds its socket."""
        trust = trusted_uids(trust_uids)
        return cls(find_socket(name, env, trust=trust), trust_uids=trust, **kwargs)

    def call(self, op: str, **args: Any) -> Any:
        """Run ``op`` with ``args`` on the daemon and return its result.

        Raises:
            ProtocolError: ``op`` is unknown or ``args`` do not fit its schema (checked
                before anything is sent).
            UntrustedPeer: the daemon at the path runs as a uid this client does not
                trust (nothing was sent).
            NotRunning: no daemon listens at the path, or it closed the connection.
            PermissionDenied: the daemon refused the op to our uid, or we may not connect.
            ControlBusy: the daemon refused the connection: its connections are all busy.
            RemoteError: any other error reply; ``.type`` and ``.message`` say what.
            ControlTimeout: no reply within ``timeout`` seconds.
        """
        spec = self.registry.get(op)
        rid = next(self._ids)
        frame = encode_request(op, spec.to_wire(**args), rid)
        line = self._roundtrip(frame)
        fds, cut = self._arrivals.take(len(line) + 1)
        try:
            reply = decode_reply(line)
            if cut:
                raise ProtocolError(E_INVALID_REPLY, f"{op}: the reply brought more descriptors than a frame may carry")
            if reply.ok:
                claimed, fds = fds, []
                spec.claim_reply_fds(reply.result, claimed)
        except BaseException:
            self.close()  # the stream is out of step now; never reuse it
            raise
        finally:
            fdpass.close_all(fds)
        if reply.id != rid:
            if reply.id is None and not reply.ok:
                # An error about the connection, not the request (Busy at accept, a
                # frame deadline): the daemon closes it after saying so.
                self.close()
                raise _remote_error(reply)
            self.close()
            raise ProtocolError(E_INVALID_REPLY, f"reply id {reply.id!r} does not match request id {rid!r}")
        if not reply.ok:
            raise _remote_error(reply)
        return reply.result

    def send_raw(self, data: bytes) -> Reply:
        """Send ``data`` as-is and decode one reply: for tests and diagnostics (descriptors that
        came with it are closed)."""
        line = self._roundtrip(data)
        fdpass.close_all(self._arrivals.take(len(line) + 1)[0])
        return decode_reply(line)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buf.clear()
        self._arrivals.close()
        self._arrivals = fdpass.Arrivals()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> int:
        """Connect now, or check that the open connection still stands (see `_connect`);
        returns the daemon's pid on it."""
        self._connect()
        assert self._server_pid is not None
        return self._server_pid

    def _connect(self) -> socket.socket:
        if self._sock is not None:
            if self._still_open(self._sock):
                return self._sock
            self.close()  # the daemon closed it while we did not use it: a new one is as good
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(self.timeout)
        try:
            self._connect_through_backlog(sock)
            peer = Peer.of(sock)
            # Before a byte goes either way: another uid's daemon may answer with
            # pickles that would run as us, and must not see what we send.
            check_owner(f"the fleet daemon at {self.path} (pid {peer.pid})", peer.uid, self.trust)
            self._server_pid = peer.pid
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise NotRunning(f"no fleet daemon at {self.path}: {exc.strerror}") from None
        except PermissionError:
            sock.close()
            raise PermissionDenied(
                f"may not connect to {self.path}: uid {os.geteuid()} is not its owner "
                "and not in its group"
            ) from None
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        return sock

    def _connect_through_backlog(self, sock: socket.socket) -> None:
        """connect(), retried while the daemon's listen backlog is full (a Unix socket
        with a timeout says EAGAIN then, where a blocking one would wait); ControlBusy
        if it stays full for the whole timeout."""
        deadline = time.monotonic() + (self.timeout if self.timeout is not None else 60.0)
        pause = 0.001
        while True:
            try:
                sock.connect(str(self.path))
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ControlBusy(f"{self.path}: the daemon's connection backlog stayed full "
                                      f"for {self.timeout}s") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.05)

    def _still_open(self, sock: socket.socket) -> bool:
        """False if the daemon closed this idle connection (end of stream, or a parting
        error such as an idle timeout, waiting unread): no request of ours was read on
        it, so sending on a new connection instead is safe."""
        if self._buf:
            return False  # bytes nobody asked for: the stream is out of step
        readable, _, _ = select.select([sock], [], [], 0)
        return not readable

    def _roundtrip(self, frame: bytes) -> bytes:
        sock = self._connect()
        sent = False  # a timeout before the whole frame went out: the daemon ran nothing
        try:
            try:
                sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError) as exc:
                # The daemon closed the connection before reading our request; it may
                # have said why first (Busy): that reply is still ours to read.
                parting = self._parting_words(sock)
                self.close()
                if parting is not None:
                    return parting
                raise NotRunning(f"fleet daemon at {self.path} closed the connection: {exc.strerror}") from None
            sent = True
            try:
                return self._read_line(sock)
            except (NotRunning, BrokenPipeError, ConnectionResetError) as exc:
                self.close()
                raise ReplyLost(f"fleet daemon at {self.path} closed the connection after the request went out, "
                                f"before replying ({exc}); it may have run it") from None
        except TimeoutError:
            self.close()
            raise ControlTimeout(f"no reply from {self.path} within {self.timeout}s", sent=sent) from None
        except (BrokenPipeError, ConnectionResetError) as exc:
            self.close()
            raise NotRunning(f"fleet daemon at {self.path} closed the connection: {exc.strerror}") from None
        except BaseException:
            self.close()  # the stream is out of step now; never reuse it
            raise

    def _parting_words(self, sock: socket.socket) -> bytes | None:
        try:
            return self._read_line(sock)
        except (OSError, NotRunning):
            return None

    def _read_line(self, sock: socket.socket) -> bytes:
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                return line
            data = self._arrivals.recv(sock, 65536, len(self._buf))
            if not data:
                raise NotRunning(f"fleet daemon at {self.path} closed the connection before replying")
            self._buf += data


def _remote_error(reply: Reply) -> RemoteError:
    factory = _REMOTE_TYPES.get(reply.error_type)
    if factory is not None:
        return factory(reply.error_message)
    return RemoteError(reply.error_type, reply.error_message)
