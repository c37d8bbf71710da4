"""fleet: a host-level worker runtime for Python.

The public face is re-exported here; everything else may move.
"""
from .errors import BootRefused, ConfigError, FleetError
from .roles import REFERENCE_ROLES, Role, RoleSet, UnknownRoleError

__version__ = "0.1.0"

__all__ = [
    "BootRefused",
    "ConfigError",
    "FleetError",
    "REFERENCE_ROLES",
    "Role",
    "RoleSet",
    "UnknownRoleError",
    "__version__",
]
