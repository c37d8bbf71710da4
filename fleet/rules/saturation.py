"""Saturation: when a role's arrivals outrun its service rate (reference 002 §13:
"saturation is the advisory queue depth, named and metered through the census's
logical rows").

Pure: a window of samples in, a reading out; the caller owns the clock. The loop feeds
one `RoleSaturation` per role every posture sample with three numbers it already
holds: the time, the role's queue depth, and how many of the role's units were granted
a slot so far (a running total). Every unit that leaves the queue by a grant has been
served or is being served, so over the window

    service rate = grants / span
    arrival rate = (grants + depth growth) / span      (what came in: served + what piled up)

A role is *raised* saturated once the window is full, its backlog is at least
`raise_depth`, it grew over the window and over the window's latter half (a burst
already draining is no episode), and arrivals beat service by more than `margin`. It stays saturated while the backlog holds (arrivals == service keeps it),
and *clears* only when the backlog has drained to `clear_depth` or below: the two
thresholds are the hysteresis, so a backlog hovering around one of them does not flap.
Each raise and each clear is one event (the caller logs one line per episode edge,
never one per check).

What the pinned tier or a bigger quota would give (`estimate`) is arithmetic on the
measured per-core service rate: a running unit holds one core, so N cores serve about
N times what one does.
"""
from __future__ import annotations

import collections
import math

from admission.records import record

RAISED = "raised"
CLEARED = "cleared"

__all__ = ["SaturationPolicy", "DEFAULT_SATURATION", "RoleSaturation", "Reading", "estimate", "describe", "RAISED", "CLEARED",
           "SATURATION_KEYS"]

SATURATION_KEYS = ("window_s", "raise_depth", "clear_depth", "margin", "warn")


