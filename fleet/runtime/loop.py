"""The supervisor: boots the fleet, dispatches units, and gives every unit one outcome.

Boot: config -> quota (cgroup) -> budget and tier plan -> seats and slots -> shared
table -> data plane -> zygote -> one worker per seat, pinned to its CPUs.

One owner. Every piece of the supervisor's state (dispatcher, ledger bookkeeping,
units, deadlines, deaths, posture, provider gate, pids) belongs to its loop thread.
Other threads never touch it: `submit` validates and pickles on the caller's thread,
takes room in the role's queue (`fleet.runtime.intake.QueueRoom`: it waits for room, or
refuses with QueueFull), and posts the unit to the loop (`fleet.runtime.intake.Intake`);
operator ops, stop and the lease gate's thread post commands the same way and wait
for their reply. The loop drains every posted command each turn (one wake-up
carries a batch of submits), collects results, reports deaths, times units out and
samples the posture; it sleeps on the data plane's bell (a futex) when there is
nothing to do, so an idle fleet costs ~nothing. Outcomes decided during a turn are
delivered (futures resolved) at the end of that turn, from the loop thread.

Clock and OS. Every clock read and OS call a rule depends on goes through
`fleet.host.system.Host` (injected): tests drive restart intensity, deadlines and stop
grace with a fake clock while the workers stay real processes.

Provider admission. A unit submitted with a `route` is checked on the caller's
thread (`ProviderGate.check`), then asks `fleet.runtime.provider_gate` on the loop before the
dispatcher: it starts now on its route or an alternative (the chosen route travels
with its task), or waits there until the loop finds its pool admits again; its
outcome is the pool's signal (`_close`). A refusal within the unit's limit is no
outcome: the gate hands the unit back (`_refused_again`), to run again now on an
alternative or to wait in the gate, and the ledger sees the outcome it ends with.

Deaths. The zygote reports every worker exit. The loop then collects what the dead
worker already delivered, discards the tasks it never took, and asks `fleet.runtime.deaths`
what the death means for each unit it still owed: one it had started fails LaneDeath
(Timeout for the unit it was killed for), one it had not goes back to the head of its
queue, unrun. It walks the seat's slots back to Idle through legal transitions, and
restarts the seat — unless one of the roles it ran died more than
`restart.max_restarts` times within `restart.within_seconds`: that role is stopped and
its queued units fail RoleStopped.
Every death the supervisor did not cause itself (a lane death, 002 §14) holds the
posture Cordoned with the sticky `lane-death` cause until an operator releases it
(`fleetctl posture release lane-death`, `Fleet.posture_release`). Seats are
re-forked during shutdown too: shutdown waits for every queued unit.
"""
from __future__ import annotations

import atexit
import collections
import dataclasses
import functools
import gc
import heapq
import itertools
import logging
import os
import signal
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

from fleet.runtime import codec
from fleet.rules import fsm
from fleet.runtime import deaths as deaths_mod
from fleet.shm import messages as M
from fleet.rules import posture as posture_mod
from fleet.rules import pressure as pressure_mod
from fleet.host import priority as priority_mod
from fleet.rules import quota as quota_mod
from fleet.rules import ranges
from fleet.rules import seats as seats_mod
from fleet.runtime.config import FleetConfig
from fleet.runtime.worker_setup import EXIT_INIT_FAILED, EXIT_RETIRED, WorkerSetup
from fleet.shm.dataplane import DataSegment
from fleet.rules.dispatch import Dispatcher, Pending
from fleet.rules.errors import FleetError
from fleet.runtime.future import SETTLED, UnitFuture
from fleet.host.system import Host
from fleet.runtime.intake import Intake, QueueRoom, TurnedAway
from fleet.rules.intensity import Deaths
from fleet.runtime.lease_gate import LeaseGate, orchestrator_id
from fleet.rules.ledger import Ledger, abort_process
from fleet.rules.outcomes import FAILED, SOLVED
from fleet.rules.vocab import Reason
from fleet.rules import cordon
from fleet.host.sampler import PressureInput, QuotaWatcher, Sampler
from fleet.shm.table import SlotTable
from fleet.shm.table import layout as L
from fleet.runtime.zygote_link import BOOT_TIMEOUT_S, Exited, Forked, WorkerStartError, ZygoteLink
from fleet.rules.raised import RoleBroken, unit_exception
from fleet.rules.unit import (
    BadUnit,
    FleetClosed,
    Outcome,
    error_for,
)

log = logging.getLogger("fleet.runtime.supervisor")

_CANCELLED = Outcome(FAILED, Reason.CANCELLED)

#: Longest the loop sleeps with nothing to do (timers are checked at least this often).
IDLE_WAIT_S = 0.1
#: With units out, or right after a turn that delivered results, the loop looks at its
#: bell this long before it sleeps (yielding the CPU between looks): their results, and
#: a caller's next submit, come within a wake-up's time (~20-50 us on a busy VM), so
#: catching them awake saves that wake-up on each.
IN_FLIGHT_SPIN_S = 150e-6
#: Posture sampling period.
SAMPLE_EVERY_S = 0.25


def _next_pow2(n: int) -> int:
    return 1 << max(12, (n - 1).bit_length())


#: Commands a turn runs before it dispatches what they brought (a fast poster does not
#: keep the loop draining while no unit starts).
INTAKE_BATCH = 64
#: Most units one `submit_many` command carries to the loop: the loop starts on a run
#: while the caller still makes the next.
SUBMIT_RUN = 256
#: Results handled before the units they free are granted, sent and delivered. Units
#: that end together (an I/O role's timers fire in batches) would otherwise wait for the
#: whole batch: the last one's successor would start only after every other's had.
RESULT_SLICE = 8


@dataclasses.dataclass(slots=True, kw_only=True)
class _Unit(Pending):
    """A unit the loop holds, from its accept to its outcome. It is also what the
    dispatcher queues (a `Pending`): one object per unit on the hot path, not one per
    stage, so a burst of submits leaves the garbage collector fewer objects to track."""

    future: Future
    body: bytes
    flags: int
    timeout: float | None
    queued: bool = True  # holds room in its role's queue (fleet.runtime.intake.QueueRoom) until granted or ended
    due: float | None = None  # when its current run times out (a refused unit runs again: a new deadline)


