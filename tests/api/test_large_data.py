"""Real data through both faces (fleet.Executor, fleet.Fleet): no size limit below memory.

Each size class goes in (an argument) and out (a result) whole; what does not fit a ring
travels beside it (fleet.shm.parcels) and is gone from /dev/shm once the unit ends. An
array arrives writable, its memory its own: it survives the next thousand units' traffic."""
from __future__ import annotations

import numpy as np
import pytest

import fleet
from fleet.shm import parcels
from tests import data_calls as D
from tests.daemons import BOUND_S, wait_until
from tests.fleets import config, descendants, running, unique_name

KIB, MIB = 1 << 10, 1 << 20


class Face:
    """One face, called the same way: ``face(call name, argument)`` -> its future."""

    def __init__(self, kind: str, target):
        self.kind, self.target = kind, target
        self.name = target.fleet.name if kind == "executor" else target.name

    def __call__(self, call: str, arg):
        if self.kind == "executor":
            return self.target.submit(getattr(D, call), arg)
        return self.target.submit("data", (call, arg))

    def map(self, call: str, args):
        if self.kind == "executor":
            return self.target.map(getattr(D, call), args, chunksize=4)
        return self.target.map("data", [(call, arg) for arg in args], chunksize=4)

    def no_parcels_left(self) -> None:
        # a task's parcel goes as its future's callbacks run, just after its waiter wakes
        wait_until(lambda: parcels.count(self.name) == 0, f"fleet {self.name}'s parcels removed")


@pytest.fixture(scope="module", params=["executor", "fleet"])
def face(request):
    if request.param == "executor":
        before = descendants()
        ex = fleet.Executor(max_workers=2)
        try:
            yield Face("executor", ex)
        finally:
            ex.shutdown(wait=True)
            assert not (descendants() - before)
            assert parcels.count(ex.fleet.name) == 0
    else:
        roles = {"data": {"kind": "pooled", "handler": "tests.data_calls:h_call", "slots": 2, "peak_cpus": 1,
                          "queue_bound": 10_000}}
        with running(config(unique_name("dt"), roles)) as f:  # which checks no segment is left
            yield Face("fleet", f)


@pytest.mark.parametrize("size", [KIB, MIB, 64 * MIB], ids=["1KiB", "1MiB", "64MiB"])
def test_each_size_goes_in_and_comes_out_whole(face, size):
    data = D.pattern(size)
    assert face("digest", data).result(BOUND_S) == D.digest(data)  # in: an argument
    assert face("make_bytes", size).result(BOUND_S) == data  # out: a result
    face.no_parcels_left()


def test_a_512_mib_result_comes_out_whole(face):
    out = face("make_array", 512 * MIB).result(BOUND_S)
    assert out.nbytes == 512 * MIB and out[0] == out[-1] == 1.0 and float(out.sum()) == out.size
    face.no_parcels_left()
    del out


def test_an_array_arrives_writable_both_ways_and_survives_the_next_thousand_units(face):
    sent = np.arange(MIB, dtype=np.float64)  # 8 MiB
    assert face("poke", sent).result(BOUND_S) == (True, float(sent.sum()) + 1.0)
    assert sent[0] == 0.0  # the worker wrote into its own copy
    got = face("make_array", 8 * MIB).result(BOUND_S)
    assert got.flags.writeable
    got[0] = 7.0
    # a thousand units' results, each beside the ring (each over codec.OOB_MIN): none may
    # land in the memory `got` is built over
    sizes = [320 * KIB] * 1000
    for i, value in enumerate(face.map("make_array", sizes)):
        assert value.nbytes == 320 * KIB and value[0] == 1.0, i
    assert got[0] == 7.0 and float(got[1:].sum()) == got.size - 1
    del got, value  # each built over its parcel: the parcel is the array's until then
    face.no_parcels_left()


