"""The admission mode's seam: the replay asks the provider admission before it submits.

Until the fleet's own submit path takes ``submit(..., lane=, route=)`` and consults its
admission, the replay driver holds an `admission.AdmissionPool` itself (the live pool of
the provider-admission package, never a copy): every provider round asks `admit` before
it is submitted; a round told to wait is held by the driver until `wake` starts it; a
round told to move runs on the route the admission chose; every round's end is reported
with `report` (clean, or the provider's refusal with its status and Retry-After). When
the fleet wiring lands, the mode becomes plain ``fleet.submit(role, payload, lane=,
route=)`` and this seam goes away.

If the admission package on this branch has no live pool (``admission.pool``) the mode
fails with `AdmissionUnavailable` before anything runs.
"""
from __future__ import annotations

import random

from .trace import Header, Route as TraceRoute


class AdmissionUnavailable(Exception):
    """The admission mode was asked for but the provider admission cannot be loaded here."""


class AdmissionSeam:
    """The driver's handle on the admission: admit, report, wake, next wake, closures, census."""

    def __init__(self, header: Header, clock, seed: int):
        try:
            from admission.pool import AdmissionPool
            from admission.policy import Policy
            from admission.state import Signal
            from fleet.route import Route
        except ImportError as exc:
            raise AdmissionUnavailable(
                "the admission mode needs the provider admission (admission.pool, fleet.route), which this "
                f"installation does not have ({exc}); run with --modes none,cap") from None
        self._Route, self._Signal = Route, Signal
        self.pool = AdmissionPool(Policy.from_dict(policy_dict(header)), clock=clock, rng=random.Random(seed))
        self._closures: dict = {}  # (provider, credential, since) -> closure: every one the replay saw

    def admit(self, unit: int, route: TraceRoute, lane, severity, parent: int | None):
        """(starts, route chosen (trace Route), moved, probe)."""
        decision = self.pool.admit(unit, self._Route(route.model, route.provider, route.credential), lane=lane,
                                   severity=severity, parent=parent)
        return self._read(decision)

    def _read(self, decision):
        r = decision.route
        return (decision.starts, TraceRoute(r.model, r.provider, r.credential), decision.action == "move",
                bool(decision.probe))

    def report_clean(self, unit: int, seconds: float) -> None:
        self.pool.report(unit, self._Signal.clean(seconds))

    def report_refused(self, unit: int, status: int, message: str, retry_after: float | None) -> None:
        self.pool.report(unit, self._Signal.refused(status, message, retry_after))
        for c in self.pool.census()["closures"]:  # a refusal is when a closure can begin
            self._closures.setdefault((c["provider"], c["credential"], c["since"]), c)

    def report_error(self, unit: int, message: str) -> None:
        self.pool.report(unit, self._Signal("error", message=message))

    def wake(self) -> list:
        """[(unit, starts, route, moved, probe)] for the waiting rounds that start now."""
        return [(unit,) + self._read(d) for unit, d in self.pool.wake()]

    def next_wake(self) -> float | None:
        return self.pool.next_wake()

    def cancel(self, unit: int) -> None:
        self.pool.cancel(unit)

    def closures(self) -> list[dict]:
        """Every closure the admission made during the replay (census rows), also those since lifted."""
        return list(self._closures.values())


def policy_dict(header: Header) -> dict:
    """The admission policy ([admission] section) a trace header declares: the catalog of its pools
    with their residency marks, their alternatives, its lanes and its admission timings."""
    providers: dict = {}
    alternatives: dict = {}
    for pool in header.pools:
        marks = {"residency": pool.residency} if pool.residency else {}
        providers.setdefault(pool.provider, {"models": {}})["models"][pool.model] = marks
        if pool.alternatives:
            alternatives.setdefault(pool.model, [])
            for model, provider in pool.alternatives:
                entry = f"{model}@{provider}"
                if entry not in alternatives[pool.model]:
                    alternatives[pool.model].append(entry)
    out = dict(header.raw.get("admission", {}))
    out.update({"providers": providers, "alternatives": alternatives, "lanes": dict(header.lanes)})
    return out
