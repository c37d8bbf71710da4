"""`fleet.connect`: a service-mode client of a running fleetd, with the embedded API.

    with fleet.connect("app") as f:
        fut = f.submit("resolve", {"path": p})
        for result in f.map("resolve", paths, chunksize=64):
            ...

`Client` offers what `fleet.Fleet` offers — ``submit``, ``map``, ``status``,
``ledger``, ``shutdown`` (and ``posture_show`` / ``posture_set``, ...) — over the fleet's
control socket; its operator methods are made from the control ops (one per op). Payloads are pickled here and unpickled only in a worker; values
come back pickled. Service-mode keys are ``str`` or ``int`` (they travel as JSON).

Submitting. A submit returns its future without waiting for fleetd: the units a
client has in flight travel coalesced, one ``submit_batch`` frame per round trip
(`fleet.api.submit_pipe`), and fleetd's refusals arrive on the futures.

Delivery. Each submit carries this client's random token and a sequence number;
fleetd holds the unit's outcome under the token and pushes it, as it is held, onto the
connection the submits went out on (``submit_batch`` v2), where the submits' reader
resolves its future (a large value arrives in parts and is joined here). A background
thread long-polls ``collect`` whenever a future is pending: it waits while the outcomes
are pushed, and takes them over (every one not acknowledged) when that connection
closes; each numbered outcome is taken once, whichever brought it. A slow daemon is not a lost
one: a poll it does not answer in time (stopped, swamped) or whose connection
breaks is asked again on a new connection, and the daemon sends again whatever the
client has not acknowledged, so the futures wait for the outcomes it still owes. If
the daemon dies (the socket refuses us), restarts, or dropped this client's
outcomes, every pending future fails with `FleetConnectionLost` (a FleetError) —
none is left hanging.

Reconnecting. The client is not spent by a lost daemon: the next call connects
again, and once fleetd is back (restarted under the same name) calls and submits
work as before. A restart is told by the daemon's pid on the socket (SO_PEERCRED):
outcomes owed by the old daemon are gone with it, so the futures still waiting for
them fail with `FleetConnectionLost`, and new submits use a fresh token.

A submit that got no reply. A submit whose request went out and whose reply never
came (none within ``timeout``, the connection broke, or fleetd's loop was still in
it at its deadline) raises `SubmitUncertain`: the unit may have been admitted. With a
``request_id`` the retry is safe: fleetd admits one unit per id (`fleet.service.replays`), and
the retry's future gets that unit's outcome. A submit that raised anything else ran
nothing.

Cancelling. ``future.cancel()`` asks fleetd to cancel the unit (the ``cancel`` op):
a unit that has not started is cancelled — it never runs, the ledger counts it
failed ``Cancelled`` — and cancel() returns True; a unit already running runs to
its outcome and cancel() returns False, as `concurrent.futures` promises. If the
daemon cannot be reached, the future is cancelled here only (nobody waits for it).

Connecting to a booting fleet. fleetd creates the fleet's table before it opens
its control socket, so `fleetctl status` can see a fleet that does not take
connections yet. `connect` waits (up to ``boot_wait``, `BOOT_WAIT_S` by default)
for the socket of a fleet whose table says a live service-mode fleetd is booting.

Only the daemon's uid and root may submit (the socket checks SO_PEERCRED); any
uid that can reach the socket may read ``status`` and ``ledger``.

Trust. The client believes only a fleetd of its own uid, root, or a uid in
``trust_uids`` (`fleet.host.trust`): the daemon's uid on each connection (SO_PEERCRED),
the owner of the table a booting fleet's socket path is read from, and the owners
of the directories a socket is looked up in are checked before anything is sent
or unpickled. Anything else is `fleet.UntrustedPeer` naming the uid.
"""
from __future__ import annotations

import itertools
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Executor, Future
from concurrent.futures import wait as wait_for
from typing import Any

