"""FleetBudget.derive: the reference table, small and fractional quotas, overrides, refusals."""
import pytest

from fleet.rules.budget import (
    PINNED,
    SERIAL,
    BelowHostFloor,
    BudgetOverQuota,
    BudgetOverrides,
    FleetBudget,
    QuotaTooSmallForPinnedRoles,
    check_declared,
    declared_peaks,
    pinned_floor,
)
from fleet.rules.errors import EXIT_BELOW_HOST_FLOOR, EXIT_BUDGET_OVER_QUOTA, EXIT_QUOTA_TOO_SMALL, ConfigError
from fleet.rules.roles import REFERENCE_ROLES, Role, RoleSet


def rows(budget):
    return {s.name: (s.cores, s.threads) for s in budget.consumers}


def ov(**kw):
    return BudgetOverrides.from_mapping(kw)


# --- the pinned projection -------------------------------------------------------------

# Q: reserve, ambient (cores = threads), resolve, merge, solver cores, simdriver cores
PINNED_TABLE = {
    6: (1, 1, 1, 1, 2, 0),
    8: (1, 2, 1, 1, 3, 0),  # 002 §5, the worked table
    8.5: (1, 2, 1, 1, 3, 0.5),
    16: (1, 4, 1, 1, 9, 0),
}


@pytest.mark.parametrize("q", sorted(PINNED_TABLE))
def test_pinned_table(q):
    h, a, r, m, s, sim = PINNED_TABLE[q]
    b = FleetBudget.derive(q)
    assert rows(b) == {
        "reserve": (h, None),
        "ambient_io": (a, a),
        "resolve": (r, 1),
        "merge": (m, 1),
        "solver": (s, 6),
        "simdriver": (sim, 4),
    }
    assert b.total == q and not b.oversubscribed and b.unallocated == 0


def test_reference_table_at_8_in_order_with_admission():
    b = FleetBudget.derive(8)
    assert [s.name for s in b.consumers] == ["reserve", "ambient_io", "resolve", "merge", "solver", "simdriver"]
    assert b.share("solver").admit == 3  # concurrent walks = S, pins stay 6
    assert b.zero_share == ("poolstateupdater", "registrar", "verifier", "submitter")


def test_solver_admission_never_exceeds_its_pins():
    assert FleetBudget.derive(16).share("solver").admit == 6


@pytest.mark.parametrize("q", [2, 3, 4, 4.5, 5, 5.9])
def test_pinned_refused_below_six_with_every_consumer_listed(q):
    with pytest.raises(QuotaTooSmallForPinnedRoles) as info:
        FleetBudget.derive(q, binding=PINNED)
    err = info.value
    assert err.exit_code == EXIT_QUOTA_TOO_SMALL and err.floor_cpus == 6
    assert [n for n, _ in err.shares] == ["reserve", "ambient_io", "resolve", "merge", "solver", "simdriver"]
    assert err.cores < 2


def test_fractional_remainder_goes_only_to_io_roles():
    b = FleetBudget.derive(6.75)
    assert b.share("solver").cores == 2  # integer shares floor against 6
    assert b.share("simdriver").cores == 0.75
    assert b.total == 6.75


def test_remainder_is_split_between_io_roles():
    roles = RoleSet(
        REFERENCE_ROLES.roles + (Role("fetch", "pooled", "deferrable", peak_cpus=0, slots=2, io_bound=True),)
    )
    b = FleetBudget.derive(8.5, roles)
    assert b.share("simdriver").cores == 0.25 and b.share("fetch").cores == 0.25


def test_without_io_roles_the_remainder_is_unallocated():
    roles = RoleSet(tuple(r for r in REFERENCE_ROLES if not r.io_bound))
    b = FleetBudget.derive(8.5, roles)
    assert b.unallocated == 0.5 and b.total == 8


def test_without_a_keyed_role_whole_cores_are_headroom_for_io():
    roles = RoleSet((Role("resolve", peak_cpus=2), Role("sim", io_bound=True, peak_cpus=0, slots=4)))
    b = FleetBudget.derive(8, roles)
    assert rows(b) == {"reserve": (1, None), "ambient_io": (2, 2), "resolve": (2, 1), "sim": (3, 4)}


# --- the serial projection ---------------------------------------------------------------

SERIAL_TABLE = {  # Q: reserve, ambient cores, ambient threads, the I/O role's remainder (None: no row)
    2: (1, 0, 1, None),  # ambient folds into the reserve core: fleetd + one seat, nothing left
    3: (1, 1, 1, None),
    4: (1, 1, 1, 1),  # the whole core serial-0 leaves
    4.5: (1, 1, 1, 1.5),  # 002 §5's example: its 0.5, and that core
    5: (1, 1, 1, 2),
}


