"""Which group is a fleet's own and where its processes go (fleet.rules.delegation), read
from fake trees in tmp dirs (every hierarchy x where the process sits x may it arrange),
the act (`fleet.host.cgroup.arrange`, `place`) on fake files and on real groups of this
host's cgroup2 and v1 cpu trees."""
from __future__ import annotations

from admission.records import replace
import itertools
import os
import subprocess
import sys
import uuid

import pytest

from fleet.host import cgroup
from fleet.rules import delegation as D
from tests.cgroups import cpu_group, remove_group
from tests import require

UNIT = "/system.slice/fleetd@demo.service"
V2_FILES = ("cgroup.procs", "cgroup.controllers", "cgroup.subtree_control", "cpu.stat", "cpu.pressure",
            "memory.events", "memory.pressure", "io.pressure")
CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc"

#: Where the process sits, relative to the unit's group, and which group carries systemd's mark.
#: name -> (the process's cgroup2 path, the marked path or None)
WHERE = {
    "marked-own": (UNIT, UNIT),
    "supervisor-leaf": (UNIT + "/supervisor", UNIT),
    "workers-leaf": (UNIT + "/workers", UNIT),
    "other-child": (UNIT + "/elsewhere", UNIT),
    "unmarked": (UNIT, None),
    "mount-root": ("/", None),
}
HIERARCHIES = (D.PURE_V2, D.HYBRID, D.V1_ONLY, D.NO_CGROUPS)


def mountinfo(kind: str) -> str:
    lines = ["22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda rw"]
    if kind == D.PURE_V2:
        lines.append("30 22 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate")
    if kind == D.HYBRID:
        lines.append("30 22 0:26 / /sys/fs/cgroup/unified rw,nosuid shared:4 - cgroup2 cgroup2 rw")
    if kind in (D.HYBRID, D.V1_ONLY):
        lines.append("31 22 0:27 / /sys/fs/cgroup/cpu,cpuacct rw shared:5 - cgroup cgroup rw,cpu,cpuacct")
        lines.append("32 22 0:28 / /sys/fs/cgroup/memory rw shared:6 - cgroup cgroup rw,memory")
    return "\n".join(lines) + "\n"


def v2_mount(kind: str) -> str | None:
    return {D.PURE_V2: "/sys/fs/cgroup", D.HYBRID: "/sys/fs/cgroup/unified"}.get(kind)


def make_tree(root, kind: str, where: str, psi: bool = True, memory: bool = True) -> None:
    """A fake host under `root`: /proc/self, the cgroup mounts `kind` has, the unit's group
    (v2 files, controllers) with its leaves, systemd's mark as a real extended attribute."""
    own, marked = WHERE[where]
    proc = root / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "mountinfo").write_text(mountinfo(kind))
    cg = [f"0::{own}"] if v2_mount(kind) else []
    if kind in (D.HYBRID, D.V1_ONLY):
        cg += [f"4:memory:{UNIT}", f"2:cpu,cpuacct:{UNIT}"]
    (proc / "cgroup").write_text("\n".join(cg) + "\n")
    if psi:
        (root / "proc" / "pressure").mkdir()
        for name in ("cpu", "memory"):
            (root / "proc" / "pressure" / name).write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    mount = v2_mount(kind)
    if mount is not None:
        top = root / mount.lstrip("/")
        for rel in ("", UNIT, own):
            d = top / rel.lstrip("/")
            d.mkdir(parents=True, exist_ok=True)
            for name in V2_FILES:
                if name == "memory.events" and (not memory or kind == D.HYBRID):
                    continue
                (d / name).write_text("")
            # On a hybrid host cgroup2 holds no controllers
            (d / "cgroup.controllers").write_text(CONTROLLERS if kind == D.PURE_V2 else "")
        if marked is not None:
            os.setxattr(top / marked.lstrip("/"), "trusted.delegate", b"1")
    if kind in (D.HYBRID, D.V1_ONLY):
        for mp in ("cpu,cpuacct", "memory"):
            d = root / "sys/fs/cgroup" / mp / UNIT.lstrip("/")
            d.mkdir(parents=True)
            (d / "cpu.stat").write_text("nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")


