"""Run time limits: when each running unit times out, and the workers killed for it.

A unit with a timeout is armed when its worker says it STARTED (`arm`); the loop looks
at the earliest deadline each turn (`check`) and kills the worker of a unit past its
limit. The death that follows fails that unit Timeout (fleet.runtime.deaths reads
`timed_out`), and the other units of its seat die of it. A refused unit runs again
under a new deadline: an entry of a run before the current one is skipped.

One owner: the loop thread.
"""
from __future__ import annotations

import heapq
import logging

log = logging.getLogger(__name__)

#: How soon a deadline is looked at again when its worker is being (re)started.
RETRY_S = 0.01


class Deadlines:
    """A heap of (deadline, unit id), and the units whose worker was killed for theirs.
    It looks up units in the books, their slots in the dispatcher and their workers in
    the seats."""

    def __init__(self, name: str, books, dispatcher, seats):
        self._name, self._books, self._dispatcher, self._seats = name, books, dispatcher, seats
        self._heap: list = []
        #: armed() -> how many run time limits are armed, with no Python frame (the loop asks every turn)
        self.armed = self._heap.__len__
        self._timed_out: set[int] = set()

    def arm(self, unit, now: float) -> None:
        """`unit` started now: it times out `unit.timeout` seconds from here."""
        unit.due = now + unit.timeout
        heapq.heappush(self._heap, (unit.due, unit.unit_id))

    def timed_out(self, unit_id: int) -> bool:
        """Whether `unit_id`'s worker was killed because the unit ran past its deadline."""
        return unit_id in self._timed_out

    def forget(self, unit_id: int) -> None:
        """`unit_id`'s death was judged (fleet.runtime.deaths): its timeout is told no more."""
        self._timed_out.discard(unit_id)

    def check(self, now: float) -> None:
        """Kill the worker of every unit past its deadline."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, unit_id = heapq.heappop(heap)
            unit = self._books.get(unit_id)
            slot = self._dispatcher.slot_of(unit_id)
            if slot is None or unit is None or unit.due != due:
                continue  # already ended, or the deadline of a run before this one (a refused unit's)
            pid = self._seats.pid_of_slot(slot)
            if pid is None:
                # Its worker is being (re)started: look again shortly.
                unit.due = now + RETRY_S
                heapq.heappush(heap, (unit.due, unit_id))
                return
            self._timed_out.add(unit_id)
            log.warning("fleet %s: unit %d ran past its timeout; killing worker pid %d", self._name, unit_id, pid)
            self._seats.kill(pid)
