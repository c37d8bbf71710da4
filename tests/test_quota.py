"""The quota a fleet plans with (pure): its sources, boot warnings, and runtime epochs."""
from __future__ import annotations

import pytest

from fleet import quota as Q
from fleet.cgroup import CpuLimit
from fleet.cli import cmd_status
from fleet.plan import resolve
from fleet.roles import Role, RoleSet

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
