"""`SubmitPipe`: a service-mode client's submits, pipelined on a connection of their own.

A submit does not wait for its reply. Its unit is queued here; when no frame is being
written the caller writes one at once itself (a lone submit waits for nothing: no timer,
no other thread), and that frame carries every unit queued while the previous frame was
being written (other threads' submits, or units queued while a frame was being written
for them), as one ``submit_batch``. So the socket, the daemon's read and its reply are
paid once per batch, not once per unit. A batch of plain units (a role and a small
pickled payload, nothing else) goes through the connection's inlet instead
(`fleet.shm.inlet`, opened as the connection is made): pushed into shared memory for the
supervisor's loop to take itself, the loop's bell rung; its reply comes on the
connection as a frame's does. A batch the inlet has no room for, and any other, goes on
the socket.

One reader thread per connection takes the replies (one per frame, in order) and
answers each unit of the frame: its unit id (`_RemoteUnitFuture.unit_id`), or its
refusal, set on its future (QueueFull, UnknownRoleError, Draining, ...). The frames are
``submit_batch`` v2: fleetd pushes the token's outcomes on the same connection as they
are held (push frames between the replies), and this reader resolves their futures
itself, so an outcome crosses no thread between the socket and its caller; each frame
acknowledges the outcomes taken so far. The client's ``collect`` poll waits meanwhile,
and takes over the outcomes not acknowledged when this connection closes. A frame whose reply never comes (the connection broke after it went out,
or no reply within the client's timeout) fails its units with `SubmitUncertain`: they may
have been admitted. A frame that never went out whole fails its units with
`FleetConnectionLost`: the daemon admits nothing of a frame it did not read to its end.

Locks: ``_lock`` guards the queue, the frames in flight and the connection; futures are
resolved outside it (their callbacks may submit again).
"""
from __future__ import annotations

import base64
import collections
import itertools
import logging
import socket
import threading
import time
from typing import Any

from fleet.service import control
from fleet.service.control import FleetConnectionLost, ProtocolError, RemoteError, ReplyLost
from fleet.service.control import fds as fdpass
from fleet.service.control import outcome_record
from fleet.service.control.client import _remote_error
from fleet.service.control.ops.units import BATCH_VERSION, MAX_BATCH_UNITS
from fleet.service.control.wire import Push, decode_stream, encode_request
from fleet.rules.errors import FleetError
from fleet.shm import inlet as inlet_mod
from fleet.shm.dataplane import DataSegment, MessageTooLarge

log = logging.getLogger(__name__)

#: Bytes of units one frame carries at most (estimated: payload plus the other arguments),
#: below `control.MAX_FRAME` with room for the envelope.
FRAME_BUDGET = control.MAX_FRAME - 64 * 1024
#: Estimated bytes of a unit's arguments besides its payload, for the frame budget.
_UNIT_OVERHEAD = 256
#: A connection unused this long is replaced before the next frame (fleetd closes idle
#: ones after 300 s; a frame written into one it just closed would be lost).
IDLE_REFRESH_S = 60.0


class _Frame:
    """One ``submit_batch`` request: its id, its units ``(seq, future, role, args)``,
    whether it went out whole, and whether through the connection's inlet."""

    __slots__ = ("rid", "units", "sent", "at", "inlet")

    def __init__(self, rid: int, units: list):
        self.rid, self.units, self.sent, self.at, self.inlet = rid, units, False, time.monotonic(), False


