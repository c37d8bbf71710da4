"""Slots versus processes: a CPU-bound role that declares no share gets a share that
follows its slots (capped by the budget), and plan, status and the boot log say how
many worker processes each role runs on."""
from __future__ import annotations

import json
import logging

import pytest

from fleet.rules.budget import FleetBudget
from fleet.cli import fleetctl
from fleet.cli.cmd_status import render_processes
from fleet.rules.plan import resolve
from fleet.rules.processes import describe, role_processes
from fleet.rules.roles import REFERENCE_ROLES, Role, RoleSet
from fleet.rules.seats import layout
from fleet.shm.status import gather

from ..fleets import running, worker_pids


def cores(budget, name):
    return budget.share(name).cores


# --- the default share (pure) -----------------------------------------------------------


def test_a_role_without_a_declared_peak_is_marked_as_such():
    assert Role("w").peak_cpus is None and not Role("w").declares_share
    assert Role("w", peak_cpus=1).declares_share


@pytest.mark.parametrize("q, expected", [(3, 1), (4, 2), (5, 3), (6, 4), (8, 4), (16, 4)])
def test_the_default_share_follows_slots_capped_by_what_the_quota_leaves(q, expected):
    # reserve 1 + ambient max(1, floor(Q/4)) come first; the role takes the rest, up to its 4 slots
    roles = RoleSet((Role("w", handler="m:f", slots=4),))
    assert cores(FleetBudget.derive(q, roles), "w") == expected


def test_a_declared_peak_still_wins_over_slots():
    roles = RoleSet((Role("w", handler="m:f", slots=4, peak_cpus=1),))
    assert cores(FleetBudget.derive(8, roles), "w") == 1


def test_an_override_still_wins_over_slots():
    from fleet.rules.budget import BudgetOverrides

    roles = RoleSet((Role("w", handler="m:f", slots=4),))
    budget = FleetBudget.derive(8, roles, BudgetOverrides.from_mapping({"w": 2}))
    assert cores(budget, "w") == 2 and budget.share("w").overridden


def test_the_default_share_never_squeezes_a_declared_one():
    roles = RoleSet((Role("a", slots=1, peak_cpus=2), Role("w", slots=16)))
    budget = FleetBudget.derive(8, roles)  # 8 - reserve 1 - ambient 2 - a 2 = 3 left
    assert cores(budget, "a") == 2 and cores(budget, "w") == 3 and budget.total == 8


def test_the_default_share_leaves_the_elastic_role_its_minimum():
    roles = RoleSet((Role("solver", kind="pinned", slots=6, peak_cpus=3), Role("w", slots=16)))
    budget = FleetBudget.derive(8, roles)  # 8 - 1 - 2 - the solver's minimum 2 = 3 for w
    assert cores(budget, "w") == 3 and cores(budget, "solver") == 2


def test_several_default_roles_take_turns_one_core_at_a_time():
    roles = RoleSet((Role("a", slots=4), Role("b", slots=4), Role("c", slots=1)))
    budget = FleetBudget.derive(10, roles)  # 10 - 1 - 2 = 7 left: c 1, then a and b alternate
    assert (cores(budget, "a"), cores(budget, "b"), cores(budget, "c")) == (3, 3, 1)
    assert budget.total == 10


def test_no_room_left_asks_for_one_core_and_a_small_host_runs_serial():
    roles = RoleSet((Role("w", handler="m:f", slots=4),))
    plan = resolve(2, "auto", roles)
    assert plan.binding == "serial" and plan.tier_refused.error == "BudgetOverQuota"
    forced = resolve(2, "pinned", roles)
    assert forced.oversubscribed and cores(forced.budget, "w") == 1


def test_the_reference_table_is_unchanged():
    budget = FleetBudget.derive(8, REFERENCE_ROLES)
    assert [(s.name, s.cores) for s in budget.consumers] == [
        ("reserve", 1), ("ambient_io", 2), ("resolve", 1), ("merge", 1), ("solver", 3), ("simdriver", 0)]


# --- processes per role (pure) ------------------------------------------------------------


def _rows(q, roles, profile="auto"):
    plan = resolve(q, profile, roles)
    lay = layout(plan, roles, list(range(q)))
    return role_processes({**lay.to_meta(), "slot_roles": [s.role for s in lay.slots]}, roles)


def test_processes_count_the_seats_that_run_a_role():
    roles = RoleSet((Role("w", handler="m:f", slots=4),))
    assert [(r["role"], r["slots"], r["processes"]) for r in _rows(4, roles)] == [("w", 4, 2)]
    assert [(r["role"], r["slots"], r["processes"]) for r in _rows(2, roles)] == [("w", 4, 1)]


