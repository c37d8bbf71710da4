"""`fleet.Fleet`: the embedded fleet, a `concurrent.futures.Executor`.

    with fleet.Fleet.from_config("/etc/fleet/app.toml") as f:
        fut = f.submit("resolve", {"path": p})
        for result in f.map("resolve", paths, chunksize=64):
            ...

It drops in where a ProcessPoolExecutor was, with roles instead of functions: the
handler for each role is named in config (``module:function``) and receives a
`fleet.Unit`. Every unit gets exactly one outcome; a unit that did not solve raises
from its future by one rule (`fleet.rules.raised`): a handler's own exception as
itself, with the worker's traceback as its cause; otherwise `UnitFailed` /
`UnitSuppressed` (both carry the outcome). For ProcessPoolExecutor's own face (a
function per call), see `fleet.Executor` (fleet.api.pool).
"""
from __future__ import annotations

import collections
import itertools
import os
import queue
import time
from concurrent.futures import Executor, Future
from typing import Callable, Iterable, Iterator

from fleet._chunk import hand_out
from fleet.shm import messages as M
from fleet.runtime.codec import handler_error
from fleet.runtime.config import FleetConfig, load_config
from fleet.runtime.facade import LoopOperations
from fleet.rules.errors import ConfigError
from fleet.rules.ledger import abort_process
from fleet.rules.outcomes import FAILED, SUPPRESSED
from fleet.rules.raised import unit_exception
from fleet.rules.vocab import Reason
from fleet.rules.unit import Outcome, error_for

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


