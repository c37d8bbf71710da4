"""fleet.connect against a real fleetd: results, typed failures, map, large values, a
daemon that dies; and the daemon's OutcomeStore (bounds, long polls) on a fake clock."""
from __future__ import annotations

import signal
import tempfile

import pytest

import fleet
from fleet import control
from fleet.daemon import OutcomeStore, encode_outcome
from fleet.errors import EXIT_NOT_RUNNING
from tests.daemons import BOUND_S, Fleetd, running_slot, wait_until
from tests.fleets import role


def roles():
    return {
        "sq": role("square", slots=2),
        "fail": role("fail", slots=1),
        "suppress": role("suppress", slots=1),
        "sometimes": role("sometimes", slots=1),
        "die": role("die", slots=1),
        "hang": role("hang", slots=2),
        "blob": {**role("square", slots=1), "handler": "fleet.examples:blob"},
    }


@pytest.fixture(scope="module")
def served():
    """One fleetd for the read-mostly tests of this module (its name is unique too)."""
    import os
    import uuid

    from fleet import dataplane
    from fleet.table import segment

    name = f"c{os.getpid()}-{uuid.uuid4().hex[:10]}"
    try:
        with Fleetd(name, roles()) as d:
            yield d
    finally:
        segment.unlink(name)
        dataplane.unlink(name)


@pytest.fixture
def client(served):
    c = served.connect()
    yield c
    c.shutdown(wait=True, cancel_futures=True)


def test_submit_returns_values_and_unit_ids(client):
    futs = [client.submit("sq", i) for i in range(20)]
    assert [f.result(BOUND_S) for f in futs] == [i * i for i in range(20)]
    ids = [f.unit_id for f in futs]
    assert len(set(ids)) == 20 and all(isinstance(i, int) for i in ids)
    assert client.submit("sq", {"not": "a number"}).exception(BOUND_S) is not None


def test_failures_arrive_typed_with_their_reasons(client):
    failed = client.submit("fail", 7)
    with pytest.raises(fleet.UnitFailed) as err:
        failed.result(BOUND_S)
    assert err.value.outcome.reason == "HandlerError" and err.value.unit_id == failed.unit_id
    assert "ValueError: bad payload 7" in err.value.outcome.detail
    assert isinstance(err.value.original, ValueError)

    with pytest.raises(fleet.UnitSuppressed) as err:
        client.submit("suppress", "x").result(BOUND_S)
    assert err.value.outcome.kind == "suppressed" and "nothing to do for 'x'" in err.value.outcome.detail

    with pytest.raises(fleet.UnitFailed) as err:
        client.submit("die", None).result(BOUND_S)
    assert err.value.outcome.reason == "LaneDeath"

    with pytest.raises(fleet.UnitFailed) as err:
        client.submit("hang", 3600, timeout=0.5).result(BOUND_S)
    assert err.value.outcome.reason == "Timeout"


def test_refused_submits_raise_the_embedded_apis_errors(client):
    with pytest.raises(fleet.UnknownRoleError, match="unknown role 'nope'"):
        client.submit("nope", 1)
    with pytest.raises(fleet.BadUnit, match="takes no key"):
        client.submit("sq", 1, key="k")
    with pytest.raises(fleet.BadUnit, match="timeout"):
        client.submit("sq", 1, timeout=0)
    with pytest.raises(fleet.PayloadTooLarge):
        client.submit("sq", bytes(2 << 20))
    with pytest.raises(fleet.PayloadUnpicklable):
        client.submit("sq", lambda: None)
    assert client.submit("sq", 3).result(BOUND_S) == 9  # and the client still works


def test_map_in_order_with_and_without_chunks(client):
    assert list(client.map("sq", range(300))) == [i * i for i in range(300)]
    assert list(client.map("sq", range(100), chunksize=7)) == [i * i for i in range(100)]
    items = client.map("sometimes", [0, 3, 1, 6], chunksize=2)
    assert next(items) == 0 and next(items) == 6
    with pytest.raises(fleet.UnitSuppressed):
        next(items)


def test_a_value_larger_than_a_reply_arrives_in_parts(client):
    size = 3 * 512 * 1024  # base64 of it spans several collect replies
    assert client.submit("blob", size).result(BOUND_S) == bytes(size)


def test_status_and_ledger_over_the_socket(served, client):
    client.submit("sq", 2).result(BOUND_S)
    doc = client.status()
    assert doc["fleet"] == served.name and doc["daemon"]["pid"] == served.proc.pid
    counts = client.ledger()
    assert counts["submitted"] >= 1
    assert counts["submitted"] == counts["solved"] + counts["suppressed"] + counts["failed"] + counts["inflight"]


