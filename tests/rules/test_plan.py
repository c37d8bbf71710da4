"""The tier plan: auto tiers, forced profiles, oversubscription and refusals (002 §14)."""
import pytest

from fleet.rules import errors
from fleet.rules.budget import BelowHostFloor, BudgetOverQuota, BudgetOverrides, QuotaTooSmallForPinnedRoles
from fleet.rules.errors import ConfigError
from fleet.rules.plan import resolve


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
