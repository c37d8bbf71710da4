"""What a unit's future raises when the unit did not solve: the one rule, for every face.

Python programmers catch what their function raised, so a handler's (or an
Executor function's) own exception comes back as itself:

* **The unit's own exception** (outcome failed, reason HandlerError, and the
  exception could be pickled in the worker and rebuilt here) is raised from
  ``result()`` and from ``map`` as that very exception, its type and args, with the
  worker's formatted traceback as ``__cause__`` (a
  ``concurrent.futures.process._RemoteTraceback``, the stdlib's convention: the
  traceback printed in the parent shows the worker's lines).
* **An exception that cannot be rebuilt here** (it does not pickle, is too large,
  or its class does not import in this process) raises `UnitFailed` (HandlerError),
  whose detail names it and says why, with the worker's traceback text.
* **Outcomes fleet itself decides** (Timeout, Shutdown, Cancelled, Refused,
  ResultError, ...) raise `UnitFailed` with the reason; a suppressed unit raises
  `UnitSuppressed`.
* **A worker that is gone** (LaneDeath: it died while the unit ran; RoleStopped: its
  role was stopped, by repeated deaths or an initializer that failed) raises
  `UnitBroken`, a `UnitFailed` that is also a
  ``concurrent.futures.process.BrokenProcessPool``, so code written for
  ProcessPoolExecutor still catches it. Only that unit fails: the seat is forked
  again and the fleet goes on. A submit to a stopped role raises `RoleBroken`, a
  `RoleStopped` that is a BrokenProcessPool too.

The ledger and ``UnitError.outcome`` keep fleet's own reasons (HandlerError counts
as it did). A service-mode fleetd relays a handler's exception still pickled: it
keeps the `UnitFailed` (the exception is no exception object there), and its
client applies this rule once it has rebuilt it.
"""
from __future__ import annotations

from fleet.rules.unit import Outcome, RoleStopped, UnitFailed, error_for
from fleet.rules.vocab import FAILED, Reason

#: The reasons that say the unit's worker (or its role's workers) are gone.
BROKEN_REASONS = frozenset((Reason.LANE_DEATH, Reason.ROLE_STOPPED))

# concurrent.futures.process (ProcessPoolExecutor's module, and multiprocessing's with it)
# is imported when first needed, not with this module: it is a fork server's and an
# Executor's whole start to import it (~6 ms of each here), and most programs never see a
# broken unit. UnitBroken and RoleBroken, its BrokenProcessPool's subclasses, are made
# then (`__getattr__`); they are this module's own names for every other purpose (import,
# pickling, `fleet.UnitBroken`).


def _make_broken() -> dict:
    from concurrent.futures.process import BrokenProcessPool

    class UnitBroken(UnitFailed, BrokenProcessPool):
        """The unit failed because its worker died while it ran (LaneDeath) or its role was
        stopped (RoleStopped). Also a BrokenProcessPool: only this unit failed, and the
        fleet goes on."""

    class RoleBroken(RoleStopped, BrokenProcessPool):
        """A submit to a role that was stopped (repeated worker deaths, a failed worker
        initializer): refused, nothing queued. Also a BrokenProcessPool, as
        ProcessPoolExecutor's submit raises once its pool is broken."""

    made = {"UnitBroken": UnitBroken, "RoleBroken": RoleBroken}
    for cls in made.values():
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
    return made


def __getattr__(name: str):
    if name in ("UnitBroken", "RoleBroken"):
        return _broken(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _broken(name: str) -> type:
    cls = globals().get(name)
    if cls is None:
        globals().update(_make_broken())  # made once: every later look finds them here
        cls = globals()[name]
    return cls


def role_broken(message: str) -> BaseException:
    """The RoleBroken a submit to a stopped role raises (`message` says why)."""
    return _broken("RoleBroken")(message)


def unit_exception(unit_id: int, role: str, outcome: Outcome, original=None) -> BaseException:
    """The exception a unit that did not solve raises (the module docstring's rule).
    `original`: the handler's exception rebuilt here (or anything else: a relayed
    pickle, a provider's refusal), None when there is none."""
    if outcome.kind == FAILED:
        if outcome.reason == Reason.HANDLER_ERROR and isinstance(original, BaseException):
            return own_exception(original, outcome.detail)
        if outcome.reason in BROKEN_REASONS:
            return _broken("UnitBroken")(unit_id, role, outcome, original)
    return error_for(unit_id, role, outcome, original)


def own_exception(exc: BaseException, traceback_text: str | None) -> BaseException:
    """`exc` with the worker's traceback as its cause, as ProcessPoolExecutor raises it."""
    from concurrent.futures.process import _RemoteTraceback

    exc.__cause__ = _RemoteTraceback(f'\n"""\n{traceback_text or ""}"""')
    return exc
