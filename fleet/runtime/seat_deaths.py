"""The deaths shell: what the loop does when a seat's worker, or the zygote, is gone.

The zygote reports every worker exit (`fleet.runtime.workers`). The loop then collects
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

These run on the loop thread (and on boot's, while the first workers start).
"""
from __future__ import annotations

import logging
import signal

from fleet.rules import fsm
from fleet.rules import posture as posture_mod
from fleet.rules.intensity import Deaths
from fleet.rules.vocab import Reason
from fleet.runtime import deaths as deaths_mod
from fleet.runtime import posture_effects, results
from fleet.rules.errors import EXIT_INIT_FAILED, EXIT_RETIRED

log = logging.getLogger(__name__)


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


def hear(sup) -> None:
    """Read what the zygote sent (its news count first: news after this read is
    read next time); restart it when it is gone. Also after each wait that timed
    out, and once a sample (`posture_effects.sample`): a zygote that died said nothing."""
    workers = sup.workers
    workers.news_seen = sup.data.zygote_news.value
    if not workers.read(lambda seat, pid, status: seat_died(sup, seat, pid, status)):
        zygote_died(sup)


def seat_died(sup, seat: int, pid: int, status: int, restart: bool = True) -> None:
    """A worker is gone. `restart=False` when its zygote died too (all seats are
    forked again once a new zygote runs)."""
    workers = sup.workers
    workers.pids.pop(seat, None)
    take_delivered(sup, seat)
    # Tasks it never took would run again on its successor: drop them.
    tasks = sup.data.tasks(seat)
    while tasks.pop_many():
        pass
    sup._outbox.pop(seat, None)
    lost = sup.dispatcher.seat_lost(seat)
    owed = [_owed(sup, item.unit_id, slot) for item, slot in lost]
    how = deaths_mod.cause(status, [unit.unit_id for unit in owed if unit.timed_out])
    worker = f"worker pid {pid} of seat {sup.layout.seats[seat].name} died ({how})"
    back = []  # never started: back to the head of their queues, unrun
    for (item, _slot), unit in zip(lost, owed):
        sup.deadlines.timed_out.discard(unit.unit_id)
        outcome = deaths_mod.verdict(unit, worker)
        if outcome is None:
            back.append(item)
        else:
            sup._close(unit.unit_id, outcome)
    sup.dispatcher.put_back_first(back)
    # Slots switch roles: the roles that died are those of the units it ran.
    dead_roles = {item.role for (item, _slot), unit in zip(lost, owed) if unit.started}
    _reset_slots(sup, seat)
    planned = status in (EXIT_RETIRED, EXIT_INIT_FAILED) and pid not in workers.killed
    if planned:
        # No death: it ran its max_tasks (replaced, as any seat is), or its initializer
        # failed (every worker would: its roles stop; fleet.worker.prepare).
        keep = _worker_exited(sup, seat, pid, status)
    else:
        # Count the death first: a role past its limit is stopped before anything could
        # be granted to the seat again (a cordon change below dispatches).
        keep = _count_death(sup, seat, how, dead_roles)
    if pid not in workers.killed and not planned:
        # Every lane death cordons (sticky) until an operator releases it (002 §14).
        posture_effects.after_posture_change(sup, sup.posture.hold(posture_mod.LANE_DEATH, sup.host.now_ms()))
    workers.killed.discard(pid)
    # Re-fork even while shutting down: shutdown waits for every queued unit, and
    # only a live seat can run them (not re-forking here wedged shutdown for good).
    if keep and restart:
        workers.fork(seat)
    sup._dispatch()
    sup.publisher.units()


def _worker_exited(sup, seat: int, pid: int, status: int) -> bool:
    """A worker that left on purpose (`seat_died`): True to fork its seat again."""
    name = sup.layout.seats[seat].name
    if status == EXIT_RETIRED:
        log.info("fleet %s: worker pid %d of seat %s ran its max_tasks; replaced", sup.name, pid, name)
        return True
    why = f"the worker initializer failed in worker pid {pid} (its traceback is in the worker's log)"
    for role in sup.layout.seats[seat].roles:
        stop_role(sup, sup.roles.code(role), why)
    return not _seat_stopped(sup, seat)