def test_connect_to_a_fleet_that_is_not_running():
    with tempfile.TemporaryDirectory(dir="/tmp") as empty:
        with pytest.raises(fleet.NotRunning) as err:
            fleet.connect("nobody-runs-this", env={"RUNTIME_DIRECTORY": empty, "XDG_RUNTIME_DIR": empty})
    assert err.value.exit_code == EXIT_NOT_RUNNING


def test_pending_futures_fail_typed_when_fleetd_is_killed(fleet_name):
    with Fleetd(fleet_name, roles()) as d:
        client = d.connect()
        futs = [client.submit("hang", 3600) for _ in range(3)]
        wait_until(lambda: running_slot(client), "a unit to be running")
        d.signal(signal.SIGKILL)
        d.wait()
        for fut in futs:
            with pytest.raises(fleet.FleetConnectionLost):
                fut.result(BOUND_S)
        with pytest.raises(fleet.FleetConnectionLost):
            client.submit("sq", 1)
        client.close()


# ---------------------------------------------------------------- the daemon's outcome store


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def solved(seq, value=None, unit=1):
    from concurrent.futures import Future

    fut = Future()
    fut.unit_id = unit
    fut.set_result(value if value is not None else seq)
    return encode_outcome(seq, "r", fut)


TOKEN = "tok-0123456789"


def test_store_answers_at_once_when_ready_and_later_when_an_outcome_arrives():
    store = OutcomeStore(clock=Clock())
    store.hold(TOKEN)
    store.put(TOKEN, solved(1))
    reply = store.collect(TOKEN, 10).result(0)
    assert [r["seq"] for r in reply["outcomes"]] == [1] and reply["more"] is False
    waiting = store.collect(TOKEN, 10)
    assert not waiting.done()
    store.put(TOKEN, solved(2))
    assert [r["seq"] for r in waiting.result(0)["outcomes"]] == [2]
    assert store.undelivered() == 0


def test_store_answers_an_expired_poll_empty():
    clock = Clock()
    store = OutcomeStore(clock=clock)
    poll = store.collect(TOKEN, 5)
    clock.now += 4.9
    store.expire()
    assert not poll.done()
    clock.now += 0.2
    store.expire()
    assert poll.result(0) == {"outcomes": [], "more": False, "closing": False}


def test_store_splits_replies_at_the_budget_and_keeps_order():
    store = OutcomeStore(clock=Clock())
    big = "x" * (300 * 1024)  # three of these exceed one reply's budget
    for seq in range(1, 5):
        store.put(TOKEN, solved(seq, big))
    seen = []
    while True:
        reply = store.collect(TOKEN, 0).result(0)
        assert sum(len(r["value"]) for r in reply["outcomes"]) <= control.COLLECT_REPLY_BUDGET
        seen += [r["seq"] for r in reply["outcomes"]]
        if not reply["more"]:
            break
    assert seen == [1, 2, 3, 4]


def test_store_drops_what_nobody_collects_and_says_so():
    clock = Clock()
    store = OutcomeStore(clock=clock, ttl_s=60)
    store.hold(TOKEN)
    store.put(TOKEN, solved(1))
    clock.now += 61
    store.expire()
    assert store.undelivered() == 0 and store.tokens() == 0
    with pytest.raises(control.OutcomesDropped, match="nobody collected them for 60s"):
        store.collect(TOKEN, 1).result(0)
    with pytest.raises(control.OutcomesDropped):
        store.hold(TOKEN)
    store.put(TOKEN, solved(2))  # a late outcome for a dropped token is discarded, not held
    assert store.undelivered() == 0


def test_store_drops_a_token_over_its_byte_bound():
    store = OutcomeStore(clock=Clock(), max_bytes=1 << 20)
    poll_token = "other-token-123"
    store.hold(TOKEN)
    store.hold(poll_token)
    for seq in range(3):
        store.put(TOKEN, solved(seq, "y" * (400 * 1024)))
    assert store.undelivered() == 0
    with pytest.raises(control.OutcomesDropped, match="more than 1048576 bytes"):
        store.collect(TOKEN, 0).result(0)
    store.put(poll_token, solved(9))  # other clients are untouched
    assert store.collect(poll_token, 0).result(0)["outcomes"][0]["seq"] == 9


def test_store_close_answers_waiting_polls():
    store = OutcomeStore(clock=Clock())
    poll = store.collect(TOKEN, 10)
    store.close()
    assert poll.result(0)["closing"] is True


def test_large_values_are_encoded_in_parts_that_join_back():
    import base64
    import pickle

    records = solved(1, b"z" * (2 << 20))
    assert len(records) > 1 and [r["part"] for r in records] == list(range(len(records)))
    assert all(len(r["value"]) <= 512 * 1024 for r in records)
    assert pickle.loads(base64.b64decode("".join(r["value"] for r in records))) == b"z" * (2 << 20)
