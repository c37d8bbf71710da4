"""cgroup detection and readers against fixture trees copied from real v1, v2 and hybrid hosts."""
import os
from pathlib import Path

import pytest
from tests import require

from fleet.host import cgroup
from fleet.host.cgroup import V1, V2, CgroupUnavailable

FIXTURES = Path(__file__).parent.parent / "fixtures" / "cgroup"


def tree(name: str) -> str:
    return str(FIXTURES / name)


def aff(n):
    return lambda: n


# --- /proc parsing -------------------------------------------------------------------


def test_proc_cgroup_splits_v2_line_and_v1_controllers():
    text = (FIXTURES / "v1_hybrid/proc/self/cgroup").read_text()
    m = cgroup.parse_proc_cgroup(text)
    assert m.v2 == "/fleet.slice/app"
    assert m.v1["cpu"] == "/fleet.slice/app"
    assert m.v1["cpuset"] == "/fleet.slice"
    assert m.v1["name=systemd"] == "/fleet.slice/app"


def test_proc_cgroup_combined_controllers_share_a_path():
    m = cgroup.parse_proc_cgroup("4:cpu,cpuacct:/docker/4f1c\n")
    assert m.v1 == {"cpu": "/docker/4f1c", "cpuacct": "/docker/4f1c"} and m.v2 is None


def test_mountinfo_keeps_only_cgroup_mounts_with_their_options():
    mounts = cgroup.parse_mountinfo((FIXTURES / "v1_hybrid/proc/self/mountinfo").read_text())
    assert {m.fstype for m in mounts} == {"cgroup", "cgroup2"}
    cpu = next(m for m in mounts if "cpu" in m.options)
    assert (cpu.mount_point, cpu.root) == ("/sys/fs/cgroup/cpu", "/")


def test_mountinfo_unescapes_spaces_and_skips_optional_fields():
    line = "32 31 0:29 /a\\040b /mnt/cg\\040x rw,relatime shared:7 master:3 - cgroup cgroup rw,cpu\n"
    (m,) = cgroup.parse_mountinfo(line)
    assert (m.root, m.mount_point, m.options) == ("/a b", "/mnt/cg x", frozenset({"rw", "cpu"}))


# --- locating directories --------------------------------------------------------------


def test_hybrid_host_uses_v1_cpu_because_cgroup2_has_no_cpu_controller():
    paths = cgroup.locate(tree("v1_hybrid"))
    assert paths.cpu == cgroup.ControllerDir("cpu", V1, "/sys/fs/cgroup/cpu/fleet.slice/app", "/sys/fs/cgroup/cpu")
    assert paths.cpuset.path == "/sys/fs/cgroup/cpuset/fleet.slice"
    assert any("no cpu controller" in r for r in paths.reasons)


def test_pure_v2_host_uses_the_unified_tree():
    paths = cgroup.locate(tree("v2_nested"))
    assert paths.cpu.version == V2
    assert paths.cpu.path == "/sys/fs/cgroup/fleet.slice/fleet.service"
    assert paths.cpu.top == "/sys/fs/cgroup"


def test_container_mount_root_is_stripped_from_the_cgroup_path():
    paths = cgroup.locate(tree("v1_container"))
    assert paths.cpu.path == "/sys/fs/cgroup/cpu,cpuacct"
    assert paths.cpuset.path == "/sys/fs/cgroup/cpuset"


def test_missing_proc_degrades_with_a_reason():
    paths = cgroup.locate(tree("empty"))
    assert paths.cpu is None and paths.cpuset is None
    assert paths.reasons and "cannot read" in paths.reasons[0]


# --- effective CPUs ---------------------------------------------------------------------


def test_lowest_quota_comes_from_an_ancestor_not_the_leaf():
    paths = cgroup.locate(tree("v1_hybrid"))
    assert cgroup.lowest_quota(paths.cpu, tree("v1_hybrid")) == (1.5, "/sys/fs/cgroup/cpu/fleet.slice")


def test_effective_cpus_is_the_min_of_affinity_cpuset_and_quota_v1():
    limit = cgroup.effective_cpus(root=tree("v1_hybrid"), affinity=aff(8))
    assert (limit.cpus, limit.affinity, limit.cpuset, limit.quota) == (1.5, 8, 4, 1.5)
    assert limit.schedulable == 2


def test_effective_cpus_keeps_a_fractional_v2_quota():
    limit = cgroup.effective_cpus(root=tree("v2_nested"), affinity=aff(16))
    assert (limit.cpus, limit.cpuset, limit.quota) == (4.5, 7, 4.5)
    assert limit.quota_dir == "/sys/fs/cgroup/fleet.slice"


