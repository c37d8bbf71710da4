"""The seats' worker processes: the zygote that forks them, and which pid runs which seat.

One owner: boot's thread builds it, then the loop thread alone uses it. The zygote
(`fleet.runtime.zygote_link`) forks one worker per seat; `read` applies what it said
about forks here (the pid books, the slots' pid in the table, a pidfd of the worker)
and hands each exit to the loop's deaths shell (`fleet.runtime.seat_deaths`), which
decides what it means. The supervisor learns of each death itself, from the worker's
pidfd (`fleet.runtime.deathwatch`), whatever the zygote does (a stopped zygote
reports nothing); the zygote's own report of an exit only comes sooner, or brings the
status of a worker it reaped before the pidfd was read. A worker the supervisor kills
itself (a unit's timeout, a lost lease, a stop, a worker stopped at shutdown) is
marked `killed`, so its death is not taken for a lane death.

A zygote that leaves a fork unanswered for `fork_server_timeout_s` (`[restart]`) has
stopped answering (stopped, wedged): `stalled` says so and the deaths shell replaces it.
"""
from __future__ import annotations

from admission.records import replace
import logging
import signal
import time

from fleet.host import affinity
from fleet.runtime.deathwatch import DeathWatch, stopped, zombie_status
from fleet.shm import handoff
from fleet.worker.prepare import WorkerSetup
from fleet.runtime.zygote_launch import Launched, spawner_for
from fleet.runtime.zygote_link import Exited, Forked, WorkerStartError, ZygoteLink

log = logging.getLogger(__name__)

#: How long teardown waits for the workers it SIGKILLed to be gone (the kernel's
#: time to tear a process down: a bound for a wedged host, never reached otherwise).
KILL_WAIT_S = 5.0


