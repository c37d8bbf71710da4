"""`map` over units, shared by the embedded `fleet.Fleet`, `fleet.Executor` and the
service-mode client (`fleet.connect`): the window of units kept submitted ahead of the
caller, the feeder that reads the iterable lazily, and the results handed out in order
or as their units complete (a chunk's items one by one, in C).
"""
from __future__ import annotations

import collections
import itertools
import queue
import sys
import time
from concurrent.futures import Future
from typing import Callable, Iterable, Iterator

from fleet._chunk import hand_out
from fleet.rules.pace import BATCH_AHEAD, Batches
from fleet.rules.outcomes import FAILED, SUPPRESSED
from fleet.rules.raised import unit_exception
from fleet.rules.unit import Outcome, error_for
from fleet.rules.vocab import Reason
from fleet.shm import messages as M
from fleet.worker.codec import handler_error

#: Most units `map` keeps submitted ahead of the caller (also bounded by the role's queue).
MAP_WINDOW = 4096
#: ... and most items in them, when its chunks are big: a window of 4,096 chunks of 1,000
#: would hold 4 million items, all read and pickled before the first chunk could start
#: (the loop waits for the GIL meanwhile, and the workers for the loop). Never fewer
#: units than two per slot of the role, so every slot still has one ahead.
MAP_WINDOW_ITEMS = 65_536
#: With a batch submit, `map` tops its window up once this many units (or a quarter of the
#: window, if less) are free: one batch per refill instead of one submit per result.
MAP_REFILL = 64


