"""The control protocol: framed JSON requests and replies over a Unix stream socket.

Wire format. One frame is one line: a UTF-8 JSON object followed by ``\\n``, at most
`MAX_FRAME` bytes (the newline excluded). A request is
``{"id": <int|string|null>, "op": <string>, "args": {...}}``; its reply is either
``{"id": .., "ok": true, "result": ..}`` or
``{"id": .., "ok": false, "error": {"type": .., "message": ..}}``. Replies come in
request order on the connection that asked. A frame over the limit gets a
``FrameTooLarge`` reply and the connection is closed (the stream cannot be resynced
without reading the rest); any other bad frame gets an error reply and the
connection goes on.

Ops. Each op is one class holding both halves of the command: the client half
(`Op.to_wire` builds the arguments, `Op.format` renders a result for people) and the
daemon half (`Op.validate` checks the arguments against the op's schema,
`Op.execute` calls the `ControlHandler`). `OPS` is the registry both sides look ops
up in; nothing routes by if/elif.

Who may do what. Anyone who can connect (the socket is mode 0660, group of the
owner unless configured) may run read-only ops. Mutating ops (``mutating = True``)
are refused with ``PermissionDenied`` unless the peer's uid, read with SO_PEERCRED,
is the daemon's own uid or root.

Threads. `ControlServer` reads, validates and answers on one thread that
multiplexes every connection (selectors), then hands each validated `Call` to a
dispatch callback that returns a Future. The daemon passes `CallQueue.submit` so
every op runs on the main loop that owns the state (the loop calls
`CallQueue.run_pending`); the server thread never waits for a Future: its
completion wakes the server loop, which sends the reply (or a ``Timeout`` reply
after ``reply_timeout``). Nothing here changes daemon state from the server
thread. A *blocking* op (``Op.blocking``, i.e. ``collect``) is the one exception
to "ops run on the main loop": it waits for something to happen, so the daemon's
dispatch does not queue it to the loop; its ``execute`` returns at once with a
Future that the daemon resolves later, and nothing waits on it meanwhile.

Connections. The server admits connections by uid (a cap per uid, a reserve for
the owner and root; an idle connection of a uid at its cap is closed to make room),
gives each a deadline to complete a frame, and refuses with a ``Busy`` error reply
(``"id": null``) when no room can be made; the client raises `ControlBusy`. See
`ControlServer`.

Result delivery (service mode). ``submit`` admits a unit and replies at once with
its unit id. A client that wants outcomes passes a ``token`` (a random string it
keeps for its life) and a ``seq`` (its own number for the unit); the daemon holds
each outcome under the token until the client fetches it with ``collect``, a long
poll that returns every outcome ready for the token (or an empty list after its
``timeout``). A reply never exceeds `COLLECT_REPLY_BUDGET`: outcomes beyond it wait
for the next ``collect`` (the reply says ``"more": true``), and one value too large
for a reply travels in consecutive ``part``s that the client joins. Outcomes held
for a token are bounded (bytes, and time since the token was last seen); past the
bound the daemon drops them, logs it, and answers that token's next ``collect``
with ``OutcomesDropped`` so the client fails its pending futures loudly.
"""
from __future__ import annotations

import base64
import binascii
import collections
import errno
import itertools
import json
import logging
import os
import pickle
import re
import select
import selectors
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from .errors import (
    EXIT_CONFIG,
    EXIT_FAILURE,
    EXIT_NO_PERMISSION,
    EXIT_NOT_RUNNING,
    EXIT_USAGE,
    FleetError,
    NotRunning,
)

__all__ = [
    "MAX_FRAME",
    "OPS",
    "POSTURE_KEYS",
    "Arg",
    "Call",
    "CallQueue",
    "COLLECT_MAX_WAIT_S",
    "COLLECT_REPLY_BUDGET",
    "ControlBusy",
    "ControlClient",
    "ControlError",
    "ControlHandler",
    "ControlServer",
    "ControlTimeout",
    "FleetConnectionLost",
    "InvalidFleetName",
    "NotRunning",
    "Op",
    "OpRegistry",
    "OutcomesDropped",
    "Peer",
    "PermissionDenied",
    "ProtocolError",
    "RemoteError",
    "Reply",
    "Request",
    "ShuttingDown",
    "decode_reply",
    "decode_request",
    "encode_error",
    "encode_reply",
    "encode_request",
    "find_socket",
    "inline_dispatch",
    "prepare_runtime_dir",
    "runtime_dir",
    "socket_candidates",
    "socket_path",
    "validate_fleet_name",
    "with_blocking_ops",
]

log = logging.getLogger("fleet.control")

#: Largest frame (one JSON line, newline excluded) either side accepts: 1 MiB.
MAX_FRAME = 1 << 20

# Error types carried in error replies. Handler errors that are FleetErrors travel
# under their class name (e.g. "ConfigError") so clients can tell them apart.
E_MALFORMED = "MalformedRequest"  # not UTF-8, not JSON
E_TOO_LARGE = "FrameTooLarge"
E_INVALID = "InvalidRequest"  # JSON, but not a request envelope
E_UNKNOWN_OP = "UnknownOp"
E_INVALID_ARGS = "InvalidArgs"
E_PERMISSION = "PermissionDenied"
E_TIMEOUT = "Timeout"
E_SHUTTING_DOWN = "ShuttingDown"
E_BUSY = "Busy"
E_INTERNAL = "InternalError"
E_INVALID_REPLY = "InvalidReply"


# --------------------------------------------------------------------------- errors


class ControlError(FleetError):
    """Base of the control protocol's errors."""


class ProtocolError(ControlError):
    """A frame, request or reply broke the protocol.

    ``code`` is the error type sent on the wire (e.g. ``InvalidArgs``); ``message``
    names what was wrong; ``request_id`` is the request's id once it is known.
    """

    exit_code = EXIT_USAGE

    def __init__(self, code: str, message: str, request_id: Any = None):
        self.code = code
        self.message = message
        self.request_id = request_id
        super().__init__(f"{code}: {message}")


class RemoteError(ControlError):
    """The daemon answered a request with an error reply: ``type`` and ``message``."""

    #: Exit codes for error types the caller caused; any other type exits 1.
    EXIT_CODES = {
        **dict.fromkeys((E_MALFORMED, E_TOO_LARGE, E_INVALID, E_UNKNOWN_OP, E_INVALID_ARGS), EXIT_USAGE),
        # the daemon refused a value (e.g. a posture threshold): what fleet.posture raises
        "ConfigError": EXIT_CONFIG,
        "PostureRetuneError": EXIT_CONFIG,
        E_PERMISSION: EXIT_NO_PERMISSION,
    }

    def __init__(self, type: str, message: str):
        self.type = type
        self.message = message
        super().__init__(f"{type}: {message}")
        self.exit_code = self.EXIT_CODES.get(type, EXIT_FAILURE)


