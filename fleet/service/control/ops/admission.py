"""The provider admission's ops: its read model, closing and reopening a provider or key,
a daily budget reading, and the coordinator's questions (reference 000 §9)."""
from __future__ import annotations

import math
import time
from typing import Any

from fleet.rules import ranges
from fleet.rules.when import utc
from fleet.service.control.ops.base import OPS, Op, in_range
from fleet.service.control.terminal import UNTIL_FORMS, parse_until
from fleet.service.control.wire import Arg


def _pool(op: Op, args: dict[str, Any]) -> None:
    from fleet.runtime.provider_gate import BadPool, parse_pool

    try:
        parse_pool(args["pool"])
    except BadPool as exc:
        raise op.bad(str(exc)) from None


def _published(sup, result):
    """`result`, once the provider gate's bulkheads are in the table: an operator's change
    shows in ``fleetctl status`` at once."""
    sup.providers.publish(force=True)
    return result


@OPS.register
class AdmissionShowOp(Op):
    """The provider admission as the fleet's own process sees it: per bulkhead and per
    lane x bulkhead rows, live closures, the starving list, units waiting with their
    reason, and a catalog reload that failed (``policy_error``)."""

    name = "admission_show"
    summary = "The provider admission: bulkheads, lanes, closures, starving, waiting units."
    command = ("admission", "show")
    help = "bulkheads, lane rows, closures, starving list and waiting units"
    view = True

    def on_loop(self, sup) -> dict:
        """The provider admission's read model (see `fleet.Fleet.status`'s ``admission``)."""
        return sup.providers.census()


_POOL_HELP = "provider, or provider/credential"


@OPS.register
class AdmissionCloseOp(Op):
    """Close a provider (``pool: "provider"``) or one key (``"provider/credential"``) until
    ``until`` (UTC epoch seconds): nothing is admitted on it but one probe per interval.
    The closure is kept across restarts. Unknown pool or a past time: ``BadPool`` (exit 1,
    nothing changed). fleetctl's ``--until`` takes a UTC time, epoch seconds or
    ``+DURATION`` from now; a malformed POOL or time exits 2."""

    name = "admission_close"
    mutating = True
    summary = "Close a provider or key until a time (an operator takes a key out)."
    schema = {
        "pool": Arg((str,), required=True, doc="provider or provider/credential"),
        "until": Arg((float,), required=True, doc="UTC epoch seconds"),
        "message": Arg((str,), default="", doc="why (shown with the closure)"),
    }
    command = ("admission", "close")
    help = "close a provider or key until a time (owner/root only)"
    fleet = True

    def on_loop(self, sup, pool: str, until: float, message: str = "") -> dict:
        """Close a provider (``"provider"``) or one key (``"provider/credential"``) until
        `until` (UTC epoch seconds). BadPool for an unknown pool or a time not in the future."""
        return _published(sup, sup.providers.close(pool, until, message))

    def wire_args(self, args: dict[str, Any]) -> dict[str, Any]:
        return {**args, "until": float(args["until"])}

    def call_args(self, args: dict[str, Any]) -> dict[str, Any]:
        return {**args, "until": float(args["until"])}

    def add_arguments(self, parser) -> None:
        parser.add_argument("pool", metavar="POOL", help=_POOL_HELP)
        parser.add_argument("--until", required=True, metavar="T", help=UNTIL_FORMS)
        parser.add_argument("--message", default="", help="why (shown with the closure)")

    def from_cli(self, args) -> dict[str, Any]:
        from fleet.runtime.provider_gate import BadPool

        now = time.time()
        until = parse_until(args.until, now)
        if not until > now:  # refused as the daemon would, naming the time as it was typed
            raise BadPool(f"--until {args.until!r} ({utc(until)}) is not in the future: nothing closed")
        return {"pool": args.pool, "until": until, "message": args.message}

    def render(self, result: Any, args) -> str:
        return f"{result['pool']}: closed until {utc(result['closed_until'])}\n"

    def check(self, args: dict[str, Any]) -> None:
        _pool(self, args)
        if not 0 < args["until"] < 1e11:
            raise self.bad(f"until must be UTC epoch seconds, got {args['until']!r}")