@pytest.mark.parametrize("row, text", [
    ({"role": "w", "slots": 4, "processes": 1}, "w: 4 slots on 1 worker process: at most 1 unit at once (a CPU-bound process runs one at a time)"),
    ({"role": "w", "slots": 4, "processes": 2}, "w: 4 slots on 2 worker processes: at most 2 units at once (a CPU-bound process runs one at a time)"),
    ({"role": "w", "slots": 2, "processes": 2}, "w: 2 slots on 2 worker processes"),
    ({"role": "w", "slots": 1, "processes": 1}, "w: 1 slot on 1 worker process"),
    ({"role": "w", "slots": 8, "processes": 1, "io_bound": True},
     "w: 8 slots on 1 worker process, I/O-bound: up to 8 units at once"),
    ({"role": "w", "slots": 2, "processes": 1, "shared_with": ["v"]},
     "w: 2 slots on 1 worker process shared with v: at most 1 unit at once (a CPU-bound process runs one at a time)"),
    ({"role": "w", "slots": 4, "processes": 5, "shared_with": ["u", "v"], "io_bound": True},
     "w: 4 slots on any of 5 worker processes shared with u, v, I/O-bound: up to 4 units at once"),
    ({"role": "w", "slots": 1, "processes": 5, "shared_with": ["v"]}, "w: 1 slot on any of 5 worker processes shared with v"),
    ({"role": "w", "slots": 2, "processes": 0}, "w: 2 slots, no worker process (no handler: declared, not run)"),
])
def test_describe(row, text):
    assert describe(row) == text


def test_serial_roles_share_their_one_process():
    roles = RoleSet((Role("a", handler="m:f", slots=2), Role("b", handler="m:f", slots=3)))
    rows = _rows(2, roles)
    assert [(r["role"], r["processes"], r["shared_with"]) for r in rows] == [("a", 1, ["b"]), ("b", 1, ["a"])]


# --- fleetctl plan -----------------------------------------------------------------------


W_TOML = '[fleet]\nname = "w"\n[roles.w]\nhandler = "tests.handlers:square"\nslots = 4\n'


@pytest.mark.parametrize("q, text", [("2", "w: 4 slots on 1 worker process"), ("4", "w: 4 slots on 2 worker processes"),
                                     ("8", "w: 4 slots on 4 worker processes")])
def test_plan_says_how_many_processes_a_role_gets(tmp_path, capsys, q, text):
    path = tmp_path / "w.toml"
    path.write_text(W_TOML)
    assert fleetctl.main(["plan", "--cpus", q, "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"  {text}" in out
    assert fleetctl.main(["plan", "--cpus", q, "--config", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["role"], r["slots"]) for r in doc["role_processes"]] == [("w", 4)]
    assert describe(doc["role_processes"][0]).startswith(text)


# --- a real fleet ------------------------------------------------------------------------


def _issue_case(fleet_name, cpus):
    # the issue's case: one CPU-bound role, slots = 4, no peak_cpus declared
    return {"fleet": {"name": fleet_name, "cpus": cpus},
            "roles": {"w": {"kind": "pooled", "handler": "tests.handlers:nap_whoami", "slots": 4}}}


def test_slots_4_runs_on_2_processes_where_the_budget_leaves_2_cores(fleet_name, caplog):
    # 4 CPUs: reserve 1 + ambient 1 leave 2 cores, so the role's 4 slots run on 2 workers
    caplog.set_level(logging.INFO, logger="fleet")
    with running(_issue_case(fleet_name, 4)) as f:
        pids = worker_pids(f)
        assert len(pids) == 2
        ran_on = {fut.result(timeout=60) for fut in [f.submit("w", 0.1) for _ in range(8)]}
        assert ran_on == pids
        doc = gather(fleet_name)
        assert [(r["role"], r["slots"], r["processes"]) for r in doc["role_processes"]] == [("w", 4, 2)]
        assert "processes w: 4 slots on 2 worker processes" in "\n".join(render_processes(doc["role_processes"]))
    assert any("w: 4 slots on 2 worker processes" in r.getMessage() for r in caplog.records)


def test_on_2_cpus_status_and_the_boot_log_say_1_process(fleet_name, caplog, capsys):
    caplog.set_level(logging.INFO, logger="fleet")
    with running(_issue_case(fleet_name, 2)) as f:
        assert len(worker_pids(f)) == 1
        assert fleetctl.main(["status", "--name", fleet_name]) == 0
        out = capsys.readouterr().out
        assert "w: 4 slots on 1 worker process: at most 1 unit at once" in out
    assert any("w: 4 slots on 1 worker process" in r.getMessage() for r in caplog.records)
