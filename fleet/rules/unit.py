"""A unit of work, what a handler may raise, and what a caller gets back.

Handlers are plain functions named in config as ``module:function``; each takes one
`Unit` and returns a picklable result, or raises `Suppress(reason)` to end the unit
as suppressed (done, nothing to deliver). The future of a unit that did not solve
raises `UnitFailed` or `UnitSuppressed`, both carrying the unit's `Outcome`.
"""
from __future__ import annotations

import collections
import math
from collections.abc import Hashable  # noqa: F401 - Unit's annotations name it (typing.get_type_hints)
from contextvars import ContextVar

from admission.records import record
from fleet.rules.errors import FleetError
from fleet.rules.outcomes import FAILED, SUPPRESSED


class Unit(collections.namedtuple("Unit", ("id", "role", "payload", "key", "lane", "request_id", "route"),
                                  defaults=(None, None, None, None, None))):
    """What a handler receives (immutable; a named tuple because workers build one per item).

    Attributes:
        id: the fleet-wide unit id (unique for the life of the fleet).
        role: the role it was submitted to.
        payload: the submitted payload (unpickled in the worker).
        key: the pin key (pinned roles), else None.
        lane: the lane it was submitted under (a name; None for the default lane).
        request_id: the caller's idempotency id, if any.
        route: the provider pool to call (a `fleet.Route`), as the provider admission
            chose it: the submitted route, or the alternative it moved the unit to.
            None for a unit submitted without a route.
    """

    # collections' namedtuple, not typing's: every worker imports this module, and typing
    # would be ~2 ms of the fork server's start. The fields' types, as typing keeps them
    # (`typing.get_type_hints(Unit)` evaluates them here):
    __annotations__ = {"id": "int", "role": "str", "payload": "object", "key": "Hashable | None",
                       "lane": "str | None", "request_id": "str | None", "route": "object"}
    __slots__ = ()


class _Running:
    """The unit a handler runs and the cost it reported (the worker keeps one per unit)."""

    __slots__ = ("unit", "cost")

    def __init__(self):
        self.unit: Unit | None = None
        self.cost: float | None = None


# Set by the worker around each handler call. A context variable, so concurrent units of
# an I/O-bound role (asyncio tasks, pool threads) each see their own.
RUNNING: ContextVar = ContextVar("fleet_running_unit", default=None)


def current_unit() -> Unit:
    """The `Unit` the calling handler is running (its ``route`` is what admission chose).

    Works in the handler and in what it awaits; a thread the handler starts itself
    does not inherit it (use ``contextvars.copy_context().run``). RuntimeError outside
    a handler.
    """
    running = RUNNING.get()
    if running is None or running.unit is None:
        raise RuntimeError("fleet.current_unit() is only known inside a handler")
    return running.unit


class NotInsideUnit(FleetError, RuntimeError):
    """`fleet.current_fleet()` was called where no unit runs: outside a handler or an
    Executor task (the caller's own process, a thread the handler started itself), or in
    a worker of another pool. The message says which."""


def report_cost(usd: float) -> None:
    """Report what the running unit's provider call cost, in USD (adds up when called again).

    The provider admission keeps the mean cost per pool (shown, and used to discount
    Thompson sampling among alternatives); a cost counts when the unit solves.
    ValueError for a negative or non-finite amount; RuntimeError outside a handler.
    """
    if isinstance(usd, bool) or not isinstance(usd, (int, float)) or not math.isfinite(usd) or usd < 0:
        raise ValueError(f"report_cost: usd must be a finite number >= 0, not {usd!r}")
    running = RUNNING.get()
    if running is None:
        raise RuntimeError("fleet.report_cost() is only known inside a handler")
    running.cost = (running.cost or 0.0) + float(usd)


class Suppress(Exception):
    """Raised by a handler: the unit is done and delivers nothing (outcome: suppressed)."""

    def __init__(self, reason: str = ""):
        self.reason = reason
        super().__init__(reason)


@record(slots=True)
class Outcome:
    """How a unit ended: kind is solved, suppressed or failed; reason and detail say why."""

    kind: str
    reason: str | None = None
    detail: str | None = None


class UnitError(FleetError):
    """A unit that did not solve. `outcome` says how it ended, `unit_id` which unit."""

    def __init__(self, unit_id: int, role: str, outcome: Outcome, original: BaseException | None = None):
        self.unit_id, self.role, self.outcome, self.original = unit_id, role, outcome, original
        text = f"unit {unit_id} ({role}) {outcome.kind}"
        if outcome.reason:
            text += f": {outcome.reason}"
        if outcome.detail and outcome.kind != FAILED:
            text += f": {outcome.detail}"
        elif outcome.detail:
            last = outcome.detail.strip().splitlines()[-1] if outcome.detail.strip() else ""
            text += f": {last}"
        super().__init__(text)

    @property
    def reason(self) -> str | None:
        return self.outcome.reason


class UnitFailed(UnitError):
    """The unit failed: outcome.reason is one of fleet.rules.outcomes.FAILURE_REASONS.

    For HandlerError, `outcome.detail` holds the handler's traceback as text and
    `original` the exception itself when it could be pickled back and rebuilt here
    (when not, the detail's first line says why and `original` is None).
    """


class UnitSuppressed(UnitError):
    """The handler raised Suppress: outcome.detail holds its reason."""


def error_for(unit_id: int, role: str, outcome: Outcome, original=None) -> UnitError:
    cls = UnitSuppressed if outcome.kind == SUPPRESSED else UnitFailed
    return cls(unit_id, role, outcome, original)


# --- refusals at submit: typed, and nothing is queued -------------------------------
class SubmitRefused(FleetError, ValueError):
    """A submit that was refused before anything was queued. ``retryable``: the same
    submit may be accepted later unchanged (the refusal is the fleet's state, not the
    unit's: a full queue, a drain)."""

    retryable: bool = False


class PayloadTooLarge(SubmitRefused):
    """The pickled payload exceeds a limit that stays: limits.max_payload_bytes when configured,
    fleetd's control frame for a service-mode submit, or the room in /dev/shm; the text names
    the size and the limit."""


class PayloadUnpicklable(SubmitRefused):
    """The payload cannot be pickled, so it cannot reach a worker."""


class QueueFull(SubmitRefused):
    """The role's queue is at its bound: backpressure, never a silent drop."""

    retryable = True


class Draining(SubmitRefused):
    """The fleet is draining (``fleetctl drain``, `Fleet.drain`): it takes no new units
    while its in-flight and queued ones finish; submit again after ``resume``.
    ``since``: when the drain began (epoch seconds; None when the reply did not say)."""

    retryable = True

    def __init__(self, message: str, since: float | None = None):
        super().__init__(message)
        self.since = since

    def __reduce__(self):
        return (type(self), (str(self), self.since))


class BadUnit(SubmitRefused):
    """Arguments that do not fit the role (a key for a pooled role, no key for a pinned one, ...)."""


class RoleStopped(SubmitRefused):
    """The role exceeded its restart intensity and takes no more work."""


class FleetClosed(FleetError, RuntimeError):
    """submit after shutdown (concurrent.futures raises RuntimeError here too)."""
