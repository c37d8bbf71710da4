"""Service-mode submits made at most once per ``request_id``.

A client that sent a submit and never got its reply (no reply in time from a stalled
daemon, a connection that broke) cannot tell whether the unit was admitted. It submits
again with the same ``request_id``: while fleetd remembers the id, the second submit is
answered with the first one's unit (the caller collects that unit's outcome), never with
a second run. Exact replay only: the id given with another role, payload, key, lane,
chunk flag or route is refused (`RequestIdReused`), failing closed as the host-group
store does with a reused request id.

fleetd remembers an id while its unit is owed and for `REPLAY_TTL_S` after it ended
(at most `REPLAY_MAX_ENDED` ended ones, the oldest forgotten first); a retry later
than that is a new unit. The clock is injected.
"""
from __future__ import annotations

import collections
import hashlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from fleet.rules.unit import SubmitRefused

#: How long after its unit ended a request id is still known: as long as fleetd holds
#: an uncollected outcome for a client (OutcomeStore's ttl).
REPLAY_TTL_S = 300.0
#: Most ended units whose request ids are kept.
REPLAY_MAX_ENDED = 65_536


class RequestIdReused(SubmitRefused):
    """A request_id given again for a different unit: refused, nothing queued."""


def identity(role: str, payload, key, lane, chunk: bool, route) -> tuple:
    """What makes two submits the same unit: role, payload (its bytes, or its JSON), key,
    lane, chunk flag and route."""
    raw = payload if isinstance(payload, (bytes, memoryview)) else repr(payload).encode()
    return role, hashlib.sha256(raw).hexdigest(), key, lane, chunk, None if route is None else str(route)


class Replays:
    """Request id -> the unit first admitted under it. Lookups and admissions come from
    fleetd's loop, ends from the supervisor's thread: one lock."""

    def __init__(self, *, ttl_s: float = REPLAY_TTL_S, max_ended: int = REPLAY_MAX_ENDED,
                 clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.max_ended, self._clock = ttl_s, max_ended, clock
        self._lock = threading.Lock()
        self._units: dict[str, tuple[tuple, Future]] = {}
        self._ended: collections.deque[tuple[float, str, Future]] = collections.deque()

    def find(self, request_id: str, same: tuple) -> Future | None:
        """The future of the unit admitted under `request_id`, or None if there is none
        (or it is forgotten). RequestIdReused if that unit is not `same`."""
        with self._lock:
            self._forget_old()
            known = self._units.get(request_id)
        if known is None:
            return None
        if known[0] != same:
            raise RequestIdReused(f"request_id {request_id!r} was given to unit {known[1].unit_id} "
                                  f"(role {known[0][0]!r}) with other arguments; a retry must repeat the "
                                  "submit exactly, a new unit needs a new request_id")
        return known[1]

    def admitted(self, request_id: str, same: tuple, future: Future) -> None:
        """`future`'s unit was admitted under `request_id`."""
        with self._lock:
            self._units[request_id] = (same, future)
        future.add_done_callback(lambda f: self._ended_now(request_id, f))

    def __len__(self) -> int:
        with self._lock:
            return len(self._units)

    def _ended_now(self, request_id: str, future: Future) -> None:
        with self._lock:
            self._ended.append((self._clock(), request_id, future))
            self._forget_old()

    def _forget_old(self) -> None:
        """(lock held) Forget the ends past the ttl, and the oldest past the bound."""
        horizon = self._clock() - self.ttl_s
        ended = self._ended
        while ended and (ended[0][0] < horizon or len(ended) > self.max_ended):
            _at, request_id, future = ended.popleft()
            known = self._units.get(request_id)
            if known is not None and known[1] is future:
                del self._units[request_id]
