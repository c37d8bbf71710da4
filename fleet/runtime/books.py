"""The unit books: each unit's record from its accept to its outcome, and the one place
an outcome is recorded.

A unit the loop accepts is entered here (`enter`: its record, and the ledger's count)
and leaves exactly once, through `close` (its outcome), `forget` (cancelled before it
ran) or `fail_unstarted`. Every end is told to the gates (`Gates.ended`), which may take
a refused unit back instead: then it has no outcome yet, and the ledger sees the one it
ends with. The futures of the outcomes decided during a turn resolve at its end
(`deliver`), on the loop thread. A unit a gate stopped (its host-group lease ended) is
marked here (`stop`): it fails with the gate's reason at its grant, or at its seat's death.
Each unit's times are told to the watch (`fleet.runtime.spans`) when [metrics] asks for
makespans or spans: at its entry and at its outcome, here, where every unit enters and ends.

One owner: the loop thread. Other threads read only the ledger (thread-safe itself).
"""
from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING

from fleet.rules.outcomes import FAILED, SOLVED
from fleet.rules.raised import unit_exception
from fleet.rules.unit import Outcome
from fleet.rules.vocab import Reason
from fleet.runtime.future import HANDOVER, SETTLED

if TYPE_CHECKING:
    from fleet.runtime.submit import LoopUnit

log = logging.getLogger(__name__)

#: Stray messages logged one by one; past this many a fleet counts them only.
STRAYS_LOGGED = 10

_CANCELLED = Outcome(FAILED, Reason.CANCELLED)
_SOLVED = Outcome(SOLVED)
#: Outcomes other than solved kept for `fleetctl why` (`ended`); a solved unit is told by
#: not being among them (see `ended`), so the solved path stores nothing.
ENDS_KEPT = 4096


