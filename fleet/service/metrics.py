"""Prometheus exposition of one fleet: its table as metrics, plus unit run times.

What is exported (names as scraped):

* ``fleet_info{fleet,version,mode,boot_id} 1``
* ``fleet_profile{profile,binding,oversubscribed} 1`` — ops alert on ``binding="serial"``
  (a production host on the small-host tier, 002 §14).
* ``fleet_slots{role,state}`` — slots per (role, state); Idle slots hold no role (``role=""``).
* ``fleet_posture_cordoned`` (0/1), ``fleet_posture_enter_total``, ``fleet_posture_exit_total``,
  ``fleet_posture_cordoned_seconds_total`` (including the current stay),
  ``fleet_intake_suppressed_total``.
* ``fleet_units_submitted_total``, ``fleet_units_total{outcome}``, ``fleet_units_inflight``,
  ``fleet_units_failed_total{reason}`` (every reason of `fleet.rules.outcomes`, zeros included).
* the same counts in items (a chunk of a map is one unit of many items, as the ledger
  counts them): ``fleet_items_submitted_total``, ``fleet_items_total{outcome}``,
  ``fleet_items_inflight``; ``fleet_units_children_total`` (units submitted from inside running
  units); and ``fleet_fsm_refused_total``, ``fleet_stray_results_total``.
* ``fleet_queue_depth{role}``, ``fleet_queue_bound{role}``, ``fleet_role_slots_in_use{role}``,
  ``fleet_role_repins_total{role}``.
* ``fleet_table_torn_records`` and ``fleet_table_readable`` (0 when the provider failed:
  the scrape still succeeds and says so, rather than erroring).
* ``fleet_unit_run_seconds{role}`` — histogram fed by the supervisor.
* ``fleet_worker_recycles_total{role}`` — workers replaced after a unit of the role left
  them above its ``max_rss_mib`` (fed by the supervisor; a role appears at its first).
* ``fleet_worker_oom_kills_total{role}`` — workers the kernel's OOM killer killed while they
  ran a unit of the role (``role="?"``: between units), as their group's ``memory.events``
  counted them (fleet.rules.oom; fed by the supervisor; a role appears at its first).
* ``fleet_child_rides_total{role}`` — children of the role run on their waiting parent's slot
  (fleet.rules.dispatch "Children"; fed by the supervisor; a role appears at its first).
* ``fleet_unit_makespan_seconds{role,key,epoch}`` — histogram of each unit's makespan, from its
  accept to its outcome (002 §7), whatever the outcome. ``key`` is the pinned key of a keyed
  role (``""`` for the others); the first `MAKESPAN_KEYS` keys of a role have their own series,
  later ones share ``key="_other"`` (and ``fleet_unit_makespan_keys_folded_total{role}`` counts
  the units so folded). ``epoch`` is the quota epoch the unit was granted in; the series of
  the newest `MAKESPAN_EPOCHS` epochs are exported, older ones are dropped. So the family
  holds at most roles x (MAKESPAN_KEYS + 1) x MAKESPAN_EPOCHS series.
* ``fleet_seat_contended{seat}`` (0/1) and ``fleet_seat_contentions_total{seat}``: the seat's
  worker waits for its own CPUs now, and times found so (fleet.rules.contention).
* ``fleet_role_saturated{role}`` (0/1), ``fleet_role_saturation_episodes_total{role}``,
  ``fleet_role_arrival_rate{role}`` and ``fleet_role_service_rate{role}`` (units/s over the
  saturation window; fleet.rules.saturation).

The table-backed families are computed at scrape time from a fresh snapshot
(`FleetCollector`), so nothing is copied between scrapes and the figures are as
consistent as the table's seqlock reads.

Unit counters and run times, from one point. The supervisor hands the ledger's
counters and the run times of the units that ended since its last call to
`FleetMetrics.publish_units` together, under its own lock, before it resolves
those units' futures; a scrape reads both under one lock. So when a caller's
``map`` has returned, a scrape counts its units, and ``fleet_units_total`` never
lags (or leads) the histogram. Until something is published (a `FleetMetrics`
over a table another process writes), the counters come from the table. Each fleet has its own
`CollectorRegistry`: several fleets (or tests) in one process never collide, and
the process-global default registry is left alone.

Use::

    server = MetricsServer(port=9464, provider=table.snapshot).start()
    server.publish_units(ledger.counts().to_dict(), [("solver", 0.012)])  # counters + run times
    ...
    server.close()
"""
from __future__ import annotations

