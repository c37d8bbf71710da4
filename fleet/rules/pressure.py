"""CPU and memory pressure (PSI) as cordon inputs: when to hold the posture, when to let go (pure).

Memory pressure goes the same way on the group's ``memory.pressure``: tasks stalled
reclaiming memory (the group at its ``memory.high`` or limit, or the host short of
memory) hold the posture under ``memory-pressure``; the rules below are the same.

A PSI trigger (`fleet.host.cgroup.PsiTrigger`) on the fleet's own cgroup's ``cpu.pressure``
wakes when its tasks stalled for `stall_us` within `window_us` waiting for a CPU: the
group is short of CPU, which is what a cordon is for, and the trigger says so at once
instead of at the next throttle count. A fired trigger holds the posture Cordoned
under the cause ``cpu-pressure``.

Triggers fire only on rising pressure (PLATFORM.md): the way out is found by polling
the file's cumulative ``total`` (µs stalled). The cause is released once the stall
rate stayed below the trigger's own rate (stall_us per window_us) for a whole window;
the posture then leaves Cordoned by its usual rule (a clean exit window), so pressure
that comes and goes does not flap it.

Everything here is a pure function of (state, reading, now); `fleet.host.sampler`
reads the trigger and the file.
"""
from __future__ import annotations


from admission.records import record
from fleet.rules.vocab import Cause

HOLD = "hold"
RELEASE = "release"
#: The posture cause a CPU pressure hold is filed under.
CAUSE = Cause.CPU_PRESSURE
#: The cause of a hold on the group's memory.pressure: the same rules, its own trigger and
#: thresholds (``[memory]``), so the two are held and released apart.
MEMORY_CAUSE = Cause.MEMORY_PRESSURE


@record
class PressureState:
    """`held`: the cause is raised. `last`: (ms, total µs) of the last reading.
    `calm_since_ms`: since when the stall rate stayed below the trigger's."""

    held: bool = False
    last: tuple[int, int] | None = None
    calm_since_ms: int | None = None


def observe(state: PressureState, now_ms: int, fired: bool, total_us: int | None,
            stall_us: int, window_us: int) -> tuple[PressureState, str | None]:
    """Feed one poll: whether the trigger fired since the last one, and the file's total
    (None: unreadable). Returns the next state and HOLD, RELEASE or None."""
    last = (now_ms, total_us) if total_us is not None else state.last
    if fired:
        return PressureState(True, last, None), (None if state.held else HOLD)
    if not state.held or total_us is None or state.last is None:
        return PressureState(state.held, last, state.calm_since_ms), None
    elapsed_us = (now_ms - state.last[0]) * 1000
    stalled_us = total_us - state.last[1]
    if elapsed_us <= 0:
        return PressureState(True, state.last, state.calm_since_ms), None
    if stalled_us < 0 or stalled_us * window_us < stall_us * elapsed_us:  # calm (or the file was reset)
        calm = state.calm_since_ms if state.calm_since_ms is not None else state.last[0]
        if (now_ms - calm) * 1000 >= window_us:
            return PressureState(False, last, None), RELEASE
        return PressureState(True, last, calm), None
    return PressureState(True, last, None), None
