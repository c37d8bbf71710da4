"""fleetctl's commands that call the daemon, made from its ops (`fleet.service.control.ops.OPS`).

Each op with a ``command`` becomes one: ``("drain",)`` is ``fleetctl drain``,
``("posture", "set")`` is ``fleetctl posture set`` in the ``posture`` group
(`COMMAND_GROUPS` gives a group its help). Every one takes ``--name`` and
``--trust-uid`` (which fleet, whom to believe) and ``--json`` (print the daemon's
reply as JSON); the op adds its own arguments, turns them into its wire arguments,
renders the reply and picks the exit code. A reply the status screen's tables draw
is rendered by `fleet.cli.views` instead.
"""
from __future__ import annotations

import functools
import json
import sys

from fleet.cli import views
from fleet.cli._common import add_name_argument, client
from fleet.service.control.ops import COMMAND_GROUPS, OPS, Op


def add_op_commands(sub) -> None:
    """Add a subparser to ``sub`` (fleetctl's) for every op with a command."""
    groups = {}
    for op in OPS.commands():
        word, *rest = op.command
        if rest:
            group = groups.get(word)
            if group is None:
                text = COMMAND_GROUPS[word]
                group = sub.add_parser(word, help=text, description=text).add_subparsers(
                    dest=f"{word}_command", metavar="ACTION")
                group.required = True
                groups[word] = group
            parser = group.add_parser(rest[0], help=op.help or op.summary,
                                      description=op.description or op.help or op.summary)
        else:
            parser = sub.add_parser(word, help=op.help or op.summary,
                                    description=op.description or op.help or op.summary)
        add_name_argument(parser)
        op.add_arguments(parser)
        parser.add_argument("--json", action="store_true", help="print the daemon's reply as JSON")
        parser.set_defaults(_run=functools.partial(run_op, op))


def run_op(op: Op, args) -> int:
    """Send ``op`` with the arguments of the command line to the chosen fleet's daemon, print
    its reply (JSON with ``--json``) and return the op's exit code for it."""
    with client(args) as c:
        result = op.cli_call(c.call, args)
    render = views.RENDER.get(op.name, op.render)
    sys.stdout.write(json.dumps(result, indent=2) + "\n" if args.json else render(result, args))
    return op.exit_code(result)
