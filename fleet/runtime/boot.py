"""Boot, on the caller's thread: config -> quota (cgroup) -> budget and tier plan -> seats
and slots -> shared table -> data plane -> zygote -> one worker per seat, pinned to its CPUs.

`Rig` is what boot builds and teardown takes apart: the plan and the resources a fleet
holds (the table, the data plane, the zygote and its workers, the provider gate, the
posture's sampler and quota watch, the publisher and its exporter). The supervisor
(`fleet.runtime.loop.Supervisor`) composes its components from it before the loop
thread starts; from the loop's start on, the loop owns them. A boot that fails part
way tears down what it built (`Rig.teardown`) and raises its typed refusal.
"""
from __future__ import annotations

import logging
import os
import time

from admission.records import record
from fleet.shm import parcels
from fleet.worker.codec import INLINE_MAX
from fleet.host import priority as priority_mod
from fleet.host.sampler import OomCounter, PressureInput, QuotaWatcher, Sampler
from fleet.rules import delegation
from fleet.rules import posture as posture_mod
from fleet.rules import quota as quota_mod
from fleet.rules import seats as seats_mod
from fleet.rules.dispatch import Dispatcher
from fleet.rules.errors import FleetError
from fleet.runtime.lease_gate import HostGroupLease, gated_roles, orchestrator_id
from fleet.runtime.publish import Publisher
from fleet.runtime import collector
from fleet.runtime import zygote_launch
from fleet.runtime.workers import Workers
from fleet.runtime.zygote_link import BOOT_TIMEOUT_S
from fleet.shm.dataplane import DataSegment
from fleet.shm.table import SlotTable

log = logging.getLogger(__name__)


@record(frozen=False, eq=False)
class Rig:
    """What boot built for one fleet. The plan's parts stay; `teardown` lets the
    resources go (and sets their fields to None)."""

    name: str
    projection: object
    priority: object
    dispatcher: Dispatcher
    posture: posture_mod.PostureOwner
    sampler: Sampler
    table: SlotTable | None
    cpus: tuple = ()  # the CPUs the seats were laid out over (an epoch places them again)
    quota_watcher: QuotaWatcher | None = None
    providers: object = None  # the provider gate (fleet.runtime.provider_gate.ProviderGate)
    publisher: Publisher | None = None
    data: DataSegment | None = None
    workers: Workers | None = None
    oom: OomCounter | None = None  # the memory group's OOM-kill counter (fleet.runtime.seat_deaths reads it)

    @property
    def quota(self):
        return self.projection.quota

    @property
    def plan(self):
        return self.projection.plan

    @property
    def layout(self):
        return self.projection.layout

    def snapshot(self):
        """A snapshot of the table (the exporter's thread reads it, as any process may)."""
        table = self.table
        if table is None:
            raise FleetError(f"fleet {self.name!r} has stopped")
        return table.snapshot()

    def teardown(self, gates, ledger, kill: bool = False) -> None:
        """Stop the gates, the zygote and workers; remove the shared segments. Idempotent."""
        if not gates.stop() and self.providers is not None:
            self.providers.stop()  # a boot that failed before its gates were installed
        if self.workers is not None:
            self.workers.exit(timeout=5 if not kill else 0.5)
        publisher = self.publisher
        if publisher is not None and publisher.metrics is not None:
            publisher.metrics.close()
            publisher.metrics = None
        if self.quota_watcher is not None:
            self.quota_watcher.close()  # its PSI trigger's file descriptor
            self.quota_watcher = None
        if self.table is not None:
            ledger.publish(self.table)
            self.table.unlink()
            self.table.close()
            self.table = None
        if self.data is not None:
            self.data.unlink()
            self.data.close()
            self.data = None
            # Its workers are gone: a parcel left (a unit's that no outcome reached) is no one's
            parcels.sweep(self.name)
        if kill is False and ledger.tripped is None:
            ledger.close()