def expect_arranged(kind: str, where: str, arrange: bool) -> bool:
    # a process in a leaf of a delegated group is arranged already, whoever asks
    return kind == D.PURE_V2 and (where in ("supervisor-leaf", "workers-leaf") or (arrange and where == "marked-own"))


@pytest.mark.parametrize("kind,where,arrange", list(itertools.product(HIERARCHIES, WHERE, (True, False))))
def test_every_hierarchy_place_and_permission(tmp_path, kind, where, arrange):
    make_tree(tmp_path, kind, where)
    a = cgroup.own_group(str(tmp_path), arrange=arrange)
    assert a.hierarchy == kind
    assert a.arranged is expect_arranged(kind, where, arrange)
    mount = v2_mount(kind)
    if a.arranged:
        unit = mount + UNIT
        assert a.mode == "delegated" and a.delegated and a.group == unit
        assert a.leaves == {"supervisor": unit + "/supervisor", "workers": unit + "/workers"}
        assert a.move_self is (where != "supervisor-leaf")
        assert a.enable == ("cpu", "cpuset", "io", "memory", "pids")
        # every reading is the unit group's, never a leaf's nor the host's
        assert {k: (r.path, r.version, r.own) for k, r in a.reads.items()} == {
            k: (f"{unit}/{k}", 2, True) for k in D.READINGS}
        return
    assert a.mode == "embedded" and a.leaves == {} and not a.move_self
    # the notes say why it is embedded, first thing
    assert a.notes and ("not delegated" in a.notes[0] or "embedded in a program" in a.notes[0]
                        or f"the host is {kind}" in a.notes[0]), a.notes
    if kind == D.PURE_V2 and where != "mount-root":
        own = mount + WHERE[where][0]
        # its own group, whatever it holds (it is told in the notes)
        assert a.group == own
        assert a.reads[D.CPU_STAT] == D.Read(own + "/cpu.stat", 2, True)
        assert a.reads[D.MEMORY_EVENTS] == D.Read(own + "/memory.events", 2, True)
        assert a.reads[D.CPU_PRESSURE].own and a.reads[D.MEMORY_PRESSURE].own
    elif kind == D.PURE_V2:
        # the mount's root is everyone's: host-wide pressure, no cpu.stat or memory.events of its own
        assert a.group is None and a.reads[D.CPU_STAT] is None and a.reads[D.MEMORY_EVENTS] is None
        assert a.reads[D.CPU_PRESSURE] == D.Read("/proc/pressure/cpu", None, False)
    elif kind in (D.HYBRID, D.V1_ONLY):
        assert a.reads[D.CPU_STAT] == D.Read(f"/sys/fs/cgroup/cpu,cpuacct{UNIT}/cpu.stat", 1, True)
        # v1 memory has no memory.events: memory.oom_control's oom_kill line stands in
        assert a.reads[D.MEMORY_EVENTS] == D.Read(f"/sys/fs/cgroup/memory{UNIT}/memory.oom_control", 1, True)
        assert "memory.events: cgroup v1 memory.oom_control (its oom_kill line) in its stead" in a.notes, a.notes
        if kind == D.HYBRID and where != "mount-root":
            # per-group PSI lives in the cgroup2 tree even on a hybrid host; a leaf of a
            # delegated group reads the group
            group = UNIT if where.endswith("-leaf") else WHERE[where][0]
            assert a.reads[D.CPU_PRESSURE] == D.Read(mount + group + "/cpu.pressure", 2, True)
        else:
            assert a.reads[D.CPU_PRESSURE] == D.Read("/proc/pressure/cpu", None, False)
    else:
        assert a.group is None and a.reads[D.CPU_STAT] is None and a.reads[D.MEMORY_EVENTS] is None
    if kind == D.HYBRID and where in ("marked-own", "supervisor-leaf", "workers-leaf"):
        # systemd marks the group in the cgroup2 tree of a hybrid host too: not used, and said
        assert a.delegated and "delegation is not used" in a.notes[0], a.notes


