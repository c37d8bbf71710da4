"""Role switching on real fleets (002 §3.4): a slot is not a role's for life.

An Idle slot is leased (T1) for whichever role's unit comes next, within that role's
budget count, on the seats whose CPU share the role may use; a Pinned slot keeps its
role and key. The census counts each slot's switches.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest

from tests.fleets import config, role, running, worker_pids

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _census(f) -> dict:
    return {row["slot"]: row for row in f.status()["census"]}


def test_a_slot_serves_role_a_then_role_b(fleet_name):
    cfg = config(fleet_name, {"a": role("whoami", slots=1), "b": role("whoami", slots=1)}, profile="serial")
    with running(cfg) as f:
        assert f.submit("a", "first").result(60)[0] == "first"
        (slot,) = [s for s, row in _census(f).items() if row["last_role"] == "a"]
        assert _census(f)[slot]["switches"] == 0
        value, pid = f.submit("b", "second").result(60)
        row = _census(f)[slot]
        # the slot role a left Idle took role b's unit: T5 then T1 with the role field set to b
        assert (value, row["last_role"], row["switches"], row["state"]) == ("second", "b", 1, "Idle")
        assert pid in worker_pids(f)
        assert sum(r["switches"] for r in _census(f).values()) == 1


def test_pooled_roles_use_every_shared_seat(fleet_name):
    """Pinned binding: roles without whole cores share the shared CPUs, so each may run on
    every shared seat (each seat is its own worker process)."""
    roles = {"a": role("nap_in_order", slots=2, peak_cpus=0), "b": role("whoami", slots=2, peak_cpus=0)}
    with running(config(fleet_name, roles, profile="pinned")) as f:
        shared = [s for s in f.layout.seats if s.binding == "shared"]
        assert len(shared) == 2 and all(set(s.roles) == {"a", "b"} for s in shared)
        # two units of a at once: its count is 2, and its seats take turns
        futures = [f.submit("a", (0.3, i)) for i in range(2)]
        for fut in futures:
            fut.result(60)
        rows = [r for r in _census(f).values() if r["last_role"] == "a"]
        assert len(rows) == 2 and {r["seat"] for r in rows} == {s.index for s in shared}


def test_a_role_never_holds_more_than_its_count_while_others_idle(fleet_name):
    cfg = config(fleet_name, {"one": role("hang", slots=1), "many": role("echo", slots=6)}, profile="serial")
    with running(cfg) as f:
        futures = [f.submit("one", 0.2) for _ in range(4)]
        deadline = time.monotonic() + 30
        while not any(r["state"] == "Running" for r in _census(f).values()) and time.monotonic() < deadline:
            time.sleep(0.01)
        held = [r for r in _census(f).values() if r["role"] == "one"]
        assert len(held) == 1  # six Idle slots, yet role one holds one: its count
        assert [fut.result(60) for fut in futures] == ["woke"] * 4


def _sampler(name: str, counts: dict) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tests.role_census_sampler", name, json.dumps(counts)],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"sampler said {line!r}"
    return proc


def _stop(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate("stop\n", timeout=60)
    return json.loads(out.strip().splitlines()[-1])


STRESS_ROLES = {
    "solver": role("keyed", kind="pinned", slots=3, peak_cpus=1),
    "merge": role("whoami", kind="singleton", slots=1, peak_cpus=0),
    "sim": role("hang", slots=2, peak_cpus=0),
    "resolve": role("spin", slots=1, peak_cpus=0),
    "bg": role("echo", slots=1, peak_cpus=0),
}


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("profile", ["serial", "pinned"])
def test_under_a_random_stress_no_role_exceeds_its_count_and_no_pin_switches(fleet_name, profile, seed):
    """Random units of five roles; a second process samples the slot words throughout.
    A fourth solver key waits while the three pins are held (no elastic re-pin): it gets
    a pin only at the epoch boundary after the watch (a config reload)."""
    rng = random.Random(seed)
    counts = {name: spec["slots"] for name, spec in STRESS_ROLES.items()}
    with running(config(fleet_name, STRESS_ROLES, profile=profile)) as f:
        # Three keys take the three pins first; bin3 comes only with the random units.
        assert [f.submit("solver", None, key=f"bin{k}").result(60)[0] for k in range(3)] == ["bin0", "bin1", "bin2"]
        sampler = _sampler(fleet_name, counts)
        try:
            futures, late = [], []
            # Pooled roles first, then everyone: the singleton's first lease takes a slot
            # the pooled roles served (a switch), then all mix.
            for phase, names, n in ((1, ["sim", "resolve", "bg"], 100), (2, list(STRESS_ROLES), 500)):
                for _ in range(n):
                    name = rng.choice(names)
                    fut, key = _submit(f, rng, name)
                    (late if key == "bin3" else futures).append(fut)
                    if rng.random() < 0.05:
                        time.sleep(rng.random() * 0.01)  # let the fleet drain now and then
                if phase == 1:
                    for fut in futures:
                        fut.exception(120)
            for fut in futures:
                assert fut.exception(120) is None
            waiting = sum(not fut.done() for fut in late)
        finally:
            report = _stop(sampler)
        assert report["samples"] > 0 and not report["over_count"], report
        assert not report["pin_switches"], report
        census = _census(f)
        solver = f._sup.roles.code("solver")
        pins = f._sup.inspect(lambda s: s.dispatcher.pinned_keys(solver))
        assert late and waiting == len(late)  # bin3 waited: every pin stayed with its key
        f.operations.reload(f._sup.config)  # an epoch boundary: pins are released (T9), bin3 gets one
        assert [fut.result(120)[0] for fut in late] == ["bin3"] * len(late)
        assert "bin3" in f._sup.inspect(lambda s: s.dispatcher.pinned_keys(solver)) and f._sup.inspect(lambda s: s.dispatcher.repins[solver]) == 0
    assert report["max_held"]["solver"] == 3  # three keys took their pins, and kept them
    assert set(pins) == {"bin0", "bin1", "bin2"}
    for slot in pins.values():
        assert census[slot]["last_role"] == "solver" and census[slot]["state"] == "Pinned"
    # slots switched roles: the singleton's, and those the released pins went back to
    assert sum(row["switches"] for row in census.values()) > 0


def _submit(f, rng, name):
    """(future, key) of one random unit of `name`."""
    if name == "solver":
        key = f"bin{rng.randrange(4)}"
        return f.submit(name, None, key=key), key
    if name == "sim":
        return f.submit(name, rng.choice((0, 0.001, 0.003))), None
    if name == "resolve":
        return f.submit(name, rng.randrange(50, 500)), None
    return f.submit(name, rng.random()), None


@pytest.mark.parametrize("profile", ["serial", "pinned"])
def test_restart_intensity_stops_only_the_role_whose_units_died(fleet_name, profile):
    """Slots switch roles, so a seat is no role's: a death counts for the roles of the
    units its worker ran, and a role that keeps killing its worker stops alone."""
    roles = {"die": role("die", slots=1, peak_cpus=0), "echo": role("echo", slots=1, peak_cpus=0)}
    from fleet.rules.unit import RoleStopped

    cfg = config(fleet_name, roles, profile=profile, restart={"max_restarts": 2, "within_seconds": 60})
    with running(cfg) as f:
        for _ in range(3):
            assert f.submit("die").exception(60).reason == "LaneDeath"
        deadline = time.monotonic() + 30
        while f._sup.roles.code("die") not in f._sup.inspect(lambda s: set(s.role_stops.view)) and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(RoleStopped):
            f.submit("die")
        assert f.submit("echo", "still served").result(60) == "still served"


def test_an_io_role_runs_concurrently_on_another_roles_shared_seat(fleet_name):
    """Every seat an I/O-bound role may land on runs its units at once: the worker sizes
    its I/O runner by the most slots each role may hold on the seat, not by home slots."""
    roles = {"io": role("together", slots=4, peak_cpus=0, io_bound=True), "other": role("echo", slots=4, peak_cpus=0)}
    roles["io"]["handler"] = "tests.io_handlers:together"
    with running(config(fleet_name, roles, profile="pinned")) as f:
        payload = {"want": 2, "patience": 5.0, "hold": 0.2}
        results = [fut.result(60) for fut in [f.submit("io", payload) for _ in range(4)]]
        by_pid: dict = {}
        for peak, pid, _start, _end in results:
            by_pid.setdefault(pid, []).append(peak)
        assert len(by_pid) == 2  # the io role's turns went to both shared seats
        assert all(max(peaks) == 2 for peaks in by_pid.values()), by_pid  # two at once on each
