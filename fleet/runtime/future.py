"""`UnitFuture`: a `concurrent.futures.Future` that is cheap to create and resolve.

A stdlib Future builds a `threading.Condition` in `__init__` (a Python-level object
around an RLock, with a deque of waiters) and a handful of lists, and every method
takes the lock. Most unit futures are never waited on while pending: they are
resolved first and read afterwards, or only read by a callback. A UnitFuture keeps
the stdlib's states, attribute names and behaviour, but starts with nothing more
than a bare RLock; the Condition is built the first time a thread waits.

Rules this module keeps:

* The states are the stdlib's own constants, in the slot `_state`: `wait()` and
  `as_completed()` read `f._state`, `f._condition` and `f._waiters` directly, and
  compare against those constants.
* A move (cancel, start, finish) is legal only if the state is a key of the event's
  row in TRANSITIONS. A missing key IS the illegal move; each method answers it the
  way the stdlib does (False, RuntimeError or InvalidStateError) and changes nothing.
* Every move, every added callback and the birth of the Condition hold the future's
  own RLock, `_lock`. The Condition is born around that same RLock, on the first
  access of `_condition` or `_waiters`, and is final.
* A move decides whether to tell waiters and notify by reading `_cond` while it
  holds `_lock`, never before.
* The predicates and the reads of a finished future take no lock: one attribute
  read is atomic, and a finished future's result is written before its state is.

Why no wake-up is lost: it is the stdlib's own argument, kept by one lock. A waiter
(a blocked `result()`, or `wait()`/`as_completed()` through `_condition`) holds
`_lock` while it checks `_state` and installs itself, and its Condition was born
before that, under `_lock` too. A move holds `_lock` while it changes `_state` and
reads `_cond`. So a move runs wholly before the check - the waiter sees the new
state and does not sleep - or wholly after the install, and then it sees the
Condition and the waiter, tells the waiter and notifies.

`_lock` is an RLock, as the stdlib's is, so code that holds `f._condition` may still
call the future's methods, and a signal handler that resolves the future its thread
is in the middle of moving re-enters instead of deadlocking.
"""
from __future__ import annotations

import threading
import time
from _thread import RLock as _RLock
from concurrent.futures import Future
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    LOGGER,
    PENDING,
    RUNNING,
    CancelledError,
    InvalidStateError,
)

from fleet.shm.dataplane import Handover, Pulse

__all__ = ["UnitFuture", "TRANSITIONS", "CANCEL", "START", "SET_RESULT", "SET_EXCEPTION"]

# --- events (one per resolving method) ------------------------------------------
CANCEL = "cancel"
START = "set_running_or_notify_cancel"
SET_RESULT = "set_result"
SET_EXCEPTION = "set_exception"

#: event -> {state: next state}. A state missing from an event's row is that event's
#: illegal move. Rows where next == state (cancel of a cancelled future) are legal
#: no-ops: the method answers as if it moved but tells nobody.
TRANSITIONS = {
    CANCEL: {PENDING: CANCELLED, CANCELLED: CANCELLED, CANCELLED_AND_NOTIFIED: CANCELLED_AND_NOTIFIED},
    START: {PENDING: RUNNING, CANCELLED: CANCELLED_AND_NOTIFIED},
    SET_RESULT: {PENDING: FINISHED, RUNNING: FINISHED},
    SET_EXCEPTION: {PENDING: FINISHED, RUNNING: FINISHED},
}
_ON_CANCEL = TRANSITIONS[CANCEL]
_ON_START = TRANSITIONS[START]
_ON_FINISH = TRANSITIONS[SET_RESULT]
assert TRANSITIONS[SET_EXCEPTION] == _ON_FINISH  # set_result and set_exception share one path

_CANCELLED = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED))
_DONE = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED))
_DESCRIPTION = {PENDING: "pending", RUNNING: "running", CANCELLED: "cancelled",
                CANCELLED_AND_NOTIFIED: "cancelled", FINISHED: "finished"}

#: Bumped by the fleet's loop after each batch of futures it settles. A blocked
#: `result()` watches it first (without the GIL, yielding its CPU) and sleeps on the
#: Condition only after RESULT_SPIN_S: most round trips end within that, and a
#: watching caller takes its result at once, where a sleeping one is woken ~20-50 us
#: later (a thread's wake-up on a VM), which would be a third of a round trip.
SETTLED = Pulse()
RESULT_SPIN_S = 200e-6
#: The GIL handed between this process's fleet loops, as they settle futures, and its
#: callers, as they submit and then watch SETTLED (fleet.shm.dataplane.Handover).
HANDOVER = Handover()

