"""The ops: each op is one class holding its client half and its daemon half, the
`OpRegistry` both sides look ops up in (`OPS`), and the `ControlHandler` protocol
the daemon implements for them."""
from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import Any, ClassVar, Protocol

from fleet.rules import ranges, vocab
from fleet.service.control.errors import E_INVALID_ARGS, E_UNKNOWN_OP, ProtocolError
from fleet.service.control.wire import Arg, _json_type, check_args


class ControlHandler(Protocol):
    """What the daemon implements for the ops; every method runs on the daemon's loop.

    Methods return JSON-serializable values. To refuse a request, raise a FleetError
    subclass: it travels to the client as ``{"type": <class name>, "message": str(exc)}``.
    Any other exception becomes an ``InternalError`` reply (and is logged).
    """

    def status(self) -> Any:
        """The fleet's status: plan, budget, census, posture, ledger counters, queues."""

    def posture_show(self) -> Any:
        """The posture: state, cause, dwell and the six thresholds."""

    def posture_set(self, patch: dict[str, Any]) -> Any:
        """Apply a partial patch over `POSTURE_KEYS` (keys already checked; values not).

        Validate the values, raise a typed error changing nothing if any is bad,
        else apply and return the effective policy.
        """

    def drain(self) -> Any:
        """Stop taking new units; in-flight units finish."""

    def resume(self) -> Any:
        """Take new units again after a drain."""

    def submit(
        self,
        *,
        role: str,
        payload: Any,
        encoding: str,
        key: str | int | None,
        lane: str | None,
        priority: int,
        timeout: float | None,
        request_id: str | None,
        token: str | None = None,
        seq: int | None = None,
        chunk: bool = False,
        route=None,
        severity: str | None = None,
        pinned: bool = False,
        parent: int | None = None,
        tag: str | None = None,
        age: float = 0.0,
    ) -> Any:
        """Admit one unit. ``payload`` is pickled bytes when ``encoding == "pickle"``,
        else the decoded JSON value. With a ``token`` the outcome is held for
        `collect` under that token, tagged with ``seq``. ``chunk``: the payload is a
        list of items run as one unit (``Fleet.map`` with chunksize > 1). ``route``
        (a `fleet.Route`, parsed), ``severity``, ``pinned``, ``parent``, ``tag``, ``age``: the
        provider admission's arguments (`fleet.Fleet.submit`). Returns e.g. the unit id."""

    def ledger(self) -> Any:
        """The ledger counters: submitted, solved, suppressed, failed by reason."""

    def collect(self, *, token: str, timeout: float, ack: int | None = None) -> Future:
        """The outcomes held for ``token``: a Future resolved, without blocking the
        caller, as soon as one is ready or after ``timeout`` seconds (then empty).
        ``ack``: how many of the token's outcomes the client has (`CollectOp`)."""

    def cancel(self, unit: int) -> Any:
        """Cancel unit ``unit`` if it has not started; say what became of it (`CancelOp`)."""

    def admission_show(self) -> Any:
        """The provider admission's read model (bulkheads, lanes, closures, starving, waits)."""

    def admission_close(self, pool: str, until: float, message: str) -> Any:
        """Close a provider or key until ``until`` (UTC epoch seconds); BadPool if unknown or not future."""

    def admission_reopen(self, pool: str) -> Any:
        """Lift a provider's or key's closure; BadPool if the pool is unknown."""

    def admission_budget(self, provider: str, spent: float, limit: float | None) -> Any:
        """The provider's daily budget reading (`fleet.Fleet.report_budget`); BadBudget if refused."""

    def admission_allowance(self, lane: str | None) -> Any:
        """The coordinator's allowance for `lane`: None or 0 (`fleet.Fleet.admission_allowance`)."""

    def admission_plan(self, lane: str | None, route, wanted: int, pinned: bool) -> Any:
        """How many of `wanted` units on `route` (a parsed `fleet.Route`) would start now; BadPlan if refused."""

    def admission_starving(self) -> Any:
        """The starving list (`fleet.Fleet.admission_starving`)."""


# ----------------------------------------------------------------------------- ops