import bisect
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from fleet.rules import fsm
from fleet.rules.errors import FleetError
from fleet.rules.outcomes import FAILURE_REASONS, OUTCOMES, reason_name

log = logging.getLogger(__name__)

#: Run-time histogram buckets (seconds): from sub-millisecond units to ten-minute solves.
RUN_SECONDS_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)

#: Keys of one keyed role whose makespans have series of their own; later keys share OTHER_KEY.
MAKESPAN_KEYS = 32
#: The key label of a keyed role's makespans past its first MAKESPAN_KEYS keys.
OTHER_KEY = "_other"
#: Quota epochs whose makespan series are exported (the newest); an older one's are dropped.
MAKESPAN_EPOCHS = 4

#: How often the server thread checks for close(), in seconds.
POLL_S = 0.05

#: A snapshot provider: called once per scrape, returns a `fleet.shm.table.snapshot.TableSnapshot`.
SnapshotProvider = Callable[[], object]


# ------------------------------------------------------------------ table -> families


def _bool_label(value) -> str:
    return "true" if value else "false"


def table_families(snap, now_ns: int, ledger: dict | None = None) -> list:
    """Every table-backed metric family for one snapshot (pure: no clock, no I/O).

    ``now_ns`` is CLOCK_MONOTONIC, the clock the posture's ``since_ns`` is on.
    ``ledger``: the unit counters (the table's ``ledger_view`` shape) when they come
    from the publishing point rather than the table.
    """
    return [
        *_identity(snap),
        _slots(snap),
        *_posture(snap.posture_view(), now_ns),
        *_ledger(snap.ledger_view() if ledger is None else ledger),
        *_queues(snap),
        *_saturation(snap),
        *_contention(snap),
        GaugeMetricFamily("fleet_table_torn_records", "Table records a writer left mid-write.", value=len(snap.torn)),
    ]


def _identity(snap) -> list:
    meta = snap.meta or {}
    info = GaugeMetricFamily(
        "fleet_info", "The fleet this endpoint exports.", labels=("fleet", "version", "mode", "boot_id")
    )
    info.add_metric((snap.name, str(meta.get("version") or ""), str(meta.get("mode") or ""), snap.boot_id), 1)
    out = [info]
    plan = meta.get("plan")
    if plan:
        profile = GaugeMetricFamily(
            "fleet_profile",
            "The booted tier plan: profile asked for, binding it resolved to, oversubscribed.",
            labels=("profile", "binding", "oversubscribed"),
        )
        profile.add_metric(
            (str(plan.get("profile")), str(plan.get("binding")), _bool_label(plan.get("oversubscribed"))), 1
        )
        out.append(profile)
    return out


def _slots(snap) -> GaugeMetricFamily:
    # Every (role, held state) pair and the Idle row are exported, zeros included,
    # so a series never vanishes when its count drops to zero.
    counts = {("", fsm.STATE_NAMES[fsm.IDLE]): 0}
    for role in snap.role_names:
        for state in sorted(fsm.HELD_STATES):
            counts[(role, fsm.STATE_NAMES[state])] = 0
    for i in range(snap.n_slots):
        slot = snap.slot(i)
        key = (slot["role"] or "", slot["state"])
        counts[key] = counts.get(key, 0) + 1
    family = GaugeMetricFamily("fleet_slots", "Slots by role and FSM state.", labels=("role", "state"))
    for (role, state), n in counts.items():
        family.add_metric((role, state), n)
    return family


def _posture(view: dict, now_ns: int) -> list:
    cordoned = view["state"] == fsm.POSTURE_NAMES[fsm.CORDONED]
    since = view["since_ns"]
    current_ns = max(0, now_ns - since) if cordoned and since else 0
    return [
        GaugeMetricFamily("fleet_posture_cordoned", "1 while the fleet is Cordoned.", value=int(cordoned)),
        CounterMetricFamily("fleet_posture_enter", "Times the fleet entered Cordoned.", value=view["enter_count"]),
        CounterMetricFamily("fleet_posture_exit", "Times the fleet left Cordoned.", value=view["exit_count"]),
        CounterMetricFamily(
            "fleet_posture_cordoned_seconds",
            "Time spent Cordoned, the current stay included.",
            value=(view["cordoned_ns"] + current_ns) / 1e9,
        ),
        CounterMetricFamily(
            "fleet_intake_suppressed", "Units whose intake the posture refused or deferred.", value=view["suppressed"]
        ),
    ]


