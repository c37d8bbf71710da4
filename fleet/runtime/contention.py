"""The contention watch: each running seat's worker read for its wait on its CPUs at every
posture sample; a contended one runs on its share's CPUs while that lasts, then goes back
to its pin (`fleet.rules.contention` holds the rule and says why).

Each sample reads every running seat's worker (`Host.schedstat`: ns run, ns waited)
and what its looks for a task took of those (`looks`: the seat's tasks ring counts
them), hands the window's wait share to the rule, and carries out its word: the worker's
affinity (every thread, `Host.pin_process`) set to its share's CPUs (WIDEN) or back to
its seat's (REPIN); the seat's slots' CPUs and contention published in the table
(`fleetctl status --json`: each slot's ``cpus``, ``contended`` and ``contentions``), where
the seat's worker also reads it before it spins for its next task (`rule.spin_for`).

The seat's own CPUs stay the seat's (`Workers.cpus_of`): a worker forked for it (a
restart, a recycle) starts on them, pinned, and is read afresh; an epoch that moves
the seat (`fleet.runtime.reseat`) re-pins its worker, and a contended seat is widened
again over its share's new CPUs at the next sample.

One owner: the loop thread.
"""
from __future__ import annotations

import logging

from fleet.rules import contention as rule

log = logging.getLogger(__name__)


class ContentionWatch:
    """Per seat: the rule's state, the last reading (pid, ns run, ns waited, when, and
    what its looks took of those) and the CPUs its worker was last set to."""

    def __init__(self, name: str, layout, follow, workers, table, slots_of_seat, host, looks,
                 policy: rule.ContentionPolicy = rule.POLICY, widen: bool = True):
        """`looks(seat)`: what the seat's workers' looks for a task took so far, in ns: on
        CPU, off it in short yields, (optionally) off it in long ones, which stay in the
        reading (`fleet.runtime.seats.Seats.looked`)."""
        self._widen = widen  # False (`[fleet] contention = "pin"`): read and shown, never moved
        self._looks = looks
        self._name, self._layout, self._follow, self._workers = name, layout, follow, workers
        self._table, self._slots_of_seat, self._host, self._policy = table, slots_of_seat, host, policy
        self._roles = [frozenset(s.roles) for s in layout.seats]
        n = len(layout.seats)
        self.states = [rule.SeatContention(hold=policy.calm_windows) for _ in range(n)]
        #: per seat: (pid, ns run, ns waited, when, its looks' ns on CPU, their ns off it)
        self._last: list[tuple[int, int, int, float, int, int] | None] = [None] * n
        #: (its seat's CPUs, the CPUs its worker was set to) while widened; None: on its seat's
        self._applied: list[tuple[tuple[int, ...], tuple[int, ...]] | None] = [None] * n
        self._refused: set[int] = set()  # seats whose last move was refused (warned once until one succeeds)
        self.widened = 0  # widenings carried out (tests, status)
        self.repinned = 0  # re-pins carried out

    def sample(self, now: float) -> None:
        """Read every running seat's worker over the window since the last sample; act."""
        placement = self._follow.placement.cpus
        for seat in range(len(self.states)):
            if placement[seat] is None:  # retired: its worker leaves
                if self._last[seat] is not None:
                    self._last[seat] = None
                    self._new_worker(seat)
                continue
            self._read(seat, now, placement)

    def _read(self, seat: int, now: float, placement) -> None:
        pid = self._workers.pids.get(seat)
        stat = self._host.schedstat(pid) if pid is not None else None
        # The looks are those of the thread that serves the ring, schedstat is the main
        # thread's: once a unit seceded (it submitted children), another thread may serve
        # the ring from then on, and its looks are taken from the main thread's reading,
        # which reads calmer (the rule clamps at none; `fleet.worker.process`, "secede").
        looked = self._looks(seat)
        last = self._last[seat]
        self._last[seat] = None if stat is None else (pid, stat[0], stat[1], now, looked[0], looked[1])
        if stat is None or last is None or last[0] != pid:
            if last is not None and (stat is None or last[0] != pid):
                self._new_worker(seat)
            return
        share = rule.wait_share(stat[0] - last[1], stat[1] - last[2], int((now - last[3]) * 1e9), self._policy,
                                (looked[0] - last[4], looked[1] - last[5]))
        state, action = rule.step(self.states[seat], share, self._policy)
        self.states[seat] = state
        if action is not None:
            self._publish(seat)
            log.info("fleet %s: seat %s %s (%.0f%% of its demand waited for a CPU)", self._name,
                     self._layout.seats[seat].name, "contended" if action == rule.WIDEN else "calm again",
                     100 * (share or 0.0))
        self._place(seat, pid, placement)

    def _new_worker(self, seat: int) -> None:
        """A seat's worker changed (or is gone): the new one starts on its seat's CPUs, calm."""
        old = self.states[seat]
        self.states[seat] = rule.SeatContention(hold=self._policy.calm_windows, episodes=old.episodes)
        if self._applied[seat] is not None:  # status showed the widened CPUs: the seat's own again
            self._applied[seat] = None
            home = self._workers.cpus_of(seat)
            for slot in self._slots_of_seat(seat) if home else ():  # (a retired seat's are its last epoch's)
                self._table.set_slot_meta(slot, cpus=home)
        if old.contended:
            self._publish(seat)

    def _place(self, seat: int, pid: int, placement) -> None:
        """Set the worker's CPUs to what its state asks, when they differ from what it has."""
        home = tuple(self._workers.cpus_of(seat))
        want = home
        if self.states[seat].contended and self._widen:
            share = rule.share_cpus(self._roles, placement, seat)
            if set(share) > set(home):
                want = share
        applied = self._applied[seat]
        # an epoch that moved the seat re-pinned its worker to its new CPUs
        now_on = applied[1] if applied is not None and applied[0] == home else home
        if want == now_on:
            return
        try:
            self._host.pin_process(pid, want)
        except OSError as exc:  # a CPU the cpuset took away meanwhile: the epoch that follows re-places it
            if seat not in self._refused:
                self._refused.add(seat)
                log.warning("fleet %s: cannot move seat %s's worker to CPUs %s: %s", self._name,
                            self._layout.seats[seat].name, list(want), exc)
            return
        self._refused.discard(seat)
        if want == home:
            self.repinned += 1
        else:
            self.widened += 1
        self._applied[seat] = None if want == home else (home, want)
        for slot in self._slots_of_seat(seat):
            self._table.set_slot_meta(slot, cpus=want)

    def _publish(self, seat: int) -> None:
        state = self.states[seat]
        for slot in self._slots_of_seat(seat):
            self._table.set_contention(slot, state.contended, state.episodes)