# `_RLock` is the C lock itself, not `threading.RLock` (a Python function around it):
# creating one is a fraction of what a Condition costs.


class UnitFuture(Future):
    """A drop-in `concurrent.futures.Future`, cheaper to create and to resolve.

    Works with `concurrent.futures.wait` (every `return_when`), `as_completed`, and
    mixed with stdlib Futures. Callbacks run once, in the order added, on the thread
    that resolves the future (or at once if it is done); a callback's exception is
    logged to the ``concurrent.futures`` logger, as the stdlib does.

    Attributes:
        unit_id: the unit this future stands for; set by whoever submits the unit.
            Unset until then (reading it raises AttributeError, as on a plain Future).
    """

    # The base class has no __slots__, so instances still carry a __dict__ slot; it
    # stays empty unless someone sets an attribute not named here.
    __slots__ = ("_state", "_result", "_exception", "_callbacks", "_lock", "_cond", "_waiter_list",
                 "unit_id")

    def __init__(self):
        # Not Future.__init__: building its Condition is the cost this class avoids.
        self._state = PENDING
        self._result = None
        self._exception = None
        self._callbacks = None
        self._lock = _RLock()
        self._cond = None
        self._waiter_list = None

    # --- what the stdlib reads directly ------------------------------------------
    @property
    def _condition(self) -> threading.Condition:
        """This future's Condition, born on first access (see the module docstring)."""
        cond = self._cond
        if cond is None:
            with self._lock:
                cond = self._cond
                if cond is None:  # another thread may have built it while we waited
                    # The list first: `_condition` hands out `_cond` without the lock.
                    self._waiter_list = []
                    cond = self._cond = threading.Condition(self._lock)
        return cond

    @property
    def _waiters(self) -> list:
        """The `wait()`/`as_completed()` waiters (callers hold `_condition`, so it is born)."""
        self._condition
        return self._waiter_list

    @property
    def _done_callbacks(self) -> list:
        """The pending callbacks as a list, for `Future` methods called unbound on this future."""
        if self._callbacks is None:
            self._callbacks = []
        return self._callbacks

    def _invoke_callbacks(self) -> None:
        # Dropped once run: done is final, so none can be added later, and the
        # list would otherwise keep closures (often over this future) alive.
        callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            for fn in callbacks:
                try:
                    fn(self)
                except Exception:
                    LOGGER.exception("exception calling callback for %r", self)

    def __repr__(self) -> str:
        state = self._state
        name = f"<{type(self).__name__} at {id(self):#x} state={_DESCRIPTION[state]}"
        if state == FINISHED:
            if self._exception:
                return f"{name} raised {type(self._exception).__name__}>"
            return f"{name} returned {type(self._result).__name__}>"
        return name + ">"

    # --- reads -------------------------------------------------------------------
    # One attribute read is atomic, and the stdlib's locked read is just as stale
    # the moment its lock is released.
    def cancelled(self) -> bool:
        """True if the future was cancelled."""
        return self._state in _CANCELLED

    def running(self) -> bool:
        """True if the future is running (started and not yet done)."""
        return self._state == RUNNING

    def done(self) -> bool:
        """True if the future was cancelled or has finished."""
        return self._state in _DONE

    def result(self, timeout: float | None = None):
        """The unit's result, waiting up to `timeout` seconds (None: no limit).

        Raises:
            CancelledError: the future was cancelled.
            TimeoutError: the future was not done within `timeout`.
            Exception: the one the unit raised (see `set_exception`).
        """
        if self._state != FINISHED:
            self._await(timeout)
        exc = self._exception
        # Truthiness, not `is not None`, as the stdlib tests it.
        if exc:
            try:
                raise exc
            finally:
                # The traceback holds this frame: break the cycle with the exception.
                exc = self = None
        return self._result

    def exception(self, timeout: float | None = None):
        """The exception the unit raised (None if it returned), waiting up to `timeout`.

        Raises:
            CancelledError: the future was cancelled.
            TimeoutError: the future was not done within `timeout`.
        """
        if self._state != FINISHED:
            self._await(timeout)
        return self._exception

    def _await(self, timeout: float | None) -> None:
        """Return once FINISHED; raise CancelledError or TimeoutError otherwise."""
        if self._state not in _DONE and (timeout is None or timeout > 0):
            start = time.monotonic()
            self._watch(RESULT_SPIN_S if timeout is None else min(timeout, RESULT_SPIN_S))
            if self._state not in _DONE:
                if timeout is not None:
                    timeout = max(0.0, timeout - (time.monotonic() - start))
                cond = self._condition
                with cond:
                    # A loop, where the stdlib waits once: a stray notify_all on the
                    # exposed Condition must not turn into a TimeoutError.
                    cond.wait_for(self.done, timeout)
        state = self._state
        if state == FINISHED:
            return
        if state in _CANCELLED:
            raise CancelledError()
        raise TimeoutError()

    def _watch(self, spin_s: float) -> None:
        """Watch SETTLED for up to `spin_s` while this future is not done. The count is
        read before the state: a settle after that read bumps it after, so the watch
        sees it."""
        end = time.monotonic() + spin_s
        while True:
            seen = SETTLED.value
            left = end - time.monotonic()
            if self._state in _DONE or left <= 0 or not SETTLED.watch(seen, left, HANDOVER):
                return

    def add_done_callback(self, fn) -> None:
        """Call `fn(future)` once the future is done; at once if it is done already.

        Callbacks run in the order added, on the thread that resolves the future; an
        exception from one is logged to the ``concurrent.futures`` logger.
        """
        if self._state not in _DONE:
            with self._lock:
                # Again under the lock: a move may have finished it since the read above.
                if self._state not in _DONE:
                    if self._callbacks is None:
                        self._callbacks = [fn]
                    else:
                        self._callbacks.append(fn)
                    return
        try:
            fn(self)
        except Exception:
            LOGGER.exception("exception calling callback for %r", self)

    # --- moves ---------------------------------------------------------------------
    def cancel(self) -> bool:
        """Cancel the future unless it is running or done; True if it is cancelled."""
        with self._lock:
            state = self._state
            nxt = _ON_CANCEL.get(state)
            if nxt is None or nxt == state:
                return nxt is not None
            self._state = nxt
            cond = self._cond
            if cond is not None:
                # wait()'s waiters hear of a cancel at set_running_or_notify_cancel, as in
                # the stdlib; blocked reads wake now.
                cond.notify_all()
        self._invoke_callbacks()
        return True

    def set_running_or_notify_cancel(self) -> bool:
        """Mark the future running (True), or, if it was cancelled, tell the
        `wait()`/`as_completed()` waiters so (False). For the unit's runner.

        Raises:
            RuntimeError: the future is running or done already, or was notified.
        """
        with self._lock:  # an RLock: `claim` takes it again
            state = self._state
            if state in _ON_START:
                return self.claim()
        LOGGER.critical("Future %s in unexpected state: %s", id(self), state)
        raise RuntimeError("Future in unexpected state")

    def set_result(self, result) -> None:
        """Finish the future with `result`. For the unit's runner.

        Raises:
            InvalidStateError: the future is cancelled or finished already.
        """
        if not self.settle(result, None, False):
            raise InvalidStateError(f"{self._state}: {self!r}")

    def set_exception(self, exception: BaseException | None) -> None:
        """Finish the future with `exception` raised. For the unit's runner.

        Raises:
            InvalidStateError: the future is cancelled or finished already.
        """
        if not self.settle(None, exception, True):
            raise InvalidStateError(f"{self._state}: {self!r}")

    # --- the runner's one-call moves (fleet's loop: one call per unit, not three) ----
    def claim(self) -> bool:
        """Mark the future running unless its caller cancelled it: True if the unit may
        run (it is running, or done already: a unit that ended before it started);
        False if it was cancelled (and its waiters are told, as by
        `set_running_or_notify_cancel`)."""
        with self._lock:
            state = self._state
            nxt = _ON_START.get(state)
            if nxt is None:  # running or finished: the runner's own earlier move
                return state not in _CANCELLED
            self._state = nxt
            if nxt == CANCELLED_AND_NOTIFIED and self._cond is not None:
                for waiter in self._waiter_list:
                    waiter.add_cancelled(self)
            return nxt == RUNNING

    def settle(self, result, exception, raised: bool) -> bool:
        """Finish the future (`exception` raised when `raised`, else `result` returned)
        unless it is done already: True if it finished it; False, changing nothing,
        when a cancel came first (or it was finished). Callbacks run here."""
        with self._lock:
            if self._state not in _ON_FINISH:
                return False
            # Result before state: lock-free readers trust whatever FINISHED shows.
            self._result = result
            self._exception = exception
            self._state = FINISHED
            cond = self._cond
            if cond is not None:
                # The waiter kind follows the method, not the value: set_exception(None)
                # still counts as an exception for wait(FIRST_EXCEPTION), as in the stdlib.
                tell = "add_exception" if raised else "add_result"
                for waiter in self._waiter_list:
                    getattr(waiter, tell)(self)
                cond.notify_all()
        if self._callbacks is not None:
            self._invoke_callbacks()
        return True