def _ledger(view: dict) -> list:
    by_outcome = CounterMetricFamily("fleet_units", "Units that reached an outcome.", labels=("outcome",))
    for outcome in OUTCOMES:
        by_outcome.add_metric((outcome,), view[outcome])
    by_reason = CounterMetricFamily("fleet_units_failed", "Failed units by reason.", labels=("reason",))
    counts = view["failed_by_reason"]
    for code in range(max(len(FAILURE_REASONS), len(counts))):
        by_reason.add_metric((reason_name(code),), counts[code] if code < len(counts) else 0)
    # Items: a chunk of a map is one unit of many items (the ledger's `items`, as status shows).
    items = view.get("items") or {}
    items_by_outcome = CounterMetricFamily("fleet_items", "Items (a chunk's calls count one each) that reached an "
                                           "outcome.", labels=("outcome",))
    for outcome in OUTCOMES:
        items_by_outcome.add_metric((outcome,), items.get(outcome, 0))
    return [
        CounterMetricFamily("fleet_units_submitted", "Units submitted.", value=view["submitted"]),
        CounterMetricFamily("fleet_units_children", "Units submitted from inside running units (children; "
                            "counted in fleet_units_submitted too).", value=view.get("children", 0)),
        by_outcome,
        GaugeMetricFamily("fleet_units_inflight", "Units submitted and not yet at an outcome.", value=view["inflight"]),
        by_reason,
        CounterMetricFamily("fleet_items_submitted", "Items submitted (a chunk's calls count one each).",
                            value=items.get("submitted", 0)),
        items_by_outcome,
        GaugeMetricFamily("fleet_items_inflight", "Items submitted and not yet at an outcome.",
                          value=items.get("inflight", 0)),
        CounterMetricFamily("fleet_fsm_refused", "Grants the slot table refused (a broken FSM rule; the unit "
                            "failed FsmRefused).", value=view.get("fsm_refused", 0)),
        CounterMetricFamily("fleet_stray_results", "Worker messages that were no owed unit's outcome, dropped.",
                            value=view.get("stray_results", 0)),
    ]


def _queues(snap) -> list:
    depth = GaugeMetricFamily("fleet_queue_depth", "Units waiting in each role's queue.", labels=("role",))
    bound = GaugeMetricFamily("fleet_queue_bound", "Each role's queue bound (a full queue refuses).", labels=("role",))
    in_use = GaugeMetricFamily("fleet_role_slots_in_use", "Slots each role holds now.", labels=("role",))
    repins = CounterMetricFamily("fleet_role_repins", "Elastic re-pins of each role's slots.", labels=("role",))
    for code in range(len(snap.role_names)):
        role = snap.role_view(code)
        depth.add_metric((role["name"],), role["queue_depth"])
        bound.add_metric((role["name"],), role["queue_bound"])
        in_use.add_metric((role["name"],), role["in_use"])
        repins.add_metric((role["name"],), role["repins"])
    return [depth, bound, in_use, repins]


def _saturation(snap) -> list:
    """Each role's saturation reading (fleet.rules.saturation), as the loop published it."""
    saturated = GaugeMetricFamily("fleet_role_saturated", "1 while the role's backlog outruns its service.",
                                  labels=("role",))
    episodes = CounterMetricFamily("fleet_role_saturation_episodes", "Saturation episodes raised per role.",
                                   labels=("role",))
    arrival = GaugeMetricFamily("fleet_role_arrival_rate", "Units/s arriving over the saturation window.",
                                labels=("role",))
    service = GaugeMetricFamily("fleet_role_service_rate", "Units/s granted a slot over the saturation window.",
                                labels=("role",))
    for code in range(len(snap.role_names)):
        role = snap.role_view(code)
        sat, name = role["saturation"], (role["name"],)
        saturated.add_metric(name, int(sat["saturated"]))
        episodes.add_metric(name, sat["episodes"])
        arrival.add_metric(name, sat["arrival_rate"])
        service.add_metric(name, sat["service_rate"])
    return [saturated, episodes, arrival, service]


