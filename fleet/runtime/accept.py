"""A submit, on the loop: accepted into the books and sent on its way.

A posted submit (`fleet.runtime.submit`) is counted in the ledger here, on the loop
thread, and goes through the loop's gates (`fleet.runtime.gates`: the provider
admission for a unit with a route, the host-group lease for a unit of a gated role),
then to the dispatcher's queue. A unit the loop takes after the fleet closed, or after
its role stopped, is counted and fails as the units queued at that moment did: the
caller holds its future, so it is never an orphan.

One owner: the loop thread.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fleet.rules.unit import BadUnit
from fleet.rules.vocab import Reason
from fleet.runtime.future import UnitFuture

if TYPE_CHECKING:
    from fleet.runtime.submit import LoopUnit


class Acceptor:
    """Takes posted submits into the books and on to the gates and the dispatcher; says
    whether any came since the loop last dispatched (`take_news`).

    Two paths, one outcome. A unit that passes every gate at once (`Gates.open_to`: no
    route, a role no gate holds) is *plain* (`LoopUnit.plain`): no gate ever sees it, so
    its start and its solved end skip the gates (fleet.runtime.loop, .results). A run of
    posted plain submits, while their role runs and the fleet is open, is taken in bulk
    (`accept_run`: one ledger call, its queue pushes in one loop); every other unit takes
    `accept`, one by one. `batched` counts the units the bulk path took."""

    def __init__(self, door, books, gates, dispatcher, roles, recorder=None):
        self._door, self._books, self._gates, self._dispatcher = door, books, gates, dispatcher
        self._roles, self._recorder = roles, recorder
        self._accepted = False  # units accepted since the last dispatch
        self.batched = 0  # units accepted through the bulk path (plain ones)

    def take_news(self) -> bool:
        """True if units were accepted since the last call (the loop dispatches them)."""
        accepted, self._accepted = self._accepted, False
        return accepted

    def accept(self, unit: LoopUnit, arrival: tuple | None) -> None:
        """A posted submit: into the ledger and on its way (the gates, then the queue).
        `arrival`: what the arrival log records, when [record] is on."""
        code = unit.role
        late = self._late_failure(code, child=bool(unit.parent))
        if late is not None:
            # The fleet closed, or the role stopped, after the caller's check: the caller
            # holds the unit's future, so the unit is counted and fails as the units
            # queued at that moment did (Shutdown, RoleStopped); never an orphan future.
            self._books.enter(unit)
            self._books.fail_unstarted(unit.unit_id, *late)
            return
        try:
            unit.plain = self._gates.open_to(unit)
            passed = unit.plain or self._gates.through(unit)
        except BadUnit as exc:  # the catalog changed since the caller's check (a reload)
            fail_future(unit.future, exc)
            self._door.room.give(code)
            return
        self._books.enter(unit)
        self._accepted = True
        if self._recorder is not None:
            self._recorder.arrival(*arrival)
        if passed:
            self._dispatcher.enqueue(unit)

    def accept_run(self, posted: list) -> None:
        """A run of posted single submits, ``[(unit, arrival), ...]`` in post order (the
        intake's `take_runs`): each accepted as `accept` would, in order; the plain ones
        (see the class doc) in bulk, between the others."""
        door, open_to = self._door, self._gates.open_to
        stops = door.role_stops.view
        if door.closing or self._recorder is not None:
            for unit, arrival in posted:
                self.accept(unit, arrival)
            return
        plain: list = []
        handed = 0  # posted[:handed] went to the books (or to `accept`)
        try:
            for i, (unit, arrival) in enumerate(posted):
                if not unit.parent and unit.role not in stops and open_to(unit):
                    plain.append(unit)
                    continue
                handed = i + 1  # the plain ones before it, and it: an error in `accept` loses no other
                if plain:
                    self._enter_plain(plain)
                    plain = []
                self.accept(unit, arrival)
            handed = len(posted)
            if plain:
                self._enter_plain(plain)
        except BaseException:
            del posted[:handed]  # the rest go back to the intake (Intake.take_runs)
            raise

    def _enter_plain(self, units: list) -> None:
        """Plain units of callers (checked by the caller: no parent, whose children queue
        apart) into the books, counted in one ledger call, and onto their queues in order,
        each run of one role in one call."""
        for unit in units:
            unit.plain = True
        self._books.enter_many(units)
        self._accepted = True
        self.batched += len(units)
        enqueue_many, start, code = self._dispatcher.enqueue_many, 0, units[0].role
        for i, unit in enumerate(units):
            if unit.role != code:
                enqueue_many(units[start:i])
                start, code = i, unit.role
        enqueue_many(units[start:] if start else units)

    def accept_many(self, units: list, arrivals: list | None) -> None:
        """A posted `submit_many` run (units of one role, no route): each unit accepted
        as a single submit is. While the fleet is open, the role runs and its units pass
        every gate at once (what `accept` checks per unit), the run goes on in bulk: one
        ledger lock, one queue push loop."""
        door = self._door
        if (not units or door.closing or units[0].role in door.role_stops
                or not self._gates.lets_role_through(units[0].role)):
            for i, unit in enumerate(units):
                self.accept(unit, None if arrivals is None else arrivals[i])
            return
        for unit in units:
            unit.plain = not unit.route  # every gate let the role through: one without a route is plain
        self._books.enter_many(units)
        self._accepted = True
        self.batched += len(units)
        if self._recorder is not None and arrivals is not None:
            for arrival in arrivals:
                self._recorder.arrival(*arrival)
        self._dispatcher.enqueue_many(units)

    def _late_failure(self, code: int, child: bool = False) -> tuple[str, str] | None:
        """(reason, detail) for a unit of role `code` accepted after the fleet closed or
        the role stopped; None while it may be queued. A `child` of a running unit is
        part of work the fleet owes already: a closing fleet (shutdown waits for it) takes it."""
        door = self._door
        if door.closing and not child:
            return Reason.SHUTDOWN, "the fleet closed before the unit was queued"
        if code in door.role_stops:
            return Reason.ROLE_STOPPED, door.role_stops.reasons.get(
                code, f"role {self._roles.by_code(code).name} exceeded its restart intensity")
        return None


def fail_future(future: UnitFuture, error: BaseException) -> None:
    """Fail a future nobody resolved yet (a caller may have cancelled it meanwhile)."""
    if future.claim():
        future.settle(None, error, True)