@OPS.register
class AdmissionReopenOp(Op):
    """Reopen a closed provider or key (a topped-up key need not wait for midnight);
    ``reopened``: whether it was closed. Unknown pool: ``BadPool``."""

    name = "admission_reopen"
    mutating = True
    summary = "Reopen a closed provider or key."
    schema = {"pool": Arg((str,), required=True, doc="provider or provider/credential")}
    command = ("admission", "reopen")
    help = "reopen a closed provider or key (owner/root only)"
    fleet = True

    def on_loop(self, sup, pool: str) -> dict:
        """Reopen a closed provider or key (a topped-up key); ``reopened``: was it closed.
        Its waiting units start at the loop's next turn."""
        return _published(sup, sup.providers.reopen(pool))

    def add_arguments(self, parser) -> None:
        parser.add_argument("pool", metavar="POOL", help=_POOL_HELP)

    def from_cli(self, args) -> dict[str, Any]:
        return {"pool": args.pool}

    def render(self, result: Any, args) -> str:
        return f"{result['pool']}: {'reopened' if result['reopened'] else 'was not closed; nothing changed'}\n"

    def check(self, args: dict[str, Any]) -> None:
        _pool(self, args)


def _amount(text: str) -> float:
    """fleetctl's reading of an amount: a finite number >= 0 (else a usage error, exit 2)."""
    import argparse  # the command line's error type; the op's daemon half never needs it

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite amount >= 0")
    return value


@OPS.register
class AdmissionBudgetOp(Op):
    """The provider's daily budget reading: ``spent`` today against ``limit`` (None: no limit),
    shown per bulkhead; at the limit the provider closes until the next UTC midnight.
    Unknown provider or a bad amount: ``BadBudget``."""

    name = "admission_budget"
    mutating = True
    summary = "Report a provider's daily budget reading (spent, limit)."
    schema = {
        "provider": Arg((str,), required=True, doc="the provider"),
        "spent": Arg((float,), required=True, doc="spent today (the budget's unit, e.g. USD)"),
        "limit": Arg((float, type(None)), default=None, doc="the daily limit (None: none)"),
    }
    command = ("admission", "budget")
    help = "report a provider's daily budget reading (owner/root only)"
    method = "report_budget"
    fleet = True

    def on_loop(self, sup, provider: str, spent: float, limit: float | None = None) -> dict:
        """The provider's daily budget reading (000 §8: read and shown, never reserved): `spent`
        today against its daily `limit` (None: none), shown on every bulkhead of `provider`;
        at the limit the provider closes until the next UTC midnight. Raises BadBudget
        (nothing changed) for an unknown provider or an amount that is not finite and >= 0."""
        return _published(sup, sup.providers.report_budget(provider, spent, limit))

    def call_args(self, args: dict[str, Any]) -> dict[str, Any]:
        limit = args["limit"]
        return {"provider": args["provider"], "spent": float(args["spent"]),
                "limit": None if limit is None else float(limit)}

    def add_arguments(self, parser) -> None:
        parser.add_argument("provider", metavar="PROVIDER", help="the provider whose budget was read")
        parser.add_argument("--spent", required=True, type=_amount, metavar="X", help="spent today (e.g. USD)")
        parser.add_argument("--limit", type=_amount, default=None, metavar="Y", help="the daily limit (omit: none)")

    def from_cli(self, args) -> dict[str, Any]:
        return {"provider": args.provider, "spent": args.spent, "limit": args.limit}

    def render(self, result: Any, args) -> str:
        limit = "no limit" if result["limit"] is None else f"limit {result['limit']:g}"
        return f"{result['provider']}: spent {result['spent']:g} today, {limit}\n"


@OPS.register
class AdmissionReloadRefusedOp(Op):
    name = "admission_reload_refused"
    no_wire = "it follows a reload whose [admission] section did not load, which is no op of the wire"
    no_command = "a reload says why it was refused"
    method = None
    no_method = "fleetd and Fleet.reload call it on a refused reload"

    def on_loop(self, sup, why: str) -> None:
        """A reload whose [admission] section did not load: the last good catalog stays, and
        the admission's ``policy_error`` says why."""
        sup.providers.refused_reload(why)