class Workers:
    """The zygote link and the pid of each seat's worker."""

    def __init__(self, name: str, config, roles, layout, priority, host, table, slots_of_seat, ring, place=None,
                 relay: bool = False):
        self.name, self.config, self.roles, self.layout = name, config, roles, layout
        self.relay = relay  # service mode: fleetd relays each result's parcel (`WorkerSetup.lend`)
        self.place = place  # puts a new zygote in the workers' cgroup leaf (None: where it starts)
        self.priority, self.host, self.table, self._slots_of_seat = priority, host, table, slots_of_seat
        self.zygote: ZygoteLink | None = None
        self._spawner = None
        self.answer_s = config.restart.fork_server_timeout_s  # the zygote's bound to answer
        self.watch = DeathWatch(name, ring)  # a pidfd per worker: rings `ring` at each death
        self._watch_seen = 0  # the watch's news count when it was last read
        self.pids: dict[int, int] = {}  # seat -> pid (read by the loop's views; written here only)
        #: seat -> the supervisor's end of its descriptor channel (service mode: fleet.shm.handoff),
        #: one per worker: closed as a worker is gone, and made for the next one when its fork is
        #: asked or something is sent to the seat first (`channel`: what is sent meanwhile is
        #: for that successor, as the tasks pushed meanwhile are)
        self.channels: dict[int, object] = {}
        #: seat -> the worker's end of its channel, kept until that worker is forked (a fork
        #: asked again, of a new zygote, passes the same end)
        self._unforked: dict[int, object] = {}
        self._seat_of_pid: dict[int, int] = {}
        self._pending_forks: dict[int, float] = {}  # seat -> when its fork was asked (time.monotonic)
        #: seat -> the CPUs it runs on in this epoch, where they are not the layout's (`set_cpus`)
        self._cpus: dict[int, tuple[int, ...]] = {}
        self._asked: dict[int, tuple[int, ...]] = {}  # seat -> the CPUs its pending fork was asked with
        self._awaiting: dict[int, float] = {}  # pid -> until when: exited and reaped, status not yet told
        self._stopped_since: dict[int, float] = {}  # pid -> when it was first seen stopped (closing only)
        self._killed: set[int] = set()  # worker pids the supervisor killed itself (not lane deaths)
        self._news_seen = 0  # the zygote's news count when its socket was last read
        self._zygote_gone = False  # its death has been handled (no new one yet)
        self._launched: ZygoteLink | None = None  # a zygote launched by boot, not yet booted

    def adopt(self, launched: Launched) -> None:
        """Boot's zygote, launched before this object existed (`fleet.runtime.zygote_launch.launch`):
        `start_zygote` boots it."""
        self._spawner, self._launched = launched.spawner, ZygoteLink.adopt(launched)

    def start_zygote(self, meanwhile=None) -> None:
        """Boot the zygote boot launched (`adopt`), or start a new one. `meanwhile()`: work
        of this process's to do while the launched one boots (`ZygoteLink.boot`)."""
        if self._spawner is None:
            self._spawner = spawner_for(self.name)
        launched, self._launched = self._launched, None
        if launched is not None:
            launched.answer_s = self.answer_s
            launched.boot(self.name, self.roles, worker_nice=self.priority.worker_nice, workers=worker_setup(self.config, self.relay),
                          meanwhile=meanwhile)
            self.zygote = launched
            return
        self.zygote = ZygoteLink.start(self.name, self.roles, self._spawner, worker_nice=self.priority.worker_nice,
                                       workers=worker_setup(self.config, self.relay), answer_s=self.answer_s,
                                       place=self.place)
        if meanwhile is not None:  # none launched ahead: it runs once this one has booted
            meanwhile()

    def restart_zygote(self, attempts: int = 3) -> None:
        """Start a new fork server. A start can fail when the new zygote is itself killed
        while it boots: try again a few times before giving up (the loop then fails every
        unit owed and closes intake)."""
        for attempt in range(1, attempts + 1):
            try:
                self.start_zygote()
                return
            except WorkerStartError as exc:
                log.error("fleet %s: worker fork server restart %d/%d failed: %s", self.name, attempt, attempts, exc)
                if attempt == attempts:
                    raise
                # (ZygoteLink.start has reaped the zygote that failed.)

    def cpus_of(self, seat: int) -> tuple[int, ...]:
        """The CPUs `seat`'s worker runs on in this epoch."""
        return self._cpus.get(seat, self.layout.seats[seat].cpus)

    def set_cpus(self, seat: int, cpus) -> None:
        """`seat` runs on `cpus` from now on: its next fork is pinned there (`repin` moves a running worker)."""
        self._cpus[seat] = tuple(cpus)

    def fork(self, seat: int) -> None:
        self.fork_many((seat,))

    def fork_many(self, seats) -> None:
        """Ask for a worker for each of `seats`, in one message to the zygote (a batch it
        forks before it reports: `ZygoteLink.fork_many`)."""
        forks, theirs = [], []
        for seat in seats:
            self._pending_forks.setdefault(seat, time.monotonic())
            self._asked[seat] = cpus = self.cpus_of(seat)
            forks.append((seat, cpus))
            if self.relay:
                if seat not in self._unforked:
                    self._new_channel(seat)  # a first fork, or a worker that ran: a channel of its own
                theirs.append(self._unforked[seat])
        if forks:
            self.zygote.fork_many(forks, channels=theirs if self.relay else None)

    def channel(self, seat: int):
        """The supervisor's end of the descriptor channel of `seat`'s current or next worker
        (made now when its last worker is gone and no fork has been asked since: what is
        sent on it waits there for that fork); None outside service mode."""
        if not self.relay:
            return None
        if seat not in self.channels:
            self._new_channel(seat)
        return self.channels[seat]

    def _new_channel(self, seat: int) -> None:
        """A new descriptor channel for the seat's next worker: what the last one's end was
        sent and never took dies with it."""
        self._close_channel(seat)
        self.channels[seat], self._unforked[seat] = handoff.channel()

    def _close_channel(self, seat: int) -> None:
        for ends in (self.channels, self._unforked):
            end = ends.pop(seat, None)
            if end is not None:
                end.close()

    def close_channels(self) -> None:
        """Close every seat's descriptor channel (the fleet is down)."""
        for seat in set(self.channels) | set(self._unforked):
            self._close_channel(seat)

    def fork_pending(self, seat: int) -> bool:
        """A fork was asked for `seat` and not yet reported."""
        return seat in self._pending_forks

    def repin(self, seat: int) -> None:
        """Move `seat`'s running worker to its CPUs (`cpus_of`): every thread of it, since
        affinity is a thread's. A worker that is gone, or a thread that ended, is left be
        (its death is handled apart); a CPU refused (outside a cpuset) is logged."""
        pid = self.pids.get(seat)
        if pid is not None:
            _set_affinity(pid, self.cpus_of(seat), self.name)

    @property
    def forking(self) -> bool:
        """Forks asked for and not yet reported."""
        return bool(self._pending_forks)

    def stalled(self) -> bool:
        """Whether the zygote left a fork unanswered for `answer_s`: it has stopped
        answering (stopped, wedged), and must be replaced."""
        oldest = min(self._pending_forks.values(), default=None)
        return oldest is not None and time.monotonic() - oldest >= self.answer_s

    def has_news(self, news: int) -> bool:
        """Whether the zygote's news count moved since its socket was last read, or a
        worker's pidfd fired since the watch was last read."""
        return news != self._news_seen or self.watch.news != self._watch_seen

    def hear(self, news: int, on_exit) -> bool:
        """Read what the zygote said and which workers died (`read`), the news counts
        taken first: news after this read is read next time. False when the zygote is gone."""
        self._news_seen, self._watch_seen = news, self.watch.news
        return self.read(on_exit)

    def read(self, on_exit, block_until: float | None = None) -> bool:
        """Apply what the zygote said, in order: a fork here (the pid books, the slots'
        pid in the table, the worker's pidfd), an exit through ``on_exit(seat, pid,
        status)`` (the loop's deaths shell); then each death the workers' pidfds tell.
        False when the zygote is gone."""
        events = self.zygote.read(block_until)
        for event in events or ():
            if isinstance(event, Forked):
                seat, pid = event.seat, event.pid
                self._pending_forks.pop(seat, None)
                asked = self._asked.pop(seat, None)
                if asked is not None and set(asked) != set(self.cpus_of(seat)):
                    _set_affinity(pid, self.cpus_of(seat), self.name)  # the seat moved while it was forked
                self.pids[seat] = pid
                self._seat_of_pid[pid] = seat
                end = self._unforked.pop(seat, None)
                if end is not None:
                    end.close()  # the worker holds its end now
                for slot in self._slots_of_seat(seat):
                    self.table.set_slot_meta(slot, pid=pid)
                if not self.watch.watch(pid):
                    # Exited and reaped already: the zygote's exit report follows this one.
                    self._awaiting.setdefault(pid, time.monotonic() + self.answer_s)
                log.debug("seat %d: worker pid %d", seat, pid)
            elif isinstance(event, Exited):
                self._died(event.pid, event.status, on_exit)
        self._pidfd_deaths(on_exit)
        return events is not None

    def _pidfd_deaths(self, on_exit) -> None:
        """The deaths the workers' pidfds tell. A zombie's status is read from /proc; a
        worker the zygote reaped already has its status in the zygote's report, on its
        way (`_awaiting`): once `answer_s` passed without it, it died of an unknown
        cause (taken for a SIGKILL)."""
        now = time.monotonic()
        for pid in self.watch.fired():
            if pid not in self._seat_of_pid:
                self.watch.forget(pid)  # handled already
                continue
            status = zombie_status(pid)
            if status is None:
                self._awaiting.setdefault(pid, now + self.answer_s)
            else:
                self._died(pid, status, on_exit)
        for pid, until in list(self._awaiting.items()):
            if now >= until:
                log.warning("fleet %s: worker pid %d exited and the fork server never said how", self.name, pid)
                self._died(pid, -signal.SIGKILL, on_exit)

    def _died(self, pid: int, status: int, on_exit) -> None:
        """Worker `pid` is gone: its death goes to ``on_exit`` once, whoever told it first."""
        self._awaiting.pop(pid, None)
        seat = self._seat_of_pid.pop(pid, None)
        if seat is not None:
            on_exit(seat, pid, status)
        self.watch.forget(pid)

    def kill(self, pid: int) -> None:
        """Kill a worker for a reason of the supervisor's own: its death is no lane death."""
        self._killed.add(pid)
        self.host.kill(pid)

    def kill_stopped(self, grace_s: float) -> list[int]:
        """Kill (as `kill`) every worker found stopped (SIGSTOP, a tracer) for `grace_s`:
        while the fleet closes, a stopped worker would hold its unit, and so shutdown,
        for ever. The pids killed."""
        now, killed = time.monotonic(), []
        for pid in list(self._seat_of_pid):
            if not stopped(pid):
                self._stopped_since.pop(pid, None)
                continue
            since = self._stopped_since.setdefault(pid, now)
            if now - since >= grace_s and pid not in self._killed:
                log.error("fleet %s: worker pid %d has been stopped %.1fs while the fleet closes: killed",
                          self.name, pid, now - since)
                self.kill(pid)
                killed.append(pid)
        return killed

    def killed_by_us(self, pid: int) -> bool:
        """Whether the supervisor killed worker `pid` itself (a timeout, a lost lease, a stop)."""
        return pid in self._killed

    def gone(self, seat: int, pid: int) -> None:
        """Worker `pid` of `seat` is gone (its death is being handled): its seat has no pid."""
        current = self.pids.get(seat)
        if current == pid:
            self.pids.pop(seat, None)
        if current in (None, pid):
            # What its end was sent and never took goes with it. Its successor gets a channel
            # of its own as soon as anything is sent to the seat or it is forked (`channel`):
            # tasks sent from now on are its. A seat retired for good makes none.
            self._close_channel(seat)

    def death_handled(self, pid: int) -> None:
        """The death of worker `pid` was handled: a kill of ours is forgotten, and its pidfd."""
        self._killed.discard(pid)
        self._stopped_since.pop(pid, None)
        self._awaiting.pop(pid, None)
        self.watch.forget(pid)

    # ------------------------------------------------------------------ the zygote's death
    def kill_zygote(self) -> None:
        """SIGKILL the zygote (it stopped answering): its death is then handled as any."""
        if self.zygote is not None and not self._zygote_gone:
            self.zygote.kill()

    def zygote_lost(self) -> int | None:
        """The zygote is gone: its exit code (it is reaped here), or None when its death
        was handled already (or none runs)."""
        if self.zygote is None or self._zygote_gone:
            return None
        self._zygote_gone = True
        return self.zygote.wait()

    def orphaned(self) -> dict[int, int]:
        """pid -> seat of the workers of a zygote that died, each killed (they die with
        it, by their parent-death signal, unless a unit took it from them) and gone by
        the time this returns, and forgotten here: the caller handles its death."""
        orphans, self._seat_of_pid = dict(self._seat_of_pid), {}
        self._awaiting.clear()
        self._kill_and_wait(orphans)
        return orphans

    def unanswered(self) -> set[int]:
        """The seats whose fork a zygote that died never answered, forgotten here."""
        seats, self._pending_forks = set(self._pending_forks), {}
        return seats

    def _kill_and_wait(self, pids) -> None:
        """SIGKILL each pid through its pidfd; wait (up to KILL_WAIT_S) until each exited."""
        for pid in pids:
            self.watch.kill(pid)
        deadline = time.monotonic() + KILL_WAIT_S
        for pid in pids:
            while not self.watch.exited(pid) and time.monotonic() < deadline:
                time.sleep(0.002)

    def replace_zygote(self) -> None:
        """Start a new fork server in place of the one that died (`restart_zygote`); the
        forks asked of the old one are forgotten."""
        self._pending_forks.clear()
        self._asked.clear()
        self.zygote.exit(timeout=0.5)
        self.restart_zygote()
        self._zygote_gone = False

    def exit(self, timeout: float) -> None:
        """Stop the zygote and the thread that started it; kill every worker. Bounded,
        whatever they do: the zygote is asked to exit and SIGKILLed after `timeout`
        (at most `answer_s`); each worker is SIGKILLed through its pidfd (it dies with
        the zygote, unless it dropped its parent-death signal, ignores SIGTERM or is
        stopped: SIGKILL ends it all the same), and waited for up to KILL_WAIT_S."""
        if self._launched is not None:  # launched, never booted
            self._launched.exit(timeout=timeout)
            self._launched = None
        if self.zygote is not None:
            self.zygote.exit(timeout=min(timeout, self.answer_s))
            self.zygote = None
        self._kill_and_wait(self.watch.watching())
        self.watch.close()
        self.close_channels()
        if self._spawner is not None:
            self._spawner.shutdown(wait=False)
            self._spawner = None


def _set_affinity(pid: int, cpus, name: str) -> None:
    """Pin every thread of process `pid` to `cpus` (a refusal is logged)."""
    try:
        affinity.pin_process(pid, cpus)
    except OSError as exc:
        log.warning("fleet %s: cannot pin worker pid %d to cpus %s: %s", name, pid, list(cpus), exc)


def worker_setup(config, relay: bool = False) -> WorkerSetup:
    """The config's worker setup; a handler named in ``__main__`` also brings the main
    module in, with the command line its top level may read (fleet.worker.prepare),
    so a script's own function can be one. ``relay`` (service mode): results are not lent."""
    setup = config.workers if not relay else replace(config.workers, lend=False)
    if setup.main is None and any((r.handler or "").startswith("__main__:") for r in config.roles):
        here = WorkerSetup.of_this_process()
        setup = replace(setup, main=here.main, argv=setup.argv or here.argv,
                                    authkey=setup.authkey or here.authkey)
    return setup