def test_a_delegated_group_without_memory_events_reads_the_hosts_pressure_and_says_so(tmp_path):
    make_tree(tmp_path, D.PURE_V2, "marked-own", memory=False)
    a = cgroup.own_group(str(tmp_path), arrange=True)
    assert a.arranged and a.reads[D.MEMORY_EVENTS] is None
    assert any(n.startswith("memory.events: none in ") for n in a.notes), a.notes


def test_without_psi_the_host_files_are_none(tmp_path):
    make_tree(tmp_path, D.V1_ONLY, "unmarked", psi=False)
    a = cgroup.own_group(str(tmp_path))
    assert a.reads[D.CPU_PRESSURE] is None and a.reads[D.MEMORY_PRESSURE] is None


def test_only_the_controllers_the_group_has_are_enabled():
    unit = D.Group("/g", frozenset(V2_FILES), frozenset({"memory", "pids", "hugetlb"}), True)
    a = D.decide(D.Facts("/", unit, D.Group("/", frozenset(V2_FILES)), arrange=True))
    assert a.enable == ("memory", "pids")
    # without the cpu controller its cpu.stat has no throttle counters: no cpu.stat reading
    assert a.reads[D.CPU_STAT] is None


def test_a_failed_arrangement_reads_the_same_group_with_no_leaves_and_says_why():
    unit = D.Group("/g", frozenset(V2_FILES), frozenset(CONTROLLERS.split()), True)
    a = D.decide(D.Facts("/", unit, D.Group("/", frozenset(V2_FILES)), arrange=True))
    f = D.failed(a, "EBUSY")
    assert (f.arranged, f.leaves, f.enable, f.group, f.reads) == (False, {}, (), a.group, a.reads)
    assert f.delegated and f.mode == "embedded" and f.notes[0] == "delegated, but not arranged: EBUSY"


def test_status_lines_name_the_group_mode_and_each_reading():
    unit = D.Group("/sys/fs/cgroup/u", frozenset(V2_FILES) - {"memory.events"}, frozenset(CONTROLLERS.split()), True)
    a = D.decide(D.Facts("/sys/fs/cgroup", unit, D.Group("/sys/fs/cgroup"), arrange=True,
                         host_psi=frozenset(D.HOST_PSI.values())))
    lines = D.describe(a.to_meta())
    assert lines[0] == "delegated: group /sys/fs/cgroup/u (cgroup v2); leaves supervisor/, workers/"
    assert lines[1] == "reads cpu.stat, cpu.pressure, memory.events -, memory.pressure"
    assert lines[2] == "memory.events: none in /sys/fs/cgroup/u"


# --------------------------------------------------------------------------- the act


def delegated_on(tmp_path) -> D.Arrangement:
    make_tree(tmp_path, D.PURE_V2, "marked-own")
    a = cgroup.own_group(str(tmp_path), arrange=True)
    assert a.arranged
    return a


def test_arrange_makes_the_leaves_moves_every_process_and_enables_the_controllers(tmp_path):
    a = delegated_on(tmp_path)
    unit = tmp_path / a.group.lstrip("/")
    (unit / "cgroup.procs").write_text("4242\n")  # another process of the unit, there before
    done = cgroup.arrange(a, str(tmp_path), pid=777)
    assert done is a
    assert (unit / "workers").is_dir() and (unit / "supervisor").is_dir()
    # a fake file keeps the last write: the other process went after this one
    assert (unit / "supervisor" / "cgroup.procs").read_text() == "4242"
    assert (unit / "cgroup.subtree_control").read_text() == "+cpu +cpuset +io +memory +pids"
    cgroup.place(999, a.leaves["workers"], str(tmp_path))
    assert (unit / "workers" / "cgroup.procs").read_text() == "999"


