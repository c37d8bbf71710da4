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

Descriptors beside frames. A request may bring file descriptors (SCM_RIGHTS; `fds`): a
``submit`` / ``submit_batch`` unit whose pickled payload is in a sealed memfd says
``"payload": null, "payload_fd": <index among the frame's descriptors>, "payload_len":
<bytes>`` (a client sends one from `fds.MEMFD_MIN` bytes), and, when the memfd is laid out
as a parcel (`fleet.worker.codec.lay_out`: the pickle, its out-of-band buffers, its blobs),
``"payload_spans": [[offset, bytes], ...]`` (in order, within the memfd, none overlapping)
and ``"payload_oob": <how many are buffers>``; fleetd never reads the pickle: it hands the
memfd itself to the worker with the task (`fleet.shm.handoff`), which builds the payload over
its mapping of it at the spans (`fleet.worker.codec._Laid`). A daemon older
than the spans refuses them with ``InvalidArgs`` (unknown arguments), admitting nothing. The sender passes a frame's
descriptors with the first bytes of that frame (one sendmsg); the server attributes each
descriptor to the frame whose bytes it came with, and the frame must name each exactly once.
Every descriptor is checked as hostile (a regular file, sealed against shrinking, growing
and writing, of the stated length) and a frame breaking any rule (an unnamed, missing,
unsealed or mis-sized descriptor, more than `fds.MAX_FRAME_FDS`, or an op that takes none)
is refused with ``InvalidArgs`` naming what was wrong, admits nothing, and has every
descriptor closed; so are those of a frame cut off, and of a connection that closes. A
connection holding more than `fds.MAX_HELD_FDS` descriptors no frame has claimed gets an
``InvalidArgs`` error (``"id": null``) and is closed. A daemon older than this refuses a
unit naming ``payload_fd`` with ``InvalidArgs`` (an unknown argument), admitting nothing.
The other way, a client that says ``"fds": true`` (``submit_batch``, ``collect``) gets a
value of `fds.MEMFD_MIN` bytes or more in a sealed memfd (``value_fd``, ``value_len`` in
its outcome record, `outcome_record`), the descriptor passed with the first bytes of the push
or reply that carries the record, in a message of that frame alone; one that does not
(an older client) gets base64 parts as before, and an older daemon refuses ``fds`` with
``InvalidArgs``. A client that also says ``"parcels": true`` gets a value still in the
parcel its worker wrote as a read-only descriptor of that parcel, unlinked (``value_fd``,
``value_len``, ``value_spans``, ``value_oob``: `outcome_record`), checked by `fds.open_parcel`
rather than for seals; an older daemon refuses ``parcels`` with ``InvalidArgs``. A reader attributes the descriptors of one read to the frame holding its
last byte (`fds.Arrivals` says why).