class Op:
    """One command: both its halves. Subclass, set the class attributes, register in `OPS`.

    Class attributes: ``name`` (the wire name), ``mutating`` (needs the daemon's uid
    or root), ``blocking`` (a long poll, kept off the main loop), ``summary`` (one
    line for help), ``schema`` (``{arg: Arg}``).
    """

    name: ClassVar[str]
    mutating: ClassVar[bool] = False
    #: A blocking op waits for an event (a long poll). Its `execute` must return a
    #: Future at once instead of a value; the daemon dispatches it off the main loop.
    blocking: ClassVar[bool] = False
    summary: ClassVar[str] = ""
    schema: ClassVar[Mapping[str, Arg]] = {}

    # -- client half
    def to_wire(self, **args: Any) -> dict[str, Any]:
        """Build the request's args from a caller's keyword arguments (checked locally)."""
        self.validate(args)
        return args

    def format(self, result: Any) -> str:
        """Render a result for a terminal."""
        if isinstance(result, dict):
            return "\n".join(f"{k}: {json.dumps(v)}" for k, v in result.items())
        return json.dumps(result)

    # -- daemon half
    def validate(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Schema check plus `check`; returns the normalized args `execute` receives."""
        checked = check_args(self.name, self.schema, args)
        self.check(checked)
        return checked

    def check(self, args: dict[str, Any]) -> None:
        """Op-specific checks beyond types; may normalize ``args`` in place."""

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        """Run against the handler; called on the thread that owns the state."""
        raise NotImplementedError

    def _bad(self, message: str) -> ProtocolError:
        return ProtocolError(E_INVALID_ARGS, f"{self.name}: {message}")


class OpRegistry:
    """Op name -> op instance. Both the client and the server look ops up here."""

    def __init__(self, ops: Iterable[type[Op]] = ()):
        self._ops: dict[str, Op] = {}
        for op in ops:
            self.register(op)

    def register(self, op_cls: type[Op]) -> type[Op]:
        """Add an op class (usable as a class decorator). A duplicate name is an error."""
        if op_cls.name in self._ops:
            raise ValueError(f"op {op_cls.name!r} is already registered")
        self._ops[op_cls.name] = op_cls()
        return op_cls

    def get(self, name: str) -> Op:
        """The op called ``name``; ProtocolError(UnknownOp) listing the known ones if none."""
        try:
            return self._ops[name]
        except KeyError:
            raise ProtocolError(
                E_UNKNOWN_OP, f"unknown op {name!r} (known: {', '.join(sorted(self._ops))})"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._ops)

    def __contains__(self, name: object) -> bool:
        return name in self._ops


#: The registry of fleet's ops.
OPS = OpRegistry()

#: The six posture thresholds a `posture_set` patch may touch (fleet.rules.vocab).
POSTURE_KEYS = frozenset(vocab.POSTURE_KEYS)


@OPS.register
class PingOp(Op):
    name = "ping"
    summary = "Check that the daemon's main loop answers."

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        # No handler method: answering at all proves the owning loop is turning.
        return {"pong": True, "pid": os.getpid()}


@OPS.register
class StatusOp(Op):
    name = "status"
    summary = "Plan, budget, census, posture, ledger counters and queue depths."

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        return handler.status()


@OPS.register
class PostureShowOp(Op):
    name = "posture_show"
    summary = "The posture state and its thresholds."

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        return handler.posture_show()


@OPS.register
class PostureSetOp(Op):
    name = "posture_set"
    mutating = True
    summary = "Retune posture thresholds with a partial patch; echoes the effective policy."
    schema = {"patch": Arg((dict,), required=True, doc="threshold name -> new value")}

    def check(self, args: dict[str, Any]) -> None:
        patch = args["patch"]
        if not patch:
            raise self._bad(f"patch is empty; give at least one of {', '.join(sorted(POSTURE_KEYS))}")
        unknown = sorted(set(patch) - POSTURE_KEYS)
        if unknown:
            raise self._bad(
                f"unknown posture key(s) {', '.join(unknown)} (known: {', '.join(sorted(POSTURE_KEYS))})"
            )

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        # A copy: the handler may keep it, and the request's dict is not its to own.
        return handler.posture_set(dict(args["patch"]))


@OPS.register
class PostureReleaseOp(Op):
    """Release a sticky posture cause; the handler's ``posture_release(cause)`` returns the
    posture view with ``released`` (whether the cause was held)."""

    name = "posture_release"
    mutating = True
    summary = "Release a sticky posture cause (lane-death, operator); echoes the posture."
    schema = {"cause": Arg((str,), required=True, doc="the sticky cause: lane-death or operator")}

    def check(self, args: dict[str, Any]) -> None:
        from fleet.rules.posture import STICKY_CAUSES

        if args["cause"] not in STICKY_CAUSES:
            raise self._bad(f"unknown posture cause {args['cause']!r} (causes: {', '.join(STICKY_CAUSES)})")

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        return handler.posture_release(args["cause"])


@OPS.register
class DrainOp(Op):
    name = "drain"
    mutating = True
    summary = "Stop taking new units; in-flight units finish."

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        return handler.drain()


@OPS.register
class ResumeOp(Op):
    name = "resume"
    mutating = True
    summary = "Take new units again after a drain."

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        return handler.resume()


@OPS.register
class LedgerOp(Op):
    name = "ledger"
    summary = "Ledger counters: submitted, solved, suppressed, failed by reason."

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        return handler.ledger()


@OPS.register
class SubmitOp(Op):
    """Submit one unit. On the wire the payload is JSON (``encoding: "json"``) or a
    base64 string of pickled bytes (``encoding: "pickle"``). Only the daemon's uid and
    root may submit, which is what makes accepting pickles acceptable."""

    name = "submit"
    mutating = True
    summary = "Submit one unit of work to a role."
    ENCODINGS = ("json", "pickle")
    schema = {
        "role": Arg((str,), required=True),
        "payload": Arg(None, required=True),
        "encoding": Arg((str,), default="json", doc="json | pickle (base64 of pickled bytes)"),
        "key": Arg((str, int, type(None)), doc="bin key for pinned roles"),
        "lane": Arg((str, type(None))),
        "priority": Arg((int,), default=0),
        "timeout": Arg((float, type(None)), doc="seconds"),
        "request_id": Arg((str, type(None)), doc="idempotency id: a submit repeated with it is admitted "
                                                  "once (fleet.service.replays); the reply says replayed"),
        "token": Arg((str, type(None)), doc="hold the outcome for `collect` under this client token"),
        "seq": Arg((int, type(None)), doc="the client's number for the unit, echoed in its outcome"),
        "chunk": Arg((bool,), default=False, doc="the payload is a list of items run as one unit"),
        "route": Arg((str, type(None)), doc="provider pool the unit calls: model@provider[/credential]"),
        "severity": Arg((str, type(None)), doc="a declared severity (urgency inside the lane)"),
        "pinned": Arg((bool,), default=False, doc="hard pin: wait for this route, never move"),
        "parent": Arg((int, type(None)), doc="the unit that delegated this one (admitted at once)"),
        "tag": Arg((str, type(None)), doc="the agent or unit tag (pins may name it)"),
        "age": Arg((float,), default=0.0, doc="seconds the unit waited already (its urgency counts from then)"),
    }

    def to_wire(self, **args: Any) -> dict[str, Any]:
        """Callers pass any Python ``payload``; it is pickled unless ``encoding="json"``.

        ``pickled=<bytes>`` in place of ``payload`` sends bytes the caller pickled
        already (a client that measures a payload before sending it).
        """
        if "pickled" in args:
            args["payload"] = base64.b64encode(args.pop("pickled")).decode("ascii")
            args["encoding"] = "pickle"
        elif args.setdefault("encoding", "pickle") == "pickle" and "payload" in args:
            from fleet.runtime.codec import CodecError, dumps  # the client half only: the daemon never pickles a payload

            try:
                raw = dumps(args["payload"], "payload")
            except CodecError as exc:
                raise self._bad(str(exc)) from None
            args["payload"] = base64.b64encode(raw).decode("ascii")
        return super().to_wire(**args)

    def check(self, args: dict[str, Any]) -> None:
        if not args["role"]:
            raise self._bad("role must be a non-empty string")
        if args["encoding"] not in self.ENCODINGS:
            raise self._bad(f"encoding must be one of {', '.join(self.ENCODINGS)}, got {args['encoding']!r}")
        for name, within in (("priority", ranges.PRIORITY), ("timeout", ranges.UNIT_TIMEOUT_S),
                             ("seq", ranges.SEQ), ("parent", ranges.UNIT_ID)):
            _in_range(self, name, args[name], within)
        if args["token"] is not None and not _TOKEN.fullmatch(args["token"]):
            raise self._bad(f"token must be 8-128 letters, digits, '_' or '-', got {args['token']!r}")
        if args["seq"] is not None and args["token"] is None:
            raise self._bad("seq tags an outcome held for a token: give token too")
        if args["chunk"] and args["encoding"] != "pickle":
            raise self._bad("a chunk travels pickled: use encoding pickle")
        if args["route"] is not None:
            from fleet.route import Route

            try:
                args["route"] = Route.parse(args["route"])
            except ValueError as exc:
                raise self._bad(str(exc)) from None
        if args["encoding"] == "pickle":
            if not isinstance(args["payload"], str):
                raise self._bad(f"a pickle payload must be a base64 string, got {_json_type(args['payload'])}")
            try:
                args["payload"] = base64.b64decode(args["payload"], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise self._bad(f"payload is not valid base64: {exc}") from None

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        return handler.submit(**args)


#: Longest a `collect` may wait: below ControlServer's default reply_timeout (30 s),
#: so a long poll always ends with an answer, never with the server's Timeout.
COLLECT_MAX_WAIT_S = 20.0
#: Most bytes of outcomes one `collect` reply carries (well under MAX_FRAME).
COLLECT_REPLY_BUDGET = 768 * 1024

_TOKEN = re.compile(r"[A-Za-z0-9_-]{8,128}")


@OPS.register
class CollectOp(Op):
    """Long-poll the outcomes held for a client token (see "Result delivery" above).

    Reply: ``{"outcomes": [...], "first": int, "more": bool, "closing": bool}``.
    A token's outcomes are numbered from 0 in the order they were held; ``first`` is
    the number of the reply's first outcome. ``ack`` (the count of the token's outcomes
    the client has) lets go of those; the ones after it are sent, again when a reply
    was lost on the way (a timeout, a broken connection). Without ``ack``, every
    outcome sent before counts as received. Each outcome is
    ``{"seq", "unit", "role", "kind", ...}``: a solved one carries ``value`` (base64
    of the pickled value; with ``part``/``parts`` when split across replies), a
    failed or suppressed one ``reason``, ``detail`` and, when it could be pickled,
    ``error`` (base64 of the handler's exception). ``more``: outcomes are still
    waiting beyond this reply's budget. ``closing``: the daemon is stopping and
    takes no more units. Mutating: collecting consumes the held outcomes, and only
    a uid that may submit has any.
    """

    name = "collect"
    mutating = True
    blocking = True
    summary = "Fetch the outcomes held for a client token, waiting up to timeout seconds."
    schema = {
        "token": Arg((str,), required=True, doc="the client token given at submit"),
        "timeout": Arg((float,), default=10.0, doc=f"seconds to wait, 0-{COLLECT_MAX_WAIT_S:g}"),
        "ack": Arg((int, type(None)), doc="how many of the token's outcomes the client has received"),
    }

    def check(self, args: dict[str, Any]) -> None:
        if not _TOKEN.fullmatch(args["token"]):
            raise self._bad(f"token must be 8-128 letters, digits, '_' or '-', got {args['token']!r}")
        if not 0 <= args["timeout"] <= COLLECT_MAX_WAIT_S:
            raise self._bad(f"timeout must be between 0 and {COLLECT_MAX_WAIT_S:g} seconds, got {args['timeout']!r}")
        if args["ack"] is not None and args["ack"] < 0:
            raise self._bad(f"ack must be >= 0, got {args['ack']!r}")

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Future:
        return handler.collect(token=args["token"], timeout=float(args["timeout"]), ack=args["ack"])

    def format(self, result: Any) -> str:
        outcomes = result.get("outcomes", []) if isinstance(result, dict) else []
        return f"{len(outcomes)} outcome(s)" + (", more waiting" if result.get("more") else "")


@OPS.register
class CancelOp(Op):
    """Cancel a unit that has not started: it never runs, and its outcome is failed
    ``Cancelled`` (counted in the ledger, delivered to its client). A unit already
    running, or ended, is left alone. Reply: ``{"unit", "cancelled": bool, "state"}``
    with ``state`` one of ``cancelled``, ``running``, ``ended`` (or not this daemon's)."""

    name = "cancel"
    mutating = True
    summary = "Cancel a unit that has not started yet."
    schema = {"unit": Arg((int,), required=True, doc="the unit id submit replied with")}

    def check(self, args: dict[str, Any]) -> None:
        _in_range(self, "unit", args["unit"], ranges.UNIT_ID)

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        return handler.cancel(args["unit"])


def _in_range(op: Op, name: str, value: Any, within) -> None:
    """InvalidArgs naming the argument, its value and its range (fleet.rules.ranges) unless
    `value` is None (not given) or in the range. JSON's 1e400 arrives as inf: refused."""
    if value is not None and not within.holds(value):
        raise op._bad(f"{name} {within.problem(value)}")


def _pool(op: Op, args: dict[str, Any]) -> None:
    from fleet.runtime.provider_gate import BadPool, parse_pool

    try:
        parse_pool(args["pool"])
    except BadPool as exc:
        raise op._bad(str(exc)) from None


@OPS.register
class AdmissionShowOp(Op):
    """The provider admission as the fleet's own process sees it: per bulkhead and per
    lane x bulkhead rows, live closures, the starving list, units waiting with their
    reason, and a catalog reload that failed (``policy_error``)."""

    name = "admission_show"
    summary = "The provider admission: bulkheads, lanes, closures, starving, waiting units."

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        return handler.admission_show()


@OPS.register
class AdmissionCloseOp(Op):
    """Close a provider (``pool: "provider"``) or one key (``"provider/credential"``) until
    ``until`` (UTC epoch seconds): nothing is admitted on it but one probe per interval.
    The closure is kept across restarts. Unknown pool or a past time: ``BadPool``."""

    name = "admission_close"
    mutating = True
    summary = "Close a provider or key until a time (an operator takes a key out)."
    schema = {
        "pool": Arg((str,), required=True, doc="provider or provider/credential"),
        "until": Arg((float,), required=True, doc="UTC epoch seconds"),
        "message": Arg((str,), default="", doc="why (shown with the closure)"),
    }

    def check(self, args: dict[str, Any]) -> None:
        _pool(self, args)
        if not 0 < args["until"] < 1e11:
            raise self._bad(f"until must be UTC epoch seconds, got {args['until']!r}")

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        return handler.admission_close(args["pool"], float(args["until"]), args["message"])


@OPS.register
class AdmissionReopenOp(Op):
    """Reopen a closed provider or key (a topped-up key need not wait for midnight);
    ``reopened``: whether it was closed. Unknown pool: ``BadPool``."""

    name = "admission_reopen"
    mutating = True
    summary = "Reopen a closed provider or key."
    schema = {"pool": Arg((str,), required=True, doc="provider or provider/credential")}

    def check(self, args: dict[str, Any]) -> None:
        _pool(self, args)

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        return handler.admission_reopen(args["pool"])


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

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        limit = args["limit"]
        return handler.admission_budget(args["provider"], float(args["spent"]), None if limit is None else float(limit))


# The coordinator API (reference 000 §9). Questions only: they read the admission and seat
# nothing, so any peer the server serves may ask them (like status and admission_show).
_LANE = Arg((str, type(None)), default=None, doc="the lane (None: units submitted without one)")


@OPS.register
class AdmissionAllowanceOp(Op):
    """``{"lane", "allowance"}``: None (start everything) unless every route the lane's work
    asks for is held back by a live refusal with no admitting alternative, then 0."""

    name = "admission_allowance"
    summary = "The provider admission's allowance for a lane (None: no hold; 0: hold its fan-out)."
    schema = {"lane": _LANE}

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        return {"lane": args["lane"], "allowance": handler.admission_allowance(args["lane"])}


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

    def check(self, args: dict[str, Any]) -> None:
        from fleet.route import Route

        try:
            Route.parse(args["route"])
        except ValueError as exc:
            raise self._bad(str(exc)) from None
        _in_range(self, "wanted", args["wanted"], ranges.PLAN_WANTED)

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        from fleet.route import Route

        route = Route.parse(args["route"])
        starts = handler.admission_plan(args["lane"], route, args["wanted"], args["pinned"])
        return {"lane": args["lane"], "route": str(route), "wanted": args["wanted"], "starts": starts}


@OPS.register
class AdmissionStarvingOp(Op):
    """``{"starving": [...]}``: closed providers or keys with work waiting first, then
    hard-pinned waits past ``starved_after``."""

    name = "admission_starving"
    summary = "The provider admission's starving list."

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        return {"starving": handler.admission_starving()}