from fleet.worker import codec
from fleet.service import control
from fleet.service.control import (
    ControlBusy,
    ControlTimeout,
    FleetConnectionLost,
    NotRunning,
    OutcomesDropped,
    ProtocolError,
    RemoteError,
    ReplyLost,
    SubmitUncertain,
)
from fleet.service.control import fds as fdpass
from fleet.service.control import outcome_record
from fleet.service.control.outcome_record import BadOutcomeRecord
from fleet.rules.errors import FleetError
from fleet.rules.vocab import Reason
from fleet.worker.mapping import MAP_WINDOW, map_units, map_window
from fleet.api.submit_pipe import _UNANSWERED, SubmitPipe
from fleet.runtime.submit import UNIT_ARGS, check_unit_args, submit_signature
from fleet.service.replays import RequestIdReused
from fleet.rules.roles import UnknownRoleError
from admission.route import Route
from fleet.host.trust import UntrustedPeer, trusted_uids
from fleet.rules.unit import (
    BadUnit,
    Draining,
    FleetClosed,
    PayloadTooLarge,
    PayloadUnpicklable,
    QueueFull,
    RoleStopped,
    SubmitRefused,
)

#: The submit op, whose schema a unit is checked against here before it is queued.
_SUBMIT = control.OPS.get("submit")

__all__ = ["BOOT_WAIT_S", "Client", "FleetConnectionLost", "SubmitUncertain", "connect"]

log = logging.getLogger(__name__)

#: How long `connect` waits, by default, for the control socket of a fleet that is
#: booting (its table is up, its socket not yet): booting forks every worker first.
BOOT_WAIT_S = 30.0
#: How often `connect` looks for that socket meanwhile.
_BOOT_POLL_S = 0.05
#: How long one `collect` long poll waits on the daemon.
COLLECT_WAIT_S = 10.0
#: How long the collector keeps a poll waiting on the daemon after its last unit was
#: owed: the outcome of a submit that follows is then sent the moment it is held, with
#: no poll to ask for it first.
COLLECT_LINGER_S = 30.0
#: How much longer than its wait a poll's reply may take before the client asks again
#: (on a new connection: the daemon holds what it sent until it is acknowledged).
COLLECT_GRACE_S = 20.0
#: How long `shutdown(wait=True)` (leaving a ``with`` block) waits quietly for pending
#: futures before it logs what it waits for: a block whose last outcomes are a moment
#: away says nothing, one that waits on long or held units says so.
WAIT_NOTICE_S = 1.0
#: Pause before polling again after a poll the daemon was too slow or too busy to answer.
COLLECT_RETRY_S = 0.05
#: Polls in a row whose connection broke after it was made, before the daemon counts
#: as gone (a live one is reached again at the first of them).
COLLECT_BREAKS = 3
#: A connection idle this long is replaced before use: the server drops idle
#: connections (ControlServer idle_timeout, 300 s) and a dropped one would read
#: as a dead daemon.
IDLE_REFRESH_S = 60.0

# Error replies that are the embedded API's typed submit refusals, by wire type.
_SUBMIT_ERRORS = {cls.__name__: cls for cls in (
    BadUnit, Draining, PayloadTooLarge, PayloadUnpicklable, QueueFull, RoleStopped, SubmitRefused, FleetClosed,
    RequestIdReused)}


def connect(name: str, *, timeout: float = 30.0, env: Mapping[str, str] | None = None,
            boot_wait: float = BOOT_WAIT_S, trust_uids: Iterable[int] = ()) -> "Client":
    """A client of the running fleet ``name`` (its fleetd's control socket).

    Args:
        name: the fleet's name (``[fleet] name`` or ``fleetd --name``).
        timeout: seconds to wait for a reply to a request before ControlTimeout.
        env: where to look for the socket (``RUNTIME_DIRECTORY``, ``XDG_RUNTIME_DIR``);
            default os.environ.
        boot_wait: seconds to wait for the socket of a fleet that is still booting
            (its table exists, owned by a live service-mode fleetd, but its socket
            is not open yet); 0 does not wait.
        trust_uids: uids besides our own and root whose fleetd this client may use
            (a service run as its own user, say); every other uid's is refused.
    Raises:
        NotRunning (exit 69): no fleetd of that name answers (or it did not finish
            booting within ``boot_wait``).
        UntrustedPeer (exit 85): the fleetd, its table, or the directory its socket
            was found in belongs to an untrusted uid (named); nothing was sent or read.
        InvalidTrust (exit 2): ``trust_uids`` holds something that is not a uid.
        PermissionDenied (exit 77): this uid may not connect to the socket.
        ControlBusy (exit 75): fleetd refused the connection, every one it allows is busy.
    """
    trust = trusted_uids(trust_uids)
    client = Client(name, _socket_for(name, env, boot_wait, trust), timeout=timeout, trust_uids=trust)
    try:
        client.ping()
    except BaseException:
        client.close()
        raise
    return client


