"""The outcome record: how one ended unit travels from fleetd to its client in a
``collect`` reply. Both halves live here: `encode` (the daemon) and `parse` /
`join_part` / `result_of` (the client), with the record's field names and version.

A record is a JSON object::

    {"v": 1, "seq": <client's number>, "unit": <unit id>, "role": <role>,
     "kind": "solved" | "suppressed" | "failed", ...}

A solved record carries ``value`` (base64 of the pickled value); a value longer
than `PART_CHARS` in base64 travels in consecutive records with ``part`` (0-based)
and ``parts`` (how many). For a client that takes them (it said ``fds`` at its
``submit_batch`` or ``collect``), a pickled value of `fds.MEMFD_MIN` bytes or more
travels in a sealed memfd instead: the record carries ``value_fd`` (the index of its
descriptor among those of the frame that carries the record) and ``value_len`` (its
bytes), no ``value``; the descriptor goes with that frame, and again with every frame
that sends the record again. For a client that takes parcels too (``parcels``), a value
still in the parcel its worker wrote travels as a read-only descriptor of that parcel
(`fds.Held`): ``value_fd``, ``value_len`` (the parcel's bytes), ``value_spans`` (each
part's ``[offset, bytes]``: the pickle, then its out-of-band buffers, then its blobs) and
``value_oob`` (how many buffers); the client builds the value over it
(`fleet.worker.codec.value_in_parcel`), its bytes never copied on the way. A failed or suppressed record carries ``reason``,
``detail`` (the traceback text, its head cut past `MAX_DETAIL_CHARS`) and, when
the handler's exception pickles within `MAX_ERROR_BYTES`, ``error`` (base64 of it).
A record without ``v`` is version 1 (the format before records carried it).
"""
from __future__ import annotations

import base64
import binascii
from concurrent.futures import Future
from typing import Any

from admission.records import record
from fleet.worker.codec import (MAX_DETAIL_CHARS, MAX_ERROR_BYTES, CodecError, _InParcel, _Pickled, clip_detail, dumps,
                                handler_error, loads, value_in_parcel)
from fleet.rules.outcomes import FAILED, KINDS, SOLVED
from fleet.rules.raised import unit_exception
from fleet.rules.vocab import Reason
from fleet.rules.unit import Outcome, UnitError, error_for
from fleet.service.control import fds as fdpass
from fleet.service.control.errors import E_INVALID_REPLY, ProtocolError

#: The record format's version, sent as ``v``; a client refuses any other.
VERSION = 1

# Field names.
V = "v"
SEQ = "seq"
UNIT = "unit"
ROLE = "role"
KIND = "kind"
REASON = "reason"
DETAIL = "detail"
ERROR = "error"
VALUE = "value"
VALUE_FD = "value_fd"
VALUE_LEN = "value_len"
VALUE_SPANS = "value_spans"
VALUE_OOB = "value_oob"
PART = "part"
PARTS = "parts"

#: Base64 characters of a value per outcome record; a larger value is split into
#: consecutive parts, so no collect reply outgrows control.COLLECT_REPLY_BUDGET.
PART_CHARS = 512 * 1024


