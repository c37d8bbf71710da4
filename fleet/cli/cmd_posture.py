"""fleetctl posture: show the cordon posture, retune its thresholds, or release a sticky cause.

``posture set KEY=VALUE ...`` sends a partial patch (``posture_set``); absent keys
keep their live value and ``KEY=null`` restores a key's default where it has one
(``cordon_sim_intake_floor``). The daemon is the one judge of values: it rejects a
bad one with a typed error (``PostureRetuneError``, exit 78) and changes nothing.
An empty patch or an unknown key is refused by the op's own check (``InvalidArgs``,
exit 2), the same check the daemon runs. The reply is the effective policy.

``posture release CAUSE`` clears a sticky cause (``posture_release``): ``lane-death``
(held since a worker died) or ``operator``. The posture turns Nominal once its exit
window is clean and no other cause holds it. An unknown cause is refused (exit 2)
and changes nothing; releasing a cause that is not held says so and changes nothing.
"""
from __future__ import annotations

import json
import sys

from fleet.rules.errors import EXIT_OK, EXIT_USAGE, FleetError
from fleet.rules.posture import POLICY_KEYS, STICKY_CAUSES
from fleet.cli._common import add_name_argument, client

NAME = "posture"
HELP = "Show the cordon posture and its thresholds, retune them, or release a sticky cause on the running fleet."


class PostureArgumentError(FleetError, ValueError):
    """A ``KEY=VALUE`` argument that is not one (no ``=``, empty key, key given twice)."""

    exit_code = EXIT_USAGE


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="posture_command", metavar="ACTION")
    sub.required = True
    show = sub.add_parser("show", help="the posture, its counters and the effective thresholds")
    add_name_argument(show)
    show.add_argument("--json", action="store_true", help="print the daemon's reply as JSON")
    keys = ", ".join(sorted(POLICY_KEYS))
    set_ = sub.add_parser(
        "set",
        help="retune thresholds with a partial patch; echoes the effective policy",
        description=f"Retune posture thresholds on the live daemon. Keys: {keys}. "
        "Values: integers, decimals, or null (restores the default where one exists).",
    )
    add_name_argument(set_)
    set_.add_argument("assignments", nargs="*", metavar="KEY=VALUE", help=f"one of: {keys}")
    set_.add_argument("--json", action="store_true", help="print the daemon's reply as JSON")
    causes = ", ".join(STICKY_CAUSES)
    release = sub.add_parser(
        "release",
        help=f"release a sticky cause ({causes}); echoes the posture",
        description="Release a sticky cause that holds the posture Cordoned: lane-death (held since a "
        "worker died) or operator (a manual cordon). The posture turns Nominal once its exit window "
        "(cordon_exit_clean_ms) is clean and no other cause holds it.",
    )
    add_name_argument(release)
    release.add_argument("cause", metavar="CAUSE", choices=STICKY_CAUSES, help=f"one of: {causes}")
    release.add_argument("--json", action="store_true", help="print the daemon's reply as JSON")


def run(args) -> int:
    if args.posture_command == "release":
        with client(args) as c:
            result = c.call("posture_release", cause=args.cause)
        if args.json:
            sys.stdout.write(json.dumps(result, indent=2) + "\n")
        else:
            said = "released" if result.get("released") else "was not held; nothing changed"
            sys.stdout.write(f"{args.cause}: {said}\n" + render(result))
        return EXIT_OK
    if args.posture_command == "set":
        patch = parse_patch(args.assignments)
        with client(args) as c:
            result = c.call("posture_set", patch=patch)
    else:
        patch = {}
        with client(args) as c:
            result = c.call("posture_show")
    sys.stdout.write(json.dumps(result, indent=2) + "\n" if args.json else render(result, changed=patch))
    return EXIT_OK


# ------------------------------------------------------------------------------ pure


def parse_value(text: str):
    """``"3"`` -> 3, ``"2.5"`` -> 2.5, ``"null"``/``"none"`` -> None; anything else stays a string.

    A string is sent as is so that the daemon, the one validator, names what is
    wrong with it; parsing here never judges a value.
    """
    stripped = text.strip()
    if stripped.lower() in ("null", "none"):
        return None
    try:
        return int(stripped)
    except ValueError:
        pass
    try:
        value = float(stripped)
    except ValueError:
        return text
    # nan/inf are not JSON; leave them as text for the daemon to refuse by name
    return value if value == value and value not in (float("inf"), float("-inf")) else text


def parse_patch(assignments) -> dict:
    """``["cordon_enter_events=3", ...]`` -> ``{"cordon_enter_events": 3, ...}``.

    Raises PostureArgumentError for an item without ``=``, with an empty key, or a
    key given twice. Unknown keys pass through: the op's check names them.
    """
    patch = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise PostureArgumentError(f"{item!r} is not KEY=VALUE (e.g. cordon_duty_percent=5)")
        if key in patch:
            raise PostureArgumentError(f"{key} is given twice")
        patch[key] = parse_value(value)
    return patch


def render(result, changed=()) -> str:
    """The daemon's posture reply as text; keys in ``changed`` are marked ``*``."""
    if not isinstance(result, dict) or "policy" not in result:
        return json.dumps(result, indent=2) + "\n"
    lines = [f"posture   {result.get('posture', '?')}"]
    causes = result.get("causes")
    if causes:
        lines.append(f"held by   {', '.join(causes)}")
    counters = (
        ("entered", "enter_count", ""),
        ("exited", "exit_count", ""),
        ("cordoned", "cordoned_dwell_ms", " ms"),
        ("window", "window_events", " events"),
        ("duty", "window_duty_percent", "%"),
    )
    shown = [f"{label} {result[key]}{unit}" for label, key, unit in counters if key in result]
    if shown:
        lines.append("          " + "; ".join(shown))
    lines.append("policy")
    policy = result["policy"]
    width = max(map(len, policy), default=0)
    for key, value in policy.items():
        mark = "*" if key in changed else " "
        lines.append(f" {mark}{key:<{width}}  {'null' if value is None else value}")
    return "\n".join(lines) + "\n"
