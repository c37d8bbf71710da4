"""fleetctl resume: the fleet takes new units again after a drain."""
from __future__ import annotations

from fleet.cli._common import add_name_argument, call_and_print

NAME = "resume"
HELP = "Take new units again after `fleetctl drain`."


def add_arguments(parser) -> None:
    add_name_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the daemon's reply as JSON")


def run(args) -> int:
    return call_and_print(args, "resume")
