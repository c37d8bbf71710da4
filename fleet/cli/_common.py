"""Pieces every fleetctl subcommand shares: picking the fleet, reaching its daemon.

Kept light: `fleetctl status` imports it too and must start fast, so the control
protocol (fleet.control) is imported only by the commands that use the socket.
"""
from __future__ import annotations

import json
import os

from ..errors import EXIT_OK

#: The fleet a command talks to when neither --name nor FLEET_NAME says otherwise:
#: the name a config without ``[fleet] name`` gets (fleet.config.FleetConfig.name;
#: a test keeps the two equal, so status need not import the config module).
DEFAULT_NAME = "fleet"


def default_name(env=None) -> str:
    """``$FLEET_NAME`` if set and non-empty, else the config default (``fleet``)."""
    env = os.environ if env is None else env
    return env.get("FLEET_NAME") or DEFAULT_NAME


def add_name_argument(parser) -> None:
    parser.add_argument(
        "--name",
        default=None,
        metavar="NAME",
        help=f"the fleet to talk to (default: $FLEET_NAME, else {DEFAULT_NAME!r})",
    )


def fleet_name(args) -> str:
    """The fleet named by ``--name``, else by the environment, else the default."""
    return args.name or default_name()


def client(args, timeout: float = 30.0):
    """A `ControlClient` for the chosen fleet; raises NotRunning (exit 69) when it has no socket."""
    from ..control import ControlClient

    return ControlClient.for_fleet(fleet_name(args), timeout=timeout)


def call_and_print(args, op: str, **op_args) -> int:
    """Run ``op`` on the chosen fleet's daemon and print its reply (JSON with ``--json``).

    The op's client half (`fleet.control.Op.format`) renders the reply, so each
    command's wording lives beside its wire format.
    """
    from ..control import OPS

    with client(args) as c:
        result = c.call(op, **op_args)
    print(json.dumps(result, indent=2) if getattr(args, "json", False) else OPS.get(op).format(result))
    return EXIT_OK
