"""fleet: a host-level worker runtime for Python.

The public face is re-exported here; everything else may move.
"""
from fleet._version import __version__
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
# this package, starts fast: name -> the module that defines it.
_LAZY = {
    "BelowHostFloor": "fleet.rules.budget",
    "BudgetOverQuota": "fleet.rules.budget",
    "BudgetOverrides": "fleet.rules.budget",
    "FleetBudget": "fleet.rules.budget",
    "QuotaTooSmallForPinnedRoles": "fleet.rules.budget",
    "FleetConfig": "fleet.runtime.config",
    "load_config": "fleet.runtime.config",
    "TierPlan": "fleet.rules.plan",
    "PostureCauseError": "fleet.rules.posture",
    "PostureOwner": "fleet.rules.posture",
    "PosturePolicy": "fleet.rules.posture",
    "PostureRetuneError": "fleet.rules.posture",
    "REFERENCE_ROLES": "fleet.rules.roles",
    "Role": "fleet.rules.roles",
    "RoleSet": "fleet.rules.roles",
    "UnknownRoleError": "fleet.rules.roles",
    "Fleet": "fleet.api.executor",
    "Executor": "fleet.api.pool",
    "UnitBroken": "fleet.rules.raised",
    "RoleBroken": "fleet.rules.raised",
    "Client": "fleet.service.client",
    "FleetConnectionLost": "fleet.service.client",
    "SubmitUncertain": "fleet.service.client",
    "RequestIdReused": "fleet.service.replays",
    "connect": "fleet.service.client",
    "Refused": "fleet.rules.outcomes",
    "Route": "admission.route",
    "UntrustedPeer": "fleet.host.trust",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fleet' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


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