def test_a_result_array_is_built_over_its_parcel_which_goes_back_once_dropped(face):
    # A result array is not copied out of the parcel its worker wrote it in: that write is
    # its one copy. It is writable, and its parcel is its own until it is gone: results
    # written meanwhile go elsewhere.
    import mmap

    from tests.shm.test_parcels import _memory_of

    size = 8 * MIB
    got = face("make_array", size).result(BOUND_S)
    assert isinstance(_memory_of(got), mmap.mmap) and got.flags.writeable
    got[0] = 7.0
    for _ in range(6):  # one at a time, each dropped: its writer's next one goes into its parcel
        value = face("make_array", size).result(BOUND_S)
        assert value[0] == 1.0 and isinstance(_memory_of(value), mmap.mmap)
        del value
    assert got[0] == 7.0 and float(got[1:].sum()) == got.size - 1
    del got
    face.no_parcels_left()  # each parcel back with its writer once its array is gone


def test_a_result_pickled_over_the_rings_bound_comes_in_a_lent_parcel_not_through_the_ring(face):
    # A result whose pickle passes RESULT_INLINE_MAX (600 pieces of 1 KiB: nothing out of
    # band) travels in a parcel its worker lends, unpickled in place and given back at once:
    # the ring's pages in use stay those of small messages. Counted as the data segment's
    # pages (tmpfs allocates a page as it is first written).
    import os

    from fleet.shm.dataplane import data_segment_name
    from fleet.worker.codec import INLINE_MAX, RESULT_INLINE_MAX

    path = "/dev/shm" + data_segment_name(face.name)
    n = 600
    assert RESULT_INLINE_MAX < n * 1024 < INLINE_MAX
    before = os.stat(path).st_blocks * 512
    for _ in range(6):
        assert face("make_pieces", n).result(BOUND_S) == D.pieces(n)
    grown = os.stat(path).st_blocks * 512 - before
    assert grown < RESULT_INLINE_MAX, grown
    face.no_parcels_left()


def test_a_map_of_arrays_each_arrives_whole(face):
    arrays = [np.full(MIB // 8 * (i + 1), float(i)) for i in range(8)]  # 1..8 MiB, distinct
    assert list(face.map("digest", arrays)) == [D.digest(a) for a in arrays]
    face.no_parcels_left()


def test_an_array_a_worker_keeps_is_its_own_while_its_parcel_carries_the_next_payloads():
    # One worker: the kept array and the payloads after it meet in one process, and each
    # payload of the same size is written into the same warm parcel once its unit solved.
    size = MIB  # over codec.OOB_MIN: each travels beside the ring
    with fleet.Executor(max_workers=1) as ex:
        first = np.full(size // 8, 5.0)
        assert ex.submit(D.keep, first).result(BOUND_S) == (5.0, -1.0)
        for i in range(20):
            assert ex.submit(D.digest, np.full(size // 8, float(i))).result(BOUND_S)[0] == size
        # the parcels were kept warm between units (the last one once its future's callbacks
        # ran: they run after result() may return)
        wait_until(lambda: parcels.count(ex.fleet.name, warm=True) >= 1, "a warm parcel")
        (a0, a1, total), = ex.submit(D.kept).result(BOUND_S)
        # what the worker kept is what it was sent (and its own write), not a later payload
        assert (a0, a1, total) == (5.0, -1.0, 5.0 * (size // 8 - 1) - 1.0)
        name = ex.fleet.name
    assert parcels.count(name) == 0 and parcels.count(name, warm=True) == 0


def test_a_result_array_held_past_shutdown_stays_whole_and_leaves_nothing_in_dev_shm():
    # Its parcel's name is swept with the fleet; its memory is the array's until it goes,
    # and the give-back at its end finds nothing to give back to.
    with fleet.Executor(max_workers=1) as ex:
        got = ex.submit(D.make_array, 8 * MIB, 3.0).result(BOUND_S)
        name = ex.fleet.name
        assert parcels.count(name) == 1  # the array's
    assert parcels.count(name) == 0 and parcels.count(name, warm=True) == 0
    assert got[0] == got[-1] == 3.0
    got[1] = 4.0
    del got
    assert parcels.count(name) == 0 and parcels.count(name, warm=True) == 0