def plan(config, host, *, name: str, mode: str, roles, ledger, cpus=None, socket_path=None, readers_group=None,
         started_ns: int, admission_args: dict, launched: zygote_launch.Launched | None = None) -> Rig:
    """The plan and the table, the posture, the provider gate, the publisher, the data
    plane and the zygote; the first forks asked for (`fork_seats`, then `await_forks`).
    `launched`: the zygote the face launched first thing (`zygote_launch.launch`), before it
    imported this runtime, so that its start overlapped those imports; None: launched
    here. On any failure here, it and what was built are stopped before the error goes up."""
    zygote = [launched]  # the one to stop on a failure, once there is one
    try:
        return _plan(config, host, name=name, mode=mode, roles=roles, ledger=ledger, cpus=cpus,
                     socket_path=socket_path, readers_group=readers_group, started_ns=started_ns,
                     admission_args=admission_args, zygote=zygote)
    except BaseException:
        if zygote[0] is not None:
            zygote[0].stop()  # idempotent: a zygote the rig already stopped stays stopped
        raise


def _plan(config, host, *, name: str, mode: str, roles, ledger, cpus, socket_path, readers_group,
          started_ns: int, admission_args: dict, zygote: list) -> Rig:
    cpus = cpus or host.affinity()
    projection = quota_mod.project(config, host.effective_cpus(), cpus)
    priority = priority_mod.this_process(config.dispatch_priority)
    _log_plan(config, name, projection, priority)
    # A unit sent ahead is dispatched: a role whose units need a host-group lease sends
    # none ahead, so a lease lost while a unit waits for a slot still stops it unrun.
    # A worker that retires after `max_tasks` units leaves its seat at its last one: no
    # seat is kept warm for the next unit (fleet.rules.dispatch, `warm_seats`).
    dispatcher = Dispatcher(roles, projection.layout, ahead_off=gated_roles(config.store, roles),
                            warm_seats=config.workers.max_tasks is None)
    owner = posture_mod.PostureOwner(config.posture, now_ms=host.now_ms())
    # Which group is ours, before any process of ours starts: fleetd in a delegated group
    # moves into its supervisor leaf here, and the zygote goes to the workers leaf
    arrangement = host.own_group(arrange=mode == "service")
    sampler = Sampler.for_arrangement(owner, arrangement, clock=host.now_ms)
    meta = _meta(name, mode, started_ns, socket_path, projection, priority)
    meta["throttle_reads"] = sampler.reads  # status says which groups the posture reads
    meta["cgroup"] = arrangement.to_meta()  # and which group is the fleet's, delegated or not
    for line in delegation.describe(meta["cgroup"]):
        log.info("fleet %s: cgroup %s", name, line)
    log.info("fleet %s: %s", name, sampler.describe())
    place = _placer(arrangement, host, name)
    # OOM kills and memory pressure are read where the arrangement says (the unit group of a
    # delegated fleetd, never the supervisor's leaf, which holds no worker)
    oom = OomCounter.for_read(arrangement.reads.get(delegation.MEMORY_EVENTS))
    memory = config.memory
    memory_pressure = arrangement.reads.get(delegation.MEMORY_PRESSURE)
    meta["memory_reads"] = {"oom_kills": oom.path, "version": oom.version,
                            "reason": oom.unavailable,
                            "pressure": memory_pressure.path if memory.pressure_cordon and memory_pressure is not None
                            and memory_pressure.own else None}
    log.info("fleet %s: %s", name, oom.describe())
    # The zygote first: it starts (its interpreter, numpy, fleet's modules, the kernels)
    # while this process makes the table, at once rather than in turn. One launched by
    # the face before it imported the runtime is placed now, before it forks anything.
    launched = zygote[0]
    if launched is None:
        launched = zygote[0] = zygote_launch.launch(name, place=place)
    elif place is not None:
        place(launched.pid)
    table = SlotTable.create(name, roles, len(projection.layout.slots), meta=meta, readers_group=readers_group)
    rig = Rig(name, projection, priority, dispatcher, owner, sampler, table, tuple(cpus), oom=oom)
    rig.table.set_quota_epoch(0, projection.quota.detected)
    # The name is ours now: parcels a killed supervisor of it left (and its workers) go
    parcels.sweep(name)
    cpu_pressure = arrangement.reads.get(delegation.CPU_PRESSURE)
    arm_memory = (lambda: PressureInput.for_memory(memory.pressure_stall_ms * 1000, memory.pressure_window_ms * 1000,
                                                   read=memory_pressure)) if memory.pressure_cordon else None
    rig.quota_watcher = QuotaWatcher(projection.quota, arm_pressure=lambda: PressureInput.for_read(cpu_pressure),
                                     arm_memory=arm_memory,
                                     clock=host.now_ms)

    def make_providers() -> None:
        # Nothing of the zygote's boot needs it: made while the zygote boots (`_rest`)
        from fleet.runtime.provider_gate import ProviderGate

        shared = (config.store.url, orchestrator_id(config.store.orchestrator, name)) if config.store.url else None
        slot_of = dispatcher.slot_of
        rig.providers = ProviderGate(config.admission, table=rig.table, shared_store=shared, catalog_file=config.source,
                                     holds_slot=lambda unit_id: slot_of(unit_id) is not None, **admission_args)

    try:
        _rest(rig, config, roles, ledger, host, launched, place, meanwhile=make_providers, relay=mode == "service")
    except BaseException:
        rig.teardown(_NoGates(), ledger, kill=True)  # the zygote too, once handed to the workers
        raise
    return rig


