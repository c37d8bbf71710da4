"""The supervisor's own view of its workers' lives: a pidfd per worker.

The workers are the zygote's children, so only the zygote can reap them and read
their wait status. The supervisor does not rely on it to learn of a death: a zygote
that is stopped (SIGSTOP), or wedged, would leave the death unnoticed and the units
the worker owed unresolved. It holds a pidfd of each worker instead
(`os.pidfd_open`: any process of ours, child or not). A pidfd becomes readable when
its process exits, reaped or not; a thread of this module waits on all of them
(epoll, one-shot) and rings the loop's bell when one fires, and the loop takes the
pids (`fired`) on its turn.

The wait status: a worker the zygote has not reaped yet is a zombie whose status the
kernel shows in /proc/<pid>/stat (`zombie_status`); one it reaped already, it has
reported or is about to (its `exited` event). A pidfd also signals its process
safely (`kill`): never another process that took the pid.

One owner: the loop thread calls everything but the watching thread's own loop.
"""
from __future__ import annotations

import collections
import logging
import os
import select
import signal
import threading

log = logging.getLogger(__name__)


class DeathWatch:
    """A pidfd per watched worker; a thread that rings `ring` when one exits."""

    def __init__(self, name: str, ring):
        self._ring = ring
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe()  # `close` ends the thread through it
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._pid_of_fd: dict[int, int] = {}  # read by the thread (one dict lookup: atomic)
        self._fd_of_pid: dict[int, int] = {}
        self._fired: collections.deque = collections.deque()  # pids: the thread appends, the loop pops
        self.news = 0  # bumped by the thread as it rings
        self._thread = threading.Thread(target=self._run, name=f"fleet-{name}-deaths", daemon=True)
        self._thread.start()

    def watch(self, pid: int) -> bool:
        """Watch worker `pid`; False when it is gone already (it exited and was reaped)."""
        if pid in self._fd_of_pid:
            return True
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        self._pid_of_fd[fd] = pid
        self._fd_of_pid[pid] = fd
        # One-shot: a pidfd stays readable once its process exited; it fires once.
        self._epoll.register(fd, select.EPOLLIN | select.EPOLLONESHOT)
        return True

    def watching(self) -> list[int]:
        return list(self._fd_of_pid)

    def fired(self) -> list[int]:
        """The watched pids that exited since the last call (each once)."""
        out = []
        while self._fired:
            pid = self._fired.popleft()
            if pid in self._fd_of_pid and self.exited(pid) and pid not in out:
                out.append(pid)
        return out

    def exited(self, pid: int) -> bool:
        """Whether watched `pid` has exited (a zombie counts). An unwatched pid: True."""
        fd = self._fd_of_pid.get(pid)
        if fd is None:
            return True
        ready, _, _ = select.select([fd], [], [], 0)
        return bool(ready)

    def kill(self, pid: int) -> None:
        """SIGKILL watched `pid` through its pidfd (never a process that took its pid)."""
        fd = self._fd_of_pid.get(pid)
        if fd is None:
            return
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it exited already

    def forget(self, pid: int) -> None:
        """Stop watching `pid` (its death was handled); its pidfd is closed."""
        fd = self._fd_of_pid.pop(pid, None)
        if fd is None:
            return
        self._pid_of_fd.pop(fd, None)
        try:
            self._epoll.unregister(fd)
        except OSError:
            pass
        os.close(fd)

    def close(self) -> None:
        """End the thread and close every pidfd. Idempotent."""
        if self._wake_w < 0:
            return
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        for pid in list(self._fd_of_pid):
            self.forget(pid)
        self._epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._wake_w = -1

    def _run(self) -> None:
        while True:
            try:
                events = self._epoll.poll()
            except InterruptedError:
                continue
            except (OSError, ValueError):  # closed under us
                return
            any_death = False
            for fd, _ in events:
                if fd == self._wake_r:
                    return
                pid = self._pid_of_fd.get(fd)
                if pid is not None:
                    self._fired.append(pid)
                    any_death = True
            if any_death:
                self.news += 1
                self._ring()


def zombie_status(pid: int) -> int | None:
    """The wait status of `pid` as an exit code (minus the signal that killed it) while
    it is a zombie (exited, not reaped yet); None when it is not one (or gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # fields[0] is field 3 (state); exit_code is field 52 (proc(5)), since Linux 3.5.
    if fields[0] != b"Z" or len(fields) < 50:
        return None
    return os.waitstatus_to_exitcode(int(fields[49]))


def stopped(pid: int) -> bool:
    """Whether `pid` is stopped (SIGSTOP, SIGTSTP: state T) or stopped by a tracer (t)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (FileNotFoundError, ProcessLookupError):
        return False
