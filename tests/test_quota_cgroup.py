"""The quota a fleet plans with, shown with its sources, from a real fleetd inside a real
v1 cpu cgroup this test makes (and removes, even when it fails)."""
from __future__ import annotations

import signal

import pytest

from tests.cgroups import FleetdInGroup, cpu_group
from tests.daemons import BOUND_S, wait_until
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


def _census(d):
    return {row["slot"]: row for row in d.ctl_json("status")["census"]}


@pytest.mark.root
def test_a_quota_change_at_runtime_starts_an_epoch_and_releases_pins(fleet_name):
    """A real fleetd in a real v1 cpu cgroup; the test changes the group's quota twice while
    the fleet runs: each change is detected, logged, shown in status, and releases pins;
    an in-flight deferrable unit drains (T7) and still completes."""
    roles = {
        "solver": role("keyed", kind="pinned", slots=2),
        "bg": role("hang", cordon_class="deferrable", slots=1),
    }
    with cpu_group(2.0) as group:
        d = FleetdInGroup(fleet_name, roles, group)
        try:
            d.start()
            doc = d.ctl_json("status")
            assert doc["quota"] == {"epoch": 0, "cpus": 2, "detected_cpus": 2, "booted_cpus": 2, "source": "detected"}
            assert doc["plan"]["detected_from"] == f"cgroup quota at {group.path}"
            with d.connect() as client:
                assert client.submit("solver", 1, key="a").result(BOUND_S) is not None
                assert client.submit("solver", 2, key="b").result(BOUND_S) is not None
                pinned = {s for s, r in _census(d).items() if r["state"] == "Pinned"}
                assert len(pinned) == 2
                sleeper = client.submit("bg", 3.0)  # in flight across the epoch boundary
                wait_until(lambda: any(r["state"] == "Running" and r["role"] == "bg" for r in _census(d).values()),
                           "the deferrable unit running")

                group.set_quota(1.0)
                doc = wait_until(lambda: (s := d.ctl_json("status"))["quota"]["epoch"] == 1 and s, "epoch 1")
                assert doc["quota"]["cpus"] == 1 and doc["quota"]["detected_cpus"] == 1
                census = {r["slot"]: r for r in doc["census"]}
                assert all(census[s]["state"] == "Idle" for s in pinned), census  # T9
                bg = next(r for r in census.values() if r["role"] == "bg")
                assert bg["state"] in ("Draining", "Idle"), bg  # T7 (Idle once it finished)
                assert sleeper.result(BOUND_S) == "woke"  # the in-flight unit completed
                err = d.stderr()
                assert "[fleet-posture]" in err and "detected quota 2 -> 1 CPUs" in err and "epoch 1 plans with 1 CPUs" in err
                assert "epoch 1: no plan fits: BelowHostFloor" in err, err
                out = d.ctl("status").stdout
                assert "quota     epoch 1: plans with 1 CPUs (detected); booted with 2 CPUs" in out, out

                group.set_quota(2.0)
                wait_until(lambda: d.ctl_json("status")["quota"]["epoch"] == 2, "epoch 2")
                assert "detected quota 1 -> 2 CPUs" in d.stderr()
                assert "epoch 2: budget re-derived: serial binding" in d.stderr()
                assert client.submit("solver", 3, key="a").result(BOUND_S) is not None  # pins again
                assert sum(r["state"] == "Pinned" for r in _census(d).values()) == 1
            d.signal(signal.SIGTERM)
            assert d.wait() == 0
        finally:
            d.cleanup()
