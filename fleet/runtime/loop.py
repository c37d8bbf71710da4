"""The supervisor's loop: the one thread that owns a fleet's state, and its turn.

One owner. Every piece of the supervisor's state (dispatcher, ledger bookkeeping,
units, deadlines, deaths, posture, the gates, pids) belongs to its loop thread. Other
threads never touch it: `submit` validates and pickles on the caller's thread, takes
room in the role's queue and posts the unit to the loop (`fleet.runtime.submit`);
operator ops (`fleet.runtime.operator`) and stops (`fleet.runtime.shutdown`) post
commands the same way (`fleet.runtime.intake.Intake`) and wait for their reply; the
lease gate's threads leave their news in the gate and ring the bell. The loop drains every posted command each turn (one wake-up carries a
batch of submits), collects results (`fleet.runtime.results`), hears of deaths
(`fleet.runtime.seat_deaths`), times units out (`fleet.runtime.deadlines`) and samples
the posture (`fleet.runtime.posture_effects`); it sleeps on the data plane's bell (a
futex) when there is nothing to do, so an idle fleet costs ~nothing. Outcomes decided
during a turn are delivered (futures resolved) at the end of that turn, from the loop
thread. Boot (`fleet.runtime.boot`) builds the state on the caller's thread before the
loop starts.

Here: the turn, the dispatch of what can be granted, and the books of each unit from
its accept to its outcome (`_close`: the one place an outcome is recorded).

Clock and OS. Every clock read and OS call a rule depends on goes through
`fleet.host.system.Host` (injected): tests drive restart intensity, deadlines and stop
grace with a fake clock while the workers stay real processes.

The gates. Between its accept and the dispatcher a unit passes the loop's gates
(`fleet.runtime.gates`: the provider admission, then the host-group lease), which may
keep it; each gate hears when it really starts (its grant, `_dispatch`) and, exactly
once, when it ends (`_close`), and ticks every turn. A provider refusal within the
unit's limit is no outcome: its gate takes the unit back, to run again now on an
alternative or to wait in the gate, and the ledger sees the outcome it ends with.
"""
from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from concurrent.futures import Future

from fleet.host import priority as priority_mod
from fleet.host.proctitle import name_thread
from fleet.host.system import Host
from fleet.rules import fsm, titles
from fleet.rules.ledger import Ledger, abort_process
from fleet.rules.outcomes import FAILED, SOLVED
from fleet.rules.raised import unit_exception
from fleet.rules.unit import FleetClosed, Outcome
from fleet.rules.vocab import Reason
from fleet.runtime import boot, posture_effects, results, seat_deaths, shutdown
from fleet.runtime.config import FleetConfig
from fleet.runtime.deadlines import Deadlines
from fleet.runtime.future import SETTLED
from fleet.runtime.gates import GO, HELD
from fleet.runtime.intake import Intake, QueueRoom, TurnedAway
from fleet.runtime.posture_effects import SAMPLE_EVERY_S
from fleet.runtime.seat_deaths import RoleStops
from fleet.runtime.shutdown import kill as _kill, shutdown as _shutdown, stop as _stop
from fleet.runtime.submit import LoopUnit, submit as _submit, submit_call as _submit_call, submit_many as _submit_many
from fleet.shm import messages as M
from fleet.shm.table import layout as L

log = logging.getLogger(__name__)

_CANCELLED = Outcome(FAILED, Reason.CANCELLED)

#: Longest the loop sleeps with nothing to do (timers are checked at least this often).
IDLE_WAIT_S = 0.1
#: With units out, or right after a turn that delivered results, the loop looks at its
#: bell this long before it sleeps (yielding the CPU between looks): their results, and
#: a caller's next submit, come within a wake-up's time (~20-50 us on a busy VM), so
#: catching them awake saves that wake-up on each.
IN_FLIGHT_SPIN_S = 150e-6
#: Commands a turn runs before it dispatches what they brought (a fast poster does not
#: keep the loop draining while no unit starts).
INTAKE_BATCH = 64

