"""fleet.runtime_status() (002 §14): before any fleet is built, the default profile's
projection with fleet_booted false; once one runs, its live view (plan, budget, census
with each entry's binding) read from its table; `fleetctl status --json` carries it
under ``runtime_status`` beside its own keys."""
from __future__ import annotations

import json

import pytest

import fleet
from fleet.cli import fleetctl
from fleet.rules.errors import EXIT_NOT_RUNNING
from fleet.runtime.loop import running_here
from tests.fleets import config, role, running

PLAN_KEYS = {"fleet_booted", "profile", "quota_cpus", "binding", "oversubscribed", "tier_refused"}


def _cfg(name: str) -> dict:
    cfg = config(name, {"sq": role("square", slots=2, peak_cpus=0), "io": role("echo", slots=3, peak_cpus=0,
                                                                               io_bound=True)})
    cfg["fleet"]["cpus"] = 2
    return cfg


def test_before_any_fleet_the_default_profile_projection(monkeypatch):
    """002 §5's own example, Q = 4.5 on the reference profile: the serial tier, with the
    pinned tier it fell from; the I/O role on a shared seat of its own, the rest logical."""
    assert running_here() == []
    monkeypatch.setenv("FLEET_CPUS", "4.5")
    view = fleet.runtime_status()
    assert view["fleet_booted"] is False and set(view["plan"]) == PLAN_KEYS
    plan = view["plan"]
    assert (plan["fleet_booted"], plan["profile"], plan["quota_cpus"], plan["binding"], plan["oversubscribed"]) == (
        False, "auto", 4.5, "serial", False)
    assert plan["tier_refused"]["tier"] == "pinned"
    assert plan["tier_refused"]["error"] == "QuotaTooSmallForPinnedRoles"
    assert {c["name"] for c in view["budget"]["consumers"]} == {"reserve", "ambient_io", "serial-0", "simdriver"}
    bindings = {(row["role"], row["binding"]) for row in view["census"]}
    assert ("simdriver", "shared") in bindings and ("solver", "logical") in bindings
    assert all(row["pid"] is None and row["state"] is None for row in view["census"])


def test_after_boot_the_live_view_and_back_to_the_projection(fleet_name):
    with running(_cfg(fleet_name)) as f:
        f.submit("sq", 3).result(60)
        view = fleet.runtime_status()
        assert fleet.runtime_status(f)["plan"] == view["plan"]
        assert fleet.runtime_status(fleet_name)["plan"] == view["plan"]
        assert (view["fleet"], view["fleet_booted"], view["plan"]["fleet_booted"]) == (fleet_name, True, True)
        plan = view["plan"]
        assert (plan["quota_cpus"], plan["binding"]) == (2, f.plan.binding)
        assert plan["oversubscribed"] is f.plan.oversubscribed
        assert view["quota"]["epoch"] == 0
        assert [c["name"] for c in view["budget"]["consumers"]] == [c.name for c in f.plan.budget.consumers]
        census = view["census"]
        assert len(census) == 5  # 2 sq slots + 3 io slots
        seats = {s.name: s.binding for s in f.layout.seats}
        for row in census:
            assert row["state"] is not None and row["pid"] and row["binding"] == seats[row["seat_name"]]
    assert fleet.runtime_status()["fleet_booted"] is False  # stopped: the projection again


def test_two_fleets_need_a_name(fleet_name):
    with running(_cfg(fleet_name)), running(_cfg(fleet_name + "b")) as g:
        with pytest.raises(fleet.FleetError, match="runs 2 fleets"):
            fleet.runtime_status()
        assert fleet.runtime_status(g)["fleet"] == fleet_name + "b"
    with pytest.raises(TypeError):
        fleet.runtime_status(3)


def test_fleetctl_status_json_carries_it_under_a_key(fleet_name, tmp_path, capsys):
    with running(_cfg(fleet_name)):
        assert fleetctl.main(["status", "--name", fleet_name, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
    assert {"fleet", "fleet_booted", "plan", "budget", "census", "ledger", "posture", "queues"} <= set(doc)
    view = doc["runtime_status"]
    assert view["fleet_booted"] is True and set(view["plan"]) == PLAN_KEYS
    assert [row["slot"] for row in view["census"]] == [row["slot"] for row in doc["census"]]
    path = tmp_path / "fleet.toml"
    path.write_text(f'[fleet]\nname = "{fleet_name}"\ncpus = 2\n[roles.sq]\nkind = "pooled"\n'
                    'handler = "tests.handlers:square"\nslots = 2\npeak_cpus = 0\n')
    assert fleetctl.main(["status", "--config", str(path), "--json"]) == EXIT_NOT_RUNNING
    doc = json.loads(capsys.readouterr().out)
    assert doc["fleet_booted"] is False and doc["runtime_status"]["fleet_booted"] is False
    assert [(r["role"], r["seat_name"], r["binding"]) for r in doc["runtime_status"]["census"]] == [
        (s["role"], s["seat_name"], s["binding"]) for s in doc["slots"]] and len(doc["slots"]) == 2
