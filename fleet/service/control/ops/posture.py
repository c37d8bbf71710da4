"""The posture ops: show it, retune its thresholds, release a sticky cause."""
from __future__ import annotations

import logging
from typing import Any

from fleet.rules import vocab
from fleet.rules.posture import STICKY_CAUSES
from fleet.service.control.ops.base import OPS, Op
from fleet.service.control.terminal import parse_patch, posture_text
from fleet.service.control.wire import Arg

log = logging.getLogger(__name__)

#: The six posture thresholds a `posture_set` patch may touch (fleet.rules.vocab).
POSTURE_KEYS = frozenset(vocab.POSTURE_KEYS)


@OPS.register
class PostureShowOp(Op):
    name = "posture_show"
    summary = "The posture state and its thresholds."
    command = ("posture", "show")
    help = "the posture, its counters and the effective thresholds"
    fleet = True
    view = True

    def on_loop(self, sup) -> dict:
        """The posture: state, causes, dwell, counters and the six thresholds."""
        return sup.posture.show()

    def render(self, result: Any, args) -> str:
        return posture_text(result)


@OPS.register
class PostureSetOp(Op):
    """``posture set KEY=VALUE ...`` sends a partial patch: absent keys keep their live value
    and ``KEY=null`` restores a key's default where it has one (``cordon_sim_intake_floor``).
    The daemon is the one judge of values: it refuses a bad one with a typed error
    (``PostureRetuneError``, exit 78) and changes nothing. An empty patch or an unknown key
    is refused by `check` (``InvalidArgs``, exit 2), the same check the daemon runs. The
    reply is the effective policy."""

    name = "posture_set"
    mutating = True
    summary = "Retune posture thresholds with a partial patch; echoes the effective policy."
    schema = {"patch": Arg((dict,), required=True, doc="threshold name -> new value")}
    command = ("posture", "set")
    help = "retune thresholds with a partial patch; echoes the effective policy"
    description = (f"Retune posture thresholds on the live daemon. Keys: {', '.join(sorted(POSTURE_KEYS))}. "
                   "Values: integers, decimals, or null (restores the default where one exists).")
    fleet = True

    def on_loop(self, sup, **patch: Any) -> dict:
        """Retune posture thresholds with a partial patch (validated: a bad value raises
        PostureRetuneError, exit 78, and changes nothing); returns the effective policy."""
        result = sup.posture.retune(patch)
        sup.dispatch()  # what the new policy lets in starts now
        return result

    def add_arguments(self, parser) -> None:
        parser.add_argument("assignments", nargs="*", metavar="KEY=VALUE",
                            help=f"one of: {', '.join(sorted(POSTURE_KEYS))}")

    def from_cli(self, args) -> dict[str, Any]:
        return {"patch": parse_patch(args.assignments)}

    def render(self, result: Any, args) -> str:
        return posture_text(result, changed=parse_patch(args.assignments))

    def check(self, args: dict[str, Any]) -> None:
        patch = args["patch"]
        if not patch:
            raise self.bad(f"patch is empty; give at least one of {', '.join(sorted(POSTURE_KEYS))}")
        unknown = sorted(set(patch) - POSTURE_KEYS)
        if unknown:
            raise self.bad(f"unknown posture key(s) {', '.join(unknown)} (known: {', '.join(sorted(POSTURE_KEYS))})")

    def call_args(self, args: dict[str, Any]) -> dict[str, Any]:
        # A copy: the handler may keep it, and the request's dict is not its to own.
        return dict(args["patch"])


@OPS.register
class PostureReleaseOp(Op):
    """Release a sticky posture cause: ``lane-death`` (held since a worker died) or
    ``operator``. The posture turns Nominal once its exit window is clean and no other
    cause holds it. An unknown cause is refused (exit 2) and changes nothing; releasing
    a cause that is not held says so and changes nothing. The reply is the posture view
    with ``released`` (whether the cause was held)."""

    name = "posture_release"
    mutating = True
    summary = "Release a sticky posture cause (lane-death, operator); echoes the posture."
    schema = {"cause": Arg((str,), required=True, doc="the sticky cause: lane-death or operator")}
    command = ("posture", "release")
    help = f"release a sticky cause ({', '.join(STICKY_CAUSES)}); echoes the posture"
    description = ("Release a sticky cause that holds the posture Cordoned: lane-death (held since a "
                   "worker died) or operator (a manual cordon). The posture turns Nominal once its exit window "
                   "(cordon_exit_clean_ms) is clean and no other cause holds it.")
    fleet = True

    def on_loop(self, sup, cause: str) -> dict:
        """Release a sticky posture cause: ``"lane-death"`` (held since a worker died) or
        ``"operator"``. Returns the posture view with ``released`` (was it held). The
        posture turns Nominal once its exit window is clean and no other cause holds it.
        An unknown cause raises PostureCauseError and changes nothing."""
        held = sup.posture.release(cause)
        if held:
            log.warning("fleet %s: operator released the posture cause %s", sup.name, cause)
        return {**sup.posture.show(), "released": held}

    def add_arguments(self, parser) -> None:
        parser.add_argument("cause", metavar="CAUSE", choices=STICKY_CAUSES, help=f"one of: {', '.join(STICKY_CAUSES)}")

    def from_cli(self, args) -> dict[str, Any]:
        return {"cause": args.cause}

    def render(self, result: Any, args) -> str:
        said = "released" if result.get("released") else "was not held; nothing changed"
        return f"{args.cause}: {said}\n" + posture_text(result)

    def check(self, args: dict[str, Any]) -> None:
        if args["cause"] not in STICKY_CAUSES:
            raise self.bad(f"unknown posture cause {args['cause']!r} (causes: {', '.join(STICKY_CAUSES)})")

