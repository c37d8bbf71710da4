"""Seat and slot layout from a tier plan (pure)."""
from __future__ import annotations

from admission.records import replace

from fleet.rules.plan import resolve
from fleet.rules.roles import REFERENCE_ROLES, Role, RoleSet
from fleet.rules.seats import NO_SEAT, layout

ACTIVE = RoleSet(tuple(replace(r, handler="m:f") for r in REFERENCE_ROLES))


def test_serial_one_seat_holds_every_slot_on_the_core_after_the_reserve():
    plan = resolve(2, "auto", ACTIVE)
    out = layout(plan, ACTIVE, [0, 1])
    assert [(s.name, s.cpus, s.binding) for s in out.seats] == [("serial-0", (1,), "logical")]
    assert len(out.slots) == sum(r.slots for r in ACTIVE)
    assert {s.seat for s in out.slots} == {0}


def test_pinned_reference_layout_at_q8():
    plan = resolve(8, "auto", ACTIVE)
    out = layout(plan, ACTIVE, list(range(8)))
    seats = {s.name: s for s in out.seats}
    # reserve cpu 0, ambient 1-2, then resolve 3, merge 4, solver 5-7 (3 seats, 6 pins)
    assert seats["resolve-0"].cpus == (3,) and seats["merge-0"].cpus == (4,)
    assert [seats[f"solver-{k}"].cpus for k in range(3)] == [(5,), (6,), (7,)]
    assert all(seats[f"solver-{k}"].binding == "pinned" for k in range(3))
    solver_slots = out.slots_of("solver")
    assert len(solver_slots) == 6
    assert sorted(out.seat_of(s) for s in solver_slots) == sorted([seats[f"solver-{k}"].index for k in range(3)] * 2)
    # roles with no whole core share the ambient CPUs
    assert seats["simdriver-0"].cpus == (1, 2) and seats["simdriver-0"].binding == "shared"
    assert seats["verifier-0"].binding == "shared"


def test_forced_pinned_on_a_small_host_wraps_its_cpus():
    roles = RoleSet((Role("work", handler="m:f", peak_cpus=2, slots=8),))
    plan = resolve(2, "pinned", roles)
    assert plan.oversubscribed
    out = layout(plan, roles, [0, 1])
    assert [s.cpus for s in out.seats] == [(0,), (1,)]
    assert [out.seat_of(s) for s in range(4)] == [0, 1, 0, 1]


def test_roles_without_a_handler_get_slots_but_no_seat():
    roles = RoleSet((Role("work", handler="m:f"), Role("idle", handler=None, slots=2)))
    out = layout(resolve(2, "auto", roles), roles, [0, 1])
    assert [s.seat for s in out.slots] == [0, NO_SEAT, NO_SEAT]
    assert out.seats[0].roles == ("work",)


def test_meta_lists_seats_and_slot_seats():
    roles = RoleSet((Role("work", handler="m:f", slots=2),))
    meta = layout(resolve(2, "auto", roles), roles, [0, 1]).to_meta()
    assert meta["slot_seats"] == [0, 0] and meta["seats"][0]["name"] == "serial-0"


def test_the_supervisor_runs_on_the_reserve_and_ambient_cpus():
    roles = RoleSet((Role("work", handler="m:f", slots=2),))
    assert layout(resolve(2, "auto", roles), roles, [0, 1]).supervisor_cpus == (0,)
    plan = resolve(8, "auto", ACTIVE)
    assert layout(plan, ACTIVE, list(range(8))).supervisor_cpus == (0, 1, 2)


def test_a_role_may_lease_the_slots_of_every_seat_whose_cpu_share_it_may_use():
    """Slots switch roles (002 §3.4) within CPU shares: the serial seat takes every role;
    pinned, a role with whole cores keeps its seats, roles without share the shared seats."""
    out = layout(resolve(2, "auto", ACTIVE), ACTIVE, [0, 1])
    assert out.seats[0].roles == ACTIVE.names and all(out.seats_for(r) == (0,) for r in ACTIVE.names)
    out = layout(resolve(8, "auto", ACTIVE), ACTIVE, list(range(8)))
    seats = {s.name: s for s in out.seats}
    sharing = ("simdriver", "poolstateupdater", "registrar", "verifier", "submitter")
    for role in sharing:
        assert set(seats[f"{role}-0"].roles) == set(sharing)
        assert {out.seats[s].name for s in out.seats_for(role)} == {f"{r}-0" for r in sharing}
    assert seats["resolve-0"].roles == ("resolve",) and seats["solver-0"].roles == ("solver",)
    assert {out.seats[s].name for s in out.seats_for("solver")} == {"solver-0", "solver-1", "solver-2"}