@pytest.mark.parametrize("q", sorted(SERIAL_TABLE))
def test_serial_table(q):
    h, a, at, io = SERIAL_TABLE[q]
    b = FleetBudget.derive(q, binding=SERIAL)
    expected = {"reserve": (h, None), "ambient_io": (a, at), "serial-0": (1, 1)}
    if io is not None:
        expected["simdriver"] = (io, 4)  # the reference's I/O-dominant role spends the remainder
    assert rows(b) == expected
    assert b.unallocated == 0 and b.total == q
    lanes = tuple(n for n in REFERENCE_ROLES.names if io is None or n != "simdriver")
    assert b.share("serial-0").lanes == lanes


def test_serial_remainder_is_unallocated_without_an_io_role():
    b = FleetBudget.derive(4.5, RoleSet((Role("w", slots=2),)), binding=SERIAL)
    assert rows(b) == {"reserve": (1, None), "ambient_io": (1, 1), "serial-0": (1, 1)} and b.unallocated == 1.5


def test_serial_remainder_is_unallocated_when_every_role_is_io_dominant():
    # serial-0 is theirs then: a seat of their own would leave serial-0 nobody to run
    b = FleetBudget.derive(4.5, RoleSet((Role("net", slots=8, io_bound=True),)), binding=SERIAL)
    assert b.share("serial-0").lanes == ("net",) and b.unallocated == 1.5 and not b.io_shares()


def test_serial_splits_the_remainder_evenly_between_io_roles():
    roles = RoleSet((Role("w"), Role("a", io_bound=True, slots=4), Role("b", io_bound=True, slots=4)))
    b = FleetBudget.derive(4.5, roles, binding=SERIAL)
    assert (b.share("a").cores, b.share("b").cores) == (0.75, 0.75) and b.share("serial-0").lanes == ("w",)


def test_serial_ignores_role_shares_that_fit_so_solver_minimum_does_not_apply():
    b = FleetBudget.derive(4, binding=SERIAL, overrides=ov(solver=2))  # solver 2 + resolve 1 + merge 1 = 4
    assert b.share("serial-0").cores == 1 and not b.oversubscribed


# --- floors and refusals ---------------------------------------------------------------------


@pytest.mark.parametrize("q", [0.5, 1, 1.99])
@pytest.mark.parametrize("binding", [PINNED, SERIAL])
def test_below_host_floor(q, binding):
    with pytest.raises(BelowHostFloor) as info:
        FleetBudget.derive(q, binding=binding, oversubscribe=True)
    assert info.value.exit_code == EXIT_BELOW_HOST_FLOOR


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "8", True, None, 1025, 1e9, 10**30])
def test_bad_quota_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="fleet.cpus") as info:
        FleetBudget.derive(bad)
    assert "(0, 1024]" in str(info.value)


def test_the_largest_quota_plans():
    assert FleetBudget.derive(1024).total == 1024


# --- declared peaks: every tier ------------------------------------------------------------------


def one(**kw):
    return RoleSet((Role("w", handler="m:f", **kw),))


@pytest.mark.parametrize("binding", [PINNED, SERIAL])
@pytest.mark.parametrize("forced", [False, True])
def test_a_declared_peak_over_the_quota_is_refused_on_every_binding(binding, forced):
    with pytest.raises(BudgetOverQuota) as info:
        FleetBudget.derive(2, one(peak_cpus=50), binding=binding, oversubscribe=forced)
    err = info.value
    assert err.exit_code == EXIT_BUDGET_OVER_QUOTA and (err.total, err.shares) == (50, (("w", 50),))
    assert str(err).startswith("declared shares sum to 50 cores over a quota of 2: w 50 (the roles' declared peaks")


def test_declared_peaks_add_up():
    roles = RoleSet((Role("a", peak_cpus=2), Role("b", peak_cpus=1), Role("c"), Role("d", peak_cpus=0)))
    assert check_declared(3, roles) is False  # 3 fits 3: c declares nothing, d nothing above 0
    with pytest.raises(BudgetOverQuota, match=r"sum to 3 cores over a quota of 2\.5: a 2, b 1 \(the roles' declared"):
        check_declared(2.5, roles)
    assert declared_peaks(roles) == (("a", 2), ("b", 1), ("d", 0))


