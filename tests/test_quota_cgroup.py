"""The quota a fleet plans with, shown with its sources, from a real fleetd inside a real
v1 cpu cgroup this test makes (and removes, even when it fails)."""
from __future__ import annotations

import signal

import pytest

from tests.cgroups import FleetdInGroup, cpu_group
from tests.fleets import role


@pytest.mark.root
def test_status_shows_the_configured_and_the_detected_quota_and_boot_warns(fleet_name):
    roles = {"sq": role("square", slots=2)}
    with cpu_group(0.3) as group:
        d = FleetdInGroup(fleet_name, roles, group, fleet={"cpus": 2, "profile": "pinned"})
        try:
            d.start()
            assert d.proc.pid in group.pids()
            plan = d.ctl_json("status")["plan"]
            assert (plan["quota_cpus"], plan["quota_source"], plan["configured_cpus"]) == (2, "config", 2)
            assert plan["detected_cpus"] == 0.3 and plan["detected_from"] == f"cgroup quota at {group.path}"
            assert plan["oversubscribed"] is True

            out = d.ctl("status")
            assert out.returncode == 0, out.stderr
            assert (f"quota 2 CPUs (configured fleet.cpus; detected 0.3 CPUs from cgroup quota at {group.path})"
                    in out.stdout), out.stdout

            err = d.stderr()
            assert "WARNING" in err and "runs the pinned binding OVERSUBSCRIBED on 2 CPUs (config)" in err, err
            assert f"fleet.cpus = 2 exceeds the 0.3 CPUs detected (cgroup quota at {group.path})" in err, err
            d.signal(signal.SIGTERM)
            assert d.wait() == 0
        finally:
            d.cleanup()
