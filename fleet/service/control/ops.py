"""The ops: each op is one class holding all of it (fleetctl's command, the client's
method, the wire request and its check, the execution against the `Operations`
façade), the `OpRegistry` every side looks ops up in (`OPS`), and the
`ControlHandler` protocol the daemon implements for them.

Adding an op is one class here (and, when it is a new operation of the loop, its
method on `fleet.runtime.facade`): fleetctl's command list and help, `fleet.Client`'s
methods and the server's dispatch all come from `OPS`. Its CLI half lives here, not in
`fleet.cli` (the floor above): it needs only argparse and the pure parsing and text of
`terminal`. fleetctl adds what every command shares (``--name``, ``--trust-uid``,
``--json``); the one reply drawn with the status screen's tables (``admission show``)
is drawn by `fleet.cli.views`, keyed by op name."""
from __future__ import annotations

import base64
import binascii
import functools
import inspect
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, ClassVar, Protocol

from fleet.rules import ranges, vocab
from fleet.rules.errors import EXIT_DATA, EXIT_FAILURE, EXIT_OK
from fleet.rules.posture import STICKY_CAUSES
from fleet.runtime import facade
from fleet.runtime.facade import Operations
from fleet.service.control.errors import E_INVALID_ARGS, E_UNKNOWN_OP, ProtocolError
from fleet.rules.when import utc
from fleet.service.control.terminal import UNTIL_FORMS, fields_text, parse_patch, parse_until, posture_text
from fleet.service.control.wire import Arg, _json_type, check_args


class ControlHandler(Operations, Protocol):
    """What the daemon implements for the ops: the fleet's operator ops (`Operations`,
    the façade the embedded `fleet.Fleet` offers too) plus the two ops only a served
    fleet has, for its clients' units. Every method runs on the daemon's loop, but
    `collect`'s Future resolves later.

    Methods return JSON-serializable values. To refuse a request, raise a FleetError
    subclass: it travels to the client as ``{"type": <class name>, "message": str(exc)}``.
    Any other exception becomes an ``InternalError`` reply (and is logged).
    """

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
        items: int | None = None,
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
        list of items run as one unit (``Fleet.map`` with chunksize > 1), ``items`` of them
        (the ledger counts them; the daemon never unpickles the chunk to count). ``route``
        (a `fleet.Route`, parsed), ``severity``, ``pinned``, ``parent``, ``tag``, ``age``: the
        provider admission's arguments (`fleet.Fleet.submit`). Returns e.g. the unit id."""

    def collect(self, *, token: str, timeout: float, ack: int | None = None) -> Future:
        """The outcomes held for ``token``: a Future resolved, without blocking the
        caller, as soon as one is ready or after ``timeout`` seconds (then empty).
        ``ack``: how many of the token's outcomes the client has (`CollectOp`)."""


# ----------------------------------------------------------------------------- ops


