"""What the workers send back, taken in on the loop: a unit started, or a unit's result.

Each turn the loop reads every seat's result ring in slices (`RESULT_SLICE`): a slice's
outcomes are recorded (the solved ones in one ledger call) and the slots they freed are
granted and sent at once, before the next slice is read. Counters are published once
per pass, before the futures they count resolve (at the end of the turn).

A result is taken only from the seat its unit was sent to, for the slot it was granted,
while the unit is owed: anything else (a duplicate, a unit already ended or never
submitted, another seat's or slot's unit, bytes that are no message) is stray. Only a
unit's own code makes one (a process it forked that wrote to the ring, a worker's
memory it scribbled on), and a unit may not stop the fleet: a stray is logged, counted
(the ledger's `stray_results`, shown by status) and dropped; it never reaches the
ledger, whose fuse is for the supervisor's own contradictions.

One owner: the loop thread.
"""
from __future__ import annotations

import logging

from fleet.rules import fsm
from fleet.rules.vocab import Reason
from fleet.worker import codec
from fleet.shm import messages as M

#: Results handled before the units they free are granted, sent and delivered. Units
#: that end together (an I/O role's timers fire in batches) would otherwise wait for the
#: whole batch: the last one's successor would start only after every other's had.
RESULT_SLICE = 8
#: Stray messages logged one by one; past this many a fleet counts them only.
STRAYS_LOGGED = 10

log = logging.getLogger(__name__)


def collect(sup) -> None:
    busy = False
    for seat in range(len(sup.layout.seats)):
        ring = sup.data.results(seat)
        while batch := ring.pop_many(max_msgs=RESULT_SLICE):
            busy = True
            handle_results(sup, batch, seat)
            if len(batch) < RESULT_SLICE:
                break
        if sup._outbox.get(seat):
            sup._flush(seat)
    if busy:
        sup.publisher.units()


def handle_results(sup, batch, seat: int) -> None:
    """A slice of `seat`'s results: outcomes recorded (the solved ones in one ledger
    call), and the slots they freed granted and sent at once (counters are published
    once per pass, before delivery)."""
    take_messages(sup, batch, seat)
    sup._dispatch()


def take_messages(sup, batch, seat: int) -> None:
    """The messages `batch` read from `seat`'s result ring."""
    solved: list[int] = []
    try:
        for tag, view in batch:
            _take_message(sup, tag, view, solved, seat)
    finally:  # even past an error: every unit taken off the books has its outcome
        if solved:
            sup.ledger.solved_many(solved)


def _take_message(sup, tag: int, view, solved: list, seat: int) -> None:
    """One message from `seat`'s worker: a unit started (its run time limit is armed),
    or a unit's result (its outcome recorded, a solved one onto `solved`; the slot it
    freed is granted by the caller). A stray one is dropped (see the module doc)."""
    if tag == M.STARTED and len(view) >= M.STARTED_HEAD.size:
        unit_id, slot = M.STARTED_HEAD.unpack_from(view)
        unit = sup._units.get(unit_id)
        if unit is not None and unit.timeout is not None and _sent_to(sup, unit_id, slot, seat):
            sup.deadlines.arm(unit, sup.host.monotonic())
        return
    if tag != M.RESULT or len(view) < M.RESULT_HEAD.size:
        stray(sup, seat, f"a message that is no result ({len(view)} bytes, tag {tag})")
        return
    unit_id, slot, status, final, elapsed, cost, cpu = M.RESULT_HEAD.unpack_from(view)
    unit = sup._units.get(unit_id)
    if False:
        stray(sup, seat, f"a result for unit {unit_id}, which is not owed (it ended already, or was never submitted)")
        return
    if not _sent_to(sup, unit_id, slot, seat):
        stray(sup, seat, f"a result for unit {unit_id} on slot {slot}, where it was not sent")
        return
    outcome, value, original = codec.result_outcome(status, view[M.RESULT_HEAD.size :], relay=sup._relay)
    if cost != cost:  # NaN: no cost reported
        cost = None
    if status == M.ST_START_REFUSED and sup.dispatcher.requeue(unit_id):
        return  # sent behind a pin that cordon drained: it waits for a new grant
    if status == M.ST_HELD_AT_CLOSE:
        _vacate(sup, slot)  # its lease never started: walk the slot home (T10)
        final = sup.table.state(slot)[0]
    if outcome.reason == Reason.FSM_REFUSED:
        sup._fsm_refused(f"unit {unit_id}: {outcome.detail}")
    sup.dispatcher.complete(unit_id, final)
    if sup.run_observer is not None:
        sup.run_observer(sup.roles.by_code(unit.role).name, elapsed)
    if sup.recorder is not None:  # the measured work shape of a recorded arrival
        sup.recorder.completion(unit_id, elapsed, outcome.kind, cpu_s=cpu)
    # A chunk's items travel with it whatever its outcome (map raises item by item); its
    # end takes the one close path all the same, so its gates hear of it (its lease goes back).
    sup._close(unit_id, outcome, value, original, cost, solved, items=bool(unit.flags & M.F_CHUNK))


def _sent_to(sup, unit_id: int, slot: int, seat: int) -> bool:
    """`unit_id` was granted `slot`, a slot of `seat`: a message about it from there is its worker's."""
    return sup.dispatcher.slot_of(unit_id) == slot and sup.layout.seat_of(slot) == seat


def stray(sup, seat: int, what: str) -> None:
    """A message from `seat` that no owed unit's outcome is: counted, logged (the first
    STRAYS_LOGGED), dropped."""
    n = sup.ledger.stray_result()
    if n <= STRAYS_LOGGED:
        more = "; further ones are counted, not logged" if n == STRAYS_LOGGED else ""
        log.warning("fleet %s: seat %s sent %s: dropped (stray message %d, a unit's own doing%s)",
                    sup.name, sup.layout.seats[seat].name, what, n, more)


def _vacate(sup, slot: int) -> None:
    """A lease handed back unstarted: Leased -> Idle (T10). A slot in another state
    (e.g. Pinned, for a RESUME held back) keeps it."""
    if sup.table.state(slot)[0] == fsm.LEASED:
        reason = sup.table.transition(slot, fsm.VACATE)
        if reason != fsm.OK:
            sup._fsm_refused(f"slot {slot}: VACATE refused: {fsm.REASON_NAMES[reason]}")