def _contention(snap) -> list:
    """Each seat's contention (fleet.rules.contention), read on its first slot: its worker
    waits for its CPUs now, and the times it was found so."""
    meta = snap.meta or {}
    names = {s.get("index"): s.get("name") for s in meta.get("seats") or []}
    contended = GaugeMetricFamily("fleet_seat_contended", "1 while the seat's worker waits for its own CPUs "
                                  "(a noisy neighbour; widened to its role's CPUs unless contention = pin).",
                                  labels=("seat",))
    episodes = CounterMetricFamily("fleet_seat_contentions", "Times the seat's worker was found waiting for its CPUs.",
                                   labels=("seat",))
    first: dict[int, int] = {}
    for slot, seat in enumerate(meta.get("slot_seats") or []):
        if seat is not None and seat >= 0 and seat in names and slot < snap.n_slots:
            first.setdefault(seat, slot)
    for seat, slot in sorted(first.items()):
        row = snap.slot(slot)
        contended.add_metric((names[seat],), int(row["contended"]))
        episodes.add_metric((names[seat],), row["contentions"])
    return [contended, episodes]


class FleetCollector(Collector):
    """A prometheus_client collector over a snapshot provider: one snapshot per scrape.

    A provider that raises a FleetError (the table went away, or is corrupt) yields
    only ``fleet_table_readable 0`` (and the run times): the scrape succeeds and the
    alert can fire. ``units``, when given, returns the published unit counters and
    run-time histogram, read together (see `FleetMetrics.publish_units`).
    """

    def __init__(self, provider: SnapshotProvider, *, clock: Callable[[], int] = time.monotonic_ns,
                 units: Callable[[], tuple] | None = None):
        self._provider = provider
        self._clock = clock
        self._units = units

    def collect(self) -> Iterable:
        ledger, histograms = self._units() if self._units is not None else (None, ())
        yield from histograms
        try:
            snap = self._provider()
        except FleetError as exc:
            log.warning("metrics scrape: cannot read the fleet table: %s", exc)
            yield GaugeMetricFamily("fleet_table_readable", "1 when the fleet table could be read.", value=0)
            return
        yield GaugeMetricFamily("fleet_table_readable", "1 when the fleet table could be read.", value=1)
        yield from table_families(snap, self._clock(), ledger)


# ------------------------------------------------------------------------- the fleet


