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
function per call), see `fleet.Executor` (fleet.api.executor).
"""
from __future__ import annotations

import functools
import os
from concurrent.futures import Executor, Future
from typing import Callable, Iterable, Iterator

from fleet.runtime import collector
from fleet.runtime.config import FleetConfig, load_config
from fleet.runtime.submit import WAIT_ARGS, UNIT_ARGS, check_unit_args, submit_signature
from fleet.rules.errors import ConfigError
from fleet.rules.ledger import abort_process
from fleet.worker.main_guard import check_not_importing_main


class _OpsOnFirstLook(type):
    """`Fleet`'s type: its operator methods, one per op with ``fleet = True`` (``status``,
    ``ledger``, ``posture_*``, ``drain``, ``admission_*``, ...), are made from the op
    registry (`fleet.service.control.ops.OPS.fleet_methods`) at the first look for a name
    the class does not have, not when this module is imported: the registry (every op's
    modules, the wire's checks, fleetctl's halves) is ~17 ms of a boot that may never use
    it, an Executor's first result among them. Once made, they are the class's own
    methods: `dir`, `help` and `inspect.signature` see them as written ones."""

    def __getattr__(cls, name: str):
        if name.startswith("__") or not _make_op_methods():
            raise AttributeError(f"type object {cls.__name__!r} has no attribute {name!r}")
        return type.__getattribute__(cls, name)

    def __dir__(cls):
        _make_op_methods()
        return super().__dir__()


def _make_op_methods() -> bool:
    """Give `Fleet` its op methods unless it has them; True when this call made them."""
    if "_op_methods_made" in Fleet.__dict__:
        return False
    from fleet.service.control.ops import OPS

    Fleet._op_methods_made = True  # first: a failure below is not tried again at each look
    OPS.fleet_methods(Fleet)
    return True


class Fleet(Executor, metaclass=_OpsOnFirstLook):
    """A running fleet embedded in this process. Build it with `from_config`."""

    def __init__(self, config: FleetConfig, *, on_fuse=abort_process, cpus=None, admission_clock=None,
                 admission_rng=None, host=None, _launched=None):
        """`admission_clock`: the provider admission's clock (``wall()``, ``mono()``; e.g.
        ``admission.ScaledClock(600)`` replays a day in minutes, ``admission.ManualClock``
        is stepped by hand); `admission_rng`: its ``random.Random`` (Thompson sampling);
        `host`: the OS and clock the supervisor uses (`fleet.host.system.Host`; tests pass one
        with a fake clock). `_launched`: the zygote `fleet.Executor` launched first thing."""
        with collector.paused():  # the boot's imports and objects, without collections (fleet.runtime.collector)
            check_not_importing_main("fleet.Fleet")  # the workers import __main__: no fleet made there
            if _launched is None:
                from fleet.runtime import zygote_launch

                # The zygote first: its interpreter and imports start now, on the other core,
                # while this process imports the supervisor's runtime (docs/executor.md)
                _launched = zygote_launch.launch(config.name)
            try:
                from fleet.runtime.loop import Supervisor
                from fleet.service import start_exporter

                self.config = config
                self._sup = Supervisor(config, mode="embedded", on_fuse=on_fuse, cpus=cpus,
                                       admission_clock=admission_clock, admission_rng=admission_rng, host=host,
                                       exporter=start_exporter, launched=_launched).start()
            except BaseException:
                _launched.stop()  # idempotent: one the boot already stopped stays stopped
                raise

    @functools.cached_property
    def operations(self):
        """The operator ops, each a command on the fleet's loop: the façade fleetd's control
        ops run against (`fleet.service.control.ops.Operations`; ``drain``, ``cancel`` and
        the rest). Some are this class's own methods too (made from their ops: ``status``,
        ``ledger``, ``posture_*``, ``admission_*``, ``report_budget``)."""
        from fleet.service.control.ops import Operations

        return Operations(self._sup)

    def __getattr__(self, name: str):
        # an op's method, looked up on a fleet before any on the class (see _OpsOnFirstLook)
        if name.startswith("_") or not _make_op_methods():
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self, name)

    @classmethod
    def from_config(cls, source=None, *, env=None, **kwargs) -> "Fleet":
        """Boot a fleet from a TOML path, a dict, or a FleetConfig (FLEET_* env applies).

        Raises ConfigError (bad config), BootRefused (the quota cannot host it: see
        its exit_code), TableInUse (a live fleet of that name runs already).
        """
        with collector.paused():  # and its config's making (fleet.runtime.collector)
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
    def submit(self, role: str, payload=None, /, **unit) -> Future:
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
        if unit:
            check_unit_args(unit, _SUBMIT_ARGS)
            return self._sup.submit(role, payload, **unit)
        return self._sup.submit_plain(role, payload)

    submit.__wrapped__ = submit_signature(WAIT_ARGS)  # its arguments, for inspect and help()

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
             total: int | None = None, chunk_of: Callable[[list], object] | None = None, batches=None) -> Iterator:
        from fleet.worker.mapping import length_of, map_units, map_window, with_progress

        sup = self._sup

        def window() -> int:
            spec = sup.roles[role]  # read at each look at the window: a reload may change the bound
            return map_window(chunksize, spec.queue_bound, spec.slots)

        results = map_units(
            lambda payload, chunk: sup.submit(role, payload, lane=lane, chunk=chunk),
            role, iterable, chunksize=chunksize, timeout=timeout, window=window,
            ordered=ordered,
            submit_many=lambda payloads, chunk: sup.submit_many(role, payloads, lane=lane, chunk=chunk),
            chunk_of=chunk_of, batches=batches,
        )
        if not progress:
            return results
        return with_progress(results, length_of(iterable) if total is None else total, role)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking units. Queued units still run unless cancel_futures (then they are
        cancelled: outcome failed/Cancelled). wait=True blocks until every unit has its
        outcome and the workers and shared segments are gone."""
        self._sup.shutdown(wait=wait, cancel_futures=cancel_futures)

    # --- the operator's methods: one per op with ``fleet = True`` (status, ledger, posture_show,
    # posture_set, posture_release, drain, resume, drain_state, admission_*, report_budget),
    # made from the op registry (`fleet.service.control.ops.OPS`) by `OPS.fleet_methods` below,
    # each a call on `operations`.

    def reload(self, source=None, *, env=None) -> dict:
        """Load the config again (a path, dict or FleetConfig) and apply what can change live:
        posture policy, queue bounds, the provider catalog. Returns ``applied`` and
        ``needs_restart``. A config that fails to load raises ConfigError and changes nothing;
        when it is the ``[admission]`` section, the last good catalog stays and the
        admission's ``policy_error`` says why. A config this host could not boot raises its
        boot refusal and changes nothing: a budget over the quota (BudgetOverQuota, ...), a
        handler the worker fork server cannot import or call (ConfigError naming the role)."""
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

    def __repr__(self) -> str:
        return f"<Fleet {self.name!r} binding={self._sup.plan.binding} seats={len(self._sup.layout.seats)}>"


#: What `Fleet.submit` takes by keyword (its signature: `fleet.runtime.submit.submit_signature`).
_SUBMIT_ARGS = frozenset(UNIT_ARGS) | frozenset(WAIT_ARGS)