class Supervisor:
    """One fleet: its table, data plane, zygote, workers, dispatcher and ledger."""

    def __init__(self, config: FleetConfig, *, mode: str = "embedded", on_fuse=abort_process, cpus=None,
                 socket_path: str | None = None, readers_group: int | str | None = None, admission_clock=None,
                 admission_rng=None, closure_file=None, host: Host | None = None):
        self.config = config
        self.host = host if host is not None else Host()
        # the provider admission (fleet.runtime.provider_gate), made at boot; its clock and RNG injectable
        self._providers = None
        self._admission_args = {"clock": admission_clock, "rng": admission_rng,
                                "closure_file": config.admission.closure_file or closure_file}
        self.socket_path = socket_path
        self.readers_group = readers_group  # may read the table (fleetd's --socket-group); None: owner only
        self.metrics = None
        self.recorder = _arrival_log(config)  # None unless [record] enabled
        self.name = config.name
        self.roles = config.roles
        self.mode = mode
        self._relay = mode == "service"  # results stay pickled for fleetd's clients (codec.result_outcome)
        self.ledger = Ledger(on_fuse=on_fuse)  # thread-safe itself: any thread may read its counts
        self._cpus_override = cpus
        self._ids = itertools.count(1)  # next() is atomic: callers number their own units
        self._room = QueueRoom([r.queue_bound for r in self.roles])
        self._intake = Intake(self._ring)
        # Read by callers, written by the loop only (a plain attribute swap each).
        self._closing = False
        self._stopped_view: frozenset = frozenset()  # codes of stopped roles
        # -------- the loop's own state
        self._units: dict[int, _Unit] = {}
        self._done: list = []  # (future, value, error) decided this turn, delivered at its end
        self._accepted = False  # units accepted since the last dispatch
        self._stopped = threading.Event()
        self._stop_at: float | None = None  # stop(grace): when queued units fail Shutdown
        self._draining = False  # fleetd drain: take nothing new from the queues
        self._stopped_roles: set[int] = set()
        self._stop_reasons: dict[int, str] = {}  # role code -> why it stopped (its submits and units say it)
        self._deaths = Deaths(config.restart.max_restarts, config.restart.within_seconds)
        self._timed_out: set[int] = set()
        self._deadlines: list = []  # heap of (deadline, unit id)
        self._outbox: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self._pids: dict[int, int] = {}  # seat -> pid
        self._seat_of_pid: dict[int, int] = {}
        self._pending_forks: set[int] = set()
        self._killed: set[int] = set()  # worker pids the supervisor killed itself (not lane deaths)
        self.table = self.data = self.zygote = None
        self._thread = None
        self._loop_ident = None  # the loop thread's ident (`_on_loop`, on every submit)
        self.started_ns = time.time_ns()
        self.run_observer = None  # callable(role name, seconds), e.g. the metrics histogram
        self._zygote_seen = 0  # the zygote's news count when its socket was last read
        self._runs_ended: list = []  # run times not yet published (see _publish_units)
        self._spawner = None
        self._zygote_gone = False  # its death has been handled (no new one yet)
        self._last_change = None  # the posture transition that set the current posture
        self._gate = None  # the host-group lease gate (fleet.runtime.lease_gate) when [store] is configured
        self._held: dict[int, Pending] = {}  # units waiting for their lease, not queued yet
        self._lease_lost: dict[int, tuple[str, str]] = {}  # unit id -> (reason, detail): its lease ended first

    # ================================================================== boot
    def start(self) -> "Supervisor":
        """Boot on the caller's thread; from the loop's start on, the loop owns the state."""
        cfg = self.config
        cpus = self._cpus_override or self.host.affinity()
        self.projection = quota_mod.project(cfg, self.host.effective_cpus(), cpus)
        self.quota, self.plan, self.layout = self.projection.quota, self.projection.plan, self.projection.layout
        for warning in quota_mod.boot_warnings(self.quota, self.plan):
            log.warning("fleet %s: %s", self.name, warning)
        for role in self.roles:
            log.debug("role %s: %s", role.name, role)
        log.info("fleet %s: %s", self.name, "; ".join(self.projection.processes()))
        reserve = next((s for s in self.plan.budget.consumers if s.name == "reserve"), None)
        if reserve is not None:
            log.info("fleet %s: supervisor loop (budget.loop = %s): reserve %s cores, %s", self.name,
                     cfg.budget.loop, reserve.cores, reserve.rule)
        self.priority = priority_mod.this_process(cfg.dispatch_priority)
        log.info("fleet %s: dispatch priority: %s", self.name, self.priority.describe())
        for share in self.plan.budget.consumers:
            if share.overridden:
                log.warning("budget override: %s = %s cores (%s)", share.name, share.cores, share.rule_gives())
        # A unit sent ahead is dispatched: a role whose units need a host-group lease sends
        # none ahead, so a lease lost while a unit waits for a slot still stops it unrun.
        gated = {c for c, r in enumerate(self.roles) if cfg.store.url and cfg.store.role(r.name) is not None}
        self.dispatcher = Dispatcher(self.roles, self.layout, ahead_off=gated)
        self.posture = posture_mod.PostureOwner(cfg.posture, now_ms=self.host.now_ms())
        self.sampler = Sampler.for_self(self.posture, clock=self.host.now_ms)
        self.table = SlotTable.create(self.name, self.roles, len(self.layout.slots), meta=self._meta(),
                                      readers_group=self.readers_group)
        self.table.set_quota_epoch(0, self.quota.detected)
        self.quota_watcher = QuotaWatcher(self.quota, arm_pressure=PressureInput.for_self, clock=self.host.now_ms)
        try:
            from fleet.runtime.provider_gate import ProviderGate

            shared = (cfg.store.url, orchestrator_id(cfg.store.orchestrator, self.name)) if cfg.store.url else None
            self._providers = ProviderGate(cfg.admission, table=self.table, shared_store=shared,
                                           catalog_file=cfg.source,
                                           **self._admission_args)
            self._boot_rest()
        except BaseException:
            self._teardown(kill=True)
            raise
        if cfg.store.url:
            # The gate's thread only posts: a grant or a lost lease is the loop's to apply.
            self._gate = LeaseGate(cfg.store, self.name,
                                   on_admitted=lambda unit_id: self._intake.post(self._lease_granted, unit_id),
                                   on_lost=lambda unit_id, reason, why: self._intake.post(self._lease_ended, unit_id,
                                                                                          reason, why),
                                   ).start()
        if cfg.gc_freeze:
            # Boot loaded numba's compiler state (~100k objects) for the table's kernels: out
            # of the collector's sight, full collections stop stalling the loop 30-100 ms.
            gc.collect()
            gc.freeze()
        self._thread = threading.Thread(target=self._loop, name=f"fleet-{self.name}", daemon=True)
        self._thread.start()
        self._owner_pid = os.getpid()  # a fork of this process (a multiprocessing child) inherits the exit hook
        self._atexit = weakref.WeakMethod(self._atexit_close)
        _at_interpreter_exit(functools.partial(_call_weak, self._atexit))
        return self

    def _meta(self) -> dict:
        meta = {
            "fleet": self.name,
            "version": _version(),
            "pid": os.getpid(),
            "mode": self.mode,
            "started_ns": self.started_ns,
            "socket": self.socket_path,
        }
        meta.update(self.projection.meta(booted=True))
        meta["dispatch_priority"] = self.priority.to_meta()
        return meta

    def _boot_rest(self) -> None:
        for spec in self.layout.slots:
            if spec.seat != seats_mod.NO_SEAT:
                seat = self.layout.seats[spec.seat]
                self.table.set_slot_meta(spec.index, cpus=seat.cpus, binding=seat.binding)
        self._publish_posture()
        cap = _next_pow2(max(1 << 20, 4 * (self.config.limits.max_payload_bytes + 4096)))
        self.data = DataSegment.create(self.name, len(self.layout.seats), cap, cap)
        self._start_zygote()
        for seat in self.layout.seats:
            self._fork(seat.index)
        deadline = time.monotonic() + BOOT_TIMEOUT_S  # the zygote link's own I/O clock
        while self._pending_forks:
            self._read_zygote(block_until=deadline)
        if self.config.metrics.enabled:
            from fleet.runtime.metrics import MetricsServer

            m = self.config.metrics
            self.metrics = MetricsServer(host=m.host, port=m.port, provider=self._snapshot_for_metrics).start()
            # Held until _publish_units hands them over with the ledger's counters.
            self.run_observer = lambda role, seconds: self._runs_ended.append((role, seconds))
            log.info("fleet %s: metrics on %s", self.name, self.metrics.url)

    def _start_zygote(self) -> None:
        if self._spawner is None:
            # The zygote's parent-death signal fires when the *thread* that started it
            # exits; start it from a thread that lives exactly as long as this fleet.
            self._spawner = ThreadPoolExecutor(1, thread_name_prefix=f"fleet-{self.name}-spawner")
        self.zygote = ZygoteLink.start(self.name, self.roles, self._spawner, worker_nice=self.priority.worker_nice,
                                       workers=_worker_setup(self.config))

    def _fork(self, seat: int) -> None:
        self._pending_forks.add(seat)
        self.zygote.fork(seat, self.layout.seats[seat].cpus)

    def _hear_zygote(self) -> None:
        """Read what the zygote sent (its news count first: news after this read is
        read next time); restart it when it is gone. Also after each wait that timed
        out, and once a sample (`_sample`): a zygote that died said nothing."""
        self._zygote_seen = self.data.zygote_news.value
        if not self._read_zygote():
            self._zygote_died()

    def _read_zygote(self, block_until: float | None = None) -> bool:
        """Handle what the zygote said; False when it is gone."""
        events = self.zygote.read(block_until)
        if events is None:
            return False
        for event in events:
            self._zygote_event(event)
        return True

    def _zygote_event(self, event) -> None:
        if isinstance(event, Forked):
            seat, pid = event.seat, event.pid
            self._pending_forks.discard(seat)
            self._pids[seat] = pid
            self._seat_of_pid[pid] = seat
            for slot in self.dispatcher.slots_of_seat(seat):
                self.table.set_slot_meta(slot, pid=pid)
            log.debug("seat %d: worker pid %d", seat, pid)
        elif isinstance(event, Exited):
            seat = self._seat_of_pid.pop(event.pid, None)
            if seat is not None:
                self._seat_died(seat, event.pid, event.status)

    def _snapshot_for_metrics(self):
        # The metrics server's thread reads the shared table, as any process may.
        table = self.table
        if table is None:
            raise FleetError(f"fleet {self.name!r} has stopped")
        return table.snapshot()

    # ================================================================== posting to the loop
    def _ring(self) -> None:
        data = self.data
        if data is not None:
            data.bell.ring()

    def _on_loop(self) -> bool:
        return threading.get_ident() == self._loop_ident

    def _call(self, fn, *args, timeout: float | None = None, view: bool = False):
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

    # ================================================================== submit (caller's thread)
    def submit(self, role: str, payload=None, *, key=None, lane=None, priority: int = 0, timeout=None,
               request_id=None, chunk: bool = False, pickled_payload: bytes | None = None, route=None,
               severity=None, pinned: bool = False, parent=None, tag=None, age: float = 0.0, block: bool = True,
               block_timeout: float | None = None) -> Future:
        """Queue a unit (see Fleet.submit). `pickled_payload`: the payload already pickled
        by a service-mode client; it travels to the worker as it is, never unpickled here.
        A unit with a `route` asks the provider admission first (fleet.runtime.provider_gate).

        A full queue makes the caller wait for room (at most `block_timeout` seconds),
        or refuses at once with QueueFull when `block` is False. (A future's callback,
        which runs on the loop thread, never waits: it would wait for itself.)"""
        code = self.roles.code(role)
        spec = self.roles.by_code(code)
        _check_unit(spec, key, lane, priority, timeout, request_id)
        if block_timeout is not None and (isinstance(block_timeout, bool) or not isinstance(block_timeout, (int, float))
                                          or block_timeout < 0):
            raise BadUnit(f"block_timeout must be a number of seconds >= 0, got {block_timeout!r}")
        if route is None:
            if severity is not None or pinned or parent is not None or tag is not None or age:
                raise BadUnit("severity, pinned, parent, tag and age are provider admission arguments: give route= too")
            admission = None
        else:
            if chunk:
                raise BadUnit("a chunk of items takes no route: submit provider calls one by one")
            admission = {"lane": lane, "severity": severity, "pinned": pinned, "parent": parent, "tag": tag,
                         "age": age}
            if parent is not None and (type(parent) is not int or not self.ledger.is_open(parent)):
                # 000 §9: only a unit of this fleet that is still owed may delegate (the loop
                # then grants the privilege only while the parent holds a seat)
                raise BadUnit(f"parent {parent!r} is no unit running in fleet {self.name!r}: "
                              "only a running unit delegates")
            if self._providers is not None:
                self._providers.check(route, **admission)
        body = codec.task_body(role, payload, key, lane, request_id, pickled_payload=pickled_payload,
                               limit=self.config.limits.max_payload_bytes)
        timeout = timeout if timeout is not None else spec.timeout_s
        flags = _task_flags(chunk, timeout)
        self._refuse_if_closed(code, role)
        self._room.take(code, role, block=block and not self._on_loop(), timeout=block_timeout)
        unit = self._new_unit(code, key, priority, body, flags, timeout)
        arrival = (unit.unit_id, role, payload, key, lane) if self.recorder is not None else None
        self._intake.post(self._accept, unit, route, admission, arrival, refused=self._turned_away,
                          pace=not self._on_loop())
        return unit.future

    def submit_many(self, role: str, payloads: list, *, lane=None, chunk: bool = False) -> list[Future]:
        """Queue one unit per payload, as `submit(role, payload, lane=lane, chunk=chunk)`
        would each (map's batches): the checks made once, and one command to the loop per
        run of queue room taken, not one per unit. Waits for room as long as it takes, as
        `submit` does by default. Raises what `submit` raises; an unpicklable or too large
        payload raises before any unit of the batch is queued."""
        code = self.roles.code(role)
        spec = self.roles.by_code(code)
        _check_unit(spec, None, lane, 0, None, None)
        limit = self.config.limits.max_payload_bytes
        bodies = [codec.task_body(role, payload, None, lane, None, pickled_payload=None, limit=limit)
                  for payload in payloads]
        timeout = spec.timeout_s
        flags = _task_flags(chunk, timeout)
        self._refuse_if_closed(code, role)
        on_loop = self._on_loop()
        futures, start = [], 0
        while start < len(bodies):
            took = self._room.take(code, role, block=not on_loop, n=min(len(bodies) - start, SUBMIT_RUN))
            units = [self._new_unit(code, None, 0, body, flags, timeout) for body in bodies[start:start + took]]
            arrivals = None
            if self.recorder is not None:
                arrivals = [(u.unit_id, role, p, None, lane) for u, p in zip(units, payloads[start:start + took])]
            self._intake.post(self._accept_many, units, arrivals, refused=self._turned_away_many, pace=not on_loop)
            futures.extend(u.future for u in units)
            start += took
        return futures

    def _new_unit(self, code: int, key, priority: int, body: bytes, flags: int, timeout) -> _Unit:
        future = UnitFuture()  # a Future without the cost of building a Condition nobody waits on
        unit_id = next(self._ids)
        future.unit_id = unit_id  # fleetd replies to a remote submit with it
        return _Unit(unit_id, code, key, priority, future=future, body=body, flags=flags, timeout=timeout)

    def _refuse_if_closed(self, code: int, role: str) -> None:
        if self._closing or self._thread is None or self._intake.closed:
            raise FleetClosed(f"fleet {self.name!r} is shut down; cannot submit")
        if code in self._stopped_view:
            why = self._stop_reasons.get(code, "repeated worker deaths")
            raise RoleBroken(f"role {role!r} was stopped ({why}); it takes no more work")

    # ================================================================== submit (the loop)
    def _accept(self, unit: _Unit, route, admission: dict | None, arrival: tuple | None) -> None:
        """A posted submit: into the ledger and on its way (provider gate, lease, queue).
        `admission`: lane, severity, pinned, parent, tag (a unit with a route); `arrival`:
        what the arrival log records, when [record] is on."""
        code, unit_id = unit.role, unit.unit_id
        late = self._late_failure(code)
        if late is not None:
            # The fleet closed, or the role stopped, after the caller's check: the caller
            # holds the unit's future, so the unit is counted and fails as the units
            # queued at that moment did (Shutdown, RoleStopped); never an orphan future.
            self._units[unit_id] = unit
            self.ledger.submitted(unit_id)
            self._fail_unstarted(unit_id, *late)
            return
        refusal = decision = None
        parent = None if admission is None else admission["parent"]
        if parent is not None and self.dispatcher.slot_of(parent) is None:
            # 000 §9 licenses a delegated unit only for a parent holding a seat here. The
            # caller's check found it owed; one still queued, or ended since, delegates
            # nothing: its child is admitted as any unit is (never an orphan future).
            admission = {**admission, "parent": None}
        if route is not None:
            try:
                decision = self._providers.admit(unit_id, unit, route, **admission)
            except BadUnit as exc:  # the catalog changed since the caller's check (a reload)
                refusal = exc
        if refusal is not None:
            _fail_future(unit.future, refusal)
            self._room.give(code)
            return
        self._units[unit_id] = unit
        self._accepted = True
        self.ledger.submitted(unit_id)
        if self.recorder is not None:
            self.recorder.arrival(*arrival)
        if decision is not None and not decision.starts:
            self._providers.watch(unit_id, unit.future)  # waits in the provider gate
            return
        if decision is not None:
            self._routed(unit_id, decision.route)
        self._to_dispatch(unit)

    def _late_failure(self, code: int) -> tuple[str, str] | None:
        """(reason, detail) for a unit of role `code` accepted after the fleet closed or
        the role stopped; None while it may be queued."""
        if self._closing:
            return Reason.SHUTDOWN, "the fleet closed before the unit was queued"
        if code in self._stopped_roles:
            return Reason.ROLE_STOPPED, self._stop_reasons.get(
                code, f"role {self.roles.by_code(code).name} exceeded its restart intensity")
        return None

    def _turned_away(self, error: BaseException, unit: _Unit, *_rest) -> None:
        """A submit the loop never accepted: it had stopped as the caller posted (this runs
        on the poster's thread, or the loop's as it closes the intake). The caller holds
        the future, so the unit is counted and fails Shutdown, as the units queued at the
        stop did. Only the ledger is touched (it is thread-safe; the rest is the loop's)."""
        self.ledger.submitted(unit.unit_id)
        self.ledger.record(unit.unit_id, FAILED, Reason.SHUTDOWN)
        role = self.roles.by_code(unit.role).name
        _fail_future(unit.future, error_for(unit.unit_id, role, Outcome(
            FAILED, Reason.SHUTDOWN, f"{error}: the unit was never queued")))

    def _turned_away_many(self, error: BaseException, units: list, *_rest) -> None:
        """A `submit_many` run the loop never accepted: each unit as `_turned_away`."""
        for unit in units:
            self._turned_away(error, unit)

    def _accept_many(self, units: list, arrivals: list | None) -> None:
        """A posted `submit_many` run (units of one role, no route): each unit accepted
        as a single submit is. While the fleet is open, the role runs and takes no lease
        (what `_accept` checks per unit), the run goes on in bulk: one ledger lock, one
        queue push loop."""
        if not units or self._closing or units[0].role in self._stopped_roles or self._gated(units[0].role):
            for i, unit in enumerate(units):
                self._accept(unit, None, None, None if arrivals is None else arrivals[i])
            return
        held = self._units
        for unit in units:
            held[unit.unit_id] = unit
        self._accepted = True
        self.ledger.submitted_many([unit.unit_id for unit in units])
        if self.recorder is not None and arrivals is not None:
            for arrival in arrivals:
                self.recorder.arrival(*arrival)
        self.dispatcher.enqueue_many(units)

    def _to_dispatch(self, pending: Pending) -> None:
        """A unit past the provider admission goes to the dispatcher, or first waits for its
        host-group lease when its role is gated."""
        if self._gated(pending.role):
            # queued for dispatch only once the host-group store grants it a lease
            self._held[pending.unit_id] = pending
            self._gate.hold(pending.unit_id, self.roles.by_code(pending.role).name)
        else:
            self.dispatcher.enqueue(pending)

    def _gated(self, code: int) -> bool:
        """Whether units of role `code` wait for a host-group lease before dispatch."""
        return self._gate is not None and self._gate.gates(self.roles.by_code(code).name)

    def _routed(self, unit_id: int, route) -> None:
        """The route admission chose travels with the unit's task: the handler's `unit.route`."""
        unit = self._units[unit_id]
        body = codec.split_route(unit.body)[1] if unit.flags & M.F_ROUTED else unit.body  # a refused unit's last route
        unit.body = codec.with_route(body, route)
        unit.flags |= M.F_ROUTED

    # ================================================================== dispatch
    def _dispatch(self) -> None:
        """Grant what can be granted and send it to the seats."""
        self._shed_deferred_at_close()
        if self._draining:
            return
        self.dispatcher.skip = self._cancelled
        grants = self.dispatcher.grant()
        for unit_id in self.dispatcher.take_skipped():
            if unit_id in self._lease_lost:
                self._close(unit_id, Outcome(FAILED, *self._lease_lost[unit_id]))
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

    def _shed_deferred_at_close(self) -> None:
        """Closing while Cordoned: deferrable units not yet started fail Shutdown.

        Shutdown waits for every queued unit, but cordon holds deferrable intake, and a
        sticky cause (lane-death, operator) never clears without an operator: waiting
        could last forever. (Units a worker holds back come home the same way.)
        """
        if not self._closing:
            return
        for code, spec in enumerate(self.roles):
            if not cordon.sheds_at_close(self.posture.posture, spec.class_code) or not self.dispatcher.queued(code):
                continue
            for item in self.dispatcher.drain_queue(code):
                self._fail_unstarted(item.unit_id, Reason.SHUTDOWN,
                                     f"the fleet closed while cordoned ({self._held_by()}); it never ran")

    def _held_by(self) -> str:
        return ", ".join(sorted(self.posture.state.causes)) or "throttling"

    def _cancelled(self, unit_id: int) -> bool:
        """Called as a unit comes up for a grant: True if its caller cancelled it; otherwise
        its future is marked running (from here on it cannot be cancelled). A unit whose
        host-group lease ended while it waited is skipped too: no dispatch without a lease."""
        if self._lease_lost and unit_id in self._lease_lost:
            return True
        return not self._units[unit_id].future.claim()

    def _flush(self, seat: int) -> None:
        ring, outbox = self.data.tasks(seat), self._outbox[seat]
        while outbox and ring.push(M.TASK, outbox[0]):
            outbox.popleft()
        ring.notify()

    def _end(self, unit_id: int) -> _Unit | None:
        """The one place a unit leaves the books: its room in the queue goes back if it
        never got a slot."""
        unit = self._units.pop(unit_id, None)
        if unit is not None and unit.queued:
            unit.queued = False
            self._room.give(unit.role)
        return unit

    def _close(self, unit_id: int, outcome: Outcome, value=None, original=None, cost=None,
               solved: list | None = None) -> None:
        """Record an outcome; its future resolves at the end of this turn. `solved`: a
        slice's list of solved units, which its caller ledgers in one call."""
        if self._providers is not None:
            # its pool takes the signal; a refused unit within its limit is handed back (000 §8)
            again = self._providers.ended(unit_id, outcome, original, cost, self._units.get(unit_id))
            if again is not None:
                self._refused_again(unit_id, again)
                return
        if self._gate is not None:
            self._lease_lost.pop(unit_id, None)
            self._gate.done(unit_id)  # give its lease back
        unit = self._end(unit_id)
        if solved is not None and outcome.kind == SOLVED:
            solved.append(unit_id)
        else:
            self.ledger.record(unit_id, outcome.kind, outcome.reason)
        if unit is None:
            return
        if outcome.kind == SOLVED:
            self._done.append((unit.future, value, None))
        else:
            role = self.roles.by_code(unit.role).name
            self._done.append((unit.future, None, unit_exception(unit_id, role, outcome, original)))

    def _refused_again(self, unit_id: int, decision) -> None:
        """A refused unit the provider admission decided again: no outcome yet (the ledger
        sees one when it ends). It starts now on the decision's route, or waits in the
        gate. It keeps its host-group lease meanwhile, and has no queue room to give back
        (it was granted once): re-queued, it goes past the role's bound, never lost."""
        if decision.starts:
            self._routed(unit_id, decision.route)
            self.dispatcher.enqueue(self._units[unit_id])

    def _fail_unstarted(self, unit_id: int, reason: str, detail: str) -> None:
        """A unit that never ran fails with `reason` (its future is claimed first: a
        cancel that raced it has no say any more)."""
        self._units[unit_id].future.claim()
        self._close(unit_id, Outcome(FAILED, reason, detail))

    def _forget(self, unit_id: int, cancel_future: bool = False) -> None:
        """A unit cancelled before it ran: recorded Cancelled (its future is cancelled
        already, or here when `cancel_future`)."""
        unit = self._end(unit_id)
        if unit is not None and cancel_future:
            unit.future.cancel()
        self.ledger.record(unit_id, FAILED, Reason.CANCELLED)
        if self._providers is not None:
            self._providers.ended(unit_id, _CANCELLED)
        if self._gate is not None:
            self._gate.done(unit_id)

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

    # ================================================================== the loop
    def _loop(self) -> None:
        self._loop_ident = threading.get_ident()
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
                    self._sample()
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
                        self._hear_zygote()  # a quiet spell: a zygote that died said nothing
        except BaseException:  # noqa: BLE001 - the loop must never die silently
            log.exception("fleet %s: supervisor loop crashed", self.name)
            self._close_intake()  # nothing would ever run a unit submitted from here on
            self._fail_everything(Reason.LANE_DEATH, "the supervisor loop crashed")
        finally:
            self._teardown()
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
        if self.data.zygote_news.value != self._zygote_seen:
            self._hear_zygote()  # it sent an event (and rang)
        self._collect()
        if self._providers.has_work():
            self._provider_tick()
        now = self.host.monotonic()
        if self._deadlines:
            self._check_deadlines(now)
        if self._stop_at is not None and now >= self._stop_at:
            self._stop_at = None
            self._fail_queued(Reason.SHUTDOWN, "the fleet stopped before it ran")
        return ran >= INTAKE_BATCH

    def _sleep_for(self, now: float) -> float:
        wait = IDLE_WAIT_S
        if self._providers.has_work():
            wait = min(wait, self._providers.seconds_to_wake(IDLE_WAIT_S))
        if self._stop_at is not None:
            wait = min(wait, max(0.0, self._stop_at - now))
        return wait

    def _provider_tick(self) -> None:
        """Units the provider admission held: cancelled ones end, due ones start; bulkheads
        published."""
        gate = self._providers
        for unit_id in gate.take_cancelled():
            self._forget(unit_id)
        for unit_id, _pending, why, refusal in gate.spent():
            self._close(unit_id, Outcome(FAILED, Reason.REFUSED, why), original=refusal)
        if gate.due():
            for unit_id, pending, route in gate.wake():
                self._routed(unit_id, route)
                self._to_dispatch(pending)
            self._dispatch()
        gate.publish()

    def _drop_waiting(self, reason: str, detail: str, cancel: bool = False) -> None:
        """End every unit waiting for provider admission: failed with `reason`, or cancelled."""
        for unit_id, why in self._providers.drop_waiting():
            if cancel:
                self._forget(unit_id, cancel_future=True)
            else:
                self._fail_unstarted(unit_id, reason, f"{detail}: {why}" if why else detail)

    def _collect(self) -> None:
        busy = False
        for seat in range(len(self.layout.seats)):
            ring = self.data.results(seat)
            while batch := ring.pop_many(max_msgs=RESULT_SLICE):
                busy = True
                self._handle_results(batch)
                if len(batch) < RESULT_SLICE:
                    break
            if self._outbox.get(seat):
                self._flush(seat)
        if busy:
            self._publish_units()

    def _handle_results(self, batch) -> None:
        """A slice of results: outcomes recorded (the solved ones in one ledger call), and
        the slots they freed granted and sent at once (counters are published once per
        pass, before delivery)."""
        self._take_messages(batch)
        self._dispatch()

    def _take_messages(self, batch) -> None:
        solved: list[int] = []
        try:
            for tag, view in batch:
                self._take_message(tag, view, solved)
        finally:  # even past an error: every unit taken off the books has its outcome
            if solved:
                self.ledger.solved_many(solved)

    def _take_message(self, tag: int, view, solved: list) -> None:
        """One message from a worker: a unit started (its run time limit is armed), or a
        unit's result (its outcome recorded, a solved one onto `solved`; the slot it
        freed is granted by the caller)."""
        if tag == M.STARTED:
            unit_id, _slot = M.STARTED_HEAD.unpack_from(view)
            unit = self._units.get(unit_id)
            if unit is not None and unit.timeout is not None:
                unit.due = self.host.monotonic() + unit.timeout
                heapq.heappush(self._deadlines, (unit.due, unit_id))
            return
        unit_id, slot, status, final, elapsed, cost, cpu = M.RESULT_HEAD.unpack_from(view)
        outcome, value, original = codec.result_outcome(status, view[M.RESULT_HEAD.size :], relay=self._relay)
        if cost != cost:  # NaN: no cost reported
            cost = None
        unit = self._units.get(unit_id)
        if status == M.ST_START_REFUSED and unit is not None and self.dispatcher.requeue(unit_id):
            return  # sent behind a pin that cordon drained: it waits for a new grant
        if status == M.ST_HELD_AT_CLOSE and unit is not None:
            self._vacate(slot)  # its lease never started: walk the slot home (T10)
            final = self.table.state(slot)[0]
        if outcome.reason == Reason.FSM_REFUSED:
            self._fsm_refused(f"unit {unit_id}: {outcome.detail}")
        if unit is not None:
            self.dispatcher.complete(unit_id, final)
            if self.run_observer is not None:
                self.run_observer(self.roles.by_code(unit.role).name, elapsed)
            if self.recorder is not None:  # the measured work shape of a recorded arrival
                self.recorder.completion(unit_id, elapsed, outcome.kind, cpu_s=cpu)
        if unit is not None and (unit.flags & M.F_CHUNK) and outcome.kind != SOLVED and value is not None:
            # A chunk's items travel with it whatever its outcome: map raises item by item.
            self.ledger.record(unit_id, outcome.kind, outcome.reason)
            self._end(unit_id)
            self._done.append((unit.future, value, None))
            return
        self._close(unit_id, outcome, value, original, cost, solved)

    # ================================================================== deaths
    def _seat_died(self, seat: int, pid: int, status: int, restart: bool = True) -> None:
        """A worker is gone. `restart=False` when its zygote died too (all seats are
        forked again once a new zygote runs)."""
        self._pids.pop(seat, None)
        self._take_delivered(seat)
        # Tasks it never took would run again on its successor: drop them.
        tasks = self.data.tasks(seat)
        while tasks.pop_many():
            pass
        self._outbox.pop(seat, None)
        lost = self.dispatcher.seat_lost(seat)
        owed = [self._owed(item.unit_id, slot) for item, slot in lost]
        how = deaths_mod.cause(status, [unit.unit_id for unit in owed if unit.timed_out])
        worker = f"worker pid {pid} of seat {self.layout.seats[seat].name} died ({how})"
        back = []  # never started: back to the head of their queues, unrun
        for (item, _slot), unit in zip(lost, owed):
            self._timed_out.discard(unit.unit_id)
            outcome = deaths_mod.verdict(unit, worker)
            if outcome is None:
                back.append(item)
            else:
                self._close(unit.unit_id, outcome)
        self.dispatcher.put_back_first(back)
        # Slots switch roles: the roles that died are those of the units it ran.
        dead_roles = {item.role for (item, _slot), unit in zip(lost, owed) if unit.started}
        self._reset_slots(seat)
        planned = status in (EXIT_RETIRED, EXIT_INIT_FAILED) and pid not in self._killed
        if planned:
            # No death: it ran its max_tasks (replaced, as any seat is), or its initializer
            # failed (every worker would: its roles stop; fleet.runtime.worker_setup).
            keep = self._worker_exited(seat, pid, status)
        else:
            # Count the death first: a role past its limit is stopped before anything could
            # be granted to the seat again (a cordon change below dispatches).
            keep = self._count_death(seat, how, dead_roles)
        if pid not in self._killed and not planned:
            # Every lane death cordons (sticky) until an operator releases it (002 §14).
            self._after_posture_change(self.posture.hold(posture_mod.LANE_DEATH, self.host.now_ms()))
        self._killed.discard(pid)
        # Re-fork even while shutting down: shutdown waits for every queued unit, and
        # only a live seat can run them (not re-forking here wedged shutdown for good).
        if keep and restart:
            self._fork(seat)
        self._dispatch()
        self._publish_units()

    def _worker_exited(self, seat: int, pid: int, status: int) -> bool:
        """A worker that left on purpose (`_seat_died`): True to fork its seat again."""
        name = self.layout.seats[seat].name
        if status == EXIT_RETIRED:
            log.info("fleet %s: worker pid %d of seat %s ran its max_tasks; replaced", self.name, pid, name)
            return True
        why = f"the worker initializer failed in worker pid {pid} (its traceback is in the worker's log)"
        for role in self.layout.seats[seat].roles:
            self._stop_role(self.roles.code(role), why)
        return not self._seat_stopped(seat)

    def _owed(self, unit_id: int, slot: int) -> deaths_mod.Owed:
        """What is known of a unit a dead seat owed on `slot`. Started: its worker records
        the id in the slot's row as it STARTs the slot, before it decodes the unit or runs
        the handler; a slot runs its units one after another, and the result of each that
        ended before was taken, so the id there is the one unit of the slot that may have run."""
        return deaths_mod.Owed(unit_id, self.table.unit(slot) == unit_id, unit_id in self._timed_out,
                               self._lease_lost.get(unit_id))

    def _take_delivered(self, seat: int) -> None:
        """Apply every result a (dead or stopped) worker pushed before it went."""
        ring = self.data.results(seat)
        batch = ring.pop_many()
        while batch:
            self._take_messages(batch)
            batch = ring.pop_many()

    def _reset_slots(self, seat: int) -> None:
        """Walk a dead seat's slots back to Idle (fsm.RESET_PATHS), in any posture."""
        for slot in self.dispatcher.slots_of_seat(seat):
            state = self.table.state(slot)[0]
            for event in fsm.RESET_PATHS.get(state, ()):
                reason = self.table.transition(slot, event)
                if reason != fsm.OK:
                    what = f"slot {slot}: reset {fsm.EVENT_NAMES[event]} refused: {fsm.REASON_NAMES[reason]}"
                    self._fsm_refused(what)
                    break
            self.table.set_slot_meta(slot, pid=0)

    def _vacate(self, slot: int) -> None:
        """A lease handed back unstarted: Leased -> Idle (T10). A slot in another state
        (e.g. Pinned, for a RESUME held back) keeps it."""
        if self.table.state(slot)[0] == fsm.LEASED:
            reason = self.table.transition(slot, fsm.VACATE)
            if reason != fsm.OK:
                self._fsm_refused(f"slot {slot}: VACATE refused: {fsm.REASON_NAMES[reason]}")

    def _fsm_refused(self, what: str) -> None:
        """The slot FSM refused the runtime a transition: a bug in a rule, logged and counted
        apart from worker deaths (status shows the count)."""
        log.error("fleet %s: slot FSM refused a transition: %s", self.name, what)
        self.ledger.fsm_refused()

    def _count_death(self, seat: int, how: str, roles: set | None = None) -> bool:
        """Restart intensity (fleet.rules.intensity): True to restart the seat; False stops its roles.
        A death counts for `roles` (those of the units the worker ran), else for every role
        that may run on the seat."""
        now = self.host.monotonic()
        codes = sorted(roles) if roles else map(self.roles.code, self.layout.seats[seat].roles)
        stop = [code for code in codes if self._deaths.died(code, now)]
        log.warning("fleet %s: seat %s worker died (%s)", self.name, self.layout.seats[seat].name, how)
        for code in stop:
            self._stop_role(code)
        return not self._seat_stopped(seat)

    def _seat_stopped(self, seat: int) -> bool:
        """Every role the seat serves was stopped: it is not restarted."""
        return all(self.roles.code(r) in self._stopped_roles for r in self.layout.seats[seat].roles)

    def _stop_role(self, code: int, why: str | None = None) -> None:
        """Stop role `code` for good: it exceeded its restart intensity (or `why`)."""
        if code in self._stopped_roles:
            return
        self._stopped_roles.add(code)
        self._stopped_view = frozenset(self._stopped_roles)  # callers refuse its submits from now on
        name = self.roles.by_code(code).name
        limit = self.config.restart
        if why is None:
            log.error("fleet %s: role %s died more than %d times in %ss: stopped; its queued units fail",
                      self.name, name, limit.max_restarts, limit.within_seconds)
            why = f"role {name} exceeded its restart intensity"
        else:
            log.error("fleet %s: role %s stopped: %s; its queued units fail", self.name, name, why)
        self._stop_reasons[code] = why
        for item in self.dispatcher.drain_queue(code):
            self._fail_unstarted(item.unit_id, Reason.ROLE_STOPPED, why)
        self._after_posture_change(self.posture.hold(posture_mod.LANE_DEATH, self.host.now_ms()))

    def _zygote_died(self) -> None:
        """The fork server is gone: its workers die with it. Fail what they owed, start again."""
        if self.zygote is None or self._zygote_gone:
            return
        self._zygote_gone = True
        code = self.zygote.wait()
        log.error("fleet %s: worker fork server exited (code %s)", self.name, code)
        pids = dict(self._seat_of_pid)
        for pid in pids:
            self.host.wait_gone(pid)  # they die with it (parent-death signal)
        for pid, seat in pids.items():
            self._seat_of_pid.pop(pid, None)
            self._seat_died(seat, pid, -signal.SIGKILL, restart=False)
        # Start a new one even while shutting down: queued units still need seats, and
        # shutdown waits for them (the loop exits, and tears it down, once none is owed).
        if self._closing and not self._units:
            return
        self._pending_forks.clear()
        self.zygote.exit(timeout=0.5)
        self._restart_zygote()
        self._zygote_gone = False
        for seat in range(len(self.layout.seats)):
            if not self._seat_stopped(seat):
                self._fork(seat)

    def _restart_zygote(self, attempts: int = 3) -> None:
        """Start a new fork server. A start can fail when the new zygote is itself killed
        while it boots: try again a few times before giving up (the loop then fails every
        unit owed and closes intake)."""
        for attempt in range(1, attempts + 1):
            try:
                self._start_zygote()
                return
            except WorkerStartError as exc:
                log.error("fleet %s: worker fork server restart %d/%d failed: %s", self.name, attempt, attempts, exc)
                if attempt == attempts:
                    raise
                # (ZygoteLink.start has reaped the zygote that failed.)

    # ================================================================== host-group leases (posted by the gate)
    def _lease_granted(self, unit_id: int) -> None:
        """The store admitted a held unit: queue it for dispatch."""
        pending = self._held.pop(unit_id, None)
        if pending is None or unit_id not in self._units:
            return
        self.dispatcher.enqueue(pending)
        self._dispatch()

    def _drop_held(self, reason: str = "", detail: str = "", cancel: bool = False) -> None:
        """End every unit still waiting for its lease: failed with `reason`, or cancelled;
        their requests are withdrawn from the store."""
        for unit_id in list(self._held):
            del self._held[unit_id]
            if cancel:
                self._forget(unit_id, cancel_future=True)
            else:
                self._fail_unstarted(unit_id, reason, detail)

    def _lease_ended(self, unit_id: int, reason: str, detail: str) -> None:
        """A unit's request or lease ended early; fail it with `reason` (LeaseDenied,
        LeasePreempted, LeaseExpired). A running unit's worker is killed."""
        if unit_id not in self._units:
            return
        if self._held.pop(unit_id, None) is not None:
            self._close(unit_id, Outcome(FAILED, reason, detail))
            return
        self._lease_lost[unit_id] = (reason, detail)  # queued: skipped at its grant; running: killed
        slot = self.dispatcher.slot_of(unit_id)
        pid = None if slot is None else self._pids.get(self.layout.seat_of(slot))
        if pid is not None:
            self._killed.add(pid)  # our own kill: not a lane death
            log.warning("fleet %s: unit %d lost its lease (%s); killing worker pid %d", self.name, unit_id, detail, pid)
            self.host.kill(pid)

    # ================================================================== timers
    def _check_deadlines(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            due, unit_id = heapq.heappop(self._deadlines)
            unit = self._units.get(unit_id)
            slot = self.dispatcher.slot_of(unit_id)
            if slot is None or unit is None or unit.due != due:
                continue  # already ended, or the deadline of a run before this one (a refused unit's)
            pid = self._pids.get(self.layout.seat_of(slot))
            if pid is None:
                # Its worker is being (re)started: look again shortly.
                unit.due = now + 0.01
                heapq.heappush(self._deadlines, (unit.due, unit_id))
                return
            self._timed_out.add(unit_id)
            self._killed.add(pid)
            log.warning("fleet %s: unit %d ran past its timeout; killing worker pid %d", self.name, unit_id, pid)
            self.host.kill(pid)

    def _sample(self) -> None:
        self._hear_zygote()  # a zygote that died said nothing: its socket tells
        tick = self.sampler.tick()
        if tick.transition is not None:
            self._after_posture_change(tick.transition)
        self._watch_quota()
        self._publish_units()
        self._providers.refresh_catalog()  # 000 §7: the catalog read every sweep, when its file changed
        self._providers.publish(force=True)  # backoffs and closures end with time
        self._publish_posture()  # dwell and suppressed intake move without a transition
        for code in range(len(self.roles)):
            self.table.set_queue_depth(code, self.dispatcher.queued(code), self.dispatcher.in_use(code),
                                       self.dispatcher.repins[code])

    def _watch_quota(self) -> None:
        """Quota re-detection and CPU pressure (fleet.host.sampler.QuotaWatcher): pressure on
        the fleet's own group holds the posture Cordoned; a quota change is logged and,
        when the plan's quota changed, starts a new epoch."""
        seen = self.quota_watcher.poll()
        if seen.pressure is not None:
            act = self.posture.hold if seen.pressure == pressure_mod.HOLD else self.posture.release
            self._after_posture_change(act(pressure_mod.CAUSE, self.host.now_ms()))
        if seen.change is not None:
            self._quota_changed(seen.change)
        released = self.dispatcher.take_idle_stale_pins()  # pins of a past epoch, now empty
        for slot in released:
            if self.table.transition(slot, fsm.UNPIN) != fsm.OK:
                log.error("slot %d: epoch UNPIN refused in state %s", slot, fsm.STATE_NAMES[self.table.state(slot)[0]])
        if released or seen.pressure is not None or seen.change is not None:
            self._dispatch()

    def _quota_changed(self, change) -> None:
        """Log the change; a new epoch re-derives the budget (logged: the seats stay as
        booted until a restart), drains in-flight deferrable units (T7) and marks every
        pin for release (T9 once it is empty)."""
        log.warning("[fleet-posture] fleet %s: %s", self.name, change.describe())
        self.table.set_quota_epoch(self.quota_watcher.epoch, change.new.detected)
        if change.epoch is None:
            return
        log.warning("fleet %s: epoch %d: %s", self.name, change.epoch,
                    quota_mod.replan(change.new.cpus, self.plan, self.config).describe(self.plan))
        for slot in self._running_deferrable():
            # One unit in flight only: units queued behind a keyed slot would find it Idle.
            if self.dispatcher.units_in_flight(slot) == 1:
                self.table.transition(slot, fsm.DRAIN)
        self.dispatcher.begin_epoch()

    def _after_posture_change(self, change) -> None:
        """Publish the posture; on cordon, drain running deferrable slots."""
        self._publish_posture()
        if change is None:
            return
        if cordon.halts_any(self.posture.posture):
            for slot in self._running_deferrable():
                self.table.transition(slot, fsm.DRAIN)
        self._last_change = change
        self._dispatch()

    def _running_deferrable(self) -> list[int]:
        """Slots Running a unit of a deferrable role now (slots switch roles: the word says which)."""
        out = []
        for slot in range(len(self.layout.slots)):
            state, code, _key, _gen = self.table.state(slot)
            if state == fsm.RUNNING and cordon.yields(self.roles.by_code(code).class_code):
                out.append(slot)
        return out

    def _publish_units(self) -> None:
        """The one point unit counters and run times are published, before the futures
        they count resolve: the table's ledger, then the metrics' counters and histogram
        as one step (so neither lags the other)."""
        self.ledger.publish(self.table)
        if self.metrics is not None:
            runs, self._runs_ended = self._runs_ended, []
            self.metrics.publish_units(self.ledger.counts().to_dict(), runs)

    def _publish_posture(self) -> None:
        p = self.posture
        state = p.state
        pol = p.policy
        now = self.host.now_ms()
        self.table.set_posture(
            p.posture,
            cause=posture_mod.cause_code(state, self._last_change),
            since_ns=state.since_ms * 1_000_000,
            enter_count=state.enter_count,
            exit_count=state.exit_count,
            cordoned_ns=int(posture_mod.cordoned_dwell_ms(state, now)) * 1_000_000,
            suppressed=self.dispatcher.suppressed,
            enter_events=pol.cordon_enter_events,
            enter_window_ms=pol.cordon_enter_window_ms,
            duty_ppm=int(round(pol.cordon_duty_percent * 10_000)),
            duty_window_ms=pol.cordon_duty_window_ms,
            exit_clean_ms=pol.cordon_exit_clean_ms,
            intake_floor=pol.cordon_sim_intake_floor or 0,
        )
        floors = [pol.intake_floor(r.slots) for r in self.roles]
        self.dispatcher.set_posture(p.posture, floors)

    # ================================================================== operator (posted to the loop)
    def posture_show(self) -> dict:
        return self._call(lambda: self.posture.show(self.host.now_ms()), view=True)

    def posture_set(self, patch: dict) -> dict:
        """Retune the posture policy live (validated; a bad patch changes nothing)."""
        return self._call(self._posture_set, patch)

    def _posture_set(self, patch: dict) -> dict:
        result = self.posture.retune(patch, self.host.now_ms())
        self._publish_posture()
        self._dispatch()
        return result

    def hold(self, cause: str = posture_mod.OPERATOR) -> None:
        """Hold the posture Cordoned for `cause` until `release(cause)` (operator cordon)."""
        self._call(lambda: self._after_posture_change(self.posture.hold(cause, self.host.now_ms())))

    def release(self, cause: str = posture_mod.OPERATOR) -> dict:
        """Release a sticky posture cause (`lane-death`, `operator`); returns the posture view
        with ``released``: whether the cause was held. An unknown cause raises
        PostureCauseError and changes nothing. The posture turns Nominal once the exit
        window is clean and no other cause holds it."""
        return self._call(self._release, cause)

    def _release(self, cause: str) -> dict:
        held = posture_mod.check_cause(cause) in self.posture.state.causes
        self._after_posture_change(self.posture.release(cause, self.host.now_ms()))
        if held:
            log.warning("fleet %s: operator released the posture cause %s", self.name, cause)
        return {**self.posture.show(self.host.now_ms()), "released": held}

    def reload(self, config: FleetConfig) -> dict:
        """Apply what can change on a live fleet (posture policy, queue bounds); report
        what needs a restart. Nothing is applied if the posture policy is invalid, or if
        the config could not boot on this host now (its typed boot refusal is raised)."""
        return self._call(self._reload, config)

    def _reload(self, config: FleetConfig) -> dict:
        # A config a restart would refuse (a budget over the quota, no handler) is refused
        # whole: accepting its live parts would leave a fleet that cannot start again.
        quota_mod.project(config, self.host.effective_cpus(), self._cpus_override or self.host.affinity())
        applied, restart = [], []
        old = self.config
        for field in ("name", "profile", "cpus", "budget", "limits", "restart", "metrics", "store"):
            if getattr(config, field) != getattr(old, field):
                restart.append(field)
        # Compare roles with the one live field masked (1: a Role refuses a bound below 1).
        old_roles = {r.name: dataclasses.replace(r, queue_bound=1) for r in old.roles}
        new_roles = {r.name: dataclasses.replace(r, queue_bound=1) for r in config.roles}
        if old_roles != new_roles:
            restart.append("roles")
        if config.posture != self.posture.policy:
            patch = {k: v for k, v in config.posture.to_dict().items() if v != getattr(self.posture.policy, k)}
            if patch:
                self.posture.retune(patch, self.host.now_ms())
                self._publish_posture()
                applied.append("posture")
        if self._providers.reload(config.admission)[0]:
            applied.append("admission")
        if "roles" not in restart:
            bounds = [config.roles[r.name].queue_bound for r in self.roles]
            if bounds != self._room.bounds():
                self._room.set_bounds(bounds)
                applied.append("roles.*.queue_bound")
        # A reload is an epoch boundary (002 §3.4): pins are released (T9) once empty.
        if self.dispatcher.begin_epoch():
            applied.append("pins released")
        self._dispatch()
        return {"applied": applied, "needs_restart": restart}

    def drain(self) -> None:
        """Take nothing new from the queues; in-flight units complete."""
        self._call(self._set_draining, True)

    def resume(self) -> None:
        self._call(self._set_draining, False)

    def _set_draining(self, draining: bool) -> None:
        self._draining = draining
        self._dispatch()

    # ================================================================== shutdown
    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Take no more units; with `cancel_futures`, queued units are cancelled. Returns once
        every unit owed has its outcome and the fleet is torn down (unless `wait` is False)."""
        if wait or self._on_loop():
            self._stop_with(self._shutdown, cancel_futures, wait=wait)
        elif self._thread is not None and not self._stopped.is_set():
            # Executor semantics: once shutdown returns, submit refuses (and the table says
            # closing), so wait for the loop to apply it, not for the units to end.
            try:
                self._call(self._shutdown, cancel_futures)
            except FleetClosed:
                pass  # it stopped meanwhile: nothing left to shut

    def _shutdown(self, cancel_futures: bool) -> None:
        self._close_intake()
        if cancel_futures:
            self._cancel_queued()
            self._drop_held(cancel=True)
            self._drop_waiting("", "", cancel=True)
        # Shutdown waits for queued units, but not for a provider's reopening: a closed
        # key may wait until midnight. Units still waiting for admission fail Shutdown.
        self._drop_waiting(Reason.SHUTDOWN, "the fleet closed while the unit waited for provider admission")
        self._dispatch()

    def _cancel_queued(self) -> None:
        """Cancel every queued unit, except one whose future runs already (it came back
        unrun from a dead seat): that one cannot be cancelled any more, so it stays first
        in its queue and runs (shutdown waits for it)."""
        running = []
        for item in self.dispatcher.drain_queue():
            if self._units[item.unit_id].future.cancel():
                self._forget(item.unit_id)
            else:
                running.append(item)
        self.dispatcher.put_back_first(running)

    def stop(self, grace_s: float = 0.0, wait: bool = True) -> None:
        """Stop soon: queued units fail with Shutdown once nothing runs or `grace_s` has
        passed, whichever is first; in-flight ones finish."""
        self._stop_with(self._stop, grace_s, wait=wait)

    def _stop(self, grace_s: float) -> None:
        self._close_intake()
        self._stop_at = self.host.monotonic() + grace_s
        self._drop_waiting(Reason.SHUTDOWN, "the fleet stopped while the unit waited for provider admission")

    def _fail_queued(self, reason: str, detail: str) -> None:
        """Every unit not yet granted a slot fails with `reason`."""
        for item in self.dispatcher.drain_queue():
            self._fail_unstarted(item.unit_id, reason, detail)
        self._drop_held(reason, detail.replace("before it ran", "before the host-group store granted its lease"))

    def kill(self, wait: bool = True) -> None:
        """Stop now: workers are killed; every unit still owed fails with Shutdown."""
        self._stop_with(self._kill, wait=wait)

    def _kill(self) -> None:
        self._close_intake()
        self._fail_everything(Reason.SHUTDOWN, "the fleet was stopped")

    def _stop_with(self, fn, *args, wait: bool) -> None:
        """Post a stop to the loop (a fleet that has stopped already stays stopped)."""
        if self._thread is None or self._stopped.is_set():
            return
        if self._on_loop():
            fn(*args)  # from a future's callback: the loop finishes the stop after this turn
            return
        self._intake.post(self._op, fn, *args, refused=_ignore_refusal)
        if wait:
            self._stopped.wait()

    def _close_intake(self) -> None:
        """Refuse new units from here on; readers of the table see it too."""
        if self._closing:
            return
        self._closing = True
        if self.recorder is not None:
            self.recorder.close()
        if self.table is not None:
            self.table.set_flags(L.FLAG_CLOSING)

    def _fail_everything(self, reason: str, detail: str) -> None:
        """Kill the workers, keep what they delivered, fail everything else with `reason`."""
        self._fail_queued(reason, detail)
        if self._providers is not None:
            self._drop_waiting(reason, detail)
        pids = dict(self._pids)
        self._killed.update(pids.values())
        for pid in pids.values():
            self.host.kill(pid)
        for pid in pids.values():
            self.host.wait_gone(pid)
        for seat in range(len(self.layout.seats)):
            self._take_delivered(seat)
            for item, _slot in self.dispatcher.seat_lost(seat):  # started or not: nothing will run it now
                self._close(item.unit_id, Outcome(FAILED, reason, detail))
        # Submits posted but not yet accepted are counted and fail Shutdown (see _accept).
        self._intake.drain()
        self._deliver()

    def _atexit_close(self) -> None:
        """At interpreter exit, the work submitted finishes, as with ProcessPoolExecutor:
        a fleet nobody shut down (or shut down without waiting) shuts down now and waits
        for every unit owed (units `shutdown(cancel_futures=True)` cancelled stay so).
        Only in the process that started the fleet: a fork of it (a multiprocessing
        child, which runs these hooks as it ends) has no loop to wait for."""
        if os.getpid() != self._owner_pid:
            return
        if not self._stopped.is_set() and self._thread is not None:
            self.shutdown(wait=True)

    def _teardown(self, kill: bool = False) -> None:
        """Stop the zygote and workers; remove the shared segments. Idempotent."""
        if self._gate is not None:
            self._gate.stop()  # gives back the leases still held
            self._gate = None
        if self._providers is not None:
            self._providers.close_store()  # writes the closures still posted
        if self.zygote is not None:
            self.zygote.exit(timeout=5 if not kill else 0.5)
            for pid in list(self._seat_of_pid):
                self.host.wait_gone(pid)
            self.zygote = None
        if self._spawner is not None:
            self._spawner.shutdown(wait=False)
            self._spawner = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if getattr(self, "quota_watcher", None) is not None:
            self.quota_watcher.close()  # its PSI trigger's file descriptor
            self.quota_watcher = None
        if self.table is not None:
            self.ledger.publish(self.table)
            self.table.unlink()
            self.table.close()
            self.table = None
        if self.data is not None:
            self.data.unlink()
            self.data.close()
            self.data = None
        if kill is False and self.ledger.tripped is None:
            self.ledger.close()

    # ================================================================== provider admission (operator)
    def admission_census(self) -> dict:
        """The provider admission's read model: bulkheads, lane x bulkhead rows, closures,
        starving, waiting units with their reason (fleet.runtime.provider_gate)."""
        return self._call(lambda: self._providers.census(), view=True)

    def admission_close(self, pool: str, until: float, message: str = "") -> dict:
        """Close a provider or key (``provider[/credential]``) until `until` (UTC epoch seconds)."""
        return self._call(self._admission_close, pool, until, message)

    def _admission_close(self, pool: str, until: float, message: str) -> dict:
        result = self._providers.close(pool, until, message)
        self._providers.publish(force=True)
        return result

    def admission_reopen(self, pool: str) -> dict:
        """Lift a provider's or key's closure; its waiting units start at the loop's next turn."""
        return self._call(self._admission_reopen, pool)

    def _admission_reopen(self, pool: str) -> dict:
        result = self._providers.reopen(pool)
        self._providers.publish(force=True)
        return result

    def admission_report_budget(self, provider: str, spent: float, limit: float | None) -> dict:
        """The provider's daily budget reading (fleet.runtime.provider_gate.ProviderGate.report_budget)."""
        return self._call(self._admission_budget, provider, spent, limit)

    def _admission_budget(self, provider: str, spent: float, limit: float | None) -> dict:
        result = self._providers.report_budget(provider, spent, limit)
        self._providers.publish(force=True)
        return result

    def admission_ask(self, question):
        """Answer a coordinator question (``question(gate)``: allowance, plan, starving) on
        the loop, as every other call on the provider gate; it reads the pool and seats nothing."""
        return self._call(question, self._providers, view=True)

    def admission_reload_refused(self, why: str) -> None:
        """A reload whose [admission] section did not load: the last good catalog stays; say why."""
        self._call(self._providers.refused_reload, why)

    # ================================================================== views
    def ledger_counts(self):
        """The ledger's counts, taken on the loop: every submit that returned before this
        call is counted."""
        return self._call(self.ledger.counts, view=True)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def pids(self) -> dict:
        """Worker pid per seat (a copy, taken on the loop)."""
        return self._call(lambda: dict(self._pids), view=True)

    def queued(self, role: str) -> int:
        """Units of `role` waiting for a slot (taken on the loop)."""
        code = self.roles.code(role)
        return self._call(lambda: self.dispatcher.queued(code), view=True)

    def find_unit(self, unit_id: int) -> tuple[bool, Future | None]:
        """(issued, future), read on the loop: whether this fleet ever handed out
        `unit_id`, and the future of that unit while it is queued or running (None once
        it ended). Every submit that returned before this call is seen."""
        def look():
            unit = self._units.get(unit_id)
            # A look at the counter spends an id: ids are unique, not dense.
            return 0 < unit_id < next(self._ids), None if unit is None else unit.future

        return self._call(look, view=True)

    def inspect(self, fn, timeout: float | None = None):
        """Run ``fn(supervisor)`` on the loop and return what it returns (tests and tools
        that look inside: nothing else may read the loop's state from another thread).
        Raises TimeoutError when the loop has not answered within `timeout` seconds."""
        return self._call(fn, self, timeout=timeout, view=True)


# ---------------------------------------------------------------------- helpers
def _check_unit(spec, key, lane, priority, timeout, request_id) -> None:
    """A submit's arguments, on their face (pure: the caller's thread)."""
    if spec.handler is None:
        raise BadUnit(f"role {spec.name!r} has no handler configured")
    if spec.kind == "pinned" and key is None:
        raise BadUnit(f"role {spec.name!r} is pinned by key: submit needs key=")
    if spec.kind != "pinned" and key is not None:
        raise BadUnit(f"role {spec.name!r} is {spec.kind}: it takes no key")
    if key is not None:
        try:
            hash(key)
        except TypeError:
            raise BadUnit(f"key must be hashable, got {type(key).__name__}") from None
    if lane is not None and not isinstance(lane, str):
        raise BadUnit(f"lane must be a name (str), got {type(lane).__name__}")
    if not ranges.PRIORITY.holds(priority):
        raise BadUnit(f"priority {ranges.PRIORITY.problem(priority)}")
    if timeout is not None and not ranges.UNIT_TIMEOUT_S.holds(timeout):
        raise BadUnit(f"timeout {ranges.UNIT_TIMEOUT_S.problem(timeout)}")
    if request_id is not None and not isinstance(request_id, str):
        raise BadUnit(f"request_id must be a str, got {type(request_id).__name__}")


def _arrival_log(config):
    """The arrival log of `[record]` (fleet.burst.record), or None when recording is off."""
    if not config.record.enabled:
        return None
    from fleet.burst.record import ArrivalLog

    return ArrivalLog.for_config(config)


def _ignore_refusal(_error: BaseException, *_args) -> None:
    """An operator op the loop never ran (it had stopped): the op was fire-and-forget."""


def _task_flags(chunk: bool, timeout) -> int:
    """A task's flags: a chunk of items, and a run time limit the loop must watch."""
    return (M.F_CHUNK if chunk else 0) | (M.F_TIMED if timeout is not None else 0)


def _fail_future(future: UnitFuture, error: BaseException) -> None:
    """Fail a future nobody resolved yet (a caller may have cancelled it meanwhile)."""
    if future.claim():
        future.settle(None, error, True)


def _version() -> str:
    from fleet import __version__

    return __version__


def _worker_setup(config: FleetConfig) -> WorkerSetup:
    """The config's worker setup; a handler named in ``__main__`` also brings the main
    module in (fleet.runtime.worker_setup), so a script's own function can be one."""
    setup = config.workers
    if setup.main is None and any((r.handler or "").startswith("__main__:") for r in config.roles):
        here = WorkerSetup.of_this_process()
        setup = dataclasses.replace(setup, main=here.main, authkey=setup.authkey or here.authkey)
    return setup


def _at_interpreter_exit(fn) -> None:
    """Call `fn` as the interpreter exits, before it joins its threads (where
    concurrent.futures hooks its own executors' exits): the loop and the zygote's
    spawner thread still run then, so the units still owed can finish. Inside an
    exit already under way, an `atexit` hook is the only one left."""
    try:
        threading._register_atexit(fn)
    except RuntimeError:  # "can't register atexit after shutdown"
        atexit.register(fn)


def _call_weak(ref) -> None:
    method = ref()
    if method is not None:
        method()