__all__ = ["Supervisor", "SAMPLE_EVERY_S"]


class Supervisor:
    """One fleet: its table, data plane, zygote, workers, dispatcher and ledger."""

    def __init__(self, config: FleetConfig, *, mode: str = "embedded", on_fuse=abort_process, cpus=None,
                 socket_path: str | None = None, readers_group: int | str | None = None, admission_clock=None,
                 admission_rng=None, closure_file=None, host: Host | None = None, exporter=None):
        self.config = config
        # ``exporter(host=, port=, provider=)``: the Prometheus exporter [metrics] starts,
        # given by the face that runs the fleet (it lives with the service, above this room)
        self.exporter = exporter
        self.host = host if host is not None else Host()
        # the provider admission (fleet.runtime.provider_gate), made at boot; its clock and RNG injectable
        self._providers = None
        self._admission_args = {"clock": admission_clock, "rng": admission_rng,
                                "closure_file": config.admission.closure_file or closure_file}
        self.socket_path = socket_path
        self.readers_group = readers_group  # may read the table (fleetd's --socket-group); None: owner only
        self.recorder = _arrival_log(config)  # None unless [record] enabled
        self.name = config.name
        self.roles = config.roles
        self.mode = mode
        self._relay = mode == "service"  # results stay pickled for fleetd's clients (codec.result_outcome)
        self.ledger = Ledger(on_fuse=on_fuse, name=config.name)  # thread-safe itself: any thread may read its counts
        self._cpus_override = cpus
        self._ids = itertools.count(1)  # next() is atomic: callers number their own units
        self._room = QueueRoom([r.queue_bound for r in self.roles])
        self._intake = Intake(self._ring)
        # Read by callers, written by the loop only (a plain attribute swap each).
        self._closing = False
        self.role_stops = RoleStops(config.restart)  # its `view` and reasons are read by callers
        # -------- the loop's own state (boot builds the rest: table, data plane, workers, ...)
        self._units: dict[int, LoopUnit] = {}
        self._done: list = []  # (future, value, error) decided this turn, delivered at its end
        self._accepted = False  # units accepted since the last dispatch
        self._stopped = threading.Event()
        self._stop_at: float | None = None  # stop(grace): when queued units fail Shutdown
        self._draining = False  # fleetd drain: take nothing new from the queues
        self.deadlines = Deadlines()
        self._outbox: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self.table = self.data = self.workers = self.publisher = self.quota_watcher = None
        self._thread = None
        self._loop_ident = None  # the loop thread's ident (`_on_loop`, on every submit)
        self.started_ns = time.time_ns()
        self.run_observer = None  # callable(role name, seconds), e.g. the metrics histogram
        # The gates a unit passes before the dispatcher (fleet.runtime.gates), made at boot:
        # the provider admission, then the host-group lease when [store] is configured.
        self.gates: list = []
        self._open_roles: frozenset = frozenset()  # roles whose units without a route pass every gate at once
        self._stops: dict[int, tuple[str, str]] = {}  # unit id -> (reason, detail): a gate stopped it

    def start(self) -> "Supervisor":
        """Boot on the caller's thread; from the loop's start on, the loop owns the state."""
        boot.boot(self)
        self._thread = threading.Thread(target=self._loop, name=f"fleet-{self.name}", daemon=True)
        self._thread.start()
        shutdown.close_at_exit(self)
        return self

    # The caller's half of a submit and of a stop (fleet.runtime.submit, fleet.runtime.shutdown).
    submit, submit_call, submit_many = _submit, _submit_call, _submit_many
    shutdown, stop, kill = _shutdown, _stop, _kill

    # ================================================================== posting to the loop

    def _ring(self) -> None:
        data = self.data
        if data is not None:
            data.bell.ring()

    def _on_loop(self) -> bool:
        return threading.get_ident() == self._loop_ident

    def call(self, fn, *args, timeout: float | None = None, view: bool = False):
        """Run ``fn(*args)`` on the loop thread and return its result. On the loop thread
        itself (a future's callback), or before the loop started, it runs here. Once the
        loop has stopped nothing else runs on the state: a `view` reads what it left; a
        change raises FleetClosed."""
        if self._on_loop() or self._thread is None:
            return fn(*args)
        if not self._stopped.is_set():
            try:
                return self._intake.call(self._op, fn, *args, timeout=timeout)
            except TurnedAway:
                self._stopped.wait()  # the loop was stopping as we asked
        if not view:
            raise FleetClosed(f"fleet {self.name!r} has stopped")
        return fn(*args)

    def _op(self, fn, *args):
        """An operator call or a stop, on the loop: the submits posted before it are
        dispatched first, so it sees them as it would have after each submit's return
        (shutdown(cancel_futures) cancels only what could not start)."""
        if self._accepted:
            self._accepted = False
            self._dispatch()
        return fn(*args)

    # ================================================================== dispatch

    def _dispatch(self) -> None:
        """Grant what can be granted and send it to the seats."""
        if self._closing:
            shutdown.shed_deferred_at_close(self)
        if self._draining:
            return
        self.dispatcher.skip = self._cancelled
        grants = self.dispatcher.grant()
        for unit_id in self.dispatcher.take_skipped():
            if unit_id in self._stops:
                self._close(unit_id, Outcome(FAILED, *self._stops[unit_id]))
            else:
                self._forget(unit_id)  # its caller cancelled it
        ops: list = []  # every grant's slot events, applied in one kernel call
        for g in grants:
            if g.ops:
                ops += g.ops
        reasons = None  # read only when the table refused some event (rare: a broken FSM rule)
        if ops:
            rows = len(ops) // L.OP_FIELDS
            if self.table.apply_ops(ops) < rows:
                reasons = iter(self.table.reasons(rows))
        sends: dict[int, list] = {}  # seat -> its tasks of this pass, pushed in one call each
        freed: dict[int, int] = {}  # role -> units granted, whose queue room goes back at once below
        gates = self.gates
        for g in grants:
            unit = self._units[g.unit_id]
            unit.queued = False
            freed[unit.role] = freed.get(unit.role, 0) + 1
            if reasons is not None and g.ops:
                why = self._grant_refused(g, [next(reasons) for _ in range(len(g.ops) // L.OP_FIELDS)])
                if why is not None:
                    # A broken FSM rule, not a dead worker: its own reason, and counted (status shows it).
                    self._fsm_refused(why)
                    self.dispatcher.complete(g.unit_id, self.table.state(g.slot)[0])
                    self._close(g.unit_id, Outcome(FAILED, Reason.FSM_REFUSED, why))
                    continue
            for gate in gates:
                gate.started(unit)  # it runs from here (on its provider too)
            task = M.TASK_HEAD.pack(g.unit_id, g.slot, g.key_id, g.role, g.start_event, unit.flags) + unit.body
            batch = sends.get(g.seat)
            if batch is None:
                sends[g.seat] = [task]
            else:
                batch.append(task)
        for code, n in freed.items():
            self._room.give(code, n)
        for seat, batch in sends.items():
            self._send(seat, batch)

    @staticmethod
    def _grant_refused(g, reasons: list) -> str | None:
        """Why the table refused grant `g` (its events' `reasons`, in order), or None."""
        for (event, _role, _key), reason in zip(g.transitions, reasons):
            if reason != fsm.OK:
                return f"slot {g.slot} refused the grant's {fsm.EVENT_NAMES[event]}: {fsm.REASON_NAMES[reason]}"
        return None

    def _send(self, seat: int, tasks: list) -> None:
        """A seat's tasks of one pass: pushed and its worker woken in one call; what does
        not fit waits in its outbox (behind any already waiting, so the order holds)."""
        outbox = self._outbox[seat]
        if outbox:
            outbox.extend(tasks)
            self._flush(seat)
            return
        pushed = self.data.tasks(seat).push_many(M.TASK, tasks)
        if pushed < len(tasks):
            outbox.extend(tasks[pushed:])
            self._flush(seat)

    def _cancelled(self, unit_id: int) -> bool:
        """Called as a unit comes up for a grant: True if its caller cancelled it; otherwise
        its future is marked running (from here on it cannot be cancelled). A unit a gate
        stopped while it waited (its host-group lease ended) is skipped too."""
        if self._stops and unit_id in self._stops:
            return True
        return not self._units[unit_id].future.claim()

    def _flush(self, seat: int) -> None:
        ring, outbox = self.data.tasks(seat), self._outbox[seat]
        while outbox and ring.push(M.TASK, outbox[0]):
            outbox.popleft()
        ring.notify()

    # ================================================================== the books: one outcome per unit

    def _end(self, unit_id: int) -> LoopUnit | None:
        """The one place a unit leaves the books: its room in the queue goes back if it
        never got a slot."""
        unit = self._units.pop(unit_id, None)
        if unit is not None and unit.queued:
            unit.queued = False
            self._room.give(unit.role)
        return unit

    def _close(self, unit_id: int, outcome: Outcome, value=None, original=None, cost=None,
               solved: list | None = None, items: bool = False) -> None:
        """Record an outcome; its future resolves at the end of this turn. `solved`: a
        slice's list of solved units, which its caller ledgers in one call. `items`: a
        chunk's items, which travel with it whatever its outcome (map raises item by item).
        Every unit's end comes here, so every gate hears of it."""
        unit = self._units.get(unit_id)
        if unit is not None and self._gates_end(unit, outcome, original, cost):
            return  # a gate took it back: no outcome yet (the ledger sees the one it ends with)
        unit = self._end(unit_id)
        if solved is not None and outcome.kind == SOLVED:
            solved.append(unit_id)
        else:
            self.ledger.record(unit_id, outcome.kind, outcome.reason)
        if unit is None:
            return
        if outcome.kind == SOLVED or (items and value is not None):
            self._done.append((unit.future, value, None))
        else:
            role = self.roles.by_code(unit.role).name
            self._done.append((unit.future, None, unit_exception(unit_id, role, outcome, original)))

    def _gates_end(self, unit: LoopUnit, outcome: Outcome, original=None, cost=None) -> bool:
        """Tell every gate of `unit`'s end (each hears of it once: the unit leaves the books
        next); True if one took it back instead. A unit taken back starts again now, past
        the gate that took it (it keeps what the gates after it gave it), or waits there."""
        if self._stops:
            self._stops.pop(unit.unit_id, None)
        for i, gate in enumerate(self.gates):
            again = gate.ended(unit, outcome, original, cost)
            if again is not None:
                if again == GO and self._through(unit, i + 1):
                    # At the head of its queue, past its bound: it was granted before the units
                    # queued since (the oldest waits least), and a unit granted once is never lost
                    self.dispatcher.enqueue(unit, front=True)
                return True
        return False

    def _fail_unstarted(self, unit_id: int, reason: str, detail: str) -> None:
        """A unit that never ran fails with `reason` (its future is claimed first: a
        cancel that raced it has no say any more)."""
        self._units[unit_id].future.claim()
        self._close(unit_id, Outcome(FAILED, reason, detail))

    def _forget(self, unit_id: int, cancel_future: bool = False) -> None:
        """A unit cancelled before it ran: recorded Cancelled (its future is cancelled
        already, or here when `cancel_future`)."""
        unit = self._units.get(unit_id)
        if unit is not None:
            self._gates_end(unit, _CANCELLED)  # a cancel is never taken back
        unit = self._end(unit_id)
        if unit is not None and cancel_future:
            unit.future.cancel()
        self.ledger.record(unit_id, FAILED, Reason.CANCELLED)

    def _deliver(self) -> bool:
        """Resolve the futures decided this turn (their callbacks run here, on the loop);
        True if there were any."""
        if not self._done:
            return False
        while self._done:
            done, self._done = self._done, []
            for future, value, error in done:
                future.settle(value, error, error is not None)  # refused (no-op) when cancelled meanwhile
        SETTLED.bump()  # callers watching for their result take it now (fleet.runtime.future)
        return True

    def _fsm_refused(self, what: str) -> None:
        """The slot FSM refused the runtime a transition: a bug in a rule, logged and counted
        apart from worker deaths (status shows the count)."""
        log.error("fleet %s: slot FSM refused a transition: %s", self.name, what)
        self.ledger.fsm_refused()

    # ================================================================== the loop

    def _loop(self) -> None:
        self._loop_ident = threading.get_ident()
        name_thread(titles.LOOP_THREAD)  # top -H; the program that embeds the fleet keeps its own name
        bell = self.data.bell
        next_sample = 0.0
        seat_cpus = {c for seat in self.layout.seats for c in seat.cpus}
        if self.layout.supervisor_cpus and not seat_cpus & set(self.layout.supervisor_cpus):
            # This thread only: the supervisor's loop runs on the reserve cores the budget
            # set aside for it, off the worker seats. An oversubscribed layout has seats on
            # those cores too: then the scheduler places the loop better than a pin would.
            try:
                self.host.pin_this_thread(self.layout.supervisor_cpus)
            except OSError as exc:
                log.warning("cannot pin the supervisor loop to %s: %s", self.layout.supervisor_cpus, exc)
        if self.priority.raises_loop:
            try:
                priority_mod.set_this_thread(self.priority.loop_nice)
            except OSError as exc:  # allowed by the capability check, refused by the kernel (an LSM)
                log.warning("fleet %s: cannot raise the supervisor loop to nice %d: %s", self.name,
                            self.priority.loop_nice, exc)
        try:
            while True:
                seen = bell.value
                left = self._turn()
                now = self.host.monotonic()
                if now >= next_sample:
                    seat_deaths.hear(self)  # a zygote that died said nothing: its socket tells
                    posture_effects.sample(self)
                    next_sample = now + SAMPLE_EVERY_S
                delivered = self._deliver()
                if self._closing and not self._units:
                    break
                # Turn again at once only for input the turn left behind or that rang
                # since it began: everything else that comes in rings the bell. (Turning
                # again on every busy turn cost the round trip: a caller woken by this
                # turn's deliveries and the loop reading every ring handed the GIL back
                # and forth; the wait lets go of it and catches what comes next awake.)
                quiet = not left and bell.value == seen
                if quiet:
                    # Keep looking a while with units out, or just after results went
                    # out: a caller's next submit tends to follow its result at once.
                    busy = delivered or self._units
                    if not bell.wait(seen, self._sleep_for(now), spin_s=IN_FLIGHT_SPIN_S if busy else 0.0):
                        seat_deaths.hear(self)  # a quiet spell: a zygote that died said nothing
        except BaseException:  # noqa: BLE001 - the loop must never die silently
            log.exception("fleet %s: supervisor loop crashed", self.name)
            shutdown.close_intake(self)  # nothing would ever run a unit submitted from here on
            shutdown.fail_everything(self, Reason.LANE_DEATH, "the supervisor loop crashed")
        finally:
            shutdown.teardown(self)
            why = f"fleet {self.name!r} has stopped"
            self._intake.close(why)
            self._room.close(why)  # a caller waiting for room learns it at once
            self._stopped.set()

    def _turn(self) -> bool:
        """One pass over every input; True if it left some behind (commands past its
        intake batch): look again at once."""
        ran = self._intake.drain(INTAKE_BATCH)
        if self._accepted:
            self._accepted = False
            self._dispatch()
        if self.data.zygote_news.value != self.workers.news_seen:
            seat_deaths.hear(self)  # it sent an event (and rang)
        results.collect(self)
        for i, gate in enumerate(self.gates):
            moved = gate.tick()
            if moved is not None:
                self._moved(i, moved)
        now = self.host.monotonic()
        if self.deadlines:
            self.deadlines.check(self, now)
        if self._stop_at is not None and now >= self._stop_at:
            self._stop_at = None
            shutdown.fail_queued(self, Reason.SHUTDOWN, "the fleet stopped before it ran")
        return ran >= INTAKE_BATCH

    def _sleep_for(self, now: float) -> float:
        wait = IDLE_WAIT_S
        for gate in self.gates:
            wait = min(wait, gate.wake_in(wait))
        if self._stop_at is not None:
            wait = min(wait, max(0.0, self._stop_at - now))
        return wait

    # ================================================================== the gates (fleet.runtime.gates)
    def _through(self, unit: LoopUnit, first: int = 0) -> bool:
        """Hand `unit` to the gates from `first` on: True once it passed them all (on to
        the dispatcher), False if one keeps it. Raises BadUnit from a gate that refuses it
        on its face (the first, at accept)."""
        gates = self.gates
        for i in range(first, len(gates)):
            if gates[i].admit(unit) == HELD:
                return False
        return True

    def _moved(self, i: int, moved) -> None:
        """What gate `i`'s tick reports: cancelled units forgotten, ended ones closed,
        stopped ones stopped, and the ones it let go on through the gates after it."""
        for unit_id in moved.forget:
            self._forget(unit_id)
        for unit_id, outcome, original in moved.end:
            self._close(unit_id, outcome, original=original)
        for unit_id, reason, detail in moved.stop:
            self._stop_unit(unit_id, reason, detail)
        if moved.go:
            for unit in moved.go:
                if self._through(unit, i + 1):
                    self.dispatcher.enqueue(unit)
            self._dispatch()

    def _stop_unit(self, unit_id: int, reason: str, detail: str) -> None:
        """A gate says `unit_id` may not run any more (LeaseDenied, LeasePreempted,
        LeaseExpired): queued, it fails at its grant; running, its worker is killed."""
        if unit_id not in self._units:
            return
        self._stops[unit_id] = (reason, detail)
        slot = self.dispatcher.slot_of(unit_id)
        pid = None if slot is None else self.workers.pids.get(self.layout.seat_of(slot))
        if pid is not None:
            log.warning("fleet %s: unit %d lost its lease (%s); killing worker pid %d", self.name, unit_id, detail, pid)
            self.workers.kill(pid)  # our own kill: not a lane death

    # ================================================================== views

    def ledger_counts(self):
        """The ledger's counts, taken on the loop: every submit that returned before this
        call is counted."""
        return self.call(self.ledger.counts, view=True)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def pids(self) -> dict:
        """Worker pid per seat (a copy, taken on the loop)."""
        return self.call(lambda: dict(self.workers.pids), view=True)

    def queued(self, role: str) -> int:
        """Units of `role` waiting for a slot (taken on the loop)."""
        code = self.roles.code(role)
        return self.call(lambda: self.dispatcher.queued(code), view=True)

    def find_unit(self, unit_id: int) -> tuple[bool, Future | None]:
        """(issued, future), read on the loop: whether this fleet ever handed out
        `unit_id`, and the future of that unit while it is queued or running (None once
        it ended). Every submit that returned before this call is seen."""
        def look():
            unit = self._units.get(unit_id)
            # A look at the counter spends an id: ids are unique, not dense.
            return 0 < unit_id < next(self._ids), None if unit is None else unit.future

        return self.call(look, view=True)

    def inspect(self, fn, timeout: float | None = None):
        """Run ``fn(supervisor)`` on the loop and return what it returns (tests and tools
        that look inside: nothing else may read the loop's state from another thread).
        Raises TimeoutError when the loop has not answered within `timeout` seconds."""
        return self.call(fn, self, timeout=timeout, view=True)


def _arrival_log(config):
    """The arrival log of `[record]` (fleet.runtime.arrivals), or None when recording is off."""
    if not config.record.enabled:
        return None
    from fleet.runtime.arrivals import ArrivalLog

    return ArrivalLog.for_config(config)
