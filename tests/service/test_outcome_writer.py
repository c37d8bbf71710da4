"""A large result on its way to a fleetd client: the daemon's `OutcomeStore.deliver` on
real parcels (as a worker writes them) and real memfds. A value still in its worker's
parcel is read and written out on the store's writer thread, never on the thread the
unit ended on (the supervisor's loop), in one copy from the parcel's pages into the
client's memfd; until its record is held it counts as undelivered (fleetd's linger waits
for it); the parcel goes, or back to its worker; and a value that cannot be written out
is its unit's failed ResultError, one outcome still."""
from __future__ import annotations

import mmap
import os
import pickle
import threading

import numpy as np
import pytest

from fleet.runtime.future import UnitFuture
from fleet.service.control import fds as fdpass
from fleet.service.control import outcome_record as rec
from fleet.service.daemon import OutcomeStore
from fleet.shm import messages as M
from fleet.shm import parcels
from fleet.rules import titles
from fleet.worker import codec
from tests import require
from tests.daemons import wait_until

TOKEN = "writer-token-0123456789"


class Clock:
    def __call__(self):
        return 1000.0


class Gated(OutcomeStore):
    """The real store, which notes the thread each `put` runs on, and holds a put made on
    its writer thread at a gate until the test opens it."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.threads: list[str] = []
        self.gate = threading.Event()

    def put(self, token, records):
        name = threading.current_thread().name
        self.threads.append(name)
        if name == titles.OUTCOME_THREAD:
            assert self.gate.wait(30), "the test never opened the gate"
        super().put(token, records)


def ended(value, unit_id: int = 1) -> UnitFuture:
    fut = UnitFuture()
    fut.unit_id = unit_id
    fut.set_result(value)
    return fut


def relayed(value, fleet_name: str, **pack):
    """``value`` as fleetd's supervisor has a worker's result: packed by the worker beside
    the ring (a parcel), opened by the loop, kept pickled for the client."""
    body, _name = codec.pack(value, "the result", fleet_name, take=True, **pack)
    outcome, kept, _ = codec.result_outcome(M.ST_SOLVED, memoryview(body), relay=True)
    assert outcome.kind == "solved"
    return kept


def held(store: OutcomeStore, n: int, token: str = TOKEN) -> list[dict]:
    """The records held for ``token`` once its outcomes are: ``n`` of them, or, for a value
    in parts, every part (a put holds them all, under the store's lock)."""
    def complete():
        with store._lock:
            box = store._boxes.get(token)
            items = list(box.items) if box is not None else []
        return len(items) >= n and len(items) >= max((r.get(rec.PARTS) or 1) for r in items)

    wait_until(complete, f"{n} record(s) held")
    with store._lock:
        return list(store._boxes[token].items)


def client_value(record: dict):
    """The value a client rebuilds from a record's memfd (as `claim_values` maps it)."""
    sealed = record[rec.VALUE_FD]
    assert isinstance(sealed, fdpass.Sealed) and record[rec.VALUE_LEN] == sealed.size
    mapped = fdpass.open_sealed(os.dup(sealed.fd), sealed.size, "the value")
    try:
        return pickle.loads(mapped.view)
    finally:
        mapped.close()
        sealed.close()


def test_a_value_in_its_parcel_is_written_out_off_the_thread_it_ended_on_and_counted_until_held(fleet_name):
    value = np.arange(1 << 20, dtype=np.float64)  # 8 MiB: beside the ring
    store = Gated(clock=Clock())
    store.hold(TOKEN, fds=True)
    store.deliver(TOKEN, 7, "r")(ended(relayed(value, fleet_name)))
    wait_until(lambda: store.threads == [titles.OUTCOME_THREAD], "the writer thread at the gate")
    assert store.undelivered() == 1  # handed off, not held yet: a linger still waits for it
    store.gate.set()
    (record,) = held(store, 1)
    assert (record[rec.SEQ], record[rec.KIND]) == (7, "solved")
    back = client_value(record)
    assert np.array_equal(back, value) and back.flags.writeable
    # held now, not sent: the writer's count gives way to the record's, never a dip to 0
    wait_until(lambda: store.undelivered() == 1, "the record held, the writer's count back")
    assert parcels.count(fleet_name) == 0

    # a value that came in its ring message is written on the thread it ended on, as before
    store.deliver(TOKEN, 8, "r")(ended(codec._Pickled(pickle.dumps(123)), unit_id=2))
    assert store.threads[-1] == threading.current_thread().name and len(held(store, 2)) == 2


def test_a_client_that_takes_base64_gets_the_value_in_parts_and_the_lent_parcel_goes_back(fleet_name):
    value = np.arange(1 << 18, dtype=np.int64)  # 2 MiB
    lender = parcels.Lender(fleet_name)
    store = Gated(clock=Clock())
    store.gate.set()
    store.hold(TOKEN)  # no fds: base64
    kept = relayed(value, fleet_name, writer=lender.write, lend=True)
    assert parcels.count(fleet_name) == 1  # lent: still its worker's while fleetd reads it
    store.deliver(TOKEN, 1, "r")(ended(kept))
    del kept
    records = held(store, 1)
    assert store.threads == [titles.OUTCOME_THREAD] and records[0][rec.PARTS] == len(records) > 1  # one put
    parts: dict = {}
    for r in records:  # as the client takes them
        record = rec.parse(r)
        joined = rec.join_part(record, parts)
    assert np.array_equal(rec.result_of(record, joined, "r"), value)
    # the unit's future (and its value) dropped once written out: the parcel back to its writer
    wait_until(lambda: parcels.count(fleet_name, warm=True) == 1, "the lent parcel given back")
    assert parcels.count(fleet_name) == 0


def test_a_value_that_cannot_be_written_out_is_its_units_failed_result_error(fleet_name):
    store = Gated(clock=Clock())
    store.gate.set()
    store.hold(TOKEN, fds=True)
    kept = relayed(np.zeros(1 << 18), fleet_name)
    kept.close()  # its parcel gone before it was read: writing it out fails
    store.deliver(TOKEN, 3, "r")(ended(kept))
    (record,) = held(store, 1)
    assert (record[rec.SEQ], record[rec.KIND], record[rec.REASON]) == (3, "failed", "ResultError")
    assert "could not deliver the outcome" in record[rec.DETAIL] and "closed before it was read" in record[rec.DETAIL]
    wait_until(lambda: store.undelivered() == 1, "the writer's count back to the records held")


def test_the_writer_thread_takes_the_process_cpus_not_those_of_the_thread_that_started_it(fleet_name):
    mask = sorted(os.sched_getaffinity(os.getpid()))
    if len(mask) < 2:
        require.lacking(f"needs two CPUs to tell a pinned thread from a free one (this process may use {mask})")
    store = Gated(clock=Clock())
    store.gate.set()
    store.hold(TOKEN, fds=True)
    kept = relayed(np.zeros(1 << 18), fleet_name)

    def pinned_loop():  # as the supervisor's loop is: on one CPU of the process's
        os.sched_setaffinity(0, {mask[0]})
        store.deliver(TOKEN, 1, "r")(ended(kept))

    loop = threading.Thread(target=pinned_loop)
    loop.start()
    loop.join(30)
    (record,) = held(store, 1)
    writer = store._writer._thread
    assert os.sched_getaffinity(writer.native_id) == set(mask)
    with open(f"/proc/{os.getpid()}/task/{writer.native_id}/comm") as f:
        assert f.read().strip() == titles.OUTCOME_THREAD  # top -H
    client_value(record)


def test_sealed_writes_a_list_of_buffers_one_after_the_other():
    pieces = [b"head", memoryview(bytearray(b"x" * 70_000)), b"", memoryview(b"tail")]
    sealed = fdpass.Sealed(pieces)
    assert sealed.size == 4 + 70_000 + 4
    with mmap.mmap(sealed.fd, sealed.size, prot=mmap.PROT_READ) as mm:
        assert mm[:] == b"head" + b"x" * 70_000 + b"tail"
    sealed.close()
    with pytest.raises(TypeError):
        fdpass.Sealed([b"ok", 12])


def test_a_replayed_unit_answers_each_token_with_its_value_read_again(fleet_name):
    # A retry of a submit (the same request id) is answered by the unit admitted first: its
    # future's value is written out again, for the retry's token, while the future lives.
    value = np.arange(1 << 17, dtype=np.float64)
    store = Gated(clock=Clock())
    store.gate.set()
    other = "writer-token-retry-000000"
    for token in (TOKEN, other):
        store.hold(token, fds=True)
    fut = ended(relayed(value, fleet_name))
    for token in (TOKEN, other):
        store.deliver(token, 5, "r")(fut)
    for token in (TOKEN, other):
        (record,) = held(store, 1, token)
        assert np.array_equal(client_value(record), value)
