"""A submit, on the loop: accepted into the books and sent on its way.

A posted submit (`fleet.runtime.submit`) is counted in the ledger here, on the loop
thread, and goes through the loop's gates (`fleet.runtime.gates`: the provider
admission for a unit with a route, the host-group lease for a unit of a gated role),
then to the dispatcher's queue. A unit the loop takes
after the fleet closed, or after its role stopped, is counted and fails as the units
queued at that moment did: the caller holds its future, so it is never an orphan.

One owner: the loop thread.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fleet.rules.unit import BadUnit
from fleet.rules.vocab import Reason
from fleet.runtime.future import UnitFuture

if TYPE_CHECKING:
    from fleet.runtime.submit import LoopUnit


def accept(sup, unit: LoopUnit, arrival: tuple | None) -> None:
    """A posted submit: into the ledger and on its way (the gates, then the queue).
    `arrival`: what the arrival log records, when [record] is on."""
    code, unit_id = unit.role, unit.unit_id
    late = _late_failure(sup, code)
    if late is not None:
        # The fleet closed, or the role stopped, after the caller's check: the caller
        # holds the unit's future, so the unit is counted and fails as the units
        # queued at that moment did (Shutdown, RoleStopped); never an orphan future.
        sup._units[unit_id] = unit
        sup.ledger.submitted(unit_id, unit.items)
        sup._fail_unstarted(unit_id, *late)
        return
    try:
        passed = (unit.route is None and code in sup._open_roles) or sup._through(unit)
    except BadUnit as exc:  # the catalog changed since the caller's check (a reload)
        fail_future(unit.future, exc)
        sup._room.give(code)
        return
    sup._units[unit_id] = unit
    sup._accepted = True
    sup.ledger.submitted(unit_id, unit.items)
    if sup.recorder is not None:
        sup.recorder.arrival(*arrival)
    if passed:
        sup.dispatcher.enqueue(unit)


def _late_failure(sup, code: int) -> tuple[str, str] | None:
    """(reason, detail) for a unit of role `code` accepted after the fleet closed or
    the role stopped; None while it may be queued."""
    if sup._closing:
        return Reason.SHUTDOWN, "the fleet closed before the unit was queued"
    if code in sup.role_stops:
        return Reason.ROLE_STOPPED, sup.role_stops.reasons.get(
            code, f"role {sup.roles.by_code(code).name} exceeded its restart intensity")
    return None


def accept_many(sup, units: list, arrivals: list | None) -> None:
    """A posted `submit_many` run (units of one role, no route): each unit accepted
    as a single submit is. While the fleet is open, the role runs and its units pass
    every gate at once (what `accept` checks per unit), the run goes on in bulk: one
    ledger lock, one queue push loop."""
    if not units or sup._closing or units[0].role in sup.role_stops or units[0].role not in sup._open_roles:
        for i, unit in enumerate(units):
            accept(sup, unit, None if arrivals is None else arrivals[i])
        return
    held = sup._units
    for unit in units:
        held[unit.unit_id] = unit
    sup._accepted = True
    sup.ledger.submitted_many([unit.unit_id for unit in units], [unit.items for unit in units])
    if sup.recorder is not None and arrivals is not None:
        for arrival in arrivals:
            sup.recorder.arrival(*arrival)
    sup.dispatcher.enqueue_many(units)


def fail_future(future: UnitFuture, error: BaseException) -> None:
    """Fail a future nobody resolved yet (a caller may have cancelled it meanwhile)."""
    if future.claim():
        future.settle(None, error, True)
