"""The quota a fleet plans with, shown with its sources, from a real fleetd inside a real
v1 cpu cgroup this test makes (and removes, even when it fails)."""
from __future__ import annotations

import os
import signal

import pytest

from fleet.host import cgroup
from fleet.rules import pressure, quota
from fleet.host.sampler import PressureInput, QuotaWatcher
from tests.cgroups import FleetdInGroup, busy, cpu_group, v2_group
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
                # In flight across the epoch boundary: long enough to be caught Draining
                # even when detection (every 2 s) is slow on a loaded machine.
                sleeper = client.submit("bg", 15.0)
                wait_until(lambda: any(r["state"] == "Running" and r["role"] == "bg" for r in _census(d).values()),
                           "the deferrable unit running")

                group.set_quota(1.0)
                doc = wait_until(lambda: (s := d.ctl_json("status"))["quota"]["epoch"] == 1 and s, "epoch 1")
                assert doc["quota"]["cpus"] == 1 and doc["quota"]["detected_cpus"] == 1
                census = {r["slot"]: r for r in doc["census"]}
                assert all(census[s]["state"] == "Idle" for s in pinned), census  # T9
                bg = next(r for r in census.values() if r["role"] == "bg")
                assert bg["state"] == "Draining", bg  # T7: it finishes, then goes Idle (T8)
                assert sleeper.result(BOUND_S) == "woke"  # the in-flight unit completed
                assert _census(d)[bg["slot"]]["state"] == "Idle"
                err = d.stderr()
                assert "[fleet-posture]" in err and "detected quota 2 -> 1 CPUs" in err and "epoch 1 plans with 1 CPUs" in err
                # one CPU could host the fleet (its loop ahead by priority), but not the two cores
                # its roles declare
                assert "epoch 1: no plan fits: BudgetOverQuota: declared shares sum to 2 cores" in err, err
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


# --- CPU pressure (PSI) as a cordon input -----------------------------------------------------------


@pytest.mark.root
def test_a_real_psi_trigger_on_a_loaded_group_holds_then_releases():
    """The watcher's pressure input on a real cgroup2 group's cpu.pressure: four busy
    loops on this host's CPUs stall each other, the kernel trigger fires, the watcher
    says HOLD; once they are gone it says RELEASE after a calm window."""
    with v2_group() as group:
        watcher = QuotaWatcher(quota.choose(None, 2, "test"), detect=lambda: cgroup.effective_cpus(),
                               pressure_input=PressureInput(os.path.join(group.path, "cpu.pressure"), cordon=True))
        load = busy(group, 2 * len(os.sched_getaffinity(0)))
        try:
            wait_until(lambda: watcher.poll().pressure == pressure.HOLD, "a pressure HOLD", every=0.1)
            assert watcher.pressure_state.held
        finally:
            for proc in load:
                proc.kill()
                proc.wait()
        wait_until(lambda: watcher.poll().pressure == pressure.RELEASE, "a pressure RELEASE", every=0.1)
        watcher.close()


@pytest.mark.root
def test_fleetd_in_a_pressured_group_cordons_with_the_cpu_pressure_cause(fleet_name):
    """A real fleetd in its own cgroup2 group (as under a service manager): load in that
    group cordons the fleet (cause cpu-pressure) and, once gone, the posture returns."""
    roles = {"sq": role("square", slots=2)}
    with v2_group() as group:
        d = FleetdInGroup(fleet_name, roles, group, posture={"cordon_exit_clean_ms": 1000})
        try:
            d.start()
            assert d.proc.pid in group.pids()
            wait_until(lambda: f"CPU pressure on {group.path}/cpu.pressure cordons the fleet" in d.stderr(),
                       "the pressure input armed")
            # A loaded machine may stall the group's own idle processes a little: let it settle.
            wait_until(lambda: d.ctl_json("status")["posture"]["state"] == "Nominal", "Nominal before the load")
            load = busy(group, 2 * len(os.sched_getaffinity(0)))
            try:
                doc = wait_until(lambda: (p := d.ctl_json("status")["posture"])["cause"] == "cpu-pressure" and p,
                                 "the cpu-pressure cordon")
                assert doc["state"] == "Cordoned"
                assert "held by cpu-pressure" in d.stderr()
            finally:
                for proc in load:
                    proc.kill()
                    proc.wait()
            wait_until(lambda: d.ctl_json("status")["posture"]["state"] == "Nominal", "Nominal again")
            with d.connect() as client:
                assert client.submit("sq", 6).result(BOUND_S) == 36
            d.signal(signal.SIGTERM)
            assert d.wait() == 0
        finally:
            d.cleanup()