def test_cpuset_or_affinity_wins_when_lower_than_the_quota():
    assert cgroup.effective_cpus(root=tree("v2_nested"), affinity=aff(3)).cpus == 3
    container = cgroup.effective_cpus(root=tree("v1_container"), affinity=aff(64))
    assert (container.cpus, container.cpuset, container.quota) == (2, 2, 3.0)


def test_no_quota_means_unlimited_and_affinity_decides():
    limit = cgroup.effective_cpus(root=tree("v2_nocpu"), affinity=aff(2))
    assert (limit.cpus, limit.quota, limit.cpuset) == (2, None, None)
    assert any("no cpu controller" in r for r in limit.reasons)


def test_nothing_known_falls_back_to_cpu_count_with_a_reason():
    limit = cgroup.effective_cpus(root=tree("empty"), affinity=aff(None))
    assert limit.cpus == (os.cpu_count() or 1)
    assert any("os.cpu_count" in r for r in limit.reasons)


def test_this_host_detection_does_not_crash():
    limit = cgroup.effective_cpus()
    assert 0 < limit.cpus <= len(os.sched_getaffinity(0))
    assert limit.affinity == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "text, cpus",
    [("max 100000", None), ("max", None), ("150000 100000", 1.5), ("50000 200000", 0.25)],
)
def test_cpu_max(text, cpus):
    assert cgroup.parse_cpu_max(text) == cpus


@pytest.mark.parametrize("quota, period, cpus", [("-1", "100000", None), ("20000", "100000", 0.2), ("450000", "100000", 4.5)])
def test_cfs_quota(quota, period, cpus):
    assert cgroup.parse_cfs(quota, period) == cpus


@pytest.mark.parametrize("text, n", [("0-3", 4), ("0-3,6,8-9", 7), ("5", 1), ("0-5,7\n", 7), ("", 0)])
def test_cpu_list(text, n):
    assert len(cgroup.parse_cpu_list(text)) == n


# --- cpu.stat ----------------------------------------------------------------------------


def test_v1_cpu_stat_throttled_time_is_already_ns():
    s = cgroup.read_cpu_stat("/sys/fs/cgroup/cpu/fleet.slice/app", V1, tree("v1_hybrid"))
    assert (s.nr_periods, s.nr_throttled, s.throttled_ns) == (21, 21, 1587207782)
    assert s.has_throttle


def test_v2_cpu_stat_throttled_usec_is_normalised_to_ns():
    s = cgroup.read_cpu_stat("/sys/fs/cgroup/fleet.slice/fleet.service", V2, tree("v2_nested"))
    assert (s.nr_periods, s.nr_throttled, s.throttled_ns, s.usage_ns) == (1200, 37, 2_450_000_000, 80_123_456_000)


def test_v2_cpu_stat_without_cpu_controller_has_no_throttle_fields():
    s = cgroup.read_cpu_stat("/sys/fs/cgroup", V2, tree("v2_nocpu"))
    assert s.nr_throttled is None and not s.has_throttle and s.usage_ns == 5_204_313_000


def test_missing_cpu_stat_raises_typed_unavailable():
    with pytest.raises(CgroupUnavailable, match="cpu.stat"):
        cgroup.read_cpu_stat("/nowhere", V1, tree("empty"))


# --- PSI -----------------------------------------------------------------------------------


def test_psi_host_file_some_and_full():
    p = cgroup.read_psi("/proc/pressure/cpu", tree("psi"))
    assert (p.some.avg10, p.some.avg60, p.some.total_us) == (0.81, 0.48, 4172506)
    assert p.full.total_us == 0


def test_psi_cgroup_file():
    p = cgroup.read_psi("/sys/fs/cgroup/fleet.slice/fleet.service/cpu.pressure", tree("v2_nested"))
    assert p.some.avg10 == 1.52


def test_psi_without_full_line():
    assert cgroup.read_psi("/proc/pressure/cpu", tree("psi_old_kernel")).full is None


def test_psi_missing_is_typed():
    with pytest.raises(CgroupUnavailable, match="PSI"):
        cgroup.read_psi("/proc/pressure/cpu", tree("empty"))


def test_psi_trigger_on_a_missing_file_is_typed():
    with pytest.raises(CgroupUnavailable, match="cannot open"):
        cgroup.PsiTrigger(str(FIXTURES / "empty" / "nope"), 100000, 2000000)