def test_an_override_is_the_declaration_and_counts():
    roles = RoleSet((Role("a", peak_cpus=1), Role("b")))
    with pytest.raises(BudgetOverQuota):
        check_declared(2, roles, ov(a=1, b=2))
    assert check_declared(3, roles, ov(a=1, b=2)) is False


def test_the_keyed_roles_declared_peak_counts_too():
    roles = RoleSet((Role("k", kind="pinned", slots=2, peak_cpus=3),))
    with pytest.raises(BudgetOverQuota):
        FleetBudget.derive(2, roles, binding=SERIAL)


def test_the_reference_profile_declares_only_what_every_tier_holds():
    # the solver's share is the rule's (S), so 2 CPUs hold its declarations: resolve 1 + merge 1
    assert check_declared(2) is False and declared_peaks(REFERENCE_ROLES)[0] == ("simdriver", 0)


def test_budget_oversubscribe_accepts_peaks_over_the_quota_as_a_small_host():
    accepting = ov(oversubscribe=True)
    assert check_declared(2, one(peak_cpus=8), accepting) is True
    with pytest.raises(BudgetOverQuota):  # the pinned projection still does not fit ...
        FleetBudget.derive(2, one(peak_cpus=8), accepting, binding=PINNED)
    b = FleetBudget.derive(2, one(peak_cpus=8), accepting, binding=PINNED, oversubscribe=True)
    assert b.share("w").cores == 8 and b.oversubscribed  # ... but a forced profile runs it, marked
    assert FleetBudget.derive(2, one(peak_cpus=8), accepting, binding=SERIAL).share("serial-0").cores == 1
    assert accepting.as_dict() == {"oversubscribe": True}


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_budget_oversubscribe_is_a_bool(bad):
    with pytest.raises(ConfigError) as info:
        ov(oversubscribe=bad)
    assert info.value.path == "budget.oversubscribe"


def test_unknown_binding():
    with pytest.raises(ConfigError, match="binding"):
        FleetBudget.derive(8, binding="threads")


def test_oversubscribe_keeps_floors_and_marks_the_excess():
    b = FleetBudget.derive(4, binding=PINNED, oversubscribe=True)
    assert b.share("solver").cores == 2 and b.total == 6 and b.oversubscribed


def test_pinned_floor_is_six_for_the_reference_profile():
    assert pinned_floor() == 6


def test_pinned_floor_moves_with_overrides():
    assert pinned_floor(overrides=ov(reserve=2)) == 7
    assert pinned_floor(overrides=ov(pinned_min=3)) == 7


# --- overrides ----------------------------------------------------------------------------------


def test_ambient_override_is_terminal_and_shrinks_the_solver():
    b = FleetBudget.derive(8, overrides=ov(ambient_io=3))
    amb = b.share("ambient_io")
    assert (amb.cores, amb.threads, amb.overridden, amb.default) == (3, 3, True, 2)
    assert b.share("solver").cores == 2 and b.total == 8
    assert b.overrides() == (amb,)


def test_solver_override_leaves_headroom_to_io():
    b = FleetBudget.derive(8, overrides=ov(solver=2))
    assert b.share("solver").overridden and b.share("solver").default == 3
    assert b.share("simdriver").cores == 1 and b.total == 8


def test_solver_override_below_minimum_fails():
    with pytest.raises(QuotaTooSmallForPinnedRoles):
        FleetBudget.derive(16, overrides=ov(solver=1))


def test_pinned_min_override_changes_the_refusal_edge():
    FleetBudget.derive(6)
    with pytest.raises(QuotaTooSmallForPinnedRoles):
        FleetBudget.derive(6, overrides=ov(pinned_min=3))


def test_overrides_over_quota_fail_listing_every_consumer():
    with pytest.raises(BudgetOverQuota) as info:
        FleetBudget.derive(8, overrides=ov(solver=4, resolve=2))
    err = info.value
    assert err.exit_code == EXIT_BUDGET_OVER_QUOTA and err.total == 10
    assert [n for n, _ in err.shares] == ["reserve", "ambient_io", "resolve", "merge", "solver", "simdriver"]
    assert "solver 4" in str(err) and "resolve 2" in str(err)


def test_serial_over_quota_with_an_ambient_override():
    with pytest.raises(BudgetOverQuota):
        FleetBudget.derive(3, binding=SERIAL, overrides=ov(ambient_io=2))


def test_io_role_override_takes_whole_cores_plus_the_remainder():
    b = FleetBudget.derive(8.5, overrides=ov(simdriver=1))
    assert b.share("simdriver").cores == 1.5 and b.share("solver").cores == 2