def _owed(sup, unit_id: int, slot: int) -> deaths_mod.Owed:
    """What is known of a unit a dead seat owed on `slot`. Started: its worker records
    the id in the slot's row as it STARTs the slot, before it decodes the unit or runs
    the handler; a slot runs its units one after another, and the result of each that
    ended before was taken, so the id there is the one unit of the slot that may have run."""
    return deaths_mod.Owed(unit_id, sup.table.unit(slot) == unit_id, unit_id in sup.deadlines.timed_out,
                           sup._stops.get(unit_id))


def take_delivered(sup, seat: int) -> None:
    """Apply every result a (dead or stopped) worker pushed before it went."""
    ring = sup.data.results(seat)
    batch = ring.pop_many()
    while batch:
        results.take_messages(sup, batch, seat)
        batch = ring.pop_many()


def _reset_slots(sup, seat: int) -> None:
    """Walk a dead seat's slots back to Idle (fsm.RESET_PATHS), in any posture."""
    for slot in sup.dispatcher.slots_of_seat(seat):
        state = sup.table.state(slot)[0]
        for event in fsm.RESET_PATHS.get(state, ()):
            reason = sup.table.transition(slot, event)
            if reason != fsm.OK:
                what = f"slot {slot}: reset {fsm.EVENT_NAMES[event]} refused: {fsm.REASON_NAMES[reason]}"
                sup._fsm_refused(what)
                break
        sup.table.set_slot_meta(slot, pid=0)


def _count_death(sup, seat: int, how: str, roles: set | None = None) -> bool:
    """Restart intensity (fleet.rules.intensity): True to restart the seat; False stops its roles.
    A death counts for `roles` (those of the units the worker ran), else for every role
    that may run on the seat."""
    now = sup.host.monotonic()
    codes = sorted(roles) if roles else map(sup.roles.code, sup.layout.seats[seat].roles)
    stop = [code for code in codes if sup.role_stops.died(code, now)]
    log.warning("fleet %s: seat %s worker died (%s)", sup.name, sup.layout.seats[seat].name, how)
    for code in stop:
        stop_role(sup, code)
    return not _seat_stopped(sup, seat)


def _seat_stopped(sup, seat: int) -> bool:
    """Every role the seat serves was stopped: it is not restarted."""
    return all(sup.roles.code(r) in sup.role_stops for r in sup.layout.seats[seat].roles)


def stop_role(sup, code: int, why: str | None = None) -> None:
    """Stop role `code` for good: it exceeded its restart intensity (or `why`)."""
    if code in sup.role_stops:
        return
    name = sup.roles.by_code(code).name
    limit = sup.config.restart
    if why is None:
        log.error("fleet %s: role %s died more than %d times in %ss: stopped; its queued units fail",
                  sup.name, name, limit.max_restarts, limit.within_seconds)
        why = f"role {name} exceeded its restart intensity"
    else:
        log.error("fleet %s: role %s stopped: %s; its queued units fail", sup.name, name, why)
    sup.role_stops.stop(code, why)
    for item in sup.dispatcher.drain_queue(code):
        sup._fail_unstarted(item.unit_id, Reason.ROLE_STOPPED, why)
    posture_effects.after_posture_change(sup, sup.posture.hold(posture_mod.LANE_DEATH, sup.host.now_ms()))


def zygote_died(sup) -> None:
    """The fork server is gone: its workers die with it. Fail what they owed, start again."""
    workers = sup.workers
    if workers.zygote is None or workers.zygote_gone:
        return
    workers.zygote_gone = True
    code = workers.zygote.wait()
    log.error("fleet %s: worker fork server exited (code %s)", sup.name, code)
    pids = dict(workers.seat_of_pid)
    for pid in pids:
        sup.host.wait_gone(pid)  # they die with it (parent-death signal)
    for pid, seat in pids.items():
        workers.seat_of_pid.pop(pid, None)
        seat_died(sup, seat, pid, -signal.SIGKILL, restart=False)
    # Start a new one even while shutting down: queued units still need seats, and
    # shutdown waits for them (the loop exits, and tears it down, once none is owed).
    if sup._closing and not sup._units:
        return
    workers.pending_forks.clear()
    workers.zygote.exit(timeout=0.5)
    workers.restart_zygote()
    workers.zygote_gone = False
    for seat in range(len(sup.layout.seats)):
        if not _seat_stopped(sup, seat):
            workers.fork(seat)