Ops. Each op is one class holding all of the command: fleetctl's half (its words,
arguments, text and exit code), the client half (`Op.to_wire` builds the arguments,
`Op.client` is the `fleet.Client` method's body), the daemon half (`Op.validate`
checks the arguments against the op's schema, `Op.execute` runs it against the
daemon's handler, `ServedOperations`) and the loop's half (what it does on the
supervisor's loop). `OPS` is the registry every side looks ops up in; nothing routes
by if/elif, and fleetctl's commands, the client's and the embedded Fleet's methods and
the handlers are made from it.

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
thread. Two kinds of op are the exceptions to "ops run on the main loop". A
*blocking* op (``Op.blocking``, i.e. ``collect``) waits for something to happen, so
the daemon's dispatch does not queue it to the loop; its ``execute`` returns at once
with a Future that the daemon resolves later, and nothing waits on it meanwhile. A
*direct* op (``Op.direct``: ``submit``, ``submit_batch``) touches only state whose
owners take any thread (the supervisor's submitter, the outcome store, the replays),
so it runs on the server thread as its frame is read: a submit crosses no loop it does
not need, and the replies to every frame of one read go out in one write.

Batches. ``submit_batch`` (``v``, ``token``, ``units``) carries the submits a client
had in flight together (`fleet.Client` sends a lone submit at once and coalesces those
made while a frame is in flight into the next one). The frame is checked whole before
anything is admitted: a malformed one is refused with ``InvalidArgs`` naming the unit
(``units[i]``) and what was wrong, and admits nothing; a batch version the daemon does
not speak is refused the same way. Then each unit is admitted in order, and a unit the
fleet refuses (``QueueFull``, ``UnknownRoleError``, ...) is refused alone, in the
reply's ``errors``; every other unit has its id, and its outcome follows under the
token. A batch whose sender leaves after the frame went out whole is admitted whole
(its outcomes are held under its token, as a submit's are); a frame cut off is
admitted in no part.

Connections. The server admits connections by uid (a cap per uid, a reserve for
the owner and root; an idle connection of a uid at its cap is closed to make room),
gives each a deadline to complete a frame, and refuses with a ``Busy`` error reply
(``"id": null``) when no room can be made; the client raises `ControlBusy`. See
`ControlServer`.

Result delivery (service mode). ``submit`` (or ``submit_batch``) admits a unit and
replies at once with its unit id. A client that wants outcomes passes a ``token`` (a random string it
keeps for its life) and a ``seq`` (its own number for the unit); the daemon holds
each outcome under the token until the client fetches it with ``collect``, a long
poll that returns every outcome ready for the token (or an empty list after its
``timeout``). A reply never exceeds `COLLECT_REPLY_BUDGET` (a value in a memfd counts its
bytes): outcomes beyond it wait for the next ``collect`` (the reply says ``"more": true``),
and one value too large for a reply travels in a memfd (see "Descriptors beside frames"),
or, to a client that takes none, in consecutive ``part``s that the client joins. A token's
outcomes are numbered; each ``collect`` acknowledges (``ack``) how many the client
has, and the daemon sends again those after it, so a reply lost to a client's
timeout or a broken connection loses nothing. A ``submit_batch`` of version 2 attaches
the token to its connection instead: the daemon pushes the token's outcomes on it as they
are held (``{"push": {"token", "first", "outcomes"}}`` frames between the replies, written
from the supervisor's loop at the end of the delivery that made them, `Stream`), each
batch's ``ack`` lets go of those the client has, and a ``collect`` of the token waits
until the connection closes, then takes every outcome not acknowledged. A ``submit`` with a ``request_id`` is
admitted once per id (`fleet.service.replays`): a retry after a lost reply gets the same unit. Outcomes held
for a token are bounded (bytes, ``limits.max_held_outcome_bytes``, and time since the token
was last seen); past the bound the daemon drops them, logs it, and answers that token's next
``collect`` with ``OutcomesDropped`` so the client fails its pending futures loudly. One
value over the bound alone is never held: its unit's outcome is a failed ``ResultError``
naming its size and the key.

Rooms. `errors` (the error types and the ``E_*`` names replies carry), `paths`
(where the socket lives), `wire` (frames, requests, replies, the argument schema),
`ops` (the ops, one class each, and `OPS`), `fds` (descriptors beside frames), `calls` (validated calls
and their queue to the owning thread), `server`, `client`, and `outcome_record`
(the records `collect` carries, both halves). This package re-exports the names
callers use, so ``from fleet.service.control import X`` keeps working.
"""
from __future__ import annotations

from fleet.rules.errors import NotRunning

# The fleet-name rule lives in fleet.rules.names (one rule for config, segments and
# sockets); both names stay importable from here.
from fleet.rules.names import InvalidFleetName, validate_fleet_name
from fleet.service.control.calls import SIDE_MIN_BYTES, Call, CallQueue, Peer, inline_dispatch, with_blocking_ops
from fleet.service.control.client import ControlClient
from fleet.service.control.errors import (
    E_BUSY,
    E_INTERNAL,
    E_INVALID,
    E_INVALID_ARGS,
    E_INVALID_REPLY,
    E_MALFORMED,
    E_OUTCOME_UNKNOWN,
    E_PERMISSION,
    E_SHUTTING_DOWN,
    E_TIMEOUT,
    E_TOO_LARGE,
    E_UNKNOWN_OP,
    ControlBusy,
    ControlError,
    ControlTimeout,
    FleetConnectionLost,
    OutcomesDropped,
    PermissionDenied,
    ProtocolError,
    RemoteError,
    ReplyLost,
    ShuttingDown,
    SubmitUncertain,
)
from fleet.service.control.ops import COLLECT_MAX_WAIT_S, COLLECT_REPLY_BUDGET, OPS, POSTURE_KEYS, Op, OpRegistry
from fleet.service.control.paths import find_socket, prepare_runtime_dir, runtime_dir, socket_candidates, socket_path
from fleet.service.control.server import FRAME_TIMEOUT_S, WRITE_TIMEOUT_S, ControlServer, Stream, _PressureLog, log
from fleet.service.control.wire import (
    MAX_FRAME,
    Arg,
    Push,
    Reply,
    Request,
    check_args,
    decode_reply,
    decode_request,
    decode_stream,
    encode_error,
    encode_push,
    encode_reply,
    encode_request,
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
    "Push",
    "RemoteError",
    "Reply",
    "ReplyLost",
    "Request",
    "ShuttingDown",
    "Stream",
    "SubmitUncertain",
    "decode_reply",
    "decode_request",
    "decode_stream",
    "encode_error",
    "encode_push",
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
    "SIDE_MIN_BYTES",
]