class FleetMetrics:
    """One fleet's metrics on its own registry: the table collector, the unit counters
    and the run-time histogram.

    Args:
        provider: returns a fresh TableSnapshot; called once per scrape, on the
            scraping thread (a snapshot is a lock-free read, safe from any thread).
        buckets: bucket bounds of ``fleet_unit_run_seconds``.
        clock: CLOCK_MONOTONIC in ns (injected for tests).
    """

    def __init__(
        self,
        provider: SnapshotProvider,
        *,
        buckets: Iterable[float] = RUN_SECONDS_BUCKETS,
        clock: Callable[[], int] = time.monotonic_ns,
    ):
        self._bounds = tuple(sorted(float(b) for b in buckets))
        self._lock = threading.Lock()
        self._ledger: dict | None = None
        self._runs: dict[str, tuple[list[int], float]] = {}  # role -> (count per bucket and +Inf, sum)
        # (role, key label, epoch) -> (count per bucket and +Inf, sum); a role's keys with series
        self._makespans: dict[tuple, tuple[list[int], float]] = {}
        self._keys: dict[str, set] = {}
        self._folded: dict[str, int] = {}  # role -> units whose key shares OTHER_KEY
        self._recycles: dict[str, int] = {}  # role -> workers recycled (max_rss_mib)
        self._oom_kills: dict[str, int] = {}  # role -> workers the kernel's OOM killer killed
        self._rides: dict[str, int] = {}  # role -> children that rode their waiting parent's slot
        self._epochs: set[int] = set()  # the epochs whose makespan series are kept
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(FleetCollector(provider, clock=clock, units=self._units_view))

    def publish_units(self, ledger: Mapping, runs: Iterable[tuple[str, float]] = (),
                      makespans: Iterable[tuple] = ()) -> None:
        """Publish the ledger's counters, and the run times and makespans of units that
        ended since the last call, as one step: a scrape sees all or none. Thread-safe.

        ``ledger`` is `fleet.rules.ledger.LedgerCounts.to_dict()` (failures by reason name);
        ``makespans``: ``(role, key, epoch, seconds)``, key None for a role that is not keyed.
        Raises ValueError, publishing nothing, for a negative or non-finite time.
        """
        runs, makespans = list(runs), list(makespans)
        for _, seconds in runs:
            _check_seconds(seconds)
        for *_, seconds in makespans:
            _check_seconds(seconds)
        by_reason = ledger.get("failed_by_reason", {})
        view = {
            "submitted": int(ledger["submitted"]),
            **{outcome: int(ledger[outcome]) for outcome in OUTCOMES},
            "inflight": int(ledger["inflight"]),
            "failed_by_reason": [int(by_reason.get(reason, 0)) for reason in FAILURE_REASONS],
            "fsm_refused": int(ledger.get("fsm_refused", 0)),
            "stray_results": int(ledger.get("stray_results", 0)),
            "items": {name: int(n) for name, n in (ledger.get("items") or {}).items()},
            "children": int(ledger.get("children", 0)),
        }
        with self._lock:
            self._ledger = view
            for role, seconds in runs:
                self._observe_locked(role, seconds)
            for role, key, epoch, seconds in makespans:
                self._makespan_locked(role, key, int(epoch), seconds)

    def observe_run(self, role: str, seconds: float) -> None:
        """Record one finished unit's run time alone (no counters). Thread-safe; cheap.

        Raises ValueError for a negative or non-finite duration: a clock mix-up
        upstream, which the histogram would otherwise hide in its sum.
        """
        _check_seconds(seconds)
        with self._lock:
            self._observe_locked(role, seconds)

    def count_recycle(self, role: str) -> None:
        """One worker recycled after a unit of `role` (max_rss_mib). Thread-safe."""
        with self._lock:
            self._recycles[role] = self._recycles.get(role, 0) + 1

    def set_rides(self, rides: dict[str, int]) -> None:
        """Children of each role granted on their waiting parent's slot so far (the
        dispatcher's ``rides``; fleet.rules.dispatch "Children"). Thread-safe."""
        with self._lock:
            self._rides = dict(rides)

    def count_oom_kill(self, role: str) -> None:
        """One worker killed by the kernel's OOM killer while it ran a unit of `role`. Thread-safe."""
        with self._lock:
            self._oom_kills[role] = self._oom_kills.get(role, 0) + 1

    def _observe_locked(self, role: str, seconds: float) -> None:
        counts, total = self._runs.get(role) or ([0] * (len(self._bounds) + 1), 0.0)
        i = bisect.bisect_left(self._bounds, seconds)  # the first bound >= seconds; len: +Inf
        counts[i] += 1
        self._runs[role] = (counts, total + seconds)

    def _makespan_locked(self, role: str, key, epoch: int, seconds: float) -> None:
        if key is None:
            label = ""
        else:
            label, keys = str(key), self._keys.setdefault(role, set())
            if label not in keys:
                if len(keys) < MAKESPAN_KEYS:
                    keys.add(label)
                else:  # the bound: the series count stays fixed whatever the keys
                    label = OTHER_KEY
                    self._folded[role] = self._folded.get(role, 0) + 1
        series = self._makespans
        counts, total = series.get((role, label, epoch)) or ([0] * (len(self._bounds) + 1), 0.0)
        i = bisect.bisect_left(self._bounds, seconds)  # the first bound >= seconds; len: +Inf
        counts[i] += 1
        series[(role, label, epoch)] = (counts, total + seconds)
        epochs = self._epochs
        if epoch not in epochs:
            epochs.add(epoch)
            if len(epochs) > MAKESPAN_EPOCHS:  # a new epoch: the oldest one's series go
                oldest = min(epochs)
                epochs.discard(oldest)
                for name in [name for name in series if name[2] == oldest]:
                    del series[name]

    def _units_view(self) -> tuple[dict | None, list]:
        runs = HistogramMetricFamily(
            "fleet_unit_run_seconds", "Run time of finished units (handler start to outcome), by role.",
            labels=("role",),
        )
        makespan = HistogramMetricFamily(
            "fleet_unit_makespan_seconds",
            "Makespan of units (accept to outcome), by role, pinned key and the quota epoch of their grant.",
            labels=("role", "key", "epoch"),
        )
        folded = CounterMetricFamily(
            "fleet_unit_makespan_keys_folded",
            f"Units of a keyed role whose key, past the role's first {MAKESPAN_KEYS}, shares key={OTHER_KEY!r}.",
            labels=("role",),
        )
        with self._lock:
            ledger = None if self._ledger is None else dict(self._ledger)
            run_series = {(role,): (list(counts), total) for role, (counts, total) in self._runs.items()}
            makespan_series = {(r, k, str(e)): (list(c), t) for (r, k, e), (c, t) in self._makespans.items()}
            folds = dict(self._folded)
            recycled = dict(self._recycles)
            oom_killed = dict(self._oom_kills)
            rode = dict(self._rides)
        self._add_series(runs, run_series)
        self._add_series(makespan, makespan_series)
        for role in sorted(folds):
            folded.add_metric((role,), folds[role])
        recycles = CounterMetricFamily(
            "fleet_worker_recycles", "Workers replaced after a unit of the role left them above its max_rss_mib.",
            labels=("role",),
        )
        for role in sorted(recycled):
            recycles.add_metric((role,), recycled[role])
        oom_kills = CounterMetricFamily(
            "fleet_worker_oom_kills", "Workers the kernel's OOM killer killed while they ran a unit of the role.",
            labels=("role",),
        )
        for role in sorted(oom_killed):
            oom_kills.add_metric((role,), oom_killed[role])
        rides = CounterMetricFamily(
            "fleet_child_rides", "Children of the role run on their waiting parent's slot (units submitted from "
            "inside that rode it).", labels=("role",),
        )
        for role in sorted(rode):
            rides.add_metric((role,), rode[role])
        return ledger, [runs, makespan, folded, recycles, oom_kills, rides]

    def _add_series(self, family: HistogramMetricFamily, series: dict) -> None:
        for labels in sorted(series):
            counts, total = series[labels]
            cumulative, buckets = 0, []
            for bound, n in zip((*self._bounds, float("inf")), counts):
                cumulative += n
                buckets.append((floatToGoString(bound), cumulative))
            family.add_metric(labels, buckets, total)

    def exposition(self) -> bytes:
        """The current text exposition (what a scrape returns)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def _check_seconds(seconds: float) -> None:
    if not (seconds >= 0 and seconds != float("inf")):
        raise ValueError(f"run time must be a finite number of seconds >= 0, got {seconds!r}")


# -------------------------------------------------------------------------- the server


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress never holds the process open


class _IPv6ThreadingWSGIServer(_ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # one line per scrape would drown the journal
        pass


class MetricsServer:
    """An HTTP endpoint serving one fleet's metrics from a background thread.

    Construction binds nothing; `start` binds and serves, `close` stops the thread
    and closes the socket. Use as a context manager, or ``start()`` / ``close()``.

    Args:
        host: address to bind; localhost by default (metrics are not for the network
            unless the operator says so).
        port: TCP port; 0 picks a free one (read `port` after `start`).
        provider: snapshot provider (see `FleetMetrics`); ignored when ``metrics`` is given.
        metrics: an existing `FleetMetrics` to serve.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 9464,
        provider: SnapshotProvider | None = None,
        *,
        metrics: FleetMetrics | None = None,
    ):
        if metrics is None:
            if provider is None:
                raise TypeError("MetricsServer needs a snapshot provider or a FleetMetrics")
            metrics = FleetMetrics(provider)
        self.metrics = metrics
        self.host = host
        self._requested_port = port
        self._bound_port: int | None = None
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the ephemeral one when asked for 0), kept after `close`; the requested one before `start`."""
        return self._requested_port if self._bound_port is None else self._bound_port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def observe_run(self, role: str, seconds: float) -> None:
        """Shortcut for ``self.metrics.observe_run``."""
        self.metrics.observe_run(role, seconds)

    def count_recycle(self, role: str) -> None:
        """Shortcut for ``self.metrics.count_recycle``."""
        self.metrics.count_recycle(role)

    def count_oom_kill(self, role: str) -> None:
        """Shortcut for ``self.metrics.count_oom_kill``."""
        self.metrics.count_oom_kill(role)

    def set_rides(self, rides: dict[str, int]) -> None:
        """Shortcut for ``self.metrics.set_rides``."""
        self.metrics.set_rides(rides)

    def publish_units(self, ledger: Mapping, runs: Iterable[tuple[str, float]] = (),
                      makespans: Iterable[tuple] = ()) -> None:
        """Shortcut for ``self.metrics.publish_units``."""
        self.metrics.publish_units(ledger, runs, makespans)

    def start(self) -> MetricsServer:
        """Bind and serve in a daemon thread; returns self. OSError if the port is taken."""
        if self._server is not None:
            return self
        server_class = _IPv6ThreadingWSGIServer if ":" in self.host else _ThreadingWSGIServer
        app = make_wsgi_app(self.metrics.registry)
        self._server = make_server(
            self.host, self._requested_port, app, server_class=server_class, handler_class=_QuietHandler
        )
        self._bound_port = self._server.server_address[1]
        # serve_forever notices shutdown() only between polls: a short poll keeps close() prompt.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": POLL_S}, name=f"fleet-metrics-{self.port}",
            daemon=True,
        )
        self._thread.start()
        log.info("serving metrics on %s", self.url)
        return self

    def close(self) -> None:
        """Stop serving, join the thread, close the socket. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()  # returns once serve_forever has left its loop
        server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
