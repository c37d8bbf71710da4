"""The cap on payload bytes beside the rings (fleet.runtime.beside, limits.max_parcel_bytes):
a submit waits for room while the cap is reached and goes on when a unit's outcome gives
room back; one that may not wait is QueueFull, one larger than the cap PayloadTooLarge,
each naming the sizes and the key; nothing is left in /dev/shm."""
from __future__ import annotations

import threading

import pytest

import fleet
from fleet.runtime.beside import Beside, default_cap
from fleet.shm import parcels
from tests import data_calls as D
from tests.daemons import BOUND_S, wait_until
from tests.fleets import config, running, unique_name

MIB = 1 << 20


def _waiters(beside: Beside) -> int:
    return len(beside._cond._waiters)  # threads waiting for room (a Condition's own list)


def test_room_is_taken_given_back_and_waited_for():
    beside = Beside(10, key="limits.max_parcel_bytes")
    beside.take(6, "a")
    with pytest.raises(fleet.QueueFull, match=r"a: 6 bytes of payloads .* 5 more would pass limits.max_parcel_bytes \(10\)"):
        beside.take(5, "a", block=False)
    with pytest.raises(fleet.QueueFull):
        beside.take(5, "a", timeout=0)
    with pytest.raises(fleet.PayloadTooLarge, match="is 11 bytes pickled, beside the ring; limits.max_parcel_bytes is 10"):
        beside.take(11, "a")
    got = []
    waiter = threading.Thread(target=lambda: (beside.take(5, "b"), got.append("b")))
    waiter.start()
    wait_until(lambda: _waiters(beside) == 1, "the second take waiting")
    assert got == [] and beside.held == 6
    beside.give(6)
    waiter.join(BOUND_S)
    assert got == ["b"] and beside.held == 5
    assert Beside(None).cap == default_cap() > 0


def test_a_submit_waits_for_room_beside_the_rings_and_goes_on_when_a_unit_ends(tmp_path):
    name, gate = unique_name("bs"), str(tmp_path / "go")
    roles = {"r": {"kind": "pooled", "handler": "tests.data_calls:h_wait_for", "slots": 1, "peak_cpus": 1,
                   "queue_bound": 100, "lookahead": 0}}
    with running(config(name, roles, limits={"max_parcel_bytes": 20 * MIB})) as f:
        beside = f._sup._submitter.beside
        first = f.submit("r", (gate, b"a" * (8 * MIB)))
        second = f.submit("r", (gate, b"b" * (8 * MIB)))
        assert parcels.count(name) == 2
        with pytest.raises(fleet.QueueFull, match="would pass limits.max_parcel_bytes"):
            f.submit("r", (gate, b"c" * (8 * MIB)), block=False)
        with pytest.raises(fleet.PayloadTooLarge, match=r"is \d+ bytes pickled, beside the ring; "
                                                        r"limits.max_parcel_bytes is 20971520"):
            f.submit("r", (gate, b"d" * (21 * MIB)))
        assert parcels.count(name) == 2  # the refused ones made none
        later = []
        submitter = threading.Thread(target=lambda: later.append(f.submit("r", (gate, b"e" * (8 * MIB)))))
        submitter.start()
        try:
            wait_until(lambda: _waiters(beside) == 1, "the third submit waiting for room")
            assert later == [] and parcels.count(name) == 2  # waiting: no copy made meanwhile
        finally:
            open(gate, "w").close()  # the units end, their parcels go, room comes back
        submitter.join(BOUND_S)
        assert [u.result(BOUND_S) for u in (first, second, *later)] == [8 * MIB] * 3
        wait_until(lambda: parcels.count(name) == 0 and beside.held == 0, "every parcel removed, its room back")


def test_an_executors_map_of_arrays_over_the_cap_runs_through(tmp_path):
    """More argument bytes than the cap, mapped: the feeder waits for room, nothing is
    refused, every call runs."""
    import numpy as np

    with fleet.Executor(max_workers=2, max_parcel_bytes=24 * MIB) as ex:
        arrays = [np.full(MIB, float(i)) for i in range(12)]  # 8 MiB each, 96 MiB in all
        assert list(ex.map(D.digest, arrays)) == [D.digest(a) for a in arrays]
        with pytest.raises(fleet.PayloadTooLarge, match=r"limits.max_parcel_bytes is 25165824"):
            ex.submit(D.digest, np.zeros(4 * MIB))
        wait_until(lambda: parcels.count(ex.fleet.name) == 0, "every parcel removed")
