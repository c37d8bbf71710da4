"""Restart intensity, OTP style (pure).

A supervisor restarts what dies, but not forever: more than `max_restarts` deaths
within any `within_seconds` window means restarting does not help, and the dying
thing is stopped instead (OTP's MaxR / MaxT). Here the thing is a role: every death
of a worker counts against each role its seat serves.

The rule keeps, per role, the times of the deaths still inside the window. A death
at `now` drops the ones older than `now - within_seconds` (one exactly on the edge
still counts), adds `now`, and exceeds the limit when more than `max_restarts`
remain. `max_restarts = 0` stops at the first death. Time is an argument (seconds
on any monotonic clock): the rule never reads a clock.
"""
from __future__ import annotations

from admission.records import record


History = tuple[float, ...]


@record
class Verdict:
    """What one death means: the history to keep, and whether the limit is exceeded."""

    history: History
    exceeded: bool


def note_death(history: History, now: float, max_restarts: int, within_seconds: float) -> Verdict:
    """Count a death at `now` against `history` (earlier deaths, oldest first).

    Returns the deaths still inside the window ending at `now` (this one included)
    and whether they are more than `max_restarts`.
    """
    horizon = now - within_seconds
    kept = tuple(t for t in history if t >= horizon) + (now,)
    return Verdict(kept, len(kept) > max_restarts)


class Deaths:
    """Death histories per role (the supervisor loop's; the rule is `note_death`)."""

    def __init__(self, max_restarts: int, within_seconds: float):
        self.max_restarts = max_restarts
        self.within_seconds = within_seconds
        self._history: dict[int, History] = {}

    def died(self, role: int, now: float) -> bool:
        """Count a death of `role` at `now`; True when it exceeds the intensity."""
        verdict = note_death(self._history.get(role, ()), now, self.max_restarts, self.within_seconds)
        self._history[role] = verdict.history
        return verdict.exceeded

    def recent(self, role: int) -> History:
        return self._history.get(role, ())
