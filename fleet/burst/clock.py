"""The replay clock: trace time, scaled by ``--speed``, shared by the simulator and the driver.

Trace time runs `speed` times faster than the host's monotonic clock from the moment
`start()` is called. `mono()` is trace seconds since then and `wall()` the UTC epoch
second it stands for (the trace header's ``start`` plus `mono()`), the two readings the
admission's clock protocol asks for: the replay fleet's provider admission runs on this
clock (``fleet.Fleet(..., admission_clock=clock)``), so closures of 35 minutes, probes every 10 s and
UTC midnight all scale with the replay.
"""
from __future__ import annotations

import time


class ReplayClock:
    """Trace time at `speed` x real time, from `start_wall` (UTC epoch seconds)."""

    def __init__(self, speed: float = 1.0, start_wall: float = 0.0):
        if not (isinstance(speed, (int, float)) and speed > 0):
            raise ValueError(f"speed must be a number > 0, not {speed!r}")
        self.speed = float(speed)
        self.start_wall = float(start_wall)
        self.t0 = time.monotonic()

    def start(self, at: float | None = None) -> None:
        """Trace time 0 is now, or at host monotonic instant `at` (trace time is negative until then)."""
        self.t0 = time.monotonic() if at is None else float(at)

    @property
    def scale(self) -> float:
        """Trace seconds per real second (the admission's clock protocol reads it to turn a wake
        instant into real seconds to sleep)."""
        return self.speed

    def mono(self) -> float:
        """Trace seconds since `start`."""
        return (time.monotonic() - self.t0) * self.speed

    def wall(self) -> float:
        """The UTC epoch second the trace stands at."""
        return self.start_wall + self.mono()

    def real_at(self, trace_s: float) -> float:
        """The host monotonic instant of trace second `trace_s`."""
        return self.t0 + trace_s / self.speed

    def trace_of(self, real_mono: float) -> float:
        """The trace second of host monotonic instant `real_mono`."""
        return (real_mono - self.t0) * self.speed

    def mono_of(self, host_mono: float) -> float:
        """The admission's clock protocol: its mono reading at a host monotonic instant (a
        refusal a worker met then backs its pool off from then)."""
        return self.trace_of(host_mono)

    def real(self, trace_s: float) -> float:
        """Real seconds a span of `trace_s` trace seconds lasts."""
        return trace_s / self.speed
