"""Concurrent units for I/O-bound roles: the seat's event loop and thread pools.

A role declared ``io_bound = true`` spends most of each unit waiting (RPCs, storage),
so its seat's worker runs up to the role's slot count of units at once instead of one
after another (002 §4: slots may exceed the CPU share for I/O-dominant roles).

Who does what. A worker whose seat hosts an I/O-bound role runs an asyncio loop on its
main thread, and that thread owns everything of the seat: the slot transitions, the
result ring (it has one producer), and this runner's books. ``async def`` handlers run
as tasks on that loop; plain handlers of I/O-bound roles on a thread pool with one
thread per I/O slot of the seat; the seat's other units (roles that are not I/O-bound,
on a serial seat) one after another on a thread of their own, so that a CPU-heavy
unit does not stop the loop's waits. A unit run off the loop comes back to it with
``loop.call_soon_threadsafe``: `on_done(slot, tag, result)` always runs on the loop
thread, with the slot already free for its next unit. No hand-back queue, no lock: a
coroutine's unit ends on the thread that started it.

A slot's next unit starts in the task of the one before. When a coroutine's unit ends
and the worker starts the slot's next unit at once (one sent ahead, waiting in the
slot's backlog), that unit runs in the same task, right away, not in a new task that
would first wait for the loop's next pass: units whose waits end together end in one
pass, and each of their successors would otherwise start only after all of them. (So
a context variable a handler sets and does not reset is still set for the next unit
of its slot; `fleet.current_unit()` is set and reset per unit.)

One unit per slot at a time. A slot walks Leased -> Running -> Idle/Pinned for each of
its units in grant order (a pin's next unit RESUMEs the slot its predecessor left
Pinned), so a unit that arrives for a slot whose unit is still running waits in the
slot's backlog (`defer`) until its predecessor is done (`next_for`). The serial lane
keeps its own order the same way (`serial_busy`, `defer_serial`, `next_serial`).
Concurrency is across slots, and so never more than the seat's slots.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable

from fleet.worker import strays

log = logging.getLogger(__name__)


class IoRunner:
    """Runs units off the seat's loop or on it, and reports each back on the loop thread.

    Args:
        threads: the plain-handler pool's size: the seat's I/O slots.
        loop: the seat's event loop (its thread calls every method here).
        on_done: ``on_done(slot, tag, result)``, called on the loop thread when a unit
            ends; `result` is what the call returned or the exception that escaped it.
    """

    def __init__(self, threads: int, loop: asyncio.AbstractEventLoop, on_done: Callable[[int, Any, Any], None]):
        self.threads = max(1, threads)
        self.loop = loop
        self._on_done = on_done
        self._running: dict[int, Any] = {}  # slot -> tag of its unit in the runner
        self._backlog: dict[int, collections.deque] = {}  # slot -> items waiting their turn
        self._serial: collections.deque = collections.deque()  # items waiting for the serial lane
        self._serial_busy = False
        self._pool: ThreadPoolExecutor | None = None
        self._serial_pool: ThreadPoolExecutor | None = None
        self._tasks: set = set()  # the loop keeps only weak references to its tasks
        self._ending = None  # the slot whose task is ending a unit (its next one runs in that task)
        self._chained: dict[int, tuple] = {}  # slot -> (tag, make) of the unit its task runs next

    @property
    def in_flight(self) -> int:
        """Units started on slots and not yet done (the serial lane's not counted)."""
        return len(self._running)

    def busy(self, slot: int) -> bool:
        """A unit of `slot` runs in the runner. While one does, the slot's later units
        must `defer`; the worker starts them once it is done, so a slot has a backlog
        only while it is busy."""
        return slot in self._running

    def defer(self, slot: int, item) -> None:
        """`item` waits until `slot`'s running unit is done (see `next_for`)."""
        self._backlog.setdefault(slot, collections.deque()).append(item)

    def next_for(self, slot: int):
        """The next item deferred for `slot` (None: none), once its running unit is done."""
        waiting = self._backlog.get(slot)
        if not waiting:
            return None
        item = waiting.popleft()
        if not waiting:
            del self._backlog[slot]
        return item

    # --- I/O slots ----------------------------------------------------------------------
    def await_(self, slot: int, tag, make: Callable[[], Awaitable]) -> None:
        """Run the coroutine `make()` as a task on the loop."""
        self._begin(slot, tag)
        if self._ending == slot:  # called from that slot's task, as it ends a unit: it runs this one next
            self._chained[slot] = (tag, make)
            return
        task = self.loop.create_task(self._run_coro(slot, tag, make))
        self._tasks.add(task)

    def call(self, slot: int, tag, fn: Callable[[], Any]) -> None:
        """Run `fn()` on the pool."""
        self._begin(slot, tag)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="fleet-io")
        self._pool.submit(self._off_loop, self._end, slot, tag, fn)

    def _begin(self, slot: int, tag) -> None:
        if slot in self._running:
            raise RuntimeError(f"slot {slot} already runs a unit in the runner")  # the worker defers instead
        self._running[slot] = tag

    def _end(self, slot: int, tag, result) -> None:
        del self._running[slot]
        self._on_done(slot, tag, result)

    async def _run_coro(self, slot: int, tag, make) -> None:
        while True:
            try:
                result = await make()
            except BaseException as exc:  # noqa: BLE001 - whatever escapes, the unit must end
                result = exc
            if strays.stray:  # the unit forked and this is the child (fleet.worker.strays)
                strays.leave(result if isinstance(result, BaseException) else None)
            self._ending = slot
            try:
                self._end(slot, tag, result)
            finally:
                self._ending = None
            nxt = self._chained.pop(slot, None)
            if nxt is None:
                break
            tag, make = nxt
        self._tasks.discard(asyncio.current_task())

    def _off_loop(self, end, slot: int, tag, fn) -> None:  # a pool or the serial thread
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - whatever escapes, the unit must end
            result = exc
        if strays.stray:
            # The unit forked on this thread and this is the child: alone in it (no loop
            # runs here to take the result), it would wait for the pool's next call for ever.
            strays.leave(result if isinstance(result, BaseException) else None)
        self.loop.call_soon_threadsafe(end, slot, tag, result)

    # --- the serial lane --------------------------------------------------------------------
    @property
    def serial_busy(self) -> bool:
        """A unit runs on the serial lane: the seat's other units wait (`defer_serial`)."""
        return self._serial_busy

    def defer_serial(self, item) -> None:
        self._serial.append(item)

    def next_serial(self):
        """The next item waiting for the serial lane (None: none), once it is free."""
        return self._serial.popleft() if self._serial and not self._serial_busy else None

    def serial(self, slot: int, tag, fn: Callable[[], Any]) -> None:
        """Run `fn()` on the serial lane's thread: one unit at a time, in order."""
        if self._serial_busy:
            raise RuntimeError("the serial lane already runs a unit")  # the worker defers instead
        self._serial_busy = True
        if self._serial_pool is None:
            self._serial_pool = ThreadPoolExecutor(1, thread_name_prefix="fleet-serial")
        self._serial_pool.submit(self._off_loop, self._end_serial, slot, tag, fn)

    def _end_serial(self, slot: int, tag, result) -> None:
        self._serial_busy = False
        self._on_done(slot, tag, result)