@record
class SaturationPolicy:
    """The thresholds (``[saturation]`` in the config).

    window_s: seconds of samples a raise looks back over (a burst shorter than this that
        drains is not an episode).
    raise_depth: the smallest backlog (units queued) that can be saturated.
    clear_depth: the backlog at or below which an episode clears (below `raise_depth`).
    margin: how much faster than service arrivals must come to raise (0.05: 5 %).
    warn: log each episode's edges at WARNING (True) or at INFO (False). The reading is
        published in the table either way. An Executor passes False: its caller makes the
        backlog itself (a map queues every call at once), so an episode there is news to
        nobody.
    """

    window_s: float = 2.0
    raise_depth: int = 8
    clear_depth: int = 0
    margin: float = 0.05
    warn: bool = True

    def __post_init__(self):
        if not (isinstance(self.window_s, (int, float)) and not isinstance(self.window_s, bool)
                and 0 < self.window_s <= 3600):
            raise ValueError(f"window_s must be a number of seconds in (0, 3600], got {self.window_s!r}")
        for key in ("raise_depth", "clear_depth"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{key} must be a whole number >= 0, got {v!r}")
        if self.raise_depth < 1:
            raise ValueError(f"raise_depth must be >= 1, got {self.raise_depth!r}")
        if self.clear_depth >= self.raise_depth:
            raise ValueError(f"clear_depth ({self.clear_depth}) must be below raise_depth ({self.raise_depth})")
        if not (isinstance(self.margin, (int, float)) and not isinstance(self.margin, bool) and 0 <= self.margin <= 10):
            raise ValueError(f"margin must be a number in [0, 10], got {self.margin!r}")
        if not isinstance(self.warn, bool):
            raise ValueError(f"warn must be true or false, got {self.warn!r}")


DEFAULT_SATURATION = SaturationPolicy()


@record
class Reading:
    """One role's saturation reading at the latest sample."""

    saturated: bool
    arrival_rate: float  # units/s over the window
    service_rate: float  # units/s over the window (grants)
    backlog: int  # units queued now
    growth: float  # backlog growth, units/s (arrival - service)
    episodes: int  # episodes raised so far
    since: float | None  # when the current episode was raised (the caller's clock), None when clear

    @property
    def drain_s(self) -> float | None:
        """Seconds the backlog takes to serve at the measured service rate (None: no service seen)."""
        return self.backlog / self.service_rate if self.service_rate > 0 else None


_CLEAR = Reading(False, 0.0, 0.0, 0, 0.0, 0, None)


class RoleSaturation:
    """One role's window and episode state. `observe` one sample at a time, in time order."""

    def __init__(self, policy: SaturationPolicy = DEFAULT_SATURATION):
        self.policy = policy
        self._samples: collections.deque = collections.deque()  # (t, depth, granted), oldest first
        self._saturated = False
        self._since: float | None = None
        self._episodes = 0
        self.reading = _CLEAR

    def observe(self, t: float, depth: int, granted: int) -> str | None:
        """Take a sample; RAISED or CLEARED when this sample starts or ends an episode, else None."""
        samples, window = self._samples, self.policy.window_s
        samples.append((t, depth, granted))
        # Keep one sample at or before the window's start: the span then covers the window.
        while len(samples) >= 2 and samples[1][0] <= t - window:
            samples.popleft()
        t0, depth0, granted0 = samples[0]
        span = t - t0
        if span > 0:
            service = max(0, granted - granted0) / span
            growth = (depth - depth0) / span
            arrival = max(0.0, service + growth)
        else:
            service = growth = arrival = 0.0
        event = None
        p = self.policy
        if not self._saturated:
            full = span >= window
            # Growing over the whole window and over its latter half too: a burst that is
            # already draining (arrivals beat service early in the window only) is no episode.
            mid = next(d for ts, d, _g in reversed(samples) if ts <= t - window / 2) if full else depth
            if (full and depth >= p.raise_depth and depth > depth0 and depth > mid
                    and arrival > service * (1.0 + p.margin)):
                self._saturated, self._since = True, t
                self._episodes += 1
                event = RAISED
        elif depth <= p.clear_depth:
            self._saturated, self._since = False, None
            event = CLEARED
        self.reading = Reading(self._saturated, arrival, service, depth, growth, self._episodes, self._since)
        return event


def estimate(arrival_rate: float, service_rate: float, cores_now: int, *, binding: str,
             pinned_cores: float | None = None, pinned_quota: float | None = None) -> dict | None:
    """What more cores would serve, from the measured rate: a unit holds one core while it
    runs, so the role serves about its per-core rate times its cores. None when nothing was
    served (no rate to scale).

    cores_now: the cores the role's seats run on now; binding: the binding in force;
    pinned_cores: the cores the pinned tier's budget gives the role (None: not known);
    pinned_quota: the quota the pinned tier needs, when this one refused it (None: this quota).
    """
    if service_rate <= 0 or cores_now <= 0:
        return None
    per_core = service_rate / cores_now
    need = max(1, math.ceil(arrival_rate / per_core - 1e-9))
    out = {"per_core_rate": round(per_core, 3), "cores_now": cores_now, "cores_needed": need, "binding": binding,
           "pinned": None}
    if pinned_cores:
        out["pinned"] = {"cores": pinned_cores, "quota_cpus": pinned_quota,
                         "capacity": round(per_core * pinned_cores, 3)}
    return out


def describe(est: dict | None, arrival_rate: float) -> str:
    """The estimate in one line (status, top's footer, the log)."""
    if est is None:
        return "no unit served yet: no rate to scale"
    head = (f"{est['per_core_rate']:.1f}/s per core on {est['cores_now']} core(s) ({est['binding']}); "
            f"{arrival_rate:.1f}/s arriving needs ~{est['cores_needed']} core(s)")
    pinned = est.get("pinned")
    if pinned is None:
        return head
    where = "at this quota" if pinned["quota_cpus"] is None else f"at a quota of {pinned['quota_cpus']:g} cpus"
    return head + f"; the pinned tier {where} gives it {pinned['cores']:g} core(s): ~{pinned['capacity']:.1f}/s"
