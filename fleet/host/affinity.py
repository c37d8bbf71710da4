"""A process's CPUs and its wait for them, as /proc and sched_setaffinity(2) give them.

Affinity is a thread's on Linux: moving a worker moves every thread of it
(`pin_process`). A worker's demand for the CPU is read from its schedstat
(`schedstat`): ns it ran, ns it waited on a run queue (no privilege needed; the main
thread's, which runs a worker's units).
"""
from __future__ import annotations

import os
from collections.abc import Iterable


def process_cpus() -> set[int]:
    """The CPUs this process may run on: its main thread's mask. A thread pinned narrower
    (a supervisor's loop, fleetd's control thread) reads its own with sched_getaffinity(0)."""
    return os.sched_getaffinity(os.getpid())


def pin_process(pid: int, cpus: Iterable[int]) -> bool:
    """Pin every thread of process `pid` to `cpus`. False when the process is gone; a
    thread that ended meanwhile is skipped. OSError (a CPU outside the cpuset, EPERM)
    as sched_setaffinity(2) reports it."""
    cpus = set(cpus)
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return False
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            continue  # that thread ended
    return True


def schedstat(pid: int, proc: str = "/proc") -> tuple[int, int] | None:
    """(ns run, ns waited on a run queue) of process `pid`'s main thread, from
    ``/proc/PID/schedstat``; None when it is gone or the file says nothing readable."""
    try:
        with open(f"{proc}/{pid}/schedstat") as f:
            fields = f.read().split()
        return int(fields[0]), int(fields[1])
    except (OSError, IndexError, ValueError):
        return None