def _rest(rig: Rig, config, roles, ledger, host, launched, place, meanwhile, relay: bool) -> None:
    """The rest of the boot, from the seats' CPUs to the first forks asked for. The zygote's
    boot message goes as soon as what it attaches (the table, the data segment) is made;
    `meanwhile()` runs while it boots. ``relay``: results go to fleetd's clients as they
    are (`fleet.runtime.workers.worker_setup`)."""
    layout, table = rig.layout, rig.table
    # The seats are laid out for the most CPUs the fleet may get; its quota places those
    # that run now (fleet.rules.seats.place), the others wait for an epoch that adds them.
    placement = rig.projection.live_placement
    for spec in layout.slots:
        if spec.seat != seats_mod.NO_SEAT:
            seat = layout.seats[spec.seat]
            table.set_slot_meta(spec.index, cpus=placement.cpus[spec.seat] or seat.cpus, binding=seat.binding)
    for seat in layout.seats:
        if placement.cpus[seat.index] is None:
            rig.dispatcher.set_live(seat.index, False)
    rig.publisher = Publisher(table, ledger, rig.posture, rig.dispatcher, roles, host.now_ms)
    rig.publisher.posture_record()
    # A ring carries a message up to half its capacity; larger ones travel beside it (parcels)
    cap = _next_pow2(4 * (INLINE_MAX + 4096))
    rig.data = DataSegment.create(rig.name, len(layout.seats), cap, cap)
    rig.workers = workers = Workers(rig.name, config, roles, layout, rig.priority, host, table,
                                    rig.dispatcher.slots_of_seat, rig.data.bell.ring, place=place, relay=relay)
    workers.adopt(launched)
    workers.start_zygote(meanwhile=meanwhile)
    for seat in placement.live:
        workers.set_cpus(seat, placement.cpus[seat])
    workers.fork_many(placement.live)  # one batch: the zygote makes every fork before it reports


def _placer(arrangement, host, name: str):
    """What puts each new fork server in the workers leaf of a delegated group (None when
    the fleet is embedded). The fork server moves, not each worker: one write per fork
    server's life rather than one per fork on the loop's thread, and every worker is born
    in its leaf, never counted in the supervisor's for the moment a move would take."""
    if not arrangement.arranged:
        return None
    leaf = arrangement.leaves[delegation.WORKERS]

    def place(pid: int) -> None:
        try:
            host.place(pid, leaf)
        except OSError as exc:  # its workers then run in the supervisor's leaf: said, not fatal
            log.warning("fleet %s: the worker fork server (pid %d) could not move into %s: %s", name, pid, leaf,
                        exc.strerror or exc)
    return place