class PermissionDenied(RemoteError):
    """The peer may not run that op (mutating op from another uid), or may not connect."""

    def __init__(self, message: str):
        super().__init__(E_PERMISSION, message)


class ControlBusy(RemoteError):
    """The daemon refused the connection: every control connection it allows is busy
    (its own limits, see `ControlServer`). Try again shortly; nothing was run."""

    #: EX_TEMPFAIL: a temporary condition, retrying later may work.
    EXIT_BUSY = 75

    def __init__(self, message: str):
        super().__init__(E_BUSY, message)
        self.exit_code = self.EXIT_BUSY


class ControlTimeout(ControlError):
    """The daemon did not reply within the client's timeout."""


class ShuttingDown(ControlError):
    """The daemon is stopping and takes no more control requests."""


class FleetConnectionLost(ControlError):
    """A service-mode client lost its daemon (it died, or the socket broke) before an
    outcome arrived: every future still pending fails with this, none is left hanging."""

    exit_code = EXIT_NOT_RUNNING


class OutcomesDropped(FleetConnectionLost):
    """The daemon dropped outcomes held for a client token that was not collected in time
    or held more than its bound (see `CollectOp`): the client's pending futures fail."""


# --------------------------------------------------------------------- names, paths

# The fleet-name rule lives in fleet.names (one rule for config, segments and
# sockets); both names stay importable from here.
from .names import InvalidFleetName, validate_fleet_name  # noqa: E402


_SYSTEM_RUNTIME_DIR = Path("/run/fleet")


def runtime_dir(
    env: Mapping[str, str] | None = None,
    *,
    euid: int | None = None,
    access: Callable[[str, int], bool] = os.access,
) -> Path:
    """The directory a daemon puts its control socket in.

    In order: ``$RUNTIME_DIRECTORY`` (set by systemd's ``RuntimeDirectory=``; the
    first entry when several), ``/run/fleet`` when root or when it is writable,
    ``$XDG_RUNTIME_DIR/fleet``, else ``/tmp/fleet-<euid>``.
    """
    env = os.environ if env is None else env
    systemd_dir = env.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if systemd_dir:
        return Path(systemd_dir)
    euid = os.geteuid() if euid is None else euid
    if euid == 0 or access(str(_SYSTEM_RUNTIME_DIR), os.W_OK | os.X_OK):
        return _SYSTEM_RUNTIME_DIR
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "fleet"
    return Path("/tmp") / f"fleet-{euid}"


def socket_path(name: str, env: Mapping[str, str] | None = None, **kwargs: Any) -> Path:
    """``<runtime_dir>/<name>.sock``, the daemon's socket path (see `runtime_dir`)."""
    return runtime_dir(env, **kwargs) / f"{validate_fleet_name(name)}.sock"


def socket_candidates(
    name: str, env: Mapping[str, str] | None = None, *, euid: int | None = None
) -> list[Path]:
    """Every place a daemon named ``name`` may have its socket, in lookup order.

    A client cannot use `runtime_dir` alone: an operator who is not root sees
    ``/run/fleet`` as not writable, yet that is where the systemd service lives.
    """
    env = os.environ if env is None else env
    euid = os.geteuid() if euid is None else euid
    validate_fleet_name(name)
    dirs = []
    if env.get("RUNTIME_DIRECTORY"):
        dirs.append(Path(env["RUNTIME_DIRECTORY"].split(":")[0]))
    dirs.append(_SYSTEM_RUNTIME_DIR)
    if env.get("XDG_RUNTIME_DIR"):
        dirs.append(Path(env["XDG_RUNTIME_DIR"]) / "fleet")
    dirs.append(Path("/tmp") / f"fleet-{euid}")
    return list(dict.fromkeys(d / f"{name}.sock" for d in dirs))


def find_socket(name: str, env: Mapping[str, str] | None = None, **kwargs: Any) -> Path:
    """The first existing socket among `socket_candidates`; NotRunning naming them if none."""
    candidates = socket_candidates(name, env, **kwargs)
    for path in candidates:
        if path.exists():
            return path
    tried = ", ".join(str(p) for p in candidates)
    raise NotRunning(f"fleet {name!r} is not running: no control socket at {tried}")


