"""What the workers send back, taken in on the loop: a unit started, or a unit's result.

Each turn the loop reads every seat's result ring in slices (`RESULT_SLICE`): a slice's
outcomes are recorded (the solved ones in one ledger call) and the slots they freed are
granted and sent at once, before the next slice is read. Counters are published once
per pass, before the futures they count resolve (at the end of the turn).

A plain unit's solved result (`LoopUnit.plain`: no gate ever saw it; a unit's value, or
a map chunk's values when every item solved) takes the batch path when no watch, arrival
log or run observer listens (`take`): a slice's plain solved units are checked and their
slots completed in one pass, their outcomes recorded in one books call
(`Books.close_solved`) and their run times paced in one call per role; any other message
of the slice, and every message of another unit, takes the path of one message
(`_take_message`). Both keep the same checks; `batched` counts the batch path's.

A result is taken only from the seat its unit was sent to, for the slot it was granted,
while the unit is owed: anything else (a duplicate, a unit already ended or never
submitted, another seat's or slot's unit, bytes that are no message) is stray. Only a
unit's own code makes one (a process it forked that wrote to the ring, a worker's
memory it scribbled on), and a unit may not stop the fleet: a stray is logged, counted
(the ledger's `stray_results`, shown by status) and dropped (`Books.stray`); it never
reaches the ledger's outcomes, whose fuse is for the supervisor's own contradictions.

One owner: the loop thread.
"""
from __future__ import annotations

from fleet.rules import fsm
from fleet.rules.outcomes import SOLVED
from fleet.rules.pace import Pace
from fleet.rules.vocab import Reason
from fleet.shm import messages as M
from fleet.worker import codec

#: Statuses of units that never ran: their elapsed time says nothing of the role's run time.
_UNRUN = frozenset((M.ST_START_REFUSED, M.ST_HELD_AT_CLOSE, M.ST_COMPLETION_REFUSED))
#: Results handled before the units they free are granted, sent and delivered. Units
#: that end together (an I/O role's timers fire in batches) would otherwise wait for the
#: whole batch: the last one's successor would start only after every other's had.
RESULT_SLICE = 8
#: Payload bytes a slice takes at most (`Ring.pop_many`'s budget).
RESULT_BYTES = 1 << 16


