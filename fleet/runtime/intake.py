"""What other threads hand to the supervisor's loop, which alone owns its state, and the
little of it they may read.

`Door` is the supervisor's side that callers' threads touch: the command queue, the
queue room, unit ids, whether the fleet is closing and which roles stopped (the loop
writes those, callers only read), and the loop thread's identity and its end.

`Intake` is the loop's command queue. Callers (submit, map, operator ops, stop, the
lease gate's thread) post a command and ring the loop's bell; the loop drains the
whole queue each turn, so one wake-up carries as many submits as arrived meanwhile.
A command is ``fn(*args)``: the loop runs it and, when a `reply` Future is given,
resolves it with the result or the exception. Once the loop has stopped, `close`
turns late commands away: a command posted after that (or still queued) gets
`FleetClosed` on its reply (or through its `refused` callback), whoever pops it first.

`QueueRoom` is the one piece of intake state a caller touches: per role, how many
units wait (submitted, not yet granted a slot) against the role's queue bound. A
submit takes room before it posts (waiting for it, or refusing at once with
`QueueFull`); the loop gives it back when the unit is granted or ends unstarted.
It is a counting semaphore per role with its own lock, the way `queue.Queue`
bounds a producer: the loop never waits on it.
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
from concurrent.futures import Future

from fleet.rules.raised import role_broken
from fleet.rules.unit import Draining, FleetClosed, QueueFull
from fleet.rules.when import utc
from fleet.runtime.future import HANDOVER


class TurnedAway(FleetClosed):
    """A command the loop never ran: it had stopped (the caller may read what it left)."""


class Intake:
    """Commands for the loop thread; any thread posts, only the loop drains.

    Pacing. A thread that posts faster than the loop drains (a plain loop of submits)
    holds the GIL for whole switch intervals, while the loop, which calls into C at
    every grant, gives the GIL up at each call and waits an interval to get it back:
    the loop would dispatch nothing until the poster stops. So a paced post that finds
    `high` commands still queued waits (GIL released) until the loop has drained them
    below `low`: the poster and the loop take turns, and units start while the caller
    is still submitting. The loop thread itself never waits (it would wait for itself).
    """

    def __init__(self, wake, high: int = 256, low: int = 64, pace_timeout: float = 0.05):
        self._queue: collections.deque = collections.deque()
        #: pending() -> commands queued: the loop looks with no Python frame before it drains
        self.pending = self._queue.__len__
        self._wake = wake
        self._closed: str | None = None
        self.high, self.low, self.pace_timeout = high, low, pace_timeout
        self._paced = threading.Condition(threading.Lock())
        self._pacing = 0  # posters waiting for the queue to go below `low`
        self._runs: dict = {}  # fn -> many: consecutive posts of fn, drained in one call (`take_runs`)

    def take_runs(self, fn, many) -> None:
        """From here on, consecutive queued posts of `fn` (no reply) are drained in one
        ``many([args, ...])`` call, in their order: a burst of submits is one call on the
        loop, not one per unit. `many` must do what `fn` would for each, in order. Should it
        raise, it first removes from the front of the list the commands it took: the ones
        left go back to the head of the queue (a stop's drain takes them, or they are
        turned away), so none is lost with the error."""
        self._runs[fn] = many

    def post(self, fn, *args, reply: Future | None = None, refused=None, pace: bool = False,
             hand_over: bool = False) -> None:
        """Queue ``fn(*args)`` for the loop and wake it. After `close` it is turned away at
        once: `reply` fails, or ``refused(FleetClosed, *args)`` is called (the command's
        own args, so a poster needs no closure per command). `pace`: wait while
        the loop is `high` commands behind (see the class doc). `hand_over`: the poster is
        a caller that watches for its results next (fleet.runtime.future.HANDOVER): the
        loop it wakes looks on until that watch lets go of the GIL."""
        queue = self._queue
        queue.append((fn, args, reply, refused))
        if self._closed is not None:
            self._turn_away()  # the loop is gone: nobody else will pop it
            return
        n = len(queue)
        if n == 1:
            # Only the post that finds the queue empty rings: a later one finds an
            # earlier command still queued, and the loop drains until the queue is empty
            # (or runs another turn at once when it stopped at its limit), so it sees
            # this one too without another wake-up.
            if hand_over:
                HANDOVER.caller_holds()
            self._wake()
        elif pace and n >= self.high:
            self._wait_for_loop()

    def _wait_for_loop(self) -> None:
        with self._paced:
            self._pacing += 1
            try:
                # Bounded: pacing is a turn-taking hint, not a bound (QueueRoom is).
                # A loop busy in a long turn (or in a callback that waits for this very
                # thread) slows the poster down; it never strands it.
                while len(self._queue) >= self.low and self._closed is None:
                    if not self._paced.wait(self.pace_timeout):
                        break
            finally:
                self._pacing -= 1

    def call(self, fn, *args, timeout: float | None = None):
        """Run ``fn(*args)`` on the loop and return its result (or raise its exception).
        Raises TimeoutError when the loop has not answered within `timeout` seconds."""
        reply: Future = Future()
        self.post(fn, *args, reply=reply)
        return reply.result(timeout)

    def drain(self, limit: int | None = None) -> int:
        """Run the queued commands (the loop thread only), at most `limit` of them; how
        many ran. A limit lets the loop act on a batch (dispatch it) while a fast
        producer is still posting, instead of draining for as long as it posts."""
        ran = 0
        queue = self._queue
        runs = self._runs
        woken = False  # paced posters told, once a drain takes the queue below `low`
        while queue and (limit is None or ran < limit):
            try:
                fn, args, reply, _refused = queue.popleft()
            except IndexError:  # a late poster's `_turn_away` took it
                break
            ran += 1
            many = runs.get(fn) if reply is None and runs else None
            if many is not None and queue and queue[0][0] is fn and queue[0][2] is None:
                run, commands = [args], [(fn, args, reply, _refused)]
                while queue and (limit is None or ran < limit):
                    head = queue[0]
                    if head[0] is not fn or head[2] is not None:
                        break
                    try:
                        command = queue.popleft()
                    except IndexError:  # a late poster's `_turn_away` took it
                        break
                    commands.append(command)
                    run.append(command[1])
                    ran += 1
            else:
                run = None
            if not woken and self._pacing and len(queue) < self.low:
                woken = True
                with self._paced:
                    self._paced.notify_all()
            if run is not None:
                try:
                    many(run)
                except BaseException:
                    if run:  # the commands `many` did not take go back first (see `take_runs`)
                        queue.extendleft(reversed(commands[len(commands) - len(run):]))
                    raise
                continue
            if reply is None:
                fn(*args)
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - the caller gets it, the loop goes on
                reply.set_exception(exc)
            else:
                reply.set_result(result)
        return ran

    def close(self, why: str) -> None:
        """The loop has stopped: fail what is still queued and whatever comes later."""
        self._closed = why
        self._turn_away()

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def _turn_away(self) -> None:
        while True:
            try:
                _fn, args, reply, refused = self._queue.popleft()
            except IndexError:
                return
            if refused is not None:
                refused(TurnedAway(self._closed), *args)
            elif reply is not None:
                reply.set_exception(TurnedAway(self._closed))


class QueueRoom:
    """Per role: units waiting for a slot, against the role's queue bound."""

    def __init__(self, bounds: list[int]):
        self._bounds = list(bounds)
        self._waiting = [0] * len(bounds)
        # Held as `_lock` on the hot paths (take, give): a Condition's `with` is two Python
        # calls around the lock's, on a path that runs once per unit on each side.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._sleepers = 0
        self._closed: str | None = None

    def take(self, code: int, name: str, block: bool = True, timeout: float | None = None, n: int = 1) -> int:
        """Room for up to `n` more units of role `code`: how many it took (1..n), as many
        as are free. When none is, waits for one (at most `timeout` seconds; None waits
        as long as it takes). Raises QueueFull when `block` is False and the queue is
        full, or when `timeout` passes first."""
        with self._lock:
            if self._closed is not None:
                raise FleetClosed(self._closed)
            if self._waiting[code] >= self._bounds[code]:
                if not block:
                    raise QueueFull(f"role {name!r} queue is full ({self._bounds[code]} units waiting)")
                self._wait_for_room(code, name, timeout)
            took = min(n, self._bounds[code] - self._waiting[code])
            self._waiting[code] += took
            return took

    def _wait_for_room(self, code: int, name: str, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._sleepers += 1
        try:
            while self._waiting[code] >= self._bounds[code]:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise QueueFull(f"role {name!r} queue stayed full ({self._bounds[code]} units waiting) "
                                    f"for {timeout:g} s")
                self._cond.wait(left)
                if self._closed is not None:
                    raise FleetClosed(self._closed)
        finally:
            self._sleepers -= 1

    def give(self, code: int, n: int = 1) -> None:
        """`n` units of role `code` left the queue (granted, or ended unstarted)."""
        with self._lock:
            self._waiting[code] -= n
            if self._sleepers:
                self._cond.notify_all()

    def set_bounds(self, bounds: list[int]) -> None:
        """New queue bounds (a reload); waiters re-check at once."""
        with self._cond:
            self._bounds = list(bounds)
            self._cond.notify_all()

    def close(self, why: str) -> None:
        """No more room, ever: every waiter (and every later `take`) raises FleetClosed."""
        with self._cond:
            self._closed = why
            self._cond.notify_all()

    def bounds(self) -> list[int]:
        with self._cond:
            return list(self._bounds)

    def waiting(self, code: int) -> int:
        return self._waiting[code]


class Door:
    """What callers' threads touch of a supervisor, each piece safe for them: the loop's
    command queue (`intake`), the roles' queue room (`room`), unit ids, the closing flag
    and the stopped roles (`role_stops`: the loop writes both, callers read), and the loop
    thread's identity (`on_loop`) and end (`stopped`)."""

    def __init__(self, name: str, queue_bounds: list[int], role_stops, wake):
        self.name = name
        self.intake = Intake(wake)
        self.room = QueueRoom(queue_bounds)
        self.role_stops = role_stops
        self._ids = itertools.count(1)  # next() is atomic: callers number their own units
        #: new_id() -> the next unit id: the counter's own __next__ (every submit calls it)
        self.new_id = self._ids.__next__
        #: Intake closed: no new units (written by the loop only, a plain attribute swap).
        self.closing = False
        #: Draining since (epoch seconds), or None: submits are refused with Draining
        #: while queued and in-flight units finish. The fleet's one copy of the drain:
        #: written by the loop only (`Supervisor.set_draining`), read by any thread.
        self.draining_since: float | None = None
        self.stopped = threading.Event()  # set once the loop has stopped (and torn down)
        self._thread: threading.Thread | None = None
        self._loop_ident: int | None = None  # the loop thread's ident (`on_loop`, on every submit)

    # ------------------------------------------------------------------ the loop thread
    def open(self, thread: threading.Thread) -> None:
        """The loop thread about to start: from here on submits are posted to it."""
        self._thread = thread

    @property
    def started(self) -> bool:
        return self._thread is not None

    def joined(self) -> None:
        """Called on the loop thread as it starts: its identity, for `on_loop`."""
        self._loop_ident = threading.get_ident()

    def on_loop(self) -> bool:
        """Whether this is the loop's thread (a future's callback runs there)."""
        return threading.get_ident() == self._loop_ident

    def is_loop_thread(self, thread: threading.Thread) -> bool:
        return thread is self._thread

    def close(self) -> None:
        """Refuse new units from here on (the loop's, as it closes)."""
        self.closing = True

    def shut(self, why: str) -> None:
        """The loop has stopped: turn late commands away, wake every caller waiting for
        room, and let `stopped` waiters go."""
        self.intake.close(why)
        self.room.close(why)  # a caller waiting for room learns it at once
        self.stopped.set()

    # ------------------------------------------------------------------ callers
    def issued(self, unit_id: int) -> bool:
        """Whether this fleet ever handed out `unit_id` (a look spends an id: ids are
        unique, not dense)."""
        return 0 < unit_id < next(self._ids)

    def refuse_if_role_stopped(self, code: int, role: str) -> None:
        """RoleBroken for a role that was stopped (all a running unit's child is refused for:
        a closing or draining fleet still owes its parent, and so takes it)."""
        if code in self.role_stops.view:
            why = self.role_stops.reasons.get(code, "repeated worker deaths")
            raise role_broken(f"role {role!r} was stopped ({why}); it takes no more work")

    def refuse_if_closed(self, code: int, role: str) -> None:
        """FleetClosed once the fleet is shut down (or was never started); RoleBroken for
        a role that was stopped; Draining while a drain holds the door."""
        if self.closing or self._thread is None or self.intake.closed:
            raise FleetClosed(f"fleet {self.name!r} is shut down; cannot submit")
        if code in self.role_stops.view:
            why = self.role_stops.reasons.get(code, "repeated worker deaths")
            raise role_broken(f"role {role!r} was stopped ({why}); it takes no more work")
        since = self.draining_since
        if since is not None:
            raise Draining(f"fleet {self.name!r} is draining since {utc(since)}: it takes no new units "
                           "until resumed (fleetctl resume); submit again then", since)

