"""The quota a fleet plans with (pure): its sources, boot warnings, and runtime epochs."""
from __future__ import annotations

import pytest

from fleet.rules import quota as Q
from fleet.rules.quota import CpuLimit
from fleet.cli import cmd_status
from fleet.rules.plan import resolve
from fleet.rules.roles import Role, RoleSet

ROLES = RoleSet((Role("sq", kind="pooled", handler="tests.handlers:square", slots=2, peak_cpus=1),))


def limit(cpus, affinity=2, cpuset=None, quota=None, quota_dir=None):
    return CpuLimit(cpus, affinity, cpuset, quota, quota_dir)


@pytest.mark.parametrize("lim, text", [
    (limit(0.3, quota=0.3, quota_dir="/sys/fs/cgroup/cpu/x"), "cgroup quota at /sys/fs/cgroup/cpu/x"),
    (limit(2, cpuset=2, quota=3.0, quota_dir="/x"), "cpuset"),
    (limit(2, affinity=2), "affinity"),
    (CpuLimit(4, None, None, None, None), "cpu count"),
])
def test_detected_from_names_the_input_that_bound(lim, text):
    assert Q.detected_from(lim) == text


def test_a_configured_quota_wins_and_keeps_the_detected_one_beside_it():
    q = Q.choose(2, 0.3, "cgroup quota at /g")
    assert (q.cpus, q.source, q.configured, q.detected) == (2.0, Q.CONFIG, 2.0, 0.3)
    assert q.to_dict() == {"quota_source": "config", "configured_cpus": 2.0, "detected_cpus": 0.3,
                           "detected_from": "cgroup quota at /g"}
    q = Q.choose(None, 4.5, "affinity")
    assert (q.cpus, q.source, q.configured, q.detected) == (4.5, Q.DETECTED, None, 4.5)


def test_boot_warns_when_oversubscribed_and_when_the_config_claims_more_than_detected():
    plan = resolve(2, "pinned", ROLES)
    assert plan.oversubscribed
    warnings = Q.boot_warnings(Q.choose(2, 0.3, "cgroup quota at /g"), plan)
    assert len(warnings) == 2
    assert warnings[0].startswith("profile 'pinned' runs the pinned binding OVERSUBSCRIBED on 2 CPUs (config)")
    assert warnings[1].startswith("fleet.cpus = 2 exceeds the 0.3 CPUs detected (cgroup quota at /g)")
    fits = resolve(2, "auto", ROLES)
    assert not fits.oversubscribed
    assert Q.boot_warnings(Q.choose(None, 2, "affinity"), fits) == []
    assert Q.boot_warnings(Q.choose(2, 2, "affinity"), fits) == []


@pytest.mark.parametrize("plan, text", [
    ({"quota_cpus": 2, "quota_source": "config", "detected_cpus": 0.3, "detected_from": "cgroup quota at /g"},
     "quota 2 CPUs (configured fleet.cpus; detected 0.3 CPUs from cgroup quota at /g)"),
    ({"quota_cpus": 1.5, "quota_source": "detected", "detected_cpus": 1.5, "detected_from": "cpuset"},
     "quota 1.5 CPUs (detected from cpuset)"),
    ({"quota_cpus": 8, "quota_source": "config fleet.cpus"}, "quota 8 CPUs (config fleet.cpus)"),
])
def test_status_names_both_quotas_and_their_sources(plan, text):
    assert cmd_status.quota_text(plan) == text


# --- runtime: re-detection and epochs, with a fake clock and fake readings -------------------------

from fleet.rules import pressure as PR  # noqa: E402
from fleet.runtime.config import load_config  # noqa: E402
from fleet.host.sampler import QuotaWatcher  # noqa: E402


class Clock:
    def __init__(self, now=0):
        self.now = now

    def __call__(self):
        return self.now


def test_re_detection_is_periodic_and_a_pressure_fire_makes_it_due_at_once():
    s = Q.watch_initial(Q.choose(None, 2, "affinity"), 1000, 2000)
    assert not Q.due(s, 2999) and Q.due(s, 3000)
    assert Q.due(s, 1001, pressure=True)


