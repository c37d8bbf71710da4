"""What the loop does with what it samples: the posture, the quota, and their effects.

Every `SAMPLE_EVERY_S` the loop samples (`sample`): the cgroup's throttle counters feed
the posture (Nominal ⇄ Cordoned, fleet.rules.posture), the quota watch re-detects the
quota and CPU pressure (fleet.host.sampler.QuotaWatcher), and the table's records are
published again. A posture change is published and, on cordon, drains the slots that
run a deferrable unit (T7); a quota change that moves the plan's quota starts a new
epoch (the budget derived again, deferrable units drained, pins released once empty).

One owner: the loop thread.
"""
from __future__ import annotations

import logging

from fleet.rules import cordon, fsm
from fleet.rules import pressure as pressure_mod
from fleet.rules import quota as quota_mod

log = logging.getLogger(__name__)

#: Posture sampling period.
SAMPLE_EVERY_S = 0.25


def sample(sup) -> None:
    """A sample's effects: the posture ticks, the quota is watched, the records go out."""
    tick = sup.sampler.tick()
    if tick.transition is not None:
        after_posture_change(sup, tick.transition)
    _watch_quota(sup)
    sup.publisher.units()
    sup._providers.refresh_catalog()  # 000 §7: the catalog read every sweep, when its file changed
    sup._providers.publish(force=True)  # backoffs and closures end with time
    sup.publisher.posture_record()  # dwell and suppressed intake move without a transition
    for code in range(len(sup.roles)):
        sup.table.set_queue_depth(code, sup.dispatcher.queued(code), sup.dispatcher.in_use(code),
                                  sup.dispatcher.repins[code])


def _watch_quota(sup) -> None:
    """Quota re-detection and CPU pressure (fleet.host.sampler.QuotaWatcher): pressure on
    the fleet's own group holds the posture Cordoned; a quota change is logged and,
    when the plan's quota changed, starts a new epoch."""
    seen = sup.quota_watcher.poll()
    if seen.pressure is not None:
        act = sup.posture.hold if seen.pressure == pressure_mod.HOLD else sup.posture.release
        after_posture_change(sup, act(pressure_mod.CAUSE, sup.host.now_ms()))
    if seen.change is not None:
        _quota_changed(sup, seen.change)
    released = sup.dispatcher.take_idle_stale_pins()  # pins of a past epoch, now empty
    for slot in released:
        if sup.table.transition(slot, fsm.UNPIN) != fsm.OK:
            log.error("slot %d: epoch UNPIN refused in state %s", slot, fsm.STATE_NAMES[sup.table.state(slot)[0]])
    if released or seen.pressure is not None or seen.change is not None:
        sup._dispatch()


def _quota_changed(sup, change) -> None:
    """Log the change; a new epoch re-derives the budget (logged: the seats stay as
    booted until a restart), drains in-flight deferrable units (T7) and marks every
    pin for release (T9 once it is empty)."""
    log.warning("[fleet-posture] fleet %s: %s", sup.name, change.describe())
    sup.table.set_quota_epoch(sup.quota_watcher.epoch, change.new.detected)
    if change.epoch is None:
        return
    log.warning("fleet %s: epoch %d: %s", sup.name, change.epoch,
                quota_mod.replan(change.new.cpus, sup.plan, sup.config).describe(sup.plan))
    for slot in _running_deferrable(sup):
        # One unit in flight only: units queued behind a keyed slot would find it Idle.
        if sup.dispatcher.units_in_flight(slot) == 1:
            sup.table.transition(slot, fsm.DRAIN)
    sup.dispatcher.begin_epoch()


def after_posture_change(sup, change) -> None:
    """Publish the posture; on cordon, drain running deferrable slots."""
    sup.publisher.posture_record()
    if change is None:
        return
    if cordon.halts_any(sup.posture.posture):
        for slot in _running_deferrable(sup):
            sup.table.transition(slot, fsm.DRAIN)
    sup.publisher.last_change = change
    sup._dispatch()


def _running_deferrable(sup) -> list[int]:
    """Slots Running a unit of a deferrable role now (slots switch roles: the word says which)."""
    out = []
    for slot in range(len(sup.layout.slots)):
        state, code, _key, _gen = sup.table.state(slot)
        if state == fsm.RUNNING and cordon.yields(sup.roles.by_code(code).class_code):
            out.append(slot)
    return out
