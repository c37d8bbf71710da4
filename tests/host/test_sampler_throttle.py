"""The sampler: scripted readings with a fake clock, degraded groups, and REAL kernel throttling."""
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from fleet.host import cgroup
from fleet.host.cgroup import V1, V2, CgroupUnavailable, CpuStat
from fleet.rules.fsm import CORDONED, NOMINAL
from fleet.rules.posture import PostureOwner
from fleet.host.sampler import Sampler
from tests.cgroups import remove_group
from tests import require


class FakeClock:
    def __init__(self, now=0):
        self.now = now

    def __call__(self):
        return self.now


def scripted(readings):
    it = iter(readings)

    def read():
        item = next(it)
        if isinstance(item, Exception):
            raise item
        return item

    return read


def stat(nr, ns):
    return CpuStat(nr_periods=nr * 2, nr_throttled=nr, throttled_ns=ns)


# --- with a fake clock -------------------------------------------------------------------


def test_ticks_feed_the_posture_with_the_injected_clock():
    clock = FakeClock()
    owner = PostureOwner(now_ms=0)
    sampler = Sampler(owner, scripted([stat(0, 0), stat(1, 0), stat(2, 0)]), clock=clock)
    seen = []
    for t in (0, 100, 200):
        clock.now = t
        seen.append(sampler.tick())
    assert [tick.now_ms for tick in seen] == [0, 100, 200]
    assert seen[-1].transition.new == CORDONED and seen[-1].transition.at_ms == 200
    assert seen[0].transition is None and seen[1].transition is None


def test_an_unreadable_group_leaves_the_posture_alone_and_says_why():
    owner = PostureOwner(now_ms=0)
    sampler = Sampler(owner, scripted([CgroupUnavailable("cannot read /x/cpu.stat")]), clock=FakeClock())
    tick = sampler.tick()
    assert tick.stat is None and tick.transition is None
    assert sampler.unavailable == "cannot read /x/cpu.stat" and owner.state.last is None


def test_a_group_without_throttle_counters_degrades():
    owner = PostureOwner(now_ms=0)
    sampler = Sampler(owner, scripted([CpuStat(None, None, None, usage_ns=5)]), clock=FakeClock())
    assert sampler.tick().transition is None
    assert "no throttle counters" in sampler.unavailable and owner.state.last is None


def test_recovery_after_unavailable_clears_the_reason():
    sampler = Sampler(PostureOwner(), scripted([CgroupUnavailable("gone"), stat(0, 0)]), clock=FakeClock())
    sampler.tick()
    sampler.tick()
    assert sampler.unavailable is None


def test_run_ticks_until_stopped():
    stop = threading.Event()
    ticks = []

    def on_tick(tick):
        ticks.append(tick)
        if len(ticks) == 3:
            stop.set()

    readings = scripted([stat(0, 0), stat(0, 0), stat(0, 0)])
    Sampler(PostureOwner(), readings, clock=FakeClock(), interval_s=0.001).run(stop, on_tick)
    assert len(ticks) == 3


def test_interval_must_be_positive():
    with pytest.raises(ValueError):
        Sampler(PostureOwner(), scripted([]), interval_s=0)


def test_for_self_degrades_where_no_cpu_cgroup_is_found(tmp_path):
    sampler = Sampler.for_self(PostureOwner(), root=str(tmp_path), clock=FakeClock())
    assert sampler.tick().stat is None and "cannot read" in sampler.unavailable


# --- real throttling ---------------------------------------------------------------------------


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _cpu_parent():
    """(directory, version) under which this test may create a cpu-limited group, or None."""
    mounts = cgroup.parse_mountinfo(_read("/proc/self/mountinfo"))
    for m in mounts:
        if m.fstype == "cgroup2" and "cpu" in _read(m.mount_point + "/cgroup.subtree_control").split():
            return m.mount_point, V2
    for m in mounts:
        if m.fstype == "cgroup" and "cpu" in m.options:
            return m.mount_point, V1
    return None


