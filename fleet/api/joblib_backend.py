"""joblib's `Parallel` on a fleet: the joblib backend ``"fleet"``, registered on import.

    import joblib
    import fleet.api.joblib_backend  # noqa: F401  (registers the backend "fleet")

    with joblib.parallel_config(backend="fleet", n_jobs=-1):
        squares = joblib.Parallel()(joblib.delayed(pow)(i, 2) for i in range(1000))

joblib knows a backend of another package only through `joblib.register_parallel_backend`
(it reads no entry points), so importing this module is what makes the name known, as
``ray.util.joblib.register_ray()`` does for ray's.

How it runs:

* **One fleet per process** (`SharedFleet`): a `fleet.Executor` with every whole core of
  this process's CPU quota as a worker, booted by the first Parallel call that needs it
  and kept for the next ones (as joblib keeps its loky executor), shut down at
  interpreter exit or by `shutdown()`.
* **n_jobs** is how many of its workers one Parallel call keeps busy at once (`Window`):
  -1 (also the default, when neither Parallel nor parallel_config says) is the quota, -2
  one core fewer, and so on; an n_jobs above the quota is capped to it (a UserWarning,
  once); 1 runs in this process, as it does with every joblib backend.
* **Batches** are joblib's own, auto-batching included (`AutoBatchingMixin`, as joblib's
  loky backend): each batch is one call on the fleet.
* **Exceptions and aborts**: a batch's exception is raised as itself with the worker's
  traceback as its cause (the Executor's rule, `fleet.rules.raised`); when joblib aborts
  (a batch failed, a ``return_as="generator"`` consumer left early) the batches that have
  not started are cancelled.
* **Nesting**: a Parallel call inside a batch runs as it does under joblib's other process
  backends, on threads one level down and sequentially below that; a worker's BLAS and
  OpenMP pools get as many threads as the cores the worker is pinned to
  (`limit_inner_threads`).
"""
from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import warnings
from concurrent.futures import Future

import cloudpickle
import joblib
from joblib.parallel import AutoBatchingMixin, FallbackToBackend, ParallelBackendBase, SequentialBackend

# the Executor from its own module, not from the face: api/ stands below fleet/__init__.py (tests/test_rooms.py)
from fleet.api.executor import Executor, quota_cores
from fleet.rules.unit import PayloadUnpicklable

log = logging.getLogger(__name__)

#: The name `joblib.parallel_config(backend=...)` takes.
NAME = "fleet"


# --- the workers' thread pools ------------------------------------------------------------------
#: The variables joblib's process backends set in their workers to bound BLAS and OpenMP pools.
THREAD_VARS = tuple(ParallelBackendBase.MAX_NUM_THREADS_VARS)


def limit_inner_threads() -> None:
    """Each worker's initializer: its BLAS and OpenMP pools get as many threads as the cores
    the worker is pinned to, so a batch that calls numpy does not run several threads on
    one core (joblib's loky backend gives its workers ``cpu_count // n_jobs``). The pools
    already loaded (numpy's BLAS is) are limited through threadpoolctl when it is
    installed; the variables bound those loaded later. When the environment sets any of
    the variables, the user has chosen and the pools are left as they are.

    Never raises: an initializer that raises stops the fleet."""
    if any(var in os.environ for var in THREAD_VARS):
        return
    from fleet.host import seat_cpus

    cores = str(len(seat_cpus.budget_cpus()))  # the seat's cores, also while a contended worker is spread wider
    os.environ.update(dict.fromkeys(THREAD_VARS, cores))
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    try:
        threadpool_limits(limits=int(cores))
    except Exception:  # a library threadpoolctl cannot drive: the batch runs all the same
        log.warning("cannot limit the thread pools of worker %d", os.getpid(), exc_info=True)


