"""fleet: a host-level worker runtime for Python.

The public face is re-exported here; everything else may move.
"""
from .budget import BelowHostFloor, BudgetOverQuota, BudgetOverrides, FleetBudget, QuotaTooSmallForPinnedRoles
from .config import FleetConfig, load_config
from .errors import BootRefused, ConfigError, FleetError, NotRunning
from .plan import TierPlan
from .posture import PostureOwner, PosturePolicy, PostureRetuneError
from .roles import REFERENCE_ROLES, Role, RoleSet, UnknownRoleError
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
)
from .executor import Fleet
from .client import Client, FleetConnectionLost, connect

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
    "RoleStopped",
    "SubmitRefused",
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
    "connect",
    "load_config",
    "__version__",
]