class BadOutcomeRecord(ProtocolError):
    """An outcome record that breaks the format; ``field`` names the field at fault."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(E_INVALID_REPLY, f"outcome record field {field!r}: {message}")


# ================================================================== daemon half
def encode(seq: int | None, role: str, future: Future, *, fds: bool = False, parcels: bool = False,
           max_bytes: int | None = None, key: str = "") -> list[dict]:
    """The outcome records for one ended unit, as `collect` sends them.

    One record, or several ``part``s when the pickled value is larger than
    `PART_CHARS` in base64; with ``fds`` (the client takes memfds) one record whose
    value is in a sealed memfd (`fds.Sealed`, held in the record until it is let go) when
    it is `fds.MEMFD_MIN` bytes or more; with ``parcels`` too, such a value still in its
    worker's parcel travels as a descriptor of the parcel (`fds.Held`). A value over
    ``max_bytes`` (what may be held for a client, the config's ``key``) is a failed
    ``ResultError`` record naming both.

    A solved value travels as the bytes its worker pickled: in service mode the
    supervisor relays them without unpickling (`fleet.worker.codec._Pickled`), so the
    daemon never has to pickle a value again. That is what keeps the ledger honest:
    a value that the worker could pickle but that would not survive a round trip
    through the daemon (its unpickled form is not picklable) used to be counted
    solved while its client was sent a ResultError. Relayed, the client gets
    exactly what the handler returned, and the daemon runs no code from a result.
    A value that is not relayed (a future built by hand) is pickled here; if that
    fails the record is a failed ``ResultError`` that says so. A handler's exception
    is relayed the same way, as its worker pickled it.
    """
    base = {V: VERSION, SEQ: seq, UNIT: getattr(future, "unit_id", None), ROLE: role}
    if future.cancelled():
        return [{**base, KIND: FAILED, REASON: Reason.CANCELLED, DETAIL: "cancelled in the daemon"}]
    exc = future.exception()
    if isinstance(exc, UnitError):
        record = {**base, KIND: exc.outcome.kind, REASON: exc.outcome.reason,
                  DETAIL: clip_detail(exc.outcome.detail)}
        error = _pickled_error(exc.original)
        if error is not None:
            record[ERROR] = error
        return [record]
    if exc is not None:
        return [undeliverable(seq, role, future, exc)]
    value = future.result()
    if not isinstance(value, _Pickled):
        try:
            value = _Pickled(dumps(value, "solved, but its value"))
        except CodecError as err:  # any pickling failure is this unit's outcome
            return [{**base, KIND: FAILED, REASON: Reason.RESULT_ERROR, DETAIL: f"{err} for the client"}]
    try:
        if fds and parcels and type(value) is _InParcel:
            records = _in_parcel(base, value, max_bytes, key)
            if records is not None:
                return records
        return _solved(base, value.pieces(), fds, max_bytes, key)
    finally:
        value.release()  # a relayed value still in its parcel: unmapped (the parcel goes with the value)


def _solved(base: dict, pieces: list, fds: bool, max_bytes: int | None, key: str) -> list[dict]:
    """The records of a solved value whose pickled bytes are ``pieces`` (`_Pickled.pieces`)."""
    size = sum(memoryview(piece).nbytes for piece in pieces)
    refused = _too_large(base, size, size if fds else (size + 2) // 3 * 4, max_bytes, key)
    if refused is not None:
        return refused
    if fds and size >= fdpass.MEMFD_MIN:
        return [{**base, KIND: SOLVED, VALUE_FD: fdpass.Sealed(pieces), VALUE_LEN: size}]
    text = base64.b64encode(b"".join(pieces)).decode("ascii")
    if len(text) <= PART_CHARS:
        return [{**base, KIND: SOLVED, VALUE: text}]
    parts = [text[i : i + PART_CHARS] for i in range(0, len(text), PART_CHARS)]
    return [{**base, KIND: SOLVED, VALUE: p, PART: i, PARTS: len(parts)} for i, p in enumerate(parts)]


def _too_large(base: dict, size: int, held: int, max_bytes: int | None, key: str) -> list[dict] | None:
    """The failed ResultError record of a value of ``size`` bytes pickled, ``held`` as the
    client takes it, over ``max_bytes``; None when it is not."""
    if max_bytes is None or held <= max_bytes:
        return None
    return [{**base, KIND: FAILED, REASON: Reason.RESULT_ERROR,
             DETAIL: f"solved, but its value is {size} bytes pickled ({held} held for the client), "
                     f"more than fleetd holds for one client: {key} is {max_bytes}"}]


def _in_parcel(base: dict, value: _InParcel, max_bytes: int | None, key: str) -> list[dict] | None:
    """The record of a solved value still in its worker's parcel, as a descriptor of that
    parcel; None when it goes as `_solved` sends it (too small, lent, not to be reopened)."""
    reopened = value.reopened()
    if reopened is None:
        return None
    fd, size, spans, n_oob = reopened
    held = fdpass.Held(fd, size)
    if size < fdpass.MEMFD_MIN:
        held.close()
        return None
    refused = _too_large(base, size, size, max_bytes, key)
    if refused is not None:
        held.close()
        return refused
    return [{**base, KIND: SOLVED, VALUE_FD: held, VALUE_LEN: size,
             VALUE_SPANS: [list(span) for span in spans], VALUE_OOB: n_oob}]


def in_parcel(future: Future) -> bool:
    """Whether ``future`` (ended) is solved with a value whose bytes are still in its
    worker's parcel: `encode` reads them, a copy, where its caller runs."""
    return not future.cancelled() and future.exception() is None and type(future.result()) is _InParcel


def undeliverable(seq: int | None, role: str, future: Future, exc: BaseException) -> dict:
    """The failed ResultError record of an outcome the daemon could not write out (`encode`
    raised: no memory, no descriptor for a memfd), naming why."""
    return {V: VERSION, SEQ: seq, UNIT: getattr(future, "unit_id", None), ROLE: role, KIND: FAILED,
            REASON: Reason.RESULT_ERROR,
            DETAIL: f"the daemon could not deliver the outcome: {type(exc).__name__}: {exc}"}


def _pickled_error(exc: BaseException | _Pickled | None) -> str | None:
    if exc is None:
        return None
    if isinstance(exc, _Pickled):
        raw = exc.data  # relayed: as its worker pickled it
    else:
        try:
            raw = dumps(exc, "the handler's exception")
        except CodecError:  # the text in `detail` still says what happened
            return None
    return base64.b64encode(raw).decode("ascii") if len(raw) <= MAX_ERROR_BYTES else None


# ================================================================== client half
@record
class Record:
    """One parsed outcome record (see the module docstring for the fields)."""

    seq: int | None
    unit: int | None
    role: str | None
    kind: str
    reason: str | None = None
    detail: str | None = None
    error: str | None = None
    value: str | None = None
    part: int | None = None
    parts: int | None = None
    #: The value's memfd, mapped, or its parcel's descriptor (`claim_values`), when it came in one.
    mapped: Any = None
    #: A parcel's layout: each part's ``(offset, bytes)``, and how many are out-of-band buffers.
    spans: tuple = ()
    oob: int = 0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _optional(obj: dict, field: str, ok: Any, what: str) -> Any:
    value = obj.get(field)
    if value is not None and not ok(value):
        raise BadOutcomeRecord(field, f"must be {what} or null, got {value!r:.80}")
    return value


def parse(obj: Any) -> Record:
    """Check one record as `encode` builds it; BadOutcomeRecord naming the field if it is not.

    Fields this version does not know are ignored.
    """
    if not isinstance(obj, dict):
        raise BadOutcomeRecord("(record)", f"must be a JSON object, got {type(obj).__name__}")
    if obj.get(V, VERSION) != VERSION:
        raise BadOutcomeRecord(V, f"version {obj[V]!r} is not the version this client reads ({VERSION})")
    kind = obj.get(KIND)
    if kind not in KINDS:
        raise BadOutcomeRecord(KIND, f"must be one of {', '.join(KINDS)}, got {kind!r:.80}")
    get = obj.get
    seq, unit, part, parts = get(SEQ), get(UNIT), get(PART), get(PARTS)
    role, reason, detail, error, value = get(ROLE), get(REASON), get(DETAIL), get(ERROR), get(VALUE)
    # Each field None or of its kind, in the order they are named; the common record's
    # plain types pass on one look each, anything else is asked as `_optional` asks.
    for field, got in ((SEQ, seq), (UNIT, unit)):
        if got is not None and type(got) is not int:
            _optional(obj, field, _is_int, "an integer")
    for field, got in ((ROLE, role), (REASON, reason), (DETAIL, detail), (ERROR, error), (VALUE, value)):
        if got is not None and type(got) is not str:
            _optional(obj, field, _is_str, "a string")
    mapped = obj.get(VALUE_FD)
    if mapped is not None and type(mapped) not in (fdpass.Mapped, fdpass.Held):
        raise BadOutcomeRecord(VALUE_FD, f"names no descriptor the frame brought, got {mapped!r:.80}")
    spans, oob = _layout(obj, mapped)
    if mapped is not None and (kind != SOLVED or value is not None or PARTS in obj):
        raise BadOutcomeRecord(VALUE_FD, "a value in a memfd is a solved record's whole value, alone")
    if kind == SOLVED and value is None and mapped is None:
        raise BadOutcomeRecord(VALUE, "a solved record must carry its value (a base64 string, or a memfd)")
    for field, got in ((PART, part), (PARTS, parts)):
        if got is not None and type(got) is not int:
            _optional(obj, field, _is_int, "an integer")
    if (part is None) != (parts is None):
        raise BadOutcomeRecord(PART if part is None else PARTS, "part and parts come together")
    if parts is not None:
        if parts < 1:
            raise BadOutcomeRecord(PARTS, f"must be at least 1, got {parts}")
        if not 0 <= part < parts:
            raise BadOutcomeRecord(PART, f"must be between 0 and {parts - 1}, got {part}")
        if kind != SOLVED:
            raise BadOutcomeRecord(PARTS, f"only a solved value travels in parts, not a {kind} record")
    return Record(seq, unit, role, kind, reason, detail, error, value, part, parts, mapped, spans, oob)


def _layout(obj: dict, mapped: Any) -> tuple[tuple, int]:
    """A parcel record's ``value_spans`` and ``value_oob``, checked; ``((), 0)`` for any other."""
    spans, oob = obj.get(VALUE_SPANS), obj.get(VALUE_OOB)
    if type(mapped) is not fdpass.Held:
        if spans is not None or oob is not None:
            raise BadOutcomeRecord(VALUE_SPANS, "a layout comes only with a parcel's descriptor (value_fd)")
        return (), 0
    if not (isinstance(spans, list) and spans and all(
            isinstance(one, list) and len(one) == 2 and all(_is_int(x) and x >= 0 for x in one) for one in spans)):
        raise BadOutcomeRecord(VALUE_SPANS, f"must be a non-empty list of [offset, bytes] pairs of integers >= 0, "
                                            f"got {spans!r:.80}")
    if not (_is_int(oob) and 0 <= oob < len(spans)):
        raise BadOutcomeRecord(VALUE_OOB, f"must be an integer from 0 to {len(spans) - 1}, got {oob!r:.40}")
    return tuple((o, n) for o, n in spans), oob


def claim_values(records: Any, fds: list[int]) -> None:
    """Map the memfd each record's ``value_fd`` names (`fds.claim`: every descriptor of the
    frame named by exactly one record, each checked as a payload's is), or take the parcel's
    descriptor of a record with ``value_spans`` (`fds.open_parcel`), in its place. Owns
    ``fds``: BadOutcomeRecord naming what was wrong, every descriptor closed and every
    mapping released, when they do not fit."""
    records = [r for r in records if isinstance(r, dict) and VALUE_FD in r] if isinstance(records, list) else []
    items = []
    try:
        for record in records:
            i, n = record[VALUE_FD], record.get(VALUE_LEN)
            if not (_is_int(i) and i >= 0):
                raise BadOutcomeRecord(VALUE_FD, f"must be a descriptor's index (an integer >= 0), got {i!r:.40}")
            if not (_is_int(n) and n >= 1):
                raise BadOutcomeRecord(VALUE_LEN, f"must be an integer >= 1, got {n!r:.40}")
            item = (i, n, f"outcome of seq {record.get(SEQ)}: value_fd", f"seq {record.get(SEQ)}")
            items.append((*item, fdpass.open_parcel) if VALUE_SPANS in record else item)
    except BadOutcomeRecord:
        fdpass.close_all(fds)
        raise
    mapped = fdpass.claim(items, fds, lambda message: BadOutcomeRecord(VALUE_FD, message), "record")
    for record, one in zip(records, mapped):
        record[VALUE_FD] = one


#: `join_part`'s answer while parts of a value are still to come.
INCOMPLETE = object()


def join_part(record: Record, held: dict) -> str | None | object:
    """The record's value; for a value in parts, the parts held so far for its ``seq``
    in ``held`` joined once the last one arrives, `INCOMPLETE` until then."""
    if record.mapped is not None:
        return record.mapped
    if record.parts is None:
        return record.value
    parts = held.setdefault(record.seq, [])
    parts.append(record.value)
    if len(parts) < record.parts:
        return INCOMPLETE
    return "".join(held.pop(record.seq))


def result_of(record: Record, value: str | None, role: str) -> Any:
    """The value of a solved record; raises the unit's UnitFailed / UnitSuppressed otherwise."""
    unit_id = record.unit or 0
    if record.kind == SOLVED:
        try:
            if type(value) is fdpass.Mapped:
                try:
                    return loads(value.view, "the result")
                finally:
                    value.close()
            if type(value) is fdpass.Held:
                try:
                    return value_in_parcel(value.fd, value.size, record.spans, record.oob)
                finally:
                    value.close()
            return loads(_unbase64(value, VALUE), "the result")
        except CodecError as exc:  # e.g. a class this process cannot import, or a __reduce__ that exits
            raise error_for(unit_id, role, Outcome(FAILED, Reason.RESULT_ERROR, str(exc))) from None
    detail, original = record.detail, None
    if record.error:
        detail, original = handler_error(record.detail, _unbase64(record.error, ERROR))
    raise unit_exception(unit_id, role, Outcome(record.kind, record.reason, detail), original)


def _unbase64(text: str, field: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadOutcomeRecord(field, f"is not base64: {exc}") from None
