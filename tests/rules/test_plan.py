"""The tier plan: auto tiers, forced profiles, oversubscription and refusals (002 §14)."""
import pytest

from fleet.rules import errors
from fleet.rules.budget import BelowHostFloor, BudgetOverQuota, BudgetOverrides, QuotaTooSmallForPinnedRoles
from fleet.rules.errors import ConfigError
from fleet.rules.plan import fractional_note, resolve


@pytest.mark.parametrize("q", [2, 3, 4, 4.5, 5, 5.99])
def test_auto_runs_serial_from_2_to_below_6_carrying_the_pinned_refusal(q):
    plan = resolve(q)
    assert (plan.profile, plan.binding, plan.oversubscribed) == ("auto", "serial", False)
    refused = plan.tier_refused
    assert (refused.tier, refused.error, refused.floor_cpus) == ("pinned", "QuotaTooSmallForPinnedRoles", 6)
    assert plan.budget.binding == "serial"


@pytest.mark.parametrize("q", [6, 8, 16, 6.5])
def test_auto_runs_pinned_from_6(q):
    plan = resolve(q)
    assert (plan.binding, plan.oversubscribed, plan.tier_refused) == ("pinned", False, None)


@pytest.mark.parametrize("profile", ["auto", "serial", "pinned"])
@pytest.mark.parametrize("q", [0.5, 1, 1.5])
def test_below_two_cpus_is_refused_whatever_the_profile(q, profile):
    with pytest.raises(BelowHostFloor) as info:
        resolve(q, profile)
    assert info.value.exit_code == errors.EXIT_BELOW_HOST_FLOOR


@pytest.mark.parametrize("q", [2, 4, 5])
def test_forced_pinned_below_the_floor_is_oversubscribed_and_names_the_floor(q):
    plan = resolve(q, "pinned")
    assert (plan.binding, plan.oversubscribed) == ("pinned", True)
    assert plan.tier_refused.floor_cpus == 6 and "pinned floor is 6" in plan.tier_refused.message
    assert plan.budget.share("solver").cores == 2 and plan.budget.total > q


def test_forced_pinned_on_a_big_host_is_plain_pinned():
    plan = resolve(8, "pinned")
    assert (plan.binding, plan.oversubscribed, plan.tier_refused) == ("pinned", False, None)


@pytest.mark.parametrize("q", [2, 8, 16])
def test_forced_serial_is_honoured_on_any_host_from_2(q):
    plan = resolve(q, "serial")
    assert (plan.binding, plan.oversubscribed, plan.tier_refused) == ("serial", False, None)


def test_overrides_move_the_tier_edge():
    grown = BudgetOverrides.from_mapping({"reserve": 2})
    assert resolve(6, overrides=grown).binding == "serial"
    assert resolve(7, overrides=grown).binding == "pinned"


def test_overrides_that_fit_no_tier_are_refused():
    with pytest.raises(BudgetOverQuota):
        resolve(2, overrides=BudgetOverrides.from_mapping({"ambient_io": 2}))


def test_unknown_profile():
    with pytest.raises(ConfigError) as info:
        resolve(8, "turbo")
    assert info.value.path == "fleet.profile"


def test_boot_refusals_have_distinct_exit_codes():
    codes = {
        BelowHostFloor.exit_code,
        QuotaTooSmallForPinnedRoles.exit_code,
        BudgetOverQuota.exit_code,
        errors.EXIT_CONFIG,
        errors.EXIT_FAILURE,
        errors.EXIT_USAGE,
    }
    assert len(codes) == 6
    assert all(issubclass(e, errors.BootRefused) for e in (BelowHostFloor, QuotaTooSmallForPinnedRoles, BudgetOverQuota))


def test_plan_dict_shape():
    d = resolve(4, "pinned").to_dict()
    assert set(d) == {"plan", "budget"}
    assert {"profile", "binding", "quota_cpus", "oversubscribed", "tier_refused"} <= set(d["plan"])
    assert d["plan"]["tier_refused"]["floor_cpus"] == 6
    assert d["budget"]["sum"] == 6 and d["budget"]["oversubscribed"] is True


