"""A process's CPUs and its wait for them, as /proc and sched_setaffinity(2) give them.

Affinity is a thread's on Linux: moving a worker moves every thread of it
(`pin_process`). A worker's demand for the CPU is read from its schedstat
(`schedstat`): ns it ran, ns it waited on a run queue (no privilege needed; the main
thread's, which runs a worker's units). Whether a CPU has room, whoever runs on it, is
read from its times in ``/proc/stat`` (`cpu_times`): a worker spread away from its own
CPU no longer waits there, so its own wait cannot tell whether what took that CPU left.
"""
from __future__ import annotations

import os
from typing import Iterable


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


#: /proc/stat's cpuN columns, in clock ticks: user nice system idle iowait irq softirq steal
#: (then guest and guest_nice, already counted in user and nice: left out of the total)
_IDLE_COLUMNS = (3, 4)  # idle, iowait: the CPU had nothing to run
_TOTAL_COLUMNS = 8


def cpu_times(proc: str = "/proc") -> dict[int, tuple[int, int]]:
    """Each CPU's (idle, total) time since boot in clock ticks, from ``/proc/stat``'s
    ``cpuN`` lines: idle counts the idle and iowait columns, total every column up to
    steal (time a hypervisor gave another guest is not idle). {} when it cannot be read;
    a malformed line is left out."""
    try:
        with open(f"{proc}/stat") as f:
            text = f.read()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        fields = line.split()
        try:
            cpu = int(fields[0][3:])  # (the first line, "cpu", sums every CPU: no number)
            ticks = [int(v) for v in fields[1:1 + _TOTAL_COLUMNS]]
        except ValueError:
            continue
        if len(ticks) == _TOTAL_COLUMNS:
            out[cpu] = (sum(ticks[i] for i in _IDLE_COLUMNS), sum(ticks))
    return out
