"""Pieces every fleetctl subcommand shares: picking the fleet, reaching its daemon.

Kept light: `fleetctl status` imports it too and must start fast, so the control
protocol (fleet.service.control) is imported only by the commands that use the socket.
"""
from __future__ import annotations

import os

from fleet.rules.errors import EXIT_USAGE, FleetError


class NameConflict(FleetError):
    """``fleetctl --name A CMD --name B`` with A != B: no silent pick."""

    exit_code = EXIT_USAGE


class NameNotApplicable(FleetError):
    """``fleetctl --name A CMD`` where CMD addresses no fleet (plan, leases, store)."""

    exit_code = EXIT_USAGE

#: The fleet a command talks to when neither --name nor FLEET_NAME says otherwise:
#: the name a config without ``[fleet] name`` gets (fleet.runtime.config.FleetConfig.name;
#: a test keeps the two equal, so status need not import the config module).
DEFAULT_NAME = "fleet"


def default_name(env=None) -> str:
    """``$FLEET_NAME`` if set and non-empty, else the config default (``fleet``)."""
    env = os.environ if env is None else env
    return env.get("FLEET_NAME") or DEFAULT_NAME


#: Where the fleet name comes from, in order; `fleetctl --help` and each command's
#: --name help say it, so the precedence is written once.
NAME_PRECEDENCE = f"--name (before or after the command), else $FLEET_NAME, else {DEFAULT_NAME!r}"
#: Namespace attribute of the --name given before the command (fleetctl's own option);
#: the one given after it lands in ``name``. fleetctl.main merges the two.
GLOBAL_NAME_DEST = "global_name"
#: The same for --trust-uid: before the command, and after it (``trust_uids``).
GLOBAL_TRUST_DEST = "global_trust_uids"
#: fleetctl's options that take a value, so the command word can be found past them.
GLOBAL_VALUE_OPTIONS = ("--name", "--trust-uid")


def add_name_argument(parser, dest: str = "name") -> None:
    """The one --name option, and --trust-uid with it (whom to believe about that
    fleet): on fleetctl itself (dest `GLOBAL_NAME_DEST`) and on each command that
    addresses a fleet (dest ``name``)."""
    parser.add_argument(
        "--name",
        dest=dest,
        default=None,
        metavar="NAME",
        help=f"the fleet to talk to (precedence: {NAME_PRECEDENCE})",
    )
    parser.add_argument(
        "--trust-uid",
        dest=GLOBAL_TRUST_DEST if dest == GLOBAL_NAME_DEST else "trust_uids",
        action="append",
        type=uid_argument,
        default=None,
        metavar="UID",
        help="also believe a fleetd, table and socket directory of this uid or user (repeatable); "
        "by default only this uid's and root's are believed, anything else is refused (exit 85)",
    )


def uid_argument(text: str) -> int:
    """A --trust-uid value: a uid, or a user name looked up in the password database."""
    import argparse
    import pwd

    if text.isdigit():
        from fleet.host.trust import MAX_UID

        if int(text) <= MAX_UID:
            return int(text)
        raise argparse.ArgumentTypeError(f"{text!r} is not a uid (at most {MAX_UID})")
    try:
        return pwd.getpwnam(text).pw_uid
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a uid nor a user name") from None


def merge_trust(args) -> tuple[int, ...]:
    """Every --trust-uid of a parsed command line, before and after the command; sets
    ``args.trust_uids`` to them. NameNotApplicable if given to a command that addresses
    no fleet."""
    before = getattr(args, GLOBAL_TRUST_DEST, None) or []
    if before and not hasattr(args, "trust_uids"):
        raise NameNotApplicable(f"--trust-uid {before[0]}: this command addresses no fleet")
    merged = tuple(before) + tuple(getattr(args, "trust_uids", None) or ())
    if hasattr(args, "trust_uids"):
        args.trust_uids = merged
    return merged


def merge_names(args) -> str | None:
    """The explicit --name of a parsed command line, validated, or None if none was given.

    Sets ``args.name`` to it. Raises:
        NameConflict: --name before and after the command disagree.
        NameNotApplicable: --name given to a command that addresses no fleet.
        InvalidFleetName: the name breaks the fleet-name rule (fleet.rules.names).
    """
    from fleet.rules.names import InvalidFleetName, validate_fleet_name

    before = getattr(args, GLOBAL_NAME_DEST, None)
    takes_name = hasattr(args, "name")
    after = getattr(args, "name", None)
    if before is not None and after is not None and before != after:
        raise NameConflict(f"--name {before!r} before the command and --name {after!r} after it disagree; give one")
    if before is not None and not takes_name:
        raise NameNotApplicable(f"--name {before!r}: this command addresses no fleet")
    chosen = after if after is not None else before
    if chosen is not None:
        try:
            validate_fleet_name(chosen)
        except InvalidFleetName as exc:  # checked before any command runs, saying where it came from
            raise InvalidFleetName(f"--name: {exc}") from None
    if takes_name:
        args.name = chosen
    return chosen


def fleet_name(args, env=None) -> str:
    """The fleet named by ``--name``, else by ``$FLEET_NAME``, else the default.

    A name from the environment is checked here (an explicit --name already was,
    in `merge_names`); a bad one raises InvalidFleetName saying it came from there.
    """
    if args.name:
        return args.name
    from fleet.rules.names import InvalidFleetName, validate_fleet_name

    name = default_name(env)
    try:
        return validate_fleet_name(name)
    except InvalidFleetName as exc:
        raise InvalidFleetName(f"$FLEET_NAME: {exc}") from None


def client(args, timeout: float = 30.0):
    """A `ControlClient` for the chosen fleet; raises NotRunning (exit 69) when it has no
    socket, UntrustedPeer (exit 85) when it belongs to a uid not trusted (--trust-uid)."""
    from fleet.service.control.client import ControlClient

    return ControlClient.for_fleet(fleet_name(args), timeout=timeout, trust_uids=getattr(args, "trust_uids", ()) or ())
