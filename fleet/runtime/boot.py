"""Boot, on the caller's thread: config -> quota (cgroup) -> budget and tier plan -> seats
and slots -> shared table -> data plane -> zygote -> one worker per seat, pinned to its CPUs.

`boot` builds the loop's state (`fleet.runtime.loop.Supervisor`) before the loop thread
starts; from the loop's start on, the loop owns it. A boot that fails part way tears
down what it built (`fleet.runtime.shutdown.teardown`) and raises its typed refusal.
"""
from __future__ import annotations

import gc
import logging
import os
import time

from fleet.host import priority as priority_mod
from fleet.host.sampler import PressureInput, QuotaWatcher, Sampler
from fleet.rules import posture as posture_mod
from fleet.rules import quota as quota_mod
from fleet.rules import seats as seats_mod
from fleet.rules.dispatch import Dispatcher
from fleet.rules.errors import FleetError
from fleet.runtime import seat_deaths, shutdown
from fleet.runtime.lease_gate import HostGroupLease, gated_roles, orchestrator_id
from fleet.runtime.publish import Publisher
from fleet.runtime.workers import Workers
from fleet.runtime.zygote_link import BOOT_TIMEOUT_S
from fleet.shm.dataplane import DataSegment
from fleet.shm.table import SlotTable

log = logging.getLogger("fleet.runtime.supervisor")


def boot(sup) -> None:
    """Build the fleet `sup` runs: its plan, table, data plane, gates and workers."""
    cfg = sup.config
    cpus = sup._cpus_override or sup.host.affinity()
    sup.projection = quota_mod.project(cfg, sup.host.effective_cpus(), cpus)
    sup.quota, sup.plan, sup.layout = sup.projection.quota, sup.projection.plan, sup.projection.layout
    sup.priority = priority_mod.this_process(cfg.dispatch_priority)
    _log_plan(sup)
    # A unit sent ahead is dispatched: a role whose units need a host-group lease sends
    # none ahead, so a lease lost while a unit waits for a slot still stops it unrun.
    sup.dispatcher = Dispatcher(sup.roles, sup.layout, ahead_off=gated_roles(cfg.store, sup.roles))
    sup.posture = posture_mod.PostureOwner(cfg.posture, now_ms=sup.host.now_ms())
    sup.sampler = Sampler.for_self(sup.posture, clock=sup.host.now_ms)
    sup.table = SlotTable.create(sup.name, sup.roles, len(sup.layout.slots), meta=_meta(sup),
                                 readers_group=sup.readers_group)
    sup.table.set_quota_epoch(0, sup.quota.detected)
    sup.quota_watcher = QuotaWatcher(sup.quota, arm_pressure=PressureInput.for_self, clock=sup.host.now_ms)
    try:
        from fleet.runtime.provider_gate import ProviderGate

        shared = (cfg.store.url, orchestrator_id(cfg.store.orchestrator, sup.name)) if cfg.store.url else None
        slot_of = sup.dispatcher.slot_of
        sup._providers = ProviderGate(cfg.admission, table=sup.table, shared_store=shared, catalog_file=cfg.source,
                                      holds_slot=lambda unit_id: slot_of(unit_id) is not None, **sup._admission_args)
        _boot_rest(sup)
    except BaseException:
        shutdown.teardown(sup, kill=True)
        raise
    # The gates, in the order a unit passes them (a gate that may take a unit back first).
    gates = [sup._providers]
    if cfg.store.url:
        # The lease gate's threads only post: a grant or a lost lease is the loop's to apply.
        gates.append(HostGroupLease(cfg.store, sup.name, sup.roles, wake=sup._ring).start())
    sup.gates = gates
    sup._open_roles = frozenset(code for code in range(len(sup.roles))
                                if all(gate.lets_through(code) for gate in gates))
    if cfg.gc_freeze:
        # Boot loaded numba's compiler state (~100k objects) for the table's kernels: out
        # of the collector's sight, full collections stop stalling the loop 30-100 ms.
        gc.collect()
        gc.freeze()


def _log_plan(sup) -> None:
    cfg = sup.config
    for warning in quota_mod.boot_warnings(sup.quota, sup.plan):
        log.warning("fleet %s: %s", sup.name, warning)
    for role in sup.roles:
        log.debug("role %s: %s", role.name, role)
    log.info("fleet %s: %s", sup.name, "; ".join(sup.projection.processes()))
    for note in quota_mod.boot_notes(sup.plan):
        log.info("fleet %s: %s", sup.name, note)
    reserve = next((s for s in sup.plan.budget.consumers if s.name == "reserve"), None)
    if reserve is not None:
        log.info("fleet %s: supervisor loop (budget.loop = %s): reserve %s cores, %s", sup.name,
                 cfg.budget.loop, reserve.cores, reserve.rule)
    log.info("fleet %s: dispatch priority: %s", sup.name, sup.priority.describe())
    for share in sup.plan.budget.consumers:
        if share.overridden:
            log.warning("budget override: %s = %s cores (%s)", share.name, share.cores, share.rule_gives())


def _meta(sup) -> dict:
    meta = {
        "fleet": sup.name,
        "version": _version(),
        "pid": os.getpid(),
        "mode": sup.mode,
        "started_ns": sup.started_ns,
        "socket": sup.socket_path,
    }
    meta.update(sup.projection.meta(booted=True))
    meta["dispatch_priority"] = sup.priority.to_meta()
    return meta


def _boot_rest(sup) -> None:
    for spec in sup.layout.slots:
        if spec.seat != seats_mod.NO_SEAT:
            seat = sup.layout.seats[spec.seat]
            sup.table.set_slot_meta(spec.index, cpus=seat.cpus, binding=seat.binding)
    sup.publisher = Publisher(sup.table, sup.ledger, sup.posture, sup.dispatcher, sup.roles, sup.host.now_ms)
    sup.publisher.posture_record()
    cap = _next_pow2(max(1 << 20, 4 * (sup.config.limits.max_payload_bytes + 4096)))
    sup.data = DataSegment.create(sup.name, len(sup.layout.seats), cap, cap)
    sup.workers = workers = Workers(sup.name, sup.config, sup.roles, sup.layout, sup.priority, sup.host, sup.table,
                                    sup.dispatcher.slots_of_seat)
    workers.start_zygote()
    for seat in sup.layout.seats:
        workers.fork(seat.index)
    deadline = time.monotonic() + BOOT_TIMEOUT_S  # the zygote link's own I/O clock
    while workers.pending_forks:
        workers.read(lambda seat, pid, status: seat_deaths.seat_died(sup, seat, pid, status), block_until=deadline)
    if sup.config.metrics.enabled:
        from fleet.runtime.metrics import MetricsServer

        m = sup.config.metrics
        publisher = sup.publisher
        publisher.metrics = MetricsServer(host=m.host, port=m.port, provider=lambda: _snapshot_for_metrics(sup)).start()
        # Held until the publisher hands them over with the ledger's counters.
        sup.run_observer = publisher.run_ended
        log.info("fleet %s: metrics on %s", sup.name, publisher.metrics.url)


def _snapshot_for_metrics(sup):
    # The metrics server's thread reads the shared table, as any process may.
    table = sup.table
    if table is None:
        raise FleetError(f"fleet {sup.name!r} has stopped")
    return table.snapshot()


def _next_pow2(n: int) -> int:
    return 1 << max(12, (n - 1).bit_length())


def _version() -> str:
    from fleet._version import __version__

    return __version__
