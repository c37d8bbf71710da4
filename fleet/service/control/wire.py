"""The wire format: one frame is one JSON line; requests, replies and error replies
are encoded and decoded here and nowhere else, with the frame limit and the op
argument schema (`Arg`, `check_args`) they are checked against."""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from admission.records import record
from fleet.service.control.errors import E_INVALID, E_INVALID_ARGS, E_INVALID_REPLY, E_MALFORMED, E_TOO_LARGE, ProtocolError
from fleet.service.control.fds import HandedOff, Held


#: Largest frame (one JSON line, newline excluded) either side accepts: 1 MiB.
MAX_FRAME = 1 << 20


@record
class Request:
    """A decoded request envelope. ``args`` is not yet checked against the op's schema."""

    id: int | str | None
    op: str
    args: dict[str, Any]


@record
class Reply:
    """A decoded reply: ``result`` when ``ok``, else ``error_type`` and ``error_message``."""

    id: int | str | None
    ok: bool
    result: Any = None
    error_type: str = ""
    error_message: str = ""


class WithFds(bytes):
    """A frame that names memfds (by their index among its descriptors): ``fds`` holds a
    duplicate of each, in that order, for the writer to send with the frame's first bytes
    and then close (`fleet.service.control.fds`)."""

    fds: list[int]


def _dumps(obj: Any) -> bytes:
    sealed: list[Held] = []

    def fd_index(value: Any) -> int:
        # A value in a memfd or a parcel (an outcome record's): named by its index, the
        # descriptor beside.
        if isinstance(value, Held):
            sealed.append(value)
            return len(sealed) - 1
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

    # allow_nan=False: NaN/Infinity are not JSON and other clients would choke on them.
    data = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=fd_index).encode("utf-8") + b"\n"
    if not sealed:
        return data
    framed = WithFds(data)
    framed.fds = [os.dup(one.fd) for one in sealed]  # the frame's own: the record may be let go before it is sent
    for one in sealed:
        if type(one) is HandedOff:
            one.close()  # given away: the frame's copy is the only one kept
    return framed


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


#: One decoder for every frame (it keeps no state between calls): `json.loads` with an
#: argument would build a new one per frame.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


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
        return _DECODER.decode(text)
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
        raise ProtocolError(E_INVALID, f"request must be a JSON object, got {json_type(obj)}")
    rid = obj.get("id")
    if not _valid_id(rid):
        raise ProtocolError(E_INVALID, f"id must be an integer, string or null, got {json_type(rid)}")
    unknown = sorted(set(obj) - {"id", "op", "args"})
    if unknown:
        raise ProtocolError(E_INVALID, f"unknown request key(s): {', '.join(unknown)}", rid)
    op = obj.get("op")
    if not isinstance(op, str) or not op:
        raise ProtocolError(E_INVALID, f"op must be a non-empty string, got {json_type(op)}", rid)
    args = obj.get("args", {})
    if not isinstance(args, dict):
        raise ProtocolError(E_INVALID, f"args must be an object, got {json_type(args)}", rid)
    return Request(rid, op, args)


def encode_reply(id: int | str | None, result: Any) -> bytes:
    """A success reply frame. Raises TypeError/ValueError if ``result`` is not JSON."""
    return _dumps({"id": id, "ok": True, "result": result})


def encode_error(id: int | str | None, type: str, message: str) -> bytes:
    """An error reply frame: ``{"id":..,"ok":false,"error":{"type":..,"message":..}}``."""
    return _dumps({"id": id, "ok": False, "error": {"type": type, "message": message}})


@record
class Push:
    """A decoded push frame: outcome records a connection carries unasked (see `encode_push`)."""

    token: str
    first: int
    outcomes: list


def encode_push(token: str, first: int, outcomes: list) -> bytes:
    """A push frame: ``{"push": {"token", "first", "outcomes"}}``, the records held for
    ``token`` numbered from ``first``, sent on the connection its ``submit_batch`` v2
    attached (`fleet.service.control.Stream`), between that connection's replies."""
    return _dumps({"push": {"token": token, "first": first, "outcomes": outcomes}})


def decode_stream(frame: bytes, *, max_frame: int = 64 * MAX_FRAME) -> Reply | Push:
    """A frame of a connection that may carry pushes: a `Push`, or the `Reply` that
    `decode_reply` makes. ProtocolError(InvalidReply) when it is neither."""
    try:
        obj = _loads(frame.rstrip(b"\n"), max_frame)
    except ProtocolError as exc:
        raise ProtocolError(E_INVALID_REPLY, exc.message) from None
    if isinstance(obj, dict) and "push" in obj:
        push = obj["push"]
        if not (len(obj) == 1 and isinstance(push, dict) and isinstance(push.get("token"), str)
                and isinstance(push.get("first"), int) and not isinstance(push.get("first"), bool)
                and push["first"] >= 0 and isinstance(push.get("outcomes"), list)):
            raise ProtocolError(E_INVALID_REPLY, "a push frame must be {\"push\": {\"token\": string, "
                                                 "\"first\": integer >= 0, \"outcomes\": array}}")
        return Push(push["token"], push["first"], push["outcomes"])
    return _reply_of(obj)


def decode_reply(frame: bytes, *, max_frame: int = 64 * MAX_FRAME) -> Reply:
    """Parse a reply frame; raises ProtocolError(InvalidReply) when it is not one."""
    try:
        obj = _loads(frame.rstrip(b"\n"), max_frame)
    except ProtocolError as exc:
        raise ProtocolError(E_INVALID_REPLY, exc.message) from None
    return _reply_of(obj)


def _reply_of(obj: Any) -> Reply:
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


def json_type(value: Any) -> str:
    """The JSON name of `value`'s type, as an error names it."""
    return _JSON_NAMES.get(type(value), type(value).__name__)


def _is(value: Any, kinds: tuple[type, ...]) -> bool:
    # (`check_args` asks only when the value's own type is not among `kinds`: a match
    # there is this function's True, in one look.)
    if isinstance(value, bool):  # bool is an int subclass; JSON keeps them apart
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, kinds)


@record
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
        elif spec.kinds is not None and type(args[name]) not in spec.kinds and not _is(args[name], spec.kinds):
            problems.append(f"argument {name} must be {spec.describe()}, got {json_type(args[name])}")
    if problems:
        raise ProtocolError(E_INVALID_ARGS, f"{op}: " + "; ".join(problems))
    return {name: args.get(name, spec.default) for name, spec in schema.items()}