# The coordinator API (reference 000 §9). Questions only: they read the admission and seat
# nothing, so any peer the server serves may ask them (like status and admission_show).
_LANE = Arg((str, type(None)), default=None, doc="the lane (None: units submitted without one)")
_COORDINATOR = "a coordinator's question, asked from its program (fleet.connect(name))"


@OPS.register
class AdmissionAllowanceOp(Op):
    """``{"lane", "allowance"}``: None (start everything) unless every route the lane's work
    asks for is held back by a live refusal with no admitting alternative, then 0."""

    name = "admission_allowance"
    summary = "The provider admission's allowance for a lane (None: no hold; 0: hold its fan-out)."
    schema = {"lane": _LANE}
    no_command = _COORDINATOR
    fleet = True
    view = True

    def on_loop(self, sup, lane: str | None) -> int | None:
        """None (start everything) unless every route `lane`'s work asks for is held back by a
        live refusal with no admitting alternative: then 0 (hold the lane's fan-out)."""
        return sup.providers.allowance(lane)

    def reply(self, value: Any, args: dict[str, Any]) -> Any:
        return {"lane": args["lane"], "allowance": value}

    def result(self, reply: Any, args: dict[str, Any]) -> Any:
        return reply["allowance"]


@OPS.register
class AdmissionPlanOp(Op):
    """``{"lane", "route", "wanted", "starts"}``: how many of ``wanted`` new units on ``route``
    would start now, pins and alternatives honoured; nothing is seated. A route outside the
    catalog: ``BadPlan``."""

    name = "admission_plan"
    summary = "How many of N units on a route would the provider admission start now."
    schema = {
        "lane": _LANE,
        "route": Arg((str,), required=True, doc="model@provider[/credential]"),
        "wanted": Arg((int,), required=True, doc="units the coordinator would fan out"),
        "pinned": Arg((bool,), default=False, doc="hard pin: never an alternative"),
    }
    no_command = _COORDINATOR
    fleet = True
    view = True

    def on_loop(self, sup, lane: str | None, route, wanted: int, pinned: bool = False) -> int:
        """How many of `wanted` new units on `route` (a `fleet.Route`) in `lane` would start now,
        pins and alternatives honoured; nothing is submitted or seated. Raises BadPlan (a
        route outside the catalog, `wanted` not a whole number >= 0, bad types)."""
        return sup.providers.plan(lane, route, wanted, pinned)

    def wire_args(self, args: dict[str, Any]) -> dict[str, Any]:
        from admission.route import Route

        route = args["route"]
        if type(route) is not Route:  # nothing sent
            from fleet.runtime.provider_gate import BadPlan

            raise BadPlan(f"route must be a fleet.Route(model, provider, credential=None), not {type(route).__name__}")
        return {**args, "route": str(route)}

    def result(self, reply: Any, args: dict[str, Any]) -> Any:
        return reply["starts"]

    def check(self, args: dict[str, Any]) -> None:
        from admission.route import Route

        try:
            Route.parse(args["route"])
        except ValueError as exc:
            raise self.bad(str(exc)) from None
        in_range(self, "wanted", args["wanted"], ranges.PLAN_WANTED)

    def call_args(self, args: dict[str, Any]) -> dict[str, Any]:
        from admission.route import Route

        return {**args, "route": Route.parse(args["route"])}

    def reply(self, value: Any, args: dict[str, Any]) -> Any:
        from admission.route import Route

        route = str(Route.parse(args["route"]))  # as the admission spells it
        return {"lane": args["lane"], "route": route, "wanted": args["wanted"], "starts": value}


@OPS.register
class AdmissionStarvingOp(Op):
    """``{"starving": [...]}``: closed providers or keys with work waiting first, then
    hard-pinned waits past ``starved_after``."""

    name = "admission_starving"
    summary = "The provider admission's starving list."
    no_command = _COORDINATOR
    fleet = True
    view = True

    def on_loop(self, sup) -> list:
        """Closed providers or keys with work waiting (``kind: provider-closed``) first, then
        hard-pinned units waiting past ``starved_after`` (``kind: pinned``)."""
        return sup.providers.starving()

    def reply(self, value: Any, args: dict[str, Any]) -> Any:
        return {"starving": value}

    def result(self, reply: Any, args: dict[str, Any]) -> Any:
        return reply["starving"]
