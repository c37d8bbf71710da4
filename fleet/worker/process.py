"""The worker: one process per seat, running the units granted to its slots in order.

A worker is forked from the fleet's zygote (`fleet.worker.zygote`), which has already
loaded the transition kernels (fleet.shm.table.kernel_load), imported this module and
every handler module and
attached the shared table and data segment; so a worker starts in milliseconds and
compiles nothing. Construction is inert; `run()` does the work (STYLE item 7).

For each task message: START (T2) or RESUME (T6) its slot, run the handler, end the
slot with the completion its role's kind takes (PIN_KEYED T3, PIN_SINGLETON T4,
RELEASE T5) — or DRAINED (T8) when the supervisor drained the slot meanwhile — and
push the result. A unit of a deferrable role that cordon refuses to start is held
back (not run, not lost) and retried once the posture is Nominal again, while the
seat goes on with other roles' units. If the fleet closes while units are held, the
posture may never clear on its own (a sticky cause): they are handed back unrun
(ST_HELD_AT_CLOSE; the supervisor fails them Shutdown) so shutdown cannot wedge.

Units of an I/O-bound role (``io_bound = true``) run concurrently, up to the seat's
slots of that role at once. A seat that hosts one runs an asyncio loop on its main
thread instead of the plain loop above, and that thread still owns the slot
transitions and the result ring: it STARTs each unit on its own slot, runs it on
`fleet.worker.io.runner` (``async def`` handlers as tasks on the loop, plain ones on a
thread pool, other roles' units one after another on a serial thread), and ends the
slot and pushes the result when the unit is done — for a coroutine, in the task that
ran it. The task ring's wake-ups reach the loop as a readable fd (`RingRelay`).

A unit that submits children (`fleet.current_fleet()`, fleet.worker.inside) secedes
from the tasks ring at its first: another thread of this worker serves the ring (runs
the units that come, its children among them, and takes their outcomes in) while the
unit runs on and waits for them; when it is done, its thread ends its unit and waits,
idle, to serve the ring again. One thread serves the ring at a time; the result ring
has one lock for every thread that pushes. A unit that rides its parent's slot
(start event RIDE, fleet.rules.fsm) walks no slot transition: its slot is its
parent's, Running; it reports STARTED first, the evidence a seat death reads.
"""
from __future__ import annotations

import _signal
import collections
import logging
import os
import pickle
import signal
import threading
import time
import traceback
import types

from fleet.host import seat_cpus
from fleet.rules import contention, cordon, fsm
from fleet.rules.fsm import RIDE
from fleet.shm import messages as M
from fleet.worker.codec import (INLINE_MAX, RESULT_INLINE_MAX, let_go_handed, lending, names_parcel, MAX_DETAIL_CHARS,
                                 CodecError, clip_detail, describe, dumps, error_parts, loads, pack, parcel_of,
                                 refused_body, safe_str, split_route)
from fleet.shm.parcels import Lender, ParcelError, remove as remove_parcel
from fleet._chunk import run_items
from fleet.shm.dataplane import RingRelay
from fleet.rules.outcomes import Refused
from fleet.shm.table.layout import FLAG_CLOSING
from fleet.rules.unit import RUNNING, Suppress, Unit, _Running
from fleet.worker import calls, inside, strays
from fleet.rules.errors import EXIT_INIT_FAILED, EXIT_OK, EXIT_RECYCLED, EXIT_RETIRED
from fleet.worker.prepare import run_initializer

TYPE_CHECKING = False  # typing's flag, without importing typing (~2 ms of the fork server's start)
if TYPE_CHECKING:
    import asyncio

    from fleet.worker.io.runner import IoRunner

#: What a seat with I/O slots runs (asyncio, its loop, the runner): imported by the zygote
#: before its forks only when a role is I/O-bound (`fleet.worker.zygote.preload_io`), so a
#: fleet of CPU-bound roles (the Executor's) starts without asyncio.
IO_MODULES = ("asyncio", "fleet.worker.io.runner", "fleet.worker.io.selector")

log = logging.getLogger(__name__)


#: How long an idle worker sleeps between checks when units are held back by cordon.
HELD_RETRY_S = 0.05
#: After its work runs out, a worker looks for the next task this long before it
#: sleeps (yielding its CPU between looks): a seat fed by a caller's back-to-back
#: submits gets each within a round trip (~50 us), and a worker that is still looking
#: takes it at once, where a sleeping one is woken tens of microseconds later. At most
#: this much CPU after each stretch of work; an idle worker sleeps.
IDLE_SPIN_S = 200e-6
#: On a seat with I/O slots, the supervisor's bell rings at least every this many results.
RESULT_RING_EVERY = 8
#: The cost field of a result whose handler reported none.
NO_COST = float("nan")
#: The CPU field of a result whose handler's CPU time was not measured.
NO_CPU = float("nan")



