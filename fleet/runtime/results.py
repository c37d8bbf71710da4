"""What the workers send back, taken in on the loop: a unit started, or a unit's result.

Each turn the loop reads every seat's result ring in slices (`RESULT_SLICE`): a slice's
outcomes are recorded (the solved ones in one ledger call) and the slots they freed are
granted and sent at once, before the next slice is read. Counters are published once
per pass, before the futures they count resolve (at the end of the turn).

One owner: the loop thread.
"""
from __future__ import annotations

from fleet.rules import fsm
from fleet.rules.vocab import Reason
from fleet.shm import messages as M
from fleet.worker import codec

#: Results handled before the units they free are granted, sent and delivered. Units
#: that end together (an I/O role's timers fire in batches) would otherwise wait for the
#: whole batch: the last one's successor would start only after every other's had.
RESULT_SLICE = 8


class Results:
    """Takes in what the seats' workers send back: into the books, the dispatcher's
    completions, the deadlines, the table's slot words and the arrival log.

    `dispatch` grants and sends what the freed slots can take (the loop's); `relay`:
    results stay pickled for fleetd's clients (`codec.result_outcome`); `recorder`: the
    arrival log, which records each run's measured shape."""

    def __init__(self, seats, books, dispatcher, deadlines, table, roles, host, publisher, dispatch, *,
                 relay: bool = False, recorder=None):
        self._seats, self._books, self._dispatcher, self._deadlines = seats, books, dispatcher, deadlines
        self._table, self._roles, self._host, self._publisher = table, roles, host, publisher
        self._dispatch, self._relay, self._recorder = dispatch, relay, recorder
        self._run_observer = None

    def observe_runs(self, observer) -> None:
        """From here on, ``observer(role name, seconds)`` hears of each run (the metrics'
        histogram, once boot started the exporter)."""
        self._run_observer = observer

    def collect(self) -> None:
        """Every seat's results, slice by slice; counters published once, if any came."""
        busy = False
        seats = self._seats
        for seat in range(seats.count):
            ring = seats.results(seat)
            while batch := ring.pop_many(max_msgs=RESULT_SLICE):
                busy = True
                self.handle(batch)
                if len(batch) < RESULT_SLICE:
                    break
            seats.flush_waiting(seat)
        if busy:
            self._publisher.units()

    def handle(self, batch) -> None:
        """A slice of results: outcomes recorded (the solved ones in one ledger call), and
        the slots they freed granted and sent at once (counters are published once per
        pass, before delivery)."""
        self.take(batch)
        self._dispatch()

    def take(self, batch) -> None:
        """A batch of messages into the books (the slots they free are not granted here)."""
        solved: list[int] = []
        try:
            for tag, view in batch:
                self._take_message(tag, view, solved)
        finally:  # even past an error: every unit taken off the books has its outcome
            if solved:
                self._books.solved_many(solved)

    def take_delivered(self, seat: int) -> None:
        """Apply every result a (dead or stopped) worker pushed before it went."""
        ring = self._seats.results(seat)
        batch = ring.pop_many()
        while batch:
            self.take(batch)
            batch = ring.pop_many()

    def _take_message(self, tag: int, view, solved: list) -> None:
        """One message from a worker: a unit started (its run time limit is armed), or a
        unit's result (its outcome recorded, a solved one onto `solved`; the slot it
        freed is granted by the caller)."""
        books = self._books
        if tag == M.STARTED:
            unit_id, _slot = M.STARTED_HEAD.unpack_from(view)
            unit = books.get(unit_id)
            if unit is not None and unit.timeout is not None:
                self._deadlines.arm(unit, self._host.monotonic())
            return
        unit_id, slot, status, final, elapsed, cost, cpu = M.RESULT_HEAD.unpack_from(view)
        outcome, value, original = codec.result_outcome(status, view[M.RESULT_HEAD.size :], relay=self._relay)
        if cost != cost:  # NaN: no cost reported
            cost = None
        unit = books.get(unit_id)
        if status == M.ST_START_REFUSED and unit is not None and self._dispatcher.requeue(unit_id):
            return  # sent behind a pin that cordon drained: it waits for a new grant
        if status == M.ST_HELD_AT_CLOSE and unit is not None:
            self._vacate(slot)  # its lease never started: walk the slot home (T10)
            final = self._table.state(slot)[0]
        if outcome.reason == Reason.FSM_REFUSED:
            books.fsm_refused(f"unit {unit_id}: {outcome.detail}")
        if unit is not None:
            self._dispatcher.complete(unit_id, final)
            if self._run_observer is not None:
                self._run_observer(self._roles.by_code(unit.role).name, elapsed)
            if self._recorder is not None:  # the measured work shape of a recorded arrival
                self._recorder.completion(unit_id, elapsed, outcome.kind, cpu_s=cpu)
        # A chunk's items travel with it whatever its outcome (map raises item by item); its
        # end takes the one close path all the same, so its gates hear of it (its lease goes back).
        books.close(unit_id, outcome, value, original, cost, solved,
                    items=unit is not None and bool(unit.flags & M.F_CHUNK))

    def _vacate(self, slot: int) -> None:
        """A lease handed back unstarted: Leased -> Idle (T10). A slot in another state
        (e.g. Pinned, for a RESUME held back) keeps it."""
        table = self._table
        if table.state(slot)[0] == fsm.LEASED:
            reason = table.transition(slot, fsm.VACATE)
            if reason != fsm.OK:
                self._books.fsm_refused(f"slot {slot}: VACATE refused: {fsm.REASON_NAMES[reason]}")
