"""The saturation watch: each role's backlog read against its service rate every posture
sample (fleet.rules.saturation holds the rule), published in the table's role rows
(status, top and the metrics read them there) and logged once per episode edge.

The loop counts each role's grants (`granted`, in `Supervisor.dispatch`, where queue room
goes back) and calls `sample` beside the posture's sample; the depth is the dispatcher's.

One owner: the loop thread.
"""
from __future__ import annotations

import logging

from fleet.rules import saturation as rule

log = logging.getLogger(__name__)


class SaturationWatch:
    """Per role: its grant count, its `RoleSaturation`, and what the pinned tier would give it."""

    def __init__(self, name: str, roles, policy: rule.SaturationPolicy, table, plan, seats):
        self._name, self._roles, self._table = name, roles, table
        self.granted = [0] * len(roles)  # units granted a slot so far, per role code (the loop adds)
        self._rules = [rule.RoleSaturation(policy) for _ in range(len(roles))]
        self._warn = policy.warn
        self._binding = plan.binding
        refused = plan.tier_refused
        self._pinned_quota = refused.floor_cpus if refused is not None and refused.tier == "pinned" else None
        # The cores a role's seats run on now, and the cores the pinned tier gives it (its declared peak).
        self._cores = [len({c for s in seats if r.name in s.roles for c in s.cpus}) for r in roles]
        self._pinned = [r.peak_cpus or None for r in roles]

    def sample(self, now: float, queued) -> None:
        """Read every role (`queued(code)`: its backlog now), publish, log an episode's edges."""
        table = self._table
        for code, saturation in enumerate(self._rules):
            event = saturation.observe(now, queued(code), self.granted[code])
            r = saturation.reading
            if table is not None:
                table.set_saturation(code, saturated=r.saturated, episodes=r.episodes, arrival_rate=r.arrival_rate,
                                     service_rate=r.service_rate, pinned_cores=self._pinned[code])
            if event is not None:
                self._log(code, event, r)

    def readings(self) -> dict:
        """Each role's latest `Reading`, by name (tests and tools, on the loop)."""
        return {self._roles.by_code(code).name: s.reading for code, s in enumerate(self._rules)}

    def _log(self, code: int, event: str, r: rule.Reading) -> None:
        role = self._roles.by_code(code).name
        level = logging.WARNING if self._warn else logging.INFO
        if event == rule.RAISED:
            est = rule.estimate(r.arrival_rate, r.service_rate, self._cores[code], binding=self._binding,
                                pinned_cores=self._pinned[code], pinned_quota=self._pinned_quota)
            log.log(level, "[fleet-saturation] fleet %s: role %s saturated (episode %d): %.1f/s arriving vs %.1f/s "
                        "served, backlog %d growing %.1f/s; %s", self._name, role, r.episodes, r.arrival_rate,
                        r.service_rate, r.backlog, r.growth, rule.describe(est, r.arrival_rate))
        else:
            log.log(level, "[fleet-saturation] fleet %s: role %s no longer saturated (episode %d): backlog drained "
                        "to %d", self._name, role, r.episodes, r.backlog)
