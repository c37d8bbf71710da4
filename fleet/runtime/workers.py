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


class Workers:
    """The zygote link and the pid of each seat's worker."""

    def __init__(self, name: str, config, roles, layout, priority, host, table, slots_of_seat):
        self.name, self.config, self.roles, self.layout = name, config, roles, layout
        self.priority, self.host, self.table, self._slots_of_seat = priority, host, table, slots_of_seat
        self.zygote: ZygoteLink | None = None
        self._spawner = None
        self.pids: dict[int, int] = {}  # seat -> pid
        self.seat_of_pid: dict[int, int] = {}
        self.pending_forks: set[int] = set()
        self.killed: set[int] = set()  # worker pids the supervisor killed itself (not lane deaths)
        self.news_seen = 0  # the zygote's news count when its socket was last read
        self.zygote_gone = False  # its death has been handled (no new one yet)

    def start_zygote(self) -> None:
        if self._spawner is None:
            # The zygote's parent-death signal fires when the *thread* that started it
            # exits; start it from a thread that lives exactly as long as this fleet.
            self._spawner = ThreadPoolExecutor(1, thread_name_prefix=f"fleet-{self.name}-spawner")
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
        self.pending_forks.add(seat)
        self.zygote.fork(seat, self.layout.seats[seat].cpus)

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
                self.pending_forks.discard(seat)
                self.pids[seat] = pid
                self.seat_of_pid[pid] = seat
                for slot in self._slots_of_seat(seat):
                    self.table.set_slot_meta(slot, pid=pid)
                log.debug("seat %d: worker pid %d", seat, pid)
            elif isinstance(event, Exited):
                seat = self.seat_of_pid.pop(event.pid, None)
                if seat is not None:
                    on_exit(seat, event.pid, event.status)
        return True

    def kill(self, pid: int) -> None:
        """Kill a worker for a reason of the supervisor's own: its death is no lane death."""
        self.killed.add(pid)
        self.host.kill(pid)

    def exit(self, timeout: float) -> None:
        """Stop the zygote (its workers die with it) and the thread that started it."""
        if self.zygote is not None:
            self.zygote.exit(timeout=timeout)
            for pid in list(self.seat_of_pid):
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
