"""Each CPU's idle and total time (fleet.host.affinity.cpu_times), read from the real
/proc/stat, and from a written one for the lines it must leave out. The contention rule
judges a widened worker's home CPU by it (fleet.rules.contention.idle_share)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys

from fleet.host.affinity import cpu_times
from fleet.rules.contention import POLICY, idle_share
from tests import require
from tests.daemons import BOUND_S, wait_until

#: a busy loop pinned to one CPU that dies with its parent (PR_SET_PDEATHSIG)
BUSY = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
if os.getppid() != {parent}:
    sys.exit(0)
os.sched_setaffinity(0, {{{cpu}}})
while True:
    pass
"""
#: ticks of the CPU's time one reading of the busy CPU spans (a quarter of a second at USER_HZ=100)
WINDOW_TICKS = 25


@contextlib.contextmanager
def busy_on(cpu: int):
    proc = subprocess.Popen([sys.executable, "-c", BUSY.format(parent=os.getpid(), cpu=cpu)], stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(BOUND_S)


def _running_on(pid: int, cpu: int) -> bool:
    """The process is running (state R) on `cpu` now (/proc/PID/stat: field 3, field 39)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return fields[0] == "R" and int(fields[36]) == cpu


def test_every_cpu_this_process_may_use_is_read_and_its_times_only_grow():
    before = cpu_times()
    assert set(os.sched_getaffinity(0)) <= set(before)
    assert all(0 <= idle <= total for idle, total in before.values())
    wait_until(lambda: all(cpu_times()[c][1] > before[c][1] for c in before), "every CPU's time to move on", BOUND_S)
    after = cpu_times()
    assert all(after[c][0] >= before[c][0] and after[c][1] >= before[c][1] for c in before)


def test_a_cpu_a_busy_loop_fills_is_not_idle_a_tick():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        require.lacking("two CPUs needed: one for the busy loop, one for the test")
    cpu = cpus[-1]
    with busy_on(cpu) as proc:
        wait_until(lambda: _running_on(proc.pid, cpu), f"the busy loop running on CPU {cpu}", BOUND_S)
        before = cpu_times()
        wait_until(lambda: cpu_times()[cpu][1] - before[cpu][1] >= WINDOW_TICKS, "a window of its time", BOUND_S)
        share = idle_share(before, cpu_times(), (cpu,))
        assert share is not None and share < POLICY.free_share  # taken: the rule keeps a worker away
        assert proc.poll() is None


def test_the_total_leaves_guest_time_out_and_a_line_it_cannot_read_is_skipped(tmp_path):
    (tmp_path / "stat").write_text(
        "cpu  900 0 900 900 0 0 0 0 0 0\n"  # the sum of all CPUs: not a CPU
        "cpu0 100 2 30 400 5 1 2 7 50 3\n"  # user nice system idle iowait irq softirq steal guest guest_nice
        "cpu1 10 0 10\n"  # too few columns
        "cpuX 1 2 3 4 5 6 7 8\n"
        "cpu3 1 2 3 4 5 6 7 x\n"
        "cpu2 1 1 1 1 1 1 1 1\n"
        "intr 1 2 3\n")
    assert cpu_times(str(tmp_path)) == {0: (405, 547), 2: (2, 8)}


def test_an_unreadable_proc_stat_reads_as_nothing(tmp_path):
    assert cpu_times(str(tmp_path)) == {}
