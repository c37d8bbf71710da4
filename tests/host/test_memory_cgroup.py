"""Memory as a reading, on this host's real cgroups: the kernel's OOM killer in a v1 memory
group the test makes (and removes, even when it fails), and memory pressure (PSI) in a
cgroup2 group of its own.

Memory pressure is made as the kernel makes it: a reader of a sparse file larger than its
v1 memory group's limit fills the page cache to the limit, and every further page is
reclaimed in the group first; each reclaim is a memory stall of the reader, which PSI
charges to the reader's cgroup2 group (PLATFORM.md: the v1 controllers and the cgroup2
groups are separate trees on this host; PSI is the cgroup2 tree's).
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys

import pytest

import fleet
from fleet.host import cgroup
from fleet.host.cgroup import V1, ControllerDir
from fleet.host.sampler import OomCounter, PressureInput, QuotaWatcher
from fleet.rules import pressure, quota
from tests.cgroups import V1_MEMORY, Both, FleetdInGroup, memory_group, v2_group
from tests.daemons import BOUND_S, wait_until
from tests.fleets import role
from tests.service.test_metrics import scrape, value

MIB = 1 << 20
#: Room above a fleetd's own usage before its group's limit: a unit allocating ALLOC_MIB
#: passes it, a unit allocating 1 MiB does not.
ROOM_MIB = 48
ALLOC_MIB = 200
#: The thrashing reader's group limit, and its file (sparse: no disk written, the page cache
#: still fills, and is reclaimed, page by page).
READER_LIMIT_MIB = 32
SPARSE_MIB = 256

pytestmark = pytest.mark.root


def _oom_score_adj(pid: int) -> int:
    with open(f"/proc/{pid}/oom_score_adj") as f:
        return int(f.read())


class _Read:
    """A reading's file as a fleet whose group is not its own names it (path, version, own)."""

    def __init__(self, path, version, own=True):
        self.path, self.version, self.own = path, version, own


def _v1_dir(group) -> ControllerDir:
    return ControllerDir("memory", V1, group.path, V1_MEMORY)


def test_a_real_oom_kill_in_a_v1_group_is_counted_in_its_oom_control():
    """fleet's reader over a group the test made: a process past the limit is killed by the
    kernel (SIGKILL) and the count moves by one."""
    with memory_group() as group:
        group.set_limit(32 * MIB)
        cdir = _v1_dir(group)
        assert cgroup.read_oom_kills(cdir) == 0
        proc = subprocess.Popen([sys.executable, "-c", "b = b'x' * (128 << 20)"], preexec_fn=group.enter_self)
        assert proc.wait(BOUND_S) == -signal.SIGKILL
        assert cgroup.read_oom_kills(cdir) == group.oom_kills() == 1
        counter = OomCounter.for_read(_Read(f"{group.path}/memory.oom_control", V1))
        assert counter.read() == 1 and "OOM kills read from " + counter.path in counter.describe()
        assert OomCounter.for_read(None).read() is None


def test_a_worker_the_oom_killer_kills_fails_its_unit_lane_death_naming_oom_and_the_fleet_serves_on(fleet_name):
    """A real fleetd in a v1 memory group with room for its own usage and a little more: a
    unit allocating far past it gets its worker killed by the kernel; the unit fails
    LaneDeath naming oom and where the kill was counted, the next unit is served, status
    and metrics count one kill. Mutations that turn it red: `claim` never naming a kill
    (the detail says only "signal 9"), the supervisor not reading the counter at the death
    (the kill is seen only at a later sample: no claim), the publisher's `oom_killed` not
    called (status and metrics count 0), the worker's oom_score_adj not raised (the kernel
    may take the supervisor, whose RSS is the larger: fleetd dies)."""
    roles = {"mem": role("allocate", slots=1, peak_cpus=1)}
    with memory_group() as group:
        d = FleetdInGroup(fleet_name, roles, group, fleet={"cpus": 2}, extra={"metrics": {"enabled": True, "port": 0}})
        try:
            d.start()
            assert d.proc.pid in group.pids()
            status = d.ctl_json("status")["memory"]
            assert status["oom_kills"] == 0 and status["oom_kills_from"] == f"{group.path}/memory.oom_control", status
            url = re.search(r"metrics on (http://\S+)", d.stderr()).group(1)
            with d.connect() as client:
                pid = client.submit("mem", 1).result(BOUND_S)  # a worker up, its imports charged
                # the worker is the OOM killer's first choice in the group: its supervisor's + 500
                assert _oom_score_adj(pid) == min(1000, _oom_score_adj(d.proc.pid) + 500)
                group.set_limit(group.usage() + ROOM_MIB * MIB)
                with pytest.raises(fleet.UnitFailed) as info:
                    client.submit("mem", ALLOC_MIB).result(BOUND_S)
                assert info.value.outcome.reason == "LaneDeath"
                text = info.value.outcome.detail
                assert "oom: killed by the kernel's OOM killer (signal 9; counted in " in text, text
                assert f"{group.path}/memory.oom_control" in text, text
                assert group.oom_kills() == 1
                assert client.submit("mem", 1).result(BOUND_S) > 0  # the fleet serves on
            assert d.proc.poll() is None
            status = d.ctl_json("status")
            assert status["memory"]["oom_kills"] == 1, status["memory"]
            assert status["ledger"]["failed_by_reason"]["LaneDeath"] == 1
            assert "OOM-killed 1" in d.ctl("status").stdout
            assert value(scrape(url), "fleet_worker_oom_kills_total", role="mem") == 1
            d.signal(signal.SIGTERM)
            assert d.wait() == 0
        finally:
            d.cleanup()


