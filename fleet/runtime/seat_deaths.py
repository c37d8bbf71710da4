"""The deaths shell: what the loop does when a seat's worker, or the zygote, is gone.

The supervisor learns of every worker exit itself, from the worker's pidfd (the zygote's
report of it may come first: `fleet.runtime.workers`). The loop then collects
what the dead worker already delivered, discards the tasks it never took, and asks
`fleet.runtime.deaths` (the pure decision) what the death means for each unit it still
owed: one it had started fails LaneDeath (Timeout for the unit it was killed for), one
it had not goes back to the head of its queue, unrun. It walks the seat's slots back to
Idle through legal transitions, and restarts the seat — unless one of the roles it ran
died more than `restart.max_restarts` times within `restart.within_seconds`: that role
is stopped (`RoleStops`) and its queued units fail RoleStopped.

Every death the supervisor did not cause itself (a lane death, 002 §14) holds the
posture Cordoned with the sticky `lane-death` cause until an operator releases it
(`fleetctl posture release lane-death`, `Fleet.posture_release`). Seats are re-forked
during shutdown too: shutdown waits for every queued unit.

A zygote that leaves a fork unanswered for `[restart] fork_server_timeout_s` (stopped,
wedged) is killed and replaced, as one that died: its workers go with it, their units
are owed as at any death, every seat is forked again. While the fleet closes, a worker
found stopped (SIGSTOP) for that long is killed as the supervisor's own kill: stopped,
it would hold its unit, and shutdown, for ever.

One owner: the loop thread (and boot's, while the first workers start).
"""
from __future__ import annotations

import logging
import signal

from fleet.shm import parcels
from fleet.rules import fsm
from fleet.rules import oom as oom_mod
from fleet.rules import posture as posture_mod
from fleet.rules.intensity import Deaths
from fleet.rules.vocab import Reason
from fleet.runtime import deaths as deaths_mod
from fleet.rules.errors import EXIT_INIT_FAILED, EXIT_RECYCLED, EXIT_RETIRED

log = logging.getLogger(__name__)
MIB = 1 << 20


class RoleStops:
    """The roles stopped for good, and why. The loop writes; a caller's thread reads only
    `view` (swapped whole) and `reasons`, to refuse a submit at once."""

    def __init__(self, restart):
        self._stopped: set[int] = set()
        self.view: frozenset = frozenset()  # codes of stopped roles, for callers
        self.reasons: dict[int, str] = {}  # role code -> why it stopped (its submits and units say it)
        self._deaths = Deaths(restart.max_restarts, restart.within_seconds)

    def __contains__(self, code: int) -> bool:
        return code in self._stopped

    def died(self, code: int, now: float) -> bool:
        """Count a death of role `code` (fleet.rules.intensity): True once it is past its limit."""
        return self._deaths.died(code, now)

    def stop(self, code: int, why: str) -> None:
        self._stopped.add(code)
        self.view = frozenset(self._stopped)  # callers refuse its submits from now on
        self.reasons[code] = why


