"""What the loop publishes for readers outside it: the table's counters and posture
record, and the metrics' counters and run-time histogram.

`fleetctl status`, the metrics endpoint and any process that maps the table read these
with no round trip to the loop. Unit counters and run times go out at one point
(`units`), before the futures they count resolve; the posture record after every
posture change and at each sample (dwell and suppressed intake move without one).

One owner: the loop thread (and boot's, before the loop starts).
"""
from __future__ import annotations

from fleet.rules import posture as posture_mod


class Publisher:
    """Publishes into the table (and the metrics server, when [metrics] is on). It keeps
    the run times not yet published and the posture change behind the current posture
    (whose cause the record names)."""

    def __init__(self, table, ledger, posture, dispatcher, roles, now_ms):
        self.table, self.ledger, self.posture, self.dispatcher, self.roles = table, ledger, posture, dispatcher, roles
        self._now_ms = now_ms
        self.metrics = None  # the MetricsServer, once boot started one
        self._runs_ended: list = []  # (role name, seconds) not yet published
        self._makespans: list = []  # (role name, key, epoch, seconds) not yet published
        self.last_change = None  # the posture transition that set the current posture
        self._exits = {"oom_kills": 0, "recycles": 0}  # workers gone outside an outcome, as the table shows them
        self._children = 0  # units submitted from inside running units, as the table shows them

    def run_ended(self, role: str, seconds: float) -> None:
        """A unit's run time, held until `units` hands it over with the ledger's counters."""
        self._runs_ended.append((role, seconds))

    def makespan_ended(self, role: str, key, epoch: int, seconds: float) -> None:
        """A unit's makespan (accept to outcome, fleet.runtime.spans), held as run times are."""
        self._makespans.append((role, key, epoch, seconds))

    def recycled(self, role: str) -> None:
        """A worker was recycled after a unit of `role` (max_rss_mib): counted in the table
        and the metrics."""
        self._exits["recycles"] += 1
        self.table.set_worker_exits(**self._exits)
        if self.metrics is not None:
            self.metrics.count_recycle(role)

    def child_submitted(self, total: int) -> None:
        """A running unit submitted a unit (fleet.runtime.inside): `total` so far, in the table
        (the metrics read it from the ledger view)."""
        self._children = total
        self.table.set_children(total)

    def oom_killed(self, role: str) -> None:
        """The kernel's OOM killer killed a worker running a unit of `role` ("?": none):
        counted in the table and the metrics."""
        self._exits["oom_kills"] += 1
        self.table.set_worker_exits(**self._exits)
        if self.metrics is not None:
            self.metrics.count_oom_kill(role)

    def units(self) -> None:
        """The one point unit counters and run times are published, before the futures
        they count resolve: the table's ledger, then the metrics' counters and histogram
        as one step (so neither lags the other)."""
        self.ledger.publish(self.table)
        if self.metrics is not None:
            runs, self._runs_ended = self._runs_ended, []
            makespans, self._makespans = self._makespans, []
            counts = {**self.ledger.counts().to_dict(), "children": self._children}
            self.metrics.publish_units(counts, runs, makespans)
            rides = self.dispatcher.rides
            if any(rides):
                self.metrics.set_rides({self.roles.by_code(code).name: n for code, n in enumerate(rides) if n})

    def posture_record(self) -> None:
        """The table's posture record, and the dispatcher's intake floors for the posture."""
        p = self.posture
        state = p.state
        pol = p.policy
        now = self._now_ms()
        self.table.set_posture(
            p.posture,
            cause=posture_mod.cause_code(state, self.last_change),
            since_ns=state.since_ms * 1_000_000,
            enter_count=state.enter_count,
            exit_count=state.exit_count,
            cordoned_ns=int(posture_mod.cordoned_dwell_ms(state, now)) * 1_000_000,
            suppressed=self.dispatcher.suppressed,
            enter_events=pol.cordon_enter_events,
            enter_window_ms=pol.cordon_enter_window_ms,
            duty_ppm=int(round(pol.cordon_duty_percent * 10_000)),
            duty_window_ms=pol.cordon_duty_window_ms,
            exit_clean_ms=pol.cordon_exit_clean_ms,
            intake_floor=pol.cordon_sim_intake_floor or 0,
        )
        floors = [pol.intake_floor(r.slots) for r in self.roles]
        self.dispatcher.set_posture(p.posture, floors)