def test_a_role_set_without_a_keyed_role_runs_serial_on_a_small_host():
    from fleet.rules.roles import Role, RoleSet

    roles = RoleSet((Role("work", peak_cpus=1, slots=8),))
    auto = resolve(2, "auto", roles)
    assert auto.binding == "serial" and auto.tier_refused.error == "BudgetOverQuota"
    assert auto.tier_refused.floor_cpus == 3
    forced = resolve(2, "pinned", roles)
    assert forced.binding == "pinned" and forced.oversubscribed
    assert resolve(3, "auto", roles).binding == "pinned"


# --- declared peaks refused on every tier; forced profiles keep only what 002 allows -------------


@pytest.mark.parametrize("profile", ["auto", "serial", "pinned"])
def test_declared_peaks_over_the_quota_are_refused_whatever_the_profile(profile):
    from fleet.rules.roles import Role, RoleSet

    roles = RoleSet((Role("w", handler="m:f", peak_cpus=50),))
    with pytest.raises(BudgetOverQuota) as info:
        resolve(2, profile, roles)
    assert info.value.exit_code == errors.EXIT_BUDGET_OVER_QUOTA and "sum to 50 cores over a quota of 2: w 50 (the roles' declared peaks" in str(info.value)


def test_declared_peaks_that_fit_on_a_host_too_small_for_the_structure_run_serial():
    from fleet.rules.roles import Role, RoleSet

    roles = RoleSet((Role("a", peak_cpus=1), Role("b", peak_cpus=1)))  # 2 fit 2; reserve + ambient do not
    plan = resolve(2, "auto", roles)
    assert plan.binding == "serial" and plan.tier_refused.error == "BudgetOverQuota"
    forced = resolve(2, "pinned", roles)  # 002 §14: a forced pinned profile runs its floors, marked
    assert forced.binding == "pinned" and forced.oversubscribed
    with pytest.raises(BudgetOverQuota):
        resolve(2, "pinned", RoleSet((Role("a", peak_cpus=2), Role("b", peak_cpus=1))))


def test_an_accepted_oversubscription_runs_as_declared():
    from fleet.rules.roles import Role, RoleSet

    roles = RoleSet((Role("w", handler="m:f", peak_cpus=8, slots=8),))
    accepting = BudgetOverrides.from_mapping({"loop": "priority", "oversubscribe": True})
    plan = resolve(2, "pinned", roles, accepting)  # fleet.Executor(max_workers=8, oversubscribe=True)
    assert plan.oversubscribed and plan.budget.share("w").cores == 8
    assert resolve(2, "auto", roles, accepting).binding == "serial"  # auto: a small host


# --- fractional quotas ------------------------------------------------------------------------------


PRIORITY = BudgetOverrides.from_mapping({"loop": "priority"})


def _call_roles():
    from fleet.rules.roles import Role, RoleSet

    return RoleSet((Role("call", handler="m:f", slots=1),))


@pytest.mark.parametrize("q", [0.1, 0.5, 0.9])
def test_below_one_cpu_the_executors_loop_rule_runs_one_seat_and_says_so(q):
    plan = resolve(q, "auto", _call_roles(), PRIORITY)
    assert (plan.binding, plan.oversubscribed) == ("serial", False)
    assert plan.budget.share("serial-0").cores == q
    note = fractional_note(plan)
    assert note.startswith(f"quota {q:g} CPUs is fractional, below one CPU: one worker seat") and "pinned" in note
    assert plan.to_dict()["plan"]["fractional"] == note


def test_below_one_cpu_a_forced_pinned_profile_is_marked_oversubscribed():
    plan = resolve(0.5, "pinned", _call_roles(), PRIORITY)
    assert plan.binding == "pinned" and plan.oversubscribed


def test_a_whole_quota_is_not_fractional():
    assert fractional_note(resolve(8)) is None and resolve(8).to_dict()["plan"]["fractional"] is None


def test_the_remainder_at_4_5_goes_to_the_io_role_and_the_plan_says_so():
    plan = resolve(4.5)  # 002 §5's example, on the reference profile: serial
    assert plan.binding == "serial" and plan.budget.share("simdriver").cores == 1.5
    assert "the 0.5 beyond 4 whole CPUs" in fractional_note(plan) and "simdriver 1.5" in fractional_note(plan)


def test_a_remainder_nobody_may_spend_is_said_to_stay_unallocated():
    from fleet.rules.roles import Role, RoleSet

    plan = resolve(4.5, "auto", RoleSet((Role("w", handler="m:f", slots=2),)))
    assert plan.budget.unallocated and "stays unallocated" in fractional_note(plan)