class _Retire(Exception):
    """This worker has run its `max_tasks` units (fleet.worker.prepare), or (`status`
    EXIT_RECYCLED) its RSS passed its role's `max_rss_mib` after a unit."""

    def __init__(self, status: int = EXIT_RETIRED):
        super().__init__(status)
        self.status = status


_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """This process's resident set, from /proc/self/statm (one small read, ~11 us on the dev host;
    the resident pages are its second field)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


#: The code flag of a function defined with ``async def`` (`inspect.CO_COROUTINE`).
CO_COROUTINE = 0x80


def is_coroutine_function(handler) -> bool:
    """`inspect.iscoroutinefunction(handler)`. A plain function's flag says it at once, so
    the fork server, which makes each seat's worker at boot, does not import inspect (with
    ast and dis, ~5 ms of its start) for the common handler; any other callable (a
    partial, a method, a function marked by `inspect.markcoroutinefunction`) is asked of inspect."""
    if type(handler) is types.FunctionType and "_is_coroutine_marker" not in handler.__dict__:
        return bool(handler.__code__.co_flags & CO_COROUTINE)
    import inspect

    return inspect.iscoroutinefunction(handler)


class Worker:
    """Runs one seat. `handlers[role code]` is the callable for that role (or None).
    `init`: the initializer to call first, `(callable, args)`; `max_tasks`: units run
    before the worker exits to be replaced (fleet.worker.prepare; None: no limit)."""

    def __init__(self, seat: int, table, data, roles, handlers: list, max_tasks: int | None = None, init=None,
                 lend: bool = True):
        self.seat = seat
        self.init = init
        self.tasks_left = max_tasks
        self.table = table
        self.roles = roles
        self.handlers = handlers
        self.tasks = data.tasks(seat)
        self.results = data.results(seat)
        self.bell = data.bell
        #: Where a large result goes: a parcel of this fleet, beside the ring, lent to the
        #: supervisor, which builds the result over it and gives it back once the result is
        #: gone (its pages stay warm for the next: `parcels.Lender`), from RESULT_INLINE_MAX
        #: on; none lent when fleetd relays each one's parcel itself to its client (``lend``
        #: False: `fleet.worker.prepare.WorkerSetup.lend`), each then a fresh parcel, whose
        #: pages cost more to allocate than a copy out of the ring: from INLINE_MAX on.
        self._lender = Lender(data.name) if lend else Lender(data.name, keep=0)
        inline_max = RESULT_INLINE_MAX if lend else INLINE_MAX
        self._beside = (data.name, min(inline_max, self.results.max_message - M.RESULT_HEAD.size), self._lender.write)
        self.held: list[tuple] = []  # (head tuple, body) refused by cordon, in order
        self._completion = [fsm.COMPLETION[fsm.KIND_NAMES.index(r.kind)] for r in roles]
        self._role_names = [r.name for r in roles]  # by role code
        self._async = [is_coroutine_function(h) for h in handlers]
        self._io_bound = [r.io_bound for r in roles]
        #: bytes of RSS above which a unit of the role recycles this worker (None: never looked at)
        self._rss_bound = [None if r.max_rss_mib is None else r.max_rss_mib << 20 for r in roles]
        self._io_slots = self._count_io_slots()  # 0: no I/O-bound role has slots on this seat
        #: a slot of this seat: its seat's contention is read there (None: the seat has none)
        self._a_slot = next((i for i, s in enumerate(table.meta.get("slot_seats", ())) if s == seat), None)
        self.io: IoRunner | None = None  # made by `run` on a seat with I/O slots
        self.loop: asyncio.AbstractEventLoop | None = None
        self._relay: RingRelay | None = None
        self._bell_due = False  # an end-of-pass ring is scheduled (results were pushed this pass)
        self._unrung = 0  # results pushed since the last ring
        self._held_timer = None
        # Submit from inside (fleet.worker.inside): the ring's one server thread at a time, the
        # threads idle for it, the units seceded and still running, the result ring's lock.
        self._ring_lock = threading.Lock()
        self._turn = threading.Condition()
        self._server: int | None = None
        self._idle_servers = 0
        self._seceded: dict[int, int | None] = {}  # thread running a unit that seceded -> its slot (None: a rider)
        self._slot_on: dict[int, int | None] = {}  # thread -> the slot of the unit it runs (None: a rider)
        #: slot of a seceded unit -> the tasks sent to it meanwhile (sent ahead, a RESUME of its
        #: pin): they start once it ends, in order
        self._busy: dict[int, list] = {}
        self._retired: int | None = None  # a thread other than the main one retired the worker
        self._backlog: collections.deque = collections.deque()  # messages taken from the ring, not yet handled
        self.children = inside.Children(roles, handlers, data.name, self._beside[1], self._push, self._secede)

    def _count_io_slots(self) -> int:
        seats = self.table.meta.get("seats", ())
        mine = seats[self.seat].get("role_slots", {}) if self.seat < len(seats) else {}
        return sum(n for role, n in mine.items() if role in self.roles and self.roles[role].io_bound)

    # --- the loop ---------------------------------------------------------------------
    def run(self) -> int:
        strays.arm()  # this process is the seat's worker; a child forked off it is not (fleet.worker.strays)
        initialized = run_initializer(self.init)
        if strays.stray:  # the initializer forked, and this is its child
            strays.leave(None if initialized else SystemExit(1))
        if not initialized:
            return EXIT_INIT_FAILED
        inside._CHILDREN = self.children
        if self._io_slots:
            return self._run_io_seat()
        self._server = threading.get_ident()
        while True:
            try:
                self._serve()
            except _Retire as retire:
                # The tasks taken from the ring and not run go back to their queues, unrun: the
                # supervisor finds them owed by this seat, never started (fleet.runtime.deaths).
                return retire.status
            status = self._await_ring()  # its unit seceded, and ended: it waits to serve again
            if status is not None:
                return status

    def _serve(self) -> None:
        """Serve the tasks ring while this thread is its server (until a unit it runs secedes)."""
        me, backlog, tasks = threading.get_ident(), self._backlog, self.tasks
        while self._server == me:
            seen = tasks.seq()  # before looking: a seceded unit's end notifies (its slot's tasks)
            if backlog:
                self._message(*backlog.popleft())
                continue
            self._look_at_held()
            batch = tasks.pop_many()
            if not batch:
                if self._seceded:
                    tasks.wait_since(seen, HELD_RETRY_S if self.held else None)
                else:
                    # no spin on contended CPUs: it would take them from whoever sends the next task
                    contended = self._a_slot is not None and self.table.contended(self._a_slot)
                    tasks.wait(HELD_RETRY_S if self.held else None, spin_s=contention.spin_for(IDLE_SPIN_S, contended))
                continue
            backlog.extend(batch)

    def _message(self, tag: int, view) -> None:
        if tag == M.TASK:
            self._task(M.TASK_HEAD.unpack_from(view), view[M.TASK_HEAD.size :])
        elif tag == M.CHILD_DONE:
            self.children.done(view)

    def _secede(self, me: int) -> None:
        """The unit running on thread `me` submits a child: if that thread serves the ring,
        another takes it over (an idle one, else a new one) while the unit runs and waits."""
        if self._server != me:
            return  # seceded already, or a seat whose loop thread serves the ring (I/O slots)
        with self._turn:
            slot = self._seceded[me] = self._slot_on.get(me)
            if slot is not None:
                self._busy[slot] = []
            self._server = None
            if self._idle_servers:
                self._turn.notify()
                return
        threading.Thread(target=self._standby, name="fleet-ring", daemon=True).start()

    def _rejoin(self) -> None:
        """A seceded unit ended on this thread: the seat counts it no more."""
        me = threading.get_ident()
        if me in self._seceded:
            with self._turn:
                slot = self._seceded.pop(me)
                deferred = self._busy.pop(slot, ()) if slot is not None else ()
                # before what the ring holds: they were sent before it
                self._backlog.extendleft((M.TASK, M.TASK_HEAD.pack(*head) + body) for head, body in reversed(deferred))
            self.tasks.notify()  # the server may sleep on an empty ring

    def _await_ring(self) -> int | None:
        """Wait to serve the ring again; the status to exit with when another thread retired the worker."""
        with self._turn:
            self._idle_servers += 1
            while self._server is not None and self._retired is None:
                self._turn.wait()
            self._idle_servers -= 1
            if self._retired is not None:
                return self._retired
            self._server = threading.get_ident()
        return None

    def _standby(self) -> None:
        """A thread that serves the ring while units it ran, or others, wait."""
        with self._turn:
            if self._server is None:
                self._server = threading.get_ident()
        while True:
            if self._server == threading.get_ident():
                try:
                    self._serve()
                except _Retire as retire:  # the main thread exits with it
                    with self._turn:
                        self._retired = retire.status
                        self._server = None
                        self._turn.notify_all()
                    return
            if self._await_ring() is not None:
                return

    def _push(self, tag: int, head, body=b"") -> None:
        """Push one message to the result ring and ring the supervisor's bell (any thread)."""
        with self._ring_lock:
            while not self.results.push2(tag, head, body):
                self.bell.ring()
                self.results.wait_space(len(head) + len(body), 1.0)
        self.bell.ring()

    def _look_at_held(self) -> None:
        if self.held and not cordon.halts_any(int(self.table.posture[0])):
            self._retry_held()
        elif self.held and int(self.table.segment.header["flags"]) & FLAG_CLOSING:
            self._hand_back_held()

    def _tasks(self, batch) -> None:
        for tag, view in batch:
            self._message(tag, view)

    # --- a seat with I/O slots: everything on one event loop ----------------------------
    def _run_io_seat(self) -> int:
        import asyncio

        from fleet.worker.io.runner import IoRunner
        from fleet.worker.io.selector import new_event_loop

        self.loop = loop = new_event_loop()  # timers to the nanosecond (fleet.worker.io.selector)
        asyncio.set_event_loop(loop)
        self.io = IoRunner(self._io_slots, loop, self._unit_done)
        self._relay = RingRelay(self.tasks)
        loop.add_reader(self._relay.fileno(), self._relayed)
        loop.call_soon(self._pump)
        loop.run_forever()  # until the process ends: the zygote or the supervisor ends it
        return EXIT_OK

    def _relayed(self) -> None:
        self._relay.clear()
        self._pump()

    def _pump(self) -> None:
        """Take the tasks there are; when none, arm the relay (it fires at the next)."""
        if strays.stray:  # a coroutine forked and its child's copy of this loop turned
            strays.leave()
        self._look_at_held()
        seen = self.tasks.seq()  # before looking: a task pushed after this fires the relay
        batch = self.tasks.pop_many()
        if batch:
            self._tasks(batch)
            self.loop.call_soon(self._pump)  # more may be there: look again once ready tasks ran
            return
        self._relay.arm(seen)
        if self.held and self._held_timer is None:
            self._held_timer = self.loop.call_later(HELD_RETRY_S, self._held_tick)

    def _held_tick(self) -> None:
        self._held_timer = None
        self._pump()

    def _unit_done(self, slot: int, tag, result) -> None:
        """A unit run by the runner is done (on the loop thread): end its slot, push its
        result, then start what waited for its slot or for the serial lane."""
        unit_id, role, ride = tag
        if isinstance(result, BaseException):  # escaped _execute (a fleet bug): still its outcome
            status, out, elapsed, cost, cpu = M.ST_HANDLER_ERROR, _error_body(result), 0.0, NO_COST, NO_CPU
        else:
            status, out, elapsed, cost, cpu = result
        status, out, final = self._finish(unit_id, slot, role, status, out, ride)
        self._send(unit_id, slot, status, final, elapsed, out, ring=False, cost=cost, cpu=cpu)
        self._result_pushed()
        io = self.io
        while not io.busy(slot) and (item := io.next_for(slot)) is not None:
            self._task(*item)
        while (item := io.next_serial()) is not None:
            self._task(*item)

    def _result_pushed(self) -> None:
        """Units whose waits end together end in one pass of the loop: ring the bell for
        the first result of a pass and for every RESULT_RING_EVERY-th (the supervisor
        starts on them while the rest are pushed), and once after the pass for those left."""
        first = not self._bell_due
        if first:
            self._bell_due = True
            self.loop.call_soon(self._end_of_pass)
        self._unrung += 1
        if first or self._unrung >= RESULT_RING_EVERY:
            self._unrung = 0
            self.bell.ring()

    def _end_of_pass(self) -> None:
        self._bell_due = False
        if self._unrung:
            self._unrung = 0
            self.bell.ring()

    def _hand_back_held(self) -> None:
        held, self.held = self.held, []
        for (unit_id, slot, *_rest), _body in held:
            text = b"the fleet closed while cordon held this unit back; it never ran"
            self._send(unit_id, slot, M.ST_HELD_AT_CLOSE, self._state(slot), 0.0, text)

    def _retry_held(self) -> None:
        held, self.held = self.held, []
        for head, body in held:
            self._task(head, body)

    # --- one unit ---------------------------------------------------------------------
    def _task(self, head: tuple, body) -> None:
        unit_id, slot, key_id, role, start_event, flags = head
        if self.held and any(held[0][1] == slot for held in self.held):
            # Behind a unit cordon held back on the same slot: keep their order (its
            # RESUME could not apply before the held START anyway).
            self.held.append((head, bytes(body)))
            return
        io = self.io
        if io is not None:
            if self._io_bound[role]:
                if io.busy(slot):
                    io.defer(slot, (head, body))  # its slot's unit still runs: it starts after it
                    return
            elif io.serial_busy:
                io.defer_serial((head, body))  # the seat's other units run one after another
                return
        ride = start_event == RIDE
        if self._busy and not ride:
            with self._turn:
                if slot in self._busy:  # its slot's unit seceded and runs on: this starts after it
                    self._busy[slot].append((head, bytes(body)))
                    return
        # A rider walks no transition: its slot is its parent's, which runs (or has just ended).
        reason = fsm.OK if ride else self.table.start_unit(slot, start_event, role, key_id, unit_id)
        if reason == fsm.R_CORDONED:
            self.held.append((head, bytes(body)))
            return
        if reason != fsm.OK:
            text = f"slot {slot} refused {fsm.EVENT_NAMES[start_event]}: {fsm.REASON_NAMES[reason]}"
            # A RESUME on an Idle slot is expected once cordon drained its pin (the supervisor
            # requeues the unit); any other refusal is a broken rule.
            drained = start_event == fsm.RESUME and self._state(slot) == fsm.IDLE
            log.log(logging.INFO if drained else logging.ERROR, "unit %d: %s", unit_id, text)
            let_go_handed(body, bool(flags & M.F_ROUTED))  # its next run is handed its payload again
            self._send(unit_id, slot, M.ST_START_REFUSED, self._state(slot), 0.0, text.encode())
            return
        if ride or flags & M.F_TIMED:
            # (a rider's evidence that it started: its slot's row names its parent)
            self._push(M.STARTED, M.STARTED_HEAD.pack(unit_id, slot))
        if io is not None:
            tag = (unit_id, role, ride)
            if not self._io_bound[role]:
                io.serial(slot, tag, lambda: self._execute(unit_id, role, flags, body))
            elif self._async[role]:
                io.await_(slot, tag, lambda: self._execute_async(unit_id, role, flags, body))
            else:
                io.call(slot, tag, lambda: self._execute(unit_id, role, flags, body))
            return
        me = threading.get_ident()
        self._slot_on[me] = None if ride else slot
        status, out, elapsed, cost, cpu = self._execute(unit_id, role, flags, body)
        status, out, final = self._finish(unit_id, slot, role, status, out, ride)
        self._send(unit_id, slot, status, final, elapsed, out, cost=cost, cpu=cpu)
        if self._seceded:  # (a unit that never seceded has nothing to rejoin)
            self._rejoin()
        if self._server != me or self._seceded:
            return  # not while units wait on other threads: retiring would take them down too
        bound = self._rss_bound[role]
        if bound is not None:  # read only when the role asks: its result is out, nothing of it is lost
            rss = rss_bytes()
            if rss > bound:
                self._push(M.RECYCLING, M.RECYCLING_HEAD.pack(role, rss, bound))
                raise _Retire(EXIT_RECYCLED)
        if self.tasks_left is not None:
            self.tasks_left -= 1
            if self.tasks_left <= 0:
                raise _Retire()

    def _execute(self, unit_id: int, role: int, flags: int, body) -> tuple[int, bytes, float, float, float]:
        """Run a unit's handler: (status, result body, seconds, reported cost or NaN, CPU seconds of
        this thread meanwhile, or NaN: a handler that sleeps runs long on little CPU). Any thread
        may call it. The CPU is read only when the task asks (F_CPU: the fleet records
        arrivals): each read is a system call, as long as a small unit's whole run."""
        measured = flags & M.F_CPU
        cpu0 = time.thread_time() if measured else 0.0
        run = self._run_chunk if flags & M.F_CHUNK else self._run_one
        t0 = time.perf_counter()
        if names_parcel(body, flags & M.F_ROUTED):
            with lending():  # the task parcel's mapping given back before the result goes
                status, out, cost = run(unit_id, role, body, flags)
        else:  # an inline body maps nothing to give back
            status, out, cost = run(unit_id, role, body, flags)
        elapsed = time.perf_counter() - t0
        if strays.stray:  # forked while its payload was unpickled or its result pickled
            strays.leave()
        return status, out, elapsed, cost, time.thread_time() - cpu0 if measured else NO_CPU

    def _decode_one(self, unit_id: int, role: int, body, flags: int = 0) -> Unit:
        route = None
        if flags & M.F_ROUTED:
            route, body = split_route(body, _HERE)
        payload, key, lane, request_id = loads(body, "the payload", _HERE)
        if type(payload).__name__ == "_Pickled":
            payload = payload.load("the payload", _HERE)  # a service-mode client's payload, pickled at its end
        return Unit(unit_id, self._role_names[role], payload, key, lane, request_id, route)

    def _decode_chunk(self, unit_id: int, role: int, body):
        """A chunk's items (a list, or an executor's `calls.Calls`), and the Unit its every
        item shares but the payload."""
        payloads, key, lane, request_id = loads(body, "the chunk's payloads", _HERE)
        if type(payloads).__name__ == "_Pickled":
            payloads = payloads.load("the chunk's payloads", _HERE)  # a service-mode client's chunk, pickled at its end
        wire = calls.Calls.is_wire(payloads)  # an executor's chunk, its function by name
        if wire or type(payloads) is calls.Calls:
            if self.handlers[role] is not calls.call:
                # a Calls runs its own function: only the role whose handler is the call does that
                raise TypeError(f"role {self.roles.by_code(role).name!r} got a chunk of executor calls, "
                                f"but its handler is not {calls.__name__}.call")
            if wire:  # checked first: its name is imported only where a chunk of calls may run
                payloads = calls.Calls.from_wire(payloads)
        elif type(payloads) is not list:
            payloads = list(payloads)
        return payloads, Unit(unit_id, self._role_names[role], None, key, lane, request_id)

    def _run_one(self, unit_id: int, role: int, body, flags: int) -> tuple[int, bytes, float]:
        running = _Running()
        token = RUNNING.set(running)  # fleet.current_unit() / fleet.report_cost() in the handler
        try:
            running.unit = self._decode_one(unit_id, role, body, flags)
            value = self.handlers[role](running.unit)
        except BaseException as exc:  # noqa: BLE001 - every handler failure is an outcome
            if strays.stray:  # a child the handler forked raised: it ends so, its parent goes on
                strays.leave(exc)
            return (*_failure_body(exc), NO_COST)
        finally:
            RUNNING.reset(token)
        if strays.stray:  # a child the handler forked returned
            strays.leave()
        return (*_result_body(value, self._beside), _cost(running))

    def _run_chunk(self, unit_id: int, role: int, body, flags: int = 0) -> tuple[int, bytes, float]:
        """Run every item of a chunk, in order: (values, {index: (status, detail)} for items
        that did not solve), and the cost its items reported, summed. A flat list of
        values pickles far faster than per-item tuples. The items run in one C loop
        (`fleet._chunk`: a Unit per item, built and passed without a Python frame of
        ours, and set as `fleet.current_unit()` while it runs); it stops at an item that
        raises, which is recorded here, and resumes at the item after it. The chunk's
        seconds from its payload's arrival to its last item's end travel with its values
        (what a batching map sizes its next chunks by: `fleet.rules.pace.Batches`)."""
        t0 = time.perf_counter()
        try:
            payloads, template = self._decode_chunk(unit_id, role, body)
        except BaseException as exc:  # noqa: BLE001
            return M.ST_HANDLER_ERROR, _error_body(exc), NO_COST
        handler, values, failures = self.handlers[role], [], {}
        running = _Running()
        token = RUNNING.set(running)
        items = payloads.items if type(payloads) is calls.Calls else payloads
        strays.watch(items)  # a child an item forks runs none of the items after it
        try:
            start = 0
            if type(payloads) is calls.Calls:
                # the executor's chunk: its calls run as the builtin map runs them; while
                # they run, fleet.current_unit() is the chunk's unit (payload None)
                running.unit = template
                run = lambda at: calls.run_chunk(payloads, values, at)  # noqa: E731
            else:
                run = lambda at: run_items(handler, template, _PAYLOAD_AT, payloads, values, at, running)  # noqa: E731
            while (failed := run(start)) is not None:
                index, exc = failed
                if strays.stray:
                    strays.leave(exc)
                failures[index] = _item_failure(exc)
                values.append(None)
                start = index + 1
            if strays.stray:
                strays.leave()
        finally:
            strays.unwatch(items)
            RUNNING.reset(token)
        return (*_chunk_body(values, failures, self._beside, time.perf_counter() - t0), _cost(running))

    # --- I/O-bound roles: the same unit, awaited ------------------------------------------
    async def _execute_async(self, unit_id: int, role: int, flags: int, body) -> tuple[int, bytes, float, float, float]:
        """As `_execute`; its CPU is not measured (the loop's thread runs other units between awaits)."""
        t0 = time.perf_counter()
        with lending():  # as in _execute
            if flags & M.F_CHUNK:
                status, out, cost = await self._run_chunk_async(unit_id, role, body)
            else:
                status, out, cost = await self._run_one_async(unit_id, role, body, flags)
        return status, out, time.perf_counter() - t0, cost, NO_CPU

    async def _run_one_async(self, unit_id: int, role: int, body, flags: int) -> tuple[int, bytes, float]:
        running = _Running()
        token = RUNNING.set(running)  # this task's own context: concurrent units do not mix
        try:
            running.unit = self._decode_one(unit_id, role, body, flags)
            value = await self.handlers[role](running.unit)
        except BaseException as exc:  # noqa: BLE001 - every handler failure is an outcome
            if strays.stray:
                strays.leave(exc)
            return (*_failure_body(exc), NO_COST)
        finally:
            RUNNING.reset(token)
        if strays.stray:
            strays.leave()
        return (*_result_body(value, self._beside), _cost(running))

    async def _run_chunk_async(self, unit_id: int, role: int, body) -> tuple[int, bytes, float]:
        """A chunk's items run one after another, as in `_run_chunk`: a chunk holds one slot."""
        try:
            payloads, template = self._decode_chunk(unit_id, role, body)
        except BaseException as exc:  # noqa: BLE001
            return M.ST_HANDLER_ERROR, _error_body(exc), NO_COST
        handler, values, failures = self.handlers[role], [], {}
        running = _Running()
        token = RUNNING.set(running)  # this task's own context, as for a single unit
        try:
            for i, payload in enumerate(payloads):
                running.unit = template._replace(payload=payload)
                try:
                    values.append(await handler(running.unit))
                except BaseException as exc:  # noqa: BLE001
                    if strays.stray:
                        strays.leave(exc)
                    values.append(None)
                    failures[i] = _item_failure(exc)
                if strays.stray:
                    strays.leave()
                running.unit = None
        finally:
            RUNNING.reset(token)
        return (*_chunk_body(values, failures, self._beside), _cost(running))

    def _finish(self, unit_id: int, slot: int, role: int, status: int, out: bytes,
                ride: bool = False) -> tuple[int, bytes, int]:
        """End the slot's unit: (status, body, the slot's state afterwards); a rider's slot
        is its parent's, left as it is. A refused
        completion is a broken FSM rule, not a result to trust: the unit fails FsmRefused.
        A process that is not the worker never gets past here (the pid is compared too:
        a fork that ran no at-fork hook ends here, before the table)."""
        if strays.is_stray():
            strays.leave()
        if ride:
            return status, out, self._state(slot)
        reason, final = self.table.finish_unit(slot, self._completion[role], role)
        if reason != fsm.OK:
            text = f"slot {slot} refused {fsm.EVENT_NAMES[self._completion[role]]}: {fsm.REASON_NAMES[reason]}"
            log.error("unit %d: %s", unit_id, text)
            _drop_parcel(out)  # its value goes nowhere: nor does the parcel it travelled in
            return M.ST_COMPLETION_REFUSED, text.encode(), final
        return status, out, final

    def _state(self, slot: int) -> int:
        return self.table.state(slot)[0]

    def _send(self, unit_id, slot, status, final_state, elapsed, body, ring: bool = True, cost: float = NO_COST,
              cpu: float = NO_CPU) -> None:
        """Push a result; `ring=False` leaves waking the supervisor to the caller (a batch)."""
        if strays.stray:  # only the worker writes its seat's result ring
            strays.leave()
        head = M.RESULT_HEAD.pack(unit_id, slot, status, final_state, elapsed, cost, cpu)
        if len(head) + len(body) > self.results.max_message:
            status = M.ST_RESULT_ERROR
            body = f"result is {len(body)} bytes; the result ring takes {self.results.max_message}".encode()
            head = M.RESULT_HEAD.pack(unit_id, slot, status, final_state, elapsed, cost, cpu)
        with self._ring_lock:  # a seceded unit's thread pushes too (fleet.worker.inside)
            while not self.results.push2(M.RESULT, head, body):
                self.bell.ring()  # the supervisor may be asleep with a full ring to drain
                self.results.wait_space(len(head) + len(body), 1.0)
        if ring:
            self.bell.ring()


