"""fleetctl: look at and steer a fleet from the shell.

A command that calls the running fleet's daemon is an op of the control protocol
(`fleet.service.control.ops`): the op's class holds its arguments, wire request,
rendering and exit code, and `fleet.cli.opcommands` makes the command of it. The
commands that read the table, a config or the store (status, top, plan, leases, store)
each live in their own module exposing ``NAME``, ``HELP``, ``add_arguments(parser)``
and ``run(args) -> int``. This file only routes. A typed fleet error becomes one
line on stderr and its exit code.

The fleet a command addresses: ``--name`` before or after the command (both given
and different: refused, exit 2), else ``$FLEET_NAME``, else ``fleet``. The name is
checked by the fleet-name rule (fleet.rules.names); a bad one exits 2.

Whom a command believes: a fleetd, table and socket directory of this uid or root,
and of each ``--trust-uid`` (before or after the command); any other is refused
with UntrustedPeer naming its uid, exit 85 (see fleet.host.trust).
"""
from __future__ import annotations

import argparse
import importlib
import sys

from fleet.rules.errors import EXIT_USAGE, FleetError
from fleet.cli._common import (
    GLOBAL_NAME_DEST,
    GLOBAL_VALUE_OPTIONS,
    NAME_PRECEDENCE,
    add_name_argument,
    merge_names,
    merge_trust,
)

#: The commands that do not go through the daemon (they read the fleet's table, a config,
#: the host-group store), each a module exposing ``NAME``, ``HELP``, ``add_arguments``
#: and ``run``: command name -> its module, in the order `fleetctl --help` lists them, so
#: that `fleetctl status` imports only what status needs (it must answer fast, even while
#: the daemon is busy).
MODULE_OF = {"status": "cmd_status", "top": "cmd_top", "plan": "cmd_plan", "leases": "cmd_leases",
             "store": "cmd_store"}


def build_parser(argv=None) -> argparse.ArgumentParser:
    """The parser; given argv naming one command, only what that command needs is loaded.

    The commands that call the daemon are its ops' (`fleet.service.control.ops.OPS`):
    each op with a ``command`` is one, in a group (``posture set``) when it has two words.
    """
    parser = argparse.ArgumentParser(
        prog="fleetctl",
        description="Inspect and steer a fleet: its CPU plan, slots, posture and ledger.",
        epilog=f"The fleet a command addresses: {NAME_PRECEDENCE}. "
        "--name before and after the command must agree.",
    )
    add_name_argument(parser, dest=GLOBAL_NAME_DEST)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    first = _command_word(argv or [])
    for name, module_name in MODULE_OF.items():
        if first in MODULE_OF and first != name:
            continue
        module = importlib.import_module(f"{__package__}.{module_name}")
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    if first not in MODULE_OF:
        from fleet.cli.opcommands import add_op_commands

        add_op_commands(sub)
    return parser


def _command_word(argv) -> str | None:
    """The command in argv, past fleetctl's own options (``--name NAME`` / ``--name=NAME``,
    ``--trust-uid UID``)."""
    rest = iter(argv)
    for word in rest:
        if word in GLOBAL_VALUE_OPTIONS:
            next(rest, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        merge_names(args)
        merge_trust(args)
        return args._run(args)
    except FleetError as exc:
        print(f"fleetctl {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_USAGE + 128


if __name__ == "__main__":
    sys.exit(main())
