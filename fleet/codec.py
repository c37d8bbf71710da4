"""The task and result codec: what travels in a message body (beside fleet.messages,
which frames the headers).

A task body is `(payload, key, lane, request_id)`, pickled once in the submitting
process (so an unpicklable or oversized payload is refused there, synchronously). A
payload a service-mode client pickled at its end travels as `_Pickled`: the worker
unpickles it, nobody else. A result body is decoded here into the unit's `Outcome`,
its value, and the handler's original exception when there was one.
"""
from __future__ import annotations

import pickle
import struct

from . import messages as M
from .outcomes import FAILED, SOLVED, SUPPRESSED, Refused
from .unit import Outcome, PayloadTooLarge, PayloadUnpicklable

_SOLVED = Outcome(SOLVED)

#: Traceback text kept per failed outcome (the head is cut; the last lines matter).
MAX_DETAIL_CHARS = 64 * 1024
#: A handler's exception travels pickled only below this size (its text always does).
MAX_ERROR_BYTES = 128 * 1024


class _Pickled:
    """Bytes pickled at one end for the other: a remote client's payload (the worker
    unpickles it) or a worker's value relayed by fleetd (its client unpickles it).

    (The worker recognises it by this class name.)"""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def __reduce__(self):
        return (_Pickled, (self.data,))

    def load(self):
        return pickle.loads(self.data)


def task_body(role: str, payload, key, lane, request_id, *, pickled_payload: bytes | None, limit: int) -> bytes:
    """The pickled body of one task.

    Raises:
        PayloadUnpicklable: the payload (or key) cannot be pickled.
        PayloadTooLarge: the body is over `limit` bytes (limits.max_payload_bytes).
    """
    if pickled_payload is not None:
        payload = _Pickled(pickled_payload)
    try:
        body = pickle.dumps((payload, key, lane, request_id), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise PayloadUnpicklable(f"payload for role {role!r} cannot be pickled: {type(exc).__name__}: {exc}") from None
    if len(body) > limit:
        raise PayloadTooLarge(f"payload for role {role!r} is {len(body)} bytes pickled; limits.max_payload_bytes is {limit}")
    return body


_ROUTE_LEN = struct.Struct("<I")


def with_route(body: bytes, route) -> bytes:
    """A task body carrying the provider route admission chose (sent with flag F_ROUTED).

    The route goes in front (its pickled length, then it), so the payload's bytes,
    pickled once at submit, are never pickled again when admission moves a unit.
    """
    raw = pickle.dumps(tuple(route), protocol=pickle.HIGHEST_PROTOCOL)
    return _ROUTE_LEN.pack(len(raw)) + raw + body


def split_route(body):
    """(route, the rest of the body) of a body made by `with_route`."""
    from .route import Route

    (n,) = _ROUTE_LEN.unpack_from(body)
    start = _ROUTE_LEN.size
    return Route(*pickle.loads(body[start : start + n])), body[start + n :]


def refused_body(exc: Refused) -> bytes:
    """The result body of a handler that raised fleet.Refused (status ST_REFUSED)."""
    return pickle.dumps((exc.status, exc.message, exc.retry_after), protocol=pickle.HIGHEST_PROTOCOL)


def result_outcome(status: int, body, relay: bool = False):
    """(Outcome, value, original exception) from a result message's status and body.

    ``relay``: a value is kept as the worker's pickled bytes (`_Pickled`) for fleetd
    to pass to its client, never unpickled here."""
    if status == M.ST_SOLVED:
        if relay:
            return _SOLVED, _Pickled(bytes(body)), None
        try:
            return _SOLVED, pickle.loads(body), None
        except Exception as exc:  # noqa: BLE001 - e.g. a class the caller's process cannot import
            return Outcome(FAILED, "ResultError", f"result cannot be unpickled here: {exc}"), None, None
    if status == M.ST_CHUNK:
        values, failures = chunk = pickle.loads(body)
        if relay:
            chunk = _Pickled(bytes(body))
        kinds = {st for st, _ in failures.values()}
        if M.ST_HANDLER_ERROR in kinds:
            return Outcome(FAILED, "HandlerError", "an item of the chunk failed"), chunk, None
        if M.ST_SUPPRESSED in kinds:
            return Outcome(SUPPRESSED, None, "an item of the chunk was suppressed"), chunk, None
        return _SOLVED, chunk, None
    if status == M.ST_SUPPRESSED:
        return Outcome(SUPPRESSED, None, _text(body)), None, None
    if status == M.ST_HANDLER_ERROR:
        text, original = pickle.loads(body)
        return Outcome(FAILED, "HandlerError", text), None, original
    if status == M.ST_RESULT_ERROR:
        return Outcome(FAILED, "ResultError", _text(body)), None, None
    if status == M.ST_REFUSED:
        refusal = Refused(*pickle.loads(body))
        return Outcome(FAILED, "Refused", str(refusal)), None, refusal
    if status == M.ST_HELD_AT_CLOSE:
        return Outcome(FAILED, "Shutdown", _text(body)), None, None
    if status in (M.ST_START_REFUSED, M.ST_COMPLETION_REFUSED):
        return Outcome(FAILED, "FsmRefused", _text(body)), None, None
    return Outcome(FAILED, "LaneDeath", _text(body)), None, None


def clip_detail(detail: str | None) -> str | None:
    """A failure's text cut to its last `MAX_DETAIL_CHARS` characters (a traceback ends with what matters)."""
    if detail is None or len(detail) <= MAX_DETAIL_CHARS:
        return detail
    return "[... cut ...]\n" + detail[-MAX_DETAIL_CHARS:]


def _text(body) -> str:
    return bytes(body).decode(errors="replace")