class Op:
    """One command, all of it: subclass, set the class attributes, register in `OPS`.

    The wire: ``name`` (the op's name on the wire), ``mutating`` (needs the daemon's
    uid or root), ``blocking`` (a long poll, kept off the main loop), ``summary`` (one
    line for help), ``schema`` (``{arg: Arg}``), `validate` / `check` (the daemon's
    judge of the arguments, run by the client too before sending), `execute` (the
    command, against the `Operations` façade or the daemon's `ControlHandler`).

    fleetctl's half: ``command`` (its words: ``("drain",)``, ``("posture", "set")``;
    fleetctl builds its command list from these), `add_arguments`, `from_cli` (the
    wire arguments from the parsed command line), `render` (the reply as text) and
    `exit_code`. fleetctl adds ``--name``, ``--trust-uid`` and ``--json`` to each.
    An op with no command says why in ``no_command``.

    The client's half: ``method`` (the `fleet.Client` method `OpRegistry.client_methods`
    makes of `client`, whose signature it takes), or None with ``no_method`` saying why.
    """

    name: ClassVar[str]
    mutating: ClassVar[bool] = False
    #: A blocking op waits for an event (a long poll). Its `execute` must return a
    #: Future at once instead of a value; the daemon dispatches it off the main loop.
    blocking: ClassVar[bool] = False
    summary: ClassVar[str] = ""
    schema: ClassVar[Mapping[str, Arg]] = {}

    command: ClassVar[tuple[str, ...] | None] = None
    no_command: ClassVar[str] = ""
    #: fleetctl's help for the command (default: ``summary``); ``description`` its longer text.
    help: ClassVar[str] = ""
    description: ClassVar[str] = ""

    method: ClassVar[str | None] = ""  # "" : named after the op
    no_method: ClassVar[str] = ""

    def __init__(self):
        if self.method == "":
            self.method = self.name

    # -- client half
    def to_wire(self, **args: Any) -> dict[str, Any]:
        """Build the request's args from a caller's keyword arguments (checked locally)."""
        self.validate(args)
        return args

    def client(self, call: Callable[..., Any], **args: Any) -> Any:
        """The `fleet.Client` method's body: ``call(**wire_args)`` sends the op and returns
        its reply. Overridden for a signature of its own or to unwrap a reply."""
        return call(**args)

    # -- fleetctl half
    def add_arguments(self, parser) -> None:
        """The command's own arguments (an argparse parser)."""

    def from_cli(self, args) -> dict[str, Any]:
        """The wire arguments from the parsed command line."""
        return {}

    def render(self, result: Any, args) -> str:
        """The reply as text for a terminal."""
        return fields_text(result)

    def exit_code(self, result: Any) -> int:
        """fleetctl's exit code for a reply (an error reply exits with its error's code)."""
        return EXIT_OK

    # -- daemon half
    def validate(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Schema check plus `check`; returns the normalized args `execute` receives."""
        checked = check_args(self.name, self.schema, args)
        self.check(checked)
        return checked

    def check(self, args: dict[str, Any]) -> None:
        """Op-specific checks beyond types; may normalize ``args`` in place."""

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
        """Run against the handler; called on the thread that owns the state."""
        raise NotImplementedError

    def _bad(self, message: str) -> ProtocolError:
        return ProtocolError(E_INVALID_ARGS, f"{self.name}: {message}")


class OpRegistry:
    """Op name -> op instance. The client, the server and fleetctl look ops up here."""

    def __init__(self, ops: Iterable[type[Op]] = ()):
        self._ops: dict[str, Op] = {}
        for op in ops:
            self.register(op)

    def register(self, op_cls: type[Op]) -> type[Op]:
        """Add an op class (usable as a class decorator). A duplicate name, or a second op
        with the same fleetctl command or client method, is an error."""
        op = op_cls()
        if op.name in self._ops:
            raise ValueError(f"op {op.name!r} is already registered")
        for other in self._ops.values():
            if op.command is not None and other.command == op.command:
                raise ValueError(f"op {op.name!r}: fleetctl {' '.join(op.command)} is op {other.name!r} already")
            if op.method is not None and other.method == op.method:
                raise ValueError(f"op {op.name!r}: client method {op.method} is op {other.name!r} already")
        if op.command is None and not op.no_command:
            raise ValueError(f"op {op.name!r} has no fleetctl command: say why in no_command")
        if op.method is None and not op.no_method:
            raise ValueError(f"op {op.name!r} has no client method: say why in no_method")
        self._ops[op.name] = op
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

    def commands(self) -> list[Op]:
        """The ops fleetctl has a command for, in the order they were registered."""
        return [op for op in self._ops.values() if op.command is not None]

    def client_methods(self) -> dict[str, Callable[..., Any]]:
        """Method name -> function, for a class with ``_call(op_name, **args)`` (`fleet.Client`):
        each calls its op's `client` with the op's ``call``, under the op's signature."""
        return {op.method: _client_method(op) for op in self._ops.values() if op.method is not None}

    def __contains__(self, name: object) -> bool:
        return name in self._ops


def _client_method(op: Op) -> Callable[..., Any]:
    name = op.name

    def method(self, *args: Any, **kwargs: Any) -> Any:
        return op.client(functools.partial(self._call, name), *args, **kwargs)

    signature = inspect.signature(op.client)  # bound: (call, ...)
    params = list(signature.parameters.values())[1:]
    method.__signature__ = signature.replace(
        parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *params])
    method.__name__ = op.method
    method.__doc__ = inspect.getdoc(op.client) if type(op).client is not Op.client else op.summary
    return method


#: The words of fleetctl's command groups and their help (a group's commands are ops).
COMMAND_GROUPS = {
    "posture": "Show the cordon posture and its thresholds, retune them, or release a sticky cause on the "
               "running fleet.",
    "admission": "Show the provider admission's bulkheads, closures and starving list; close or reopen a "
                 "provider or key.",
}


