"""`--cpu-quota`: run a replay inside its own v1 cpu cgroup, made and removed by the tool.

As root on a host with the v1 cpu controller (``/sys/fs/cgroup/cpu``), `cpu_quota(cpus)`
creates ``/sys/fs/cgroup/cpu/fleet-burst-<pid>-<random>``, sets its CFS quota to `cpus`
CPUs (period 100 ms), moves this process into it (the fleet's zygote and workers, forked
later, start inside it, so the fleet detects the quota and its throttle counters move),
and on exit moves this process back to the cpu group it came from and removes the group
once the fleet's processes have left it. Only the group it made is ever touched.
"""
from __future__ import annotations

import contextlib
import os
import time
import uuid

V1_CPU = "/sys/fs/cgroup/cpu"
PERIOD_US = 100_000


class CpuQuotaUnavailable(Exception):
    """--cpu-quota needs root and a v1 cpu cgroup hierarchy."""


def _own_cpu_group() -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "cpu" in controllers.split(","):
                return path
    raise CpuQuotaUnavailable("this process is in no v1 cpu cgroup")


def _write(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def read_stat(path: str) -> dict:
    """The group's cpu.stat (nr_periods, nr_throttled, throttled_time) as ints."""
    with open(os.path.join(path, "cpu.stat")) as f:
        return {k: int(v) for k, v in (line.split() for line in f if line.strip())}


def check_available() -> None:
    """CpuQuotaUnavailable unless this process may make v1 cpu groups (root, the hierarchy mounted)."""
    if os.geteuid() != 0 or not os.path.exists(os.path.join(V1_CPU, "cgroup.procs")):
        raise CpuQuotaUnavailable(f"--cpu-quota needs root and a v1 cpu cgroup hierarchy at {V1_CPU}")


@contextlib.contextmanager
def cpu_quota(cpus: float, *, leave_timeout_s: float = 30.0):
    """Run the body inside a fresh v1 cpu cgroup limited to `cpus` CPUs; yields a dict with its
    ``path``, filled with its final ``stat`` (cpu.stat) when the body is done."""
    check_available()
    home = os.path.join(V1_CPU, _own_cpu_group().lstrip("/"))
    path = os.path.join(V1_CPU, f"fleet-burst-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(path)
    try:
        _write(os.path.join(path, "cpu.cfs_period_us"), PERIOD_US)
        _write(os.path.join(path, "cpu.cfs_quota_us"), int(round(cpus * PERIOD_US)))
        _write(os.path.join(path, "cgroup.procs"), os.getpid())
        info = {"path": path, "stat": None}
        try:
            yield info
        finally:
            _write(os.path.join(home, "cgroup.procs"), os.getpid())
            info["stat"] = read_stat(path)
    finally:
        deadline = time.monotonic() + leave_timeout_s
        while True:
            try:
                os.rmdir(path)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # the fleet's last processes are still leaving it
