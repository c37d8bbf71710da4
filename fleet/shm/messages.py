"""The data plane's message formats (pure).

Every ring message carries a tag (its kind) and a fixed little-endian header,
followed by a pickled body. Bodies are pickled once, where they are made: a
payload at submit (so an unpicklable payload is refused there), a result in the
worker. A body too large for its ring names the parcel it travels in beside the ring
instead (fleet.worker.codec.pack, fleet.shm.parcels).
"""
from __future__ import annotations

import struct

# --- tags ---------------------------------------------------------------------------
TASK = 1  # supervisor -> worker: run a unit
RESULT = 2  # worker -> supervisor: a unit's outcome
STARTED = 3  # worker -> supervisor: a unit with a timeout began running
RECYCLING = 4  # worker -> supervisor: after its last result, it exits to be replaced (max_rss_mib)
CHILD = 5  # worker -> supervisor: a running unit submits a child unit (fleet.current_fleet())
CHILD_DONE = 6  # supervisor -> worker: a child's outcome, for the future its parent holds

# --- task flags ---------------------------------------------------------------------
F_CHUNK = 1  # the body holds a list of payloads (Fleet.map with chunksize > 1)
F_TIMED = 2  # report STARTED, so the supervisor can time the unit
F_ROUTED = 4  # the body starts with the provider route admission chose (fleet.worker.codec.with_route)
F_CPU = 8  # measure the handler's CPU time: the arrival log records it ([record]); a read costs ~0.5 us

#: unit id, slot, key id, role, start event, flags
TASK_HEAD = struct.Struct("<QIIHBB")

# --- result status ------------------------------------------------------------------
ST_SOLVED = 0
ST_SUPPRESSED = 1  # body: the reason, utf-8
ST_HANDLER_ERROR = 2  # body: pickled (traceback text, the exception pickled or None): fleet.worker.codec.error_parts
ST_RESULT_ERROR = 3  # body: utf-8 text: why the result could not be sent
ST_START_REFUSED = 4  # body: utf-8 text: the slot refused to start it (a fleet bug)
ST_CHUNK = 5  # body: pickled (values, {index: (status, reason | error_parts)} for items that did not solve); all solved
ST_COMPLETION_REFUSED = 6  # body: utf-8 text: the slot refused to end it (a fleet bug; its result is void)
ST_HELD_AT_CLOSE = 7  # body: utf-8 text: cordon held it back and the fleet is closing: it never ran
ST_REFUSED = 8  # body: pickled (status, message, retry_after): the handler raised fleet.Refused
# A chunk's status sums up its items, so nobody unpickles its values to learn its outcome
# (fleetd relays them unread). Body as ST_CHUNK.
ST_CHUNK_SUPPRESSED = 9  # some item was suppressed, none failed
ST_CHUNK_FAILED = 10  # some item failed (HandlerError)

#: unit id, slot, status, slot state after the unit, run seconds, cost in USD the handler
#: reported (fleet.report_cost; NaN when it reported none), CPU seconds of the thread that ran
#: the handler (NaN: not measured, an awaited handler shares its thread with others)
RESULT_HEAD = struct.Struct("<QIBBddd")
#: the parent's unit id, the child's id in its parent's worker, the child's role code, its flags
#: (F_CHUNK); then the pickled submit (fleet.worker.inside)
CHILD_HEAD = struct.Struct("<QQHB")
#: the child's id in its parent's worker, what its outcome is (fleet.worker.inside: DONE_*); then its body
CHILD_DONE_HEAD = struct.Struct("<QB")
#: unit id, slot
STARTED_HEAD = struct.Struct("<QI")
#: role code of the unit after which it looked, its resident bytes, the role's bound in bytes
RECYCLING_HEAD = struct.Struct("<HQQ")