def _socket_for(name: str, env: Mapping[str, str] | None, boot_wait: float, trust: frozenset[int]):
    """The fleet's control socket; waits for it while the fleet's table says it is booting."""
    deadline = time.monotonic() + boot_wait
    while True:
        try:
            return control.find_socket(name, env, trust=trust)
        except NotRunning as exc:
            path = _booting_socket(name, trust)
            if path is None:
                raise
            if os.path.exists(path):
                return path
            if time.monotonic() >= deadline:
                raise NotRunning(f"fleet {name!r} is booting but its control socket {path} did not appear "
                                 f"within {boot_wait:g}s") from exc
            time.sleep(_BOOT_POLL_S)


def _booting_socket(name: str, trust: frozenset[int]) -> str | None:
    """The socket path a live service-mode fleetd of ``name`` will listen on, from its
    table; None when there is no such table (no fleet, a dead one, an embedded one).
    UntrustedPeer when the table belongs to an untrusted uid: its path is theirs."""
    from fleet.shm.table import snapshot

    try:
        snap, alive = snapshot.read(name, trust=trust)
    except UntrustedPeer:
        raise
    except (FleetError, OSError):
        return None
    meta = snap.meta or {}
    if not alive or meta.get("mode") != "service" or not meta.get("socket"):
        return None
    return str(meta["socket"])


