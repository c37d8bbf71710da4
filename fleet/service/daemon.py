"""fleetd: one fleet run as a service, in the foreground, under systemd or by hand.

Theory of operation. The main thread owns the daemon: it boots the `Supervisor`
(table, data plane, zygote, workers) in service mode, starts the `ControlServer`
on ``<runtime dir>/<name>.sock``, tells the service manager ``READY=1``, then turns
one loop until the fleet has stopped:

1. sleep on a self-pipe until a signal, a control call or the next timer is due;
2. dispatch queued signals, each to its ``handle_<name>`` method (a signal handler
   only appends to a queue and writes the pipe: STYLE.md item 6);
3. run the control calls queued by the control server's thread (`CallQueue`): every op
   that reads or changes the fleet runs here, on this thread;
4. expire outcome long-polls and outcomes nobody collected (`OutcomeStore`);
5. ping the watchdog (``WATCHDOG=1`` at half ``WATCHDOG_USEC``) and refresh the
   one-line ``STATUS=``;
6. once the supervisor has stopped, linger until clients have collected what they
   are owed (at most ``linger_s``), then leave.

Signals. SIGTERM drains: intake closes, in-flight units finish, units still queued
after ``grace_s`` fail with Shutdown; exit 0. SIGINT (or a second SIGTERM) stops
fast: workers are killed and everything owed fails with Shutdown; exit 0. SIGHUP
re-reads the config and applies what can change live (posture policy, queue bounds)
through the reload op (`fleet.service.control.ops.intake.ReloadOp`), logging what needs a
restart. The file is checked as boot checks it first; one boot would refuse (invalid, out
of range, a budget that does not fit, a handler the worker fork server cannot import or
call) is refused: one WARNING line names why, the running config stays, and the
``STATUS=`` line says so (``systemctl status``) until a reload is applied.

Result delivery (see fleet.service.control, "Result delivery"): a submit that carries a
client token has its outcome encoded (`fleet.service.control.outcome_record`) when the
unit ends and held in the `OutcomeStore` under that token until the client's
``collect`` long poll takes it, or, for a token a ``submit_batch`` v2 attached to its
connection, pushed on that connection: the supervisor's loop writes what each of its
deliveries held at the delivery's end (`OutcomeStore.flush`, its ``Books.on_delivered``).
The long poll is the one op that does not run on the loop: its Future is resolved
by the store itself (when an outcome arrives) or by the loop's expiry pass.

Exit codes: 0 after a requested stop; a boot refusal exits with its typed code
(ConfigError 78, TableInUse 82, BootRefused 80/81/84, ...); 1 when the fleet stops
on its own (its supervisor loop failed).
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
import selectors
import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future

from admission.records import field, record, replace
from fleet.service import control, replays, sdnotify, start_exporter
from fleet.runtime.beside import default_cap
from fleet.runtime.config import DAEMON_LIMITS, FleetConfig, load_config
from fleet.service.control import outcome_record
from fleet.service.side_thread import SideThread
from fleet.worker.codec import CodecError
from fleet.service.control.ops import ServedOperations
from fleet.service.inlets import Inlets
from fleet.host import open_files
from fleet.host.proctitle import name_process
from fleet.rules import titles
from fleet.rules.errors import EXIT_FAILURE, EXIT_OK, FleetError
from fleet.runtime import collector

log = logging.getLogger(__name__)

#: SIGTERM's default grace: queued units may still start for this long. Well below
#: the unit files' TimeoutStopSec=90s, so in-flight units have time left to finish.
DEFAULT_GRACE_S = 30.0
#: After the fleet stops, how long fleetd waits for clients to collect their outcomes.
DEFAULT_LINGER_S = 10.0
#: How often the STATUS= line is refreshed.
STATUS_EVERY_S = 5.0
#: Longest the loop sleeps; expiry of long polls is checked at least this often.
TICK_S = 0.25


#: How a client's held outcomes are bounded (`OutcomeStore.max_bytes`), and the default.
HELD_BYTES_KEY = "limits.max_held_outcome_bytes"
DEFAULT_HELD_BYTES = 64 << 20
#: How long a client's outcomes are held after it was last heard from (`OutcomeStore.ttl_s`),
#: and the default.
TTL_KEY = "limits.held_outcome_ttl_s"
DEFAULT_OUTCOME_TTL_S = 300.0


class ConfigReloadError(FleetError):
    """A SIGHUP reload was refused (the new file is invalid, or renames the fleet)."""


# ============================================================== outcomes for clients
# The records themselves (format, encoding): fleet.service.control.outcome_record.
def _size(record: dict) -> int:
    # Close enough to the JSON size: the long strings dominate, the keys add ~150 bytes;
    # a value in a memfd counts its bytes (they are held in memory as much as a string's).
    size = 160
    for v in record.values():
        if type(v) is str:
            size += len(v)
    held = record.get(outcome_record.VALUE_LEN)
    if type(held) is int:
        size += held
    return size


@record(frozen=False, eq=False)
class _Box:
    """What one client token is owed: records in order, not yet acknowledged, and a
    waiting long poll. ``base`` numbers ``items[0]`` (the token's records are numbered
    from 0 in the order they were held); the first ``sent`` items went out in a reply."""

    seen: float
    items: collections.deque = field(default_factory=collections.deque)
    base: int = 0
    sent: int = 0
    bytes: int = 0
    waiter: Future | None = None
    deadline: float = 0.0
    #: The highest ``ack`` heard on any path: an older one (a poll sent before a batch
    #: that acknowledged more) says nothing new, and drops nothing.
    acked: int = 0
    #: Records ever sent (their count, numbered as ``base``): an ack may reach this far,
    #: though an attach or a detach sends again from ``base`` (``sent`` back to 0).
    issued: int = 0
    #: The connection the token's records are pushed on (`attach`), and whether a push
    #: is asked of it already (one wake-up carries every record held meanwhile).
    stream: object = None
    push_due: bool = False
    #: The client takes large values in memfds (said by its submit_batch or collect), and
    #: those still in their worker's parcels as the parcels' descriptors.
    fds: bool = False
    parcels: bool = False


class OutcomeStore:
    """Outcomes held per client token until that client's `collect` takes them.

    Thread-safe: outcomes arrive on the supervisor's threads, long polls on the
    control server's thread, expiry on the daemon loop. Bounded, so a client that never
    collects cannot grow the daemon forever: a token not seen (no submit, no
    collect) for ``ttl_s`` seconds, or holding more than ``max_bytes``, has its
    outcomes dropped with a log line; its next collect (or submit) then fails with
    `control.OutcomesDropped`, so the client learns it lost them. The clock is
    injected (``clock``), as are the bounds.

    A reply can be lost (the client timed out on a stalled daemon, the connection
    broke), so a record sent stays held until the client acknowledges it: each
    ``collect`` (and each ``submit_batch`` v2) says how many of the token's records it
    has (``ack``); the records after those go out again. An ack older than one heard
    before (the two travel on different connections) changes nothing.

    Pushed outcomes. A token may be attached to a connection (`attach`, by a
    ``submit_batch`` v2 on it): its records then go out on that connection as they are
    held, in push frames the control thread writes (`control.Stream`), with no
    ``collect`` asked for each, and a long poll of the token waits meanwhile. Every push
    from an attach on starts at the first record not acknowledged, so the client, which
    takes each numbered record once, misses none whatever path brought the one before.
    When the connection closes the token is detached and a waiting poll is answered with
    every record not acknowledged. Once sent, a record counts as delivered: one nobody
    acknowledges goes quietly at the ttl or to make room under the byte bound, and
    fleetd's linger at a stop does not wait for acknowledgements.
    """

    def __init__(self, *, max_bytes: int = DEFAULT_HELD_BYTES, ttl_s: float = DEFAULT_OUTCOME_TTL_S,
                 clock: Callable[[], float] = time.monotonic, lost_memory: int = 4096):
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._boxes: dict[str, _Box] = {}
        self._lost: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._lost_memory = lost_memory
        self._closing = False
        self._flusher: int | None = None  # the supervisor loop's thread, once it called `flush`
        self._due: list[str] = []  # attached tokens held for on that thread: `flush` writes them
        self._writer = SideThread(titles.OUTCOME_THREAD)  # large values written out off the loop (`deliver`)
        self._writing = 0  # outcomes handed to it and not held yet

    # -- from submits and outcomes
    def hold(self, token: str, fds: bool = False, parcels: bool = False, *, ack: int | None = None,
             stream=None) -> None:
        """A submit under ``token``: keep a box for it. OutcomesDropped if it lost some.
        ``fds``: the client takes large values in memfds; ``parcels``: and in their
        parcels' descriptors (`takes`). A ``submit_batch`` v2 says the rest of what it
        says of its token under the same lock: ``ack``, as `acknowledge`; ``stream``, as
        `attach`."""
        attached = push = None
        with self._lock:
            self._refuse_lost(token)
            box = self._box(token)
            box.seen = self._clock()
            box.fds, box.parcels = box.fds or fds, box.parcels or parcels
            if ack is not None:
                self._batch_ack(token, box, ack)
            if stream is not None:
                attached, push = self._attach(token, box, stream)
        if attached:
            self._attached(token, stream, push)

    def takes(self, token: str) -> tuple[bool, bool]:
        """Whether ``token``'s client said it takes large values in memfds (its records may
        carry one; a client that did not say so gets them base64, in parts), and whether it
        takes a value still in its worker's parcel as the parcel's descriptor
        (`outcome_record.encode`'s ``fds`` and ``parcels``)."""
        with self._lock:
            box = self._boxes.get(token)
            return (box.fds, box.parcels) if box is not None else (False, False)

    def deliver(self, token: str, seq: int | None, role: str) -> Callable[[Future], None]:
        """The done-callback of a unit submitted under ``token``: its records held (`record`,
        `put`). It runs where the unit ends, on the supervisor's loop; a value still in its
        worker's parcel (`outcome_record.in_parcel`) is read and written out for the client
        (a memfd, or base64) on the store's writer thread instead, so that a large result
        costs the loop that serves every unit an open, not a copy. Until its records are held
        it counts as undelivered (fleetd's linger waits for it)."""
        def done(future: Future) -> None:
            if not outcome_record.in_parcel(future):
                self.put(token, self.record(token, seq, role, future))
                return
            with self._lock:
                self._writing += 1
            self._writer.run(lambda: self._write(token, seq, role, future))
        return done

    def _write(self, token: str, seq: int | None, role: str, future: Future) -> None:
        try:
            self.put(token, self.record(token, seq, role, future))
        finally:
            with self._lock:
                self._writing -= 1

    def record(self, token: str, seq: int | None, role: str, future) -> list[dict]:
        """The outcome records of ``future`` for ``token``'s client (`outcome_record.encode`);
        a value alone larger than ``max_bytes`` is its unit's failed ResultError naming both
        sizes and the key, never held. One the daemon cannot write out (no memory, no
        descriptor left for its memfd) is a failed ResultError saying so: the client is owed
        exactly one outcome either way."""
        try:
            fds, parcels = self.takes(token)
            return outcome_record.encode(seq, role, future, fds=fds, parcels=parcels, max_bytes=self.max_bytes,
                                         key=HELD_BYTES_KEY)
        except (OSError, MemoryError, CodecError) as exc:
            log.warning("the outcome of unit %s could not be written out for its client: %s: %s",
                        getattr(future, "unit_id", None), type(exc).__name__, exc)
            return [outcome_record.undeliverable(seq, role, future, exc)]

    def put(self, token: str, records: list[dict]) -> None:
        """Hold ``records`` for ``token``; wakes its long poll."""
        with self._lock:
            if token in self._lost:
                log.debug("outcome for dropped token %s discarded", _short(token))
                return
            box = self._box(token)
            for record in records:
                box.items.append(record)
                box.bytes += _size(record)
            if box.bytes > self.max_bytes:
                self._forget_sent(box)  # handed over already: room first, before anything is lost
            if box.bytes > self.max_bytes:
                self._drop(token, f"it held more than {self.max_bytes} bytes of uncollected outcomes "
                                  f"({HELD_BYTES_KEY})")
                wake = push = None
            elif box.stream is not None:
                wake, push = None, None
                if threading.get_ident() == self._flusher:
                    # On the supervisor's loop, in its delivery: `flush` follows at its end
                    # and writes every record held meanwhile, on this thread.
                    if not box.push_due:
                        box.push_due = True
                        self._due.append(token)
                else:
                    push = self._push_due(token, box)
            else:
                wake, push = self._take_waiter(box), None
        _resolve(wake)
        if push is not None:
            push()

    # -- pushed outcomes (submit_batch v2)
    def attach(self, token: str, stream) -> None:
        """Push ``token``'s records on ``stream`` (a `control.Stream`) from now on, from the
        first one not acknowledged; detached when the stream closes."""
        with self._lock:
            self._refuse_lost(token)
            box = self._box(token)
            box.seen = self._clock()
            attached, push = self._attach(token, box, stream)
        if attached:
            self._attached(token, stream, push)

    def _attach(self, token: str, box: _Box, stream) -> tuple[bool, Callable[[], None] | None]:
        """`attach`'s part under the lock: whether ``stream`` is newly attached, and the
        push it is then asked for (None: nothing held)."""
        if box.stream is stream:
            return False, None
        box.stream, box.sent, box.push_due = stream, 0, False
        return True, self._push_due(token, box) if box.items else None

    def _attached(self, token: str, stream, push) -> None:
        """`attach`'s part after the lock: detached when ``stream`` closes; its push asked."""
        stream.on_close(lambda: self.detach(token, stream))
        if push is not None:
            push()

    def flush(self) -> None:
        """Write the records held for attached tokens during the supervisor's delivery,
        from its loop thread (`Books.on_delivered`, called at the end of each delivery): one
        push frame per token, straight onto its connection (`control.Stream.write`), so an
        outcome crosses no thread between the loop and the socket."""
        self._flusher = threading.get_ident()
        if not self._due:
            return
        with self._lock:
            due, self._due = self._due, []
            streams = [(token, box.stream) for token in due
                       if (box := self._boxes.get(token)) is not None and box.stream is not None]
        for token, stream in streams:
            if not stream.room():  # the client is behind: the control thread pushes once it reads
                stream.ready(lambda token=token, stream=stream: self._pull(token, stream))
                continue
            stream.write(lambda token=token, stream=stream: self._pull(token, stream))

    def detach(self, token: str, stream) -> None:
        """``stream`` closed: ``token``'s records not acknowledged go to its next poll
        (a waiting one at once)."""
        with self._lock:
            box = self._boxes.get(token)
            if box is None or box.stream is not stream:
                return
            box.stream, box.sent, box.push_due = None, 0, False
            wake = self._take_waiter(box) if box.items else None
        _resolve(wake)

    def acknowledge(self, token: str, ack: int) -> None:
        """The client has ``ack`` of ``token``'s records (a ``submit_batch``'s): let go of
        them. An ack past what was sent is ignored here (a batch's ack is advisory: the
        batch goes on); OutcomesDropped when it asks again for records let go."""
        with self._lock:
            box = self._boxes.get(token)
            if box is not None:
                self._batch_ack(token, box, ack)

    def _batch_ack(self, token: str, box: _Box, ack: int) -> None:
        """A batch's ``ack`` (lock held): advisory, so one past what was sent is ignored."""
        if ack <= box.issued:
            self._acknowledge(token, box, ack)

    def _push_due(self, token: str, box: _Box):
        """The call that asks ``box``'s stream for a push, unless one is asked already (lock held)."""
        if box.push_due:
            return None
        box.push_due = True
        return self._ask_push(token, box)

    def _ask_push(self, token: str, box: _Box):
        stream = box.stream
        return lambda: stream.ready(lambda: self._pull(token, stream))

    def _pull(self, token: str, stream) -> bytes | None:
        """The push frame of ``token``'s records not sent yet, at most a reply's budget
        (called on the control thread when it writes to ``stream``); another push is
        asked when more are left. None when there is nothing to push."""
        with self._lock:
            box = self._boxes.get(token)
            if box is None or box.stream is not stream:
                return None
            box.push_due = False
            out, used = [], 0
            for record in itertools.islice(box.items, box.sent, None):
                size = _size(record)
                if out and used + size > control.COLLECT_REPLY_BUDGET:
                    break
                used += size
                out.append(record)
            if not out:
                return None
            first = box.base + box.sent
            box.sent += len(out)
            box.issued = max(box.issued, box.base + box.sent)
            more = self._push_due(token, box) if box.sent < len(box.items) else None
        if more is not None:
            more()
        return control.encode_push(token, first, out)

    # -- from collect
    def collect(self, token: str, timeout: float, ack: int | None = None, fds: bool = False,
                parcels: bool = False) -> Future:
        """A Future of ``{"outcomes", "first", "more", "closing"}`` for ``token``: resolved
        now if anything is ready (or the daemon is closing), else when something arrives
        or ``timeout`` seconds pass (then with no outcomes). ``first`` numbers the first
        outcome of the reply. ``ack``: how many of the token's records the client has
        (records before it are let go, those after it are sent, again if need be);
        None acknowledges every record sent so far."""
        fut: Future = Future()
        now = self._clock()
        with self._lock:
            try:
                self._refuse_lost(token)
                box = self._box(token)
                self._acknowledge(token, box, ack)
                box.fds, box.parcels = box.fds or fds, box.parcels or parcels
            except (control.OutcomesDropped, control.ProtocolError) as exc:
                fut.set_exception(exc)
                return fut
            box.seen = now
            previous = box.waiter  # one poll per token: an older one is answered empty
            box.waiter, box.deadline = fut, now + timeout
            # A token whose records are pushed (attached) has its poll wait: it is answered
            # when the stream closes, or empty at its timeout.
            ready = box.items and box.stream is None
            wake = [self._take_waiter(box)] if ready or self._closing or timeout <= 0 else []
            if previous is not None and previous.set_running_or_notify_cancel():
                wake.append((previous, self._reply_empty(box)))
        for item in wake:
            _resolve(item)
        return fut

    # -- from the loop
    def expire(self) -> None:
        """Answer long polls whose timeout passed; drop tokens not seen for ``ttl_s``. Records
        held on the loop's thread and not flushed (held outside a delivery) are pushed by
        the control thread."""
        now = self._clock()
        wake = []
        with self._lock:
            left, self._due = self._due, []
            pushes = [push for token in left if (box := self._boxes.get(token)) is not None
                      and box.stream is not None and (push := self._ask_push(token, box)) is not None]
            for token, box in list(self._boxes.items()):
                if box.waiter is not None:
                    if now >= box.deadline:
                        wake.append(self._take_waiter(box) if box.stream is None else self._expire_empty(box))
                    continue
                if now - box.seen > self.ttl_s:
                    if len(box.items) > box.sent:
                        self._drop(token, f"nobody collected them for {self.ttl_s:g}s ({TTL_KEY})")
                    else:
                        del self._boxes[token]
        for item in wake:
            _resolve(item)
        for push in pushes:
            push()

    def close(self) -> None:
        """The daemon is stopping: answer every waiting poll now (``closing: true``)."""
        with self._lock:
            self._closing = True
            wake = [self._take_waiter(box) for box in self._boxes.values() if box.waiter is not None]
        for item in wake:
            _resolve(item)

    def undelivered(self) -> int:
        """Records held and never sent, over every token, and outcomes still being written
        out (`deliver`)."""
        with self._lock:
            return self._writing + sum(len(box.items) - box.sent for box in self._boxes.values())

    def tokens(self) -> int:
        with self._lock:
            return len(self._boxes)

    # -- internals (lock held)
    def _box(self, token: str) -> _Box:
        box = self._boxes.get(token)
        if box is None:
            box = self._boxes[token] = _Box(seen=self._clock())
        return box

    def _acknowledge(self, token: str, box: _Box, ack: int | None) -> None:
        """Let go of the records the client has (its ``ack``); ProtocolError for an ack
        past what was sent, OutcomesDropped when it asks again for records let go."""
        held_to = box.issued
        ack = held_to if ack is None else max(ack, box.acked)
        if ack > held_to:
            raise control.ProtocolError(control.E_INVALID_ARGS, f"ack {ack} is past the {held_to} outcome(s) "
                                                                "sent for this token")
        if ack < box.base:
            self._drop(token, f"the client asked again for outcome(s) {ack}..{box.base - 1}, let go "
                              "after they were sent")
            self._refuse_lost(token)
        box.acked = ack
        while box.base < ack:
            box.bytes -= _size(box.items.popleft())
            box.base += 1
            box.sent = max(0, box.sent - 1)

    def _forget_sent(self, box: _Box) -> None:
        """Let go of every record sent and not acknowledged (they were handed over)."""
        while box.sent:
            box.bytes -= _size(box.items.popleft())
            box.base += 1
            box.sent -= 1

    def _refuse_lost(self, token: str) -> None:
        reason = self._lost.get(token)
        if reason is not None:
            raise control.OutcomesDropped(f"outcomes held for this client were dropped: {reason}")

    def _drop(self, token: str, why: str) -> None:
        box = self._boxes.pop(token)
        log.warning("dropped %d outcome(s) held for client token %s: %s", len(box.items), _short(token), why)
        self._lost[token] = why
        while len(self._lost) > self._lost_memory:
            self._lost.popitem(last=False)
        if box.waiter is not None and box.waiter.set_running_or_notify_cancel():
            box.waiter.set_exception(control.OutcomesDropped(f"outcomes held for this client were dropped: {why}"))

    def _take_waiter(self, box: _Box):
        """(waiter, reply) with what fits one reply; None if no live poll waits.

        The waiter is marked running first: a poll the server already cancelled
        (it is closing) takes nothing, so no record is lost with it.
        """
        fut, box.waiter = box.waiter, None
        if fut is None or not fut.set_running_or_notify_cancel():
            return None
        # From the first record the client lacks: records stay held until acknowledged.
        out, used = [], 0
        for record in box.items:
            size = _size(record)
            if out and used + size > control.COLLECT_REPLY_BUDGET:
                break
            used += size
            out.append(record)
        box.sent = max(box.sent, len(out))
        box.issued = max(box.issued, box.base + box.sent)
        return fut, {"outcomes": out, "first": box.base, "more": len(out) < len(box.items),
                     "closing": self._closing}

    def _expire_empty(self, box: _Box):
        """(waiter, an empty reply) for a poll whose token's records are pushed: the stream
        carries them, none goes again by the poll."""
        fut, box.waiter = box.waiter, None
        if fut is None or not fut.set_running_or_notify_cancel():
            return None
        return fut, self._reply_empty(box)

    def _reply_empty(self, box: _Box) -> dict:
        return {"outcomes": [], "first": box.base, "more": False, "closing": self._closing}


def _resolve(item) -> None:
    """Answer a long poll taken under the lock (outside it: waking threads is not free)."""
    if item is not None:
        fut, reply = item
        fut.set_result(reply)


def _short(token: str) -> str:
    return token[:8] + "..."


# ================================================================== the daemon
@record(frozen=False)
class Options:
    """What the command line chose (see fleet.cli.fleetd)."""

    config_path: str
    name: str | None = None
    grace_s: float = DEFAULT_GRACE_S
    linger_s: float = DEFAULT_LINGER_S
    socket_group: str | int | None = None
    socket_mode: int = 0o660
    #: fleetd's command-line arguments, shown after its name in ps (fleet.rules.titles);
    #: None: the process keeps its name (a Daemon run inside another program)
    title_args: tuple | None = None


class Daemon:
    """fleetd's state and main loop. Construction is inert: `run` boots and serves.

    The OS and the clock are injected: ``env`` (for config overrides, the runtime
    dir and sd_notify), ``clock`` (monotonic seconds), ``notify`` (the sd_notify
    module or a stand-in with ready/status/watchdog/stopping/reloading).
    """

    SIGNALS = {signal.SIGTERM: "term", signal.SIGINT: "int", signal.SIGHUP: "hup"}

    def __init__(self, options: Options, *, env: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic, notify=sdnotify):
        self.options = options
        self.env = dict(os.environ if env is None else env)
        if options.name is not None:
            self.env["FLEET_NAME"] = options.name  # --name wins over the file, at boot and at reload
        self.clock = clock
        self.notify = notify
        self.config: FleetConfig | None = None
        self.sup = None
        self.server: control.ControlServer | None = None
        self.calls: control.CallQueue | None = None
        self.handler: ServedOperations | None = None  # what the control ops run against
        self.store = OutcomeStore(clock=clock)
        self.replays = replays.Replays(clock=clock)  # submits made at most once per request_id
        self.inlets: Inlets | None = None  # the clients' inlets (fleet.service.inlets), once booted
        self._signals: collections.deque[int] = collections.deque()
        self._wake_r = self._wake_w = -1
        self._stopping: str | None = None  # None, "drain" or "kill"
        self._linger_until: float | None = None
        self._watchdog: sdnotify.WatchdogSchedule | None = None
        self._next_status = 0.0
        self._notify_failed = False
        self._exit_code = EXIT_OK
        self._reload_refused: str | None = None  # why the last reload was refused (STATUS= says it)

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        """Boot, serve until stopped, clean up; returns the exit code.

        Raises the typed boot errors (ConfigError, TableInUse, BootRefused,
        ControlError, ...) before anything is served; nothing is left behind then.
        """
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in self.SIGNALS}
        try:
            with collector.paused():  # the boot's imports and objects, without collections (fleet.runtime.collector)
                self.boot()
            try:
                self._loop()
            finally:
                self._shut()
            return self._exit_code
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(self._wake_r)
            os.close(self._wake_w)

    def boot(self) -> None:
        """Config, runtime dir, supervisor (workers up), control socket, READY=1."""
        from fleet.runtime.loop import Supervisor

        self.config = load_config(self.options.config_path, env=self.env)
        self._apply_limits(self.config.limits)
        raised = open_files.raise_soft()  # its workers keep the limit found (fleet.host.open_files)
        if raised is not None:
            log.info("open files: soft limit raised from %d to %d (the hard limit); workers keep %d", raised[0],
                     raised[1], raised[0])
        name = control.validate_fleet_name(self.config.name)
        if self.options.title_args is not None:
            name_process(titles.daemon(name, self.options.title_args))
        directory = control.prepare_runtime_dir(control.runtime_dir(self.env))
        path = directory / f"{name}.sock"
        # The socket group may read the table too (fleetctl status), never the data segment.
        from fleet.runtime.provider_gate import default_closure_file

        # Closures outlive a restart: a restarted fleetd must not re-spend a key it knows is spent.
        self.sup = Supervisor(self.config, mode="service", socket_path=str(path),
                              readers_group=self.options.socket_group,
                              closure_file=default_closure_file(name, self.env), exporter=start_exporter).start()
        # The outcomes held for clients during a delivery go out at its end, on the loop.
        self.inlets = Inlets(self)  # the loop takes a client's batches from its inlet itself
        self.sup.books.on_delivered = self._turned
        try:
            self.handler = ServedOperations(self)
            self.calls = control.CallQueue(wakeup=self._wake)
            self.server = control.ControlServer(
                path, control.with_blocking_ops(self.handler, self.calls.submit, self.calls.refusal,
                                                side=SideThread(titles.INTAKE_THREAD)),
                group=self.options.socket_group, mode=self.options.socket_mode,
                cpus=lambda: self.sup.loop_cpus,  # the control plane runs beside the loop
            ).start()
        except BaseException:
            self.sup.kill()
            raise
        interval = sdnotify.watchdog_interval(self.env)
        if interval is not None:
            self._watchdog = sdnotify.WatchdogSchedule(interval, self.clock())
        log.info("fleet %s: serving on %s (%s); pid %d", name, path, self._summary(), os.getpid())
        self._send("ready", self._summary())
        self._next_status = self.clock() + STATUS_EVERY_S

    def _turned(self) -> None:
        """The end of a turn of the supervisor's loop, on its thread: the replies of the
        batches its inlets brought, then the outcomes held for attached clients."""
        self.inlets.flush()
        self.store.flush()

    def _loop(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._wake_r, selectors.EVENT_READ)
            while True:
                sel.select(self._sleep_for(self.clock()))
                self._drain_pipe()
                while self._signals:
                    name = self.SIGNALS[self._signals.popleft()]
                    getattr(self, f"handle_{name}")()
                self.calls.run_pending(self.handler)
                self.store.expire()
                now = self.clock()
                self._heartbeat(now)
                if self._finished(now):
                    return

    def _shut(self) -> None:
        """After the loop: answer the long polls, close the socket, join the stopper."""
        self.store.close()
        if self.calls is not None:
            self.calls.close()
        if self.server is not None:
            self.server.close()
        if self.sup is not None and not self.sup.wait_stopped(0):
            self.sup.kill()  # the loop left early (an exception): never leave workers behind
        if self.inlets is not None:
            self.inlets.close()  # the loop that read them has stopped
        log.info("fleet %s: stopped; ledger %s", self.config.name if self.config else "?",
                 self.sup.ledger_counts().to_dict() if self.sup else {})

    # ------------------------------------------------------------------ loop parts
    def _sleep_for(self, now: float) -> float:
        wait = TICK_S
        if self._watchdog is not None:
            wait = min(wait, self._watchdog.remaining(now))
        return max(0.0, min(wait, self._next_status - now))

    def _heartbeat(self, now: float) -> None:
        if self._watchdog is not None and self._watchdog.due(now):
            self._send("watchdog")
            self._watchdog.pinged(now)
        if now >= self._next_status:
            self._send("status", self._summary())
            self._next_status = now + STATUS_EVERY_S

    def _finished(self, now: float) -> bool:
        if not self.sup.wait_stopped(0):
            return False
        if self._stopping is None:
            log.error("fleet %s: the supervisor stopped on its own; exiting", self.config.name)
            self._exit_code = EXIT_FAILURE
            return True
        if self._linger_until is None:
            self.store.close()  # waiting polls learn at once that nothing new will come
            self._linger_until = now + self.options.linger_s
        return self.store.undelivered() == 0 or now >= self._linger_until

    def _summary(self) -> str:
        # The ledger itself (thread-safe), not a call on the supervisor's loop: the status
        # line goes out with the watchdog ping, which must not wait on a busy loop.
        counts = self.sup.ledger.counts().to_dict()
        text = (f"{self.sup.plan.binding} binding, {len(self.sup.layout.seats)} seat(s); "
                f"units: {counts['submitted']} submitted, {counts['solved']} solved, "
                f"{counts['suppressed']} suppressed, {counts['failed']} failed, {counts['inflight']} in flight")
        if self._reload_refused:
            text += f"; last reload refused: {self._reload_refused}"
        if self._stopping:
            text += "; stopping"
        elif self.sup.draining:  # the door's flag, the fleet's one copy (a plain attribute the loop swaps)
            text += "; draining"
        return text

    def _send(self, what: str, *args) -> None:
        try:
            getattr(self.notify, what)(*args, env=self.env)
        except sdnotify.NotifyError as exc:
            if not self._notify_failed:  # once: a missing manager must not flood the log
                log.warning("sd_notify: %s", exc)
                self._notify_failed = True

    # ------------------------------------------------------------------ signals
    def _on_signal(self, signum, frame) -> None:
        # Only enqueue: the loop owns the state and dispatches to handle_<name>.
        self._signals.append(signum)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # the pipe is full: the loop is already due to wake

    def _drain_pipe(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def handle_term(self) -> None:
        """SIGTERM: drain (a second one stops fast)."""
        if self._stopping is not None:
            log.warning("fleet %s: SIGTERM again while stopping: stopping fast", self.config.name)
            self.handle_int()
            return
        log.info("fleet %s: SIGTERM: draining; queued units fail with Shutdown after %gs",
                 self.config.name, self.options.grace_s)
        self._begin_stop("drain", lambda: self.sup.stop(self.options.grace_s, wait=False))

    def handle_int(self) -> None:
        """SIGINT: stop now; everything still owed fails with Shutdown."""
        if self._stopping == "kill":
            return
        log.info("fleet %s: stopping fast: workers are killed, units owed fail with Shutdown", self.config.name)
        self._begin_stop("kill", lambda: self.sup.kill(wait=False))

    @property
    def stopping(self) -> str | None:
        """None, or how the daemon stops: "drain" (SIGTERM) or "kill" (SIGINT, a second SIGTERM)."""
        return self._stopping

    def _begin_stop(self, how: str, stop: Callable[[], None]) -> None:
        self._stopping = how
        self._send("stopping")
        self._send("status", self._summary())
        # Posted to the supervisor's loop, not waited for: this loop keeps answering long
        # polls (clients collect outcomes meanwhile) and pinging the watchdog, and sees
        # the supervisor stopped in `_finished`. A stop posted to a fleet that has
        # stopped already is a no-op.
        stop()

    def handle_hup(self) -> None:
        """SIGHUP: re-read the config; apply what can change live, log the rest."""
        if self._stopping is not None:
            log.info("fleet %s: SIGHUP ignored: stopping", self.config.name)
            return
        self._send("reloading")
        if self._watchdog is not None:  # the check waits on the fork server (bounded): start with a fresh ping
            self._send("watchdog")
            self._watchdog.pinged(self.clock())
        try:
            result = self.reload()
        except FleetError as exc:
            # A warning, not an error: the fleet runs on, as it was; the operator fixes the file.
            self._reload_refused = f"{type(exc).__name__}: {exc}"
            log.warning("fleet %s: reload refused, nothing changed: %s", self.config.name, self._reload_refused)
            if str(getattr(exc, "path", "")).startswith("admission"):
                self.handler.admission_reload_refused(str(exc))  # the last good catalog stays; status says why
        except Exception:  # a fault in reading or checking the file must not stop a running fleet
            self._reload_refused = "an internal error (logged)"
            log.exception("fleet %s: reload failed; the running config stays", self.config.name)
        else:
            self._reload_refused = None
            log.info("fleet %s: reload from %s: applied %s; needs a restart to change: %s", self.config.name,
                     self.options.config_path, ", ".join(result["applied"]) or "nothing",
                     ", ".join(result["needs_restart"]) or "nothing")
        self._send("ready", self._summary())

    def _apply_limits(self, limits) -> list[str]:
        """fleetd's own limits (`config.DAEMON_LIMITS`) onto its outcome store, at boot and at
        each reload; the keys whose value changed. A lower byte bound applies from the next
        outcome held: a client already past it loses its outcomes then (OutcomesDropped)."""
        held = default_cap() if limits.max_held_outcome_bytes is None else limits.max_held_outcome_bytes
        ttl = DEFAULT_OUTCOME_TTL_S if limits.held_outcome_ttl_s is None else limits.held_outcome_ttl_s
        store, changed = self.store, []
        if held != store.max_bytes:
            changed.append(HELD_BYTES_KEY)
        if ttl != store.ttl_s:
            changed.append(TTL_KEY)
        store.max_bytes, store.ttl_s = held, ttl
        return changed

    def reload(self) -> dict:
        """Load the config file again and hand it to the reload op (`ReloadOp`, on the loop).

        Raises ConfigError / PostureRetuneError, the boot refusal of a config that could
        not boot here (BootRefused), or ConfigReloadError when the new file names another
        fleet; nothing changed then.
        """
        new = load_config(self.options.config_path, env=self.env)
        if new.name != self.config.name:
            raise ConfigReloadError(f"the config now names fleet {new.name!r}, not {self.config.name!r}; "
                                    "a fleet cannot be renamed live (start it under the new name)")
        result = self.handler.reload(new)
        result["applied"] += self._apply_limits(new.limits)
        self.config = replace(self.config, limits=replace(
            self.config.limits, **{key: getattr(new.limits, key) for key in DAEMON_LIMITS}))
        if "roles" not in result["needs_restart"]:
            # Keep what was applied (queue bounds for submit replies); roles that need
            # a restart keep the running definition.
            self.config = replace(self.config, posture=new.posture, roles=new.roles)
        elif "posture" in result["applied"]:
            self.config = replace(self.config, posture=new.posture)
        return result
