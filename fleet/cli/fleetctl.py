"""fleetctl: look at and steer a fleet from the shell.

Each subcommand lives in its own module exposing ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``; this file only routes. A typed
fleet error becomes one line on stderr and its exit code.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import EXIT_USAGE, FleetError

#: Subcommand modules, in the order `fleetctl --help` lists them.
COMMANDS = ("cmd_status", "cmd_plan", "cmd_posture", "cmd_drain", "cmd_resume", "cmd_leases", "cmd_store")
#: command name -> its module, so that `fleetctl status` imports only what status needs
#: (it must answer fast, even while the daemon is busy). A test keeps this in step.
MODULE_OF = {"status": "cmd_status", "plan": "cmd_plan", "posture": "cmd_posture", "drain": "cmd_drain",
             "resume": "cmd_resume", "leases": "cmd_leases", "store": "cmd_store"}


def build_parser(argv=None) -> argparse.ArgumentParser:
    """The parser; given argv naming one command, only that command's module is loaded."""
    parser = argparse.ArgumentParser(
        prog="fleetctl",
        description="Inspect and steer a fleet: its CPU plan, slots, posture and ledger.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    first = argv[0] if argv else None
    modules = (MODULE_OF[first],) if first in MODULE_OF else COMMANDS
    for module_name in modules:
        module = importlib.import_module(f"{__package__}.{module_name}")
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        return args._run(args)
    except FleetError as exc:
        print(f"fleetctl {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_USAGE + 128


if __name__ == "__main__":
    sys.exit(main())
