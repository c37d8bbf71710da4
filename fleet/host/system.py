"""The operating system and the clock, as the supervisor sees them (injectable).

Every call the supervisor's rules depend on — the monotonic clock, SIGKILL, waiting
for a process to be gone, this process's CPU affinity and cgroup quota, pinning the
loop thread — goes through one `Host`. The real one calls the OS; a test passes a
`Host` with a fake clock (and, where it wants, a recording `kill`), so restart
intensity, deadlines and deaths are driven without sleeping. The zygote protocol
itself (fork requests over its socket) is the zygote link's, not the host's.
"""
from __future__ import annotations

import os
import signal
import time

from fleet.host import affinity, cgroup


class Host:
    """The real OS and monotonic clock."""

    #: Seconds on the monotonic clock (deadlines, restart intensity, stop grace): the C
    #: function itself, no Python frame around it (the loop reads it twice a turn).
    monotonic = staticmethod(time.monotonic)

    def now_ms(self) -> int:
        """Monotonic milliseconds (the posture's and the sampler's clock)."""
        return int(self.monotonic() * 1000)

    def kill(self, pid: int) -> None:
        """SIGKILL `pid`; a process already gone is not an error."""
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def gone(self, pid: int) -> bool:
        """Whether `pid` has exited (gone, or a zombie: workers are the zygote's children)."""
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except (FileNotFoundError, ProcessLookupError):
            return True

    def wait_gone(self, pid: int, timeout: float = 5.0) -> None:
        """Until `pid` is gone or `timeout` real seconds passed."""
        deadline = time.monotonic() + timeout
        while not self.gone(pid) and time.monotonic() < deadline:
            time.sleep(0.005)

    def affinity(self) -> list[int]:
        """The CPUs this process may run on: its main thread's mask, not the calling
        thread's (the supervisor's loop and fleetd's control thread are pinned narrower)."""
        return sorted(affinity.process_cpus())

    def effective_cpus(self):
        """The cgroup quota detection (fleet.host.cgroup.effective_cpus)."""
        return cgroup.effective_cpus()

    def own_group(self, arrange: bool):
        """Which cgroup is this fleet's (`fleet.host.cgroup.own_group`), its delegated group's
        leaves made and this process moved into its own when `arrange` (fleetd) and the
        group is delegated (`fleet.host.cgroup.arrange`)."""
        return cgroup.arrange(cgroup.own_group(arrange=arrange))

    def place(self, pid: int, leaf: str) -> None:
        """Move process `pid` into the cgroup `leaf` (raises OSError)."""
        cgroup.place(pid, leaf)

    def pin_this_thread(self, cpus) -> None:
        """Run the calling thread on `cpus` only (Linux applies affinity per thread)."""
        os.sched_setaffinity(0, cpus)

    def pin_process(self, pid: int, cpus) -> bool:
        """Run every thread of process `pid` on `cpus` only (`fleet.host.affinity.pin_process`)."""
        return affinity.pin_process(pid, cpus)

    def schedstat(self, pid: int) -> tuple[int, int] | None:
        """(ns run, ns waited on a run queue) of process `pid` (`fleet.host.affinity.schedstat`)."""
        return affinity.schedstat(pid)


class FakeClockHost(Host):
    """A real host whose monotonic clock is stepped by hand (tests).

    Only the clock is fake: processes, signals and /proc stay real, so a fleet on
    this host runs real workers while its deadlines and restart windows move only
    when the test calls `advance`. `kills` records every pid the supervisor killed.
    """

    def __init__(self, start: float = 1000.0):
        self._now = start
        self.kills: list[int] = []

    def monotonic(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def kill(self, pid: int) -> None:
        self.kills.append(pid)
        super().kill(pid)