class SeatDeaths:
    """What the loop does when a seat's worker, or the zygote, is gone: the seats, the
    books, the dispatcher's grants, the table's slot words and the roles' stops, as one
    death changes them. `dispatch` grants what the death let go (the loop's); `closing`
    says whether the fleet is closing (a zygote that died then is not replaced once
    nothing is owed)."""

    def __init__(self, *, name: str, roles, layout, restart, seats, results, books, dispatcher, table, deadlines,
                 role_stops, posture, publisher, host, dispatch, closing, oom=None):
        self._name, self._roles, self._layout, self._restart = name, roles, layout, restart
        self._seats, self._results, self._books, self._dispatcher = seats, results, books, dispatcher
        self.inside = None  # the children submitted from inside (fleet.runtime.inside), once composed
        self._table, self._deadlines, self._role_stops, self._posture = table, deadlines, role_stops, posture
        self._publisher, self._host, self._dispatch, self._closing = publisher, host, dispatch, closing
        #: role name -> workers recycled after one of its units passed its max_rss_mib (the loop writes)
        self.recycles: dict[str, int] = {}
        #: role name -> workers the kernel's OOM killer killed while they ran a unit of it ("?": none)
        self.oom_kills: dict[str, int] = {}
        # The memory group's OOM-kill counter (fleet.host.sampler.OomCounter; None: not read)
        # and what fleet.rules.oom made of its readings; the first reading is the baseline.
        self._oom, self._oom_books = oom, oom_mod.OomBooks()
        self.read_oom()

    def read_oom(self) -> None:
        """Read the group's OOM-kill counter (at boot, once a sample, at a death): kills seen
        stay claimable a while (fleet.rules.oom)."""
        if self._oom is not None:
            self._oom_books = oom_mod.observe(self._oom_books, self._host.now_ms(), self._oom.read())

    def _oom_killed(self, status: int, ours: bool) -> str | None:
        """Where the OOM kill of a worker that died with `status` was counted; None: it was not one."""
        if self._oom is None or ours or status != -signal.SIGKILL:
            return None
        self.read_oom()
        self._oom_books, killed = oom_mod.claim(self._oom_books, self._host.now_ms(), status, ours)
        return self._oom.path if killed else None

    def hear(self) -> None:
        """Read what the zygote sent and which workers died (the news counts first: news
        after this read is read next time); restart the zygote when it is gone or has
        stopped answering. Also after each wait that timed out, and once a sample: a
        zygote that died said nothing, and one stopped says nothing."""
        workers = self._seats.workers
        if not workers.hear(self._seats.zygote_news.value, self.seat_died):
            self.zygote_died()
        elif workers.stalled():
            self.zygote_stalled()
        if self._closing():
            workers.kill_stopped(workers.answer_s)

    def zygote_stalled(self) -> None:
        """The fork server left a fork unanswered past its bound: kill it and start anew."""
        workers = self._seats.workers
        log.error("fleet %s: worker fork server pid %d did not answer within %gs: replaced", self._name,
                  workers.zygote.pid, workers.answer_s)
        workers.kill_zygote()
        self.zygote_died()

    def seat_died(self, seat: int, pid: int | None, status: int, restart: bool = True) -> None:
        """A worker is gone (pid None: one a dead zygote may have forked and never told
        of). `restart=False` when its zygote died too (all seats are forked again once a
        new zygote runs)."""
        workers, books, dispatcher = self._seats.workers, self._books, self._dispatcher
        workers.gone(seat, pid)
        self._results.take_delivered(seat)
        recycled = self._results.recycling.pop(seat, None)  # what it said as it left, if it was recycled
        # What it sent is read: a parcel it made and never sent (killed mid-transfer) is no one's
        parcels.sweep(self._name, pid)
        # Tasks it never took would run again on its successor: drop them.
        self._seats.drop_unsent(seat)
        lost = dispatcher.seat_lost(seat)
        owed = [self._owed(item.unit_id, slot) for item, slot in lost]
        ours = workers.killed_by_us(pid)
        oom_where = self._oom_killed(status, ours)
        how = deaths_mod.cause(status, [unit.unit_id for unit in owed if unit.timed_out], oom_where)
        who = "the worker being forked" if pid is None else f"worker pid {pid}"
        worker = f"{who} of seat {self._layout.seats[seat].name} died ({how})"
        back = []  # never started: back to the head of their queues, unrun
        for (item, _slot), unit in zip(lost, owed):
            self._deadlines.forget(unit.unit_id)
            outcome = deaths_mod.verdict(unit, worker)
            if outcome is None:
                back.append(item)
            else:
                books.close(unit.unit_id, outcome)
        if self.inside is not None:
            back = self.inside.unorphaned(back)  # a child whose parent died with it ends Cancelled
        dispatcher.put_back_first(back)
        # Slots switch roles: the roles that died are those of the units it ran.
        dead_roles = {item.role for (item, _slot), unit in zip(lost, owed) if unit.started}
        self._reset_slots(seat)
        if oom_where is not None:
            self._count_oom(dead_roles)
        planned = status in (EXIT_RETIRED, EXIT_RECYCLED, EXIT_INIT_FAILED) and not ours
        if ours and not dispatcher.live(seat):
            # Its epoch retired the seat and its worker was told to leave (fleet.runtime.reseat):
            # no death, nothing to count against restart intensity.
            log.info("fleet %s: worker pid %d of retired seat %s left", self._name, pid, self._layout.seats[seat].name)
            keep = False
        elif planned:
            # No death: it ran its max_tasks or passed its role's max_rss_mib (replaced, as
            # any seat is; what was sent ahead to it went back to the queue above, unrun), or
            # its initializer failed (every worker would: its roles stop; fleet.worker.prepare).
            keep = self._worker_exited(seat, pid, status, recycled)
        else:
            # Count the death first: a role past its limit is stopped before anything could
            # be granted to the seat again (a cordon change below dispatches).
            keep = self._count_death(seat, how, dead_roles)
        if not ours and not planned:
            # Every lane death cordons (sticky) until an operator releases it (002 §14).
            self._posture.hold(posture_mod.LANE_DEATH)
        workers.death_handled(pid)
        # Re-fork even while shutting down: shutdown waits for every queued unit, and
        # only a live seat can run them (not re-forking here wedged shutdown for good).
        # A seat its epoch retired is not (fleet.runtime.reseat): its worker left on purpose.
        if keep and restart and dispatcher.live(seat):
            workers.fork(seat)
        self._dispatch()
        self._publisher.units()

    def _count_oom(self, codes) -> None:
        """Count an OOM kill for the roles of the units its worker ran ("?" when it ran none)."""
        for role in sorted(self._roles.by_code(code).name for code in codes) or ["?"]:
            self.oom_kills[role] = self.oom_kills.get(role, 0) + 1
            self._publisher.oom_killed(role)

    def _worker_exited(self, seat: int, pid: int, status: int, recycled: tuple | None = None) -> bool:
        """A worker that left on purpose (`seat_died`): True to fork its seat again.
        `recycled`: (role code, RSS bytes, bound bytes) a recycled worker sent as it left."""
        name = self._layout.seats[seat].name
        if status == EXIT_RECYCLED:
            role = "?" if recycled is None else self._roles.by_code(recycled[0]).name
            self.recycles[role] = self.recycles.get(role, 0) + 1
            self._publisher.recycled(role)
            rss, bound = ("?", "?") if recycled is None else (f"{recycled[1] / MIB:.1f}", f"{recycled[2] / MIB:.0f}")
            log.info("fleet %s: worker pid %d of seat %s recycled: RSS %s MiB over role %s's max_rss_mib %s MiB; replaced",
                     self._name, pid, name, rss, role, bound)
            return True
        if status == EXIT_RETIRED:
            log.info("fleet %s: worker pid %d of seat %s ran its max_tasks; replaced", self._name, pid, name)
            return True
        why = f"the worker initializer failed in worker pid {pid} (its traceback is in the worker's log)"
        for role in self._layout.seats[seat].roles:
            self.stop_role(self._roles.code(role), why)
        return not self._seat_stopped(seat)

    def _owed(self, unit_id: int, slot: int) -> deaths_mod.Owed:
        """What is known of a unit a dead seat owed on `slot`. Started: its worker records
        the id in the slot's row as it STARTs the slot, before it decodes the unit or runs
        the handler; a slot runs its units one after another, and the result of each that
        ended before was taken, so the id there is the one unit of the slot that may have run."""
        # A rider (a child on its parent's slot, fleet.rules.dispatch) said so as it started.
        started = self._dispatcher.took_ride(unit_id) or self._table.unit(slot) == unit_id
        return deaths_mod.Owed(unit_id, started, self._deadlines.timed_out(unit_id), self._books.stopped(unit_id))

    def _reset_slots(self, seat: int) -> None:
        """Walk a dead seat's slots back to Idle (fsm.RESET_PATHS), in any posture."""
        table = self._table
        for slot in self._dispatcher.slots_of_seat(seat):
            state = table.state(slot)[0]
            for event in fsm.RESET_PATHS.get(state, ()):
                reason = table.transition(slot, event)
                if reason != fsm.OK:
                    what = f"slot {slot}: reset {fsm.EVENT_NAMES[event]} refused: {fsm.REASON_NAMES[reason]}"
                    self._books.fsm_refused(what)
                    break
            table.set_slot_meta(slot, pid=0)

    def _count_death(self, seat: int, how: str, roles: set | None = None) -> bool:
        """Restart intensity (fleet.rules.intensity): True to restart the seat; False stops its roles.
        A death counts for `roles` (those of the units the worker ran), else for every role
        that may run on the seat."""
        now = self._host.monotonic()
        codes = sorted(roles) if roles else map(self._roles.code, self._layout.seats[seat].roles)
        stop = [code for code in codes if self._role_stops.died(code, now)]
        log.warning("fleet %s: seat %s worker died (%s)", self._name, self._layout.seats[seat].name, how)
        for code in stop:
            self.stop_role(code)
        return not self._seat_stopped(seat)

    def _seat_stopped(self, seat: int) -> bool:
        """Every role the seat serves was stopped: it is not restarted."""
        return all(self._roles.code(r) in self._role_stops for r in self._layout.seats[seat].roles)

    def stop_role(self, code: int, why: str | None = None) -> None:
        """Stop role `code` for good: it exceeded its restart intensity (or `why`)."""
        if code in self._role_stops:
            return
        name = self._roles.by_code(code).name
        limit = self._restart
        if why is None:
            log.error("fleet %s: role %s died more than %d times in %ss: stopped; its queued units fail",
                      self._name, name, limit.max_restarts, limit.within_seconds)
            why = f"role {name} exceeded its restart intensity"
        else:
            log.error("fleet %s: role %s stopped: %s; its queued units fail", self._name, name, why)
        self._role_stops.stop(code, why)
        for item in self._dispatcher.drain_queue(code):
            self._books.fail_unstarted(item.unit_id, Reason.ROLE_STOPPED, why)
        self._posture.hold(posture_mod.LANE_DEATH)

    def zygote_died(self) -> None:
        """The fork server is gone: its workers die with it. Fail what they owed, start again."""
        workers = self._seats.workers
        code = workers.zygote_lost()
        if code is None:
            return
        log.error("fleet %s: worker fork server exited (code %s)", self._name, code)
        orphans = workers.orphaned()  # killed and gone
        # A fork it never answered may have happened all the same: the worker, unknown
        # here, may have taken the tasks sent to its seat (even started one) before it
        # died with the zygote (reaped above: nothing of its runs any more). Its seat
        # owes them as any dead seat does; left as they were, they waited for ever.
        unanswered = workers.unanswered() - set(orphans.values())
        for pid, seat in orphans.items():
            self.seat_died(seat, pid, -signal.SIGKILL, restart=False)
        for seat in sorted(unanswered):
            if any(self._dispatcher.units_in_flight(slot) for slot in self._dispatcher.slots_of_seat(seat)):
                self.seat_died(seat, None, -signal.SIGKILL, restart=False)
        # Start a new one even while shutting down: queued units still need seats, and
        # shutdown waits for them (the loop exits, and tears it down, once none is owed).
        if self._closing() and not len(self._books):
            return
        workers.replace_zygote()
        for seat in range(len(self._layout.seats)):
            if not self._seat_stopped(seat) and self._dispatcher.live(seat):
                workers.fork(seat)
