"""Submit from inside: a running unit submits units and maps to the fleet that runs it.

`fleet.current_fleet()`, called in a handler (role face) or an Executor task, returns a
handle on the fleet that runs the unit, mirroring the face the unit runs on:

* role face (`RoleFleet`): ``submit(role, payload, key=, lane=, priority=, timeout=,
  request_id=, route=, severity=, pinned=, tag=, age=)``, ``map(role, iterable,
  chunksize=, timeout=, lane=)`` and ``map_unordered``;
* Executor face (`ExecutorFleet`): ``submit(fn, *args, **kwargs)``, ``map(fn,
  *iterables, timeout=, chunksize=)`` and ``map_unordered``.

Every child carries ``parent=`` the running unit's id. The futures are
``concurrent.futures.Future`` objects of this process: ``result()``, ``exception()`` (the
child's own exception, as the caller's side raises it), callbacks, ``as_completed`` and
``wait`` all work. A child cannot be cancelled from inside (its future is running from
its submit on); a parent that fails takes its queued children with it (fleet.runtime.inside).

The channel is the worker's own pair of rings (`Children`): a child's submit goes to the
supervisor on the results ring (M.CHILD, with an id local to this worker) and its outcome
comes back on the tasks ring (M.CHILD_DONE). fleetd's supervisor is its workers' parent
too, so the same channel serves embedded and service mode.

No nested deadlock. From its first child on, a unit *secedes* from its seat's ring (as
Dask's ``secede``): another thread of the worker serves the ring while it runs and
waits (the GIL keeps the seat's CPU use what it was), and the supervisor lets the
parent's children ride on the parent's own slot when no other slot is free
(fleet.rules.dispatch, "Children"). So a fan-out of any depth completes even when every
slot holds a waiting parent. When the parent's handler returns, its thread ends its
unit and waits, idle, to serve the ring again.
"""
from __future__ import annotations

import functools
import itertools
import threading
from concurrent.futures import Future

from fleet.rules.outcomes import FAILED
from fleet.rules.raised import own_exception, unit_exception
from fleet.rules.unit import RUNNING, NotInsideUnit, Outcome
from fleet.rules.vocab import Reason
from fleet.shm import messages as M
from fleet.worker import calls, codec

#: What a CHILD_DONE body holds.
DONE_VALUE, DONE_UNIT_ERROR, DONE_RAISED, DONE_CANCELLED = 0, 1, 2, 3

#: The worker's end of the channel, once its worker runs (None in any other process).
_CHILDREN: "Children | None" = None


def current_fleet():
    """A handle on the fleet that runs the calling unit: `RoleFleet` in a handler,
    `ExecutorFleet` in an Executor task. Its children carry ``parent=`` this unit.

    Raises:
        NotInsideUnit: no unit runs here (the caller's process, a thread the handler
            started itself: pass the handle to it instead).
    """
    children = _CHILDREN
    if children is None:
        raise NotInsideUnit("fleet.current_fleet() is only known inside a running unit (a handler or an "
                            "Executor task); this process runs none")
    running = RUNNING.get()
    if running is None or running.unit is None:
        raise NotInsideUnit("fleet.current_fleet() is only known inside a running unit: this thread runs none "
                            "(a thread the handler starts itself does not inherit it; pass the handle on)")
    unit = running.unit
    if children.executor_role(unit.role):
        return ExecutorFleet(children, unit)
    return RoleFleet(children, unit)


class Children:
    """The worker's end: its children's submits out, their outcomes in. `send(tag, head,
    body)` pushes to the results ring (under the worker's ring lock: the handler's thread
    and the ring's server both push); `secede()` hands the tasks ring to another thread,
    once per unit (the worker's)."""

    def __init__(self, roles, handlers, fleet_name: str, inline_max: int, send, secede):
        self._roles, self._handlers = roles, handlers
        self._fleet, self._inline_max = fleet_name, inline_max
        self._send, self._secede = send, secede
        self._ids = itertools.count(1)
        self._futures: dict[int, Future] = {}
        self._lock = threading.Lock()

    def executor_role(self, role: str) -> bool:
        return self._handlers[self._roles.code(role)] is calls.call

    def submit(self, parent: int, owner: int, role: str, payload, *, chunk: bool = False, items: int = 1,
               **args) -> Future:
        """Send a child's submit; its future (running: it cannot be cancelled from here).
        `owner`: the thread that runs the parent (it secedes, whichever thread submits).
        A payload that cannot be pickled raises here, as a caller's submit does."""
        code = self._roles.code(role)  # UnknownRoleError for a role this fleet has not
        body, parcel, size = codec.pack_task(role, payload, args.get("key"), args.get("lane"),
                                              args.get("request_id"), pickled_payload=None, limit=None,
                                              fleet=self._fleet, inline_max=self._inline_max)
        future = Future()
        future.set_running_or_notify_cancel()
        local = next(self._ids)
        with self._lock:
            self._futures[local] = future
        self._secede(owner)  # from here on the parent may wait: the ring is served elsewhere
        submit = codec.dumps((args, body, parcel, items, size), "a child's submit")
        self._send(M.CHILD, M.CHILD_HEAD.pack(parent, local, code, M.F_CHUNK if chunk else 0), submit)
        return future

    def done(self, view) -> None:
        """A CHILD_DONE message: resolve the child's future (its callbacks run here)."""
        local, kind = M.CHILD_DONE_HEAD.unpack_from(view)
        with self._lock:
            future = self._futures.pop(local, None)
        if future is None:
            return  # not ours (a worker before this one sent it): nobody waits on it
        try:
            value = codec.loads(view[M.CHILD_DONE_HEAD.size:], "a child's outcome", "in the worker")
            error = _rebuilt(kind, value)
        except BaseException as exc:  # noqa: BLE001 - a child's outcome that cannot be read is its failure here
            value, error = None, exc
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value.load("the child's value", "in the worker")
                              if type(value) is codec._Pickled else value)