def _limit(path, version, quota_us, period_us=100_000):
    if version == V2:
        with open(path + "/cpu.max", "w") as f:
            f.write(f"{quota_us} {period_us}")
        return
    with open(path + "/cpu.cfs_period_us", "w") as f:
        f.write(str(period_us))
    with open(path + "/cpu.cfs_quota_us", "w") as f:
        f.write(str(quota_us))


class Group:
    """A cgroup this test created, with a busy child that it can start and stop."""

    def __init__(self, parent, path, version):
        self.parent, self.path, self.version, self.child = parent, path, version, None

    def start_load(self):
        self.child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        with open(self.path + "/cgroup.procs", "w") as f:
            f.write(str(self.child.pid))

    def stop_load(self):
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGKILL)
        if self.child is not None:
            self.child.wait()


@pytest.fixture
def throttled_group():
    found = _cpu_parent()
    if os.geteuid() != 0 or found is None:
        # CI has both: there a missing one is a broken machine, not a reason to pass.
        require.lacking("needs root and a cpu cgroup controller")
    parent, version = found
    # Unique per test process: xdist runs several of these at once.
    path = os.path.join(parent, f"fleet-test-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(path)
    group = Group(parent, path, version)
    try:
        _limit(path, version, quota_us=10_000)  # 0.1 CPU: a busy loop is throttled every period
        yield group
    finally:
        group.stop_load()
        remove_group(path)


def _drive(sampler, want, deadline_s=20.0):
    """Tick until the posture is `want`; a generous bound only guards a broken kernel."""
    end = time.monotonic() + deadline_s
    ticks = []
    while time.monotonic() < end:
        ticks.append(sampler.tick())
        if sampler.owner.posture == want:
            return ticks
        time.sleep(sampler.interval_s)
    pytest.fail(f"posture never reached {want}; last readings: {[t.stat for t in ticks[-5:]]}; {sampler.unavailable}")


@pytest.mark.root
def test_real_throttling_cordons_then_recovers(throttled_group):
    owner = PostureOwner()  # the default 002 §6 policy: 2 events / 1 s, 2 % / 5 s, 10 s clean
    sampler = Sampler.for_cgroup(owner, throttled_group.path, throttled_group.version, interval_s=0.05)
    sampler.tick()  # baseline
    throttled_group.start_load()

    ticks = _drive(sampler, CORDONED)
    assert ticks[-1].transition.new == CORDONED and ticks[-1].stat.nr_throttled >= 2
    assert owner.state.enter_count == 1

    # Shorten the windows on the live posture so recovery takes well under a second.
    view = owner.retune(
        {"cordon_enter_window_ms": 200, "cordon_duty_window_ms": 200, "cordon_exit_clean_ms": 400},
        now_ms=ticks[-1].now_ms,
    )
    assert view["posture"] == "Cordoned"
    throttled_group.stop_load()

    ticks = _drive(sampler, NOMINAL)
    assert ticks[-1].transition.new == NOMINAL and "clean for" in ticks[-1].transition.reason
    assert (owner.state.enter_count, owner.state.exit_count) == (1, 1)
    assert owner.show(ticks[-1].now_ms)["cordoned_dwell_ms"] >= 400


@pytest.mark.root
def test_the_real_group_reports_throttle_counters(throttled_group):
    s = cgroup.read_cpu_stat(throttled_group.path, throttled_group.version)
    assert s.has_throttle and (s.nr_throttled, s.throttled_ns) == (0, 0)
    cdir = cgroup.ControllerDir("cpu", throttled_group.version, throttled_group.path, throttled_group.parent)
    assert cgroup.lowest_quota(cdir) == (0.1, throttled_group.path)


# --- a quota above the fleet's own group (a slice's CPUQuota=, a delegated leaf) -----------

V2_NESTED = os.path.join(os.path.dirname(__file__), "..", "fixtures", "cgroup", "v2_nested")
SLICE = "sys/fs/cgroup/fleet.slice"
LEAF = SLICE + "/fleet.service"


def _v2_tree(tmp_path):
    import shutil

    root = tmp_path / "root"
    shutil.copytree(V2_NESTED, root)
    return root


def _write_stat(root, rel, nr_throttled, throttled_usec):
    (root / rel / "cpu.stat").write_text(
        f"usage_usec 5000\nuser_usec 4000\nsystem_usec 1000\nnr_periods {nr_throttled * 2}\n"
        f"nr_throttled {nr_throttled}\nthrottled_usec {throttled_usec}\nnr_bursts 0\nburst_usec 0\n")


def test_throttling_counted_only_by_the_slice_above_cordons_the_fleet(tmp_path):
    # cgroup v2: the quota is the slice's; the fleet's own group never counts a period.
    root = _v2_tree(tmp_path)
    _write_stat(root, LEAF, 0, 0)
    clock = FakeClock()
    sampler = Sampler.for_self(PostureOwner(now_ms=0), root=str(root), clock=clock)
    seen = []
    for t, nr in ((0, 0), (100, 1), (200, 2)):
        clock.now = t
        _write_stat(root, SLICE, nr, nr * 20_000)
        seen.append(sampler.tick())
    assert sampler.unavailable is None
    assert seen[-1].transition is not None and seen[-1].transition.new == CORDONED
    assert seen[-1].stat.nr_throttled == 2 and seen[-1].stat.throttled_ns == 2 * 20_000_000


def test_read_throttle_adds_every_ancestors_counters_and_passes_over_an_unreadable_one(tmp_path):
    root = _v2_tree(tmp_path)
    _write_stat(root, LEAF, 3, 1000)
    _write_stat(root, SLICE, 4, 500)
    cdir = cgroup.locate(str(root)).cpu
    got = cgroup.read_throttle(cdir, str(root))
    assert (got.nr_throttled, got.throttled_ns, got.usage_ns) == (7, 1_500_000, 5_000_000)
    os.unlink(root / SLICE / "cpu.stat")  # a group above the view, or gone
    assert cgroup.read_throttle(cdir, str(root)).nr_throttled == 3
    os.unlink(root / LEAF / "cpu.stat")
    with pytest.raises(CgroupUnavailable):
        cgroup.read_throttle(cdir, str(root))


def test_a_leaf_without_counters_is_read_through_the_group_above(tmp_path):
    # A delegated leaf of its own (the cpu controller not enabled below the unit's group):
    # the leaf reports usage only, the unit's group above it the throttling.
    root = _v2_tree(tmp_path)
    (root / LEAF / "cpu.stat").write_text("usage_usec 5000\nuser_usec 4000\nsystem_usec 1000\n")
    _write_stat(root, SLICE, 2, 10)
    got = cgroup.read_throttle(cgroup.locate(str(root)).cpu, str(root))
    assert got.has_throttle and got.nr_throttled == 2


def test_the_sampler_says_which_groups_it_reads(tmp_path):
    root = _v2_tree(tmp_path)
    sampler = Sampler.for_self(PostureOwner(now_ms=0), root=str(root), clock=FakeClock())
    assert sampler.reads == {"group": "/sys/fs/cgroup/fleet.slice/fleet.service", "version": V2,
                             "above": ["/sys/fs/cgroup/fleet.slice", "/sys/fs/cgroup"], "reason": None}
    assert sampler.describe() == ("throttling read from /sys/fs/cgroup/fleet.slice/fleet.service/cpu.stat "
                                  "(cgroup v2) and the 2 group(s) above it")
    nothing = Sampler.for_self(PostureOwner(now_ms=0), root=str(tmp_path / "no-such-root"), clock=FakeClock())
    assert nothing.reads["group"] is None and nothing.describe().startswith("no throttle counters: ")
