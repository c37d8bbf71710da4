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
COMMANDS = ("cmd_status", "cmd_plan", "cmd_posture", "cmd_drain", "cmd_resume")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetctl",
        description="Inspect and steer a fleet: its CPU plan, slots, posture and ledger.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module_name in COMMANDS:
        module = importlib.import_module(f"{__package__}.{module_name}")
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
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