def test_arrange_that_fails_undoes_its_moves_and_leaves_and_says_why(tmp_path):
    a = delegated_on(tmp_path)
    unit = tmp_path / a.group.lstrip("/")
    (unit / "cgroup.subtree_control").unlink()
    (unit / "cgroup.subtree_control").mkdir()  # writing it fails, as EBUSY would
    done = cgroup.arrange(a, str(tmp_path), pid=777)
    assert not done.arranged and done.group == a.group and done.reads == a.reads
    assert done.notes[0].startswith("delegated, but not arranged: ") and "subtree_control" in done.notes[0]
    # the leaves made are removed (in a fake tree the supervisor leaf keeps the file the
    # move wrote, which a real group's rmdir does not mind)
    assert not (unit / "workers").exists()
    assert not (unit / "supervisor").exists() or os.listdir(unit / "supervisor") == ["cgroup.procs"]
    assert (unit / "cgroup.procs").read_text() == "777"  # moved back


def test_arrange_keeps_leaves_that_exist_and_an_embedded_arrangement_does_nothing(tmp_path):
    a = delegated_on(tmp_path)
    unit = tmp_path / a.group.lstrip("/")
    (unit / "workers").mkdir()
    cgroup.arrange(a, str(tmp_path), pid=1)
    assert (unit / "workers").is_dir()
    e = D.failed(a, "x")
    before = sorted(os.listdir(unit))
    assert cgroup.arrange(e, str(tmp_path), pid=1) is e and sorted(os.listdir(unit)) == before


def _cgroup2() -> str:
    with open("/proc/self/mountinfo") as f:
        mount = next((m.mount_point for m in cgroup.parse_mountinfo(f.read()) if m.fstype == "cgroup2"), None)
    if os.geteuid() != 0 or mount is None:
        require.lacking("needs root and a cgroup2 mount")
    return mount