@pytest.mark.skipif(not os.path.exists("/proc/pressure/cpu") and not require.required(), reason="kernel without PSI")
def test_psi_trigger_arms_and_polls_on_this_kernel():
    try:
        trig = cgroup.PsiTrigger("/proc/pressure/cpu", 150000, 2000000)
    except CgroupUnavailable as exc:  # PSI present but triggers refused (no privilege): typed, not a crash
        assert "PSI trigger" in str(exc) or "cannot open" in str(exc)
        return
    with trig:
        assert trig.wait(0) in (True, False)


# --- which pressure file, and whose affinity ---------------------------------------------------------


def test_pressure_file_is_the_own_v2_groups_when_it_has_one():
    assert cgroup.pressure_file(tree("v2_nested")) == ("/sys/fs/cgroup/fleet.slice/fleet.service/cpu.pressure", True)


def test_pressure_file_without_a_group_file_is_none_or_the_hosts(tmp_path):
    # v1_hybrid's unified group has no cpu.pressure, and the tree has no /proc/pressure/cpu
    assert cgroup.pressure_file(tree("v1_hybrid")) == (None, False)
    assert cgroup.pressure_file(tree("empty")) == (None, False)
    host = tmp_path / "proc" / "pressure"
    host.mkdir(parents=True)
    (host / "cpu").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert cgroup.pressure_file(str(tmp_path)) == ("/proc/pressure/cpu", False)


def test_affinity_is_the_process_not_a_pinned_thread():
    """The supervisor pins its loop thread to the reserve cores and re-detects the quota
    from that thread: detection must still count the process's CPUs."""
    import threading

    whole = len(os.sched_getaffinity(0))
    if whole < 2:
        require.lacking("needs 2 CPUs to pin a thread to fewer")
    seen = []

    def pinned():
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        seen.append(cgroup.effective_cpus(cgroup.CgroupPaths(None, None, None)).affinity)

    t = threading.Thread(target=pinned)
    t.start()
    t.join()
    assert seen == [whole]


# --- memory: the OOM-kill counter and the group's memory.pressure ---------------------------------


def _copy(name: str, tmp_path) -> Path:
    import shutil

    dest = tmp_path / name
    shutil.copytree(FIXTURES / name, dest)
    return dest


def test_the_memory_group_is_the_v2_group_with_the_memory_controller(tmp_path):
    root = _copy("v2_nested", tmp_path)
    group = root / "sys/fs/cgroup/fleet.slice/fleet.service"
    (group / "memory.events").write_text("low 0\nhigh 12\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n")
    cdir, reasons = cgroup.memory_dir(str(root))
    assert (cdir.version, cdir.path) == (V2, "/sys/fs/cgroup/fleet.slice/fleet.service"), reasons
    assert cgroup.oom_kills_file(cdir) == "/sys/fs/cgroup/fleet.slice/fleet.service/memory.events"
    assert cgroup.read_oom_kills(cdir, str(root)) == 2


def test_on_a_hybrid_host_the_memory_group_is_v1_and_its_count_is_in_oom_control(tmp_path):
    root = _copy("v1_hybrid", tmp_path)
    group = root / "sys/fs/cgroup/memory/fleet.slice/app"
    group.mkdir(parents=True)
    cdir, reasons = cgroup.memory_dir(str(root))
    assert (cdir.version, cdir.path) == (V1, "/sys/fs/cgroup/memory/fleet.slice/app")
    assert "cgroup2 at /sys/fs/cgroup/unified/fleet.slice/app has no memory controller" in reasons
    with pytest.raises(CgroupUnavailable, match="cannot read .*memory.oom_control"):
        cgroup.read_oom_kills(cdir, str(root))
    (group / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")  # a kernel before 4.13
    with pytest.raises(CgroupUnavailable, match="has no oom_kill counter"):
        cgroup.read_oom_kills(cdir, str(root))
    (group / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert cgroup.read_oom_kills(cdir, str(root)) == 5


def test_no_memory_group_says_why():
    assert cgroup.memory_dir(tree("empty")) == (None, ("cannot read /proc/self/cgroup or mountinfo",))


def test_the_memory_pressure_file_is_the_own_v2_groups_or_none(tmp_path):
    root = _copy("v2_nested", tmp_path)
    assert cgroup.own_pressure_file("memory", str(root)) is None  # the group has no memory.pressure
    (root / "sys/fs/cgroup/fleet.slice/fleet.service/memory.pressure").write_text(
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert cgroup.own_pressure_file("memory", str(root)) == "/sys/fs/cgroup/fleet.slice/fleet.service/memory.pressure"
    # host-wide memory pressure is never the fleet's own
    host = tmp_path / "proc" / "pressure"
    host.mkdir(parents=True)
    (host / "memory").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert cgroup.own_pressure_file("memory", str(tmp_path)) is None
