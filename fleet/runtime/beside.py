"""The bytes a fleet's payloads hold beside its rings: counted against `limits.max_parcel_bytes`.

A payload too large for its ring is written into a parcel (`fleet.shm.parcels`) at submit,
and its bytes stay in memory (/dev/shm is memory) until the unit's outcome removes it. A
caller submitting faster than the workers consume would otherwise hold every payload it
ever submitted there at once. So a submit takes room for its parcel's bytes first, waiting
while the fleet's payloads in flight would pass the cap (backpressure, as a full queue
makes it wait), and the unit's outcome gives the room back. A single payload larger than
the cap can never fit: it is refused at once, its size and the key named.

Results are not counted here: a worker writes at most the result of the unit it runs, and
the supervisor takes each parcel as it reads its message (the object built over it is the
caller's own memory from then on).

One owner: this object, behind its own lock (any thread submits; the loop gives back).
"""
from __future__ import annotations

import os
import threading
import time

from fleet.rules.unit import PayloadTooLarge, QueueFull

#: The cap when none is configured: this share of the host's physical memory.
DEFAULT_SHARE = 4


def default_cap() -> int:
    """A quarter of physical memory."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // DEFAULT_SHARE


class Beside:
    """Room for payload bytes beside the rings, up to `cap` (``key``: how the cap is set,
    for the refusals: ``limits.max_parcel_bytes``, or an Executor's keyword)."""

    def __init__(self, cap: int | None, key: str = "limits.max_parcel_bytes"):
        self.cap = default_cap() if cap is None else int(cap)
        self.key = key
        self.held = 0  # bytes of parcels made and not yet removed
        self._cond = threading.Condition(threading.Lock())

    def take(self, n: int, what: str, *, block: bool = True, timeout: float | None = None) -> None:
        """Room for `n` bytes, waiting while the cap is reached (at most `timeout` s; not at all
        unless `block`). Raises PayloadTooLarge (`n` alone is over the cap) or QueueFull (no
        room in time)."""
        if n > self.cap:
            raise PayloadTooLarge(f"{what} is {n} bytes pickled, beside the ring; {self.key} is {self.cap}")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self.held + n > self.cap:
                left = None if deadline is None else deadline - time.monotonic()
                if not block or (left is not None and left <= 0):
                    raise QueueFull(f"{what}: {self.held} bytes of payloads are in flight beside the rings, and "
                                    f"{n} more would pass {self.key} ({self.cap})")
                self._cond.wait(left)
            self.held += n

    def give(self, n: int) -> None:
        """Room for `n` bytes back (a parcel removed)."""
        with self._cond:
            self.held -= n
            self._cond.notify_all()
