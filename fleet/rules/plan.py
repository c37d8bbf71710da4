"""The tier plan: which binding a quota runs, as one pure function of the budget.

    host CPUs        "auto" resolves to    what runs
    < 2              refused               nothing: BelowHostFloor (exit 80)
    2 .. pinned floor - 1   serial         one seat, every role a lane on it
    >= pinned floor  pinned                one process per seat, pinned to its cores

The pinned floor is not a constant: it is the least quota on which the pinned
projection of `FleetBudget` fits (6 CPUs for the reference profile, 002 §14), so
overrides that grow the fixed shares move it, and no call site decides a tier on
its own. A plan that falls back to serial carries the QuotaTooSmallForPinnedRoles
it fell from in `tier_refused`.

Forced profiles (`pinned` or `serial`) are honoured on any host of 2 CPUs or more.
A forced pinned profile below the pinned floor runs the pinned seats anyway, marked
`oversubscribed`, with `tier_refused` naming the floor it overrode: never a silent
narrowing. Forced serial always fits a 2-CPU host.

What no profile overrides: the roles' declared peaks must fit the quota
(`fleet.rules.budget.check_declared`, checked first, on every tier); a config that
declares more is refused with BudgetOverQuota (exit 84), not narrowed to serial. Only
the fleet's own structure not fitting (reserve, ambient runtime, the keyed role's
minimum) makes a host small.

A fractional quota says so (`fractional_note`): below one CPU one seat runs within the
fraction (with the loop ahead by priority, `budget.loop = "priority"`: the
Executor's); above it, the fraction (and any whole core no share takes) is the
I/O-dominant roles' remainder.
"""
from __future__ import annotations

import math

from admission.records import record
from fleet.rules.budget import (
    NO_OVERRIDES,
    PINNED,
    SERIAL,
    BudgetOverQuota,
    BudgetOverrides,
    FleetBudget,
    QuotaTooSmallForPinnedRoles,
    check_declared,
    json_number,
)
from fleet.rules.errors import ConfigError
from fleet.rules.roles import REFERENCE_ROLES, RoleSet

AUTO = "auto"
PROFILES = (AUTO, SERIAL, PINNED)


@record
class TierRefusal:
    """The tier a plan could not take, and why (serialised as ``tier_refused``)."""

    tier: str
    error: str
    floor_cpus: int | None
    message: str

    def to_dict(self) -> dict:
        return {"tier": self.tier, "error": self.error, "floor_cpus": self.floor_cpus, "message": self.message}


@record
class TierPlan:
    """What a quota runs: the requested profile, the binding it resolved to, the budget."""

    profile: str
    binding: str
    quota_cpus: float
    oversubscribed: bool
    tier_refused: TierRefusal | None
    budget: FleetBudget

    def to_dict(self) -> dict:
        """``{"plan": {...}, "budget": {...}}`` as `fleetctl plan --json` prints it."""
        plan = {
            "profile": self.profile,
            "binding": self.binding,
            "quota_cpus": json_number(self.quota_cpus),
            "oversubscribed": self.oversubscribed,
            "tier_refused": None if self.tier_refused is None else self.tier_refused.to_dict(),
            "fractional": fractional_note(self),
        }
        return {"plan": plan, "budget": self.budget.to_dict()}


def _refusal(exc: QuotaTooSmallForPinnedRoles | BudgetOverQuota) -> TierRefusal:
    # A fixed-share overflow names its floor as the whole CPUs its shares need.
    floor = getattr(exc, "floor_cpus", None) or math.ceil(getattr(exc, "total", 0)) or None
    return TierRefusal(PINNED, type(exc).__name__, floor, str(exc))


def resolve(
    quota: float,
    profile: str = AUTO,
    roles: RoleSet = REFERENCE_ROLES,
    overrides: BudgetOverrides = NO_OVERRIDES,
) -> TierPlan:
    """Resolve the tier and the budget for `quota` CPUs.

    Args:
        quota: effective CPUs (fractional allowed).
        profile: ``auto``, ``serial`` or ``pinned``.
        roles, overrides: as for `FleetBudget.derive`.
    Raises:
        BelowHostFloor: quota < 2 (with the loop on a reserved core), whatever the profile.
        BudgetOverQuota: the roles' declared peaks exceed the quota, whatever the
            profile; or the chosen projection does not fit (overrides too large).
        ConfigError: unknown profile or a bad quota.
    """
    if profile not in PROFILES:
        raise ConfigError("fleet.profile", f"unknown profile {profile!r}; one of {', '.join(PROFILES)}")
    check_declared(quota, roles, overrides)  # before any tier: no profile runs a declaration past the quota
    if profile == SERIAL:
        return _serial(quota, profile, roles, overrides, None)
    try:
        budget = FleetBudget.derive(quota, roles, overrides, PINNED)
    except (QuotaTooSmallForPinnedRoles, BudgetOverQuota) as exc:
        # Either way the pinned projection does not fit this quota: below the pinned
        # floor, auto runs serial and a forced pinned profile runs oversubscribed.
        # Declared peaks that overflow are a small host; overrides that overflow are
        # an operator's mistake, refused as such.
        if isinstance(exc, BudgetOverQuota) and _has_overrides(overrides):
            raise
        if profile == AUTO:
            return _serial(quota, profile, roles, overrides, _refusal(exc))
        budget = FleetBudget.derive(quota, roles, overrides, PINNED, oversubscribe=True)
        return TierPlan(profile, PINNED, float(quota), True, _refusal(exc), budget)
    return TierPlan(profile, PINNED, float(quota), budget.oversubscribed, None, budget)


def _has_overrides(ov: BudgetOverrides) -> bool:
    return any(v is not None for v in (ov.reserve, ov.ambient_io, ov.pinned_min)) or bool(ov.roles)


def _serial(quota, profile, roles, overrides, refused):
    budget = FleetBudget.derive(quota, roles, overrides, SERIAL)
    return TierPlan(profile, SERIAL, float(quota), budget.oversubscribed, refused, budget)


def fractional_note(plan: TierPlan) -> str | None:
    """What a fractional quota means for `plan`, in one line (None: a whole quota).
    `fleetctl plan` prints it and boot logs it."""
    budget, q = plan.budget, plan.quota_cpus
    fraction = budget.fraction
    if not fraction:
        return None
    cpus = f"quota {json_number(q)} CPUs is fractional"
    if q < 1:
        seat = next((s for s in budget.consumers if s.kind == "seat"), None)
        where = "one worker seat (serial-0) runs every unit within it" if seat is not None else \
            "the roles' seats share it"
        return f"{cpus}, below one CPU: {where}, pinned to one CPU"
    spenders = budget.io_shares()
    if spenders:
        spent = ", ".join(f"{s.name} {json_number(s.cores)}" for s in spenders)
        return (f"{cpus}: the {json_number(fraction)} beyond {int(q - fraction)} whole CPUs is spendable by "
                f"I/O-dominant roles only, and they have it: {spent} cores")
    return (f"{cpus}: the {json_number(fraction)} beyond {int(q - fraction)} whole CPUs is spendable by "
            "I/O-dominant roles only; none is declared, so it stays unallocated")
