"""Validated calls and how they reach the thread that owns the state: `Peer`,
`Call`, the dispatches (`inline_dispatch`, `with_blocking_ops`), a call's answer made on the
spot (`Answered`) and `CallQueue`."""
from __future__ import annotations

import collections
import socket
import struct
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from admission.records import record
from fleet.service.control.errors import ShuttingDown
from fleet.service.control.ops import Op


@record
class Peer:
    """The process at the other end of a connection, from SO_PEERCRED."""

    pid: int
    uid: int
    gid: int

    @classmethod
    def of(cls, sock: socket.socket) -> Peer:
        fmt = "3i"  # struct ucred { pid_t pid; uid_t uid; gid_t gid; }
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(fmt))
        return cls(*struct.unpack(fmt, raw))


@record
class Call:
    """A validated request, ready to run against the handler on the owning thread."""

    op: Op
    args: dict[str, Any]
    peer: Peer
    request_id: int | str | None = None
    #: The connection's push side (`server.Stream`) for an op that streams (``Op.streams``).
    stream: Any = None
    #: What the frame's descriptors hold (`fds.Mapped`), released when the call ends.
    held: tuple = ()

    def run(self, handler) -> Any:
        if self.op.streams:
            return self.op.execute(handler, {**self.args, "stream": self.stream})
        return self.op.execute(handler, self.args)


def inline_dispatch(handler) -> Callable[[Call], Answered]:
    """A dispatch that runs each call at once on the server's connection thread.

    Only for handlers that are safe to call from any thread; a daemon whose loop
    owns its state uses `CallQueue` instead.
    """

    def dispatch(call: Call) -> Answered:
        return answered(call.run, handler)

    return dispatch


class Answered:
    """The answer of a call run at once on the server's thread, as the server reads a
    Future's (`done`, `result`, `add_done_callback`): a reply made on the spot needs no
    Future's condition, locks and callbacks list, made and settled per frame (a service
    client's every submit is one)."""

    __slots__ = ("_value", "_error")

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self._value, self._error = value, error

    def done(self) -> bool:
        return True

    def cancel(self) -> bool:
        return False  # it ran already

    def result(self, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._error

    def add_done_callback(self, fn: Callable[[Answered], None]) -> None:
        fn(self)  # done already: at once, as a Future's would be


def answered(fn: Callable[..., Any], *args: Any) -> Answered:
    """`fn(*args)` run now: its value, or the Exception it raised (the reply says it)."""
    try:
        return Answered(fn(*args))
    except Exception as exc:  # delivered to the waiter as the reply
        return Answered(error=exc)


#: A direct op whose frame brought this many bytes or more in memfds (a large payload,
#: which its admission may read whole) runs on the ``side`` thread of `with_blocking_ops`.
SIDE_MIN_BYTES = 8 << 20


def held_bytes(call: Call) -> int:
    """The bytes of the memfds a call's frame brought (`fds.Mapped`)."""
    return sum(mapped.view.nbytes for mapped in call.held)


def with_blocking_ops(handler, dispatch: Callable[[Call], Future],
                      refusal: Callable[[], str | None] = lambda: None, side=None) -> Callable[[Call], Future | Answered]:
    """A dispatch that keeps blocking ops (``Op.blocking``, a long poll) and direct ones
    (``Op.direct``, a submit) off ``dispatch``.

    A blocking op's `execute` returns a Future at once; it is handed straight back to
    the server, whose connection thread waits on it, so a long poll never occupies
    the loop that owns the state. A direct op touches only state with an owner of its
    own that any thread may call (the supervisor's submitter, the outcome store, the
    replays): it runs here, on the server's thread, and its Future is done on return,
    so it crosses no loop it does not need; except one whose frame brought
    `SIDE_MIN_BYTES` or more in memfds, whose admission may read them whole (a unit with a
    request id hashes its payload: `fleet.service.replays`; the payload itself is handed to
    its worker as it is, `fleet.shm.handoff`) and so hold the server's thread, and every
    other connection with it, for as long as it takes: that one runs
    on ``side`` (a `fleet.service.side_thread.SideThread`), when given, and its
    connection alone waits for its reply. ``refusal()``: why calls are refused now
    (`CallQueue.refusal`: the daemon is shutting down), or None; a direct op then fails
    ShuttingDown as a queued one would. Every other call goes to ``dispatch``
    (normally `CallQueue.submit`).
    """

    def direct(call: Call):
        why = refusal()
        if why is not None:
            raise ShuttingDown(why)
        return call.run(handler)

    def route(call: Call) -> Future | Answered:
        if call.op.direct:
            if side is not None and call.held and held_bytes(call) >= SIDE_MIN_BYTES:
                return side.submit(lambda: direct(call))
            return answered(direct, call)
        if not call.op.blocking:
            return dispatch(call)
        try:
            fut = call.run(handler)
        except Exception as exc:  # delivered to the waiter as the reply
            fut = Future()
            fut.set_exception(exc)
        if not isinstance(fut, Future):
            raise TypeError(f"blocking op {call.op.name} returned {type(fut).__name__}, not a Future")
        return fut

    return route


class CallQueue:
    """Hands calls from server threads to the thread that owns the state.

    Give `submit` to `ControlServer` as its dispatch; the owning loop calls
    `run_pending(handler)` whenever `wait` returns True or its ``wakeup`` fires
    (e.g. a write to the loop's self-pipe, so a loop sleeping in select wakes).
    A call whose Future was cancelled (its requester timed out) is skipped, so a
    ``Timeout`` reply that says "not executed" stays true.
    """

    def __init__(self, wakeup: Callable[[], None] | None = None):
        self._calls: collections.deque[tuple[Call, Future]] = collections.deque()
        self._cond = threading.Condition()
        self._wakeup = wakeup
        self._closed: str | None = None

    def submit(self, call: Call) -> Future:
        """Queue ``call``; thread-safe. After `close` the Future fails with ShuttingDown."""
        fut: Future = Future()
        with self._cond:
            if self._closed is not None:
                fut.set_exception(ShuttingDown(self._closed))
                return fut
            self._calls.append((call, fut))
            self._cond.notify_all()
        if self._wakeup is not None:
            self._wakeup()
        return fut

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a call is pending (True), or the queue is closed or ``timeout``
        seconds pass (False). ``while q.wait(): q.run_pending(h)`` serves until `close`."""
        with self._cond:
            self._cond.wait_for(lambda: self._calls or self._closed is not None, timeout)
            return bool(self._calls)

    def run_pending(self, handler, *, limit: int | None = None) -> int:
        """Run queued calls (at most ``limit``) on this thread; returns how many ran."""
        ran = 0
        while limit is None or ran < limit:
            with self._cond:
                if not self._calls:
                    break
                call, fut = self._calls.popleft()
            if not fut.set_running_or_notify_cancel():
                continue  # the requester gave up before we got to it
            ran += 1
            try:
                result = call.run(handler)
            except Exception as exc:
                fut.set_exception(exc)
            else:
                fut.set_result(result)
        return ran

    def refusal(self) -> str | None:
        """Why calls are refused now (`close`'s reason), or None while they are taken."""
        return self._closed

    def close(self, reason: str = "the fleet daemon is shutting down") -> None:
        """Refuse new calls and fail the pending ones with ShuttingDown."""
        with self._cond:
            self._closed = reason
            pending, self._calls = list(self._calls), collections.deque()
            self._cond.notify_all()
        for _, fut in pending:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(ShuttingDown(reason))

    def __len__(self) -> int:
        with self._cond:
            return len(self._calls)