@pytest.mark.parametrize(
    "data, path",
    [
        ({"reserve": -1}, "budget.reserve"),
        ({"ambient_io": 1.5}, "budget.ambient_io"),
        ({"pinned_min": 0}, "budget.pinned_min"),
        ({"solver": "3"}, "budget.solver"),
        ({"solver": -2}, "budget.solver"),
    ],
)
def test_bad_override_values(data, path):
    with pytest.raises(ConfigError) as info:
        BudgetOverrides.from_mapping(data)
    assert info.value.path == path


def test_override_of_an_undeclared_role():
    with pytest.raises(ConfigError) as info:
        FleetBudget.derive(8, overrides=ov(nosuch=1))
    assert info.value.path == "budget.nosuch"


def test_cpu_bound_role_takes_whole_cores():
    with pytest.raises(ConfigError, match="whole cores"):
        FleetBudget.derive(8, overrides=ov(resolve=1.5))
    roles = RoleSet((Role("resolve", peak_cpus=0.5),))
    with pytest.raises(ConfigError) as info:
        FleetBudget.derive(8, roles)
    assert info.value.path == "roles.resolve.peak_cpus"


def test_to_dict_prints_whole_numbers_as_ints():
    d = FleetBudget.derive(8).to_dict()
    assert d["sum"] == 8 and isinstance(d["sum"], int)
    assert [c["cores"] for c in d["consumers"]] == [1, 2, 1, 1, 3, 0]


# --- where the supervisor's loop runs (budget.loop) --------------------------------------------
CALL_ROLE = RoleSet((Role(name="call", handler="fleet.worker.calls:call", slots=64),))


@pytest.mark.parametrize("q, workers", [(1, 1), (1.5, 1), (2, 2), (4, 4), (7.5, 7), (64, 64)])
def test_loop_priority_gives_every_whole_core_to_the_workers(q, workers):
    b = FleetBudget.derive(q, CALL_ROLE, ov(loop="priority"))
    assert rows(b)["reserve"][0] == 0 and rows(b)["ambient_io"][0] == 0
    assert rows(b)["call"] == (workers, 64)
    assert "priority" in {s.name: s for s in b.consumers}["reserve"].rule  # plan and boot log say which rule ran


def test_loop_reserved_keeps_the_reference_reserve():
    assert rows(FleetBudget.derive(8, CALL_ROLE))["reserve"] == (1, None)
    assert rows(FleetBudget.derive(8, CALL_ROLE, ov(loop="reserved")))["call"][0] == 8 - 1 - 2
    assert rows(FleetBudget.derive(8))["reserve"] == (1, None)  # the reference profile, 002


@pytest.mark.parametrize("q", [0.05, 0.5, 0.99])
def test_loop_priority_has_no_floor_one_seat_runs_within_a_fraction(q):
    b = FleetBudget.derive(q, CALL_ROLE, ov(loop="priority"), binding=SERIAL)
    seat = b.share("serial-0")
    assert (seat.cores, seat.threads, seat.lanes) == (q, 1, ("call",)) and "below one CPU" in seat.rule
    assert b.total == q and not b.oversubscribed and b.unallocated == 0


def test_the_reference_floor_stays_at_two():
    with pytest.raises(BelowHostFloor, match="below the host floor of 2"):
        FleetBudget.derive(1.5)  # the reference profile: 002's floor, whatever the loop rule says
    with pytest.raises(BelowHostFloor, match="below the host floor of 2"):
        FleetBudget.derive(1, CALL_ROLE, ov(loop="reserved"))  # asked for: a reserved core, or nothing


@pytest.mark.parametrize("q", [0.5, 1, 1.5])
def test_loop_auto_runs_a_fleet_below_two_cpus_with_the_loop_ahead_by_priority(q):
    b = FleetBudget.derive(q, CALL_ROLE, binding=SERIAL)
    assert rows(b)["reserve"] == (0, None) and "budget.loop = auto: below 2 CPUs" in b.share("reserve").rule
    assert b.share("serial-0").cores == min(q, 1)


def test_loop_auto_keeps_the_reserved_core_from_two_cpus():
    assert rows(FleetBudget.derive(2, CALL_ROLE, binding=SERIAL))["reserve"] == (1, None)
    assert BudgetOverrides().loop == "auto" and ov(loop="auto").as_dict() == {}


def test_an_unknown_loop_rule_is_a_config_error():
    with pytest.raises(ConfigError, match="budget.loop"):
        ov(loop="spare")
