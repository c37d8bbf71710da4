"""Each unit's times from its accept to its outcome: the makespan histogram's input and
the unit's span (002 §7: submit -> grant -> start -> end, with role, key, seat, epoch
and outcome).

Off unless asked for. With neither ``[metrics] enabled`` nor ``[metrics] spans`` the
books hold no watch (``Books.watch is None``) and the loop pays one attribute check
at each place a unit moves (accept, a dispatch pass, a result, an outcome): no clock
read, no dict entry. With the exporter on, the watch keeps four numbers per unit owed
and hands each ended unit's makespan to the publisher (`Publisher.makespan_ended`),
which publishes it with the ledger's counters. With spans on, it also makes one
OpenTelemetry span per unit, on the tracer of the process's tracer provider (the
program configures the SDK and its exporter, as for any instrumented library); the
``opentelemetry-api`` package comes with the ``fleet[otel]`` extra.

The times are the loop's: "submit" is the unit's accept on the loop (a submit reaches
it within a wake-up), "grant" its last grant (a unit taken back by a gate, or sent
back from a dead seat before it started, is granted again), "start" its handler's
start as the worker measured it (the result's run time before the result's arrival),
"end" its outcome. The spans of a turn are made once its futures are resolved (`flush`,
from `Books.deliver`), so no caller waits for a span. A unit that never ran has no start event; a unit whose worker died
mid-run (LaneDeath) has its grant and no start (its worker never said).

One owner: the loop thread.
"""
from __future__ import annotations

import time

from fleet._version import __version__
from fleet.rules.errors import FleetError
from fleet.rules.outcomes import FAILED

#: What a span is called (its role is an attribute, so one name serves every role).
SPAN_NAME = "fleet.unit"
#: The instrumentation scope's name, as a tracing system shows it.
TRACER_NAME = "fleet"

# A unit's times, in a list indexed by these (a list is the cheapest record to update).
_SUBMIT, _GRANT, _SEAT, _EPOCH, _START = range(5)


class OtelMissing(FleetError):
    """``[metrics] spans`` is on and the OpenTelemetry API is not installed."""


def tracer():
    """The tracer of the process's tracer provider (the SDK's, once the program set one;
    a no-op one until then). OtelMissing when the ``fleet[otel]`` extra is absent."""
    try:
        from opentelemetry import trace
    except ImportError:
        raise OtelMissing("[metrics] spans = true needs OpenTelemetry: pip install 'fleet[otel]'") from None
    return trace.get_tracer(TRACER_NAME, __version__)


class UnitWatch:
    """Stamps each unit as it moves; at its outcome, its makespan to `makespans` and its
    span to `tracer` (either may be None, not both).

    Args:
        fleet: the fleet's name (a span attribute).
        roles: the fleet's RoleSet (a code's name; whether a role is keyed).
        epoch: returns the quota epoch in force (the one a grant happened in).
        seat_name: a seat's name from its index.
        makespans: ``(role, key, epoch, seconds)`` hears of each ended unit; key is None
            for a role that is not keyed.
        tracer: an OpenTelemetry tracer, or None.
        clock: CLOCK_MONOTONIC in ns.
    """

    def __init__(self, fleet: str, roles, epoch, seat_name, *, makespans=None, tracer=None,
                 clock=time.monotonic_ns):
        self._fleet, self._roles, self._epoch, self._seat_name = fleet, roles, epoch, seat_name
        self._makespans, self._tracer, self._clock = makespans, tracer, clock
        self._keyed = [r.kind == "pinned" for r in roles]
        self._units: dict[int, list] = {}
        self._due: list = []  # the spans of units ended this turn, made at `flush`
        # Spans take wall-clock ns: the monotonic stamps plus this offset, read once
        # (a wall-clock step during a span cannot make it end before it starts).
        self._wall_offset = time.time_ns() - clock()

    def __len__(self) -> int:
        """Units stamped and not yet ended."""
        return len(self._units)

    def entered(self, unit_id: int) -> None:
        self._units[unit_id] = [self._clock(), 0, -1, -1, 0]

    def entered_many(self, unit_ids) -> None:
        now = self._clock()
        units = self._units
        for unit_id in unit_ids:
            units[unit_id] = [now, 0, -1, -1, 0]

    def granted(self, grants) -> None:
        """A dispatch pass's grants (`fleet.rules.dispatch.Grant`): each one's time, seat, epoch."""
        now, epoch, units = self._clock(), self._epoch(), self._units
        for g in grants:
            times = units.get(g.unit_id)
            if times is not None:
                times[_GRANT], times[_SEAT], times[_EPOCH], times[_START] = now, g.seat, epoch, 0

    def ran(self, unit_id: int, elapsed_s: float) -> None:
        """A result arrived for a unit whose handler ran `elapsed_s` seconds."""
        times = self._units.get(unit_id)
        if times is not None:
            times[_START] = max(times[_GRANT], self._clock() - int(elapsed_s * 1e9))

    def ended(self, unit, outcome) -> None:
        """`unit` (a LoopUnit) has its outcome: its makespan and span go out."""
        times = self._units.pop(unit.unit_id, None)
        if times is None:
            return
        end = self._clock()
        epoch = times[_EPOCH] if times[_EPOCH] >= 0 else self._epoch()
        spec = self._roles.by_code(unit.role)
        key = unit.key if self._keyed[unit.role] else None
        if self._makespans is not None:
            self._makespans(spec.name, key, epoch, (end - times[_SUBMIT]) / 1e9)
        if self._tracer is not None:
            self._due.append((unit.unit_id, spec.name, key, epoch, outcome, times, end))

    def flush(self) -> None:
        """Make the spans of the units that ended since the last call (the books call it
        once a turn's futures are resolved: a caller's result never waits for its span)."""
        due, self._due = self._due, []
        for span in due:
            self._span(*span)

    def _span(self, unit_id: int, role: str, key, epoch: int, outcome, times: list, end: int) -> None:
        from opentelemetry.trace import Status, StatusCode

        off = self._wall_offset
        attributes = {"fleet.name": self._fleet, "fleet.unit_id": unit_id, "fleet.role": role,
                      "fleet.epoch": epoch, "fleet.outcome": outcome.kind}
        if key is not None:
            attributes["fleet.key"] = str(key)
        if times[_SEAT] >= 0:
            attributes["fleet.seat"] = self._seat_name(times[_SEAT])
        if outcome.reason:
            attributes["fleet.reason"] = outcome.reason
        span = self._tracer.start_span(SPAN_NAME, start_time=times[_SUBMIT] + off, attributes=attributes)
        if times[_GRANT]:
            span.add_event("grant", timestamp=times[_GRANT] + off)
        if times[_START]:
            span.add_event("start", timestamp=times[_START] + off)
        if outcome.kind == FAILED:
            span.set_status(Status(StatusCode.ERROR, outcome.reason))
        span.end(end_time=end + off)


def watch_for(config, rig, seats, exporting: bool) -> UnitWatch | None:
    """The watch a booted fleet's books hold: makespans when the exporter runs
    (`exporting`), spans when ``[metrics] spans`` is on; None when neither (the loop then
    stamps nothing)."""
    on_spans = config.metrics.spans
    if not exporting and not on_spans:
        return None
    watcher = rig.quota_watcher
    return UnitWatch(config.name, config.roles, lambda: watcher.epoch, seats.name,
                     makespans=rig.publisher.makespan_ended if exporting else None,
                     tracer=tracer() if on_spans else None)