class Books:
    """The units owed an outcome, the outcomes to deliver, and the ledger's entries."""

    def __init__(self, name: str, roles, ledger, room, gates):
        self.ledger = ledger  # thread-safe itself: any thread may read its counts
        self._name, self._roles, self._room, self._gates = name, roles, room, gates
        self._units: dict[int, LoopUnit] = {}
        #: get(unit_id) -> the unit owed, or None: the dict's own get (called several times
        #: per unit on the loop; `_units` is never replaced)
        self.get = self._units.get
        #: count() -> units owed an outcome: `len(books)` with no Python frame (the loop asks it every turn)
        self.count = self._units.__len__
        self._done: list = []  # (future, value, error) decided this turn, delivered at its end
        self._stops: dict[int, tuple[str, str]] = {}  # unit id -> (reason, detail): a gate stopped it
        self.watch = None  # the UnitWatch (fleet.runtime.spans) when makespans or spans are on
        #: the last ENDS_KEPT outcomes that were not solved, and the highest unit id let go of
        #: (an ended unit above it that is not kept here was solved)
        self._ends: collections.OrderedDict = collections.OrderedDict()
        self._ends_dropped = 0
        #: ``on_end(unit_id, outcome)``: told of every end (fleet.runtime.inside: a parent's
        #: children) but a slice's plain solved ones, which ``on_solved(unit_ids)`` hears
        #: in one call (`close_solved`)
        self.on_end = None
        self.on_solved = None
        #: ``on_delivered()``: called at the end of every `deliver`, on the loop, after the
        #: futures' callbacks (fleetd: the outcomes they held for clients go out in one write
        #: per client from here, with no other thread woken for it)
        self.on_delivered = None

    def __len__(self) -> int:
        """Units owed an outcome."""
        return len(self._units)

    def __contains__(self, unit_id: int) -> bool:
        return unit_id in self._units

    def owed(self):
        """The units owed an outcome, in the order they were accepted (an operator's look)."""
        return iter(self._units.values())

    def ended(self, unit_id: int) -> Outcome | None:
        """The outcome of a unit that left the books: kept when it was not solved; a solved
        one (not kept) is told apart from one let go of by the ids (None: not known any more).
        Ask only of a unit this fleet issued and that is not on the books."""
        outcome = self._ends.get(unit_id)
        if outcome is not None:
            return outcome
        return _SOLVED if unit_id > self._ends_dropped else None

    def _keep_end(self, unit_id: int, outcome: Outcome) -> None:
        ends = self._ends
        ends[unit_id] = outcome
        if len(ends) > ENDS_KEPT:
            dropped, _ = ends.popitem(last=False)
            self._ends_dropped = max(self._ends_dropped, dropped)

    # ------------------------------------------------------------------ in
    def enter(self, unit: LoopUnit) -> None:
        """A unit accepted: on the books, counted submitted."""
        self._units[unit.unit_id] = unit
        self.ledger.submitted(unit.unit_id, unit.items)
        if self.watch is not None:
            self.watch.entered(unit.unit_id)

    def enter_many(self, units: list) -> None:
        """A run of accepted units: on the books, counted under one ledger lock."""
        held = self._units
        for unit in units:
            held[unit.unit_id] = unit
        ids = [unit.unit_id for unit in units]
        self.ledger.submitted_many(ids, [unit.items for unit in units])
        if self.watch is not None:
            self.watch.entered_many(ids)

    # ------------------------------------------------------------------ at a grant
    def skip_at_grant(self, unit_id: int) -> bool:
        """Called as a unit comes up for a grant (the dispatcher's `skip`): True if its
        caller cancelled it, or a gate stopped it while it waited; otherwise its future
        is marked running (from here on it cannot be cancelled)."""
        if self._stops and unit_id in self._stops:
            return True
        return not self._units[unit_id].future.claim()

    def skipped(self, unit_id: int) -> None:
        """A unit the dispatcher skipped at its grant: it fails with its gate's stop, or
        is recorded Cancelled (its caller cancelled it)."""
        stop = self._stops.get(unit_id)
        if stop is not None:
            self.close(unit_id, Outcome(FAILED, *stop))
        else:
            self.forget(unit_id)

    # ------------------------------------------------------------------ stops
    def stop(self, unit_id: int, reason: str, detail: str) -> bool:
        """A gate says `unit_id` may not run any more: it fails with `reason` at its
        grant, or when its seat dies. False when the unit is not on the books."""
        if unit_id not in self._units:
            return False
        self._stops[unit_id] = (reason, detail)
        return True

    def stopped(self, unit_id: int) -> tuple[str, str] | None:
        """(reason, detail) of a gate's stop of `unit_id`, or None."""
        return self._stops.get(unit_id)

    # ------------------------------------------------------------------ out: one outcome per unit
    def close(self, unit_id: int, outcome: Outcome, value=None, original=None, cost=None,
              solved: list | None = None, items: bool = False) -> None:
        """Record an outcome; its future resolves at the end of this turn. `solved`: a
        slice's list of solved units, which its caller ledgers in one call (`solved_many`).
        `items`: a chunk's items, which travel with it whatever its outcome (map raises
        item by item). Every unit's end comes here, so every gate hears of it."""
        unit = self._units.get(unit_id)
        if unit is not None and self._told_gates(unit, outcome, original, cost):
            return  # a gate took it back: no outcome yet (the ledger sees the one it ends with)
        unit = self._end(unit_id)
        if self.on_end is not None:
            self.on_end(unit_id, outcome)
        if solved is not None and outcome.kind == SOLVED:
            solved.append(unit_id)
        else:
            self.ledger.record(unit_id, outcome.kind, outcome.reason)
            if outcome.kind != SOLVED:
                self._keep_end(unit_id, outcome)
        if unit is None:
            return
        if self.watch is not None:
            self.watch.ended(unit, outcome)
        if outcome.kind == SOLVED or (items and value is not None):
            self._done.append((unit.future, value, None))
        else:
            role = self._roles.by_code(unit.role).name
            self._done.append((unit.future, None, unit_exception(unit_id, role, outcome, original)))

    def close_solved(self, ended: list, solved: list) -> None:
        """Plain units that solved (`LoopUnit.plain`: no gate saw them), ``[(unit, value,
        ...), ...]``: the outcome `close` records for each, in one call; their ids onto
        `solved`, which the caller ledgers in one call. The caller checked that no watch is
        on and no gate stopped any unit (`plain_ends`)."""
        held, done, room = self._units, self._done, self._room
        first = len(solved)
        for unit, value, _run_s in ended:
            unit_id = unit.unit_id
            del held[unit_id]
            if unit.queued:  # never, for a unit that ran; `_end`'s rule all the same
                unit.queued = False
                room.give(unit.role)
            solved.append(unit_id)
            done.append((unit.future, value, None))
        if self.on_solved is not None:
            self.on_solved(solved[first:])

    @property
    def plain_ends(self) -> bool:
        """Whether a plain unit's solved end may take `close_solved`: no watch to tell and
        no gate's stop pending (a stop of a unit makes it end through `close`)."""
        return self.watch is None and not self._stops

    def solved_many(self, unit_ids: list) -> None:
        """The ledger's entries of a slice's solved units (`close` with `solved`), in one call."""
        self.ledger.solved_many(unit_ids)

    def fail_unstarted(self, unit_id: int, reason: str, detail: str) -> None:
        """A unit that never ran fails with `reason` (its future is claimed first: a
        cancel that raced it has no say any more)."""
        self._units[unit_id].future.claim()
        self.close(unit_id, Outcome(FAILED, reason, detail))

    def forget(self, unit_id: int, cancel_future: bool = False) -> None:
        """A unit cancelled before it ran: recorded Cancelled (its future is cancelled
        already, or here when `cancel_future`)."""
        unit = self._units.get(unit_id)
        if unit is not None:
            self._told_gates(unit, _CANCELLED)  # a cancel is never taken back
        unit = self._end(unit_id)
        if self.on_end is not None:
            self.on_end(unit_id, _CANCELLED)
        if unit is not None and self.watch is not None:
            self.watch.ended(unit, _CANCELLED)
        if unit is not None and cancel_future:
            unit.future.cancel()
        self.ledger.record(unit_id, FAILED, Reason.CANCELLED)
        self._keep_end(unit_id, _CANCELLED)

    def cancel(self, unit_id: int) -> bool:
        """Cancel a queued unit's future (shutdown's cancel_futures): recorded Cancelled.
        False when its future runs already (it came back unrun from a dead seat): it stays."""
        if not self._units[unit_id].future.cancel():
            return False
        self.forget(unit_id)
        return True

    def fsm_refused(self, what: str) -> None:
        """The slot FSM refused the runtime a transition: a bug in a rule, logged and counted
        apart from worker deaths (status shows the count)."""
        log.error("fleet %s: slot FSM refused a transition: %s", self._name, what)
        self.ledger.fsm_refused()

    def stray(self, seat: str, what: str) -> None:
        """Seat `seat` sent `what`, which is no owed unit's outcome (`fleet.runtime.results`):
        counted, logged (the first STRAYS_LOGGED), never recorded."""
        n = self.ledger.stray_result()
        if n <= STRAYS_LOGGED:
            more = "; further ones are counted, not logged" if n == STRAYS_LOGGED else ""
            log.warning("fleet %s: seat %s sent %s: dropped (stray message %d, a unit's own doing%s)",
                        self._name, seat, what, n, more)

    def deliver(self) -> bool:
        """Resolve the futures decided this turn (their callbacks run here, on the loop);
        True if there were any. Then the spans of the units that ended (when on): after
        the futures, so no caller waits for its unit's span."""
        delivered = bool(self._done)
        while self._done:
            done, self._done = self._done, []
            for future, value, error in done:
                future.settle(value, error, error is not None)  # refused (no-op) when cancelled meanwhile
        if delivered:
            HANDOVER.loop_holds()  # the loop's next wait lets go of the GIL and says so
            SETTLED.bump()  # callers watching for their result take it now (fleet.runtime.future)
        if self.watch is not None:
            self.watch.flush()
        if self.on_delivered is not None:
            self.on_delivered()
        return delivered

    # ------------------------------------------------------------------ inside
    def _end(self, unit_id: int) -> LoopUnit | None:
        """The one place a unit leaves the books: its room in the queue goes back if it
        never got a slot."""
        unit = self._units.pop(unit_id, None)
        if unit is not None and unit.queued:
            unit.queued = False
            self._room.give(unit.role)
        return unit

    def _told_gates(self, unit: LoopUnit, outcome: Outcome, original=None, cost=None) -> bool:
        """Tell the gates of `unit`'s end (each hears of it once: the unit leaves the books
        next); True if one took it back instead."""
        if self._stops:
            self._stops.pop(unit.unit_id, None)
        return self._gates.ended(unit, outcome, original, cost)
