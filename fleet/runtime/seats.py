"""The seats: each seat's rings to and from its worker, the tasks waiting to go out, and
the worker processes (`fleet.runtime.workers.Workers`).

A dispatch pass sends each seat its tasks in one call (`send`): pushed, and its worker
woken once; what does not fit the ring waits in the seat's outbox, behind any already
waiting, so the order holds, and goes out as the worker makes room (`flush`). A seat
whose worker died has its unsent tasks dropped (`drop_unsent`): its successor must
not run them again.

One owner: boot's thread builds it, then the loop thread alone uses it.
"""
from __future__ import annotations

import collections

from fleet.shm import messages as M


class Seats:
    """The data plane's rings, the seats' outboxes and their worker processes."""

    def __init__(self, data, workers, layout):
        self.workers = workers
        self._data, self._layout = data, layout
        #: slot -> its seat (`seat_of`, as a tuple the result pass indexes: the layout is fixed)
        self.slot_seats = tuple(s.seat for s in layout.slots)
        self._outbox: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        #: zygote_news_count() -> the zygote's news count (it bumps it and rings as it sends an
        #: event), read with no Python frame: the loop looks at it every turn
        self.zygote_news_count = data.zygote_news.count

    @property
    def count(self) -> int:
        return len(self._layout.seats)

    @property
    def bell(self):
        """The loop's bell: everything that comes in for the loop rings it."""
        return self._data.bell

    @property
    def zygote_news(self):
        """The zygote's news count (it bumps it and rings as it sends an event)."""
        return self._data.zygote_news

    # ------------------------------------------------------------------ out
    def send(self, seat: int, tasks: list) -> None:
        """A seat's tasks of one pass, each a pair (head, body) of bytes: pushed and its
        worker woken in one call; what does not fit waits in its outbox (behind any
        already waiting, so the order holds)."""
        outbox = self._outbox[seat]
        if outbox:
            outbox.extend(tasks)
            self.flush(seat)
            return
        if type(tasks[0]) is _Other:  # another kind of message (send_message)
            outbox.extend(tasks)
            self.flush(seat)
            return
        pushed = self._data.tasks(seat).push_many(M.TASK, tasks)
        if pushed < len(tasks):
            outbox.extend(tasks[pushed:])
            self.flush(seat)

    def hand(self, seat: int, handed) -> None:
        """Send a payload's memfd (`fleet.shm.handoff.Handed`) to the seat's worker, ahead of
        the task that names it."""
        handed.send(self.workers.channel(seat), seat)

    def send_message(self, seat: int, tag: int, message: bytes) -> None:
        """One message of another kind than a task (a child's outcome, M.CHILD_DONE), in
        the same order as the tasks: it waits in the outbox behind them when they wait."""
        self.send(seat, [_Other(tag, message)])

    def task_max(self, seat: int) -> int:
        """The longest message the seat's tasks ring takes."""
        return self._data.tasks(seat).max_message

    def flush(self, seat: int) -> None:
        """Push what waits in the seat's outbox, as far as its ring has room; wake its worker.
        An entry is a task's (head, body), or another kind of message (`_Other`)."""
        ring, outbox = self._data.tasks(seat), self._outbox[seat]
        while outbox:
            entry = outbox[0]
            if not (ring.push(entry.tag, entry.data) if type(entry) is _Other else ring.push2(M.TASK, *entry)):
                break
            outbox.popleft()
        ring.notify()

    def flush_waiting(self) -> None:
        """`flush` every seat whose outbox holds something (once a turn, after its results)."""
        for seat, outbox in self._outbox.items():
            if outbox:
                self.flush(seat)

    def waiting(self, seat: int) -> bool:
        """Whether tasks wait in the seat's outbox (not yet on its ring)."""
        return bool(self._outbox.get(seat))

    def drop_unsent(self, seat: int) -> None:
        """A seat whose worker died: the tasks it never took would run again on its
        successor, so they go (from its ring and its outbox)."""
        tasks = self._data.tasks(seat)
        while tasks.pop_many():
            pass
        self._outbox.pop(seat, None)

    # ------------------------------------------------------------------ in
    def looked(self, seat: int) -> tuple[int, int, int]:
        """What the seat's workers' looks for a task on its tasks ring took, in ns: on CPU,
        off it in short yields, off it in long ones (`fleet.shm.dataplane.Ring.looked`;
        the contention watch's reading)."""
        return self._data.tasks(seat).looked()

    def results(self, seat: int):
        """The seat's result ring (what its worker sends back)."""
        return self._data.results(seat)

    def result_rings(self) -> tuple:
        """(seat, its result ring, the ring's `taker`) for every seat, in seat order: what
        the loop polls each turn (the layout's seats, hence the rings, are fixed)."""
        rings = [(seat, self._data.results(seat)) for seat in range(self.count)]
        return tuple((seat, ring, ring.taker()) for seat, ring in rings)

    # ------------------------------------------------------------------ workers
    def seat_of(self, slot: int) -> int:
        """The seat a slot is on."""
        return self._layout.seat_of(slot)

    def name(self, seat: int) -> str:
        """A seat's name, as status shows it."""
        return self._layout.seats[seat].name

    def pid_of_slot(self, slot: int) -> int | None:
        """The pid of the worker running `slot`'s seat; None while it is being (re)started."""
        return self.workers.pids.get(self._layout.seat_of(slot))

    def kill(self, pid: int) -> None:
        """Kill a worker for a reason of the supervisor's own: its death is no lane death."""
        self.workers.kill(pid)


class _Other:
    """A message of another kind than a task in a seat's outbox (`Seats.send_message`)."""

    __slots__ = ("tag", "data")

    def __init__(self, tag: int, data: bytes):
        self.tag, self.data = tag, data
