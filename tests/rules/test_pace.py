"""What is sent ahead to a busy slot follows the units' measured run time (fleet.rules.pace):
enough to keep a worker busy, never more out of cancel's reach than needed. A map's
batches follow its calls' measured cost: as many calls as run about BATCH_S, no more."""
from __future__ import annotations

import pytest

from fleet.rules.pace import (BATCH_GROWTH, BATCH_MAX, BATCH_S, FIRST_AHEAD, IDLE_SHARE, ROUND_TRIP_S, SMOOTHING,
                              Batches, Pace, batch_for, depth_for)


@pytest.mark.parametrize("run_s, depth", [
    (None, FIRST_AHEAD),  # not measured yet: none ahead
    (0.0, 16), (5e-6, 16), (ROUND_TRIP_S / 4, 4), (ROUND_TRIP_S / 3.5, 4),  # short: a round trip's worth
    (ROUND_TRIP_S, 1), (0.01, 1),  # in between: one
    (ROUND_TRIP_S / IDLE_SHARE, 0), (0.5, 0), (10.0, 0),  # long: none, cancel reaches all but the running one
])
def test_the_depth_covers_a_round_trip_and_no_more(run_s, depth):
    assert depth_for(run_s, 16) == depth


def test_the_depth_never_passes_the_roles_cap():
    assert depth_for(1e-7, 3) == 3 and depth_for(None, 0) == 0 and depth_for(1e-7, 0) == 0


def test_what_waits_ahead_of_a_worker_runs_about_a_round_trip_or_one_unit():
    """The bound cancel relies on: the units ahead of a worker run at most a round trip
    plus one unit, or one unit when units are longer than a trip (ProcessPoolExecutor
    queues one per worker, and one more)."""
    for run_s in (1e-7, 1e-6, 3e-5, 2e-4, 9e-4, 1e-3, 0.004, 0.03, 0.05, 1.0, 60.0):
        depth = depth_for(run_s, 64)
        assert depth <= 1 or depth * run_s <= ROUND_TRIP_S + run_s


def test_the_run_time_is_the_first_measure_then_a_moving_average_and_a_slice_is_its_measures_in_order():
    one, many = Pace([16]), Pace([16])
    runs = [4e-4, float("nan"), 2e-4, -1.0, 1e-4]  # a NaN or a negative one is no measure
    for s in runs:
        one.ran(0, s)
    many.ran_many(0, runs)
    expected = 4e-4
    for s in (2e-4, 1e-4):
        expected += SMOOTHING * (s - expected)
    assert one.run_s(0) == many.run_s(0) == pytest.approx(expected)


def test_pace_reports_a_roles_depth_only_when_it_changes_and_smooths_one_odd_unit():
    pace = Pace([16, 0])
    assert pace.depths == [FIRST_AHEAD, 0]
    assert pace.ran(0, 5e-6) == 16
    assert pace.ran(0, 5e-6) is None  # unchanged: nothing to tell the dispatcher
    assert pace.ran(1, 1e-6) is None  # a role that sends nothing ahead is never paced
    # one 10 ms unit among microsecond ones moves the smoothed time, not to 10 ms
    assert pace.ran(0, 0.01) == 1 and pace.run_s(0) < 0.01
    for _ in range(40):
        pace.ran(0, 5e-6)
    assert pace.depths[0] == 16
    for _ in range(40):
        pace.ran(0, 0.5)
    assert pace.depths[0] == 0
    assert pace.ran(0, float("nan")) is None and pace.depths[0] == 0  # no measure: no change


# --- map's batches ------------------------------------------------------------------------
@pytest.mark.parametrize("item_s, last, size", [
    (None, 1, 1), (float("nan"), 50, 1),  # not measured: one call per unit
    (BATCH_S, 1, 1), (0.5, 64, 1), (10.0, 1, 1),  # a call as long as a batch, or longer: alone
    (BATCH_S / 10, 100, 10), (BATCH_S / 10.5, 100, 10),  # as many as run BATCH_S, rounded down
    (BATCH_S / 1000, 1, BATCH_GROWTH), (BATCH_S / 1000, 100, 400),  # growth bounded by the last batch
    (0.0, BATCH_MAX, BATCH_MAX), (1e-9, 10**6, BATCH_MAX),  # never more than BATCH_MAX
])
def test_a_batch_holds_the_calls_that_run_its_time(item_s, last, size):
    assert batch_for(item_s, last) == size


def test_a_batch_never_runs_past_its_time_once_measured():
    for item_s in (1e-7, 1e-6, 3e-5, 2e-4, 9e-4, 1e-3, 0.004, 0.5):
        for last in (1, 4, 100, BATCH_MAX):
            n = batch_for(item_s, last)
            assert n == 1 or n * item_s <= BATCH_S


