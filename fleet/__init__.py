"""fleet: a host-level worker runtime for Python.

The public face is re-exported here; everything else may move.
"""
from fleet.rules.errors import BootRefused, ConfigError, FleetError, NotRunning
from fleet.rules.unit import (
    BadUnit,
    FleetClosed,
    Outcome,
    PayloadTooLarge,
    PayloadUnpicklable,
    QueueFull,
    RoleStopped,
    SubmitRefused,
    Suppress,
    Unit,
    UnitError,
    UnitFailed,
    UnitSuppressed,
    current_unit,
    report_cost,
)

# Heavier parts load on first use (PEP 562), so that `fleetctl status`, which imports
# this package, starts fast: name -> module that defines it.
_LAZY = {
    "BelowHostFloor": "rules.budget",
    "BudgetOverQuota": "rules.budget",
    "BudgetOverrides": "rules.budget",
    "FleetBudget": "rules.budget",
    "QuotaTooSmallForPinnedRoles": "rules.budget",
    "FleetConfig": "runtime.config",
    "load_config": "runtime.config",
    "TierPlan": "rules.plan",
    "PostureCauseError": "rules.posture",
    "PostureOwner": "rules.posture",
    "PosturePolicy": "rules.posture",
    "PostureRetuneError": "rules.posture",
    "REFERENCE_ROLES": "rules.roles",
    "Role": "rules.roles",
    "RoleSet": "rules.roles",
    "UnknownRoleError": "rules.roles",
    "Fleet": "api.executor",
    "Executor": "api.pool",
    "UnitBroken": "rules.raised",
    "RoleBroken": "rules.raised",
    "Client": "service.client",
    "FleetConnectionLost": "service.client",
    "SubmitUncertain": "service.client",
    "RequestIdReused": "service.replays",
    "connect": "service.client",
    "Refused": "rules.outcomes",
    "Route": "route",
    "UntrustedPeer": "host.trust",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fleet' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "BadUnit",
    "Client",
    "Executor",
    "Fleet",
    "FleetConnectionLost",
    "FleetClosed",
    "Outcome",
    "PayloadTooLarge",
    "PayloadUnpicklable",
    "QueueFull",
    "Refused",
    "RequestIdReused",
    "RoleStopped",
    "Route",
    "SubmitRefused",
    "SubmitUncertain",
    "Suppress",
    "Unit",
    "UnitError",
    "UnitFailed",
    "UnitSuppressed",
    "UnitBroken",
    "RoleBroken",
    "BelowHostFloor",
    "BootRefused",
    "BudgetOverQuota",
    "BudgetOverrides",
    "ConfigError",
    "FleetBudget",
    "FleetConfig",
    "FleetError",
    "PostureCauseError",
    "PostureOwner",
    "PosturePolicy",
    "PostureRetuneError",
    "QuotaTooSmallForPinnedRoles",
    "REFERENCE_ROLES",
    "Role",
    "RoleSet",
    "TierPlan",
    "UnknownRoleError",
    "NotRunning",
    "UntrustedPeer",
    "connect",
    "current_unit",
    "load_config",
    "report_cost",
    "__version__",
]