def test_real_cgroup2_group_marked_by_hand_is_found_arranged_and_left_clean():
    """A real group in this host's cgroup2 tree, marked as systemd marks one, with a real
    process in it: the facts are read from /proc and the group, the act is real. (The host
    is hybrid, so the rule is asked as if it were pure v2: its cgroup2 has no controllers.)"""
    mount = _cgroup2()
    group = os.path.join(mount, f"fleet-test-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(group)
    child = None
    try:
        os.setxattr(group, "trusted.delegate", b"1")
        child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        cgroup.place(child.pid, group)
        facts = cgroup.facts(pid=str(child.pid), arrange=True)
        assert facts.own.path == group and facts.own.marked and not facts.parent.marked
        a = D.decide(replace(facts, v1={}))
        assert a.arranged and a.group == group and a.move_self
        done = cgroup.arrange(a, pid=child.pid)
        assert done.arranged, done.notes
        with open(f"/proc/{child.pid}/cgroup") as f:
            assert f"0::{group[len(mount):]}/supervisor" in f.read().splitlines()
        # asked again from the leaf, the answer is the same group, nothing left to move
        again = D.decide(replace(cgroup.facts(pid=str(child.pid), arrange=True), v1={}))
        assert again.group == group and not again.move_self
    finally:
        if child is not None:
            child.kill()
            child.wait()
        for leaf in ("supervisor", "workers"):
            remove_group(os.path.join(group, leaf))
        remove_group(group)


def test_place_moves_a_real_process_into_a_real_v1_cpu_group_and_the_answer_follows():
    with cpu_group(1.0) as g:
        child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        try:
            cgroup.place(child.pid, g.path)
            assert child.pid in g.pids()
            a = cgroup.own_group(pid=str(child.pid), arrange=True)
            # this hybrid host: embedded, the v1 cpu group's cpu.stat is its throttle reading
            assert a.mode == "embedded" and a.reads[D.CPU_STAT] == D.Read(g.path + "/cpu.stat", 1, True)
            assert a.reads[D.MEMORY_EVENTS].path.endswith("/memory.oom_control")
        finally:
            child.kill()
            child.wait()


def test_a_reading_needs_its_controller_on_the_group_not_only_the_file():
    """cpu.stat without the cpu controller has usage alone; memory.events is read only where
    the memory controller is on (a fixture copied from a host with it off keeps no such file)."""
    own = D.Group("/g/x", frozenset(V2_FILES), frozenset({"pids"}), False)
    a = D.decide(D.Facts("/g", own, D.Group("/g"), arrange=True))
    assert a.reads[D.CPU_STAT] is None and a.reads[D.MEMORY_EVENTS] is None
    both = D.decide(D.Facts("/g", replace(own, controllers=frozenset({"cpu", "memory"})), D.Group("/g")))
    assert both.reads[D.CPU_STAT].path == "/g/x/cpu.stat" and both.reads[D.MEMORY_EVENTS].path == "/g/x/memory.events"


def test_a_delegated_fleets_posture_reads_the_unit_group_and_above_never_its_leaf(tmp_path):
    from fleet.host.sampler import Sampler
    from fleet.rules.posture import PostureOwner, PosturePolicy

    make_tree(tmp_path, D.PURE_V2, "supervisor-leaf")
    top = tmp_path / "sys/fs/cgroup"
    stat = "usage_usec 1\nuser_usec 1\nsystem_usec 0\nnr_periods {p}\nnr_throttled {t}\nthrottled_usec {u}\n"
    (top / UNIT.lstrip("/") / "cpu.stat").write_text(stat.format(p=10, t=4, u=100))
    (top / UNIT.lstrip("/") / "supervisor" / "cpu.stat").write_text(stat.format(p=10, t=1000, u=1000))
    (top / "system.slice").mkdir(exist_ok=True)
    (top / "system.slice" / "cpu.stat").write_text(stat.format(p=10, t=3, u=50))
    a = cgroup.own_group(str(tmp_path))
    sampler = Sampler.for_arrangement(PostureOwner(PosturePolicy(), now_ms=0), a, str(tmp_path), clock=lambda: 0)
    assert sampler.reads["group"] == "/sys/fs/cgroup" + UNIT and sampler.reads["version"] == 2
    tick = sampler.tick()
    # the unit's 4 and the slice's 3; the leaf's own counters are not read
    assert tick.stat.nr_throttled == 7 and tick.stat.throttled_ns == 150_000


def test_a_v1_group_that_is_its_hierarchys_root_is_the_hosts_not_the_fleets():
    a = D.decide(D.Facts(None, None, v1={"cpu": "/sys/fs/cgroup/cpu", "memory": "/sys/fs/cgroup/memory/m"},
                         v1_tops=frozenset({"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/memory"})))
    assert a.group is None and a.reads[D.CPU_STAT] == D.Read("/sys/fs/cgroup/cpu/cpu.stat", 1, False)
    assert a.reads[D.MEMORY_EVENTS] == D.Read("/sys/fs/cgroup/memory/m/memory.oom_control", 1, True)
    assert D.describe(a.to_meta())[0] == "embedded: group (none) (cgroup v1)"


@pytest.mark.parametrize("where", ["supervisor-leaf", "workers-leaf", "marked-own"])
def test_locating_a_controller_from_a_leaf_finds_the_delegated_group(tmp_path, where):
    """Every membership-based lookup (the quota's `locate`, any controller's directory)
    answers the unit's group from a leaf fleetd made, as `own_group` does."""
    make_tree(tmp_path, D.PURE_V2, where)
    paths = cgroup.locate(str(tmp_path))
    assert paths.cpu.path == paths.cpuset.path == "/sys/fs/cgroup" + UNIT
    assert cgroup._v2_dir(*_membership(tmp_path), str(tmp_path), "memory", []).path == "/sys/fs/cgroup" + UNIT


def test_locating_from_a_child_that_is_no_leaf_of_ours_stays_there(tmp_path):
    make_tree(tmp_path, D.PURE_V2, "other-child")
    assert cgroup.locate(str(tmp_path)).cpu.path == "/sys/fs/cgroup" + UNIT + "/elsewhere"


def _membership(tmp_path):
    mounts = cgroup.parse_mountinfo((tmp_path / "proc/self/mountinfo").read_text())
    return mounts, cgroup.parse_proc_cgroup((tmp_path / "proc/self/cgroup").read_text())
