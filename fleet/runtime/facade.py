"""The operator's façade: what a running fleet's owner loop offers an operator.

`Operations` is the one shape every operator op runs against: the ops of the control
protocol (`fleet.service.control.ops`, each one class) call it, whether the fleet is
embedded (`fleet.Fleet.operations`) or served by fleetd (the daemon's handler, which
delegates to the same `LoopOperations` and adds what only the daemon knows).
`LoopOperations` is its implementation over a `Supervisor`: each method posts the op's
loop half (`fleet.runtime.operator`) to the supervisor's loop (DESIGN §8: the loop is
the one owner of the state), which runs it between turns and hands the answer back.

Arguments reach these methods already checked on their face (the op's schema and
`check`); the loop judges what only it can (a posture value, a pool, a budget) and
raises a typed FleetError that changes nothing.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from fleet.runtime import operator

#: What `Operations.cancel` says became of a unit (its reply's ``state``).
CANCELLED = "cancelled"  # it had not started: it never runs, its outcome is failed Cancelled
RUNNING = "running"  # it started: it runs to its own outcome
ENDED = "ended"  # it had its outcome already
UNKNOWN = "unknown"  # this fleet never handed out that unit id
CANCEL_STATES = (CANCELLED, RUNNING, ENDED, UNKNOWN)


@runtime_checkable
class Operations(Protocol):
    """The operator ops a fleet offers; every method returns JSON-serializable values."""

    def status(self) -> dict:
        """The fleet's status: plan, budget, census, posture, ledger counters, queues, admission."""

    def ledger(self) -> dict:
        """The ledger counters: submitted, solved, suppressed, failed by reason."""

    def posture_show(self) -> dict:
        """The posture: state, cause, dwell and the six thresholds."""

    def posture_set(self, patch: dict[str, Any]) -> dict:
        """Retune posture thresholds with a partial patch; PostureRetuneError changing nothing
        if a value is bad; returns the effective policy."""

    def posture_release(self, cause: str) -> dict:
        """Release a sticky posture cause; the posture view with ``released`` (was it held)."""

    def drain(self) -> dict:
        """Take nothing new from the queues; in-flight units finish. ``{"draining": True}``."""

    def resume(self) -> dict:
        """Take units from the queues again after a drain. ``{"draining": False}``."""

    def cancel(self, unit: int) -> dict:
        """Cancel unit ``unit`` if it has not started: ``{"unit", "cancelled", "state"}`` with
        ``state`` one of `CANCEL_STATES`."""

    def admission_show(self) -> dict:
        """The provider admission's read model (bulkheads, lanes, closures, starving, waits)."""

    def admission_close(self, pool: str, until: float, message: str) -> dict:
        """Close a provider or key until ``until`` (UTC epoch seconds); BadPool if unknown or past."""

    def admission_reopen(self, pool: str) -> dict:
        """Lift a provider's or key's closure; BadPool if the pool is unknown."""

    def admission_budget(self, provider: str, spent: float, limit: float | None) -> dict:
        """The provider's daily budget reading; BadBudget if refused."""

    def admission_allowance(self, lane: str | None) -> int | None:
        """The coordinator's allowance for ``lane``: None or 0."""

    def admission_plan(self, lane: str | None, route, wanted: int, pinned: bool) -> int:
        """How many of ``wanted`` units on ``route`` (a `fleet.Route`) would start now; BadPlan if refused."""

    def admission_starving(self) -> list:
        """The starving list: closed pools with work waiting, then hard pins waiting too long."""

    def reload(self, config) -> dict:
        """Apply what can change live of ``config`` (a FleetConfig): ``applied``, ``needs_restart``."""


class LoopOperations:
    """`Operations` over a `Supervisor`: each op's loop half (`fleet.runtime.operator`)
    posted to its loop."""

    def __init__(self, supervisor):
        self._sup = supervisor

    def _on_loop(self, op, *args, view: bool = False):
        return self._sup.call(op, self._sup, *args, view=view)

    def status(self) -> dict:
        from fleet.shm.status import gather

        doc = gather(self._sup.name)
        doc["admission"] = self.admission_show()
        return doc

    def ledger(self) -> dict:
        return self._sup.ledger_counts().to_dict()

    def posture_show(self) -> dict:
        return self._on_loop(operator.posture_show, view=True)

    def posture_set(self, patch: dict[str, Any]) -> dict:
        return self._on_loop(operator.posture_set, patch)

    def posture_release(self, cause: str) -> dict:
        return self._on_loop(operator.release, cause)

    def drain(self) -> dict:
        self._on_loop(operator.set_draining, True)
        return {"draining": True}

    def resume(self) -> dict:
        self._on_loop(operator.set_draining, False)
        return {"draining": False}

    def cancel(self, unit: int) -> dict:
        issued, future = self._sup.find_unit(unit)
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
        return {"unit": unit, "cancelled": state == CANCELLED, "state": state}

    def admission_show(self) -> dict:
        return self._on_loop(operator.admission_census, view=True)

    def admission_close(self, pool: str, until: float, message: str) -> dict:
        return self._on_loop(operator.admission_close, pool, until, message)

    def admission_reopen(self, pool: str) -> dict:
        return self._on_loop(operator.admission_reopen, pool)

    def admission_budget(self, provider: str, spent: float, limit: float | None) -> dict:
        return self._on_loop(operator.admission_budget, provider, spent, limit)

    def admission_allowance(self, lane: str | None) -> int | None:
        return self._on_loop(operator.admission_ask, lambda gate: gate.allowance(lane), view=True)

    def admission_plan(self, lane: str | None, route, wanted: int, pinned: bool) -> int:
        return self._on_loop(operator.admission_ask, lambda gate: gate.plan(lane, route, wanted, pinned), view=True)

    def admission_starving(self) -> list:
        return self._on_loop(operator.admission_ask, lambda gate: gate.starving(), view=True)

    def admission_reload_refused(self, why: str) -> None:
        """A reload whose [admission] section did not load (no wire op: the reload itself
        raised): the last good catalog stays, and the admission's ``policy_error`` says why."""
        self._on_loop(operator.admission_reload_refused, why)

    def reload(self, config) -> dict:
        return self._on_loop(operator.reload, config)