def test_meta_role_slots_are_the_most_a_role_may_hold_on_a_seat():
    out = layout(resolve(8, "auto", ACTIVE), ACTIVE, list(range(8)))
    meta = {s["name"]: s for s in out.to_meta()["seats"]}
    # simdriver's seat holds its 4 slots; verifier's seat holds 1, so simdriver may hold 1 there
    assert meta["simdriver-0"]["role_slots"]["simdriver"] == 4
    assert meta["verifier-0"]["role_slots"] == {r: 1 for r in meta["verifier-0"]["roles"]}
    assert meta["solver-0"]["role_slots"] == {"solver": 2}


def test_serial_remainder_gives_the_io_roles_a_seat_of_their_own_on_the_cpus_serial_0_leaves():
    # 002 §5's example: Q = 4.5 on 5 CPUs. reserve cpu 0, ambient 1, serial-0 2; the
    # remainder (1.5) is the I/O roles': a seat on cpus 3 and 4, its ceiling.
    plan = resolve(4.5, "auto", ACTIVE)
    out = layout(plan, ACTIVE, list(range(5)))
    seats = {s.name: s for s in out.seats}
    assert seats["serial-0"].cpus == (2,) and "simdriver" not in seats["serial-0"].roles
    io = seats["simdriver-0"]
    assert (io.cpus, io.binding, io.roles) == ((3, 4), "shared", ("simdriver",))
    assert {out.seat_of(s) for s in out.slots_of("simdriver")} == {io.index}
    assert {out.seat_of(s) for s in out.slots_of("solver")} == {seats["serial-0"].index}


def test_serial_without_a_remainder_keeps_io_roles_on_serial_0():
    out = layout(resolve(3, "auto", ACTIVE), ACTIVE, list(range(3)))
    assert [s.name for s in out.seats] == ["serial-0"] and "simdriver" in out.seats[0].roles


def test_below_one_cpu_one_seat_on_one_cpu():
    from fleet.rules.budget import BudgetOverrides

    roles = RoleSet((Role("call", handler="m:f", slots=1), Role("net", handler="m:g", io_bound=True, slots=4)))
    plan = resolve(0.5, "auto", roles, BudgetOverrides.from_mapping({"loop": "priority"}))
    out = layout(plan, roles, [0, 1])
    assert [(s.name, s.cpus, s.roles) for s in out.seats] == [("serial-0", (0,), ("call", "net"))]
    assert {s.seat for s in out.slots} == {0} and out.supervisor_cpus == ()


def test_pinned_io_role_takes_the_cpu_its_fraction_runs_on():
    # 8.5 CPUs, the reference profile: simdriver's 0.5 is the remainder, on the ninth CPU
    out = layout(resolve(8.5, "auto", ACTIVE), ACTIVE, list(range(9)))
    seats = {s.name: s for s in out.seats}
    assert (seats["simdriver-0"].cpus, seats["simdriver-0"].binding) == ((8,), "pinned")
    assert "simdriver" not in seats["verifier-0"].roles and seats["verifier-0"].cpus == (1, 2)
    # a declared whole core and the fraction: two CPUs
    roles = RoleSet((Role("w", handler="m:f", slots=2), Role("net", handler="m:g", io_bound=True, slots=4,
                                                                peak_cpus=1)))
    plan = resolve(4.5, "auto", roles)
    assert plan.binding == "pinned" and plan.budget.share("net").cores == 1.5
    net = [s for s in layout(plan, roles, list(range(5))).seats if "net" in s.roles]
    assert [s.cpus for s in net] == [(3,), (4,)]
