"""Dispatch priority: the scheduler runs the supervisor's loop before a worker.

The loop feeds every seat. When a host has fewer free cores than runnable threads
(the loop, the caller that submits, one worker per seat), a worker woken on the core
the loop runs on preempts it, and every seat then waits for its next unit until that
worker sleeps again: measured on 2 cores with 2 pinned workers, 3,000 preemptions of
the loop a second, 23 % of its time spent runnable but not running, throughput 25-35 %
lower. Some nice levels between the loop and its workers end that (the scheduler's
wake-up preemption weighs them): `[fleet] dispatch_priority` levels.

Nice is per thread on Linux. Where the process may lower a nice (CAP_SYS_NICE, or an
RLIMIT_NICE that allows it) the loop thread alone goes `levels` below the process's
nice and the workers keep it. Elsewhere the workers go `levels` above it instead
(raising a nice needs no privilege): the same order inside the fleet, but against
processes outside it the workers then weigh less. `levels = 0` changes nothing.

The OOM killer's order, by the same token: a worker raises its own oom_score_adj
(`raise_oom_score`), so in a group at its memory limit a worker is killed, not the
supervisor or the fork server whose deaths would take every worker with them.
"""
from __future__ import annotations

import collections
import logging
import os
import resource
import threading

from fleet.rules.limits import NICE_MAX, NICE_MIN

log = logging.getLogger(__name__)

#: Linux capability number of CAP_SYS_NICE (bit in /proc/<pid>/status CapEff).
CAP_SYS_NICE = 23


class DispatchPriority(collections.namedtuple("DispatchPriority", ("levels", "base", "loop_nice", "worker_nice"))):
    """How boot applies `levels`: the loop thread's nice and the workers' nice (``base``:
    the process's nice at boot). collections' namedtuple, not typing's: the fork server
    imports this module, and typing would be ~2 ms of its start."""

    __slots__ = ()

    @property
    def raises_loop(self) -> bool:
        return self.loop_nice < self.base

    def describe(self) -> str:
        if self.loop_nice == self.worker_nice:
            return f"loop and workers at nice {self.base} (dispatch_priority = {self.levels})"
        how = "loop raised" if self.raises_loop else "workers lowered: no CAP_SYS_NICE to raise the loop"
        return f"loop at nice {self.loop_nice}, workers at nice {self.worker_nice} ({how})"

    def to_meta(self) -> dict:
        return {"levels": self.levels, "loop_nice": self.loop_nice, "worker_nice": self.worker_nice}


def may_lower_nice(to: int, cap_eff: int, rlimit_nice: int) -> bool:
    """Whether a thread may set its nice to `to` below its current one: with CAP_SYS_NICE
    (`cap_eff`, the effective capability mask), or when RLIMIT_NICE's soft limit allows
    it (a nice of ``20 - rlimit`` and above; setpriority(2))."""
    if cap_eff >> CAP_SYS_NICE & 1:
        return True
    return to >= 20 - rlimit_nice


def decide(levels: int, base: int, cap_eff: int, rlimit_nice: int) -> DispatchPriority:
    """The nices that put the loop `levels` above the workers, from a process at nice `base`.

    Lowering the loop is preferred (the workers keep their weight against the rest of the
    host); where it is not allowed, or would go past -20, the workers are raised for what
    is left (at most to 19)."""
    loop = max(NICE_MIN, base - levels)
    if loop < base and not may_lower_nice(loop, cap_eff, rlimit_nice):
        loop = base
    # loop >= base - levels, so the workers never go below the process's nice
    return DispatchPriority(levels, base, loop, min(NICE_MAX, loop + levels))


def this_process(levels: int) -> DispatchPriority:
    """`decide` for the calling process (its nice, capabilities and RLIMIT_NICE)."""
    return decide(levels, os.getpriority(os.PRIO_PROCESS, 0), _cap_eff(), resource.getrlimit(resource.RLIMIT_NICE)[0])


def set_this_thread(nice: int) -> None:
    """Set the calling thread's nice (Linux: PRIO_PROCESS of a thread id is that thread).
    OSError (e.g. PermissionError) as setpriority(2) reports it."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def _cap_eff() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:  # no /proc: no capability we could show
        return 0
    return 0


#: How far a worker raises its own oom_score_adj: in a memory group at its limit the kernel's
#: OOM killer takes a worker before the supervisor or the fork server (whose deaths take every
#: worker with them), even when the worker's RSS is the smaller.
WORKER_OOM_SCORE_ADJ = 500
OOM_SCORE_ADJ_MAX = 1000


def oom_score_adj_after(current: int, by: int = WORKER_OOM_SCORE_ADJ) -> int:
    """The oom_score_adj a worker takes from `current`: `by` higher, at most the kernel's
    maximum (raising needs no privilege; lowering would)."""
    return min(OOM_SCORE_ADJ_MAX, current + by)


def raise_oom_score(path: str = "/proc/self/oom_score_adj", by: int = WORKER_OOM_SCORE_ADJ) -> int | None:
    """Raise this process's oom_score_adj by `by`; the new value, or None when it cannot be
    read or written (logged; the worker runs on at the old one)."""
    # os.open/read/write, not open(): it runs in each worker just after its fork, and the
    # io stack's objects (a buffered text file, its decoder) would write to ~0.2 MiB of
    # pages still shared with the fork server, each copied into the worker's own memory
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            value = oom_score_adj_after(int(os.read(fd, 32).strip()), by)
        finally:
            os.close(fd)
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # as open(path, "w") does
        try:
            os.write(fd, str(value).encode())
        finally:
            os.close(fd)
        return value
    except (OSError, ValueError) as exc:
        log.warning("cannot raise oom_score_adj: %s", exc)
        return None
