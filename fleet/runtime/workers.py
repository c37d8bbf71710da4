"""The seats' worker processes: the zygote that forks them, and which pid runs which seat.

One owner: boot's thread builds it, then the loop thread alone uses it. The zygote
(`fleet.runtime.zygote_link`) forks one worker per seat and reports every exit; `read`
applies what it said about forks here (the pid books, the slots' pid in the table) and
hands each exit to the loop's deaths shell (`fleet.runtime.seat_deaths`), which decides
what it means. A worker the supervisor kills itself (a unit's timeout, a lost lease,
a stop) is marked `killed`, so its death is not taken for a lane death.
"""
from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor

from fleet.worker.prepare import WorkerSetup
from fleet.runtime.zygote_link import Exited, Forked, WorkerStartError, ZygoteLink

log = logging.getLogger(__name__)


def spawner_for(name: str) -> ThreadPoolExecutor:
    """The thread that starts a fleet's zygotes. The zygote's parent-death signal fires
    when the *thread* that started it exits: it lives exactly as long as the fleet."""
    return ThreadPoolExecutor(1, thread_name_prefix=f"fleet-{name}-spawner")


@dataclasses.dataclass
class Launched:
    """A zygote launched at the start of a boot (`launch`), and the thread that started it."""

    spawner: ThreadPoolExecutor
    link: ZygoteLink

    def stop(self) -> None:
        """The boot failed before the zygote was booted: stop it and its thread."""
        self.link.exit(timeout=0.5)
        self.spawner.shutdown(wait=False)


def launch(name: str) -> Launched:
    """Start fleet `name`'s zygote now, to boot later (`Workers.adopt`): it loads numba and
    the kernels while this process does the same for its table."""
    spawner = spawner_for(name)
    try:
        return Launched(spawner, ZygoteLink.launch(spawner))
    except BaseException:
        spawner.shutdown(wait=False)
        raise


class Workers:
    """The zygote link and the pid of each seat's worker."""

    def __init__(self, name: str, config, roles, layout, priority, host, table, slots_of_seat):
        self.name, self.config, self.roles, self.layout = name, config, roles, layout
        self.priority, self.host, self.table, self._slots_of_seat = priority, host, table, slots_of_seat
        self.zygote: ZygoteLink | None = None
        self._spawner = None
        self.pids: dict[int, int] = {}  # seat -> pid (read by the loop's views; written here only)
        self._seat_of_pid: dict[int, int] = {}
        self._pending_forks: set[int] = set()
        self._killed: set[int] = set()  # worker pids the supervisor killed itself (not lane deaths)
        self._news_seen = 0  # the zygote's news count when its socket was last read
        self._zygote_gone = False  # its death has been handled (no new one yet)
        self._launched: ZygoteLink | None = None  # a zygote launched by boot, not yet booted

    def adopt(self, launched: "Launched") -> None:
        """Boot's zygote, launched before this object existed (`launch`): `start_zygote` boots it."""
        self._spawner, self._launched = launched.spawner, launched.link

    def start_zygote(self) -> None:
        if self._spawner is None:
            self._spawner = spawner_for(self.name)
        launched, self._launched = self._launched, None
        if launched is not None:
            launched.boot(self.name, self.roles, worker_nice=self.priority.worker_nice, workers=worker_setup(self.config))
            self.zygote = launched
            return
        self.zygote = ZygoteLink.start(self.name, self.roles, self._spawner, worker_nice=self.priority.worker_nice,
                                       workers=worker_setup(self.config))

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

    def fork(self, seat: int) -> None:
        self._pending_forks.add(seat)
        self.zygote.fork(seat, self.layout.seats[seat].cpus)

    @property
    def forking(self) -> bool:
        """Forks asked for and not yet reported."""
        return bool(self._pending_forks)

    def has_news(self, news: int) -> bool:
        """Whether the zygote's news count moved since its socket was last read."""
        return news != self._news_seen

    def hear(self, news: int, on_exit) -> bool:
        """Read what the zygote said (`read`), its news count `news` taken first: news
        after this read is read next time. False when the zygote is gone."""
        self._news_seen = news
        return self.read(on_exit)

    def read(self, on_exit, block_until: float | None = None) -> bool:
        """Apply what the zygote said, in order: a fork here (the pid books, the slots'
        pid in the table), an exit through ``on_exit(seat, pid, status)`` (the loop's
        deaths shell). False when the zygote is gone."""
        events = self.zygote.read(block_until)
        if events is None:
            return False
        for event in events:
            if isinstance(event, Forked):
                seat, pid = event.seat, event.pid
                self._pending_forks.discard(seat)
                self.pids[seat] = pid
                self._seat_of_pid[pid] = seat
                for slot in self._slots_of_seat(seat):
                    self.table.set_slot_meta(slot, pid=pid)
                log.debug("seat %d: worker pid %d", seat, pid)
            elif isinstance(event, Exited):
                seat = self._seat_of_pid.pop(event.pid, None)
                if seat is not None:
                    on_exit(seat, event.pid, event.status)
        return True

    def kill(self, pid: int) -> None:
        """Kill a worker for a reason of the supervisor's own: its death is no lane death."""
        self._killed.add(pid)
        self.host.kill(pid)

    def killed_by_us(self, pid: int) -> bool:
        """Whether the supervisor killed worker `pid` itself (a timeout, a lost lease, a stop)."""
        return pid in self._killed

    def gone(self, seat: int, pid: int) -> None:
        """Worker `pid` of `seat` is gone (its death is being handled): its seat has no pid."""
        self.pids.pop(seat, None)

    def death_handled(self, pid: int) -> None:
        """The death of worker `pid` was handled: a kill of ours is forgotten."""
        self._killed.discard(pid)

    # ------------------------------------------------------------------ the zygote's death
    def zygote_lost(self) -> int | None:
        """The zygote is gone: its exit code (it is reaped here), or None when its death
        was handled already (or none runs)."""
        if self.zygote is None or self._zygote_gone:
            return None
        self._zygote_gone = True
        return self.zygote.wait()

    def orphaned(self) -> dict[int, int]:
        """pid -> seat of the workers of a zygote that died (they die with it), each
        forgotten here: the caller handles its death."""
        orphans, self._seat_of_pid = dict(self._seat_of_pid), {}
        return orphans

    def replace_zygote(self) -> None:
        """Start a new fork server in place of the one that died (`restart_zygote`); the
        forks asked of the old one are forgotten."""
        self._pending_forks.clear()
        self.zygote.exit(timeout=0.5)
        self.restart_zygote()
        self._zygote_gone = False

    def exit(self, timeout: float) -> None:
        """Stop the zygote (its workers die with it) and the thread that started it."""
        if self._launched is not None:  # launched, never booted
            self._launched.exit(timeout=timeout)
            self._launched = None
        if self.zygote is not None:
            self.zygote.exit(timeout=timeout)
            for pid in list(self._seat_of_pid):
                self.host.wait_gone(pid)
            self.zygote = None
        if self._spawner is not None:
            self._spawner.shutdown(wait=False)
            self._spawner = None


def worker_setup(config) -> WorkerSetup:
    """The config's worker setup; a handler named in ``__main__`` also brings the main
    module in, with the command line its top level may read (fleet.worker.prepare),
    so a script's own function can be one."""
    setup = config.workers
    if setup.main is None and any((r.handler or "").startswith("__main__:") for r in config.roles):
        here = WorkerSetup.of_this_process()
        setup = dataclasses.replace(setup, main=here.main, argv=setup.argv or here.argv,
                                    authkey=setup.authkey or here.authkey)
    return setup