def test_batches_follow_the_maps_own_chunks_run_in_the_worker():
    b = Batches(slots=2)
    assert b.item_s() is None and b.size() == 1  # nothing measured: one call per chunk
    b.ran(2e-3, 1)  # one call of 2 ms: still alone
    assert b.item_s() == pytest.approx(2e-3) and b.size() == 1
    for _ in range(40):
        b.ran(2e-4 * 10, 10)  # then calls of 0.2 ms: ten to a batch, reached by growth
    assert b.item_s() == pytest.approx(2e-4, rel=1e-3)
    n = int(BATCH_S / b.item_s())
    assert n in (9, 10) and [b.size() for _ in range(3)] == [BATCH_GROWTH, n, n]  # grown, then steady
    b.ran(float("nan"), 5)
    b.ran(1.0, 0)  # no measure: nothing moves
    assert b.item_s() == pytest.approx(2e-4, rel=1e-3)


def test_one_slow_chunk_among_fast_ones_moves_the_measure_not_all_the_way():
    b = Batches(slots=2)
    b.ran(1e-6 * 100, 100)
    b.ran(0.1, 1)  # an odd call of 100 ms
    assert 1e-6 < b.item_s() < 0.1 and b.size() == 1  # small batches until the calls are short again


def test_batches_grow_by_at_most_their_growth_per_chunk():
    b = Batches(slots=2)
    b.ran(1e-7, 1)
    sizes = [b.size() for _ in range(6)]
    assert sizes == [min(BATCH_MAX, BATCH_GROWTH ** k) for k in range(1, 7)]


def test_slow_calls_never_batch():
    b = Batches(slots=2)
    for _ in range(30):
        b.ran(0.05, 1)
    assert [b.size() for _ in range(5)] == [1] * 5


def test_a_batch_of_large_arguments_holds_at_most_its_bytes():
    from fleet.rules.pace import BATCH_BYTES

    fast = 1e-9  # calls that cost nothing measured: time alone would batch BATCH_MAX of them
    assert batch_for(fast, BATCH_MAX, item_bytes=1 << 20) == BATCH_BYTES // (1 << 20)
    assert batch_for(fast, BATCH_MAX, item_bytes=BATCH_BYTES) == 1 == batch_for(fast, 4, item_bytes=BATCH_BYTES * 3)
    assert batch_for(fast, BATCH_MAX, item_bytes=0) == BATCH_MAX  # size not known: time alone
    assert batch_for(fast, BATCH_MAX, item_bytes=1024) == min(BATCH_MAX, BATCH_BYTES // 1024)
    assert batch_for(None, BATCH_MAX, item_bytes=1) == 1  # not measured yet: one, whatever the size
    assert batch_for(BATCH_S / 2, BATCH_MAX, item_bytes=1) == 2  # time still bounds small ones


def test_the_size_of_a_calls_argument_is_read_from_its_buffer_or_not_at_all():
    import numpy as np

    from fleet.rules.pace import value_bytes

    assert value_bytes(b"x" * 1000) == 1000 and value_bytes(bytearray(7)) == 7
    assert value_bytes(memoryview(b"abcd")[1:]) == 3 and value_bytes("text") == 4
    assert value_bytes(np.zeros(128)) == 1024 and value_bytes(np.zeros((4, 8), dtype=np.int32)[:, ::2]) == 64
    assert value_bytes((b"ab", np.zeros(2), 5)) == 2 + 16  # a star map's arguments: its buffers summed
    assert value_bytes(12345) == 0 and value_bytes([b"x" * 100]) == 0 and value_bytes(None) == 0


def test_batches_learn_the_size_of_the_maps_arguments():
    from fleet.rules.pace import BATCH_BYTES

    b = Batches(slots=2)
    b.ran(1e-9, 1)
    b.saw(b"x" * (1 << 20))
    assert [b.size() for _ in range(4)] == [BATCH_GROWTH, min(BATCH_GROWTH ** 2, BATCH_BYTES >> 20)] + \
        [BATCH_BYTES >> 20] * 2
    b.saw(7)  # arguments of no known size: time alone again
    assert b.size() == min(BATCH_MAX, BATCH_GROWTH * (BATCH_BYTES >> 20))


def test_batches_learn_the_size_of_the_maps_results_and_bound_a_call_by_both():
    from fleet.rules.pace import BATCH_BYTES

    b = Batches(slots=2)
    b.ran(1e-9, 1)
    b.returned(b"r" * (1 << 20))  # results of 1 MiB, arguments of no known size
    assert [b.size() for _ in range(3)] == [BATCH_GROWTH, BATCH_BYTES >> 20, BATCH_BYTES >> 20]
    b.saw(b"a" * (1 << 20))  # and arguments of 1 MiB too: a call moves 2 MiB
    assert b.size() == BATCH_BYTES >> 21
    b.returned(None)
    b.saw(3)  # neither known: time alone again
    assert b.size() == min(BATCH_MAX, BATCH_GROWTH * (BATCH_BYTES >> 21))
