"""The ops on units: submit one, collect the outcomes held for a client, cancel one."""
from __future__ import annotations

import base64
import binascii
import logging
import re
from concurrent.futures import Future
from typing import Any

from fleet.rules import ranges
from fleet.rules.errors import EXIT_DATA, EXIT_FAILURE, EXIT_OK, FleetError
from fleet.service.control.errors import E_INTERNAL, E_INVALID_REPLY, ProtocolError
from fleet.runtime.submit import UNIT_ARGS
from fleet.service import replays
from fleet.service.control import fds as fdpass
from fleet.service.control import outcome_record
from fleet.service.control.ops.base import OPS, Op, in_range
from fleet.service.control.wire import Arg, json_type
from fleet.shm import parcels
from fleet.worker.codec import _Laid

#: Longest a `collect` may wait: below ControlServer's default reply_timeout (30 s),
#: so a long poll always ends with an answer, never with the server's Timeout.
COLLECT_MAX_WAIT_S = 20.0
#: Most bytes of outcomes one `collect` reply carries (well under MAX_FRAME).
COLLECT_REPLY_BUDGET = 768 * 1024

log = logging.getLogger(__name__)

_TOKEN = re.compile(r"[A-Za-z0-9_-]{8,128}")

#: The wire's type and doc of each of a unit's arguments (`fleet.runtime.submit.UNIT_ARGS`
#: names them and their defaults).
_UNIT_WIRE = {
    "key": ((str, int, type(None)), "bin key for pinned roles"),
    "lane": ((str, type(None)), ""),
    "priority": ((int,), ""),
    "timeout": ((float, type(None)), "seconds"),
    "request_id": ((str, type(None)), "idempotency id: a submit repeated with it is admitted once "
                                      "(fleet.service.replays); the reply says replayed"),
    "route": ((str, type(None)), "provider pool the unit calls: model@provider[/credential]"),
    "severity": ((str, type(None)), "a declared severity (urgency inside the lane)"),
    "pinned": ((bool,), "hard pin: wait for this route, never move"),
    "parent": ((int, type(None)), "the unit that delegated this one (admitted at once)"),
    "tag": ((str, type(None)), "the agent or unit tag (pins may name it)"),
    "age": ((float,), "seconds the unit waited already (its urgency counts from then)"),
}
assert list(_UNIT_WIRE) == list(UNIT_ARGS), "every unit argument travels, with its wire type"


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
        **{name: Arg(kinds, default=UNIT_ARGS[name], doc=doc) for name, (kinds, doc) in _UNIT_WIRE.items()},
        "token": Arg((str, type(None)), doc="hold the outcome for `collect` under this client token"),
        "seq": Arg((int, type(None)), doc="the client's number for the unit, echoed in its outcome"),
        "chunk": Arg((bool,), default=False, doc="the payload is a list of items run as one unit"),
        "items": Arg((int, type(None)), doc="how many items the chunk holds (the ledger counts them)"),
        "payload_fd": Arg((int, type(None)), doc="the pickled payload is in a sealed memfd: the index of its "
                                                 "descriptor among those the frame brought (payload null)"),
        "payload_len": Arg((int, type(None)), doc="with payload_fd: the memfd's length in bytes"),
        "payload_spans": Arg((list, type(None)), doc="with payload_fd: each part's [offset, bytes] in the memfd: "
                                                     "the pickle, its out-of-band buffers, then its blobs"),
        "payload_oob": Arg((int, type(None)), doc="with payload_spans: how many of the parts are out-of-band buffers"),
    }

    direct = True  # the submitter, the outcome store and the replays take any thread

    def on_daemon(self, daemon, **args: Any) -> dict:
        """Admit one unit (the checked arguments of the wire). ``payload`` is pickled bytes when
        ``encoding == "pickle"``, else the decoded JSON value. With a ``token`` the outcome is
        held for `collect` under that token, tagged with ``seq``. ``chunk``: the payload is a
        list of items run as one unit, ``items`` of them (the ledger counts them; the daemon
        never unpickles the chunk to count). Replies with the unit id, the role's queue bound
        and slots, and whether it was a replay (a retry with the same ``request_id``)."""
        if args["token"] is not None:
            daemon.store.hold(args["token"])
        fut, replayed = self.admit(daemon, args)
        spec = daemon.config.roles[args["role"]]
        return {"unit": fut.unit_id, "queue_bound": spec.queue_bound, "slots": spec.slots, "replayed": replayed}

    @staticmethod
    def admit(daemon, args: dict[str, Any]) -> tuple[Any, bool]:
        """One checked unit into the fleet (its token held already): its future, and whether
        it was a replay. Raises the fleet's typed refusal, having queued nothing."""
        role, payload, token, chunk = args["role"], args["payload"], args["token"], args["chunk"]
        unit = {name: args[name] for name in UNIT_ARGS}
        request_id = unit["request_id"]
        # A retry of a submit whose reply was lost: the unit admitted the first time
        # answers it (its outcome goes to this token too); nothing runs twice.
        same = fut = None
        if request_id is not None:
            raw = payload.data if type(payload) is _Laid else payload  # a laid-out payload: its memfd's bytes
            same = replays.identity(role, raw, unit["key"], unit["lane"], chunk, unit["route"])
            fut = daemon.replays.find(request_id, same)
        replayed = fut is not None
        if not replayed:
            body = {"pickled_payload": payload} if args["encoding"] == "pickle" else {"payload": payload}
            # block=False: this loop serves every client; a full queue is the client's QueueFull.
            fut = daemon.sup.submit(role, chunk=chunk, items=args["items"], block=False, **unit, **body)
            if request_id is not None:
                daemon.replays.admitted(request_id, same, fut)
        if token is not None:
            store, seq = daemon.store, args["seq"]
            fut.add_done_callback(store.deliver(token, seq, role))
        return fut, replayed

    def take_fds(self, args: dict[str, Any], fds: list[int]) -> list:
        """The memfd a submit's ``payload_fd`` names, mapped in place of its payload."""
        return claim_payloads(self, [("", args)], fds)

    def to_wire(self, **args: Any) -> dict[str, Any]:
        """Callers pass any Python ``payload``; it is pickled unless ``encoding="json"``.

        ``pickled=<bytes>`` in place of ``payload`` sends bytes the caller pickled
        already (a client that measures a payload before sending it).
        """
        if "pickled" in args:
            args["payload"] = base64.b64encode(args.pop("pickled")).decode("ascii")
            args["encoding"] = "pickle"
        elif args.setdefault("encoding", "pickle") == "pickle" and "payload" in args:
            from fleet.worker.codec import CodecError, dumps  # the client half only: the daemon never pickles a payload

            try:
                raw = dumps(args["payload"], "payload")
            except CodecError as exc:
                raise self.bad(str(exc)) from None
            args["payload"] = base64.b64encode(raw).decode("ascii")
        return super().to_wire(**args)

    def check(self, args: dict[str, Any]) -> None:
        if not args["role"]:
            raise self.bad("role must be a non-empty string")
        if args["encoding"] not in self.ENCODINGS:
            raise self.bad(f"encoding must be one of {', '.join(self.ENCODINGS)}, got {args['encoding']!r}")
        for name, within in (("priority", ranges.PRIORITY), ("timeout", ranges.UNIT_TIMEOUT_S),
                             ("seq", ranges.SEQ), ("parent", ranges.UNIT_ID)):
            in_range(self, name, args[name], within)
        if args["token"] is not None and not _TOKEN.fullmatch(args["token"]):
            raise self.bad(f"token must be 8-128 letters, digits, '_' or '-', got {args['token']!r}")
        if args["seq"] is not None and args["token"] is None:
            raise self.bad("seq tags an outcome held for a token: give token too")
        if args["chunk"] and args["encoding"] != "pickle":
            raise self.bad("a chunk travels pickled: use encoding pickle")
        if args["items"] is not None and not args["chunk"]:
            raise self.bad("items counts the items of a chunk: give chunk too")
        in_range(self, "items", args["items"], ranges.CHUNK_ITEMS)
        if args["route"] is not None:
            from admission.route import Route

            try:
                args["route"] = Route.parse(args["route"])
            except ValueError as exc:
                raise self.bad(str(exc)) from None
        if args["payload_fd"] is not None or args["payload_len"] is not None:
            if args["payload_fd"] is None or args["payload_len"] is None:
                raise self.bad("payload_fd and payload_len go together (a memfd and its length)")
            if args["encoding"] != "pickle" or args["payload"] is not None:
                raise self.bad("a payload in a memfd (payload_fd) is pickled: encoding pickle, payload null")
            if not 0 <= args["payload_fd"] < fdpass.MAX_FRAME_FDS:
                raise self.bad(f"payload_fd must be 0-{fdpass.MAX_FRAME_FDS - 1}, got {args['payload_fd']}")
            if args["payload_len"] < 1:
                raise self.bad(f"payload_len must be >= 1, got {args['payload_len']}")
            _check_layout(self, args)
        elif args["payload_spans"] is not None or args["payload_oob"] is not None:
            raise self.bad("payload_spans and payload_oob lay out a memfd: give payload_fd and payload_len too")
        elif args["encoding"] == "pickle" and type(args["payload"]) is not bytes:  # bytes: an inlet's, as they are
            if not isinstance(args["payload"], str):
                raise self.bad(f"a pickle payload must be a base64 string, got {json_type(args['payload'])}")
            try:
                args["payload"] = base64.b64decode(args["payload"], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise self.bad(f"payload is not valid base64: {exc}") from None


#: The batch frame's format (`SubmitBatchOp`, its ``v``): a client sends the version it
#: speaks, and a daemon refuses one it does not know with InvalidArgs, admitting nothing.
#: 2: the batch's connection carries the token's outcomes (pushed), and ``ack`` rides along.
BATCH_VERSION = 2
#: Every version this daemon speaks: a v1 client (outcomes by ``collect`` alone) keeps working.
BATCH_VERSIONS = (1, 2)
#: Most units one batch frame carries (each is also bounded by the frame's size).
MAX_BATCH_UNITS = 4096
#: What a unit of a batch may say: a submit's arguments but the token (the batch's own).
_BATCH_UNIT_KEYS = frozenset(SubmitOp.schema) - {"token"}


@OPS.register
class SubmitBatchOp(Op):
    """Submit the units a client had in flight together, in one frame (`fleet.Client`'s
    submits, coalesced while its previous frame was being written).

    ``units`` is a list of objects, each a `submit`'s arguments but ``token`` (the batch's
    ``token`` holds every outcome) and with ``seq`` required, unique in the batch. The frame
    is checked whole first: a malformed one (a unit that is not an object, an unknown or
    mistyped argument, a repeated seq, an unknown ``v``) is refused with InvalidArgs naming
    the unit and what was wrong, and nothing is admitted. Then each unit is admitted in
    order as a `submit` would be; a unit the fleet refuses (QueueFull, UnknownRoleError,
    Draining, ...) is refused alone. Reply: ``{"units": [unit id or null, ...],
    "errors": {"<index>": {"type", "message"}}, "replayed": [index, ...],
    "roles": {role: [queue_bound, slots]}}``; every unit of the batch has either its id
    (its outcome follows under the token) or its error, never both.

    Version 2 (``v: 2``) also attaches the token to the batch's connection: its outcomes
    are pushed on it as they are held (`fleet.service.control.wire.encode_push` frames,
    between the replies), from the first one not acknowledged, with no ``collect`` asked
    for each; ``ack`` (optional) says how many of the token's outcomes the client has,
    as a ``collect``'s does (an ack past what was sent is ignored). A ``collect`` of the
    token waits meanwhile, and is answered when the connection closes. Version 1 gets
    outcomes by ``collect`` alone."""

    name = "submit_batch"
    mutating = True
    direct = True
    streams = True
    summary = "Submit several units in one frame (a client's submits in flight, coalesced)."
    no_command = "a unit's payload is a Python object: submit from Python (fleet.connect(name).submit)"
    method = None
    no_method = "fleet.Client.submit sends its submits in flight as one batch"
    schema = {
        "v": Arg((int,), required=True, doc="the batch format's version (" + ", ".join(map(str, BATCH_VERSIONS))
                                            + "; 2 pushes outcomes on the connection)"),
        "token": Arg((str,), required=True, doc="hold every outcome for `collect` under this client token"),
        "units": Arg((list,), required=True, doc=f"1-{MAX_BATCH_UNITS} objects: a submit's arguments each, "
                                                  "seq required"),
        "ack": Arg((int, type(None)), doc="v2: how many of the token's outcomes the client has received"),
        "fds": Arg((bool,), default=False, doc="the client takes large values in sealed memfds (value_fd)"),
        "parcels": Arg((bool,), default=False, doc="with fds: the client takes a value still in its worker's "
                                                   "parcel as the parcel's read-only descriptor (value_spans)"),
    }

    def check(self, args: dict[str, Any]) -> None:
        self._check_batch(args["v"], args["token"], args["ack"], args["units"])
        units = args["units"]
        submit, checked, seqs, token = OPS.get(SubmitOp.name), [], set(), args["token"]
        for i, unit in enumerate(units):
            one = _plain_unit(unit, token)
            if one is not None and one["seq"] not in seqs:
                seqs.add(one["seq"])
                checked.append(one)
                continue
            if not isinstance(unit, dict):
                raise self.bad(f"units[{i}] must be an object, got {json_type(unit)}")
            extra = sorted(set(unit) - _BATCH_UNIT_KEYS)
            if extra:
                raise self.bad(f"units[{i}]: unknown argument(s) {', '.join(extra)} (the batch's token holds "
                               "every outcome)" if extra == ["token"] else
                               f"units[{i}]: unknown argument(s) {', '.join(extra)}")
            if unit.get("seq") is None:
                raise self.bad(f"units[{i}]: seq is required (the outcome's tag)")
            try:
                one = submit.validate({**unit, "token": args["token"]})
            except ProtocolError as exc:
                raise self.bad(f"units[{i}]: {exc.message}") from None
            if one["seq"] in seqs:
                raise self.bad(f"units[{i}]: seq {one['seq']} is given twice in this batch")
            seqs.add(one["seq"])
            checked.append(one)
        args["units"] = checked

    def _check_batch(self, v: int, token: str, ack: int | None, units: list) -> None:
        """The rules of a batch's own arguments (its units are each checked after)."""
        if v not in BATCH_VERSIONS:
            raise self.bad(f"batch version {v} is not spoken here (this daemon speaks "
                           f"{', '.join(map(str, BATCH_VERSIONS))})")
        if ack is not None and (v < 2 or ack < 0):
            raise self.bad(f"ack must be an integer >= 0, with v 2 or later; got ack {ack!r} with v {v}")
        if not _TOKEN.fullmatch(token):
            raise self.bad(f"token must be 8-128 letters, digits, '_' or '-', got {token!r}")
        if not 1 <= len(units) <= MAX_BATCH_UNITS:
            raise self.bad(f"units must hold 1-{MAX_BATCH_UNITS} units, got {len(units)}")

    def check_plain(self, token: str, ack: int | None, units: list) -> list[dict[str, Any]] | None:
        """A v2 batch of plain units ``[(seq, role, pickled payload), ...]`` (an inlet's,
        `fleet.service.inlets`: each field of its type already), checked by the rules
        `validate` applies to such a batch: its units' checked arguments as `validate`
        makes them. ProtocolError for the batch's own arguments; None when some unit is
        not one a plain unit's rule takes (or a seq repeats): `validate` then says what."""
        self._check_batch(BATCH_VERSION, token, ack, units)
        checked, seqs = [], set()
        for seq, role, payload in units:
            one = _plain_args(role, payload, seq, token)
            if one is None or seq in seqs:
                return None
            seqs.add(seq)
            checked.append(one)
        return checked

    def take_fds(self, args: dict[str, Any], fds: list[int]) -> list:
        """The memfds the units' ``payload_fd`` name, each mapped in place of its payload."""
        return claim_payloads(self, [(f"units[{i}]: ", unit) for i, unit in enumerate(args["units"])], fds)

    def on_daemon(self, daemon, v: int, token: str, units: list, ack: int | None = None, fds: bool = False,
                  parcels: bool = False, stream=None) -> dict:
        """Admit every unit of a checked batch in order; a refusal is that unit's alone. A
        run of plain units of one role (nothing but a pickled payload: the common case) is
        admitted a run at a time (`Submitter.submit_pickled`); a unit such a run stopped
        at, and any other unit, one by one (`SubmitOp.admit`), each with its own refusal.
        v2: the token's outcomes are pushed on ``stream`` (the batch's connection) from
        now on, and ``ack`` lets go of those the client has."""
        if v >= 2:  # OutcomesDropped (raised by hold) before anything is admitted
            daemon.store.hold(token, fds, parcels, ack=ack, stream=stream)
        else:
            daemon.store.hold(token, fds, parcels)
        ids, errors, replayed, roles = [None] * len(units), {}, [], {}
        specs, store, i = daemon.config.roles, daemon.store, 0
        while i < len(units):
            args = units[i]
            role = args["role"]
            if _plain(args):
                end = i + 1
                while end < len(units) and units[end]["role"] == role and _plain(units[end]):
                    end += 1
                futures = daemon.sup.submit_pickled(role, [u["payload"] for u in units[i:end]])
                for k, fut in enumerate(futures, i):
                    seq = units[k]["seq"]
                    fut.add_done_callback(store.deliver(token, seq, role))
                    ids[k] = fut.unit_id
                i += len(futures)
                if futures and role not in roles:
                    roles[role] = [specs[role].queue_bound, specs[role].slots]
                if i == end:
                    continue
                args = units[i]  # the run stopped here: this one alone says why
            try:
                fut, again = SubmitOp.admit(daemon, args)
            except FleetError as exc:
                errors[str(i)] = {"type": type(exc).__name__, "message": str(exc)}
            except Exception as exc:  # noqa: BLE001 - one unit's bug must not cost the others their answer
                log.error("submit_batch: unit %d failed", i, exc_info=exc)
                errors[str(i)] = {"type": E_INTERNAL, "message": f"submit failed: {type(exc).__name__}: {exc}"}
            else:
                ids[i] = fut.unit_id
                if again:
                    replayed.append(i)
                if role not in roles:
                    roles[role] = [specs[role].queue_bound, specs[role].slots]
            i += 1
        return {"units": ids, "errors": errors, "replayed": replayed, "roles": roles}


@OPS.register
class OpenInletOp(Op):
    """Open an inlet for this connection: a byte ring in shared memory that the client
    pushes its batches of plain units into, for the supervisor's loop to take itself
    (`fleet.shm.inlet`, `fleet.service.inlets`), with no frame for fleetd's control
    thread to read. Each batch is answered on this connection as a ``submit_batch`` v2
    frame would be (its reply, then its token's outcomes pushed), and is checked as one.

    Reply: ``{"inlet": <descriptor index>, "capacity": bytes, "fleet": name}``, the
    inlet's sealed memfd beside (SCM_RIGHTS). The client rings the loop's bell in the
    fleet's data segment (``fleet``) after each push. The inlet closes with the
    connection; at most one per connection (a second is refused, as is one past
    fleetd's bound on inlets: the client's batches then go as frames)."""

    name = "open_inlet"
    mutating = True
    direct = True
    streams = True
    summary = "Open a shared-memory inlet for this connection's submits (fleet.Client opens one)."
    no_command = "an inlet is a client's, for its submits from Python (fleet.connect(name).submit)"
    method = None
    no_method = "fleet.Client opens one on its submit connection"
    schema = {}

    def on_daemon(self, daemon, stream=None) -> dict:
        inlet = daemon.inlets.open(stream)
        # fleetd keeps no descriptor of it: its mapping keeps the memfd while the inlet lives
        return {"inlet": fdpass.HandedOff(inlet.hand_over(), inlet.capacity), "capacity": inlet.capacity,
                "fleet": daemon.sup.name}

    def claim_reply_fds(self, result: Any, fds: list[int]) -> None:
        """The inlet's memfd, in its index's place (`fds.Held`); any other descriptor closed."""
        index = result.get("inlet") if isinstance(result, dict) else None
        if type(index) is not int or not 0 <= index < len(fds) or len(fds) != 1:
            fdpass.close_all(fds)
            raise ProtocolError(E_INVALID_REPLY, f"open_inlet: the reply names descriptor {index!r} of "
                                                 f"{len(fds)} it brought")
        result["inlet"] = fdpass.Held(fds[0], 0)


#: Most parts a laid-out payload may have (its pickle, buffers and blobs): a bound on the
#: work of packing it, far above what an object's large buffers come to.
MAX_PAYLOAD_SPANS = 4096


def _check_layout(op: Op, args: dict[str, Any]) -> None:
    """A memfd payload's ``payload_spans`` and ``payload_oob`` (both or neither): parts in
    order, each within the memfd, none overlapping another; the count of buffers in range.
    The spans are all fleetd reads of the memfd (`fleet.worker.codec._Laid`)."""
    spans, oob, length = args["payload_spans"], args["payload_oob"], args["payload_len"]
    if spans is None and oob is None:
        return
    if spans is None or oob is None:
        raise op.bad("payload_spans and payload_oob go together (the memfd's parts and how many are buffers)")
    if not 1 <= len(spans) <= MAX_PAYLOAD_SPANS:
        raise op.bad(f"payload_spans must hold 1-{MAX_PAYLOAD_SPANS} parts, got {len(spans)}")
    for i, span in enumerate(spans):
        if not (type(span) is list and len(span) == 2 and all(type(x) is int and x >= 0 for x in span)):
            raise op.bad(f"payload_spans[{i}] must be [offset, bytes], integers >= 0, got {span!r:.60}")
    fault = parcels.spans_fault(spans, oob, length, spans_name="payload_spans", oob_name="payload_oob",
                                file="the memfd")
    if fault is not None:
        raise op.bad(fault)
    args["payload_spans"] = [tuple(span) for span in spans]


def claim_payloads(op: Op, units: list[tuple[str, dict[str, Any]]], fds: list[int]) -> list:
    """Map the memfd each unit's ``payload_fd`` names (`fds.claim`: every descriptor of the
    frame named by exactly one unit, each checked) as its payload; the mappings, for the
    call to release. Owns ``fds``: on a refusal (InvalidArgs naming the unit and what was
    wrong) every descriptor is closed and every mapping released."""
    items = [(unit["payload_fd"], unit["payload_len"], f"{where}payload_fd", where.rstrip(": ") or "the submit",
              _open_payload) for where, unit in units]
    mapped = fdpass.claim(items, fds, op.bad, "unit")
    for (_where, unit), one in zip(units, mapped):
        if one is not None:
            # A payload in a memfd is laid out (a pickle alone: one part, no buffers); the
            # memfd's descriptor goes with it, for the supervisor to hand to the worker
            # (`fleet.shm.handoff`): its bytes are written once, by the client.
            spans = unit.get("payload_spans") or [(0, unit["payload_len"])]
            oob = unit["payload_oob"] if unit.get("payload_spans") else 0
            unit["payload"] = _Laid(one.view, spans, oob, one.fd)
    return [one for one in mapped if one is not None]


def _open_payload(fd: int, length: int, what: str):
    return fdpass.open_sealed(fd, length, what, private=True, keep=True)


#: The arguments of a plain unit (role, pickled payload, seq: `fleet.Client.submit`'s
#: common case) and the defaults `_plain_unit` fills in for the rest.
_PLAIN_KEYS = frozenset({"role", "payload", "encoding", "seq"})
_PLAIN_DEFAULTS = {name: spec.default for name, spec in SubmitOp.schema.items()}


def _plain(args: dict[str, Any]) -> bool:
    """Whether checked unit arguments ask nothing but the role's defaults (a pickled
    payload; no key, lane, priority, timeout, request id, route or chunk)."""
    return (args["encoding"] == "pickle" and args["key"] is None and args["lane"] is None and args["priority"] == 0
            and args["timeout"] is None and args["request_id"] is None and args["route"] is None
            and not args["chunk"])


def _plain_unit(unit: Any, token: str) -> dict[str, Any] | None:
    """The checked arguments of a plain unit, as `SubmitOp.validate` makes them; None when
    the unit is anything else (or anything about it is wrong): the full check then says
    what. The same rules, on the path every plain unit of a batch takes."""
    if type(unit) is not dict or not unit.keys() <= _PLAIN_KEYS or unit.get("encoding") != "pickle":
        return None
    payload = unit.get("payload")
    if type(payload) is str:
        try:
            payload = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            return None
    return _plain_args(unit.get("role"), payload, unit.get("seq"), token)


def _plain_args(role: Any, payload: Any, seq: Any, token: str) -> dict[str, Any] | None:
    """A plain unit's checked arguments from its role, its pickled bytes and its seq; None
    when one of them is not what a plain unit's is."""
    if type(role) is not str or not role or type(seq) is not int or not ranges.SEQ.holds(seq) \
            or type(payload) is not bytes:
        return None
    return {**_PLAIN_DEFAULTS, "role": role, "payload": payload, "encoding": "pickle", "seq": seq, "token": token}


@OPS.register
class CollectOp(Op):
    """Long-poll the outcomes held for a client token (see "Result delivery" in
    `fleet.service.control`).

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
        "fds": Arg((bool,), default=False, doc="the client takes large values in sealed memfds (value_fd)"),
        "parcels": Arg((bool,), default=False, doc="with fds: the client takes a value still in its worker's "
                                                   "parcel as the parcel's read-only descriptor (value_spans)"),
    }

    def on_daemon(self, daemon, token: str, timeout: float, ack: int | None = None, fds: bool = False,
                  parcels: bool = False) -> Future:
        """The outcomes held for ``token``: a Future resolved, without blocking the caller, as
        soon as one is ready or after ``timeout`` seconds (then empty). ``ack``: how many of
        the token's outcomes the client has; ``fds``: it takes large values in memfds;
        ``parcels``: and those in their workers' parcels as the parcels' descriptors."""
        return daemon.store.collect(token, timeout, ack, fds, parcels)

    def claim_reply_fds(self, result: Any, fds: list[int]) -> None:
        """The memfds of the reply's values, each mapped in its record's place."""
        outcomes = result.get("outcomes") if isinstance(result, dict) else None
        outcome_record.claim_values(outcomes if isinstance(outcomes, list) else [], fds)

    def check(self, args: dict[str, Any]) -> None:
        if not _TOKEN.fullmatch(args["token"]):
            raise self.bad(f"token must be 8-128 letters, digits, '_' or '-', got {args['token']!r}")
        if not 0 <= args["timeout"] <= COLLECT_MAX_WAIT_S:
            raise self.bad(f"timeout must be between 0 and {COLLECT_MAX_WAIT_S:g} seconds, got {args['timeout']!r}")
        if args["ack"] is not None and args["ack"] < 0:
            raise self.bad(f"ack must be >= 0, got {args['ack']!r}")

    def call_args(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"token": args["token"], "timeout": float(args["timeout"]), "ack": args["ack"], "fds": args["fds"],
                "parcels": args["parcels"]}


#: What `cancel` says became of a unit (its reply's ``state``).
CANCELLED = "cancelled"  # it had not started: it never runs, its outcome is failed Cancelled
RUNNING = "running"  # it started: it runs to its own outcome
ENDED = "ended"  # it had its outcome already
UNKNOWN = "unknown"  # this fleet never handed out that unit id
CANCEL_STATES = (CANCELLED, RUNNING, ENDED, UNKNOWN)


@OPS.register
class CancelOp(Op):
    """Cancel a unit that has not started: it never runs, and its outcome is failed
    ``Cancelled`` (counted in the ledger, delivered to its client). A unit already
    running runs on to its own outcome, but its children (units it submitted from
    inside, `fleet.current_fleet`) that have not started are cancelled, and those that
    run finish; an ended unit is left alone. Reply: ``{"unit", "cancelled": bool, "state",
    "children"}`` with ``state`` one of ``cancelled``, ``running``, ``ended``, ``unknown``
    (an id the fleet never handed out) and ``children`` how many children were cancelled. fleetctl exits 0 when it cancelled the unit, 1 when the
    unit is running or ended (nothing changed), 65 for an unknown id."""

    name = "cancel"
    mutating = True
    summary = "Cancel a unit that has not started yet."
    schema = {"unit": Arg((int,), required=True, doc="the unit id submit replied with")}
    command = ("cancel",)
    help = ("Cancel a queued unit by id: it never runs and fails Cancelled; a running one runs on, its queued "
            "children cancelled; an ended one is left alone.")
    description = (help + " Exit 0: cancelled; 1: running or already ended (nothing changed); 65: no unit of "
                   "this fleet has that id.")
    #: What fleetctl says and exits with, per state.
    TEXT = {CANCELLED: ("cancelled: it will not run; its outcome is failed Cancelled", EXIT_OK),
            RUNNING: ("not cancelled: it is running and ends with its own outcome", EXIT_FAILURE),
            ENDED: ("not cancelled: it has ended already", EXIT_FAILURE),
            UNKNOWN: ("unknown: no unit of this fleet has that id", EXIT_DATA)}

    def run(self, sup, unit: int) -> dict:
        """Cancel unit ``unit`` (its id, ``future.unit_id``) if it has not started:
        ``{"unit", "cancelled", "state", "children"}``, ``state`` one of `CANCEL_STATES`;
        a running unit's children that have not started are cancelled (``children``: how many).
        ``future.cancel()`` does the same for a future of the fleet's own caller."""
        issued, future = sup.find_unit(unit)
        # The future is cancelled here, not on the loop: its callbacks are its caller's
        # and run on the thread that resolves it. A unit that has not started has a
        # pending future the loop has not claimed; cancelling it is final (the loop
        # skips it at its grant and records Cancelled).
        if future is None:
            state = ENDED if issued else UNKNOWN
        elif future.cancel():
            state = CANCELLED
        else:
            state = ENDED if future.done() else RUNNING
        children = sup.cancel_children(unit) if state == RUNNING else 0
        return {"unit": unit, "cancelled": state == CANCELLED, "state": state, "children": children}

    def add_arguments(self, parser) -> None:
        parser.add_argument("unit", metavar="UNIT", type=int, help="the unit id (submit's reply, Future.unit_id)")

    def from_cli(self, args) -> dict[str, Any]:
        return {"unit": args.unit}

    def render(self, result: Any, args) -> str:
        children = result.get("children", 0)
        also = f"; {children} of its children that had not started cancelled" if children else ""
        return f"unit {result['unit']}: {self.TEXT[result['state']][0]}{also}\n"

    def exit_code(self, result: Any) -> int:
        return self.TEXT[result["state"]][1]

    def check(self, args: dict[str, Any]) -> None:
        in_range(self, "unit", args["unit"], ranges.UNIT_ID)
