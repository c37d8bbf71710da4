"""`fleet.connect`: a service-mode client of a running fleetd, with the embedded API.

    with fleet.connect("app") as f:
        fut = f.submit("resolve", {"path": p})
        for result in f.map("resolve", paths, chunksize=64):
            ...

`Client` offers what `fleet.Fleet` offers — ``submit``, ``map``, ``status``,
``ledger``, ``shutdown`` (and ``posture_show`` / ``posture_set``) — over the fleet's
control socket. Payloads are pickled here and unpickled only in a worker; values
come back pickled. Service-mode keys are ``str`` or ``int`` (they travel as JSON).

Delivery. Each submit carries this client's random token and a sequence number;
fleetd holds the unit's outcome under the token. One background thread long-polls
``collect`` whenever a future is pending and resolves futures as outcomes arrive
(a large value arrives in parts and is joined here). If the daemon dies, the socket
breaks, or the daemon dropped this client's outcomes, every pending future fails
with `FleetConnectionLost` (a FleetError) — none is left hanging — and the client
refuses further submits with the same error.

Cancelling a future here only stops this client waiting for it: the unit, once
admitted, still runs in the fleet (its outcome is counted in the ledger, then
discarded here).

Only the daemon's uid and root may submit (the socket checks SO_PEERCRED); any
uid that can reach the socket may read ``status`` and ``ledger``.
"""
from __future__ import annotations

import base64
import itertools
import os
import pickle
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Executor, Future
from typing import Any

from . import control
from .control import FleetConnectionLost, NotRunning, OutcomesDropped, ProtocolError, RemoteError
from .errors import FleetError
from .executor import MAP_WINDOW, map_units
from .outcomes import FAILED, SOLVED
from .roles import UnknownRoleError
from .unit import (
    BadUnit,
    FleetClosed,
    Outcome,
    PayloadTooLarge,
    PayloadUnpicklable,
    QueueFull,
    RoleStopped,
    SubmitRefused,
    error_for,
)

__all__ = ["Client", "FleetConnectionLost", "connect"]

#: How long one `collect` long poll waits on the daemon.
COLLECT_WAIT_S = 10.0
#: A connection idle this long is replaced before use: the server drops idle
#: connections (ControlServer idle_timeout, 300 s) and a dropped one would read
#: as a dead daemon.
IDLE_REFRESH_S = 60.0
#: Largest pickled payload a submit frame can carry: base64 (4/3) of it plus the
#: other arguments must fit control.MAX_FRAME.
MAX_WIRE_PAYLOAD = (control.MAX_FRAME - 64 * 1024) * 3 // 4

# Error replies that are the embedded API's typed submit refusals, by wire type.
_SUBMIT_ERRORS = {cls.__name__: cls for cls in (
    BadUnit, PayloadTooLarge, PayloadUnpicklable, QueueFull, RoleStopped, SubmitRefused, FleetClosed)}


def connect(name: str, *, timeout: float = 30.0, env: Mapping[str, str] | None = None) -> "Client":
    """A client of the running fleet ``name`` (its fleetd's control socket).

    Args:
        name: the fleet's name (``[fleet] name`` or ``fleetd --name``).
        timeout: seconds to wait for a reply to a request before ControlTimeout.
        env: where to look for the socket (``RUNTIME_DIRECTORY``, ``XDG_RUNTIME_DIR``);
            default os.environ.
    Raises:
        NotRunning (exit 69): no fleetd of that name answers.
        PermissionDenied (exit 77): this uid may not connect to the socket.
    """
    client = Client(name, control.find_socket(name, env), timeout=timeout)
    try:
        client.ping()
    except BaseException:
        client.close()
        raise
    return client