def prepare_runtime_dir(path: str | os.PathLike, *, euid: int | None = None) -> Path:
    """Create ``path`` (mode 0755) if needed and check that it is safe to bind in.

    Refuses (ControlError) a symlink, a non-directory, a directory owned by someone
    other than ``euid`` or root, or one others can write without the sticky bit:
    under /tmp another user could have made it first to catch our socket.
    """
    path = Path(path)
    euid = os.geteuid() if euid is None else euid
    path.mkdir(mode=0o755, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ControlError(f"runtime dir {path}: not a directory (or a symlink)")
    if st.st_uid not in (euid, 0):
        raise ControlError(f"runtime dir {path}: owned by uid {st.st_uid}, expected {euid}")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise ControlError(
            f"runtime dir {path}: writable by group or others (mode {st.st_mode & 0o7777:o})"
        )
    return path


# ----------------------------------------------------------------------------- wire


@dataclass(frozen=True)
class Request:
    """A decoded request envelope. ``args`` is not yet checked against the op's schema."""

    id: int | str | None
    op: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    """A decoded reply: ``result`` when ``ok``, else ``error_type`` and ``error_message``."""

    id: int | str | None
    ok: bool
    result: Any = None
    error_type: str = ""
    error_message: str = ""


def _dumps(obj: Any) -> bytes:
    # allow_nan=False: NaN/Infinity are not JSON and other clients would choke on them.
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _loads(frame: bytes, max_frame: int) -> Any:
    """Parse one frame, raising ProtocolError for every way it can be bad."""
    if frame.endswith(b"\r"):
        frame = frame[:-1]
    if len(frame) > max_frame:
        raise ProtocolError(E_TOO_LARGE, f"frame of {len(frame)} bytes exceeds {max_frame}")
    try:
        text = frame.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(E_MALFORMED, f"frame is not UTF-8: {exc.reason} at byte {exc.start}")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ProtocolError(E_MALFORMED, "JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and int digit limits
        raise ProtocolError(E_MALFORMED, f"invalid JSON: {exc}") from None


def _valid_id(value: Any) -> bool:
    return value is None or isinstance(value, str) or (
        isinstance(value, int) and not isinstance(value, bool)
    )


def encode_request(op: str, args: Mapping[str, Any] | None = None, id: int | str | None = None) -> bytes:
    """One request frame, newline included."""
    return _dumps({"id": id, "op": op, "args": dict(args or {})})


def decode_request(frame: bytes, *, max_frame: int = MAX_FRAME) -> Request:
    """Parse one request frame (trailing newline optional) into a `Request`.

    Raises ProtocolError: FrameTooLarge, MalformedRequest (not UTF-8 / not JSON) or
    InvalidRequest (not an object; unknown keys; bad id, op or args), naming what
    was wrong. The op name and the args are checked later, by `OpRegistry`.
    """
    obj = _loads(frame.rstrip(b"\n"), max_frame)
    if not isinstance(obj, dict):
        raise ProtocolError(E_INVALID, f"request must be a JSON object, got {_json_type(obj)}")
    rid = obj.get("id")
    if not _valid_id(rid):
        raise ProtocolError(E_INVALID, f"id must be an integer, string or null, got {_json_type(rid)}")
    unknown = sorted(set(obj) - {"id", "op", "args"})
    if unknown:
        raise ProtocolError(E_INVALID, f"unknown request key(s): {', '.join(unknown)}", rid)
    op = obj.get("op")
    if not isinstance(op, str) or not op:
        raise ProtocolError(E_INVALID, f"op must be a non-empty string, got {_json_type(op)}", rid)
    args = obj.get("args", {})
    if not isinstance(args, dict):
        raise ProtocolError(E_INVALID, f"args must be an object, got {_json_type(args)}", rid)
    return Request(rid, op, args)


def encode_reply(id: int | str | None, result: Any) -> bytes:
    """A success reply frame. Raises TypeError/ValueError if ``result`` is not JSON."""
    return _dumps({"id": id, "ok": True, "result": result})


def encode_error(id: int | str | None, type: str, message: str) -> bytes:
    """An error reply frame: ``{"id":..,"ok":false,"error":{"type":..,"message":..}}``."""
    return _dumps({"id": id, "ok": False, "error": {"type": type, "message": message}})


def decode_reply(frame: bytes, *, max_frame: int = 64 * MAX_FRAME) -> Reply:
    """Parse a reply frame; raises ProtocolError(InvalidReply) when it is not one."""
    try:
        obj = _loads(frame.rstrip(b"\n"), max_frame)
    except ProtocolError as exc:
        raise ProtocolError(E_INVALID_REPLY, exc.message) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("ok"), bool) or not _valid_id(obj.get("id")):
        raise ProtocolError(E_INVALID_REPLY, "reply must be an object with a boolean 'ok' and an id")
    if obj["ok"]:
        return Reply(obj["id"], True, obj.get("result"))
    err = obj.get("error")
    if not (isinstance(err, dict) and isinstance(err.get("type"), str) and isinstance(err.get("message"), str)):
        raise ProtocolError(E_INVALID_REPLY, "error reply lacks error.type / error.message strings")
    return Reply(obj["id"], False, None, err["type"], err["message"])


# --------------------------------------------------------------------------- schema

_JSON_NAMES = {
    str: "string", int: "integer", float: "number", bool: "boolean",
    dict: "object", list: "array", type(None): "null",
}


def _json_type(value: Any) -> str:
    return _JSON_NAMES.get(type(value), type(value).__name__)


def _is(value: Any, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # bool is an int subclass; JSON keeps them apart
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, kinds)


@dataclass(frozen=True)
class Arg:
    """One argument of an op: accepted JSON types (None = any JSON value), required, default."""

    kinds: tuple[type, ...] | None
    required: bool = False
    default: Any = None
    doc: str = ""

    def describe(self) -> str:
        if self.kinds is None:
            return "any JSON value"
        return " or ".join(_JSON_NAMES[k] for k in self.kinds)


def check_args(op: str, schema: Mapping[str, Arg], args: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``args`` against ``schema``; returns them with defaults filled in.

    Raises ProtocolError(InvalidArgs) naming every unknown, missing or mistyped argument.
    """
    problems = []
    unknown = sorted(set(args) - set(schema))
    if unknown:
        problems.append(
            f"unknown argument(s) {', '.join(unknown)} (accepted: {', '.join(sorted(schema)) or 'none'})"
        )
    for name, spec in schema.items():
        if name not in args:
            if spec.required:
                problems.append(f"missing required argument {name} ({spec.describe()})")
        elif spec.kinds is not None and not _is(args[name], spec.kinds):
            problems.append(f"argument {name} must be {spec.describe()}, got {_json_type(args[name])}")
    if problems:
        raise ProtocolError(E_INVALID_ARGS, f"{op}: " + "; ".join(problems))
    return {name: args.get(name, spec.default) for name, spec in schema.items()}


# ------------------------------------------------------------------------- handler


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
    ) -> Any:
        """Admit one unit. ``payload`` is pickled bytes when ``encoding == "pickle"``,
        else the decoded JSON value. With a ``token`` the outcome is held for
        `collect` under that token, tagged with ``seq``. ``chunk``: the payload is a
        list of items run as one unit (``Fleet.map`` with chunksize > 1). Returns e.g.
        the unit id."""

    def ledger(self) -> Any:
        """The ledger counters: submitted, solved, suppressed, failed by reason."""

    def collect(self, *, token: str, timeout: float) -> Future:
        """The outcomes held for ``token``: a Future resolved, without blocking the
        caller, as soon as one is ready or after ``timeout`` seconds (then empty)."""

    def cancel(self, unit: int) -> Any:
        """Cancel unit ``unit`` if it has not started; say what became of it (`CancelOp`)."""


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

#: The six posture thresholds a `posture_set` patch may touch.
POSTURE_KEYS = frozenset(
    {
        "cordon_enter_events",
        "cordon_enter_window_ms",
        "cordon_duty_percent",
        "cordon_duty_window_ms",
        "cordon_exit_clean_ms",
        "cordon_sim_intake_floor",
    }
)


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
        from .posture import STICKY_CAUSES

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
        "request_id": Arg((str, type(None)), doc="idempotency id"),
        "token": Arg((str, type(None)), doc="hold the outcome for `collect` under this client token"),
        "seq": Arg((int, type(None)), doc="the client's number for the unit, echoed in its outcome"),
        "chunk": Arg((bool,), default=False, doc="the payload is a list of items run as one unit"),
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
            raw = pickle.dumps(args["payload"], protocol=pickle.HIGHEST_PROTOCOL)
            args["payload"] = base64.b64encode(raw).decode("ascii")
        return super().to_wire(**args)

    def check(self, args: dict[str, Any]) -> None:
        if not args["role"]:
            raise self._bad("role must be a non-empty string")
        if args["encoding"] not in self.ENCODINGS:
            raise self._bad(f"encoding must be one of {', '.join(self.ENCODINGS)}, got {args['encoding']!r}")
        if args["timeout"] is not None and not args["timeout"] > 0:
            raise self._bad(f"timeout must be > 0 seconds, got {args['timeout']!r}")
        if args["token"] is not None and not _TOKEN.fullmatch(args["token"]):
            raise self._bad(f"token must be 8-128 letters, digits, '_' or '-', got {args['token']!r}")
        if args["seq"] is not None and args["token"] is None:
            raise self._bad("seq tags an outcome held for a token: give token too")
        if args["chunk"] and args["encoding"] != "pickle":
            raise self._bad("a chunk travels pickled: use encoding pickle")
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

    Reply: ``{"outcomes": [...], "more": bool, "closing": bool}``. Each outcome is
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
    }

    def check(self, args: dict[str, Any]) -> None:
        if not _TOKEN.fullmatch(args["token"]):
            raise self._bad(f"token must be 8-128 letters, digits, '_' or '-', got {args['token']!r}")
        if not 0 <= args["timeout"] <= COLLECT_MAX_WAIT_S:
            raise self._bad(f"timeout must be between 0 and {COLLECT_MAX_WAIT_S:g} seconds, got {args['timeout']!r}")

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Future:
        return handler.collect(token=args["token"], timeout=float(args["timeout"]))

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
        if args["unit"] < 1:
            raise self._bad(f"unit must be a unit id (an integer >= 1), got {args['unit']!r}")

    def execute(self, handler: ControlHandler, args: dict[str, Any]) -> Any:
        return handler.cancel(args["unit"])


# ------------------------------------------------------------------ calls, queueing


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a connection, from SO_PEERCRED."""

    pid: int
    uid: int
    gid: int

    @classmethod
    def of(cls, sock: socket.socket) -> Peer:
        fmt = "3i"  # struct ucred { pid_t pid; uid_t uid; gid_t gid; }
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(fmt))
        return cls(*struct.unpack(fmt, raw))


@dataclass(frozen=True)
class Call:
    """A validated request, ready to run against the handler on the owning thread."""

    op: Op
    args: dict[str, Any]
    peer: Peer
    request_id: int | str | None = None

    def run(self, handler: ControlHandler) -> Any:
        return self.op.execute(handler, self.args)


def inline_dispatch(handler: ControlHandler) -> Callable[[Call], Future]:
    """A dispatch that runs each call at once on the server's connection thread.

    Only for handlers that are safe to call from any thread; a daemon whose loop
    owns its state uses `CallQueue` instead.
    """

    def dispatch(call: Call) -> Future:
        fut: Future = Future()
        fut.set_running_or_notify_cancel()
        try:
            fut.set_result(call.run(handler))
        except Exception as exc:  # delivered to the waiter as the reply
            fut.set_exception(exc)
        return fut

    return dispatch


def with_blocking_ops(handler: ControlHandler, dispatch: Callable[[Call], Future]) -> Callable[[Call], Future]:
    """A dispatch that keeps blocking ops (``Op.blocking``, a long poll) off ``dispatch``.

    A blocking op's `execute` returns a Future at once; it is handed straight back to
    the server, whose connection thread waits on it, so a long poll never occupies
    the loop that owns the state. Every other call goes to ``dispatch`` (normally
    `CallQueue.submit`).
    """

    def route(call: Call) -> Future:
        if not call.op.blocking:
            return dispatch(call)
        try:
            fut = call.run(handler)
        except Exception as exc:  # delivered to the waiter as the reply
            fut = Future()
            fut.set_exception(exc)
        if not isinstance(fut, Future):
            raise TypeError(f"blocking op {call.op.name} returned {type(fut).__name__}, not a Future")
        return fut

    return route


class CallQueue:
    """Hands calls from server threads to the thread that owns the state.

    Give `submit` to `ControlServer` as its dispatch; the owning loop calls
    `run_pending(handler)` whenever `wait` returns True or its ``wakeup`` fires
    (e.g. a write to the loop's self-pipe, so a loop sleeping in select wakes).
    A call whose Future was cancelled (its requester timed out) is skipped, so a
    ``Timeout`` reply that says "not executed" stays true.
    """

    def __init__(self, wakeup: Callable[[], None] | None = None):
        self._calls: collections.deque[tuple[Call, Future]] = collections.deque()
        self._cond = threading.Condition()
        self._wakeup = wakeup
        self._closed: str | None = None

    def submit(self, call: Call) -> Future:
        """Queue ``call``; thread-safe. After `close` the Future fails with ShuttingDown."""
        fut: Future = Future()
        with self._cond:
            if self._closed is not None:
                fut.set_exception(ShuttingDown(self._closed))
                return fut
            self._calls.append((call, fut))
            self._cond.notify_all()
        if self._wakeup is not None:
            self._wakeup()
        return fut

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a call is pending (True), or the queue is closed or ``timeout``
        seconds pass (False). ``while q.wait(): q.run_pending(h)`` serves until `close`."""
        with self._cond:
            self._cond.wait_for(lambda: self._calls or self._closed is not None, timeout)
            return bool(self._calls)

    def run_pending(self, handler: ControlHandler, *, limit: int | None = None) -> int:
        """Run queued calls (at most ``limit``) on this thread; returns how many ran."""
        ran = 0
        while limit is None or ran < limit:
            with self._cond:
                if not self._calls:
                    break
                call, fut = self._calls.popleft()
            if not fut.set_running_or_notify_cancel():
                continue  # the requester gave up before we got to it
            ran += 1
            try:
                result = call.run(handler)
            except Exception as exc:
                fut.set_exception(exc)
            else:
                fut.set_result(result)
        return ran

    def close(self, reason: str = "the fleet daemon is shutting down") -> None:
        """Refuse new calls and fail the pending ones with ShuttingDown."""
        with self._cond:
            self._closed = reason
            pending, self._calls = list(self._calls), collections.deque()
            self._cond.notify_all()
        for _, fut in pending:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(ShuttingDown(reason))

    def __len__(self) -> int:
        with self._cond:
            return len(self._calls)


# --------------------------------------------------------------------------- server

#: How long a connection may take to send a complete frame: from accept until its
#: first frame ends, and from a frame's first byte until its newline. Every client
#: writes a request at once, so only a stalled or hostile peer ever reaches this.
FRAME_TIMEOUT_S = 10.0
#: How long a reply may sit unsent because the peer does not read it.
WRITE_TIMEOUT_S = 30.0
#: Reply bytes waiting for the peer beyond which no further request of that
#: connection is read: a peer that never reads its replies holds one reply, no more.
_WRITE_HIGH = 64 * 1024
#: At most this many connections are accepted per wake-up, so a connect flood
#: cannot starve the connections already being served.
_ACCEPT_BURST = 64
#: After accept() fails for want of file descriptors, it is retried this much later.
_ACCEPT_PAUSE_S = 0.1
#: Longest the server loop sleeps without a deadline due (it also wakes on I/O).
_TICK_S = 1.0


@dataclass(eq=False)
class _Conn:
    """One accepted connection; owned by the server loop thread."""

    sock: socket.socket
    peer: Peer
    opened: float
    rbuf: bytearray = field(default_factory=bytearray)
    scanned: int = 0  # bytes of rbuf known to hold no newline
    wbuf: bytearray = field(default_factory=bytearray)
    call: Call | None = None  # the request being answered
    inflight: Future | None = None
    call_deadline: float = 0.0
    spoke: bool = False  # sent at least one complete frame
    frame_deadline: float | None = None  # an incomplete frame must end by then
    last_active: float = 0.0  # last complete frame or reply
    write_stalled_since: float | None = None
    eof: bool = False
    closing: bool = False  # close once wbuf is sent
    events: int = 0  # what the selector watches for it

    @property
    def idle(self) -> bool:
        """Nothing asked, nothing owed: closing it loses no request and no reply."""
        return self.inflight is None and not self.wbuf and not self.rbuf


class _PressureLog:
    """Refused and evicted connections, logged at most once per ``every_s``.

    A flood of connection attempts must not become a flood of log lines: the first
    event logs at once, later ones are counted and summed up in one line per
    interval (by uid). ``clock`` is injected for tests.
    """

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.every_s = every_s
        self._clock = clock
        self._next = 0.0
        self._refused: collections.Counter = collections.Counter()
        self._evicted: collections.Counter = collections.Counter()
        self._last = ""

    def refused(self, peer: Peer, why: str) -> None:
        self._refused[peer.uid] += 1
        self._last = f"uid {peer.uid} pid {peer.pid}: {why}"
        self.flush()

    def evicted(self, peer: Peer) -> None:
        self._evicted[peer.uid] += 1
        self.flush()

    def flush(self) -> None:
        """Log what was counted, if the interval allows."""
        if not (self._refused or self._evicted):
            return
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self.every_s
        parts = []
        if self._refused:
            parts.append(f"refused {sum(self._refused.values())} connection(s) as busy "
                         f"({_by_uid(self._refused)}; last: {self._last})")
        if self._evicted:
            parts.append(f"closed {sum(self._evicted.values())} idle connection(s) to make room "
                         f"({_by_uid(self._evicted)})")
        log.warning("control socket under pressure: %s", "; ".join(parts))
        self._refused.clear()
        self._evicted.clear()


def _by_uid(counts: collections.Counter) -> str:
    return ", ".join(f"uid {uid}: {n}" for uid, n in counts.most_common())


class ControlServer:
    """Serves the control protocol on a Unix stream socket, from one thread.

    One thread multiplexes the listener and every connection (selectors). Each
    request is decoded, its op looked up, the peer's right to run it checked, its
    args validated, and only then handed to ``dispatch`` as a `Call`; the Future it
    returns is not waited on: its completion wakes the loop, which sends the reply.
    So a long poll (``collect``) holds no thread, and one connection never delays
    another. A connection has one request in flight at a time, so replies keep
    request order. Use as a context manager, or `start` / `close`.

    Who gets a connection. At most ``max_connections`` at once; the last
    ``reserved`` of them only the owner uid and root may hold, and any other uid at
    most ``max_per_uid``. A uid at its limit gets room by closing its own longest
    idle connection (one with no request in flight, no partial frame, no reply
    pending): idle sockets never deny service, not even to their own uid. When
    nothing can be closed the new connection gets a ``Busy`` error reply and is
    closed (the client raises `ControlBusy`); refusals are logged, rate-limited.

    Hostile peers. A connection must send a complete frame within
    ``frame_timeout`` of connecting or of starting that frame (a half frame, a
    never-ending line), else it gets a ``Timeout`` error and is closed; a frame over
    ``max_frame`` gets ``FrameTooLarge`` and is closed; a peer that leaves a reply
    unread for ``write_timeout`` is closed, and none of its later requests is read
    meanwhile. Connections idle between requests close after ``idle_timeout``.

    Args:
        path: socket path; its directory must exist (see `prepare_runtime_dir`).
        dispatch: ``Call -> Future`` (normally ``CallQueue.submit``).
        registry: the ops served (default `OPS`).
        group: gid or group name the socket file is given; default the owner's group.
        mode: socket file mode; 0660 lets the group connect and no one else.
        owner_uid: the uid allowed mutating ops besides root; default our euid.
        reply_timeout: seconds a call may take before a ``Timeout`` reply.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        dispatch: Callable[[Call], Future],
        *,
        registry: OpRegistry = OPS,
        group: int | str | None = None,
        mode: int = 0o660,
        owner_uid: int | None = None,
        reply_timeout: float = 30.0,
        max_frame: int = MAX_FRAME,
        max_connections: int = 256,
        max_per_uid: int = 32,
        reserved: int = 32,
        frame_timeout: float = FRAME_TIMEOUT_S,
        write_timeout: float = WRITE_TIMEOUT_S,
        idle_timeout: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if max_connections < 1 or max_per_uid < 1 or not 0 <= reserved <= max_connections:
            raise ValueError(
                f"need max_connections >= 1, max_per_uid >= 1 and 0 <= reserved <= max_connections; "
                f"got {max_connections}, {max_per_uid}, {reserved}"
            )
        self.path = Path(path)
        self.dispatch = dispatch
        self.registry = registry
        self.group = group
        self.mode = mode
        self.owner_uid = os.geteuid() if owner_uid is None else owner_uid
        self.reply_timeout = reply_timeout
        self.max_frame = max_frame
        self.max_connections = max_connections
        self.max_per_uid = max_per_uid
        self.reserved = reserved
        self.frame_timeout = frame_timeout
        self.write_timeout = write_timeout
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._listener: socket.socket | None = None
        self._inode: tuple[int, int] | None = None
        self._sel: selectors.BaseSelector | None = None
        self._wake_r = self._wake_w = -1
        self._wake_lock = threading.Lock()  # a Future may complete after close(): never write a closed fd
        self._thread: threading.Thread | None = None
        self._conns: set[_Conn] = set()
        self._done: collections.deque[tuple[_Conn, Future]] = collections.deque()
        self._stopping = threading.Event()
        self._accept_paused_until: float | None = None
        self._emfile_logged = float("-inf")
        self._pressure = _PressureLog(clock=clock)

    # -- lifecycle
    def start(self) -> ControlServer:
        """Bind, set the socket file's mode and group, listen, start the server thread."""
        self._clear_stale()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            listener.bind(str(self.path))
            # Mode and group before listen(): no one can connect until they are right.
            os.chmod(self.path, self.mode)
            if self.group is not None:
                os.chown(self.path, -1, self._gid(self.group))
            st = os.stat(self.path)
            self._inode = (st.st_dev, st.st_ino)
            listener.listen(128)
        except BaseException:
            listener.close()
            self._unlink_own()
            raise
        self._listener = listener
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ, "listener")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._serve, name="fleet-control", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving: cancel calls in flight (answered ``ShuttingDown`` where the peer
        still reads), close every connection, join the thread, unlink the socket."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join()
        with self._wake_lock:
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r = self._wake_w = -1
        self._unlink_own()

    def __enter__(self) -> ControlServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connections(self) -> int:
        """Connections being served now."""
        return len(self._conns)

    def connections_by_uid(self) -> dict[int, int]:
        """Connections being served now, per peer uid."""
        return dict(collections.Counter(c.peer.uid for c in list(self._conns)))

    # -- socket file
    @staticmethod
    def _gid(group: int | str) -> int:
        from .groups import resolve_gid

        try:
            return resolve_gid(group)
        except ValueError as exc:
            raise ControlError(f"socket {exc}") from None

    def _clear_stale(self) -> None:
        """Remove a socket left by a dead daemon; refuse to touch a live one or a non-socket."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise ControlError(f"{self.path} exists and is not a socket; not removing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            probe.connect(str(self.path))
        except ConnectionRefusedError:
            os.unlink(self.path)  # nobody listens: a crashed daemon's leftover
            return
        except OSError as exc:
            raise ControlError(f"{self.path}: cannot probe existing socket: {exc}") from exc
        finally:
            probe.close()
        raise ControlError(f"{self.path}: another daemon is serving on this socket")

    def _unlink_own(self) -> None:
        # Only the inode we bound: a successor may already have bound a new one here.
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if self._inode is None or (st.st_dev, st.st_ino) == self._inode:
            os.unlink(self.path)

    # -- the loop
    def _wake(self) -> None:
        with self._wake_lock:
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:
                pass  # the pipe is full: the loop is due to wake anyway

    def _serve(self) -> None:
        assert self._sel is not None
        try:
            while not self._stopping.is_set():
                for key, events in self._sel.select(self._sleep_for()):
                    if key.data == "listener":
                        self._accept_burst()
                    elif key.data == "wake":
                        _drain(self._wake_r)
                    else:
                        self._guarded(key.data, self._on_ready, events)
                self._finish_calls()
                self._expire()
                self._pressure.flush()
        except Exception:  # noqa: BLE001 - logged loudly; close() still cleans up
            log.exception("control server loop failed; no more control requests are served")
        finally:
            self._teardown()

    def _guarded(self, conn: _Conn, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn`` for one connection; a bug or I/O error there closes that one only."""
        try:
            fn(conn, *args)
        except OSError:
            self._drop(conn)  # the peer went away: nothing to answer
        except Exception:  # noqa: BLE001 - one connection's failure must not stop the others
            log.exception("control connection from pid %d failed", conn.peer.pid)
            self._drop(conn)

    def _sleep_for(self) -> float:
        wait = _TICK_S
        now = self._clock()
        if self._accept_paused_until is not None:
            wait = min(wait, self._accept_paused_until - now)
        for conn in self._conns:
            for due in (conn.frame_deadline, conn.call_deadline if conn.inflight is not None else None):
                if due is not None:
                    wait = min(wait, due - now)
        return max(0.0, wait)

    def _teardown(self) -> None:
        for conn in list(self._conns):
            fut = conn.inflight
            if fut is not None and fut.cancel():
                conn.inflight = None
                self._send_now(conn, encode_error(conn.call.request_id, E_SHUTTING_DOWN,
                                                  f"{conn.call.op.name} not executed: the server is closing"))
            self._drop(conn)
        if self._listener is not None:
            self._listener.close()
        if self._sel is not None:
            self._sel.close()

    # -- accepting
    def _accept_burst(self) -> None:
        assert self._listener is not None
        for _ in range(_ACCEPT_BURST):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: the listener stays readable, so stop watching
                    # it for a moment rather than spin.
                    now = self._clock()
                    if now >= self._emfile_logged + self._pressure.every_s:  # not a line per retry
                        log.error("control socket cannot accept: %s; pausing accepts for %gs at a time",
                                  exc, _ACCEPT_PAUSE_S)
                        self._emfile_logged = now
                    self._sel.unregister(self._listener)
                    self._accept_paused_until = self._clock() + _ACCEPT_PAUSE_S
                return
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        try:
            peer = Peer.of(sock)
        except OSError:
            sock.close()
            return
        refusal = self._make_room(peer)
        if refusal is not None:
            self._pressure.refused(peer, refusal)
            try:
                sock.send(encode_error(None, E_BUSY, refusal))
            except OSError:
                pass
            sock.close()
            return
        now = self._clock()
        conn = _Conn(sock, peer, opened=now, last_active=now, frame_deadline=now + self.frame_timeout)
        self._conns.add(conn)
        self._watch(conn)

    def _privileged(self, peer: Peer) -> bool:
        return peer.uid in (0, self.owner_uid)

    def _make_room(self, peer: Peer) -> str | None:
        """None if ``peer`` may have a new connection now (after closing one of its own
        idle ones if need be), else the reason it is refused."""
        mine = [c for c in self._conns if c.peer.uid == peer.uid]
        if self._privileged(peer):
            full = len(self._conns) >= self.max_connections
            why = f"all {self.max_connections} control connections are busy"
        else:
            shared = sum(1 for c in self._conns if not self._privileged(c.peer))
            pool = self.max_connections - self.reserved
            if len(mine) >= self.max_per_uid:
                full, why = True, f"uid {peer.uid} already has {len(mine)} busy control connections (the most one uid may hold)"
            else:
                full, why = shared >= pool, f"all {pool} control connections open to other users are busy"
        if not full:
            return None
        for victim in sorted((c for c in mine if c.idle), key=lambda c: c.last_active):
            # Idle as far as the loop knows; but a request may be waiting unread in
            # its socket (accepted just before this flood): read first, close only
            # a connection that really has nothing to say.
            self._guarded(victim, self._read)
            if victim not in self._conns:
                return None  # it had gone away: that made room
            if victim.idle:
                self._pressure.evicted(victim.peer)
                self._drop(victim)  # frees a place in whichever limit was full: it counted in all
                return None
        return why

    def _resume_accepting(self) -> None:
        assert self._sel is not None and self._listener is not None
        self._accept_paused_until = None
        self._sel.register(self._listener, selectors.EVENT_READ, "listener")

    # -- one connection's I/O
    def _watch(self, conn: _Conn) -> None:
        """Point the selector at what ``conn`` waits for now."""
        assert self._sel is not None
        events = 0
        if not conn.eof and not conn.closing and len(conn.rbuf) <= self.max_frame:
            events |= selectors.EVENT_READ
        if conn.wbuf:
            events |= selectors.EVENT_WRITE
        if events == conn.events:
            return
        if conn.events == 0:
            self._sel.register(conn.sock, events, conn)
        elif events == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _on_ready(self, conn: _Conn, events: int) -> None:
        if events & selectors.EVENT_WRITE:
            self._flush(conn)
        if events & selectors.EVENT_READ and conn in self._conns:
            self._read(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        if data:
            conn.rbuf += data
        else:
            conn.eof = True
        self._advance(conn)

    def _advance(self, conn: _Conn) -> None:
        """Answer the frames ``conn`` sent, one at a time, while nothing is in flight
        and the peer keeps up with its replies."""
        now = self._clock()
        while conn.inflight is None and not conn.closing and len(conn.wbuf) < _WRITE_HIGH:
            nl = conn.rbuf.find(b"\n", conn.scanned)
            if nl < 0:
                conn.scanned = len(conn.rbuf)
                if len(conn.rbuf) > self.max_frame:
                    self._reply(conn, encode_error(None, E_TOO_LARGE, f"frame exceeds {self.max_frame} bytes"))
                    conn.closing = True  # the stream cannot be resynced without reading the rest
                elif conn.eof:
                    if conn.rbuf.strip():
                        self._reply(conn, encode_error(None, E_MALFORMED, "connection closed mid-frame (no newline)"))
                    conn.closing = True
                break
            frame = bytes(conn.rbuf[:nl])
            del conn.rbuf[: nl + 1]
            conn.scanned = 0
            conn.spoke = True
            conn.last_active = now
            self._start(conn, frame)
            if len(frame) > self.max_frame:
                conn.closing = True  # the reply said FrameTooLarge; that connection is done
        # The deadline for a complete frame: from accept until the first one, and
        # from the first byte of any later one.
        tail = len(conn.rbuf) - (conn.rbuf.rfind(b"\n") + 1)
        if tail:
            if conn.frame_deadline is None:
                conn.frame_deadline = now + self.frame_timeout
        elif conn.spoke:
            conn.frame_deadline = None
        if conn.closing and not conn.wbuf:
            self._drop(conn)
            return
        self._watch(conn)

    def _reply(self, conn: _Conn, data: bytes) -> None:
        """Queue a reply and send what the socket takes now (the caller updates the selector)."""
        conn.wbuf += data
        conn.last_active = self._clock()
        self._send_some(conn)

    def _send_some(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.wbuf)
        except (BlockingIOError, InterruptedError):
            sent = 0
        del conn.wbuf[:sent]
        if sent or not conn.wbuf:
            conn.write_stalled_since = None
        if conn.wbuf and conn.write_stalled_since is None:
            conn.write_stalled_since = self._clock()

    def _flush(self, conn: _Conn) -> None:
        """EVENT_WRITE: send more; once all is sent, read the requests held back meanwhile."""
        self._send_some(conn)
        if conn.wbuf:
            self._watch(conn)
        else:
            self._advance(conn)

    def _send_now(self, conn: _Conn, data: bytes) -> None:
        """Best effort, never blocking: a notice sent just before closing."""
        try:
            conn.sock.send(bytes(conn.wbuf) + data)
        except OSError:
            pass

    def _drop(self, conn: _Conn) -> None:
        if conn not in self._conns:
            return
        self._conns.discard(conn)
        if conn.events and self._sel is not None:
            try:
                self._sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        conn.events = 0
        if conn.inflight is not None:
            conn.inflight.cancel()  # not started: it never runs; started: its reply has no reader
            conn.inflight = None
        conn.sock.close()

    # -- deadlines
    def _expire(self) -> None:
        now = self._clock()
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._resume_accepting()
        for conn in list(self._conns):
            if conn.inflight is not None and now >= conn.call_deadline:
                self._guarded(conn, self._call_timed_out)
            elif conn.frame_deadline is not None and now >= conn.frame_deadline:
                self._send_now(conn, encode_error(
                    None, E_TIMEOUT, f"no complete request frame within {self.frame_timeout:g}s; closing"))
                self._drop(conn)
            elif conn.wbuf and conn.write_stalled_since is not None \
                    and now - conn.write_stalled_since >= self.write_timeout:
                log.info("control connection from pid %d uid %d closed: it left a reply unread for %gs",
                         conn.peer.pid, conn.peer.uid, self.write_timeout)
                self._drop(conn)
            elif conn.idle and now - conn.last_active >= self.idle_timeout:
                self._drop(conn)

    def _call_timed_out(self, conn: _Conn) -> None:
        fut, call = conn.inflight, conn.call
        conn.inflight = None  # its completion, if it ever comes, is ignored
        if fut.cancel():
            reply = encode_error(call.request_id, E_TIMEOUT, f"{call.op.name} not executed: the daemon's loop "
                                 f"did not take it within {self.reply_timeout:g}s")
        else:
            reply = encode_error(call.request_id, E_TIMEOUT, f"{call.op.name} still running after "
                                 f"{self.reply_timeout:g}s; its outcome is unknown")
        self._reply(conn, reply)
        if conn in self._conns:
            self._advance(conn)

    # -- requests
    def _start(self, conn: _Conn, frame: bytes) -> None:
        """Check one request frame and dispatch it; errors are answered at once."""
        checked = self._check(conn, frame)
        if isinstance(checked, bytes):
            self._reply(conn, checked)
            return
        try:
            fut = self.dispatch(checked)
        except Exception as exc:  # noqa: BLE001 - a dispatch bug is this request's InternalError
            log.error("dispatching op %s failed", checked.op.name, exc_info=exc)
            self._reply(conn, encode_error(checked.request_id, E_INTERNAL, f"{checked.op.name} failed: "
                                           f"{type(exc).__name__}: {exc}"))
            return
        conn.call, conn.inflight = checked, fut
        conn.call_deadline = self._clock() + self.reply_timeout
        # Runs on whichever thread completes the Future (at once if it is done):
        # it only queues the completion and wakes the loop.
        fut.add_done_callback(lambda f, conn=conn: (self._done.append((conn, f)), self._wake()))

    def _check(self, conn: _Conn, frame: bytes) -> Call | bytes:
        """The validated `Call` for one request frame, or the error reply. Never raises for bad input."""
        rid = None
        try:
            request = decode_request(frame, max_frame=self.max_frame)
            rid = request.id
            op = self.registry.get(request.op)
            if op.mutating and not self._privileged(conn.peer):
                log.warning(
                    "refused mutating op %s from pid %d uid %d", op.name, conn.peer.pid, conn.peer.uid
                )
                raise ProtocolError(
                    E_PERMISSION,
                    f"op {op.name!r} changes the fleet; only uid {self.owner_uid} or root may run it "
                    f"(you are uid {conn.peer.uid})",
                )
            args = op.validate(request.args)
        except ProtocolError as exc:
            return encode_error(exc.request_id if rid is None else rid, exc.code, exc.message)
        return Call(op, args, conn.peer, rid)

    def _finish_calls(self) -> None:
        while self._done:
            conn, fut = self._done.popleft()
            if conn.inflight is not fut or conn not in self._conns:
                continue  # timed out or dropped meanwhile: already answered or unanswerable
            conn.inflight = None
            self._guarded(conn, self._answer, fut)

    def _answer(self, conn: _Conn, fut: Future) -> None:
        self._reply(conn, self._reply_for(conn.call, fut))
        if conn in self._conns:
            self._advance(conn)

    @staticmethod
    def _reply_for(call: Call, fut: Future) -> bytes:
        rid = call.request_id
        try:
            result = fut.result(timeout=0)
        except CancelledError:
            return encode_error(rid, E_SHUTTING_DOWN, f"{call.op.name} not executed: the server is closing")
        except ShuttingDown as exc:
            return encode_error(rid, E_SHUTTING_DOWN, str(exc))
        except FleetError as exc:
            return encode_error(rid, type(exc).__name__, str(exc))
        except Exception as exc:
            log.error("op %s failed", call.op.name, exc_info=exc)
            return encode_error(rid, E_INTERNAL, f"{call.op.name} failed: {type(exc).__name__}: {exc}")
        try:
            return encode_reply(rid, result)
        except (TypeError, ValueError) as exc:
            log.error("op %s returned a result that is not JSON: %s", call.op.name, exc)
            return encode_error(rid, E_INTERNAL, f"{call.op.name} returned a result that is not JSON: {exc}")


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


# --------------------------------------------------------------------------- client

_REMOTE_TYPES: dict[str, Callable[[str], RemoteError]] = {E_PERMISSION: PermissionDenied, E_BUSY: ControlBusy}


class ControlClient:
    """Talks to one daemon's control socket. One connection, reused across calls.

    A connection the daemon closed while it sat unused (an idle timeout, a restart)
    is replaced by a new one before the next request is sent: no request is lost on
    it, since none was sent.

    ``ControlClient(path)`` or ``ControlClient.for_fleet(name)``; use as a context
    manager or call `close`. Not thread-safe: one client per thread.
    """

    def __init__(self, path: str | os.PathLike, *, timeout: float | None = 60.0, registry: OpRegistry = OPS):
        self.path = Path(path)
        self.timeout = timeout
        self.registry = registry
        self._sock: socket.socket | None = None
        self._server_pid: int | None = None
        self._buf = bytearray()
        self._ids = itertools.count(1)

    @classmethod
    def for_fleet(cls, name: str, env: Mapping[str, str] | None = None, **kwargs: Any) -> ControlClient:
        """A client for the running fleet ``name`` (see `find_socket`); NotRunning if none."""
        return cls(find_socket(name, env), **kwargs)

    def call(self, op: str, **args: Any) -> Any:
        """Run ``op`` with ``args`` on the daemon and return its result.

        Raises:
            ProtocolError: ``op`` is unknown or ``args`` do not fit its schema (checked
                before anything is sent).
            NotRunning: no daemon listens at the path, or it closed the connection.
            PermissionDenied: the daemon refused the op to our uid, or we may not connect.
            ControlBusy: the daemon refused the connection: its connections are all busy.
            RemoteError: any other error reply; ``.type`` and ``.message`` say what.
            ControlTimeout: no reply within ``timeout`` seconds.
        """
        spec = self.registry.get(op)
        rid = next(self._ids)
        frame = encode_request(op, spec.to_wire(**args), rid)
        reply = decode_reply(self._roundtrip(frame))
        if reply.id != rid:
            if reply.id is None and not reply.ok:
                # An error about the connection, not the request (Busy at accept, a
                # frame deadline): the daemon closes it after saying so.
                self.close()
                raise _remote_error(reply)
            self.close()
            raise ProtocolError(E_INVALID_REPLY, f"reply id {reply.id!r} does not match request id {rid!r}")
        if not reply.ok:
            raise _remote_error(reply)
        return reply.result

    def send_raw(self, data: bytes) -> Reply:
        """Send ``data`` as-is and decode one reply: for tests and diagnostics."""
        return decode_reply(self._roundtrip(data))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buf.clear()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def server_pid(self) -> int | None:
        """The daemon's pid on the current connection (SO_PEERCRED); None when not connected."""
        return self._server_pid

    def connect(self) -> int:
        """Connect now, or check that the open connection still stands (see `_connect`);
        returns the daemon's pid on it."""
        self._connect()
        assert self._server_pid is not None
        return self._server_pid

    def _connect(self) -> socket.socket:
        if self._sock is not None:
            if self._still_open(self._sock):
                return self._sock
            self.close()  # the daemon closed it while we did not use it: a new one is as good
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(self.timeout)
        try:
            self._connect_through_backlog(sock)
            self._server_pid = Peer.of(sock).pid
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise NotRunning(f"no fleet daemon at {self.path}: {exc.strerror}") from None
        except PermissionError:
            sock.close()
            raise PermissionDenied(
                f"may not connect to {self.path}: uid {os.geteuid()} is not its owner "
                "and not in its group"
            ) from None
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        return sock

    def _connect_through_backlog(self, sock: socket.socket) -> None:
        """connect(), retried while the daemon's listen backlog is full (a Unix socket
        with a timeout says EAGAIN then, where a blocking one would wait); ControlBusy
        if it stays full for the whole timeout."""
        deadline = time.monotonic() + (self.timeout if self.timeout is not None else 60.0)
        pause = 0.001
        while True:
            try:
                sock.connect(str(self.path))
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ControlBusy(f"{self.path}: the daemon's connection backlog stayed full "
                                      f"for {self.timeout}s") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.05)

    def _still_open(self, sock: socket.socket) -> bool:
        """False if the daemon closed this idle connection (end of stream, or a parting
        error such as an idle timeout, waiting unread): no request of ours was read on
        it, so sending on a new connection instead is safe."""
        if self._buf:
            return False  # bytes nobody asked for: the stream is out of step
        readable, _, _ = select.select([sock], [], [], 0)
        return not readable

    def _roundtrip(self, frame: bytes) -> bytes:
        sock = self._connect()
        try:
            try:
                sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError) as exc:
                # The daemon closed the connection before reading our request; it may
                # have said why first (Busy): that reply is still ours to read.
                parting = self._parting_words(sock)
                self.close()
                if parting is not None:
                    return parting
                raise NotRunning(f"fleet daemon at {self.path} closed the connection: {exc.strerror}") from None
            return self._read_line(sock)
        except TimeoutError:
            self.close()
            raise ControlTimeout(f"no reply from {self.path} within {self.timeout}s") from None
        except (BrokenPipeError, ConnectionResetError) as exc:
            self.close()
            raise NotRunning(f"fleet daemon at {self.path} closed the connection: {exc.strerror}") from None
        except BaseException:
            self.close()  # the stream is out of step now; never reuse it
            raise

    def _parting_words(self, sock: socket.socket) -> bytes | None:
        try:
            return self._read_line(sock)
        except (OSError, NotRunning):
            return None

    def _read_line(self, sock: socket.socket) -> bytes:
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                return line
            data = sock.recv(65536)
            if not data:
                raise NotRunning(f"fleet daemon at {self.path} closed the connection before replying")
            self._buf += data


def _remote_error(reply: Reply) -> RemoteError:
    factory = _REMOTE_TYPES.get(reply.error_type)
    if factory is not None:
        return factory(reply.error_message)
    return RemoteError(reply.error_type, reply.error_message)
