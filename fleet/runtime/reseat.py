"""The seats follow the quota: an epoch's quota places the booted seats (002 §3.4, §5).

Boot lays the seats out for the most CPUs the fleet may be given (`fleet.rules.quota.capacity`)
and runs those its quota places (`fleet.rules.seats.place`). At each epoch that a quota
change starts (`fleet.runtime.posture_effects`), the new quota's seats are placed again
and the change (`fleet.rules.seats.changes`) carried out:

* a seat that retires is granted nothing new (`Dispatcher.set_live`); its units in flight
  complete, its pins are released as every pin of a past epoch is (T9, once empty), and
  then its worker leaves (killed by the supervisor: no lane death, no restart, no charge
  against restart intensity). Units queued for its roles run on the seats that stay.
* a seat that is added gets its worker forked, pinned to the epoch's CPUs, and its Idle
  slots back in the pool.
* a seat that moves has its worker's affinity (every thread of it) set to the new CPUs;
  the unit it runs carries on there.

A quota that no plan fits leaves the seats as they are (logged).

One owner: the loop thread (and boot's, before the loop starts).
"""
from __future__ import annotations

import logging

from fleet.rules import seats as seats_mod

log = logging.getLogger(__name__)


class SeatFollow:
    """The placement in force and the seats waiting to retire; applies each epoch's change."""

    def __init__(self, name: str, layout, placement, cpus, roles, dispatcher, seats, table, pin_loop=None):
        self._name, self._layout, self._cpus, self._roles = name, layout, tuple(cpus), roles
        self._dispatcher, self._seats, self._table = dispatcher, seats, table
        self.placement = placement
        self._retiring: set[int] = set()  # retired seats whose worker has not been told to leave
        self.last: seats_mod.SeatChange | None = None  # the last epoch's change (status, tests)
        #: pins the calling thread (the loop's: epochs run on it) to CPUs; None in tests of the rule alone
        self._pin_loop = pin_loop
        self.loop_cpus: tuple[int, ...] | None = None  # where the loop is pinned (None: not pinned)

    @property
    def live(self) -> tuple[int, ...]:
        return self.placement.live

    def epoch(self, plan) -> str:
        """Place the seats for an epoch's `plan` (None: no plan fits, nothing moves) and
        start the change; what it does, for the log."""
        if plan is None:
            return "the seats stay as they run"
        epoch_seats = seats_mod.layout(plan, self._roles, self._cpus)
        new = seats_mod.place(self._layout, epoch_seats)
        change = seats_mod.changes(self.placement, new)
        self._move_loop(seats_mod.loop_cpus(epoch_seats))
        self.placement, self.last = new, change
        dispatcher, workers = self._dispatcher, self._seats.workers
        for seat in change.retire:
            dispatcher.set_live(seat, False)
            self._retiring.add(seat)
        for seat in change.add + change.repin:
            cpus = new.cpus[seat]
            workers.set_cpus(seat, cpus)
            for slot in dispatcher.slots_of_seat(seat):
                self._table.set_slot_meta(slot, cpus=cpus)
        for seat in change.repin:
            workers.repin(seat)
        for seat in change.add:
            self._retiring.discard(seat)
            dispatcher.set_live(seat, True)
            if seat not in workers.pids and not workers.fork_pending(seat):
                workers.fork(seat)
            else:
                workers.repin(seat)  # its worker had not left yet: it stays, on the new CPUs
        self.retire_empty()
        return self.describe(change, new)

    def _move_loop(self, cpus) -> None:
        """The loop follows too: onto the CPUs the epoch's budget reserves for it, or
        anywhere the fleet may run when it reserves none (the seats may run there now)."""
        if cpus == self.loop_cpus or self._pin_loop is None:
            return
        try:
            self._pin_loop(cpus if cpus is not None else self._cpus)
        except OSError as exc:
            log.warning("fleet %s: cannot pin the supervisor loop to %s: %s", self._name, cpus, exc)
            return
        self.loop_cpus = cpus

    def retire_empty(self) -> None:
        """A retired seat with nothing held on it any more (units done, pins released,
        nothing waiting to go out): its worker leaves."""
        workers = self._seats.workers
        for seat in sorted(self._retiring):
            if not self._dispatcher.seat_empty(seat) or self._seats.waiting(seat):
                continue
            self._retiring.discard(seat)
            pid = workers.pids.get(seat)
            if pid is not None:
                log.info("fleet %s: seat %s retired: worker pid %d leaves", self._name,
                         self._layout.seats[seat].name, pid)
                workers.kill(pid)

    def describe(self, change, new) -> str:
        seats = self._layout.seats
        parts = [f"{len(new.live)} worker process{'es' if len(new.live) != 1 else ''}"]
        if change.retire:
            parts.append("retiring " + ", ".join(seats[i].name for i in change.retire))
        if change.add:
            parts.append("adding " + ", ".join(f"{seats[i].name} on CPUs {list(new.cpus[i])}" for i in change.add))
        if change.repin:
            parts.append("moving " + ", ".join(f"{seats[i].name} to CPUs {list(new.cpus[i])}" for i in change.repin))
        if not change:
            parts.append("as they run already")
        if new.unplaced:
            parts.append("no booted seat runs " + ", ".join(new.unplaced) + " (a restart would lay it out)")
        return "seats: " + "; ".join(parts)
