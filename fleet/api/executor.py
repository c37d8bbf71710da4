"""`fleet.Executor`: ProcessPoolExecutor's face on a fleet. Change the import line:

    from fleet import Executor as ProcessPoolExecutor

    with ProcessPoolExecutor() as ex:
        print(ex.submit(pow, 2, 8).result())
        print(list(ex.map(pow, range(10), range(10), chunksize=4)))

It is an embedded `fleet.Fleet` (the same loop, rings, slot FSM, ledger and budget)
with one role, ``call``, whose handler (`fleet.worker.calls.call`) runs the call a
unit carries, ``(fn, args, kwargs)``, pickled by reference as ProcessPoolExecutor
pickles it, or by name (`fleet.worker.calls.call_payload`); a chunk of `map` travels
as one `fleet.worker.calls.Calls` (the function once, by name where it can, then each
call's arguments). The fleet is booted with ``[budget] loop = "priority"``
(`fleet.rules.budget`): every whole core of the detected quota (cgroup, cpuset,
affinity) is a worker's, and the supervisor's loop keeps its place by priority.
docs/executor.md says what is the same as ProcessPoolExecutor, what fleet adds and
what differs, and why.
"""
from __future__ import annotations

import functools
import itertools
import logging
import math
import os
from concurrent.futures import Executor as _StdExecutor
from concurrent.futures import Future

from fleet.rules.limits import DEFAULT_LOOKAHEAD
from fleet.worker.calls import call_payload
from fleet.worker.main_guard import check_not_importing_main

TYPE_CHECKING = False  # typing's own flag, without typing's import (~2 ms before the launch)
if TYPE_CHECKING:
    from multiprocessing.context import BaseContext
    from typing import Callable, Iterator

    from fleet.api.fleet import Fleet

# This module stays light (neither the runtime nor fleet's rules, nor multiprocessing:
# tests/api/test_executor_start.py pins it): `Executor()` launches the fork server first,
# and imports the runtime only then, so that the fork server's start (its interpreter, its
# modules, the kernels) runs on the other core while this process imports. Each module
# imported here would delay the fork server's launch, which is the first result's path.

log = logging.getLogger(__name__)

#: The one role, and its handler.
ROLE = "call"
HANDLER = "fleet.worker.calls:call"
#: The role's queue bound: ProcessPoolExecutor's queue has none; fleet's is the most
#: config allows, so submit waits for room only past ten million units waiting.
QUEUE_BOUND = 10_000_000
#: The most calls sent ahead to a busy worker (the role default). How many are sent
#: follows the calls' measured run time (`fleet.rules.pace`): microsecond calls are fed
#: this deep, which keeps a worker busy without a round trip through the parent's loop
#: per call; calls longer than a round trip one ahead; long calls none. A call sent
#: ahead counts as started (cancel, `shutdown(cancel_futures=True)`, Ctrl-C and leaving
#: a `map` early wait for it), so what waits beyond the running calls is about a round
#: trip, or a call per worker: never more than ProcessPoolExecutor's call queue
#: (max_workers + 1 calls) holds.
MAX_LOOKAHEAD = DEFAULT_LOOKAHEAD


#: The message ProcessPoolExecutor's submit raises after shutdown (a plain RuntimeError there too).
AFTER_SHUTDOWN = "cannot schedule new futures after shutdown"

_names = itertools.count(1)
#: Every executor's fleet name starts so, and then says its process: ``executor-<pid>-<n>``.
NAME_PREFIX = "executor-"


def quota_cores(limit=None) -> int:
    """The whole cores of the quota this process may use (cgroup quota, cpuset,
    affinity: `fleet.host.cgroup.effective_cpus`, never the host's CPU count on a
    smaller container), at least 1. `limit`: that detection's result, when it was made."""
    if limit is None:
        from fleet.host.system import Host

        limit = Host().effective_cpus()
    return max(1, math.floor(limit.cpus))