#: The registry of fleet's ops.
OPS = OpRegistry()

#: The six posture thresholds a `posture_set` patch may touch (fleet.rules.vocab).
POSTURE_KEYS = frozenset(vocab.POSTURE_KEYS)


@OPS.register
class PingOp(Op):
    name = "ping"
    summary = "Check that the daemon's main loop answers."
    no_command = "every fleetctl command that reaches the daemon shows it answers; fleetctl status shows its state"

    def client(self, call: Callable[..., Any]) -> dict:
        """``{"pong": True, "pid"}``: the daemon's loop answers."""
        return call()

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
        # No handler method: answering at all proves the owning loop is turning.
        return {"pong": True, "pid": os.getpid()}


@OPS.register
class StatusOp(Op):
    name = "status"
    summary = "Plan, budget, census, posture, ledger counters and queue depths."
    no_command = "fleetctl status reads the fleet's table: it answers for an embedded fleet and a busy daemon too"

    def client(self, call: Callable[..., Any]) -> dict:
        """What `fleetctl status --json` shows, plus the daemon's own ``daemon`` section."""
        return call()

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
        return handler.status()


@OPS.register
class LedgerOp(Op):
    name = "ledger"
    summary = "Ledger counters: submitted, solved, suppressed, failed by reason."
    no_command = "fleetctl status shows the ledger (read from the table)"

    def client(self, call: Callable[..., Any]) -> dict:
        """submitted, solved, suppressed, failed (+ in flight and failures by reason)."""
        return call()

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
        return handler.ledger()


@OPS.register
class PostureShowOp(Op):
    name = "posture_show"
    summary = "The posture state and its thresholds."
    command = ("posture", "show")
    help = "the posture, its counters and the effective thresholds"

    def render(self, result: Any, args) -> str:
        return posture_text(result)

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
        return handler.posture_show()


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

    def add_arguments(self, parser) -> None:
        parser.add_argument("assignments", nargs="*", metavar="KEY=VALUE",
                            help=f"one of: {', '.join(sorted(POSTURE_KEYS))}")

    def from_cli(self, args) -> dict[str, Any]:
        return {"patch": parse_patch(args.assignments)}

    def render(self, result: Any, args) -> str:
        return posture_text(result, changed=parse_patch(args.assignments))

    def client(self, call: Callable[..., Any], **patch: Any) -> dict:
        """Retune posture thresholds; RemoteError ``PostureRetuneError`` (exit 78) if refused."""
        return call(patch=patch)

    def check(self, args: dict[str, Any]) -> None:
        patch = args["patch"]
        if not patch:
            raise self._bad(f"patch is empty; give at least one of {', '.join(sorted(POSTURE_KEYS))}")
        unknown = sorted(set(patch) - POSTURE_KEYS)
        if unknown:
            raise self._bad(
                f"unknown posture key(s) {', '.join(unknown)} (known: {', '.join(sorted(POSTURE_KEYS))})"
            )

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
        # A copy: the handler may keep it, and the request's dict is not its to own.
        return handler.posture_set(dict(args["patch"]))


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

    def add_arguments(self, parser) -> None:
        parser.add_argument("cause", metavar="CAUSE", choices=STICKY_CAUSES, help=f"one of: {', '.join(STICKY_CAUSES)}")

    def from_cli(self, args) -> dict[str, Any]:
        return {"cause": args.cause}

    def render(self, result: Any, args) -> str:
        said = "released" if result.get("released") else "was not held; nothing changed"
        return f"{args.cause}: {said}\n" + posture_text(result)

    def client(self, call: Callable[..., Any], cause: str) -> dict:
        """Release a sticky posture cause (``lane-death``, ``operator``); the posture view
        with ``released`` (was it held)."""
        return call(cause=cause)

    def check(self, args: dict[str, Any]) -> None:
        if args["cause"] not in STICKY_CAUSES:
            raise self._bad(f"unknown posture cause {args['cause']!r} (causes: {', '.join(STICKY_CAUSES)})")

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
        return handler.posture_release(args["cause"])


@OPS.register
class DrainOp(Op):
    name = "drain"
    mutating = True
    summary = "Stop taking new units; in-flight units finish."
    command = ("drain",)
    help = "Stop taking new units; in-flight units finish (undo with `fleetctl resume`)."

    def client(self, call: Callable[..., Any]) -> dict:
        """Take nothing new from the queues; in-flight units finish (undo with `resume`)."""
        return call()

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
        return handler.drain()


