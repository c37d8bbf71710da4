"""The seats' outboxes (fleet.runtime.seats.Seats): tasks that do not fit a seat's ring
wait, in order, and the loop's `flush_waiting` (once a turn, after the results that made
room) pushes every seat's that waits. Real rings in a real data segment; the worker's
side is this test taking from the ring."""
from __future__ import annotations

import types

from fleet.runtime.seats import Seats
from fleet.shm import messages as M
from fleet.shm.dataplane import DataSegment


def _seats(fleet_name, n_seats: int = 2):
    data = DataSegment.create(fleet_name, n_seats, 4096, 4096)
    layout = types.SimpleNamespace(seats=[object()] * n_seats, slots=[])
    return Seats(data, None, layout), data


def _taken(data, seat: int) -> list[bytes]:
    """Every task on the seat's ring, taken as its worker takes them."""
    out = []
    while batch := data.tasks(seat).pop_many():
        out += [bytes(view) for tag, view in batch if tag == M.TASK]
    return out


def test_tasks_that_do_not_fit_wait_in_order_and_each_turn_pushes_every_seats_that_wait(fleet_name):
    seats, data = _seats(fleet_name)
    tasks = [(b"h%02d" % i, bytes([i]) * 900) for i in range(12)]  # ~4 fit a 4 KiB ring
    seats.send(1, tasks)
    assert seats.waiting(1) and not seats.waiting(0)
    first = _taken(data, 1)
    assert 0 < len(first) < len(tasks)
    seats.flush_waiting()  # the loop's, after a turn's results
    second = _taken(data, 1)
    assert second, "the room the worker made was not used"
    seats.flush_waiting()
    rest = _taken(data, 1)
    while seats.waiting(1):
        seats.flush_waiting()
        rest += _taken(data, 1)
    assert first + second + rest == [h + b for h, b in tasks]  # every task once, in order
    assert _taken(data, 0) == [] and not seats.waiting(0)
    data.close()


def test_a_flush_with_nothing_waiting_pushes_nothing(fleet_name):
    seats, data = _seats(fleet_name)
    seats.send(0, [(b"h", b"one")])
    assert _taken(data, 0) == [b"hone"]
    seats.flush_waiting()
    assert _taken(data, 0) == [] and _taken(data, 1) == []
    data.close()
