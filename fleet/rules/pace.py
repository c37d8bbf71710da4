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

A map without a chunksize batches its calls the same way (`Batches`, `batch_for`): as
many calls per unit as run about BATCH_S in the worker, measured from the map's own
chunks, so that microsecond calls do not each pay a unit's trip, and a batch sent ahead
stays within cancel's bound above.
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
        return self._settle(code, _smoothed(self._run_s[code], (seconds,)))

    def ran_many(self, code: int, seconds: list) -> int | None:
        """`ran` for each of `seconds` in order (a slice of the role's results), the depth
        judged once, after the last: what `ran` one by one leaves behind (a depth between
        is no longer in force by then), in one call."""
        if self._caps[code] <= 0:
            return None
        run_s = _smoothed(self._run_s[code], seconds)
        return None if run_s is None else self._settle(code, run_s)

    def _settle(self, code: int, run_s: float) -> int | None:
        """The role's run time is now `run_s`: its new depth, or None when it is unchanged."""
        self._run_s[code] = run_s
        depth = depth_for(run_s, self._caps[code], self._round_trip_s)
        if depth == self.depths[code]:
            return None
        self.depths[code] = depth
        return depth

    def run_s(self, code: int) -> float | None:
        """The role's smoothed run time (None before any of its units ended)."""
        return self._run_s[code]


# --- map's batches ---------------------------------------------------------------------------
#: A batch of map's calls (one unit) runs about this long at most, once their length is
#: measured: long enough that a unit's trip through the supervisor is a small share of it,
#: short enough that one sent ahead keeps cancel (Ctrl-C, leaving a map) waiting no longer
#: than a round trip or two (`ROUND_TRIP_S`).
BATCH_S = 2e-3
#: Most calls in one batch, however short they are.
BATCH_MAX = 1024
#: A batch grows at most this many times over the last one: one quick measure (a loaded
#: host's lucky stretch) does not make a batch that runs far past BATCH_S.
BATCH_GROWTH = 4
#: Units a batching map keeps submitted ahead of its results, per slot: about
#: BATCH_AHEAD * BATCH_S of work each, so a batch size measured anew reaches the queue soon.
BATCH_AHEAD = 16
#: Most bytes of arguments and results a batch carries, for calls whose arguments' or
#: results' size is known (`value_bytes`). A call's run in the worker counts neither its
#: argument's trip (an array arrives in shared memory and is adopted there) nor its
#: result's (pickled after the batch's last call). So calls on 1 MiB arrays measured a
#: microsecond and went 16-46 to a batch: parcels of sizes the next batch rarely matched,
#: written into fresh pages (1 MiB numpy in: 1.5-11 GB/s from one map to the next); and
#: calls that return 1 MiB arrays made cheaply grew batches of as many, held whole by the
#: worker and then by the parent. Past a few MiB a unit's own trip (tens of microseconds)
#: is a small share of its copy: eight 1 MiB calls a batch, one of 8 MiB or more (4 MiB:
#: 3.8-5.0 GB/s; 8 MiB: 5.9-6.5; 16 MiB: 3.4-7.1, its last batches of odd sizes missing
#: the warm parcels).
BATCH_BYTES = 8 << 20


def batch_for(item_s: float | None, last: int, target_s: float = BATCH_S, most: int = BATCH_MAX,
              item_bytes: int = 0) -> int:
    """Calls per batch for calls that cost `item_s` seconds each (None: not measured
    yet: one), when the last batch held `last`: as many as run `target_s`, at least one,
    at most `most`, BATCH_GROWTH times `last`, and BATCH_BYTES for calls that move
    `item_bytes` each, argument and result (0: not known, no bound)."""
    if item_s is None or item_s != item_s:  # not measured, or NaN
        return 1
    fit = int(target_s / item_s) if item_s > 0 else most
    if item_bytes > 0:
        fit = min(fit, BATCH_BYTES // item_bytes)
    return max(1, min(fit, most, BATCH_GROWTH * max(1, last)))


def value_bytes(value) -> int:
    """Bytes a call's argument (or result) carries, as far as it says so cheaply: a buffer's (bytes,
    bytearray, memoryview, a numpy array: anything with the buffer protocol) or a str's
    length, summed over a tuple's first items (a map over several iterables: one
    argument of each); 0 for anything else (not known)."""
    if type(value) is tuple:
        return sum(_one_value_bytes(v) for v in value[:8])
    return _one_value_bytes(value)


def _one_value_bytes(value) -> int:
    if type(value) is str:
        return len(value)
    try:
        return memoryview(value).nbytes
    except TypeError:
        return 0


class Batches:
    """A map's batch size, from its own calls' run in the workers.

    Each chunk comes back saying how long its calls ran in the worker, from its
    payload's arrival to its last call's end (`ran(seconds, calls)`): a call's cost is
    that over its calls, smoothed over the map's chunks (`SMOOTHING`). Only the map's
    own chunks count: another map's calls of the same executor may be far shorter or
    longer. `size()`: the next chunk's calls, one until a chunk has come back, and no
    more than BATCH_BYTES of arguments and results of the sizes last seen (`saw`,
    `returned`). One map feeds and asks it, from the thread that takes its results."""

    def __init__(self, slots: int, target_s: float | None = None, most: int = BATCH_MAX):
        self.slots = max(1, slots)
        self._target_s = BATCH_S if target_s is None else target_s
        self._most = most
        self._item_s: float | None = None
        self._arg_bytes = self._result_bytes = 0
        self._last = 1

    def saw(self, value) -> None:
        """A call's argument of the map, as a chunk is made (its first): the size of the
        next ones is taken to be its (`value_bytes`); with the results' (`returned`), it
        bounds a batch's bytes."""
        self._arg_bytes = value_bytes(value)

    def returned(self, value) -> None:
        """A call's result, as a chunk comes back (its first): the size of the next ones."""
        self._result_bytes = value_bytes(value)

    def ran(self, seconds: float, calls: int) -> None:
        if not calls or not seconds >= 0:  # NaN or a negative: no measure
            return
        self._item_s = _smoothed(self._item_s, (seconds / calls,))

    def item_s(self) -> float | None:
        """A call's measured run in seconds; None before a chunk came back."""
        return self._item_s

    def size(self) -> int:
        self._last = batch_for(self._item_s, self._last, self._target_s, self._most,
                               self._arg_bytes + self._result_bytes)
        return self._last


def _smoothed(last: float | None, seconds) -> float | None:
    """A run time after the measures `seconds` (an iterable, in order; a NaN or a negative
    one is no measure and is passed over): the first measure as it is, then an
    exponential moving average (SMOOTHING). One call for a slice of measures."""
    for s in seconds:
        if s >= 0:
            last = s if last is None else last + SMOOTHING * (s - last)
    return last