@OPS.register
class ResumeOp(Op):
    name = "resume"
    mutating = True
    summary = "Take new units again after a drain."
    command = ("resume",)
    help = "Take new units again after `fleetctl drain`."

    def client(self, call: Callable[..., Any]) -> dict:
        """Take units from the queues again after `drain`."""
        return call()

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
        return handler.resume()


@OPS.register
class SubmitOp(Op):
    """Submit one unit. On the wire the payload is JSON (``encoding: "json"``) or a
    base64 string of pickled bytes (``encoding: "pickle"``). Only the daemon's uid and
    root may submit, which is what makes accepting pickles acceptable."""

    name = "submit"
    mutating = True
    summary = "Submit one unit of work to a role."
    no_command = "a unit's payload is a Python object: submit from Python (fleet.connect(name).submit)"
    method = None
    no_method = "fleet.Client.submit (the Executor's) sends it, with the future of the unit's outcome"
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
        "items": Arg((int, type(None)), doc="how many items the chunk holds (the ledger counts them)"),
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
        if args["items"] is not None and not args["chunk"]:
            raise self._bad("items counts the items of a chunk: give chunk too")
        _in_range(self, "items", args["items"], ranges.CHUNK_ITEMS)
        if args["route"] is not None:
            from admission.route import Route

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
    no_command = "outcomes are held for the client that submitted the units, under its own token"
    method = None
    no_method = "the client's collector thread long-polls it to resolve its futures"
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