def test_a_change_of_the_detected_quota_starts_an_epoch():
    s = Q.watch_initial(Q.choose(None, 2, "cgroup quota at /g"), 0, 2000)
    s, change = Q.observe(s, 2000, 2000, 2.0, "cgroup quota at /g")
    assert change is None and s.epoch == 0 and s.next_check_ms == 4000
    s, change = Q.observe(s, 4000, 2000, 1.5, "cgroup quota at /g")
    assert (change.epoch, change.old.cpus, change.new.cpus, change.at_ms) == (1, 2.0, 1.5, 4000)
    assert s.epoch == 1 and s.quota.cpus == 1.5
    assert change.describe() == "detected quota 2 -> 1.5 CPUs (cgroup quota at /g): epoch 1 plans with 1.5 CPUs"
    s, change = Q.observe(s, 6000, 2000, 1.5, "cgroup quota at /g")
    assert change is None and s.epoch == 1


def test_a_failed_re_detection_keeps_the_quota_in_force():
    s = Q.watch_initial(Q.choose(None, 2, "affinity"), 0, 2000)
    s, change = Q.observe(s, 2000, 2000, None, "")
    assert change is None and s.quota.cpus == 2 and s.next_check_ms == 4000


def test_with_a_configured_quota_a_detected_change_is_logged_but_starts_no_epoch():
    s = Q.watch_initial(Q.choose(2, 0.3, "cgroup quota at /g"), 0, 2000)
    s, change = Q.observe(s, 2000, 2000, 0.5, "cgroup quota at /g")
    assert change.epoch is None and s.epoch == 0 and (s.quota.cpus, s.quota.detected) == (2, 0.5)
    assert "fleet.cpus = 2 is configured and stays in force" in change.describe()


def test_replan_says_what_a_restart_would_change():
    cfg = load_config({"roles": {"sq": {"kind": "pooled", "handler": "m:f", "slots": 2, "peak_cpus": 1}}}, env={})
    booted = resolve(8, "auto", cfg.roles)
    same = Q.replan(8, booted, cfg)
    assert same.plan is not None and same.needs_restart == ()
    assert "the same as the boot's" in same.describe(booted)
    smaller = Q.replan(2, booted, cfg)
    assert smaller.plan.binding == "serial" and "binding pinned -> serial" in smaller.needs_restart
    assert "differs from the boot's: binding pinned -> serial" in smaller.describe(booted)
    below = Q.replan(1, booted, cfg)  # budget.loop = auto: the loop ahead by priority, no reserved core
    assert below.plan.budget.share("reserve").cores == 0 and "reserve 1 cores -> 0 cores" in below.needs_restart
    refused = Q.replan(0.5, booted, cfg)  # sq declares a whole core
    assert refused.plan is None and refused.refused.startswith("BudgetOverQuota")
    assert "keeps its pinned seats as booted" in refused.describe(booted)


def test_pressure_holds_on_a_fire_and_releases_after_a_calm_window():
    stall, window = 150_000, 2_000_000  # 7.5 % stalled
    s, act = PR.observe(PR.PressureState(), 0, False, 1_000, stall, window)
    assert act is None and not s.held
    s, act = PR.observe(s, 250, True, 100_000, stall, window)
    assert act == PR.HOLD and s.held
    s, act = PR.observe(s, 500, True, 200_000, stall, window)
    assert act is None and s.held  # held once
    s, act = PR.observe(s, 750, False, 250_000, stall, window)  # 50 ms of 250: 20 %: still pressed
    assert act is None and s.calm_since_ms is None
    s, act = PR.observe(s, 1000, False, 251_000, stall, window)  # 0.4 %: calm from 750
    assert act is None and s.calm_since_ms == 750
    s, act = PR.observe(s, 2749, False, 252_000, stall, window)
    assert act is None and s.held  # 1999 ms calm < the 2 s window
    s, act = PR.observe(s, 2750, False, 252_000, stall, window)
    assert act == PR.RELEASE and not s.held


def test_pressure_that_returns_restarts_the_calm_window():
    stall, window = 150_000, 2_000_000
    s, _ = PR.observe(PR.PressureState(), 0, True, 0, stall, window)
    s, _ = PR.observe(s, 1000, False, 0, stall, window)
    s, _ = PR.observe(s, 1500, False, 200_000, stall, window)  # 40 % again
    assert s.calm_since_ms is None
    s, act = PR.observe(s, 3000, False, 200_000, stall, window)
    assert act is None and s.held  # calm only since 1500
    s, act = PR.observe(s, 3500, False, 200_000, stall, window)
    assert act == PR.RELEASE


