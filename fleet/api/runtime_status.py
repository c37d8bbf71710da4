"""`fleet.runtime_status()`: the live view of a fleet (002 §14), or, before any fleet is
built, the default profile's projection on this host.

The view (`fleet.shm.status.runtime_view`): the plan (fleet_booted, profile, quota_cpus,
binding, oversubscribed, tier_refused), the budget table (the seat/share rows) and the
census, one row per slot with its lane-to-thread binding. A live fleet's comes from its
table (the same read `fleetctl status` makes, which prints it under ``runtime_status``);
the projection plans the built-in reference profile for the quota detected now, on this
process's CPUs, with ``fleet_booted: false``.
"""
from __future__ import annotations

from admission.records import replace
import os

from fleet.rules.errors import FleetError
from fleet.shm import status

#: The handler a projection gives the reference profile's roles (which name none): a
#: projection lays seats out only for roles that could run, and it imports nothing.
PROJECTED_HANDLER = "dry.run:unit"


def runtime_status(fleet=None) -> dict:
    """The runtime view of `fleet` (a `fleet.Fleet`, a `fleet.Executor` or a running fleet's
    name); without one, of the fleet this process runs, or the default profile's
    projection (``fleet_booted: false``) while it runs none.

    Raises FleetError when this process runs several fleets and none is named (which one
    would be a guess), and NotRunning for a name no fleet on this host runs under.
    """
    if fleet is None:
        from fleet.runtime.loop import running_here

        live = running_here()
        if len(live) > 1:
            names = ", ".join(sup.name for sup in live)
            raise FleetError(f"this process runs {len(live)} fleets ({names}): name one, runtime_status(fleet)")
        if not live:
            return default_projection()
        name = live[0].name
    elif isinstance(fleet, str):
        name = fleet
    else:
        sup = getattr(fleet, "_sup", None)  # a Fleet's, an Executor's
        if sup is None:
            raise TypeError(f"runtime_status() takes a Fleet, an Executor or a fleet's name, got {type(fleet).__name__}")
        name = sup.name
    return status.runtime_view(status.gather(name))


def default_projection() -> dict:
    """The built-in reference profile projected on this host: the view before any fleet."""
    from fleet.rules.roles import RoleSet
    from fleet.runtime.config import load_config

    config = load_config(None, env=os.environ)
    roles = RoleSet(tuple(r if r.handler else replace(r, handler=PROJECTED_HANDLER)
                          for r in config.roles))
    config = replace(config, roles=roles)
    return status.runtime_view(status.gather_projection(config, config.name))
