"""Concurrent units for I/O-bound roles: one asyncio loop thread and one thread pool per worker.

A role declared ``io_bound = true`` spends most of each unit waiting (RPCs, storage),
so its seat's worker runs up to the role's slot count of units at once instead of one
after another (002 §4: slots may exceed the CPU share for I/O-dominant roles):
``async def`` handlers run as tasks on one asyncio loop in its own thread, plain
handlers on a thread pool with one thread per I/O slot of the seat. Both are made at
first use, so a seat that never runs an I/O unit starts no thread.

Who does what. The slot transitions (the table kernels) and the result ring belong to
the worker's main thread, and only to it: the ring has one producer. The runner never
touches either. A finished unit is *handed back*: appended to a thread-safe queue,
then `wake()` (the seat task ring's notify, atomics only) rouses the main loop, which
waits with `Ring.wait_since` so no hand-back is missed between its look and its sleep.
Only the hand-back that finds the queue empty wakes: the main loop takes the whole
queue at once, so later ones of a burst ride on that wake-up.
The main loop then ends the slot (the completion transition) and pushes the result.

One unit per slot at a time. A slot walks Leased -> Running -> Idle/Pinned for each of
its units in grant order (a pin's next unit RESUMEs the slot its predecessor left
Pinned), so a unit that arrives for a slot whose unit is still running waits in the
slot's backlog (`defer`) until its predecessor was handed back (`next_for`).
Concurrency is across slots, and so never more than the seat's slots.

Everything but the hand-back queue is the main thread's (`start`, `defer`,
`completions`, `next_for`, `busy`); the pool and the loop only run what they are given.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable

log = logging.getLogger("fleet.io_runner")


class IoRunner:
    """Runs the units of I/O-bound roles concurrently for one worker (see the module doc).

    Args:
        threads: the plain-handler pool's size: the seat's I/O slots.
        wake: called (from a pool or loop thread) after each hand-back; must be
            thread-safe and must make the main loop look at `completions()`.
    """

    def __init__(self, threads: int, wake: Callable[[], Any]):
        self.threads = max(1, threads)
        self._wake = wake
        self._handed_back: list = []  # (slot, tag, result), appended by any thread under _back_lock
        self._back_lock = threading.Lock()
        self._running: dict[int, Any] = {}  # slot -> tag of its unit in the runner (main thread)
        self._backlog: dict[int, collections.deque] = {}  # slot -> items waiting their turn (main thread)
        self._pool: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set = set()  # the loop keeps only weak references to its tasks (loop thread)
        # Coroutines to start, passed to the loop in batches: one wake-up of the loop thread
        # per batch of grants, not one per unit.
        self._to_spawn: list = []
        self._spawn_lock = threading.Lock()

    # --- main thread ----------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Units started and not yet collected by `completions()`."""
        return len(self._running)

    def busy(self, slot: int) -> bool:
        """A unit of `slot` runs in the runner (not yet collected). While one does, the
        slot's later units must `defer`; the worker starts them after collecting it, so
        a slot has a backlog only while it is busy."""
        return slot in self._running

    def defer(self, slot: int, item) -> None:
        """`item` waits until `slot`'s unit in the runner was handed back (see `next_for`)."""
        self._backlog.setdefault(slot, collections.deque()).append(item)

    def next_for(self, slot: int):
        """The next item deferred for `slot` (None: none), once its running unit was collected."""
        waiting = self._backlog.get(slot)
        if not waiting:
            return None
        item = waiting.popleft()
        if not waiting:
            del self._backlog[slot]
        return item

    def call(self, slot: int, tag, fn: Callable[[], Any]) -> None:
        """Run `fn()` on the pool; its return value is handed back as `slot`'s result."""
        self._begin(slot, tag)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="fleet-io")
        self._pool.submit(self._run_call, slot, tag, fn)

    def await_(self, slot: int, tag, make: Callable[[], Awaitable]) -> None:
        """Run the coroutine `make()` on the loop; its value is handed back as `slot`'s result.
        `make` is called on the loop thread, so the coroutine is created where it runs."""
        self._begin(slot, tag)
        if self._loop is None:
            self._loop = _start_loop()
        with self._spawn_lock:
            self._to_spawn.append((slot, tag, make))
            if len(self._to_spawn) > 1:
                return  # the loop has not taken the batch yet: it takes this one with it
        self._loop.call_soon_threadsafe(self._spawn)

    def completions(self) -> list:
        """Every (slot, tag, result) handed back since the last call; their slots are free
        for their next units. A result is what the call returned, or the exception that
        escaped it."""
        with self._back_lock:
            out, self._handed_back = self._handed_back, []
        for slot, _tag, _result in out:
            del self._running[slot]
        return out

    def _begin(self, slot: int, tag) -> None:
        if slot in self._running:
            raise RuntimeError(f"slot {slot} already runs a unit in the runner")  # the worker defers instead
        self._running[slot] = tag

    # --- pool and loop threads ---------------------------------------------------------
    def _hand_back(self, slot: int, tag, result) -> None:
        with self._back_lock:
            first = not self._handed_back
            self._handed_back.append((slot, tag, result))
        if first:  # later ones of a batch ride on this wake-up: the main loop takes the whole list
            self._wake()

    def _run_call(self, slot: int, tag, fn) -> None:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - whatever escapes, the unit must be handed back
            result = exc
        self._hand_back(slot, tag, result)

    def _spawn(self) -> None:
        with self._spawn_lock:
            batch, self._to_spawn = self._to_spawn, []
        for slot, tag, make in batch:
            task = asyncio.ensure_future(self._run_coro(slot, tag, make))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run_coro(self, slot: int, tag, make) -> None:
        try:
            result = await make()
        except BaseException as exc:  # noqa: BLE001 - whatever escapes, the unit must be handed back
            result = exc
        self._hand_back(slot, tag, result)


def _start_loop() -> asyncio.AbstractEventLoop:
    """A new event loop running forever on a daemon thread (it dies with the worker)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run():
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()

    threading.Thread(target=run, name="fleet-io-loop", daemon=True).start()
    ready.wait()
    return loop