# --- the fleet ------------------------------------------------------------------------------
class SharedFleet:
    """The one fleet this process's Parallel calls run on: booted on first use, booted again
    after it broke, was shut down, or belongs to the parent of a forked process."""

    def __init__(self):
        self._lock = threading.Lock()
        self._executor: Executor | None = None
        self._pid = 0

    def executor(self) -> Executor:
        with self._lock:
            ex = self._executor
            # a forked child inherits the object but not the fleet's loop: it needs its own
            if ex is None or self._pid != os.getpid() or ex._shutdown or ex._broken:
                ex = self._executor = Executor(initializer=limit_inner_threads)
                self._pid = os.getpid()
            return ex

    def shutdown(self, wait: bool = True) -> None:
        with self._lock:
            ex, self._executor = self._executor, None
        if ex is not None and self._pid == os.getpid():
            ex.shutdown(wait=wait)


SHARED = SharedFleet()


def shutdown(wait: bool = True) -> None:
    """Shut down the fleet the backend keeps between Parallel calls (the next call boots a
    new one). `wait`: return once every batch it runs has ended and its workers are gone.
    Interpreter exit does this by itself."""
    SHARED.shutdown(wait=wait)


# --- one Parallel call's share of it -----------------------------------------------------------
class Window:
    """At most `width` batches of one Parallel call on the fleet at once; the others wait
    here, in the order joblib submitted them, and start as running ones end. So n_jobs is
    the call's concurrency whatever the fleet's size, and an abort has little out of
    reach: the waiting batches never reached the fleet.

    Every batch gets exactly one outcome on the future `submit` returned (the fleet's
    outcome, or the error that kept it from the fleet, or cancelled by `abort`), and
    joblib's callback runs on it; nothing here raises into joblib's dispatching, which runs
    on the fleet's loop thread once the first batches end."""

    def __init__(self, executor: Executor, width: int):
        self._executor = executor
        self.width = width
        self._lock = threading.Lock()
        self._running: dict[Future, Future] = {}  # the fleet's future -> the batch's (ours)
        self._waiting: collections.deque = collections.deque()  # (batch, our future)
        self._by_value = _main_is_unimportable()

    def submit(self, batch, callback) -> Future:
        ours = Future()
        ours.add_done_callback(callback)
        with self._lock:
            if len(self._running) >= self.width:
                self._waiting.append((batch, ours))
                return ours
            self._running[ours] = ours  # the slot, held until the fleet's future replaces it
        self._start(batch, ours)
        return ours

    def abort(self) -> None:
        """Cancel the batches that have not started: the waiting ones, and those on the fleet
        it has not started (a call a worker runs, or that was sent ahead to one, goes on;
        so does a batch this very moment being handed to the fleet)."""
        with self._lock:
            waiting, self._waiting = self._waiting, collections.deque()
            on_fleet = [theirs for theirs, ours in self._running.items() if theirs is not ours]
        for _batch, ours in waiting:
            ours.cancel()
        for theirs in on_fleet:
            theirs.cancel()

    def _start(self, batch, ours: Future) -> None:
        """Hand `batch` to the fleet in the slot `ours` holds. A batch the fleet refuses
        ends with the refusal, and the next waiting batch takes the slot (a loop, not a
        recursion: when the fleet was shut down under the call, every waiting batch fails so)."""
        while True:
            try:
                theirs = self._submit(batch)
            except BaseException as exc:  # unpicklable, or the fleet shut down under the call
                nxt = self._release(ours)
                ours.set_exception(exc)
                if nxt is None:
                    return
                batch, ours = nxt
                continue
            with self._lock:
                del self._running[ours]
                self._running[theirs] = ours
            theirs.add_done_callback(self._finished)
            return

    def _submit(self, batch) -> Future:
        """The batch on the fleet, pickled as the Executor pickles calls (by reference, with
        numpy's buffers out of band); what plain pickle refuses (a lambda, a function made
        inside another), or everything when the workers cannot import ``__main__`` (an
        interactive session), travels by value through cloudpickle, as under loky. What
        neither can pickle raises PayloadUnpicklable, naming why."""
        if not self._by_value:
            try:
                return self._executor.submit(batch)
            except PayloadUnpicklable:
                pass
        return self._executor.submit(ByValue(batch))

    def _finished(self, theirs: Future) -> None:
        with self._lock:
            ours = self._running[theirs]
        nxt = self._release(theirs)
        if nxt is not None:  # the waiting go first: joblib, told of this end, submits another
            self._start(*nxt)
        if theirs.cancelled():
            ours.cancel()
        elif theirs.exception() is not None:
            ours.set_exception(theirs.exception())
        else:
            ours.set_result(theirs.result())

    def _release(self, key: Future):
        """Free `key`'s slot; the next waiting ``(batch, future)``, now holding it, or None."""
        with self._lock:
            del self._running[key]
            if not self._waiting:
                return None
            batch, ours = self._waiting.popleft()
            self._running[ours] = ours
            return batch, ours