class SubmitPipe:
    """The submits of one `fleet.Client`: `put` queues a unit and writes the frames;
    the reader thread answers them. ``client`` is the owner (its pending futures, token,
    error translation, role bounds)."""

    def __init__(self, client, path, *, timeout: float | None, trust_uids):
        self._client = client
        self._path, self._timeout, self._trust = path, timeout, trust_uids
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)  # unit ids waited for (`unit_id`)
        self._awaiting_ids = 0  # threads in `wait_answer`: only they are woken by an answer
        self._queue: list = []
        self._writer = False  # a thread is writing frames (one at a time: the stream must not interleave)
        self._flight: collections.deque[_Frame] = collections.deque()
        self._sock = None
        self._pid: int | None = None
        self._used = 0.0
        self._ids = itertools.count(1)
        self._closed = False
        self.frames = 0  # frames written: how many submits travelled together is units / frames
        self.inlet_frames = 0  # of those, the ones that went through the connection's inlet
        self._inlet = None  # the connection's (inlet, bell), or None: frames on the socket only
        #: Open an inlet on each connection (fleet.shm.inlet); False: frames on the socket only.
        self.use_inlet = True

    def in_flight(self) -> int:
        """Frames written whose replies have not come."""
        with self._lock:
            return len(self._flight)

    # -- the caller's side
    def put(self, seq: int, future, role: str, args: dict[str, Any]) -> None:
        """Queue one unit. With no frame in flight it goes out at once, on this thread;
        else it waits for that frame's reply, and goes out with every unit queued
        meanwhile, in the next frame (written by the reader as the reply comes)."""
        with self._lock:
            self._queue.append((seq, future, role, args))
            if self._writer or self._flight:
                return
            self._writer = True
        self._pump()

    def _pump(self) -> None:
        """Write what is queued, as the one writer (``_writer``, set by the caller under the
        lock), until nothing is queued or frames are in flight (their reader goes on)."""
        try:
            while True:
                with self._lock:
                    units, self._queue = self._queue, []
                    if not units or self._flight:
                        self._queue[:0] = units
                        self._writer = False
                        return
                self._write(units)
        except BaseException:
            with self._lock:
                left, self._queue = self._queue, []
                self._writer = False
            self._fail(left, FleetConnectionLost(f"submit to fleetd at {self._path} interrupted before it was sent"))
            raise

    def _next_frame(self) -> None:
        """A reply came (or the connection broke): with every frame answered and no writer,
        the units queued meanwhile go out now, as one frame, on this thread."""
        with self._lock:
            if self._writer or self._flight or not self._queue:
                return
            self._writer = True
        self._pump()

    def _unsent(self, units: list) -> list:
        """`units` but those whose futures ended while they were queued (cancelled here, or
        failed by a restart): those are never sent, and have no unit id."""
        keep = []
        for unit in units:
            if unit[1].done():
                unit[1]._unit_id = None
            else:
                keep.append(unit)
        if len(keep) < len(units):
            self._tell_awaiting()
        return keep

    def _write(self, units: list) -> None:
        units = self._unsent(units)
        while units:
            take, size, fds = 0, 0, 0
            for _seq, _fut, _role, args in units[:MAX_BATCH_UNITS]:
                payload = args["payload"]
                # a frame carries it in base64 (`_with_fd_indices`)
                size += (0 if payload is None else (len(payload) + 2) // 3 * 4) + _UNIT_OVERHEAD
                fds += "payload_fd" in args
                if take and (size > FRAME_BUDGET or fds > fdpass.MAX_FRAME_FDS):
                    break
                take += 1
            if not self._write_frame(units[:take], units[take:]):
                with self._lock:
                    self._queue[:0] = units  # first in the frame after the replies in flight
                return
            units = self._unsent(units[take:])

    def _write_frame(self, units: list, later: list) -> bool:
        """One frame of `units` (`later`: the units of the frames after it). False when it
        must wait for the frames in flight instead (nothing sent, nothing failed): frames
        in flight all went one way, the inlet or the socket, so their replies come in the
        order they went, and a client's units are admitted in the order it submitted them."""
        try:
            sock, pid, inlet = self._connection()
        except BaseException as exc:
            self._fail(units, self._client._translate(exc, units[0][2]))
            if isinstance(exc, Exception):
                return True
            raise
        def unsent() -> list:
            with self._lock:
                return [u[0] for u in units] + [u[0] for u in later] + [u[0] for u in self._queue]

        # A restarted daemon: the futures owed by the old one fail; these were never sent to it.
        token = self._client._token_for_pid(pid, unsent)
        units = self._unsent(units)
        if not units:
            return True
        with self._lock:
            in_inlet = any(f.inlet for f in self._flight)
            on_socket = len(self._flight) > in_inlet
        frame = _Frame(next(self._ids), units)
        if inlet is not None and not on_socket and all(_plain(u[3]) for u in units):
            if self._through_inlet(inlet, frame, token):
                return True
        if in_inlet:  # the inlet is full (or the frame is not plain): after its replies
            return False
        wire, sealed = _with_fd_indices([u[3] for u in units])
        # v2: this connection carries the token's outcomes back (pushed), and the batch
        # acknowledges the ones taken so far (fleetd lets go of them).
        data = encode_request("submit_batch", {"v": BATCH_VERSION, "token": token, "ack": self._client._received,
                                               "fds": True, "parcels": True, "units": wire}, frame.rid)
        with self._lock:
            self._flight.append(frame)  # before the bytes go: its reply may come at once
        try:
            fdpass.send_with_fds(sock, data, [one.fd for one in sealed])
        except (OSError, TimeoutError) as exc:
            # The frame did not go out whole: the daemon admits nothing of it.
            with self._lock:
                mine = frame in self._flight
                if mine:
                    self._flight.remove(frame)
            if mine:
                self._fail(units, FleetConnectionLost(f"lost fleetd at {self._path} before the submit went out: "
                                                      f"{exc}"))
            self._broken(sock, f"the connection broke: {exc}")
            return True
        finally:
            for one in sealed:
                one.close()  # sent (the daemon holds its own descriptor now) or never: ours goes
        with self._lock:
            frame.sent = True
            self.frames += 1
            self._used = time.monotonic()
        return True

    def _through_inlet(self, inlet, frame: _Frame, token: str) -> bool:
        """Send ``frame`` (its units plain: a role and a pickled payload, as `_plain` says)
        through the connection's inlet when the ring has room now: True when it went. Its
        reply comes on the connection as a frame's does."""
        units = frame.units
        ring, bell = inlet
        frame.inlet = True
        with self._lock:
            self._flight.append(frame)  # before it goes: the loop may answer at once
        went = False
        try:
            went = ring.push(frame.rid, token, self._client._received, True, True,
                             [(seq, role, args["payload"]) for seq, _fut, role, args in units])
        except MessageTooLarge:
            went = False  # larger than the ring could ever hold: the socket takes it
        finally:  # whatever stopped it (too large, or an error on its way out), it is not in flight
            if not went:
                with self._lock:
                    if frame in self._flight:  # (a broken connection failed it meanwhile)
                        self._flight.remove(frame)
                frame.inlet = False
        if not went:  # full now, or too large ever: not this way
            return False
        bell.ring()
        with self._lock:
            frame.sent = True
            self.frames += 1
            self.inlet_frames += 1
            self._used = time.monotonic()
        return True

    def _connection(self):
        """The open connection, the daemon's pid on it and its inlet (None: frames only);
        connects (opens the inlet and starts its reader) when there is none, or when it sat
        unused long enough to have been closed."""
        with self._lock:
            if self._closed:
                raise control.NotRunning(f"the client of {self._path} is closed")
            sock = self._sock
            stale = sock is not None and not self._flight and time.monotonic() - self._used > IDLE_REFRESH_S
            if sock is not None and not stale:
                return sock, self._pid, self._inlet
            inlet = self._inlet
            if stale:
                self._sock, self._inlet = None, None
        if stale:
            _close(sock, inlet)
        opener = control.ControlClient(self._path, timeout=self._timeout, trust_uids=self._trust)
        sock = opener._connect()  # SO_PEERCRED checked against the trusted uids
        pid = opener._server_pid
        inlet = self._open_inlet(opener) if self.use_inlet else None
        if opener._sock is not sock:  # the ask lost the connection (no reply in time): a new one, frames only
            sock = opener._connect()
            pid = opener._server_pid
        opener._sock = None  # the connection is this pipe's now
        with self._lock:
            if self._closed:
                _close(sock, inlet)
                raise control.NotRunning(f"the client of {self._path} is closed")
            self._sock, self._pid, self._inlet, self._used = sock, pid, inlet, time.monotonic()
        threading.Thread(target=self._read, args=(sock,), name="fleet-client-submits", daemon=True).start()
        return sock, pid, inlet

    def _open_inlet(self, opener):
        """The connection's inlet and the loop's bell it rings, or None when fleetd gives
        none (an older fleetd, its bound on inlets) or its data segment is not ours to
        map: the frames go on the socket then, as they always could."""
        try:
            reply = opener.call("open_inlet")
        except FleetError as exc:  # refused, or the op unknown there; a lost connection shows on the first frame
            log.debug("fleet client: no inlet from fleetd at %s (%s): frames go on the socket", self._path, exc)
            return None
        held, capacity, fleet = reply["inlet"], reply.get("capacity"), reply.get("fleet")
        if type(capacity) is not int or type(fleet) is not str:
            held.close()
            log.debug("fleet client: fleetd at %s sent an inlet reply without its capacity and fleet", self._path)
            return None
        try:
            ring = inlet_mod.Inlet.open(held.fd, capacity)
        except (OSError, inlet_mod.InletError) as exc:
            log.debug("fleet client: the inlet of fleetd at %s is not usable (%s)", self._path, exc)
            return None
        finally:
            held.fd = -1  # Inlet.open owns it (closed there)
        try:
            segment = DataSegment.attach(fleet, trust=self._trust)  # fleetd's own: a uid this client trusts
        except (OSError, FleetError) as exc:  # not there, not ours to open, or not a trusted uid's
            ring.close()
            log.debug("fleet client: cannot ring fleetd's loop at %s (%s): frames go on the socket", self._path, exc)
            return None
        return ring, _Bell(segment)

    # -- the reader's side
    def _read(self, sock) -> None:
        buf = bytearray()
        arrivals = fdpass.Arrivals()  # the memfds of large values, by the frame that names them
        why = "fleetd closed the connection"
        try:
            while True:
                try:
                    data = arrivals.recv(sock, 1 << 16, len(buf))
                except TimeoutError:
                    with self._lock:
                        late = self._flight and self._flight[0].sent and \
                            time.monotonic() - self._flight[0].at >= (self._timeout or 0)
                    if late:
                        why = f"no reply within {self._timeout}s"
                        break
                    continue
                if not data:
                    break
                buf += data
                while (nl := buf.find(b"\n")) >= 0:
                    fds, cut = arrivals.take(nl + 1)
                    try:
                        frame = decode_stream(bytes(buf[:nl]))
                        if cut:
                            raise ProtocolError(control.E_INVALID_REPLY, "fleetd's frame brought more descriptors "
                                                                        "than a frame may carry")
                        if fds or type(frame) is Push:
                            # each value in a memfd mapped in its record's place (none: a reply names none)
                            outcome_record.claim_values(frame.outcomes if type(frame) is Push else [], fds)
                            fds = []
                    finally:
                        fdpass.close_all(fds)
                    del buf[:nl + 1]
                    if type(frame) is Push:
                        # Outcomes, delivered on this thread: no other thread stands between
                        # the socket and the caller.
                        if not self._client._deliver(frame.outcomes, frame.first, frame.token):
                            # Closing the connection detaches the token: fleetd's poll answer
                            # then carries every outcome not acknowledged, the skipped ones too.
                            raise ProtocolError(control.E_INVALID_REPLY, f"fleetd pushed outcome {frame.first} on "
                                                                         "while earlier ones had not come")
                        continue
                    self._reply(frame)
                    self._next_frame()
        except (OSError, ValueError, ProtocolError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        except Exception:  # noqa: BLE001 - a bug here must not leave futures hanging
            log.exception("fleet client: reading submit replies from %s failed", self._path)
            why = "the client's reader failed (logged)"
        finally:
            arrivals.close()
        self._broken(sock, why)

    def _reply(self, reply) -> None:
        with self._lock:
            if not self._flight:
                raise ProtocolError(control.E_INVALID_REPLY, "a reply to no submit in flight")
            frame = self._flight.popleft()
        units = frame.units
        if not reply.ok:
            # The whole frame refused (or the connection refused: Busy, id null): nothing admitted.
            error = _remote_error(reply)
            self._answer(units, [None] * len(units))
            self._fail(units, None, error)
            if reply.id != frame.rid:
                raise ProtocolError(control.E_INVALID_REPLY, f"{reply.error_type}: {reply.error_message}")
            return
        result = reply.result
        if reply.id != frame.rid or not _batch_reply(result, len(units)):
            self._answer(units, [None] * len(units))
            self._fail(units, None, ReplyLost(f"fleetd at {self._path} sent a reply that does not fit the submits "
                                              f"(id {reply.id!r}, expected {frame.rid})"))
            raise ProtocolError(control.E_INVALID_REPLY, "submit_batch reply out of step")
        bounds = self._client._bounds
        for role, (bound, slots) in result["roles"].items():
            bounds[role] = (bound, slots)
        errors = result["errors"]
        self._answer(units, result["units"])
        refused = [(u, RemoteError(errors[str(i)]["type"], errors[str(i)]["message"]))
                   for i, u in enumerate(units) if str(i) in errors]
        for unit, error in refused:
            self._fail([unit], None, error)

    def _answer(self, units: list, ids: list) -> None:
        """Each unit's id (None: refused), for `unit_id`; wakes whoever waits for one."""
        for unit, unit_id in zip(units, ids):
            unit[1]._unit_id = unit_id
        self._tell_awaiting()
        if any(unit_id is not None for unit_id in ids):
            self._client._admitted()

    def wait_answer(self, future, timeout: float | None) -> None:
        """Wait (at most `timeout`) until `future`'s submit has its reply (`unit_id`)."""
        with self._lock:
            self._awaiting_ids += 1
            try:
                self._answered.wait_for(lambda: future._unit_id is not _UNANSWERED, timeout)
            finally:
                self._awaiting_ids -= 1

    def _tell_awaiting(self) -> None:
        """Unit ids were answered: wake the threads that wait for one. (A waiter counts
        itself under the lock before it looks, and an id is set before this is asked: one
        that saw no id is asleep and counted.)"""
        if self._awaiting_ids:
            with self._lock:
                self._answered.notify_all()

    def _broken(self, sock, why: str) -> None:
        """`sock` is done: the frames in flight on it fail SubmitUncertain (they went out,
        no reply came); the next submit connects again."""
        inlet = None
        with self._lock:
            if self._sock is sock:
                self._sock, inlet = None, self._inlet
                self._inlet = None
                lost, self._flight = list(self._flight), collections.deque()
            else:
                lost = []  # replaced already (closed, idle): its frames were answered
        _close(sock, inlet)
        for frame in lost:
            self._answer(frame.units, [None] * len(frame.units))
            self._fail(frame.units, None, ReplyLost(f"fleetd at {self._path}: {why} after the submit went out, "
                                                    "before its reply; it may have run it"))
        # The units queued behind those frames never went out: a new connection takes them
        # (unless this is the writer's own failure: it goes on itself).
        self._next_frame()

    def _fail(self, units: list, exc: BaseException | None, error: BaseException | None = None) -> None:
        """Fail each unit's future with `exc`, or with `error` translated for its role."""
        client = self._client
        for seq, future, role, args in units:
            if future._unit_id is _UNANSWERED:
                future._unit_id = None
            one = exc if exc is not None else client._translate(error, role, args.get("request_id"))
            client._refused(seq, future, one)
        self._tell_awaiting()

    def close(self) -> None:
        """No more submits; the connection closes (the client fails what is still owed)."""
        with self._lock:
            self._closed = True
            sock, self._sock = self._sock, None
            inlet, self._inlet = self._inlet, None
            lost, self._flight = list(self._flight), collections.deque()
        if sock is not None:
            _close(sock, inlet)
        for frame in lost:
            self._answer(frame.units, [None] * len(frame.units))


#: `_RemoteUnitFuture._unit_id` before its submit's reply.
_UNANSWERED = object()


def _with_fd_indices(units: list) -> tuple[list, list]:
    """The units' wire arguments, each memfd payload (`fdpass.Sealed`) named by its index
    among the frame's descriptors, a payload of bytes in base64; and those memfds, in that
    order."""
    sealed = []
    wire = []
    for args in units:
        one = args.get("payload_fd")
        if one is not None:
            args = {**args, "payload_fd": len(sealed)}
            sealed.append(one)
        elif type(args["payload"]) is bytes:
            args = {**args, "payload": base64.b64encode(args["payload"]).decode("ascii")}
        wire.append(args)
    return wire, sealed


#: What a plain unit's arguments are (`fleet.Client._submit`'s small payload, nothing else
#: asked): what an inlet carries.
_PLAIN_KEYS = frozenset({"role", "payload", "encoding", "seq"})


def _plain(args: dict) -> bool:
    return args.keys() == _PLAIN_KEYS and type(args["payload"]) is bytes


class _Bell:
    """The loop's bell in fleetd's data segment, which this client maps to ring it."""

    __slots__ = ("_segment", "ring")

    def __init__(self, segment):
        self._segment = segment
        self.ring = segment.bell.ring

    def close(self) -> None:
        self.ring = None
        self._segment.close()


def _batch_reply(result: Any, n: int) -> bool:
    """Whether `result` is a submit_batch reply for `n` units."""
    if not isinstance(result, dict):
        return False
    units, errors, roles = result.get("units"), result.get("errors"), result.get("roles")
    return (isinstance(units, list) and len(units) == n and isinstance(errors, dict) and isinstance(roles, dict)
            and all(isinstance(e, dict) and isinstance(e.get("type"), str) and isinstance(e.get("message"), str)
                    for e in errors.values())
            and all(isinstance(u, int) or (u is None and str(i) in errors) for i, u in enumerate(units))
            and all(isinstance(b, list) and len(b) == 2 for b in roles.values()))


def _close(sock, inlet=None) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
    if inlet is not None:
        ring, bell = inlet
        ring.close()
        bell.close()