class Fleet(Executor):
    """A running fleet embedded in this process. Build it with `from_config`."""

    def __init__(self, config: FleetConfig, *, on_fuse=abort_process, cpus=None, admission_clock=None,
                 admission_rng=None, host=None):
        """`admission_clock`: the provider admission's clock (``wall()``, ``mono()``; e.g.
        ``admission.ScaledClock(600)`` replays a day in minutes, ``admission.ManualClock``
        is stepped by hand); `admission_rng`: its ``random.Random`` (Thompson sampling);
        `host`: the OS and clock the supervisor uses (`fleet.host.system.Host`; tests pass one
        with a fake clock)."""
        from fleet.runtime.loop import Supervisor

        self.config = config
        self._sup = Supervisor(config, mode="embedded", on_fuse=on_fuse, cpus=cpus, admission_clock=admission_clock,
                               admission_rng=admission_rng, host=host).start()
        #: The operator ops, each a command on the fleet's loop: the façade fleetd's control
        #: ops run against (`fleet.runtime.facade.Operations`; ``drain``, ``cancel`` and the
        #: rest). The methods below are the user's names for some of them.
        self.operations = LoopOperations(self._sup)

    @classmethod
    def from_config(cls, source=None, *, env=None, **kwargs) -> "Fleet":
        """Boot a fleet from a TOML path, a dict, or a FleetConfig (FLEET_* env applies).

        Raises ConfigError (bad config), BootRefused (the quota cannot host it: see
        its exit_code), TableInUse (a live fleet of that name runs already).
        """
        config = source if isinstance(source, FleetConfig) else load_config(source, env=os.environ if env is None else env)
        return cls(config, **kwargs)

    @property
    def name(self) -> str:
        return self._sup.name

    @property
    def plan(self):
        return self._sup.plan

    @property
    def layout(self):
        return self._sup.layout

    # --- Executor ---------------------------------------------------------------------
    def submit(self, role: str, payload=None, /, *, key=None, lane=None, priority: int = 0, timeout=None,
               request_id=None, route=None, severity=None, pinned: bool = False, parent=None, tag=None,
               age: float = 0.0, block: bool = True, block_timeout: float | None = None) -> Future:
        """Queue one unit for `role`; returns its Future.

        When the role's queue is at its bound (`queue_bound`, units waiting for admission
        included), submit waits for room, as ProcessPoolExecutor's caller never notices a
        bound: at most `block_timeout` seconds (None: as long as it takes), or not at all
        with ``block=False``. `timeout` is the unit's own run time limit, not this wait.

        A unit that calls a provider passes ``route=fleet.Route(model, provider,
        credential=None)``: the provider admission (docs/admission.md) starts
        it now, moves it to a declared alternative, or holds it while its pool backs off
        or is closed. Its handler calls ``unit.route``, the route admission chose.
        `severity` (a declared severity name: urgency inside the lane), `pinned` (never
        move: wait for this route), `parent` (the id of a unit running in this fleet that
        delegated this one: admitted on its lane through a backoff, never through a
        closure; a unit that is not running fails the future with BadUnit, nothing
        counted), `tag` (pins may name it) and `age` (seconds the unit waited already,
        elsewhere or before a restart: its urgency counts from then) need a route.

        A unit its provider refuses (the handler raises ``fleet.Refused``) is not lost:
        it waits out the refusal (a backoff, a closure) and is admitted again, on an
        alternative when one admits, so its handler may run more than once. It fails
        ``Refused`` only past its lane's limit (``max_refusals``, ``refusal_deadline``).
        Once it has run it counts as running: it can no longer be cancelled.

        Raises (nothing queued): UnknownRoleError, BadUnit (also: a route outside the
        declared catalog, one the lane's marks exclude, an unknown severity),
        PayloadTooLarge, PayloadUnpicklable, QueueFull (the queue stayed full: ``block=False``,
        or `block_timeout` passed), RoleStopped, FleetClosed (after shutdown). A submit
        racing `shutdown` from another thread raises FleetClosed or returns a future like
        any other: its unit is in the ledger and ends with its own outcome (solved, or
        UnitFailed with reason ``Shutdown`` when the fleet closed before it was queued).
        """
        return self._sup.submit(role, payload, key=key, lane=lane, priority=priority, timeout=timeout,
                                request_id=request_id, route=route, severity=severity, pinned=pinned, parent=parent,
                                tag=tag, age=age, block=block, block_timeout=block_timeout)

    def map(self, role: str, iterable: Iterable, *, chunksize: int = 1, timeout: float | None = None,
            lane=None, progress: bool = False) -> Iterator:
        """Results of `role`'s handler over `iterable`, in order.

        With chunksize > 1 each chunk of items is one unit (one outcome in the ledger).
        A failed or suppressed item raises its error (`fleet.rules.raised`: the
        handler's own exception, or UnitFailed / UnitSuppressed) when the iteration
        reaches it. `timeout` bounds the whole iteration (TimeoutError).
        The iterable is read lazily, at most a window of units (`map_window`:
        MAP_WINDOW, or fewer for a smaller queue bound or big chunks) ahead of the
        results taken: a generator of any length maps in bounded memory. For
        results as they complete, see `map_unordered`. ``progress=True`` draws a tqdm
        progress bar (`with_progress`; off by default).
        """
        return self._map(role, iterable, chunksize, timeout, lane, ordered=True, progress=progress)

    def map_unordered(self, role: str, iterable: Iterable, *, chunksize: int = 1, timeout: float | None = None,
                      lane=None, progress: bool = False) -> Iterator:
        """Results of `role`'s handler over `iterable` as their units complete, the way
        `multiprocessing.Pool.imap_unordered` hands them out: a slow item does not hold
        back the items behind it. The items of one chunk come out together, in order.

        Same bounded window as `map` (at most that many units submitted ahead; the
        iterable is read lazily, so an endless generator is fine). A unit that did not
        solve raises its UnitFailed / UnitSuppressed when its result comes up, which
        ends the iteration (units not yet started are cancelled). `timeout` bounds the
        whole iteration (TimeoutError). ``progress=True``: a progress bar, as for `map`.
        """
        return self._map(role, iterable, chunksize, timeout, lane, ordered=False, progress=progress)

    def _map(self, role, iterable, chunksize, timeout, lane, ordered: bool, progress: bool = False,
             total: int | None = None, chunk_of: Callable[[list], object] | None = None) -> Iterator:
        sup = self._sup
        results = map_units(
            lambda payload, chunk: sup.submit(role, payload, lane=lane, chunk=chunk),
            role, iterable, chunksize=chunksize, timeout=timeout, window=lambda: self._window(role, chunksize),
            ordered=ordered,
            submit_many=lambda payloads, chunk: sup.submit_many(role, payloads, lane=lane, chunk=chunk),
            chunk_of=chunk_of,
        )
        if not progress:
            return results
        return with_progress(results, length_of(iterable) if total is None else total, role)

    def _window(self, role, chunksize: int) -> int:
        spec = self._sup.roles[role]  # read at each look at the window: a reload may change the bound
        return map_window(chunksize, spec.queue_bound, spec.slots)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking units. Queued units still run unless cancel_futures (then they are
        cancelled: outcome failed/Cancelled). wait=True blocks until every unit has its
        outcome and the workers and shared segments are gone."""
        self._sup.shutdown(wait=wait, cancel_futures=cancel_futures)

    # --- views ----------------------------------------------------------------------------
    def status(self) -> dict:
        """What `fleetctl status --json` shows for this fleet, plus ``admission``: the provider
        admission's read model (per bulkhead and per lane x bulkhead rows, closures, the
        starving list, units waiting with their reason and until-when; reference 000 §10)."""
        return self.operations.status()

    def reload(self, source=None, *, env=None) -> dict:
        """Load the config again (a path, dict or FleetConfig) and apply what can change live:
        posture policy, queue bounds, the provider catalog. Returns ``applied`` and
        ``needs_restart``. A config that fails to load raises ConfigError and changes nothing;
        when it is the ``[admission]`` section, the last good catalog stays and the
        admission's ``policy_error`` says why. A config this host could not boot (a budget
        over the quota, ...) raises its boot refusal (BootRefused) and changes nothing."""
        if source is None:
            source = self.config.source if self.config.source not in (None, "<dict>") else None
        try:
            config = source if isinstance(source, FleetConfig) else load_config(
                source, env=os.environ if env is None else env)
        except ConfigError as exc:
            if str(exc.path).startswith("admission"):
                self.operations.admission_reload_refused(str(exc))
            raise
        return self.operations.reload(config)

    def admission_close(self, pool: str, until: float, message: str = "") -> dict:
        """Close a provider (``"provider"``) or one key (``"provider/credential"``) until
        `until` (UTC epoch seconds). BadPool for an unknown pool or a time not in the future."""
        return self.operations.admission_close(pool, until, message)

    # -- the provider admission's coordinator API (reference 000 §9): questions, nothing is seated.
    # Named admission_* (as the control ops): `plan` is the fleet's placement plan.
    def admission_allowance(self, lane: str | None) -> int | None:
        """None (start everything) unless every route `lane`'s work asks for is held back by a
        live refusal with no admitting alternative: then 0 (hold the lane's fan-out)."""
        return self.operations.admission_allowance(lane)

    def admission_plan(self, lane: str | None, route, wanted: int, pinned: bool = False) -> int:
        """How many of `wanted` new units on `route` (a `fleet.Route`) in `lane` would start now,
        pins and alternatives honoured; nothing is submitted or seated. Raises BadPlan (a
        route outside the catalog, `wanted` not a whole number >= 0, bad types)."""
        return self.operations.admission_plan(lane, route, wanted, pinned)

    def admission_starving(self) -> list[dict]:
        """Closed providers or keys with work waiting (``kind: provider-closed``) first, then
        hard-pinned units waiting past ``starved_after`` (``kind: pinned``)."""
        return self.operations.admission_starving()

    def admission_reopen(self, pool: str) -> dict:
        """Reopen a closed provider or key (a topped-up key); ``reopened``: was it closed."""
        return self.operations.admission_reopen(pool)

    def report_budget(self, provider: str, spent: float, limit: float | None = None) -> dict:
        """The provider's daily budget reading (000 §8: read and shown, never reserved): `spent`
        today against its daily `limit` (None: none), shown on every bulkhead of `provider`;
        at the limit the provider closes until the next UTC midnight. Raises BadBudget
        (nothing changed) for an unknown provider or an amount that is not finite and >= 0."""
        return self.operations.admission_budget(provider, spent, limit)

    def ledger(self) -> dict:
        """submitted, solved, suppressed, failed (+ in flight and failures by reason)."""
        return self.operations.ledger()

    def posture_show(self) -> dict:
        return self.operations.posture_show()

    def posture_set(self, **patch) -> dict:
        return self.operations.posture_set(patch)

    def posture_release(self, cause: str) -> dict:
        """Release a sticky posture cause: ``"lane-death"`` (held since a worker died) or
        ``"operator"``. Returns the posture view with ``released`` (was it held). The
        posture turns Nominal once its exit window is clean and no other cause holds it.
        An unknown cause raises PostureCauseError and changes nothing."""
        return self.operations.posture_release(cause)

    def __repr__(self) -> str:
        return f"<Fleet {self.name!r} binding={self._sup.plan.binding} seats={len(self._sup.layout.seats)}>"


def map_units(submit: Callable[[object, bool], Future], role: str, iterable: Iterable, *, chunksize: int = 1,
              timeout: float | None = None, window: Callable[[], int] = lambda: MAP_WINDOW,
              ordered: bool = True, submit_many: Callable[[list, bool], list] | None = None,
              chunk_of: Callable[[list], object] | None = None) -> Iterator:
    """`Executor.map` over units, shared by the embedded `Fleet` and the service-mode client.

    ``submit(payload, chunk)`` queues one unit (``chunk=True``: the payload is a list
    of items run as one unit, whose value is a list of ``(status, value)``) and
    returns its Future. At most ``window()`` units are kept submitted ahead of the
    caller, so the iterable is read at most ``window() * chunksize`` items ahead of
    the results handed out: a generator of any length maps in bounded memory. The
    first window is submitted before this returns, so a refusal (e.g. QueueFull, an
    unknown role) raises here rather than at the first ``next()``. Leaving the
    iteration early (``close()``, ``break``, an error) cancels the units not yet
    started; each still gets its one outcome.

    ``ordered=False`` hands results out as their units complete (the items of one
    chunk stay in their order), as `multiprocessing.Pool.imap_unordered` does.

    ``submit_many(payloads, chunk)``, when given, queues a list of units at once and
    returns their Futures: the window is then topped up in batches (once `MAP_REFILL`
    units, or a quarter of the window, are free), not one unit per result taken.

    ``chunk_of(items)``, when given, makes a chunk's payload of its list of items (any
    sized object its role's worker runs as a chunk: the Executor's `Calls`).
    """
    if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
        raise ValueError(f"chunksize must be an int >= 1, got {chunksize!r}")
    deadline = None if timeout is None else time.monotonic() + timeout
    feeder = _Feeder(submit, iter(iterable), chunksize, window, ordered, submit_many, chunk_of)
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

    def __init__(self, submit, items, chunksize, window, ordered, submit_many=None, chunk_of=None):
        self.submit, self.items, self.chunksize, self.window = submit, items, chunksize, window
        self.submit_many, self.chunk_of = submit_many, chunk_of
        self.more = True
        self.pending = collections.deque() if ordered else set()
        self.done = None if ordered else queue.SimpleQueue()
        #: a batch top-up waits until no more than this many are pending (set at each
        #: look at the window: the map reads its window only then, not per result)
        self.low = 0

    def fill(self) -> None:
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
            for future in self.submit_many(payloads, self.chunksize > 1):
                self._track(future)

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

    def _chunk(self):
        """The next chunk's payload: up to `chunksize` items; empty (falsy) at the end."""
        items = list(itertools.islice(self.items, self.chunksize))
        return self.chunk_of(items) if items and self.chunk_of is not None else items

    def _track(self, future: Future) -> None:
        if self.done is None:
            self.pending.append(future)
        else:
            self.pending.add(future)
            future.add_done_callback(self.done.put)

    def cancel_rest(self) -> None:
        for future in list(self.pending):
            future.cancel()


def _left(deadline):
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _ordered(role, feeder, chunksize, deadline):
    pending = feeder.pending
    try:
        while pending:
            yield from _results(role, pending.popleft(), chunksize, _left(deadline))
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
            yield from _results(role, future, chunksize, 0)
            feeder.fill()
    finally:
        feeder.cancel_rest()


def _results(role, future: Future, chunksize: int, left) -> Iterable:
    """The values of one unit of a map, for its generator to `yield from`: one iterable
    of them (its value alone, or a chunk's list as it came back). A unit that did not
    solve raises its error here, and a chunk with a failed item yields the values before
    it and then raises that item's error: raised in the generator, it ends the
    iteration (and cancels what has not started), as the unit's own error does.
    Each value is let go of as it is handed out (`fleet._chunk.hand_out`), as
    ProcessPoolExecutor's map does: a result the caller dropped is freed at once."""
    if chunksize == 1:
        return (hand_out([future.result(left)]),)
    exc = future.exception(left)
    if exc is not None:
        raise exc
    values, failures = future.result()
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
    text, original = handler_error(*value)  # rebuilt here, under the codec's guard
    raise unit_exception(0, role, Outcome(FAILED, Reason.HANDLER_ERROR, text), original)