def map_window(chunksize: int, queue_bound: int, slots: int = 0) -> int:
    """Units `map` keeps submitted ahead of the results taken: MAP_WINDOW, or fewer
    when the role's queue bound is smaller or the chunks are big (MAP_WINDOW_ITEMS)."""
    return max(1, min(MAP_WINDOW, queue_bound, max(2 * slots, MAP_WINDOW_ITEMS // chunksize)))



def map_units(submit: Callable[[object, bool], Future], role: str, iterable: Iterable, *, chunksize: int = 1,
              timeout: float | None = None, window: Callable[[], int] = lambda: MAP_WINDOW,
              ordered: bool = True, submit_many: Callable[[list, bool], list] | None = None,
              chunk_of: Callable[[list], object] | None = None, batches: Batches | None = None) -> Iterator:
    """`Executor.map` over units, shared by the embedded `Fleet` and the service-mode client.

    ``submit(payload, chunk)`` queues one unit (``chunk=True``: the payload is a list
    of items run as one unit, whose value is a list of ``(status, value)``) and
    returns its Future. At most ``window()`` units are kept submitted ahead of the
    caller, so the iterable is read at most ``window() * chunksize`` items ahead of
    the results handed out: a generator of any length maps in bounded memory. The
    first window is submitted before this returns, so a refusal (e.g. QueueFull, an
    unknown role) raises here rather than at the first ``next()`` (a service-mode
    client's submit does not wait for fleetd: its refusals come on the futures, at
    the first ``next()``). Leaving the
    iteration early (``close()``, ``break``, an error) cancels the units not yet
    started; each still gets its one outcome.

    ``ordered=False`` hands results out as their units complete (the items of one
    chunk stay in their order), as `multiprocessing.Pool.imap_unordered` does.

    ``submit_many(payloads, chunk)``, when given, queues a list of units at once and
    returns their Futures: the window is then topped up in batches (once `MAP_REFILL`
    units, or a quarter of the window, are free), not one unit per result taken.

    ``chunk_of(items)``, when given, makes a chunk's payload of its list of items (any
    sized object its role's worker runs as a chunk: the Executor's `Calls`).

    ``batches`` (a `fleet.rules.pace.Batches`), when given, sizes the chunks itself, as the
    map's calls turn out to run (`chunksize` is then not used): chunks of one call until
    a chunk has come back (each says how long its calls ran in the worker), then as many
    as run about `fleet.rules.pace.BATCH_S`. The window is then BATCH_AHEAD units per
    slot, so that a new measure reaches the units soon.
    """
    if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
        raise ValueError(f"chunksize must be an int >= 1, got {chunksize!r}")
    deadline = None if timeout is None else time.monotonic() + timeout
    feeder = _Feeder(submit, iter(iterable), chunksize, window, ordered, submit_many, chunk_of, batches)
    feeder.fill()
    results = _ordered if ordered else _unordered
    return MapIterator.over(results(role, feeder, chunksize, deadline))


class MapIterator(itertools.chain):
    """What `map` and `map_unordered` return: an iterator over the results, with
    ``close()`` (the units not yet started are cancelled, as on ``break``).

    Results come a unit at a time from a generator that yields each unit's values
    (a chunk's list as it came back); the items inside a unit are handed out by
    `itertools.chain` in C, with no generator frame resumed per item."""

    __slots__ = ("_units",)

    @classmethod
    def over(cls, units: Iterator[Iterable]) -> "MapIterator":
        it = cls.from_iterable(units)
        it._units = units
        return it

    def close(self) -> None:
        """Stop early: the units not yet started are cancelled (each still gets its outcome)."""
        self._units.close()


class _Feeder:
    """Keeps at most ``window()`` units of a map submitted; owns the iterable's cursor.

    Ordered, its futures wait in submit order in `pending`. Unordered, each future
    reports its completion onto `done` (a done callback, so no scan of the window
    per result) and `pending` is the set still owed a result.
    """

    def __init__(self, submit, items, chunksize, window, ordered, submit_many=None, chunk_of=None, batches=None):
        self.submit, self.items, self.chunksize, self.window = submit, items, chunksize, window
        self.submit_many, self.chunk_of, self.batches = submit_many, chunk_of, batches
        #: whether its units are chunks (a chunk's value is a list of values, not one)
        self.chunks = chunksize > 1 or batches is not None
        self.more = True
        self.pending = collections.deque() if ordered else set()
        self.done = None if ordered else queue.SimpleQueue()
        #: `fill` tops the window up only while `more` and no more than this many are
        #: pending (its caller looks before it calls). A batch top-up sets it at each look
        #: at the window (the map reads its window only then, not per result); the other
        #: ways look at every result.
        self.low = 0 if submit_many is not None and batches is None else sys.maxsize

    def fill(self) -> None:
        if self.batches is not None:
            self._fill_batches()
            return
        if self.submit_many is not None:
            if self.more and len(self.pending) <= self.low:
                self._fill_batch()
            return
        while self.more and len(self.pending) < max(1, self.window()):
            self.more = self._feed()

    def _fill_batch(self) -> None:
        window = max(1, self.window())
        # Top up in runs of at least MAP_REFILL (or a quarter of a small window), or
        # whenever nothing is pending.
        self.low = window - min(MAP_REFILL, max(1, window // 4))
        free = window - len(self.pending)
        if not self.more or free <= 0 or (self.pending and len(self.pending) > self.low):
            return
        if self.chunksize == 1:
            payloads = list(itertools.islice(self.items, free))
        else:
            payloads = []
            while len(payloads) < free and (chunk := self._chunk()):
                payloads.append(chunk)
        self.more = len(payloads) == free
        if payloads:
            self._track_all(self.submit_many(payloads, self.chunksize > 1))

    def _fill_batches(self) -> None:
        """Top the window up with units of the size the map's measure calls for now."""
        batches = self.batches
        n = batches.size()
        slots = batches.slots
        window = max(1, min(self.window(), BATCH_AHEAD * slots, max(2 * slots, MAP_WINDOW_ITEMS // n)))
        low = window - min(MAP_REFILL, max(1, window // 4))
        free = window - len(self.pending)
        if not self.more or free <= 0 or (self.pending and len(self.pending) > low):
            return
        payloads = []
        while len(payloads) < free and (chunk := self._chunk(n)):
            payloads.append(chunk)
        self.more = len(payloads) == free
        if not payloads:
            return
        if self.submit_many is not None:
            self._track_all(self.submit_many(payloads, True))
        else:
            self._track_all([self.submit(payload, True) for payload in payloads])

    def _feed(self) -> bool:
        if self.chunksize == 1:
            for payload in self.items:
                self._track(self.submit(payload, False))
                return True
            return False
        chunk = self._chunk()
        if chunk:
            self._track(self.submit(chunk, True))
        return bool(chunk)

    def _chunk(self, n: int | None = None):
        """The next chunk's payload: up to `n` (default `chunksize`) items; empty (falsy) at the end."""
        items = list(itertools.islice(self.items, n or self.chunksize))
        if items and self.batches is not None:
            self.batches.saw(items[0])  # its calls' arguments' size bounds the batches' bytes
        return self.chunk_of(items) if items and self.chunk_of is not None else items

    def _track(self, future: Future) -> None:
        self._track_all((future,))

    def _track_all(self, futures) -> None:
        if self.done is None:
            self.pending.extend(futures)
            return
        for future in futures:
            self.pending.add(future)
            future.add_done_callback(self.done.put)

    def cancel_rest(self) -> None:
        for future in list(self.pending):
            future.cancel()


def _left(deadline):
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _ordered(role, feeder, chunksize, deadline):
    pending, chunks, batches = feeder.pending, feeder.chunks, feeder.batches
    try:
        while pending:
            left = None if deadline is None else _left(deadline)
            if chunks:
                yield from _results(role, pending.popleft(), True, left, batches)
            else:  # `_results` of a unit of one call, with no frame between
                yield hand_out([pending.popleft().result(left)])
            if feeder.more and len(pending) <= feeder.low:
                feeder.fill()
    finally:
        feeder.cancel_rest()


def _unordered(role, feeder, chunksize, deadline):
    pending = feeder.pending
    try:
        while pending:
            try:
                future = feeder.done.get(timeout=_left(deadline))
            except queue.Empty:
                raise TimeoutError(f"map_unordered over {role!r}: timed out with {len(pending)} unit(s) owed") from None
            pending.discard(future)
            yield from _results(role, future, feeder.chunks, 0, feeder.batches)
            if feeder.more and len(pending) <= feeder.low:
                feeder.fill()
    finally:
        feeder.cancel_rest()


def _results(role, future: Future, chunks: bool, left, batches: Batches | None = None) -> Iterable:
    """The values of one unit of a map, for its generator to `yield from`: one iterable
    of them (its value alone, or a chunk's list as it came back). A unit that did not
    solve raises its error here, and a chunk with a failed item yields the values before
    it and then raises that item's error: raised in the generator, it ends the
    iteration (and cancels what has not started), as the unit's own error does.
    Each value is let go of as it is handed out (`fleet._chunk.hand_out`), as
    ProcessPoolExecutor's map does: a result the caller dropped is freed at once.
    A chunk's value is ``(values, failures, seconds)``: its calls' run in the worker is
    told to `batches`, when the map sizes its own."""
    if not chunks:
        return (hand_out([future.result(left)]),)
    exc = future.exception(left)
    if exc is not None:
        raise exc
    chunk = future.result()
    values, failures = chunk[0], chunk[1]
    if batches is not None and len(chunk) > 2:
        batches.ran(chunk[2], len(values))
        if values:
            batches.returned(values[0])  # its calls' results' size bounds the batches' bytes too
    del chunk
    return _upto_failure(role, values, failures) if failures else (hand_out(values),)


def _upto_failure(role, values: list, failures: dict):
    """A chunk's values before its first failed item (as one list), then that item's error."""
    first = min(failures)
    if first:
        yield hand_out(values[:first])
    _item(role, *failures[first])


def with_progress(results: Iterator, total: int | None, what: str) -> Iterator:
    """`results` with a tqdm progress bar (one tick per item; `total` when the input
    has a length), as mpire users expect from ``map(..., progress_bar=True)``."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        raise ImportError("map(progress=True) draws its bar with tqdm: pip install 'fleet[progress]'") from None
    return _ticking(results, tqdm(total=total, desc=what, unit="item"))


def _ticking(results, bar):
    try:
        for value in results:
            bar.update()
            yield value
    finally:
        bar.close()
        close = getattr(results, "close", None)
        if close is not None:
            close()  # leaving early cancels what has not started, as without a bar


def length_of(iterable) -> int | None:
    """len(iterable), or None for an iterable without one (a generator)."""
    try:
        return len(iterable)
    except TypeError:
        return None


def _item(role: str, status: int, value):
    """Raise the error of a chunk item that did not solve."""
    if status == M.ST_SUPPRESSED:
        raise error_for(0, role, Outcome(SUPPRESSED, None, value))
    if status == M.ST_RESULT_ERROR:  # its value could not be pickled in the worker
        raise error_for(0, role, Outcome(FAILED, Reason.RESULT_ERROR, value))
    text, original = handler_error(*value)  # rebuilt here, under the codec's guard
    raise unit_exception(0, role, Outcome(FAILED, Reason.HANDLER_ERROR, text), original)