@contextlib.contextmanager
def thrashing_reader(v2, tmp_path):
    """A process in `v2` (cgroup2: its PSI) and in a v1 memory group of READER_LIMIT_MIB of its
    own, reading a sparse file of SPARSE_MIB round and round: a memory stall at every page."""
    path = tmp_path / "sparse.bin"
    with open(path, "wb") as f:
        f.truncate(SPARSE_MIB * MIB)
    code = ("import sys\nwhile True:\n    with open(sys.argv[1], 'rb', buffering=0) as f:\n"
            "        while f.read(1 << 20):\n            pass\n")
    with memory_group() as own:
        own.set_limit(READER_LIMIT_MIB * MIB)
        proc = subprocess.Popen([sys.executable, "-c", code, str(path)], preexec_fn=Both(v2, own).enter_self)
        try:
            yield proc
        finally:
            proc.kill()
            proc.wait(BOUND_S)


def test_a_real_psi_trigger_on_a_groups_memory_pressure_holds_then_releases(tmp_path):
    """The watcher's memory input on a real cgroup2 group's memory.pressure: a reader
    thrashing its page cache stalls on reclaim, the kernel trigger fires, the watcher says
    HOLD (as memory, not CPU); once it is gone, RELEASE after a calm window."""
    with v2_group() as v2:
        path = os.path.join(v2.path, "memory.pressure")
        assert PressureInput.for_memory(100_000, 2_000_000, read=_Read(path, 2, own=False)) is None  # not ours
        watcher = QuotaWatcher(quota.choose(None, 2, "test"), detect=lambda: cgroup.effective_cpus(),
                               memory_input=PressureInput.for_memory(100_000, 2_000_000, read=_Read(path, 2)))
        assert "memory pressure on " + path in watcher.describe()
        with thrashing_reader(v2, tmp_path):
            seen = wait_until(lambda: (s := watcher.poll()).memory == pressure.HOLD and s, "a memory HOLD", every=0.1)
            assert seen.pressure is None and watcher.memory_state.held
        wait_until(lambda: watcher.poll().memory == pressure.RELEASE, "a memory RELEASE", every=0.1)
        watcher.close()


def test_fleetd_in_a_group_under_memory_pressure_cordons_with_the_memory_pressure_cause(fleet_name, tmp_path):
    """A real fleetd in its own cgroup2 group: memory pressure in that group (a reader beside
    it thrashing its page cache) cordons the fleet (cause memory-pressure); once the reader
    is gone the cause is released. Mutations that turn it red: the memory input never armed
    (no cordon), its HOLD filed under cpu-pressure (the cause), the release never applied."""
    roles = {"sq": role("square", slots=2)}
    with v2_group() as v2:
        d = FleetdInGroup(fleet_name, roles, v2, posture={"cordon_exit_clean_ms": 1000},
                          extra={"memory": {"pressure_stall_ms": 100, "pressure_window_ms": 2000}})
        try:
            d.start()
            wait_until(lambda: f"memory pressure on {v2.path}/memory.pressure (100 ms stalled in 2000 ms) cordons"
                       in d.stderr(), "the memory pressure input armed")
            assert d.ctl_json("status")["memory"]["pressure_from"] == f"{v2.path}/memory.pressure"
            # (a loaded host may stall the group's own processes on CPU: cpu-pressure comes and goes)
            wait_until(lambda: "memory-pressure" not in d.ctl_json("posture", "show")["causes"], "no memory hold first")
            with thrashing_reader(v2, tmp_path):
                # the reader stalls on its CPU too: cpu-pressure may hold beside it
                doc = wait_until(lambda: (p := d.ctl_json("posture", "show"))["posture"] == "Cordoned"
                                 and "memory-pressure" in p["causes"] and p, "the memory-pressure cordon")
                assert set(doc["causes"]) <= {"memory-pressure", "cpu-pressure"}, doc
                # not an operator's to release: only its own input lets it go
                refused = d.ctl("posture", "release", "memory-pressure")
                assert refused.returncode == 2 and "invalid choice: 'memory-pressure'" in refused.stderr, refused.stderr
            wait_until(lambda: "memory-pressure" not in d.ctl_json("posture", "show")["causes"], "the memory hold let go")
            assert "memory-pressure: release (PSI on " in d.stderr()
            with d.connect() as client:
                assert client.submit("sq", 6).result(BOUND_S) == 36
            d.signal(signal.SIGTERM)
            assert d.wait() == 0
        finally:
            d.cleanup()
