"""fleetctl drain: stop the fleet taking new units; what is in flight finishes."""
from __future__ import annotations

from fleet.cli._common import add_name_argument, call_and_print

NAME = "drain"
HELP = "Stop taking new units; in-flight units finish (undo with `fleetctl resume`)."


def add_arguments(parser) -> None:
    add_name_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the daemon's reply as JSON")


def run(args) -> int:
    return call_and_print(args, "drain")
