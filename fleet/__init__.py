"""fleet: a host-level worker runtime for Python.

This module is the public face: the user's API, what README.md and docs/ show users
writing (tests/test_exports.py pins it). Everything else lives in its wing and may move.
"""
from fleet._version import __version__

# Every name loads on first use (PEP 562): `import fleet` costs nothing more, so a
# process that needs one part (`fleetctl status`, the fork server, which this package's
# import precedes) pays for that part alone, and `from fleet import Executor` loads the
# executor's face and what it needs to start: name -> the module that defines it.
_LAZY = {
    "Refused": "admission.errors",
    "Route": "admission.route",
    "BootRefused": "fleet.rules.errors",
    "ConfigError": "fleet.rules.errors",
    "FleetError": "fleet.rules.errors",
    "NotRunning": "fleet.rules.errors",
    **dict.fromkeys([
        "BadUnit", "Draining", "FleetClosed", "NotInsideUnit", "Outcome", "PayloadTooLarge", "PayloadUnpicklable",
        "QueueFull", "RoleStopped", "SubmitRefused", "Suppress", "Unit", "UnitError", "UnitFailed",
        "UnitSuppressed", "current_unit", "report_cost",
    ], "fleet.rules.unit"),
    "Executor": "fleet.api.executor",
    "Fleet": "fleet.api.fleet",
    "Client": "fleet.api.client",
    "connect": "fleet.api.client",
    "runtime_status": "fleet.api.runtime_status",
    "current_fleet": "fleet.worker.inside",
    "FleetConnectionLost": "fleet.api.client",
    "SubmitUncertain": "fleet.api.client",
    "RequestIdReused": "fleet.service.replays",
    "UnitBroken": "fleet.rules.raised",
    "RoleBroken": "fleet.rules.raised",
    "UnknownRoleError": "fleet.rules.roles",
    "BelowHostFloor": "fleet.rules.budget",
    "BudgetOverQuota": "fleet.rules.budget",
    "QuotaTooSmallForPinnedRoles": "fleet.rules.budget",
    "PostureCauseError": "fleet.rules.posture",
    "PostureRetuneError": "fleet.rules.posture",
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
    # the two faces of a fleet, and the client of a running fleetd
    "Executor",
    "Fleet",
    "connect",
    "Client",
    # the live view of a fleet (the plan, the budget, the census), or the default projection
    "runtime_status",
    # what a handler receives, raises and reports; what a caller gets back
    "Unit",
    "Route",
    "Refused",
    "Suppress",
    "current_unit",
    "current_fleet",
    "report_cost",
    "Outcome",
    # the errors a user catches
    "FleetError",
    "ConfigError",
    "BootRefused",
    "BelowHostFloor",
    "QuotaTooSmallForPinnedRoles",
    "BudgetOverQuota",
    "SubmitRefused",
    "BadUnit",
    "QueueFull",
    "Draining",
    "PayloadTooLarge",
    "PayloadUnpicklable",
    "RoleStopped",
    "RoleBroken",
    "UnknownRoleError",
    "RequestIdReused",
    "FleetClosed",
    "UnitError",
    "UnitFailed",
    "UnitSuppressed",
    "UnitBroken",
    "PostureCauseError",
    "PostureRetuneError",
    "NotRunning",
    "NotInsideUnit",
    "UntrustedPeer",
    "FleetConnectionLost",
    "SubmitUncertain",
]
