"""The loop's taking of results (fleet.runtime.results.Results.collect): one turn empties
every seat's result ring, whatever the size of its messages. A result left in a ring
waits for the loop's idle timeout: its worker rang the bell when it pushed it, and
rings no more."""
from __future__ import annotations

import mmap

import pytest

from fleet._native import ffi, lib
from fleet.runtime import results as results_mod
from fleet.shm.dataplane import Ring


def _ring(capacity: int) -> Ring:
    mm = mmap.mmap(-1, lib.fleet_ring_bytes(capacity), mmap.MAP_SHARED)
    base = ffi.from_buffer(mm)
    assert lib.fleet_ring_init(base, capacity) == 0
    return Ring(base, base, "results ring")


class _Seats:
    def __init__(self, rings):
        self.rings, self.count, self.flushed = rings, len(rings), 0

    def result_rings(self):
        return tuple((seat, ring, ring.taker()) for seat, ring in enumerate(self.rings))

    def flush_waiting(self):
        self.flushed += 1


class _Publisher:
    def __init__(self):
        self.published = 0

    def units(self):
        self.published += 1


def _collector(rings):
    """A Results with only what `collect` uses, its `handle` recording what it is handed."""
    taken: list[tuple[int, bytes]] = []
    res = object.__new__(results_mod.Results)
    res._seats, res._publisher, res._rings = _Seats(rings), _Publisher(), None
    res.handle = lambda batch, seat: taken.extend((seat, bytes(view)) for _tag, view in batch)
    return res, taken


@pytest.mark.parametrize("size", [1024, 16 << 10, 40 << 10, 64 << 10, 200 << 10])
def test_one_collect_empties_every_ring_whatever_the_message_size(size):
    # Results of 16 KiB and more make slices short for bytes (pop_many's budget), not for
    # want of messages: each must still be taken in the same turn.
    rings = [_ring(1 << 23), _ring(1 << 23)]  # as boot makes them (INLINE_MAX fits)
    sent = []
    for seat, ring in enumerate(rings):
        for i in range(3 * results_mod.RESULT_SLICE + 1):
            body = bytes([seat * 64 + i % 64]) * size
            assert ring.push(7, body)
            sent.append((seat, body))
    res, taken = _collector(rings)
    res.collect()
    assert [r.used for r in rings] == [0, 0]
    assert taken == sent  # in order, each once
    assert res._publisher.published == 1 and res._seats.flushed == 1  # the outboxes once, after every ring


def test_a_collect_over_empty_rings_publishes_nothing():
    res, taken = _collector([_ring(1 << 16)])
    res.collect()
    assert taken == [] and res._publisher.published == 0
