"""The supervisor's loop: the one thread that owns a fleet's state, its turn, and the
components it composes.

One owner. The supervisor's state is held by a few components, each owning its data
and the operations on it; the loop composes them and is the only thread that calls them:

* the books (`fleet.runtime.books`): each unit's record from its accept to its
  outcome, the ledger's entries, the futures delivered at the end of a turn;
* the gates (`fleet.runtime.gates`): the admissions outside the CPU (the provider
  admission, the host-group lease), one protocol;
* the seats (`fleet.runtime.seats`): the rings to and from each worker, the tasks
  waiting to go out, the worker processes; their deaths (`fleet.runtime.seat_deaths`);
* the posture effects (`fleet.runtime.posture_effects`): the posture, the quota watch
  and what they do to the slots and the dispatcher;
* the dispatcher (`fleet.rules.dispatch`) and the table (`fleet.shm.table`), each one
  object already; results (`fleet.runtime.results`), deadlines
  (`fleet.runtime.deadlines`) and stops (`fleet.runtime.shutdown`) work on the
  components they are handed, never on the supervisor.

Other threads touch only the door (`fleet.runtime.intake.Door`): `submit` validates
and pickles on the caller's thread, takes room in the role's queue and posts the unit
to the loop (`fleet.runtime.submit`), which accepts it (`fleet.runtime.accept`);
operator ops and stops post commands the same way and wait for their reply; the lease
gate's threads leave their news in the gate and ring the bell. Boot
(`fleet.runtime.boot`) builds the rig on the caller's thread and the supervisor
composes its components from it before the loop starts.

The turn: every posted command (one wake-up carries a batch of submits), then the
results, the zygote's news, the gates' ticks, deadlines and a stop's grace; a sample
of the posture every `SAMPLE_EVERY_S`; then the outcomes decided during the turn are
delivered (futures resolved), from the loop thread. It sleeps on the data plane's bell
(a futex) when there is nothing to do, so an idle fleet costs ~nothing. Here too: the
dispatch of what can be granted (`dispatch`), which every component that frees a
slot or lets a unit through asks for.

Clock and OS. Every clock read and OS call a rule depends on goes through
`fleet.host.system.Host` (injected): tests drive restart intensity, deadlines and stop
grace with a fake clock while the workers stay real processes.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from concurrent.futures import Future

from fleet.host import priority as priority_mod
from fleet.host.proctitle import name_thread
from fleet.host.system import Host
from fleet.rules import fsm, titles
from fleet.rules.dispatch import RIDE
from fleet.rules import seats as seats_mod
from fleet.rules.contention import CONTENTION_WIDEN, LookBeforeSleep
from fleet.rules.ledger import Ledger, abort_process
from fleet.rules.outcomes import FAILED
from fleet.rules.unit import FleetClosed, Outcome
from fleet.rules.vocab import Reason
from fleet.rules.when import utc
from fleet.runtime import boot, collector, spans
from fleet.runtime.accept import Acceptor
from fleet.runtime.books import Books
from fleet.runtime.config import FleetConfig
from fleet.runtime.contention import ContentionWatch
from fleet.runtime.deadlines import Deadlines
from fleet.runtime.future import HANDOVER
from fleet.runtime.gates import Gates
from fleet.runtime.inside import Inside
from fleet.runtime.intake import Door, TurnedAway
from fleet.runtime.posture_effects import SAMPLE_EVERY_S, PostureEffects
from fleet.runtime.results import Results
from fleet.runtime.saturation import SaturationWatch
from fleet.runtime.seat_deaths import RoleStops, SeatDeaths
from fleet.runtime.reseat import SeatFollow
from fleet.runtime.seats import Seats
from fleet.runtime.shutdown import Stops, close_at_exit
from fleet.runtime.submit import Submitter
from fleet.shm import messages as M
from fleet.shm.table import layout as L

log = logging.getLogger(__name__)

#: Longest the loop sleeps with nothing to do (timers are checked at least this often).
IDLE_WAIT_S = 0.1
#: With units out, or right after a turn that delivered results, the loop looks at its
#: bell up to this long before it sleeps (yielding the CPU between looks): their results,
#: and a caller's next submit, come within a wake-up's time (~20-50 us on a busy VM), so
#: catching them awake saves that wake-up on each. With units out, shorter, down to
#: none, while their results come slower than that (`fleet.rules.contention.LookBeforeSleep`:
#: a look is a core's time the workers need); after a turn that delivered the last
#: results, always this long (the gaps between a caller's round trips say nothing of
#: how soon a result comes).
IN_FLIGHT_SPIN_S = 150e-6
#: The shortest look worth making: below it, the loop sleeps at once (`LookBeforeSleep`).
LEAST_SPIN_S = 20e-6
#: Commands a turn runs before it dispatches what they brought (a fast poster does not
#: keep the loop draining while no unit starts).
INTAKE_BATCH = 64

__all__ = ["Supervisor", "SAMPLE_EVERY_S", "running_here"]

#: The fleets this process started (held weakly): `fleet.runtime_status()` reads them.
_STARTED: weakref.WeakSet = weakref.WeakSet()


def running_here() -> list:
    """The supervisors this process started whose loop still runs, oldest first."""
    live = [sup for sup in list(_STARTED) if sup.door.started and not sup.door.stopped.is_set()]
    return sorted(live, key=lambda sup: sup.started_ns)


class Supervisor:
    """One fleet: its table, data plane, zygote, workers, dispatcher and ledger."""

    def __init__(self, config: FleetConfig, *, mode: str = "embedded", on_fuse=abort_process, cpus=None,
                 socket_path: str | None = None, readers_group: int | str | None = None, admission_clock=None,
                 admission_rng=None, closure_file=None, host: Host | None = None, exporter=None, launched=None):
        """`launched`: the fleet's zygote, launched by the face before it imported the
        runtime (`fleet.runtime.zygote_launch.launch`); None: boot launches it."""
        self.config = config
        self.host = host if host is not None else Host()
        self.name = config.name
        self.roles = config.roles
        self.mode = mode
        self.started_ns = time.time_ns()
        self.ledger = Ledger(on_fuse=on_fuse, name=config.name)  # thread-safe itself: any thread may read its counts
        self.recorder = _arrival_log(config)  # None unless [record] enabled
        self.role_stops = RoleStops(config.restart)  # its `view` and reasons are read by callers
        self.door = Door(self.name, [r.queue_bound for r in self.roles], self.role_stops, self._ring)
        self._submitter = Submitter(self.door, self.roles, self.ledger, config.limits, self.recorder,
                                    handoff=self.mode == "service")
        # The caller's half of a submit (fleet.runtime.submit), bound here: no call between.
        self.submit, self.submit_plain, self.submit_call, self.submit_many, self.submit_pickled = (
            self._submitter.submit, self._submitter.submit_plain, self._submitter.submit_call,
            self._submitter.submit_many, self._submitter.submit_pickled)
        self._cpus = cpus  # the quota to plan with, when given (fleet.Fleet's cpus=)
        self._boot_args = {"cpus": cpus, "socket_path": socket_path, "readers_group": readers_group,
                           "launched": launched,
                           "admission_args": {"clock": admission_clock, "rng": admission_rng,
                                              "closure_file": config.admission.closure_file or closure_file}}
        # ``exporter(host=, port=, provider=)``: the Prometheus exporter [metrics] starts,
        # given by the face that runs the fleet (it lives with the service, above this room)
        self._exporter = exporter
        self._rig: boot.Rig | None = None
        # The components, composed at `start` (before the loop thread starts).
        self.dispatcher = self.gates = self.books = self.seats = self.posture = self.providers = self.follow = None
        self.publisher = self.saturation = self.inside = self.contention = None
        self._accept = self._results = self._deadlines = self._deaths = self._stops = None
        self._froze = False  # whether its boot froze the collector's old objects (boot.settle)
        #: What the loop takes from outside its own inputs at every turn, before its intake
        #: (`add_feed`): fleetd's inlets (fleet.service.inlets). Replaced whole, never changed
        #: in place: the loop reads it from its own thread while another adds.
        self._feeds: tuple = ()

    # ================================================================== start: boot and compose
    def start(self) -> "Supervisor":
        """Boot on the caller's thread; from the loop's start on, the loop owns the state."""
        rig = boot.plan(self.config, self.host, name=self.name, mode=self.mode, roles=self.roles, ledger=self.ledger,
                        started_ns=self.started_ns, **self._boot_args)
        self._rig = rig
        try:
            self._compose(rig)
            boot.await_forks(rig, self._deaths.seat_died)
            exporting = boot.start_exporter(rig, self.config, self._exporter) is not None
            if exporting:
                # Held until the publisher hands them over with the ledger's counters.
                self._results.observe_runs(rig.publisher.run_ended)
            self.books.watch = spans.watch_for(self.config, rig, self.seats, exporting)
        except BaseException:
            rig.teardown(self.gates, self.ledger, kill=True)
            self._submitter.warm.close()
            raise
        self.gates.install(boot.gates(rig, self.config, self.roles, self._ring))
        self._froze = boot.settle(self.config)
        thread = threading.Thread(target=self._loop, name=f"fleet-{self.name}", daemon=True)
        self.door.open(thread)
        thread.start()
        close_at_exit(self)
        _STARTED.add(self)
        return self

    def _compose(self, rig: boot.Rig) -> None:
        """The components, each handed the others it works with (never the supervisor)."""
        name, roles, host, dispatch = self.name, self.roles, self.host, self.dispatch
        self.dispatcher, self.publisher, self.providers = rig.dispatcher, rig.publisher, rig.providers
        self.gates = Gates(rig.dispatcher, len(roles))
        self.books = Books(name, roles, self.ledger, self.door.room, self.gates)
        self.seats = Seats(rig.data, rig.workers, rig.layout)
        self.follow = SeatFollow(name, rig.layout, rig.projection.live_placement, rig.cpus, roles, rig.dispatcher,
                                 self.seats, rig.table, pin_loop=host.pin_this_thread)
        self.posture = PostureEffects(rig.posture, rig.sampler, rig.quota_watcher, name=name, config=self.config,
                                      plan=rig.plan, roles=roles, layout=rig.layout, table=rig.table,
                                      dispatcher=rig.dispatcher, publisher=rig.publisher, providers=rig.providers,
                                      host=host, dispatch=dispatch, follow=self.follow)
        self.saturation = SaturationWatch(name, roles, self.config.saturation, rig.table, rig.plan,
                                          rig.projection.live_placement.running(rig.layout))
        self.contention = ContentionWatch(name, rig.layout, self.follow, rig.workers, rig.table,
                                          rig.dispatcher.slots_of_seat, host, self.seats.looked,
                                          widen=self.config.contention == CONTENTION_WIDEN)
        self._deadlines = Deadlines(name, self.books, rig.dispatcher, self.seats)
        self._results = Results(self.seats, self.books, rig.dispatcher, self._deadlines, rig.table, roles, host,
                                rig.publisher, dispatch, relay=self.mode == "service", recorder=self.recorder,
                                paced=self.config.paced)
        self._deaths = SeatDeaths(name=name, roles=roles, layout=rig.layout, restart=self.config.restart,
                                  seats=self.seats, results=self._results, books=self.books,
                                  dispatcher=rig.dispatcher, table=rig.table, deadlines=self._deadlines,
                                  role_stops=self.role_stops, posture=self.posture, publisher=rig.publisher, host=host,
                                  dispatch=dispatch, closing=lambda: self.door.closing, oom=rig.oom)
        self._stops = Stops(door=self.door, books=self.books, gates=self.gates, dispatcher=rig.dispatcher,
                            seats=self.seats, results=self._results, posture=self.posture, roles=roles,
                            table=rig.table, host=host, dispatch=dispatch, recorder=self.recorder)
        self._accept = Acceptor(self.door, self.books, self.gates, rig.dispatcher, roles, self.recorder)
        accept = self._accept.accept  # one bound method: the intake knows a run of its posts by it
        self._submitter.connect(accept, self._accept.accept_many, rig.providers)
        self.door.intake.take_runs(accept, self._accept.accept_run)
        self.inside = Inside(name, roles, self._submitter, self.books, rig.dispatcher, self.seats, self._results.sent_to)
        self._results.inside = self._deaths.inside = self.inside
        self.books.on_end, self.books.on_solved = self.inside.ended, self.inside.solved
        self.inside.publisher = rig.publisher

    # ================================================================== what boot planned
    @property
    def plan(self):
        return self._rig.plan

    @property
    def layout(self):
        return self._rig.layout

    @property
    def table(self):
        """The shared table (None once the fleet is torn down)."""
        return self._rig.table if self._rig is not None else None

    def project(self, config):
        """What this host would plan for `config` now (`fleet.rules.quota.project`): raises
        the typed boot refusal of a config that could not boot here."""
        from fleet.rules import quota as quota_mod

        return quota_mod.project(config, self.host.effective_cpus(), self._cpus or self.host.affinity())

    @property
    def loop_cpus(self) -> tuple[int, ...] | None:
        """The CPUs the loop runs on when pinned: the reserve the budget sets aside for it,
        off the workers' seats (None: not pinned; the scheduler places it). Moved by an
        epoch (`fleet.runtime.reseat`); any thread may read it."""
        return self.follow.loop_cpus if self.follow is not None else None

    @property
    def draining(self) -> bool:
        """Whether a drain refuses new units (fleetd's STATUS= line reads it): the door's
        flag, the fleet's one copy of it."""
        return self.door.draining_since is not None

    def add_feed(self, feed) -> None:
        """From the next turn on, the loop calls ``feed()`` at every turn, on its thread,
        before it drains its intake (what `feed` submits is taken in the same turn). A feed
        must not block; what brings it input rings the bell (`seats.bell`)."""
        self._feeds = (*self._feeds, feed)

    # ================================================================== posting to the loop
    def _ring(self) -> None:
        rig = self._rig
        if rig is not None and rig.data is not None:
            rig.data.bell.ring()

    def call(self, fn, *args, timeout: float | None = None, view: bool = False):
        """Run ``fn(*args)`` on the loop thread and return its result. On the loop thread
        itself (a future's callback), or before the loop started, it runs here. Once the
        loop has stopped nothing else runs on the state: a `view` reads what it left; a
        change raises FleetClosed."""
        door = self.door
        if door.on_loop() or not door.started:
            return fn(*args)
        if not door.stopped.is_set():
            try:
                return door.intake.call(self._op, fn, *args, timeout=timeout)
            except TurnedAway:
                door.stopped.wait()  # the loop was stopping as we asked
        if not view:
            raise FleetClosed(f"fleet {self.name!r} has stopped")
        return fn(*args)

    def _op(self, fn, *args):
        """An operator call or a stop, on the loop: the submits posted before it are
        dispatched first, so it sees them as it would have after each submit's return
        (shutdown(cancel_futures) cancels only what could not start)."""
        if self._accept.take_news():
            self.dispatch()
        return fn(*args)

    # ================================================================== stopping (the caller's half)
    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Take no more units; with `cancel_futures`, queued units are cancelled. Returns once
        every unit owed has its outcome and the fleet is torn down (unless `wait` is False)."""
        door = self.door
        if wait or door.on_loop():
            self._stop_with("shutdown", cancel_futures, wait=wait)
        elif door.started and not door.stopped.is_set():
            # Executor semantics: once shutdown returns, submit refuses (and the table says
            # closing), so wait for the loop to apply it, not for the units to end.
            try:
                self.call(self._stops.shutdown, cancel_futures)
            except FleetClosed:
                pass  # it stopped meanwhile: nothing left to shut

    def stop(self, grace_s: float = 0.0, wait: bool = True) -> None:
        """Stop soon: queued units fail with Shutdown once nothing runs or `grace_s` has
        passed, whichever is first; in-flight ones finish."""
        self._stop_with("stop", grace_s, wait=wait)

    def kill(self, wait: bool = True) -> None:
        """Stop now: workers are killed; every unit still owed fails with Shutdown."""
        self._stop_with("kill", wait=wait)

    def _stop_with(self, how: str, *args, wait: bool) -> None:
        """Post a stop to the loop (a fleet that has stopped already stays stopped)."""
        door = self.door
        if not door.started or door.stopped.is_set():
            return
        fn = getattr(self._stops, how)
        if door.on_loop():
            fn(*args)  # from a future's callback: the loop finishes the stop after this turn
            return
        door.intake.post(self._op, fn, *args, refused=_ignore_refusal)
        if not wait:
            return
        try:
            door.stopped.wait()
        except KeyboardInterrupt:
            # Ctrl-C while a stop waits for the units it lets finish (the first Ctrl-C's
            # `with` exit, or the interpreter's): stop at once. The workers are killed,
            # every unit still owed fails Shutdown and the rig is torn down (no segment
            # stays) before the interrupt goes on.
            if how != "kill":
                door.intake.post(self._op, self._stops.kill, refused=_ignore_refusal)
                door.stopped.wait()
            raise

    def close_at_exit(self) -> None:
        """The interpreter exits: a fleet nobody shut down shuts down now and waits for
        every unit owed, as ProcessPoolExecutor does (fleet.runtime.shutdown.close_at_exit)."""
        if self.door.started and not self.door.stopped.is_set():
            self.shutdown(wait=True)

    # ================================================================== dispatch
    def dispatch(self) -> None:
        """Grant what can be granted and send it to the seats (on the loop: the components
        that free a slot or let a unit through call it, as do the operator's ops)."""
        if self.door.closing:
            self._stops.shed_deferred_at_close()
            self._stops.fail_unpinnable()
        dispatcher, books, table = self.dispatcher, self.books, self._rig.table
        dispatcher.skip = books.skip_at_grant
        grants = dispatcher.grant()
        for unit_id in dispatcher.take_skipped():
            books.skipped(unit_id)  # a gate stopped it, or its caller cancelled it
        if grants and books.watch is not None:
            books.watch.granted(grants)  # their grant times (makespans and spans, when on)
        ops: list = []  # every grant's slot events, applied in one kernel call
        for g in grants:
            if g.ops:
                ops += g.ops
        reasons = None  # read only when the table refused some event (rare: a broken FSM rule)
        if ops:
            rows = len(ops) // L.OP_FIELDS
            if table.apply_ops(ops) < rows:
                reasons = iter(table.reasons(rows))
        sends: dict[int, list] = {}  # seat -> its tasks of this pass, pushed in one call each
        freed: dict[int, int] = {}  # role -> units granted, whose queue room goes back at once below
        started = self.gates.started
        now = time.time() if grants else 0.0  # one clock read per pass: when its units run since
        for g in grants:
            if g.start_event == RIDE:
                table.count_ride(g.slot)  # the census shows it (status "rides")
            unit = g.item  # what was queued: the unit's record on the books
            unit.queued = False
            unit.since = now
            freed[unit.role] = freed.get(unit.role, 0) + 1
            if reasons is not None and g.ops:
                why = self._grant_refused(g, [next(reasons) for _ in range(len(g.ops) // L.OP_FIELDS)])
                if why is not None:
                    # A broken FSM rule, not a dead worker: its own reason, and counted (status shows it).
                    books.fsm_refused(why)
                    dispatcher.complete(g.unit_id, table.state(g.slot)[0])
                    books.close(g.unit_id, Outcome(FAILED, Reason.FSM_REFUSED, why))
                    continue
            if not unit.plain:
                started(unit)  # it runs from here (on its provider too); no gate ever saw a plain one
            if unit.handed is not None:
                self.seats.hand(g.seat, unit.handed)  # before its task: the worker finds it as it reads the task
            # (head, body): the ring joins them as it copies (a body up to a ring message's
            # bound is not copied once more here, beside the one the unit keeps)
            task = (M.TASK_HEAD.pack(g.unit_id, g.slot, g.key_id, g.role, g.start_event, unit.flags), unit.body)
            batch = sends.get(g.seat)
            if batch is None:
                sends[g.seat] = [task]
            else:
                batch.append(task)
        room, granted = self.door.room, self.saturation.granted
        for code, n in freed.items():
            room.give(code, n)
            granted[code] += n  # the saturation watch's service count
        send = self.seats.send
        for seat, batch in sends.items():
            send(seat, batch)

    @staticmethod
    def _grant_refused(g, reasons: list) -> str | None:
        """Why the table refused grant `g` (its events' `reasons`, in order), or None."""
        for (event, _role, _key), reason in zip(g.transitions, reasons):
            if reason != fsm.OK:
                return f"slot {g.slot} refused the grant's {fsm.EVENT_NAMES[event]}: {fsm.REASON_NAMES[reason]}"
        return None

    def set_draining(self, draining: bool) -> dict:
        """Drain: refuse new submits with Draining while queued and in-flight units run to
        their outcomes; or take new units again. On the loop (the door's flag is written
        here only); the table carries it for `fleetctl status` and `top`. Draining again
        keeps the first drain's start. Returns `drain_state`."""
        door = self.door
        if draining and door.draining_since is None:
            door.draining_since = time.time()
            log.info("fleet %s: draining: new submits are refused; %d unit(s) queued or in flight finish",
                     self.name, len(self.books))
        elif not draining and door.draining_since is not None:
            log.info("fleet %s: resumed after draining since %s: taking new units", self.name,
                     utc(door.draining_since))
            door.draining_since = None
        if self._rig is not None and self._rig.table is not None:
            self._rig.table.set_draining_since(door.draining_since)
        return self.drain_state()

    def drain_state(self) -> dict:
        """``draining``, ``since`` (epoch seconds or None), ``since_utc`` and ``owed``:
        units queued or in flight (the ledger's count, which any thread may read)."""
        since = self.door.draining_since
        return {"draining": since is not None, "since": since, "since_utc": utc(since) if since else None,
                "owed": self.ledger.counts().inflight}

    # ================================================================== the loop
    def _loop(self) -> None:
        self.door.joined()
        name_thread(titles.LOOP_THREAD)  # top -H; the program that embeds the fleet keeps its own name
        bell = self.seats.bell
        rung = bell.count  # the bell's count, read with no Python frame (twice a turn)
        next_sample = 0.0
        self._raise_loop_thread()
        deaths, books = self._deaths, self.books
        owed = books.count
        look = LookBeforeSleep(IN_FLIGHT_SPIN_S, LEAST_SPIN_S)
        try:
            while True:
                seen = rung()
                left = self._turn()
                now = self.host.monotonic()
                if now >= next_sample:
                    deaths.hear()  # a zygote that died said nothing: its socket tells
                    deaths.read_oom()  # kills of the group's OOM killer, claimed by the deaths that follow
                    self.posture.sample()
                    self.saturation.sample(now, self.dispatcher.queued)
                    self.contention.sample(now)
                    next_sample = now + SAMPLE_EVERY_S
                delivered = books.deliver()
                if self.door.closing and not owed():
                    break
                # Turn again at once only for input the turn left behind or that rang
                # since it began: everything else that comes in rings the bell. (Turning
                # again on every busy turn cost the round trip: a caller woken by this
                # turn's deliveries and the loop reading every ring handed the GIL back
                # and forth; the wait lets go of it and catches what comes next awake.)
                quiet = not left and rung() == seen
                if quiet:
                    # Keep looking a while with units out, or just after results went
                    # out: a caller's next submit tends to follow its result at once.
                    if owed():  # units out: how soon their results come tells the next look
                        t0 = time.perf_counter()  # (real time: it is about wake-ups)
                        came = bell.wait(seen, self._sleep_for(now), look.look_s, HANDOVER)
                        look.waited(time.perf_counter() - t0, came)
                    else:  # none out: a caller's next submit follows its result at once, or not soon
                        spin = IN_FLIGHT_SPIN_S if delivered else 0.0
                        came = bell.wait(seen, self._sleep_for(now), spin, HANDOVER)
                    if not came:
                        deaths.hear()  # a quiet spell: a zygote that died said nothing
        except BaseException:  # noqa: BLE001 - the loop must never die silently
            log.exception("fleet %s: supervisor loop crashed", self.name)
            self._stops.close_intake()  # nothing would ever run a unit submitted from here on
            self._stops.fail_everything(Reason.LANE_DEATH, "the supervisor loop crashed")
        finally:
            self._rig.teardown(self.gates, self.ledger)
            self._submitter.warm.close()  # its units are over: the warm parcels' pages go
            self.door.shut(f"fleet {self.name!r} has stopped")
            if self._froze:
                collector.thaw_after_fleet()  # a stopped fleet's objects may be collected again

    def _raise_loop_thread(self) -> None:
        """This thread only: the loop runs on the reserve cores the budget set aside for
        it, off the worker seats, and above the workers by `dispatch_priority`."""
        projection, priority = self._rig.projection, self._rig.priority
        cpus = seats_mod.loop_cpus(projection.seated or projection.layout)  # the quota's own seats
        if cpus is not None:
            try:
                self.host.pin_this_thread(cpus)
            except OSError as exc:
                log.warning("cannot pin the supervisor loop to %s: %s", list(cpus), exc)
        self.follow.loop_cpus = cpus  # an epoch moves it (fleet.runtime.reseat)
        if priority.raises_loop:
            try:
                priority_mod.set_this_thread(priority.loop_nice)
            except OSError as exc:  # allowed by the capability check, refused by the kernel (an LSM)
                log.warning("fleet %s: cannot raise the supervisor loop to nice %d: %s", self.name,
                            priority.loop_nice, exc)

    def _turn(self) -> bool:
        """One pass over every input; True if it left some behind (commands past its
        intake batch): look again at once."""
        for feed in self._feeds:
            feed()
        intake = self.door.intake
        ran = intake.drain(INTAKE_BATCH) if intake.pending() else 0
        if self._accept.take_news():
            self.dispatch()
        seats = self.seats
        if seats.workers.has_news(seats.zygote_news_count()):
            self._deaths.hear()  # it sent an event (and rang)
        self._results.collect()
        for i, moved in self.gates.tick():
            self._moved(i, moved)
        now = self.host.monotonic()
        if self._deadlines.armed():
            self._deadlines.check(now)
        if self._stops.stop_at is not None:  # a stop's grace runs
            self._stops.due(now)
        return ran >= INTAKE_BATCH

    def _sleep_for(self, now: float) -> float:
        wait = self.gates.wake_in(IDLE_WAIT_S)
        return wait if self._stops.stop_at is None else self._stops.wake_in(now, wait)

    def _moved(self, i: int, moved) -> None:
        """What gate `i`'s tick reports: cancelled units forgotten, ended ones closed,
        stopped ones stopped, and the ones it let go on through the gates after it."""
        books = self.books
        for unit_id in moved.forget:
            books.forget(unit_id)
        for unit_id, outcome, original in moved.end:
            books.close(unit_id, outcome, original=original)
        for unit_id, reason, detail in moved.stop:
            self._stop_unit(unit_id, reason, detail)
        if moved.go:
            self.gates.go_on(moved.go, i)
            self.dispatch()

    def _stop_unit(self, unit_id: int, reason: str, detail: str) -> None:
        """A gate says `unit_id` may not run any more (LeaseDenied, LeasePreempted,
        LeaseExpired): queued, it fails at its grant; running, its worker is killed."""
        if not self.books.stop(unit_id, reason, detail):
            return
        slot = self.dispatcher.slot_of(unit_id)
        pid = None if slot is None else self.seats.pid_of_slot(slot)
        if pid is not None:
            log.warning("fleet %s: unit %d lost its lease (%s); killing worker pid %d", self.name, unit_id, detail, pid)
            self.seats.kill(pid)  # our own kill: not a lane death

    # ================================================================== views
    def ledger_counts(self):
        """The ledger's counts, taken on the loop: every submit that returned before this
        call is counted."""
        return self.call(self.ledger.counts, view=True)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self.door.stopped.wait(timeout)

    def pids(self) -> dict:
        """Worker pid per seat (a copy, taken on the loop)."""
        return self.call(lambda: dict(self.seats.workers.pids), view=True)

    def recycles(self) -> dict:
        """Workers recycled per role name after passing its `max_rss_mib` (a copy, taken on the loop)."""
        return self.call(lambda: dict(self._deaths.recycles), view=True)

    def queued(self, role: str) -> int:
        """Units of `role` waiting for a slot (taken on the loop)."""
        code = self.roles.code(role)
        return self.call(lambda: self.dispatcher.queued(code), view=True)

    def find_unit(self, unit_id: int) -> tuple[bool, Future | None]:
        """(issued, future), read on the loop: whether this fleet ever handed out
        `unit_id`, and the future of that unit while it is queued or running (None once
        it ended). Every submit that returned before this call is seen."""
        def look():
            unit = self.books.get(unit_id)
            return self.door.issued(unit_id), None if unit is None else unit.future

        return self.call(look, view=True)

    def cancel_children(self, unit_id: int) -> int:
        """Cancel the children of running unit `unit_id` that have not started (on the
        loop, `fleet.runtime.inside`): how many were cancelled."""
        return self.call(self.inside.cancel_children, unit_id)

    def inspect(self, fn, timeout: float | None = None):
        """Run ``fn(supervisor)`` on the loop and return what it returns (tests and tools
        that look inside: nothing else may read the loop's state from another thread).
        Raises TimeoutError when the loop has not answered within `timeout` seconds."""
        return self.call(fn, self, timeout=timeout, view=True)


def _ignore_refusal(_error: BaseException, *_args) -> None:
    """A stop the loop never ran (it had stopped): the stop was fire-and-forget."""


def _arrival_log(config):
    """The arrival log of `[record]` (fleet.runtime.arrivals), or None when recording is off."""
    if not config.record.enabled:
        return None
    from fleet.runtime.arrivals import ArrivalLog

    return ArrivalLog.for_config(config)
