"""The posture effects: the posture, the quota watch, and what follows from each.

Every `SAMPLE_EVERY_S` the loop samples (`sample`): the cgroup's throttle counters feed
the posture (Nominal ⇄ Cordoned, fleet.rules.posture), the quota watch re-detects the
quota and CPU pressure (fleet.host.sampler.QuotaWatcher), and the table's records are
published again. A posture change is published and, on cordon, drains the slots that
run a deferrable unit (T7); a quota change that moves the plan's quota starts a new
epoch (the budget derived again, deferrable units drained, pins released once empty,
the seats placed for the new quota: `fleet.runtime.reseat`).
Holds, releases and retunes (a lane death, an operator) take the same path.

One owner: the loop thread (and boot's, before the loop starts).
"""
from __future__ import annotations

import logging

from fleet.rules import cordon, fsm
from fleet.rules import posture as posture_mod
from fleet.rules import pressure as pressure_mod
from fleet.rules import quota as quota_mod

log = logging.getLogger(__name__)

#: Posture sampling period.
SAMPLE_EVERY_S = 0.25


class PostureEffects:
    """Owns the live posture (`fleet.rules.posture.PostureOwner`), its sampler and the quota
    watch, and applies what they decide: to the table's slots, the dispatcher's epochs and
    floors (through the publisher), and the provider gate's catalog and census.

    `dispatch` grants what a change lets through (the loop's)."""

    def __init__(self, owner, sampler, quota_watcher, *, name: str, config, plan, roles, layout, table, dispatcher,
                 publisher, providers, host, dispatch, follow=None):
        self._owner, self._sampler, self._quota_watcher = owner, sampler, quota_watcher
        self._name, self._config, self._plan, self._roles, self._layout = name, config, plan, roles, layout
        self._table, self._dispatcher, self._publisher, self._providers = table, dispatcher, publisher, providers
        self._host, self._dispatch = host, dispatch
        self._follow = follow  # the seats following the quota (fleet.runtime.reseat.SeatFollow)

    # ------------------------------------------------------------------ reads
    @property
    def posture(self) -> int:
        """The posture now (fleet.rules.vocab: NOMINAL, CORDONED)."""
        return self._owner.posture

    @property
    def causes(self):
        """The causes that hold the posture Cordoned."""
        return self._owner.state.causes

    @property
    def policy(self):
        return self._owner.policy

    def show(self) -> dict:
        """The posture view: state, causes, dwell, counters and the six thresholds."""
        return self._owner.show(self._host.now_ms())

    # ------------------------------------------------------------------ the sample
    def sample(self) -> None:
        """A sample's effects: the posture ticks, the quota is watched, the records go out."""
        tick = self._sampler.tick()
        if tick.transition is not None:
            self.after_change(tick.transition)
        self._watch_quota()
        self._publisher.units()
        self._providers.refresh_catalog()  # 000 §7: the catalog read every sweep, when its file changed
        self._providers.publish(force=True)  # backoffs and closures end with time
        self._publisher.posture_record()  # dwell and suppressed intake move without a transition
        dispatcher = self._dispatcher
        for code in range(len(self._roles)):
            self._table.set_queue_depth(code, dispatcher.queued(code), dispatcher.in_use(code), dispatcher.repins[code])

    # ------------------------------------------------------------------ holds, releases, retunes
    def hold(self, cause: str) -> None:
        """Hold the posture Cordoned for `cause` until it is released."""
        self.after_change(self._owner.hold(cause, self._host.now_ms()))

    def release(self, cause: str) -> bool:
        """Release `cause` (an unknown one raises PostureCauseError, changing nothing);
        True if it was held. The posture turns Nominal once the exit window is clean and
        no other cause holds it."""
        held = posture_mod.check_cause(cause) in self._owner.state.causes
        self.after_change(self._owner.release(cause, self._host.now_ms()))
        return held

    def retune(self, patch: dict) -> dict:
        """Retune the policy live (validated; a bad patch raises and changes nothing)."""
        result = self._owner.retune(patch, self._host.now_ms())
        self._publisher.posture_record()
        return result

    def after_change(self, change) -> None:
        """Publish the posture; on cordon, drain running deferrable slots."""
        self._publisher.posture_record()
        if change is None:
            return
        if cordon.halts_any(self._owner.posture):
            for slot in self._running_deferrable():
                self._table.transition(slot, fsm.DRAIN)
        self._publisher.last_change = change
        self._dispatch()

    # ------------------------------------------------------------------ quota
    def _watch_quota(self) -> None:
        """Quota re-detection, CPU and memory pressure (fleet.host.sampler.QuotaWatcher): pressure
        on the fleet's own group holds the posture Cordoned (cpu-pressure, memory-pressure); a quota change is logged and,
        when the plan's quota changed, starts a new epoch."""
        seen = self._quota_watcher.poll()
        watcher = self._quota_watcher
        for action, cause, source in ((seen.pressure, pressure_mod.CAUSE, watcher.pressure_input),
                                      (seen.memory, pressure_mod.MEMORY_CAUSE, watcher.memory_input)):
            if action is not None:
                # One line per hold and release, whatever the posture was: a hold beside
                # another cause changes no posture, and would leave no trace otherwise.
                log.warning("[fleet-posture] fleet %s: %s: %s (PSI on %s)", self._name, cause, action,
                            getattr(source, "path", "?"))
                act = self._owner.hold if action == pressure_mod.HOLD else self._owner.release
                self.after_change(act(cause, self._host.now_ms()))
        if seen.change is not None:
            self._quota_changed(seen.change)
        table = self._table
        released = self._dispatcher.take_idle_stale_pins()  # pins of a past epoch, now empty
        for slot in released:
            if table.transition(slot, fsm.UNPIN) != fsm.OK:
                log.error("slot %d: epoch UNPIN refused in state %s", slot, fsm.STATE_NAMES[table.state(slot)[0]])
        if self._follow is not None:
            self._follow.retire_empty()  # a retired seat's worker leaves once nothing is held on it
        if released or seen.pressure is not None or seen.memory is not None or seen.change is not None:
            self._dispatch()

    def _quota_changed(self, change) -> None:
        """Log the change; a new epoch re-derives the budget (logged), drains in-flight
        deferrable units (T7), marks every pin for release (T9 once it is empty) and
        places the seats for the new quota (`fleet.runtime.reseat`): pins are marked
        before any seat retires, so a retired seat's pins are released, never re-leased there."""
        log.warning("[fleet-posture] fleet %s: %s", self._name, change.describe())
        self._table.set_quota_epoch(self._quota_watcher.epoch, change.new.detected)
        if change.epoch is None:
            return
        replan = quota_mod.replan(change.new.cpus, self._plan, self._config)
        log.warning("fleet %s: epoch %d: %s", self._name, change.epoch, replan.describe(self._plan))
        for slot in self._running_deferrable():
            # One unit in flight only: units queued behind a keyed slot would find it Idle.
            if self._dispatcher.units_in_flight(slot) == 1:
                self._table.transition(slot, fsm.DRAIN)
        self._dispatcher.begin_epoch()
        if self._follow is not None:
            log.warning("fleet %s: epoch %d: %s", self._name, change.epoch, self._follow.epoch(replan.plan))

    def _running_deferrable(self) -> list[int]:
        """Slots Running a unit of a deferrable role now (slots switch roles: the word says which)."""
        out = []
        table, roles = self._table, self._roles
        for slot in range(len(self._layout.slots)):
            state, code, _key, _gen = table.state(slot)
            if state == fsm.RUNNING and cordon.yields(roles.by_code(code).class_code):
                out.append(slot)
        return out
