"""How many units to send ahead to a busy slot: as many as keep its worker busy, no more.

A unit sent ahead waits on the worker's ring behind the one it runs, so the worker
starts it without a round trip through the supervisor's loop; it also counts as
started, out of `cancel`'s reach (Ctrl-C, ``shutdown(cancel_futures=True)``, leaving a
`map` early wait for it). How many a worker needs depends on how long its units run:

* a unit shorter than a round trip leaves the worker idle unless the next ones wait
  behind it: ``ceil(round trip / run)`` of them cover the trip, up to the role's
  `lookahead` (microsecond calls: the role's whole lookahead);
* a unit far longer than a round trip (`IDLE_SHARE`: the trip is at most 2% of it)
  needs nothing ahead: the worker waits a round trip between units, a share of its
  time too small to see, and cancel reaches every unit but the running ones;
* in between, one.

So what is out of cancel's reach on a worker, beyond the unit it runs, runs about a
round trip, or one unit when units are longer: never more than ProcessPoolExecutor's
call queue holds (one per worker, and one more). Before any unit of the role has
ended its run time is unknown: nothing ahead (`FIRST_AHEAD`).

The run time is the workers' own measure (a result's ``elapsed``), smoothed over the
last few units (`SMOOTHING`) so that one odd unit does not swing the depth. Pure: the
loop feeds it (`fleet.runtime.results`) and hands the depth to the dispatcher
(`Dispatcher.pace`).
"""
from __future__ import annotations

import math

#: A unit's trip through the supervisor: its result read from the ring, the loop's turn,
#: the next unit granted and pushed, the worker woken. ~50-200 us on a quiet host, about
#: a millisecond on a loaded 2-core VM; the larger figure, so that short units are fed
#: deep enough on a busy host (over-estimating it costs only depth for sub-ms units).
ROUND_TRIP_S = 1e-3
#: Send nothing ahead once a round trip is at most this share of a unit's run.
IDLE_SHARE = 0.02
#: Units sent ahead before the role's run time is known: none, as ProcessPoolExecutor's
#: first calls (a unit that might run minutes is not put out of cancel's reach on a
#: guess); microsecond units pay one round trip for it, at their first results.
FIRST_AHEAD = 0
#: Weight of the newest run in the smoothed run time.
SMOOTHING = 0.25


def depth_for(run_s: float | None, cap: int, round_trip_s: float = ROUND_TRIP_S) -> int:
    """Units to send ahead to a busy slot whose units run `run_s` seconds (None: not
    known yet), at most `cap` (the role's lookahead)."""
    if cap <= 0:
        return 0
    if run_s is None:
        return min(cap, FIRST_AHEAD)
    if run_s * IDLE_SHARE >= round_trip_s:
        return 0
    if run_s <= 0:
        return cap
    return min(cap, max(1, math.ceil(round_trip_s / run_s)))


class Pace:
    """Each role's smoothed run time, and the depth it calls for.

    `ran(code, seconds)` returns the role's new depth when it changed, else None (the
    caller then has nothing to tell the dispatcher)."""

    def __init__(self, caps: list[int], round_trip_s: float = ROUND_TRIP_S):
        self._caps = list(caps)
        self._round_trip_s = round_trip_s
        self._run_s: list[float | None] = [None] * len(caps)
        self.depths = [depth_for(None, cap, round_trip_s) for cap in caps]

    def ran(self, code: int, seconds: float) -> int | None:
        if self._caps[code] <= 0 or not seconds >= 0:  # nothing to pace; NaN or a negative: no measure
            return None
        last = self._run_s[code]
        run_s = seconds if last is None else last + SMOOTHING * (seconds - last)
        self._run_s[code] = run_s
        depth = depth_for(run_s, self._caps[code], self._round_trip_s)
        if depth == self.depths[code]:
            return None
        self.depths[code] = depth
        return depth

    def ran_many(self, code: int, seconds: list) -> int | None:
        """`ran` for each of `seconds` in order (a slice of the role's results), the depth
        judged once, after the last: what `ran` one by one leaves behind (a depth between
        is no longer in force by then), in one call."""
        if self._caps[code] <= 0:
            return None
        run_s = self._run_s[code]
        for s in seconds:
            if s >= 0:  # NaN or a negative: no measure
                run_s = s if run_s is None else run_s + SMOOTHING * (s - run_s)
        if run_s is None:
            return None
        self._run_s[code] = run_s
        depth = depth_for(run_s, self._caps[code], self._round_trip_s)
        if depth == self.depths[code]:
            return None
        self.depths[code] = depth
        return depth

    def run_s(self, code: int) -> float | None:
        """The role's smoothed run time (None before any of its units ended)."""
        return self._run_s[code]