@OPS.register
class CancelOp(Op):
    """Cancel a unit that has not started: it never runs, and its outcome is failed
    ``Cancelled`` (counted in the ledger, delivered to its client). A unit already
    running, or ended, is left alone. Reply: ``{"unit", "cancelled": bool, "state"}``
    with ``state`` one of ``cancelled``, ``running``, ``ended``, ``unknown`` (an id the
    fleet never handed out). fleetctl exits 0 when it cancelled the unit, 1 when the
    unit is running or ended (nothing changed), 65 for an unknown id."""

    name = "cancel"
    mutating = True
    summary = "Cancel a unit that has not started yet."
    schema = {"unit": Arg((int,), required=True, doc="the unit id submit replied with")}
    command = ("cancel",)
    help = "Cancel a queued unit by id: it never runs and fails Cancelled; a running or ended one is left alone."
    description = (help + " Exit 0: cancelled; 1: running or already ended (nothing changed); 65: no unit of "
                   "this fleet has that id.")
    #: What fleetctl says and exits with, per state.
    TEXT = {facade.CANCELLED: ("cancelled: it will not run; its outcome is failed Cancelled", EXIT_OK),
            facade.RUNNING: ("not cancelled: it is running and ends with its own outcome", EXIT_FAILURE),
            facade.ENDED: ("not cancelled: it has ended already", EXIT_FAILURE),
            facade.UNKNOWN: ("unknown: no unit of this fleet has that id", EXIT_DATA)}

    def add_arguments(self, parser) -> None:
        parser.add_argument("unit", metavar="UNIT", type=int, help="the unit id (submit's reply, Future.unit_id)")

    def from_cli(self, args) -> dict[str, Any]:
        return {"unit": args.unit}

    def render(self, result: Any, args) -> str:
        return f"unit {result['unit']}: {self.TEXT[result['state']][0]}\n"

    def exit_code(self, result: Any) -> int:
        return self.TEXT[result["state"]][1]

    def client(self, call: Callable[..., Any], unit: int) -> dict:
        """Cancel unit ``unit`` (its id, ``future.unit_id``) if it has not started:
        ``{"unit", "cancelled", "state"}`` (see `fleet.runtime.facade.CANCEL_STATES`).
        ``future.cancel()`` does the same for a future of this client."""
        return call(unit=unit)

    def check(self, args: dict[str, Any]) -> None:
        _in_range(self, "unit", args["unit"], ranges.UNIT_ID)

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
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
    command = ("admission", "show")
    help = "bulkheads, lane rows, closures, starving list and waiting units"

    def client(self, call: Callable[..., Any]) -> dict:
        """The provider admission's read model (see `fleet.Fleet.status`'s ``admission``)."""
        return call()

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
        return handler.admission_show()


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

    def client(self, call: Callable[..., Any], pool: str, until: float, message: str = "") -> dict:
        """Close a provider or ``provider/credential`` until `until` (UTC epoch seconds)."""
        return call(pool=pool, until=float(until), message=message)

    def check(self, args: dict[str, Any]) -> None:
        _pool(self, args)
        if not 0 < args["until"] < 1e11:
            raise self._bad(f"until must be UTC epoch seconds, got {args['until']!r}")

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
        return handler.admission_close(args["pool"], float(args["until"]), args["message"])


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

    def add_arguments(self, parser) -> None:
        parser.add_argument("pool", metavar="POOL", help=_POOL_HELP)

    def from_cli(self, args) -> dict[str, Any]:
        return {"pool": args.pool}

    def render(self, result: Any, args) -> str:
        return f"{result['pool']}: {'reopened' if result['reopened'] else 'was not closed; nothing changed'}\n"

    def client(self, call: Callable[..., Any], pool: str) -> dict:
        """Reopen a closed provider or key; ``reopened``: whether it was closed."""
        return call(pool=pool)

    def check(self, args: dict[str, Any]) -> None:
        _pool(self, args)

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
        return handler.admission_reopen(args["pool"])


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

    def add_arguments(self, parser) -> None:
        parser.add_argument("provider", metavar="PROVIDER", help="the provider whose budget was read")
        parser.add_argument("--spent", required=True, type=_amount, metavar="X", help="spent today (e.g. USD)")
        parser.add_argument("--limit", type=_amount, default=None, metavar="Y", help="the daily limit (omit: none)")

    def from_cli(self, args) -> dict[str, Any]:
        return {"provider": args.provider, "spent": args.spent, "limit": args.limit}

    def render(self, result: Any, args) -> str:
        limit = "no limit" if result["limit"] is None else f"limit {result['limit']:g}"
        return f"{result['provider']}: spent {result['spent']:g} today, {limit}\n"

    def client(self, call: Callable[..., Any], provider: str, spent: float, limit: float | None = None) -> dict:
        """As `fleet.Fleet.report_budget`: the provider's daily budget reading (RemoteError ``BadBudget``)."""
        return call(provider=provider, spent=spent, limit=limit)

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
        limit = args["limit"]
        return handler.admission_budget(args["provider"], float(args["spent"]), None if limit is None else float(limit))


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

    def client(self, call: Callable[..., Any], lane: str | None) -> int | None:
        """As `fleet.Fleet.admission_allowance`: None, or 0 while every route of the lane is held back."""
        return call(lane=lane)["allowance"]

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
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
    no_command = _COORDINATOR

    def client(self, call: Callable[..., Any], lane: str | None, route, wanted: int, pinned: bool = False) -> int:
        """As `fleet.Fleet.admission_plan`: how many of `wanted` units on `route` would start now. A route
        outside the catalog: RemoteError ``BadPlan``; a route that is not a `fleet.Route`: BadPlan
        (nothing sent); other malformed arguments: ProtocolError ``InvalidArgs``."""
        from admission.route import Route

        if type(route) is not Route:
            from fleet.runtime.provider_gate import BadPlan

            raise BadPlan(f"route must be a fleet.Route(model, provider, credential=None), not {type(route).__name__}")
        return call(lane=lane, route=str(route), wanted=wanted, pinned=pinned)["starts"]

    def check(self, args: dict[str, Any]) -> None:
        from admission.route import Route

        try:
            Route.parse(args["route"])
        except ValueError as exc:
            raise self._bad(str(exc)) from None
        _in_range(self, "wanted", args["wanted"], ranges.PLAN_WANTED)

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
        from admission.route import Route

        route = Route.parse(args["route"])
        starts = handler.admission_plan(args["lane"], route, args["wanted"], args["pinned"])
        return {"lane": args["lane"], "route": str(route), "wanted": args["wanted"], "starts": starts}


@OPS.register
class AdmissionStarvingOp(Op):
    """``{"starving": [...]}``: closed providers or keys with work waiting first, then
    hard-pinned waits past ``starved_after``."""

    name = "admission_starving"
    summary = "The provider admission's starving list."
    no_command = _COORDINATOR

    def client(self, call: Callable[..., Any]) -> list[dict]:
        """As `fleet.Fleet.admission_starving`."""
        return call()["starving"]

    def execute(self, handler: Operations, args: dict[str, Any]) -> Any:
        return {"starving": handler.admission_starving()}
