"""The posture sampler: read a cgroup's cpu.stat on every tick and feed the posture.

The edge between the kernel and the pure posture rules: `tick()` reads the clock
and the counters, hands plain numbers to `PostureOwner.observe`, and returns what
changed. Clock, reader and wait are injected, so tests drive it tick by tick.

A group whose cpu.stat reports no throttle counters (cgroup2 without the cpu
controller) or cannot be read leaves the posture untouched: the sampler records
why in `unavailable` and keeps trying, it never raises out of a tick.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from . import cgroup
from .cgroup import CgroupUnavailable, CpuStat
from .posture import PostureOwner, Transition


def monotonic_ms() -> int:
    """The default clock: monotonic milliseconds."""
    return time.monotonic_ns() // 1_000_000


@dataclass(frozen=True)
class Tick:
    """What one tick saw: the time, the reading (None if unreadable) and any change."""

    now_ms: int
    stat: CpuStat | None
    transition: Transition | None


class Sampler:
    """Reads throttle counters every `interval_s` and feeds a PostureOwner.

    Args:
        owner: the posture to feed.
        read_stat: returns the group's current CpuStat (raises CgroupUnavailable).
        clock: returns now in milliseconds (monotonic).
        interval_s: time between ticks in `run`.
    """

    def __init__(
        self,
        owner: PostureOwner,
        read_stat: Callable[[], CpuStat],
        clock: Callable[[], int] = monotonic_ms,
        interval_s: float = 0.25,
    ):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.owner = owner
        self._read = read_stat
        self._clock = clock
        self.interval_s = interval_s
        self.unavailable: str | None = None

    @classmethod
    def for_cgroup(cls, owner: PostureOwner, path: str, version: int, root: str = "/", **kwargs) -> "Sampler":
        """A sampler over the cgroup directory `path` (v1 or v2)."""
        return cls(owner, lambda: cgroup.read_cpu_stat(path, version, root), **kwargs)

    @classmethod
    def for_self(cls, owner: PostureOwner, root: str = "/", **kwargs) -> "Sampler":
        """A sampler over this process's own cpu cgroup, as `fleet.cgroup.locate` finds it."""
        paths = cgroup.locate(root)
        if paths.cpu is None:
            reason = "; ".join(paths.reasons) or "no cpu cgroup"

            def unavailable():
                raise CgroupUnavailable(reason)

            return cls(owner, unavailable, **kwargs)
        return cls.for_cgroup(owner, paths.cpu.path, paths.cpu.version, root, **kwargs)

    def tick(self) -> Tick:
        """Read once and feed the posture. Never raises for a missing or partial cpu.stat."""
        now = self._clock()
        try:
            stat = self._read()
        except CgroupUnavailable as exc:
            self.unavailable = str(exc)
            return Tick(now, None, None)
        if not stat.has_throttle:
            self.unavailable = "cpu.stat has no throttle counters (no cpu controller on this group)"
            return Tick(now, stat, None)
        self.unavailable = None
        return Tick(now, stat, self.owner.observe(now, stat.nr_throttled, stat.throttled_ns))

    def run(self, stop: threading.Event, on_tick: Callable[[Tick], None] | None = None) -> None:
        """Tick every `interval_s` until `stop` is set."""
        while not stop.is_set():
            result = self.tick()
            if on_tick is not None:
                on_tick(result)
            stop.wait(self.interval_s)