class FakePressure:
    def __init__(self, cordon, readings):
        self.cordon, self.stall_us, self.window_us, self.path = cordon, 150_000, 2_000_000, "/g/cpu.pressure"
        self.readings = list(readings)

    def poll(self):
        return self.readings.pop(0)

    def close(self):
        pass


def _limit(cpus):
    return CpuLimit(cpus, 2, None, cpus, "/sys/fs/cgroup/cpu/g")


def test_the_watcher_re_detects_on_its_period_and_on_a_fire():
    clock, detected = Clock(0), [2.0]
    calls = []

    def detect():
        calls.append(clock.now)
        return _limit(detected[0])

    w = QuotaWatcher(Q.choose(None, 2, "x"), detect=detect, clock=clock, every_ms=2000,
                     pressure_input=FakePressure(False, [(False, 0), (True, 10), (False, 10), (False, 10)]))
    clock.now = 1000
    assert w.poll().change is None and calls == []
    clock.now = 1250  # the host-wide trigger fired: re-detect now (but it is no cordon input)
    seen = w.poll()
    assert calls == [1250] and seen.pressure is None and seen.change is None
    detected[0] = 1.0
    clock.now = 2000
    assert w.poll().change is None and calls == [1250]  # next period: 3250
    clock.now = 3250
    seen = w.poll()
    assert seen.change.epoch == 1 and w.epoch == 1 and w.quota.cpus == 1.0


def test_the_watcher_turns_own_group_pressure_into_holds_and_survives_a_failed_detection():
    clock = Clock(0)

    def detect():
        raise OSError("gone")

    w = QuotaWatcher(Q.choose(None, 2, "x"), detect=detect, clock=clock, every_ms=2000,
                     pressure_input=FakePressure(True, [(True, 100_000), (False, 100_000), (False, 100_000)]))
    clock.now = 100
    assert w.poll().pressure == PR.HOLD
    assert "quota re-detection failed: gone" in w.unavailable and w.epoch == 0
    clock.now = 1100
    assert w.poll().pressure is None
    clock.now = 2100
    assert w.poll().pressure == PR.RELEASE


def test_the_pressure_trigger_is_armed_at_the_first_poll_not_at_boot():
    armed = []

    def arm():
        armed.append(True)
        return FakePressure(True, [(True, 0)])

    w = QuotaWatcher(Q.choose(None, 2, "x"), detect=lambda: _limit(2), clock=Clock(0), arm_pressure=arm)
    assert armed == [] and w.pressure_input is None
    assert w.poll().pressure == PR.HOLD and armed == [True]
    assert w.describe().endswith("; CPU pressure on /g/cpu.pressure cordons the fleet")


def test_memory_pressure_is_a_hold_of_its_own_and_never_wakes_re_detection():
    """The memory input feeds `Seen.memory` (the cause memory-pressure), not `Seen.pressure`,
    and a fired memory trigger does not re-detect the quota. Mutations that turn it red: the
    memory reading fed to the CPU state (Seen.pressure set), its `fired` passed to `quota.due`."""
    clock, calls = Clock(0), []

    def detect():
        calls.append(clock.now)
        return _limit(2)

    memory = FakePressure(True, [(True, 100_000), (False, 100_000), (False, 100_000)])
    memory.path = "/g/memory.pressure"
    w = QuotaWatcher(Q.choose(None, 2, "x"), detect=detect, clock=clock, every_ms=2000, memory_input=memory)
    clock.now = 100
    seen = w.poll()
    assert (seen.memory, seen.pressure, calls) == (PR.HOLD, None, [])
    assert w.memory_state.held and not w.pressure_state.held
    clock.now = 1100
    assert w.poll().memory is None
    clock.now = 2100
    seen = w.poll()
    assert seen.memory == PR.RELEASE and calls == [2100]  # its period, not the trigger
    assert "; memory pressure on /g/memory.pressure (150 ms stalled in 2000 ms) cordons the fleet" in w.describe()


def test_the_memory_trigger_is_armed_at_the_first_poll_and_its_absence_is_said():
    armed = []

    def arm():
        armed.append(True)
        return None  # no own cgroup2 group: nothing to arm

    w = QuotaWatcher(Q.choose(None, 2, "x"), detect=lambda: _limit(2), clock=Clock(0), arm_memory=arm)
    assert armed == []
    assert w.poll().memory is None and armed == [True] and w.memory_input is None
    assert w.describe().endswith("; no memory pressure input (no own cgroup2 group, no PSI, or the trigger was refused)")