class Executor(_StdExecutor):
    """A `concurrent.futures.Executor` with ProcessPoolExecutor's constructor and methods.

    Args:
        max_workers: worker processes (default: every whole core of the quota). More
            than the quota has are capped to it, with one WARNING (logger
            ``fleet.api.executor``) naming the quota and where it was read;
            ``oversubscribe=True`` runs them all anyway.
        mp_context: accepted for ProcessPoolExecutor's signature and moot: fleet's
            workers are forks of its own zygote whatever the start method (a function
            of a script's ``__main__`` still works: the workers import it as spawn
            does). Must be None or a multiprocessing context.
        initializer, initargs: called in each worker process before its first call
            (also in every worker started later). If it raises, the executor is
            broken: pending and later calls raise BrokenProcessPool.
        max_tasks_per_child: calls (a chunk of `map` counts once) a worker runs
            before it is replaced by a fresh one (default: no limit).
        max_rss_mib: a worker whose resident memory is above this many MiB after a
            call is replaced by a fresh one, its call's result delivered first
            (default: never; fleet's own, a role's `max_rss_mib`; docs/executor.md).
        oversubscribe: let `max_workers` exceed the quota's cores (fleet's own
            opt-in; not a ProcessPoolExecutor argument).
        max_parcel_bytes: most bytes of arguments held beside the rings at once (those
            too large for a ring travel in shared memory until their call ends); a
            submit waits for room when they would pass it, and one argument larger than
            it is PayloadTooLarge. Default: a quarter of physical memory (fleet's own;
            `limits.max_parcel_bytes` of a fleet's config).

    Raises:
        ValueError: max_workers < 1, max_tasks_per_child < 1, max_rss_mib out of range.
        TypeError: an initializer that is not callable, a max_tasks_per_child or
            max_rss_mib that is not an int, an mp_context that is not a multiprocessing context.
        PayloadUnpicklable: the initializer or its initargs cannot be pickled.
        BootRefused: the host cannot run a worker (below 1 CPU).
    """

    def __init__(self, max_workers: int | None = None, mp_context: BaseContext | None = None,
                 initializer: Callable | None = None, initargs: tuple = (), *,
                 max_tasks_per_child: int | None = None, oversubscribe: bool = False,
                 max_parcel_bytes: int | None = None, max_rss_mib: int | None = None):
        from fleet.runtime import collector

        with collector.paused():  # the boot's imports and objects, without collections (fleet.runtime.collector)
            check_not_importing_main("fleet.Executor")  # the workers import __main__: no executor made there
            _check_args(max_workers, mp_context, initializer, max_tasks_per_child)
            _check_rss(max_rss_mib)
            from fleet.runtime import zygote_launch

            name = f"{NAME_PREFIX}{os.getpid()}-{next(_names)}"
            launched = zygote_launch.launch(name)  # first: see the note at the top of this module
            try:
                self._boot(name, launched, max_workers, mp_context, initializer, initargs, max_tasks_per_child,
                           oversubscribe, max_parcel_bytes, max_rss_mib)
            except BaseException:
                launched.stop()  # idempotent: one its boot already stopped stays stopped
                raise

    def _boot(self, name, launched, max_workers, mp_context, initializer, initargs, max_tasks_per_child,
              oversubscribe, max_parcel_bytes, max_rss_mib) -> None:
        from admission.records import replace

        from fleet.api.fleet import Fleet
        from fleet.host.system import Host
        from fleet.rules.quota import detected_from
        from fleet.runtime.config import load_config
        from fleet.shm import parcels
        from fleet.shm.segments import reclaim_stale_of
        from fleet.worker.prepare import WorkerSetup

        limit = Host().effective_cpus()
        cores = quota_cores(limit)
        workers = cores if max_workers is None else max_workers
        over = workers > cores
        if over and not oversubscribe:
            # A warning: the program asked for more processes than it gets, and a user who
            # asked should not have to turn on INFO to learn why (ProcessPoolExecutor runs them all).
            log.warning("fleet.Executor: max_workers=%d is more than this process's CPU quota runs: %g CPUs, "
                        "from the %s; running %d worker process%s (pass oversubscribe=True to run %d)", workers,
                        limit.cpus, detected_from(limit), cores, "" if cores == 1 else "es", workers)
            workers, over = cores, False
        role = {"handler": HANDLER, "slots": workers, "queue_bound": QUEUE_BOUND, "lookahead": MAX_LOOKAHEAD}
        if max_rss_mib is not None:
            role["max_rss_mib"] = max_rss_mib
        if over:
            role["peak_cpus"] = workers  # forced pinned, oversubscribed: the plan says so (fleet.rules.plan)
        config = load_config({
            "fleet": {"name": name, "profile": "pinned" if over else "auto"},
            "budget": {"loop": "priority", "oversubscribe": over},  # over: the caller's own opt-in
            "roles": {ROLE: role},
            "limits": {} if max_parcel_bytes is None else {"max_parcel_bytes": max_parcel_bytes},
            # A map queues every call at once: the backlog is the caller's own doing, and a
            # script's stderr is no place for it (status and metrics still show it).
            "saturation": {"warn": False},
        }, env={})
        # An executor's name is never taken again, so no later boot would reclaim the segments
        # of one whose process was killed before its teardown: each boot sweeps them.
        reclaim_stale_of(NAME_PREFIX)
        parcels.sweep_orphans(NAME_PREFIX)  # and the parcels of those whose tables are gone
        setup = WorkerSetup.of_this_process(initializer=initializer, initargs=initargs, max_tasks=max_tasks_per_child)
        self._max_workers = workers
        self._max_tasks = max_tasks_per_child
        self._mp_context = mp_context
        self._shutdown = False
        self._fleet = Fleet(replace(config, workers=setup, paced=True), _launched=launched)
        self._sup = self._fleet._sup
        self._role_code = self._sup.roles.code(ROLE)

    # --- concurrent.futures.Executor ---------------------------------------------------------
    def submit(self, fn, /, *args, **kwargs) -> Future:
        """Run ``fn(*args, **kwargs)`` in a worker; returns its Future. `fn` and the
        arguments are pickled here (by reference for functions, as ProcessPoolExecutor
        does): one that cannot be pickled raises PayloadUnpicklable now, nothing queued.

        Raises also RuntimeError after shutdown, and BrokenProcessPool (`RoleBroken`)
        once the executor is broken (its initializer failed, or its workers kept dying)."""
        if self._shutdown:
            raise RuntimeError(AFTER_SHUTDOWN)
        try:
            return self._sup.submit_call(self._role_code, ROLE, call_payload(fn, args, kwargs))
        except _fleet_closed():
            raise RuntimeError(AFTER_SHUTDOWN) from None

    def map(self, fn, *iterables, timeout: float | None = None, chunksize: int | None = None,
            progress: bool = False) -> Iterator:
        """``fn(*args)`` for the items of `iterables` taken together (as the builtin
        map, shortest first), in order. With ``chunksize=n`` that many calls travel
        and run as one unit (1: each call its own, as ProcessPoolExecutor's default);
        without it, calls travel one by one until their length is measured, then in
        batches that run about 2 ms each (`fleet.rules.pace.Batches`; not with
        `max_tasks_per_child`, whose count is of units). A call's exception is raised when the iteration reaches
        it; `timeout` bounds the whole iteration (TimeoutError). The iterables are read
        lazily, a bounded window ahead of the results taken (`fleet.worker.mapping.map_units`),
        so a generator of any length maps in bounded memory. ``progress=True`` draws a
        tqdm progress bar."""
        return self._map(fn, iterables, timeout, chunksize, progress, ordered=True)

    def map_unordered(self, fn, *iterables, timeout: float | None = None, chunksize: int | None = None,
                      progress: bool = False) -> Iterator:
        """As `map`, but results come as their calls complete (a chunk's in its order),
        as ``multiprocessing.Pool.imap_unordered`` hands them out."""
        return self._map(fn, iterables, timeout, chunksize, progress, ordered=False)

    def _map(self, fn, iterables, timeout, chunksize, progress, ordered) -> Iterator:
        if self._shutdown:
            raise RuntimeError(AFTER_SHUTDOWN)
        from fleet.rules.pace import Batches
        from fleet.worker.calls import Calls, payloads
        from fleet.worker.mapping import length_of

        lengths = [length_of(i) for i in iterables] if progress else [None]
        total = None if None in lengths else min(lengths, default=0)
        star = len(iterables) != 1
        if chunksize is None:
            if self._max_tasks is None:
                # chunks sized as the calls turn out to run (fleet.rules.pace.Batches)
                items = zip(*iterables) if star else iterables[0]
                return self._fleet_map(items, 1, timeout, ordered, progress, total,
                                       functools.partial(Calls, fn, star=star), Batches(self._max_workers))
            chunksize = 1  # a worker's count of units is of calls: one call per unit
        if chunksize == 1:
            # one call per unit, as submit makes it (`calls.payloads`): no Python frame per
            # item on the caller's side of a map
            items = payloads(fn, zip(*iterables))
            chunk_of = None
        else:
            # a chunk travels as one Calls: fn once, then the items' arguments (one
            # iterable: each item is the argument; several: a tuple of one from each)
            items = zip(*iterables) if star else iterables[0]
            chunk_of = functools.partial(Calls, fn, star=star)
        return self._fleet_map(items, chunksize, timeout, ordered, progress, total, chunk_of)

    def _fleet_map(self, items, chunksize, timeout, ordered, progress, total, chunk_of, batches=None) -> Iterator:
        try:
            return self._fleet._map(ROLE, items, chunksize, timeout, None, ordered, progress, total, chunk_of,
                                    batches)
        except _fleet_closed():
            raise RuntimeError(AFTER_SHUTDOWN) from None

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more calls. With `cancel_futures`, calls not yet started are cancelled;
        the others finish (also with ``wait=False``, and at interpreter exit). `wait`:
        return once every call has its outcome and the workers are gone."""
        self._shutdown = True
        self._fleet.shutdown(wait=wait, cancel_futures=cancel_futures)

    # --- what ProcessPoolExecutor users read ------------------------------------------------------
    @property
    def fleet(self) -> Fleet:
        """The embedded fleet: its plan, layout, ledger and status."""
        return self._fleet

    @property
    def _broken(self):
        """False, or why the executor is broken (ProcessPoolExecutor's attribute)."""
        code = self._sup.roles.code(ROLE)
        if code not in self._sup.role_stops.view:
            return False
        return self._sup.role_stops.reasons.get(code, "its workers kept dying")

    def __repr__(self) -> str:
        return f"<fleet.Executor max_workers={self._max_workers} fleet={self._fleet.name!r}>"


def _fleet_closed() -> type:
    """`FleetClosed`, for an ``except`` clause, which evaluates it only when an exception
    is on its way: the runtime, loaded by then, holds it; this module does not import it."""
    from fleet.rules.unit import FleetClosed

    return FleetClosed


def _is_mp_context(value) -> bool:
    # multiprocessing is imported only for a context given (one was made with it)
    from multiprocessing.context import BaseContext

    return isinstance(value, BaseContext)


def _check_args(max_workers, mp_context, initializer, max_tasks_per_child) -> None:
    """ProcessPoolExecutor's argument checks, with its messages."""
    if max_workers is not None:
        if isinstance(max_workers, bool) or not isinstance(max_workers, int):
            raise TypeError(f"max_workers must be an int, got {max_workers!r}")
        if max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
    if mp_context is not None and not _is_mp_context(mp_context):
        raise TypeError(f"mp_context must be a multiprocessing context or None, got {mp_context!r}")
    if initializer is not None and not callable(initializer):
        raise TypeError("initializer must be a callable")
    if max_tasks_per_child is not None:
        if isinstance(max_tasks_per_child, bool) or not isinstance(max_tasks_per_child, int):
            raise TypeError("max_tasks_per_child must be an integer")
        if max_tasks_per_child <= 0:
            raise ValueError("max_tasks_per_child must be >= 1")


def _check_rss(max_rss_mib) -> None:
    """fleet's own keyword: an int in the range of a role's max_rss_mib (fleet.rules.ranges)."""
    if max_rss_mib is None:
        return
    if isinstance(max_rss_mib, bool) or not isinstance(max_rss_mib, int):
        raise TypeError(f"max_rss_mib must be an int (MiB) or None, got {max_rss_mib!r}")
    from fleet.rules.ranges import config_range

    why = config_range("roles.*.max_rss_mib").problem(max_rss_mib)
    if why:
        raise ValueError(f"max_rss_mib {why}")
