"""fleet: a host-level worker runtime for Python.

The public face is re-exported here; everything else may move.
"""
from .errors import BootRefused, ConfigError, FleetError, NotRunning
from .unit import (
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
    "BelowHostFloor": "budget",
    "BudgetOverQuota": "budget",
    "BudgetOverrides": "budget",
    "FleetBudget": "budget",
    "QuotaTooSmallForPinnedRoles": "budget",
    "FleetConfig": "config",
    "load_config": "config",
    "TierPlan": "plan",
    "PostureCauseError": "posture",
    "PostureOwner": "posture",
    "PosturePolicy": "posture",
    "PostureRetuneError": "posture",
    "REFERENCE_ROLES": "roles",
    "Role": "roles",
    "RoleSet": "roles",
    "UnknownRoleError": "roles",
    "Fleet": "executor",
    "Client": "client",
    "FleetConnectionLost": "client",
    "SubmitUncertain": "client",
    "RequestIdReused": "replays",
    "connect": "client",
    "Refused": "outcomes",
    "Route": "route",
    "UntrustedPeer": "trust",
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
