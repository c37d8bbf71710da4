"""Real v1 cpu cgroups for tests: created under /sys/fs/cgroup/cpu/ with a quota the test
sets (and may change while something runs inside), removed even when the test fails.
Only groups made here are ever touched."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid

from tests import require
from tests.daemons import Fleetd, to_toml

V1_CPU = "/sys/fs/cgroup/cpu"
V1_MEMORY = "/sys/fs/cgroup/memory"
PERIOD_US = 100_000


def remove_group(path: str) -> None:
    """rmdir a cgroup this test made, once its killed processes have left it (a killed and
    reaped process takes a moment to leave its group); gone already is fine."""
    for _ in range(200):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)
    os.rmdir(path)


def require_v1_cpu() -> None:
    """Fail under CI (root, cgroups v1 cpu: a missing one is a broken machine), skip elsewhere."""
    if os.geteuid() != 0 or not os.path.exists(os.path.join(V1_CPU, "cgroup.procs")):
        require.lacking("needs root and a cgroup v1 cpu hierarchy")


class CpuGroup:
    """One v1 cpu cgroup this test made."""

    def __init__(self, path: str):
        self.path = path

    def set_quota(self, cpus: float) -> None:
        """Set the CFS quota to `cpus` CPUs (period 100 ms)."""
        with open(os.path.join(self.path, "cpu.cfs_period_us"), "w") as f:
            f.write(str(PERIOD_US))
        with open(os.path.join(self.path, "cpu.cfs_quota_us"), "w") as f:
            f.write(str(int(round(cpus * PERIOD_US))))

    def add(self, pid: int) -> None:
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def pids(self) -> list[int]:
        with open(os.path.join(self.path, "cgroup.procs")) as f:
            return [int(line) for line in f.read().split()]

    def enter_self(self) -> None:
        """For a preexec_fn: move the calling (forked) process into the group."""
        self.add(os.getpid())


@contextlib.contextmanager
def cpu_group(cpus: float):
    """A fresh v1 cpu cgroup limited to `cpus` CPUs; removed on exit (processes still in
    it are the test's own: they are killed first, so rmdir can succeed)."""
    require_v1_cpu()
    with _fresh(V1_CPU, CpuGroup) as group:
        group.set_quota(cpus)
        yield group


@contextlib.contextmanager
def _fresh(root: str, kind):
    """A new group of `kind` under `root`, named for this test process; removed on exit,
    its processes (the test's own) killed first."""
    group = kind(os.path.join(root, f"fleet-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"))
    os.mkdir(group.path)
    try:
        yield group
    finally:
        _remove(group)


def _cgroup2_mount() -> str | None:
    from fleet.host import cgroup

    with open("/proc/self/mountinfo") as f:
        mounts = cgroup.parse_mountinfo(f.read())
    return next((m.mount_point for m in mounts if m.fstype == "cgroup2"), None)


@contextlib.contextmanager
def v2_group():
    """A fresh cgroup2 group (no controllers needed: its cpu.pressure is PSI of its own
    tasks); removed on exit. Fails under CI (root, cgroup2 with PSI there), skips elsewhere."""
    mount = _cgroup2_mount()
    if os.geteuid() != 0 or mount is None or not os.path.exists(os.path.join(mount, "cpu.pressure")):
        require.lacking("needs root and a cgroup2 mount with PSI")
    with _fresh(mount, CpuGroup) as group:
        yield group


class MemoryGroup(CpuGroup):
    """One v1 memory cgroup this test made."""

    def set_limit(self, nbytes: int) -> None:
        with open(os.path.join(self.path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(nbytes))

    def usage(self) -> int:
        with open(os.path.join(self.path, "memory.usage_in_bytes")) as f:
            return int(f.read())

    def oom_kills(self) -> int:
        """The group's own oom_kill count, read here (not through fleet's reader)."""
        with open(os.path.join(self.path, "memory.oom_control")) as f:
            return int(dict(line.split() for line in f.read().splitlines())["oom_kill"])


@contextlib.contextmanager
def memory_group():
    """A fresh v1 memory cgroup (no limit until the test sets one); removed on exit, its
    processes killed first. Fails under CI (root, a v1 memory hierarchy), skips elsewhere."""
    if os.geteuid() != 0 or not os.path.exists(os.path.join(V1_MEMORY, "cgroup.procs")):
        require.lacking("needs root and a cgroup v1 memory hierarchy")
    with _fresh(V1_MEMORY, MemoryGroup) as group:
        yield group


class Both:
    """Several groups (of different hierarchies) as one: a process enters each."""

    def __init__(self, *groups):
        self.groups = groups
        self.path = groups[0].path

    def enter_self(self) -> None:
        for group in self.groups:
            group.enter_self()

    def pids(self) -> list[int]:
        return self.groups[0].pids()


def busy(group: CpuGroup, n: int) -> list[subprocess.Popen]:
    """`n` busy-looping processes inside `group` (the caller kills them; _remove does too)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=group.enter_self) for _ in range(n)]


def _remove(group: CpuGroup) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            for pid in group.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            os.rmdir(group.path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # a killed process takes a moment to leave the group


class FleetdInGroup(Fleetd):
    """A real fleetd started inside `group` (it moves itself there before exec)."""

    def __init__(self, name: str, roles: dict, group: CpuGroup, *, fleet: dict | None = None, **kwargs):
        self.group = group
        self.fleet_section = fleet or {}
        super().__init__(name, roles, **kwargs)

    def write_config(self, roles, *, posture=None, limits=None, text=None) -> None:
        if text is None:
            cfg = {"fleet": {"name": self.name, **self.fleet_section}, "roles": roles}
            if posture:
                cfg["posture"] = posture
            if limits:
                cfg["limits"] = limits
            cfg.update(self.extra)
            text = to_toml(cfg)
        super().write_config(roles, text=text)

    def start(self, *, wait_ready: bool = True) -> "FleetdInGroup":
        self._stderr = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleet.cli.fleetd", "--config", self.config_path, "--name", self.name,
             *self.args],
            env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr, cwd=self.dir,
            preexec_fn=self.group.enter_self,
        )
        if wait_ready:
            self.wait_ready()
        return self