def await_forks(rig: Rig, on_exit) -> None:
    """Wait for the first workers: each fork reported, each exit meanwhile handed to
    ``on_exit(seat, pid, status)`` (the loop's deaths shell)."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S  # the zygote link's own I/O clock
    while rig.workers.forking:
        rig.workers.read(on_exit, block_until=deadline)


def start_exporter(rig: Rig, config, exporter) -> object | None:
    """The Prometheus exporter `[metrics]` asks for, started (``exporter(host=, port=,
    provider=)``, given by the face that runs the fleet) and handed to the publisher;
    None when metrics are off."""
    if not config.metrics.enabled:
        return None
    if exporter is None:
        raise FleetError(f"fleet {rig.name!r}: [metrics] is on and nothing was given to export them")
    m = config.metrics
    rig.publisher.metrics = exporter(host=m.host, port=m.port, provider=rig.snapshot)
    log.info("fleet %s: metrics on %s", rig.name, rig.publisher.metrics.url)
    return rig.publisher.metrics


def gates(rig: Rig, config, roles, wake) -> list:
    """The gates, in the order a unit passes them (a gate that may take a unit back first):
    the provider admission, then the host-group lease when [store] is configured (its
    threads only post: a grant or a lost lease is the loop's to apply)."""
    made = [rig.providers]
    if config.store.url:
        made.append(HostGroupLease(config.store, rig.name, roles, wake=wake).start())
    return made


def settle(config) -> bool:
    """The last step of a boot: with `gc_freeze`, the objects alive then (the modules
    imported, and numba's compiler state, ~100k objects, when the kernels were not built
    at install) go out of the collector's sight while the fleet runs, so full collections
    stop stalling the loop (`collector.freeze_for_fleet`; the loop's end thaws them,
    `collector.thaw_after_fleet`), with no collection first (`freeze_for_fleet` says why).
    Returns whether it froze."""
    if config.gc_freeze:
        collector.freeze_for_fleet()
    return bool(config.gc_freeze)


class _NoGates:
    """Teardown's gates for a boot that failed before any were installed."""

    @staticmethod
    def stop() -> bool:
        return False


def _log_plan(cfg, name: str, projection, priority) -> None:
    plan = projection.plan
    for warning in quota_mod.boot_warnings(projection.quota, plan):
        log.warning("fleet %s: %s", name, warning)
    for role in cfg.roles:
        log.debug("role %s: %s", role.name, role)
    log.info("fleet %s: %s", name, "; ".join(projection.processes()))
    for note in quota_mod.boot_notes(plan):
        log.info("fleet %s: %s", name, note)
    reserve = next((s for s in plan.budget.consumers if s.name == "reserve"), None)
    if reserve is not None:
        log.info("fleet %s: supervisor loop (budget.loop = %s): reserve %s cores, %s", name,
                 cfg.budget.loop, reserve.cores, reserve.rule)
    log.info("fleet %s: dispatch priority: %s", name, priority.describe())
    for share in plan.budget.consumers:
        if share.overridden:
            log.warning("budget override: %s = %s cores (%s)", share.name, share.cores, share.rule_gives())


def _meta(name: str, mode: str, started_ns: int, socket_path, projection, priority) -> dict:
    meta = {
        "fleet": name,
        "version": _version(),
        "pid": os.getpid(),
        "mode": mode,
        "started_ns": started_ns,
        "socket": socket_path,
    }
    meta.update(projection.meta(booted=True))
    meta["dispatch_priority"] = priority.to_meta()
    return meta


def _next_pow2(n: int) -> int:
    return 1 << max(12, (n - 1).bit_length())


def _version() -> str:
    from fleet._version import __version__

    return __version__