class Results:
    """Takes in what the seats' workers send back: into the books, the dispatcher's
    completions, the deadlines, the table's slot words and the arrival log.

    `dispatch` grants and sends what the freed slots can take (the loop's); `relay`:
    results stay pickled for fleetd's clients (`codec.result_outcome`); `recorder`: the
    arrival log, which records each run's measured shape; `paced`: send ahead what the
    units' run time calls for (`fleet.rules.pace`), not the roles' whole lookahead."""

    def __init__(self, seats, books, dispatcher, deadlines, table, roles, host, publisher, dispatch, *,
                 relay: bool = False, recorder=None, paced: bool = False):
        self._seats, self._books, self._dispatcher, self._deadlines = seats, books, dispatcher, deadlines
        self._table, self._roles, self._host, self._publisher = table, roles, host, publisher
        self._dispatch, self._relay, self._recorder = dispatch, relay, recorder
        self._run_observer = None
        self._rings = None  # (seat, result ring, its taker) per seat, made at the first collect
        self.batched = 0  # solved results of plain units taken through the batch path
        self.inside = None  # the children submitted from inside (fleet.runtime.inside), once composed
        #: seat -> (role code, RSS bytes, bound bytes) its worker sent as it left to be
        #: recycled (max_rss_mib); the seat's death handling takes it (fleet.runtime.seat_deaths)
        self.recycling: dict[int, tuple[int, int, int]] = {}
        # `paced`: what each role sends ahead to a busy slot follows its units' run time
        # (fleet.rules.pace), enough to keep a worker busy and no more out of cancel's reach.
        self._pace = Pace(dispatcher.ahead_caps()) if paced else None
        for code, depth in enumerate(self._pace.depths if paced else ()):
            dispatcher.pace(code, depth)

    def observe_runs(self, observer) -> None:
        """From here on, ``observer(role name, seconds)`` hears of each run (the metrics'
        histogram, once boot started the exporter)."""
        self._run_observer = observer

    def collect(self) -> None:
        """Every seat's results, slice by slice, until its ring is empty; counters
        published once, if any came."""
        busy = False
        rings = self._rings
        if rings is None:
            rings = self._rings = self._seats.result_rings()
        for seat, ring, take in rings:
            while batch := take(RESULT_BYTES, RESULT_SLICE):
                busy = True
                self.handle(batch, seat)
                # A short slice may be short for bytes (pop_many's budget), not for want of
                # messages: stop only at an empty ring. A result left in it would wait for
                # the loop's idle timeout, as its worker rang the bell already.
                if len(batch) < RESULT_SLICE and not ring.used:
                    break
        self._seats.flush_waiting()  # tasks that waited for room: the results above made some
        if busy:
            self._publisher.units()

    def handle(self, batch, seat: int) -> None:
        """A slice of `seat`'s results: outcomes recorded (the solved ones in one ledger
        call), and the slots they freed granted and sent at once (counters are published
        once per pass, before delivery)."""
        self.take(batch, seat)
        self._dispatch()

    def take(self, batch, seat: int) -> None:
        """A batch of messages from `seat` into the books (the slots they free are not granted here)."""
        solved: list[int] = []
        try:
            if self._books.plain_ends and self._recorder is None and self._run_observer is None:
                self._take_plain(batch, seat, solved)
            else:
                for tag, view in batch:
                    self._take_message(tag, view, solved, seat)
        finally:  # even past an error: every unit taken off the books has its outcome
            if solved:
                self._books.solved_many(solved)

    def _take_plain(self, batch, seat: int, solved: list) -> None:
        """`batch` with its plain units' solved results in bulk (see the module doc): each
        checked as `_take_message` checks it, its slot completed at once; their outcomes
        recorded and their run times paced together, before any other message's outcome
        and at the slice's end (so outcomes resolve in the order their results came).
        Anything else goes through `_take_message`, in its place."""
        get, slot_of, complete = self._books.get, self._dispatcher.slot_of, self._dispatcher.complete
        seat_of, outcome_of, relay = self._seats.slot_seats, codec.solved_outcome, self._relay
        # a plain unit's solved result, or a chunk's whose every item solved: the statuses
        # `codec.solved_outcome` decodes
        unpack, head, solved_statuses = M.RESULT_HEAD.unpack_from, M.RESULT_HEAD.size, codec.SOLVED_BODIES
        ended: list = []  # (unit, value, run time), in the order their results came
        try:
            for tag, view in batch:
                if tag == M.RESULT and len(view) >= head:
                    unit_id, slot, status, final, elapsed, cost, cpu = unpack(view)
                    if status in solved_statuses:
                        unit = get(unit_id)
                        if unit is not None and unit.plain and slot_of(unit_id) == slot and seat_of[slot] == seat:
                            outcome, value, original = outcome_of(status, view[head:], relay)
                            complete(unit_id, final)
                            if outcome.kind == SOLVED:
                                ended.append((unit, value, elapsed))
                                continue
                            # its value could not be read (ResultError): the one path's end
                            if ended:
                                self._close_plain(ended, solved)
                                ended = []
                            self._ended(unit, unit_id, status, elapsed, cpu, outcome, value, original,
                                        None if cost != cost else cost, solved)
                            continue
                if ended:
                    self._close_plain(ended, solved)
                    ended = []
                self._take_message(tag, view, solved, seat)
        finally:  # even past an error: the units completed so far get their outcome
            if ended:
                self._close_plain(ended, solved)

    def _close_plain(self, ended: list, solved: list) -> None:
        """Plain units' solved ends, ``[(unit, value, run seconds), ...]``: recorded in one
        books call (their ids onto `solved`), their run times paced in one call per role."""
        self.batched += len(ended)
        self._books.close_solved(ended, solved)
        pace = self._pace
        if pace is None:
            return
        runs: dict[int, list] = {}  # role -> run times, in order
        for unit, _value, elapsed in ended:
            run = runs.get(unit.role)
            if run is None:
                runs[unit.role] = [elapsed]
            else:
                run.append(elapsed)
        for code, seconds in runs.items():
            depth = pace.ran_many(code, seconds)
            if depth is not None:
                self._dispatcher.pace(code, depth)

    def take_delivered(self, seat: int) -> None:
        """Apply every result a (dead or stopped) worker pushed before it went."""
        ring = self._seats.results(seat)
        batch = ring.pop_many()
        while batch:
            self.take(batch, seat)
            batch = ring.pop_many()

    def _take_message(self, tag: int, view, solved: list, seat: int) -> None:
        """One message from `seat`'s worker: a unit started (its run time limit is armed),
        or a unit's result (its outcome recorded, a solved one onto `solved`; the slot it
        freed is granted by the caller). A stray one is dropped (see the module doc)."""
        books = self._books
        if tag == M.STARTED and len(view) >= M.STARTED_HEAD.size:
            unit_id, slot = M.STARTED_HEAD.unpack_from(view)
            unit = books.get(unit_id)
            if unit is not None and self._sent_to(unit_id, slot, seat):
                self._dispatcher.rode(unit_id)  # a rider's evidence that it started (seat deaths read it)
                if unit.timeout is not None:
                    self._deadlines.arm(unit, self._host.monotonic())
            return
        if tag == M.CHILD:
            self.inside.child(seat, view)
            return
        if tag == M.RECYCLING and len(view) >= M.RECYCLING_HEAD.size:
            self.recycling[seat] = M.RECYCLING_HEAD.unpack_from(view)
            return
        if tag != M.RESULT or len(view) < M.RESULT_HEAD.size:
            books.stray(self._seats.name(seat), f"a message that is no result ({len(view)} bytes, tag {tag})")
            return
        unit_id, slot, status, final, elapsed, cost, cpu = M.RESULT_HEAD.unpack_from(view)
        unit = books.get(unit_id)
        if unit is None:
            books.stray(self._seats.name(seat), f"a result for unit {unit_id}, which is not owed "
                        "(it ended already, or was never submitted)")
            codec.drop_parcel(status, view[M.RESULT_HEAD.size :])
            return
        if not self._sent_to(unit_id, slot, seat):
            books.stray(self._seats.name(seat), f"a result for unit {unit_id} on slot {slot}, where it was not sent")
            codec.drop_parcel(status, view[M.RESULT_HEAD.size :])
            return
        outcome, value, original = codec.result_outcome(status, view[M.RESULT_HEAD.size :], relay=self._relay)
        if cost != cost:  # NaN: no cost reported
            cost = None
        if status == M.ST_START_REFUSED and self._dispatcher.requeue(unit_id):
            return  # sent behind a pin that cordon drained: it waits for a new grant
        if status == M.ST_HELD_AT_CLOSE:
            self._vacate(slot)  # its lease never started: walk the slot home (T10)
            final = self._table.state(slot)[0]
        if outcome.reason == Reason.FSM_REFUSED:
            books.fsm_refused(f"unit {unit_id}: {outcome.detail}")
        self._dispatcher.complete(unit_id, final)
        self._ended(unit, unit_id, status, elapsed, cpu, outcome, value, original, cost, solved)

    def _ended(self, unit, unit_id: int, status: int, elapsed: float, cpu: float, outcome, value, original, cost,
               solved: list) -> None:
        """A result's outcome, its slot completed: paced, observed, recorded, and the unit closed."""
        books = self._books
        if self._pace is not None and status not in _UNRUN:
            depth = self._pace.ran(unit.role, elapsed)
            if depth is not None:
                self._dispatcher.pace(unit.role, depth)
        if self._run_observer is not None:
            self._run_observer(self._roles.by_code(unit.role).name, elapsed)
        if self._books.watch is not None:  # its start, for its span
            self._books.watch.ran(unit_id, elapsed)
        if self._recorder is not None:  # the measured work shape of a recorded arrival
            self._recorder.completion(unit_id, elapsed, outcome.kind, cpu_s=cpu)
        # A chunk's items travel with it whatever its outcome (map raises item by item); its
        # end takes the one close path all the same, so its gates hear of it (its lease goes back).
        books.close(unit_id, outcome, value, original, cost, solved, items=bool(unit.flags & M.F_CHUNK))

    def sent_to(self, unit_id: int, seat: int) -> bool:
        """`unit_id` is in flight on a slot of `seat`."""
        slot = self._dispatcher.slot_of(unit_id)
        return slot is not None and self._seats.seat_of(slot) == seat

    def _sent_to(self, unit_id: int, slot: int, seat: int) -> bool:
        """`unit_id` was granted `slot`, a slot of `seat`: a message about it from there is its worker's."""
        return self._dispatcher.slot_of(unit_id) == slot and self._seats.seat_of(slot) == seat

    def _vacate(self, slot: int) -> None:
        """A lease handed back unstarted: Leased -> Idle (T10). A slot in another state
        (e.g. Pinned, for a RESUME held back) keeps it."""
        table = self._table
        if table.state(slot)[0] == fsm.LEASED:
            reason = table.transition(slot, fsm.VACATE)
            if reason != fsm.OK:
                self._books.fsm_refused(f"slot {slot}: VACATE refused: {fsm.REASON_NAMES[reason]}")