class _Channel(control.ControlClient):
    """One connection for one thread at a time: replaced when it sat idle long enough
    for the server to have dropped it, and can be aborted from another thread."""

    def __init__(self, path, *, timeout, trust_uids):
        super().__init__(path, timeout=timeout, trust_uids=trust_uids)
        self._used = 0.0
        self.lock = threading.RLock()  # a future's callback may cancel (a call) mid-submit

    def _connect(self):
        if self._sock is not None and time.monotonic() - self._used > IDLE_REFRESH_S:
            self.close()
        sock = super()._connect()
        self._used = time.monotonic()
        return sock

    def abort(self) -> None:
        """Wake a call blocked in recv on another thread (it then fails)."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _RemoteUnitFuture(Future):
    """A client future whose `cancel` cancels the unit in the fleet when it has not started,
    and whose `unit_id` is the unit's id in the fleet once its submit's reply came."""

    def __init__(self, client: "Client"):
        super().__init__()
        self._client = client
        # Set while fleetd is asked to cancel: the Cancelled outcome may come back
        # before the reply does, and must then cancel this future, not fail it.
        self.cancelling = False
        self._unit_id = _UNANSWERED  # the submit's reply sets it (fleet.api.submit_pipe)

    @property
    def unit_id(self) -> int | None:
        """The unit's id in the fleet (`fleetctl cancel`, `why`); waits for the submit's
        reply (at most the client's timeout). None when the submit was refused, or no reply
        came."""
        if self._unit_id is _UNANSWERED:
            self._client._pipe.wait_answer(self, self._client.timeout)
        unit_id = self._unit_id
        return None if unit_id is _UNANSWERED else unit_id

    def cancel(self) -> bool:
        """Cancel the unit if it has not started in the fleet (True); False if it is
        running or done. If fleetd cannot be reached, only this future is cancelled."""
        if self.done():
            return self.cancelled()
        self.cancelling = True
        if not self._client._cancel_remote(self):
            self.cancelling = False
            return False
        return super().cancel()


@control.OPS.client_class
class Client(Executor):
    """A running fleetd, seen from another process. Build it with `fleet.connect`.

    ``Client(name, path)`` talks to the socket at ``path`` with no lookup; the daemon
    there must still run as our uid, root, or one of ``trust_uids`` (UntrustedPeer).
    """

    def __init__(self, name: str, path: str | os.PathLike, *, timeout: float = 30.0, trust_uids: Iterable[int] = ()):
        self.name = name
        self.path = path
        self.timeout = timeout
        trust = trusted_uids(trust_uids)
        self._token = secrets.token_urlsafe(24)
        self._token_pid: int | None = None  # the daemon holding outcomes for _token
        self._seq = itertools.count(1)
        self._requests = _Channel(path, timeout=timeout, trust_uids=trust)
        self._pipe = SubmitPipe(self, path, timeout=timeout, trust_uids=trust)
        self._polls = _Channel(path, timeout=max(timeout, COLLECT_WAIT_S + COLLECT_GRACE_S), trust_uids=trust)
        # The client's state lock, and the collector's condition over it: taken as the
        # lock alone where nobody is woken (a submit, each record of a delivery), which
        # costs no Python frame, where the condition's enter and exit cost two.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._collector_waits = False  # the collector sleeps for a unit to be owed (`_wake_collector`)
        self._pending: dict[int, tuple[Future, str]] = {}
        self._parts: dict[int, list[str]] = {}
        self._delivery = threading.Lock()  # one thread takes records at a time (_deliver)
        self._received = 0  # outcomes of _token received: the next collect's ack
        self._bounds: dict[str, tuple[int, int]] = {}  # role -> (queue bound, slots), from submit replies
        self._collector: threading.Thread | None = None
        self._closing = False

    # --- Executor -----------------------------------------------------------------------
    def submit(self, role: str, payload=None, /, **unit) -> Future:
        """Submit one unit to the fleet's `role`; returns its Future (see `fleet.Fleet.submit`,
        also for the provider admission's `route`, `severity`, `pinned`, `parent`, `tag`, `age`).

        ``request_id`` makes the submit idempotent: fleetd admits one unit per id
        (`fleet.service.replays`: while the unit is owed and for 5 minutes after), so
        submitting again with the same id and arguments returns a future of that
        unit, never a second run; the same id with other arguments fails the
        future with RequestIdReused.

        The submit does not wait for fleetd: a lone one is written at once on this
        thread, and those made while a frame is in flight go out together in the next
        (`fleet.api.submit_pipe`). Raises at once, nothing sent: BadUnit (an argument
        this client can check), PayloadUnpicklable, FleetClosed (this client is closed).
        A payload of any size travels (from `fds.MEMFD_MIN` bytes pickled, in a sealed
        memfd beside its frame). What only the fleet can judge fails the returned future,
        that unit having no outcome and ``unit_id`` None: UnknownRoleError, BadUnit (a
        key on an unpinned role), PayloadTooLarge (over the fleet's limits.max_payload_bytes,
        or alone over limits.max_parcel_bytes), QueueFull (the role's queue, or the payload
        bytes held beside the rings, is full: retry later, ``.retryable``), Draining (retry after its resume),
        RoleStopped, RequestIdReused, FleetClosed (the fleet is stopping),
        PermissionDenied (this uid may not submit), ControlBusy, FleetConnectionLost
        (no fleetd to send it to; a later submit tries again), UntrustedPeer (the daemon
        on the socket runs as a uid this client does not trust: nothing was sent to it). SubmitUncertain fails it
        when its frame went out and no reply came (none within the client's timeout, or
        the connection broke): the unit may have been admitted; retry with the same
        request_id to run it at most once.
        """
        if unit:
            check_unit_args(unit, UNIT_ARGS.keys())
        ask = {**UNIT_ARGS, **unit}
        route = ask["route"]
        if route is not None and type(route) is not Route:
            raise BadUnit(f"route must be a fleet.Route(model, provider, credential=None), not {type(route).__name__}")
        admission = {} if route is None else {"route": str(route), "severity": ask["severity"], "pinned": ask["pinned"],
                                              "parent": ask["parent"], "tag": ask["tag"]}
        if route is None and (ask["severity"] is not None or ask["pinned"] or ask["parent"] is not None
                              or ask["tag"] is not None or ask["age"]):
            raise BadUnit("severity, pinned, parent, tag and age are provider admission arguments: give route= too")
        if ask["age"]:
            admission["age"] = ask["age"]  # checked by the fleet (a number of seconds >= 0)
        return self._submit(role, payload, key=ask["key"], lane=ask["lane"], priority=ask["priority"],
                            timeout=ask["timeout"], request_id=ask["request_id"], **admission)

    submit.__wrapped__ = submit_signature()  # its arguments, for inspect and help()

    def map(self, role: str, iterable: Iterable, *, chunksize: int = 1, timeout: float | None = None,
            lane=None) -> Iterator:
        """Results of `role`'s handler over `iterable`, in order (see `fleet.Fleet.map`)."""
        return self._map(role, iterable, chunksize, timeout, lane, ordered=True)

    def map_unordered(self, role: str, iterable: Iterable, *, chunksize: int = 1, timeout: float | None = None,
                      lane=None) -> Iterator:
        """Results as their units complete (see `fleet.Fleet.map_unordered`)."""
        return self._map(role, iterable, chunksize, timeout, lane, ordered=False)

    def _map(self, role, iterable, chunksize, timeout, lane, ordered) -> Iterator:
        return map_units(
            lambda payload, chunk: self._submit(role, payload, lane=lane, chunk=chunk),
            role, iterable, chunksize=chunksize, timeout=timeout,
            window=lambda: map_window(chunksize, *self._bounds.get(role, (MAP_WINDOW, 0))), ordered=ordered,
        )

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Close this client (the fleet keeps running).

        wait=True first waits for every pending future (leaving a ``with`` block does):
        when some are still pending after `WAIT_NOTICE_S`, a WARNING (logger
        ``fleet.api.client``) says how many it waits for. cancel_futures cancels the
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
            left = wait_for(pending, WAIT_NOTICE_S).not_done if pending else ()
            if left:
                # Never block without a word: the caller learns what it waits for.
                log.warning("client of fleet %r closing: waiting for %d unit(s) still owed to this client "
                            "(queued or in flight in the fleet) to reach their outcomes; shutdown(wait=False) "
                            "or cancel_futures=True leaves at once", self.name, len(left))
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
        self._pipe.close()
        self._polls.close()

    def close(self) -> None:
        """Close now: pending futures fail with FleetClosed (the fleet keeps running)."""
        self.shutdown(wait=False)

    # --- the operator ops: one method per op of the registry (`fleet.service.control.ops.OPS`),
    # made by `OPS.client_class` from each op's client half (status, ledger,
    # posture_show, posture_set, drain, resume, drain_state, cancel, admission_close, report_budget, ...).

    def __repr__(self) -> str:
        return f"<fleet.Client {self.name!r} at {self.path}>"

    # --- requests -----------------------------------------------------------------------
    def _call(self, op: str, **args: Any) -> Any:
        with self._requests.lock:
            return self._requests.call(op, **args)

    def _submit(self, role, payload, *, key=None, lane=None, priority=0, timeout=None, request_id=None,
                chunk=False, **admission) -> Future:
        if self._closing:
            raise FleetClosed(f"client of fleet {self.name!r} is closed; cannot submit")
        try:
            # Laid out as a parcel is (`lay_out`): its large buffers and bytes by reference,
            # written once, into the memfd below, never copied into a pickle first; fleetd
            # hands the memfd to the worker (fleet.shm.handoff), which builds the object over it.
            pieces, spans, n_oob = codec.lay_out(payload, f"payload for role {role!r}")
        except codec.CodecError as exc:  # whatever pickling raises, the unit cannot travel
            raise PayloadUnpicklable(str(exc)) from None
        seq = next(self._seq)
        size = len(pieces[0]) if len(pieces) == 1 else sum(memoryview(p).nbytes for p in pieces)
        if size >= fdpass.MEMFD_MIN or len(pieces) > 1:
            # Beside the frame, in a sealed memfd its descriptor goes with (the pipe numbers it)
            args = {"role": role, "payload": None, "payload_fd": fdpass.Sealed(pieces), "payload_len": size,
                    "payload_spans": spans, "payload_oob": n_oob, "encoding": "pickle", "seq": seq}
        else:  # small, nothing set aside: one pickle, in the frame (base64) or the inlet (as it is)
            args = {"role": role, "payload": bytes(pieces[0]), "encoding": "pickle", "seq": seq}
        del pieces
        for name, value, default in (("key", key, None), ("lane", lane, None), ("priority", priority, 0),
                                     ("timeout", timeout, None), ("request_id", request_id, None),
                                     ("chunk", chunk, False)):
            if value is not default and value != default:
                args[name] = value
        if chunk:
            args["items"] = len(payload)
        args.update(admission)
        if len(args) > 4 or type(role) is not str or not role:  # a plain unit has nothing else to check
            try:
                # Checked here as the daemon checks it (its payload aside): a bad argument is
                # BadUnit now, before anything is queued.
                _SUBMIT.validate({**args, "payload": "", "payload_fd": None, "payload_len": None,
                                  "payload_spans": None, "payload_oob": None, "token": "checked-here"})
            except ProtocolError as exc:
                raise self._translate(exc, role, request_id) from None
        fut = _RemoteUnitFuture(self)
        with self._lock:
            if self._closing:  # shutdown() began since the check above: it waits for none of ours
                raise FleetClosed(f"client of fleet {self.name!r} is closed; cannot submit")
            self._pending[seq] = (fut, role)
        # Sent now, or with the next frame if one is in flight (fleet.api.submit_pipe);
        # its reply answers `unit_id`, or fails the future with the fleet's refusal.
        self._pipe.put(seq, fut, role, args)
        self._wake_collector()  # after the write: the collector's wake-up must not delay it
        return fut

    def _wake_collector(self) -> None:
        """A unit is owed: wake the collector if it sleeps for one. The flag is read
        without the lock, and no wake-up is missed: a collector that found nothing owed
        set it under the lock before it slept, and the unit was recorded owed under that
        lock before this is asked."""
        if self._collector_waits:
            with self._cond:
                self._cond.notify_all()

    def _token_for_pid(self, pid: int, unsent) -> str:
        """`_token_for` a frame of the submit pipe: the units in ``unsent()`` (seqs) never went
        to the old daemon, so a restart fails the others and these go to the new one."""
        with self._lock:
            if self._token_pid == pid:
                return self._token  # the same daemon: nothing to set apart (every frame but a restart's)
        seqs = unsent()  # the pipe's lock, never taken inside ours
        with self._lock:
            keep = {seq: self._pending.pop(seq) for seq in seqs if seq in self._pending}
            try:
                return self._token_for(pid)
            finally:
                self._pending.update(keep)

    def _refused(self, seq: int, fut: Future, exc: BaseException) -> None:
        """The submit of ``fut`` was refused, or its reply lost: it gets no outcome here."""
        with self._lock:
            entry = self._pending.get(seq)
            if entry is not None and entry[0] is fut:
                del self._pending[seq]
        if Future.set_running_or_notify_cancel(fut):
            fut.set_exception(exc)

    def _token_for(self, pid: int) -> str:
        """The token to submit under to the daemon ``pid`` (lock held). A new daemon (a
        restart) owes nothing of the old one's: those futures fail, a new token starts."""
        if self._token_pid is not None and self._token_pid != pid:
            self._retire_locked_and_fail(FleetConnectionLost(
                f"fleetd {self.name!r} at {self.path} restarted (pid {self._token_pid} -> {pid}); "
                "outcomes owed by the old daemon are lost"))
        self._token_pid = pid
        return self._token

    def _cancel_remote(self, fut: Future) -> bool:
        """Ask fleetd to cancel ``fut``'s unit: True if it will not run (or fleetd cannot
        be asked: then nobody waits for it here either), False if it started."""
        unit = fut.unit_id if isinstance(fut, _RemoteUnitFuture) else getattr(fut, "unit_id", None)
        if unit is None:
            return True  # never admitted (refused, or never sent): nothing runs
        try:
            reply = self.cancel(unit)
        except (FleetError, OSError) as exc:
            log.debug("fleet %s: cannot cancel unit %s in the fleet: %s", self.name, unit, exc)
            return True
        return bool(reply.get("cancelled"))

    def _translate(self, exc: BaseException, role: str, request_id: str | None = None) -> BaseException:
        """The embedded API's typed error for a refused submit; SubmitUncertain for one
        whose reply never came (it may have been admitted)."""
        if isinstance(exc, ReplyLost) or (isinstance(exc, ControlTimeout) and exc.sent) or (
                isinstance(exc, RemoteError) and exc.type == control.E_OUTCOME_UNKNOWN):
            retry = (f"submitting again with request_id={request_id!r} is safe: fleetd admits one unit per id"
                     if request_id is not None else "give submit a request_id to make a retry safe")
            return SubmitUncertain(f"submit to role {role!r} of fleet {self.name!r}: {exc}; the unit may have been "
                                   f"admitted and then runs: {retry}", role=role, request_id=request_id)
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
                lost = OutcomesDropped(exc.message)
                self._retire(lost)  # this token is refused from now on: a new one starts
                return lost
            return exc
        if isinstance(exc, ProtocolError) and exc.code == control.E_INVALID_ARGS:
            return BadUnit(exc.message)  # checked here before sending, as the daemon would
        if isinstance(exc, (NotRunning, OSError)):
            return FleetConnectionLost(f"lost fleetd {self.name!r} at {self.path}: {exc}")
        return exc

    # --- outcomes -----------------------------------------------------------------------
    def _admitted(self) -> None:
        """A submit's reply admitted a unit: its outcome will be held for us, so the
        collector polls from now on (started at the first; a uid that may not submit has
        nothing to collect, and never polls)."""
        with self._lock:
            # Even while closing: shutdown(wait=True) waits for this unit's outcome (a
            # collector with nothing owed ends at once).
            if self._collector is None:
                self._start_collector_locked()
        self._wake_collector()

    def _start_collector_locked(self) -> None:
        self._collector = threading.Thread(target=self._collect_loop, name=f"fleet-client-{self.name}", daemon=True)
        self._collector.start()

    def _collect_loop(self) -> None:
        breaks = 0  # polls in a row whose connection broke after it was made
        linger_until = 0.0  # polls go on with nothing owed until then, after a poll that worked
        while True:
            with self._cond:
                if self._waiting():
                    linger_until = time.monotonic() + COLLECT_LINGER_S
                elif breaks or time.monotonic() >= linger_until:
                    self._collector_waits = True
                    try:
                        self._cond.wait_for(lambda: self._waiting() or self._closing)
                    finally:
                        self._collector_waits = False
                if self._closing and not self._waiting():
                    return  # closing, nothing owed
            token = connected = None
            try:
                with self._polls.lock:
                    pid = self._polls.connect()
                    connected = True
                    with self._cond:
                        if self._token_pid is not None and pid != self._token_pid:
                            self._retire_locked_and_fail(FleetConnectionLost(
                                f"fleetd {self.name!r} at {self.path} restarted (pid {self._token_pid} -> {pid}) "
                                f"with unit(s) pending; their outcomes are lost"))
                            continue
                        token, ack = self._token, self._received
                    reply = self._polls.call("collect", token=token, timeout=COLLECT_WAIT_S, ack=ack, fds=True,
                                            parcels=True)
            except (ControlTimeout, ControlBusy) as exc:
                # A live daemon too slow or too busy to answer still owes the outcomes (it
                # holds what it sent until acknowledged): the futures stay pending.
                if self._closing:
                    return
                linger_until = 0.0
                log.info("fleet %s: no outcomes from %s yet (%s); polling again", self.name, self.path, exc)
                time.sleep(COLLECT_RETRY_S)
                continue
            except RemoteError as exc:
                linger_until = 0.0
                cls = OutcomesDropped if exc.type == "OutcomesDropped" else FleetConnectionLost
                self._retire(cls(f"fleetd {self.name!r} at {self.path}: {exc}"), token)
                continue
            except (FleetError, OSError) as exc:
                if self._closing:
                    return  # shutdown() aborted the poll on purpose
                linger_until = 0.0
                if connected and breaks < COLLECT_BREAKS:
                    # The connection broke under a poll: connect again and ask again. A dead
                    # daemon refuses the connection, a restarted one shows another pid.
                    breaks += 1
                    continue
                self._retire(FleetConnectionLost(
                    f"lost fleetd {self.name!r} at {self.path} with {len(self._pending)} unit(s) pending: {exc}"),
                    token)
                continue
            breaks = 0
            self._deliver(reply.get("outcomes", []), reply.get("first", 0), token)

    def _waiting(self) -> bool:
        """Some pending future is not done (cancelled ones need no outcome)."""
        return any(not fut.done() for fut, _ in self._pending.values())

    def _deliver(self, records: list[dict], first: int, token: str) -> bool:
        """Outcome records numbered from ``first`` for ``token``, from a ``collect`` reply or
        a push (`fleet.api.submit_pipe`), on whichever thread read them. Each number is
        taken once, in order (one sent again is skipped), under ``_delivery``, so two
        threads delivering overlapping runs take every record once and join a value's
        parts in order. Futures are resolved after, outside every lock: their callbacks
        may call back into this client. False when the run skips a number this client has not
        had (fleetd sends every run from one it has had at most): nothing from there on is
        taken, and the caller asks again."""
        out: list = []  # ((future, role), record, value or the exception that fails it)
        failed: tuple = ()
        skipped = False
        with self._delivery:
            for number, raw in enumerate(records, first):
                with self._lock:
                    if token != self._token:
                        break  # retired (a restart, a bad record): its futures have failed already
                    if number < self._received:
                        continue  # sent again: the reply that carried it was late, not lost
                    if number > self._received:
                        skipped = True  # taking it would lose the ones between for good
                        break
                    self._received = number + 1
                try:
                    record = outcome_record.parse(raw)
                except BadOutcomeRecord as exc:
                    failed = self._bad_record(raw, exc, token, out) or failed
                    continue
                value = outcome_record.join_part(record, self._parts)
                if value is outcome_record.INCOMPLETE:
                    continue
                with self._lock:
                    entry = self._pending.pop(record.seq, None)
                if entry is not None:  # else not ours any more (a submit that raised), or delivered
                    out.append((entry, record, value))
        if failed:
            _fail(*failed)
        for (fut, role), record, value in out:
            if record is None:
                if fut.set_running_or_notify_cancel():
                    fut.set_exception(value)
                continue
            if record.reason == Reason.CANCELLED and getattr(fut, "cancelling", False):
                Future.cancel(fut)  # the outcome of our own cancel: the future ends cancelled
                continue
            if not fut.set_running_or_notify_cancel():
                continue  # cancelled here: the unit ran anyway, nobody wants its outcome
            try:
                result = outcome_record.result_of(record, value, role)
            except BaseException as exc:  # noqa: BLE001 - a UnitError, or a value we cannot unpickle
                fut.set_exception(exc)
            else:
                fut.set_result(result)
        return not skipped

    def _bad_record(self, raw: Any, exc: BadOutcomeRecord, token: str, out: list) -> tuple:
        """A record that breaks the format fails the future it names (queued on ``out``);
        one that names none we wait for leaves no way to tell whose outcome it was, so
        every pending future fails rather than wait for ever: returns those and why."""
        seq = raw.get("seq") if isinstance(raw, dict) else None
        with self._cond:
            entry = self._pending.pop(seq, None) if isinstance(seq, int) else None
            if entry is not None:
                out.append((entry, None, exc))
                return ()
            if token != self._token:
                return ()
            lost = FleetConnectionLost(f"fleetd {self.name!r} at {self.path} sent an outcome record "
                                       f"that names no pending unit: {exc}")
            return self._retire_locked(lost), lost

    def _retire(self, exc: FleetError, token: str | None = None) -> None:
        """The daemon holding outcomes for ``token`` (default: the current one) is gone, or
        dropped them: fail every future waiting for them and start a new token. A loss
        already handled (``token`` retired meanwhile) changes nothing."""
        with self._cond:
            if token is not None and token != self._token:
                return
            failed = self._retire_locked(exc)
        _fail(failed, exc)

    def _retire_locked_and_fail(self, exc: FleetError) -> None:
        failed = self._retire_locked(exc)
        # Futures resolve outside the lock only; a callback may call back into us.
        self._cond.release()
        try:
            _fail(failed, exc)
        finally:
            self._cond.acquire()

    def _retire_locked(self, exc: FleetError) -> list[Future]:
        pending, self._pending = self._pending, {}
        self._parts.clear()
        self._token = secrets.token_urlsafe(24)
        self._received = 0
        self._token_pid = None
        self._cond.notify_all()
        if pending:
            log.warning("fleet %s: %d pending unit(s) lost: %s", self.name, len(pending), exc)
        return [fut for fut, _ in pending.values()]

    def _fail_pending(self, exc: FleetError) -> None:
        with self._cond:
            pending, self._pending = self._pending, {}
            self._parts.clear()
            self._cond.notify_all()
        _fail([fut for fut, _ in pending.values()], exc)


def _fail(futures: Iterable[Future], exc: FleetError) -> None:
    for fut in futures:
        if Future.set_running_or_notify_cancel(fut):
            fut.set_exception(exc)
