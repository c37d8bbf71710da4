"""A submit, on the loop: accepted into the books and sent on its way.

A posted submit (`fleet.runtime.submit`) is counted in the ledger here, on the loop
thread, and goes on to the provider admission (a unit with a route), to its host-group
lease (a unit of a gated role), then to the dispatcher's queue. A unit the loop takes
after the fleet closed, or after its role stopped, is counted and fails as the units
queued at that moment did: the caller holds its future, so it is never an orphan.

One owner: the loop thread.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fleet.rules.dispatch import Pending
from fleet.rules.unit import BadUnit
from fleet.rules.vocab import Reason
from fleet.runtime import codec
from fleet.runtime.future import UnitFuture
from fleet.shm import messages as M

if TYPE_CHECKING:
    from fleet.runtime.submit import LoopUnit


def accept(sup, unit: LoopUnit, route, admission: dict | None, arrival: tuple | None) -> None:
    """A posted submit: into the ledger and on its way (provider gate, lease, queue).
    `admission`: lane, severity, pinned, parent, tag (a unit with a route); `arrival`:
    what the arrival log records, when [record] is on."""
    code, unit_id = unit.role, unit.unit_id
    late = _late_failure(sup, code)
    if late is not None:
        # The fleet closed, or the role stopped, after the caller's check: the caller
        # holds the unit's future, so the unit is counted and fails as the units
        # queued at that moment did (Shutdown, RoleStopped); never an orphan future.
        sup._units[unit_id] = unit
        sup.ledger.submitted(unit_id)
        sup._fail_unstarted(unit_id, *late)
        return
    refusal = decision = None
    parent = None if admission is None else admission["parent"]
    if parent is not None and sup.dispatcher.slot_of(parent) is None:
        # 000 §9 licenses a delegated unit only for a parent holding a seat here. The
        # caller's check found it owed; one still queued, or ended since, delegates
        # nothing: its child is admitted as any unit is (never an orphan future).
        admission = {**admission, "parent": None}
    if route is not None:
        try:
            decision = sup._providers.admit(unit_id, unit, route, **admission)
        except BadUnit as exc:  # the catalog changed since the caller's check (a reload)
            refusal = exc
    if refusal is not None:
        fail_future(unit.future, refusal)
        sup._room.give(code)
        return
    sup._units[unit_id] = unit
    sup._accepted = True
    sup.ledger.submitted(unit_id)
    if sup.recorder is not None:
        sup.recorder.arrival(*arrival)
    if decision is not None and not decision.starts:
        sup._providers.watch(unit_id, unit.future)  # waits in the provider gate
        return
    if decision is not None:
        routed(sup, unit_id, decision.route)
    to_dispatch(sup, unit)


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
    as a single submit is. While the fleet is open, the role runs and takes no lease
    (what `accept` checks per unit), the run goes on in bulk: one ledger lock, one
    queue push loop."""
    if not units or sup._closing or units[0].role in sup.role_stops or gated(sup, units[0].role):
        for i, unit in enumerate(units):
            accept(sup, unit, None, None, None if arrivals is None else arrivals[i])
        return
    held = sup._units
    for unit in units:
        held[unit.unit_id] = unit
    sup._accepted = True
    sup.ledger.submitted_many([unit.unit_id for unit in units])
    if sup.recorder is not None and arrivals is not None:
        for arrival in arrivals:
            sup.recorder.arrival(*arrival)
    sup.dispatcher.enqueue_many(units)


def to_dispatch(sup, pending: Pending) -> None:
    """A unit past the provider admission goes to the dispatcher, or first waits for its
    host-group lease when its role is gated."""
    if gated(sup, pending.role):
        # queued for dispatch only once the host-group store grants it a lease
        sup._held[pending.unit_id] = pending
        sup._gate.hold(pending.unit_id, sup.roles.by_code(pending.role).name)
    else:
        sup.dispatcher.enqueue(pending)


def gated(sup, code: int) -> bool:
    """Whether units of role `code` wait for a host-group lease before dispatch."""
    return sup._gate is not None and sup._gate.gates(sup.roles.by_code(code).name)


def routed(sup, unit_id: int, route) -> None:
    """The route admission chose travels with the unit's task: the handler's `unit.route`."""
    unit = sup._units[unit_id]
    body = codec.split_route(unit.body)[1] if unit.flags & M.F_ROUTED else unit.body  # a refused unit's last route
    unit.body = codec.with_route(body, route)
    unit.flags |= M.F_ROUTED


def fail_future(future: UnitFuture, error: BaseException) -> None:
    """Fail a future nobody resolved yet (a caller may have cancelled it meanwhile)."""
    if future.claim():
        future.settle(None, error, True)