class _Channel(control.ControlClient):
    """One connection for one thread at a time: reconnects when it sat idle long enough
    for the server to have dropped it, and can be aborted from another thread."""

    def __init__(self, path, *, timeout):
        super().__init__(path, timeout=timeout)
        self._used = 0.0
        self.lock = threading.Lock()

    def call(self, op: str, **args: Any) -> Any:
        if self._sock is not None and time.monotonic() - self._used > IDLE_REFRESH_S:
            self.close()
        try:
            return super().call(op, **args)
        finally:
            self._used = time.monotonic()

    def abort(self) -> None:
        """Wake a call blocked in recv on another thread (it then fails)."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Client(Executor):
    """A running fleetd, seen from another process. Build it with `fleet.connect`."""

    def __init__(self, name: str, path: str | os.PathLike, *, timeout: float = 30.0):
        self.name = name
        self.path = path
        self.timeout = timeout
        self._token = secrets.token_urlsafe(24)
        self._seq = itertools.count(1)
        self._requests = _Channel(path, timeout=timeout)
        self._polls = _Channel(path, timeout=max(timeout, COLLECT_WAIT_S + 20.0))
        self._cond = threading.Condition()
        self._pending: dict[int, tuple[Future, str]] = {}
        self._parts: dict[int, list[str]] = {}
        self._bounds: dict[str, int] = {}
        self._collector: threading.Thread | None = None
        self._closing = False
        self._lost: FleetConnectionLost | None = None

    # --- Executor -----------------------------------------------------------------------
    def submit(self, role: str, payload=None, /, *, key=None, lane=None, priority: int = 0, timeout=None,
               request_id=None) -> Future:
        """Submit one unit to the fleet's `role`; returns its Future (see `fleet.Fleet.submit`).

        Raises (nothing queued): UnknownRoleError, BadUnit, PayloadTooLarge,
        PayloadUnpicklable, QueueFull, RoleStopped, FleetClosed (this client is
        closed, or the fleet is stopping), PermissionDenied (this uid may not
        submit), FleetConnectionLost (the daemon is gone).
        """
        return self._submit(role, payload, key=key, lane=lane, priority=priority, timeout=timeout,
                            request_id=request_id)

    def map(self, role: str, iterable: Iterable, *, chunksize: int = 1, timeout: float | None = None,
            lane=None) -> Iterator:
        """Results of `role`'s handler over `iterable`, in order (see `fleet.Fleet.map`)."""
        return map_units(
            lambda payload, chunk: self._submit(role, payload, lane=lane, chunk=chunk),
            role, iterable, chunksize=chunksize, timeout=timeout,
            window=lambda: max(1, min(MAP_WINDOW, self._bounds.get(role, MAP_WINDOW))),
        )

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Close this client (the fleet keeps running).

        wait=True first waits for every pending future; cancel_futures cancels the
        ones still pending here (their units still run in the fleet). Futures still
        pending when the client closes fail with FleetClosed.
        """
        with self._cond:
            self._closing = True
            pending = [fut for fut, _ in self._pending.values()]
            self._cond.notify_all()
        if cancel_futures:
            for fut in pending:
                fut.cancel()
        if wait:
            for fut in pending:
                try:
                    fut.exception()
                except BaseException:  # noqa: BLE001 - cancelled: it is done either way
                    pass
        self._polls.abort()
        if self._collector is not None and self._collector is not threading.current_thread():
            self._collector.join()
        self._fail_pending(FleetClosed(f"client of fleet {self.name!r} closed before the outcome arrived"))
        with self._requests.lock:
            self._requests.close()
        self._polls.close()

    def close(self) -> None:
        """Close now: pending futures fail with FleetClosed (the fleet keeps running)."""
        self.shutdown(wait=False)

    # --- views --------------------------------------------------------------------------
    def status(self) -> dict:
        """What `fleetctl status --json` shows, plus the daemon's own ``daemon`` section."""
        return self._call("status")

    def ledger(self) -> dict:
        """submitted, solved, suppressed, failed (+ in flight and failures by reason)."""
        return self._call("ledger")

    def posture_show(self) -> dict:
        return self._call("posture_show")

    def posture_set(self, **patch) -> dict:
        """Retune posture thresholds; RemoteError ``PostureRetuneError`` (exit 78) if refused."""
        return self._call("posture_set", patch=patch)

    def posture_release(self, cause: str) -> dict:
        """Release a sticky posture cause (``lane-death``, ``operator``); the posture view
        with ``released`` (was it held)."""
        return self._call("posture_release", cause=cause)

    def ping(self) -> dict:
        return self._call("ping")

    def __repr__(self) -> str:
        return f"<fleet.Client {self.name!r} at {self.path}>"

    # --- requests -----------------------------------------------------------------------
    def _call(self, op: str, **args: Any) -> Any:
        with self._requests.lock:
            return self._requests.call(op, **args)

    def _submit(self, role, payload, *, key=None, lane=None, priority=0, timeout=None, request_id=None,
                chunk=False) -> Future:
        if self._lost is not None:
            raise FleetConnectionLost(str(self._lost))
        if self._closing:
            raise FleetClosed(f"client of fleet {self.name!r} is closed; cannot submit")
        try:
            raw = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - whatever pickle raises, the unit cannot travel
            raise PayloadUnpicklable(f"payload for role {role!r} cannot be pickled: {type(exc).__name__}: {exc}") \
                from None
        if len(raw) > MAX_WIRE_PAYLOAD:
            raise PayloadTooLarge(f"payload for role {role!r} is {len(raw)} bytes pickled; a service-mode submit "
                                  f"carries at most {MAX_WIRE_PAYLOAD} (one control frame, base64)")
        seq = next(self._seq)
        fut: Future = Future()
        with self._cond:
            self._pending[seq] = (fut, role)
        try:
            reply = self._call("submit", role=role, pickled=raw, key=key, lane=lane, priority=priority,
                               timeout=timeout, request_id=request_id, token=self._token, seq=seq, chunk=chunk)
        except BaseException as exc:
            with self._cond:
                self._pending.pop(seq, None)
            raise self._translate(exc, role) from None
        fut.unit_id = reply["unit"]
        self._bounds[role] = reply.get("queue_bound", MAP_WINDOW)
        self._start_collector()
        with self._cond:
            self._cond.notify_all()
        return fut

    def _translate(self, exc: BaseException, role: str) -> BaseException:
        """The embedded API's typed error for a refused submit."""
        if isinstance(exc, RemoteError):
            cls = _SUBMIT_ERRORS.get(exc.type)
            if cls is not None:
                return cls(exc.message)
            if exc.type == "UnknownRoleError":
                err = UnknownRoleError(role, ())
                err.args = (exc.message,)
                return err
            if exc.type == control.E_SHUTTING_DOWN:
                return FleetClosed(f"fleet {self.name!r} is shutting down: {exc.message}")
            if exc.type == "OutcomesDropped":
                return self._connection_lost(OutcomesDropped(exc.message))
            return exc
        if isinstance(exc, ProtocolError) and exc.code == control.E_INVALID_ARGS:
            return BadUnit(exc.message)  # checked here before sending, as the daemon would
        if isinstance(exc, (NotRunning, OSError)):
            return self._connection_lost(FleetConnectionLost(f"lost fleetd {self.name!r} at {self.path}: {exc}"))
        return exc

    # --- outcomes -----------------------------------------------------------------------
    def _start_collector(self) -> None:
        with self._cond:
            if self._collector is not None:
                return
            self._collector = threading.Thread(target=self._collect_loop, name=f"fleet-client-{self.name}",
                                               daemon=True)
        self._collector.start()

    def _collect_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._waiting() or self._closing)
                if not self._waiting():
                    return  # closing, nothing owed
            try:
                with self._polls.lock:
                    reply = self._polls.call("collect", token=self._token, timeout=COLLECT_WAIT_S)
            except RemoteError as exc:
                cls = OutcomesDropped if exc.type == "OutcomesDropped" else FleetConnectionLost
                self._connection_lost(cls(f"fleetd {self.name!r} at {self.path}: {exc}"))
                return
            except (FleetError, OSError) as exc:
                if self._closing:
                    return  # shutdown() aborted the poll on purpose
                self._connection_lost(FleetConnectionLost(
                    f"lost fleetd {self.name!r} at {self.path} with {len(self._pending)} unit(s) pending: {exc}"))
                return
            self._deliver(reply.get("outcomes", []))

    def _waiting(self) -> bool:
        """Some pending future is not done (cancelled ones need no outcome)."""
        return any(not fut.done() for fut, _ in self._pending.values())

    def _deliver(self, records: list[dict]) -> None:
        for record in records:
            seq = record.get("seq")
            value = record.get("value")
            if "parts" in record:
                parts = self._parts.setdefault(seq, [])
                parts.append(value)
                if len(parts) < record["parts"]:
                    continue
                value = "".join(self._parts.pop(seq))
            with self._cond:
                entry = self._pending.pop(seq, None)
            if entry is None:
                continue  # not ours any more (a submit that raised), or delivered already
            fut, role = entry
            if not fut.set_running_or_notify_cancel():
                continue  # cancelled here: the unit ran anyway, nobody wants its outcome
            try:
                result = _decode(record, value, role)
            except BaseException as exc:  # noqa: BLE001 - a UnitError, or a value we cannot unpickle
                fut.set_exception(exc)
            else:
                fut.set_result(result)

    def _connection_lost(self, exc: FleetConnectionLost) -> FleetConnectionLost:
        """Remember the loss and fail every pending future with it (never leave one hanging)."""
        if self._lost is None:
            self._lost = exc
        self._fail_pending(exc)
        return exc

    def _fail_pending(self, exc: FleetError) -> None:
        with self._cond:
            pending, self._pending = self._pending, {}
            self._parts.clear()
            self._cond.notify_all()
        for fut, _ in pending.values():
            if fut.set_running_or_notify_cancel():
                fut.set_exception(exc)


def _decode(record: dict, value: str | None, role: str):
    """The value of a solved record; raises the unit's UnitFailed / UnitSuppressed otherwise."""
    unit_id = record.get("unit") or 0
    kind = record.get("kind")
    if kind == SOLVED:
        try:
            return pickle.loads(base64.b64decode(value))
        except Exception as exc:  # noqa: BLE001 - e.g. a class this process cannot import
            raise error_for(unit_id, role, Outcome(FAILED, "ResultError",
                            f"result cannot be unpickled here: {type(exc).__name__}: {exc}")) from None
    original = None
    if record.get("error"):
        try:
            original = pickle.loads(base64.b64decode(record["error"]))
        except Exception:  # noqa: BLE001 - the traceback text in detail still tells the story
            original = None
    raise error_for(unit_id, role, Outcome(kind, record.get("reason"), record.get("detail")), original)