def _rebuilt(kind: int, value) -> BaseException | None:
    """The exception a child's future raises, from what the supervisor sent (None: a value)."""
    if kind == DONE_VALUE:
        return None
    if kind == DONE_CANCELLED:
        unit_id, role, detail = value
        return unit_exception(unit_id, role, Outcome(FAILED, Reason.CANCELLED, detail))
    if kind == DONE_RAISED:
        exc, text = value
        return own_exception(exc, text) if text is not None else exc
    unit_id, role, outcome, original = value
    if type(original) is codec._Pickled:  # relayed by fleetd, still pickled: rebuilt here
        try:
            original = original.load("the child's exception", "in the worker")
        except codec.CodecError:
            original = None
    return unit_exception(unit_id, role, outcome, original)


class _Face:
    """What both faces share: the running unit and the channel."""

    def __init__(self, children: Children, unit):
        self._children, self._unit = children, unit
        # the thread that runs the unit: it secedes at the first child, even when a thread
        # the handler started submits it (with this handle)
        self._owner = threading.get_ident()

    @property
    def parent(self) -> int:
        """The unit id every child of this handle carries as its parent."""
        return self._unit.id

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of unit {self._unit.id} ({self._unit.role})>"


class RoleFleet(_Face):
    """`fleet.current_fleet()` in a handler: submit and map to the fleet's roles."""

    def submit(self, role: str, payload=None, /, *, key=None, lane=None, priority: int = 0, timeout=None,
               request_id=None, route=None, severity=None, pinned: bool = False, tag=None, age: float = 0.0) -> Future:
        """As `fleet.Fleet.submit`, the child's ``parent`` this unit. Checks happen in the
        supervisor: a refused submit (BadUnit, QueueFull, ...) is the future's exception."""
        args = {"key": key, "lane": lane, "priority": priority, "timeout": timeout, "request_id": request_id,
                "route": route, "severity": severity, "pinned": pinned, "tag": tag, "age": age}
        return self._children.submit(self._unit.id, self._owner, role, payload, **args)

    def map(self, role: str, iterable, *, chunksize: int = 1, timeout: float | None = None, lane=None):
        """As `fleet.Fleet.map`: results in order, each item a child of this unit."""
        return self._map(role, iterable, chunksize, timeout, lane, True)

    def map_unordered(self, role: str, iterable, *, chunksize: int = 1, timeout: float | None = None, lane=None):
        """As `fleet.Fleet.map_unordered`."""
        return self._map(role, iterable, chunksize, timeout, lane, False)

    def _map(self, role, iterable, chunksize, timeout, lane, ordered, chunk_of=None):
        from fleet.worker.mapping import map_units  # noqa: PLC0415 - loaded when a unit first maps

        children, parent, owner = self._children, self._unit.id, self._owner

        def submit(payload, chunk):
            items = len(payload) if chunk else 1
            return children.submit(parent, owner, role, payload, chunk=chunk, items=items, lane=lane)

        return map_units(submit, role, iterable, chunksize=chunksize, timeout=timeout, ordered=ordered,
                         chunk_of=chunk_of)


class ExecutorFleet(RoleFleet):
    """`fleet.current_fleet()` in an Executor task: ``submit(fn, *args, **kwargs)`` and
    ``map(fn, *iterables)``, as the Executor itself."""

    def submit(self, fn, /, *args, **kwargs) -> Future:  # noqa: D102 - the Executor's
        return self._children.submit(self._unit.id, self._owner, self._unit.role, calls.call_payload(fn, args, kwargs))

    def map(self, fn, *iterables, timeout: float | None = None, chunksize: int = 1):  # noqa: D102
        return self._calls(fn, iterables, timeout, chunksize, True)

    def map_unordered(self, fn, *iterables, timeout: float | None = None, chunksize: int = 1):  # noqa: D102
        return self._calls(fn, iterables, timeout, chunksize, False)

    def _calls(self, fn, iterables, timeout, chunksize, ordered):
        if chunksize == 1:
            items = calls.payloads(fn, zip(*iterables))
            chunk_of = None
        else:
            star = len(iterables) != 1
            items = zip(*iterables) if star else iterables[0]
            chunk_of = functools.partial(calls.Calls, fn, star=star)
        return self._map(self._unit.role, items, chunksize, timeout, None, ordered, chunk_of)