def _main_is_unimportable() -> bool:
    """True in an interactive session (a REPL, ``python -c``, a notebook): the workers import
    a script's ``__main__`` to find its functions, and there is no script to import."""
    return getattr(sys.modules.get("__main__"), "__file__", None) is None


class ByValue:
    """A batch that travels pickled by cloudpickle; unpickled in the worker, it is the batch again."""

    def __init__(self, batch):
        self.batch = batch

    def __reduce__(self):
        return cloudpickle.loads, (cloudpickle.dumps(self.batch),)


# --- the backend ----------------------------------------------------------------------------
class FleetBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib's backend ``"fleet"``: Parallel's batches as calls on this process's fleet."""

    #: n_jobs when neither Parallel nor parallel_config says: the whole budget (choosing this
    #: backend is choosing the fleet; dask's backend does the same with its cluster)
    default_n_jobs = -1
    supports_retrieve_callback = True  # results come through the futures' callbacks (so do
    # return_as="generator" and Parallel's timeout, which joblib keeps on its side)
    uses_threads = False
    supports_sharedmem = False

    def __init__(self, nesting_level=None, inner_max_num_threads=None, **backend_kwargs):
        if backend_kwargs:
            raise TypeError(f"the fleet backend takes no parameters; got {sorted(backend_kwargs)}")
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        self._window: Window | None = None

    def effective_n_jobs(self, n_jobs) -> int:
        """n_jobs within the whole cores of this process's CPU quota: -1 is all of them,
        -2 one fewer, and so on; more than there are is capped (a UserWarning, once)."""
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        cores = quota_cores()
        wanted = n_jobs if n_jobs > 0 else cores + 1 + n_jobs
        if wanted > cores:
            _say_capped(n_jobs, cores)
        return max(1, min(wanted, cores))

    def configure(self, n_jobs=1, parallel=None, prefer=None, require=None, **memmap_kwargs) -> int:
        # memmap_kwargs: joblib's arguments for its memmapping pools (max_nbytes, mmap_mode,
        # temp_folder, ...), passed to every backend; no array is memory-mapped here: an
        # array travels in its batch's payload, as an Executor call's arguments do.
        n = self.effective_n_jobs(n_jobs)
        if n == 1:
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        self.parallel = parallel
        self._window = Window(SHARED.executor(), n)
        return n

    def submit(self, func, callback=None) -> Future:
        return self._window.submit(func, callback or _nothing)

    def retrieve_result_callback(self, future: Future):
        return future.result()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        # The fleet is shared and stays up: what a managed Parallel submits next still runs.
        if self._window is not None:
            self._window.abort()

    def terminate(self) -> None:
        self._window = None
        self.reset_batch_stats()


def _nothing(_future) -> None:
    pass


_capped_said: set[tuple[int, int]] = set()


def _say_capped(n_jobs: int, cores: int) -> None:
    """A warning, as joblib warns when it runs fewer jobs than asked (once per n_jobs and
    quota: a program that runs many Parallel calls is told once)."""
    if (n_jobs, cores) not in _capped_said:
        _capped_said.add((n_jobs, cores))
        warnings.warn(f"joblib backend {NAME!r}: n_jobs={n_jobs} is more than the {cores} whole cores of this "
                      f"process's CPU quota; running {cores} batches at once", UserWarning, stacklevel=2)


joblib.register_parallel_backend(NAME, FleetBackend)