#: Where a chunk item's payload goes in its Unit (`run_items` fills the rest from a template).
_PAYLOAD_AT = Unit._fields.index("payload")
#: Where this process unpickles what the supervisor sent, as a failure names it.
_HERE = "in the worker"


def _traceback(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException as err:  # noqa: BLE001 - a handler's exception is its unit's, whatever it does
        return f"{describe(exc)}\n(its traceback cannot be formatted: {describe(err)})"


def _error_body(exc: BaseException) -> bytes:
    # Plain data (text, bytes): pickling it cannot run a unit's code.
    return pickle.dumps(_error_parts(exc), protocol=pickle.HIGHEST_PROTOCOL)


def _error_parts(exc: BaseException) -> tuple:
    """codec.error_parts of a failure. A payload the worker could not unpickle (a
    CodecError) travels as its text alone: it is fleet's word on the unit, not an
    exception of the handler's, so the caller gets a UnitFailed naming it
    (fleet.rules.raised), never the CodecError raised as if the handler had."""
    if isinstance(exc, CodecError):
        return clip_detail(_traceback(exc)), None
    return error_parts(_traceback(exc), exc)


def _item_failure(exc: BaseException) -> tuple[int, object]:
    """What a handler's exception makes of a chunk item: (status, reason or codec.error_parts)."""
    if isinstance(exc, Suppress):
        return M.ST_SUPPRESSED, safe_str(exc.reason, MAX_DETAIL_CHARS)
    return M.ST_HANDLER_ERROR, _error_parts(exc)


def _cost(running: _Running) -> float:
    return NO_COST if running.cost is None else running.cost


def _failure_body(exc: BaseException) -> tuple[int, bytes]:
    """What a handler's exception makes of a unit (the same rule as for a chunk item);
    a provider's refusal (fleet.Refused) is its own outcome, Failed(Refused)."""
    if isinstance(exc, Refused):
        # when the provider refused, as near as the worker knows it: its pool backs off from then
        return M.ST_REFUSED, refused_body(exc, time.monotonic())
    status, detail = _item_failure(exc)
    if status == M.ST_SUPPRESSED:
        return status, _utf8(detail)
    return status, pickle.dumps(detail, protocol=pickle.HIGHEST_PROTOCOL)


def _chunk_body(values: list, failures: dict, beside, seconds: float = NO_COST) -> tuple[int, bytes]:
    """A chunk's result, ``(values, failures, seconds)`` (`seconds`: its run, NaN when not
    measured), its status summing up its items (so nobody has to unpickle its values to
    learn its outcome): failed if an item failed, else suppressed if one was. A value that
    cannot be pickled is its own item's ResultError, the chunk's other values still go."""
    status, out = _result_body((values, failures, seconds), beside, "the chunk's results")
    if status == M.ST_RESULT_ERROR and _unpicklable_items(values, failures):
        status, out = _result_body((values, failures, seconds), beside, "the chunk's results")
    if status != M.ST_SOLVED:
        return status, out
    kinds = {st for st, _ in failures.values()}
    if M.ST_HANDLER_ERROR in kinds or M.ST_RESULT_ERROR in kinds:
        return M.ST_CHUNK_FAILED, out
    return (M.ST_CHUNK_SUPPRESSED if kinds else M.ST_CHUNK), out


def _unpicklable_items(values: list, failures: dict) -> bool:
    """Each value of `values` that cannot be pickled made its item's ResultError (in
    `failures`, its value None): whether there was one."""
    found = False
    for i, value in enumerate(values):
        if i in failures:
            continue
        try:
            dumps(value, f"the result of item {i}")
        except CodecError as exc:
            values[i], failures[i], found = None, (M.ST_RESULT_ERROR, str(exc)), True
    return found


def _result_body(value, beside: tuple, what: str = "the result") -> tuple[int, bytes]:
    """A value's result body: inline in the ring, or naming the parcel it travels in beside
    it (`beside`: the fleet's name, the most bytes carried inline, and the writer of the
    parcels the supervisor copies results out of and gives back)."""
    fleet, inline_max, writer = beside
    try:
        return M.ST_SOLVED, pack(value, what, fleet, take=True, inline_max=inline_max, writer=writer, lend=True)[0]
    except CodecError as exc:  # an unpicklable result is the unit's outcome
        return M.ST_RESULT_ERROR, _utf8(str(exc))
    except ParcelError as exc:  # no room in /dev/shm for it: the unit's outcome too
        return M.ST_RESULT_ERROR, _utf8(f"{what}: {exc}")


def _drop_parcel(body) -> None:
    """Remove the parcel a result body names (a result that will not be sent)."""
    try:
        found = parcel_of(body)
    except Exception:  # noqa: BLE001 - a text body, not a parcel's name
        return
    if found is not None:
        remove_parcel(found[0])


def _utf8(text: str) -> bytes:
    return text.encode(errors="replace")  # a lone surrogate in a handler's text is no reason to die


def child_setup(cpus, nice: int | None = None, title=None) -> None:
    """Process-wide set-up of a fresh worker (after fork, before run): pinned to `cpus`,
    at `nice` (fleet.host.priority: a worker below its supervisor's loop), named
    `title` (a fleet.rules.titles.Title; None: the zygote's name kept), its oom_score_adj
    raised (fleet.host.priority.raise_oom_score)."""
    from fleet._native import lib

    lib.fleet_set_pdeathsig(signal.SIGKILL)  # never outlive the zygote (and so fleetd)
    if title is not None:
        from fleet.host.proctitle import name_process

        name_process(title)  # ps, top and the journal tell this seat's worker from the rest
    # _signal's own calls, not signal.signal: its wrapper makes an enum of the handler it
    # returns, and the enum machinery's objects would write to ~0.1 MiB of pages still
    # shared with the fork server (each copied into this worker's own memory)
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # the supervisor decides when work stops
    _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    _signal.set_wakeup_fd(-1)
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:  # a CPU outside our cgroup's cpuset: run unpinned, say so
            log.warning("cannot pin worker to cpus %s: %s", list(cpus), exc)
        else:
            seat_cpus.seat_pinned(cpus)  # the seat's budget, also while the worker is spread wider
    if nice is not None and nice != os.getpriority(os.PRIO_PROCESS, 0):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except OSError as exc:  # a nice we may not take: run at the zygote's, say so
            log.warning("cannot set worker nice to %d: %s", nice, exc)
    from fleet.host.priority import raise_oom_score

    raise_oom_score()  # the OOM killer's first choice in the group: a worker, not its supervisor
