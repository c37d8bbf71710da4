"""fleet.connect against a real fleetd: results, typed failures, map, large values, a
daemon that dies; and the daemon's OutcomeStore (bounds, long polls) on a fake clock."""
from __future__ import annotations

import json
import os
import signal
import tempfile
import time

import pytest

import fleet
from fleet.service import control
from fleet.service.control.outcome_record import encode as encode_outcome
from fleet.service.daemon import OutcomeStore
from fleet.rules.errors import EXIT_NOT_RUNNING
from tests.daemons import BOUND_S, Fleetd, running_slot, served_fleetd, wait_until
from tests.fleets import role
from tests.stalls import wait_state


def roles():
    # No declared peaks but the I/O role's 0: declared peaks add up against the quota on
    # every tier, and these nine would ask more than a small host has.
    return {name: {k: v for k, v in spec.items() if k != "peak_cpus" or v == 0} for name, spec in {
        "sq": role("square", slots=2),
        "fail": role("fail", slots=1),
        "suppress": role("suppress", slots=1),
        "sometimes": role("sometimes", slots=1),
        "die": role("die", slots=1),
        "hang": role("hang", slots=2),
        "blob": {**role("square", slots=1), "handler": "fleet.api.examples:blob"},
        "oneway": {**role("square", slots=1), "handler": "tests.daemons:one_way"},
        "held": role("wait_for_file", slots=4, io_bound=True, peak_cpus=0, queue_bound=6),
        # one slot, nothing sent ahead: a unit held on its gate file keeps the next one queued
        "gate": role("wait_for_file", slots=1, io_bound=True, peak_cpus=0, lookahead=0),
    }.items()}


@pytest.fixture(scope="module")
def served():
    """One fleetd for the read-mostly tests of this module (its name is unique too)."""
    with served_fleetd("c", roles()) as d:
        yield d


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
    with pytest.raises(ValueError) as err:  # the handler's own exception, as in the embedded fleet
        failed.result(BOUND_S)
    assert err.value.args == ("bad payload 7",) and "ValueError: bad payload 7" in err.value.__cause__.tb

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
    # What only the fleet can judge comes back on the unit's future (the submit did not
    # wait for it); that unit has no id and no outcome
    unknown = client.submit("nope", 1)
    with pytest.raises(fleet.UnknownRoleError, match="unknown role 'nope'"):
        unknown.result(BOUND_S)
    assert unknown.unit_id is None
    with pytest.raises(fleet.BadUnit, match="takes no key"):
        client.submit("sq", 1, key="k").result(BOUND_S)
    # what the client checks itself raises at once, nothing sent
    with pytest.raises(fleet.BadUnit, match="timeout"):
        client.submit("sq", 1, timeout=0)
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


def test_map_unordered_hands_out_results_as_they_complete(client, tmp_path):
    release = tmp_path / "release"
    tmp_path.chmod(0o755)  # fleetd's workers look for the file
    # the first unit runs until `release` exists: the four behind it come out first
    items = iter([(str(release), 10)] + [(None, i) for i in range(1, 5)])
    it = client.map_unordered("held", items, timeout=120)
    assert sorted(next(it) for _ in range(4)) == [1, 4, 9, 16]
    release.touch()
    assert list(it) == [100]
    failing = client.map_unordered("sometimes", [0, 2, 3], chunksize=1)
    with pytest.raises(RuntimeError, match="two: 2"):  # the handler's own exception, rebuilt here
        list(failing)


def test_map_unordered_keeps_at_most_the_roles_queue_bound_submitted(client, tmp_path):
    release = tmp_path / "release"
    tmp_path.chmod(0o755)
    pulled = []

    def items():
        for i in range(30):
            pulled.append(i)
            yield (str(release), i)

    list(client.map("held", [(None, 0)]))  # the client learns the role's queue bound (6)
    it = client.map_unordered("held", items(), timeout=120)
    assert len(pulled) == 6
    release.touch()
    assert sorted(it) == [i * i for i in range(30)]


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
            client.submit("sq", 1).result(BOUND_S)  # nobody serves the name now: its future says so
        client.close()


def test_a_client_reconnects_to_a_restarted_fleetd_for_new_calls(fleet_name):
    first = Fleetd(fleet_name, roles())
    try:
        first.start()
        client = first.connect()
        assert client.submit("sq", 3).result(BOUND_S) == 9
        owed = client.submit("hang", 3600)
        wait_until(lambda: running_slot(client), "a unit to be running")
        first.signal(signal.SIGKILL)
        first.wait()
        with pytest.raises(fleet.FleetConnectionLost):
            owed.result(BOUND_S)  # its outcome died with the daemon, as before
        with Fleetd(fleet_name, roles(), base_dir=first.dir) as second:
            # the same client, no new connect(): calls and submits reach the new daemon
            assert client.status()["creator_pid"] == second.proc.pid
            assert [client.submit("sq", i).result(BOUND_S) for i in range(3)] == [0, 1, 4]
            assert list(client.map("sq", range(4), chunksize=2)) == [0, 1, 4, 9]
        client.close()
    finally:
        first.cleanup()


@pytest.mark.parametrize("noticed_by", ["poll", "submit"])
def test_units_pending_across_a_restart_between_polls_fail_and_new_ones_run(fleet_name, noticed_by):
    # The restart happens while no poll is in flight (the test holds the poll channel),
    # so no broken poll reports it: the client must notice the new daemon (its pid on
    # the socket) and fail the unit the old one owed, not wait for it from the new one.
    first = Fleetd(fleet_name, roles())
    second = Fleetd(fleet_name, roles(), base_dir=first.dir)
    try:
        first.start()
        client = first.connect()
        with client._polls.lock:
            owed = client.submit("hang", 3600)
            wait_until(lambda: running_slot(client), "a unit to be running")
            first.signal(signal.SIGKILL)
            first.wait()
            second.start()
            if noticed_by == "submit":
                fresh = client.submit("sq", 5)
                with pytest.raises(fleet.FleetConnectionLost, match="restarted"):
                    owed.result(0)  # failed already, by the submit that met the new daemon
        # the poll channel is free again: the collector polls now
        with pytest.raises(fleet.FleetConnectionLost, match="restarted"):
            owed.result(BOUND_S)
        if noticed_by == "poll":
            fresh = client.submit("sq", 5)
        assert fresh.result(BOUND_S) == 25
        client.close()
    finally:
        second.cleanup()
        first.cleanup()


def test_a_daemon_stalled_past_the_poll_timeout_still_delivers_what_it_solves(fleet_name, monkeypatch):
    # Polls give up after 0.5 s; the daemon is stopped for several of them while its
    # worker (another process) runs the unit, then goes on: the unit it solves reaches
    # the future, which waited (a slow daemon is not a lost one).
    from fleet.api import client as client_mod

    monkeypatch.setattr(client_mod, "COLLECT_WAIT_S", 0.2)
    monkeypatch.setattr(client_mod, "COLLECT_GRACE_S", 0.3)
    with Fleetd(fleet_name, roles()) as d:
        client = d.connect(timeout=0.5)
        try:
            fut = client.submit("hang", 1.0)
            wait_until(lambda: running_slot(client), "the unit to be running")
            d.signal(signal.SIGSTOP)
            try:
                assert not fut.done()
                time.sleep(3.0)  # six poll timeouts
                assert not fut.done()  # no FleetConnectionLost for a daemon that is only slow
            finally:
                d.signal(signal.SIGCONT)
            assert fut.result(BOUND_S) == "woke"
            assert client.submit("sq", 6).result(BOUND_S) == 36
            assert client.ledger()["solved"] == 2
        finally:
            client.close()


def marking_roles():
    return {**roles(), "mark": role("marked_echo", slots=1)}


def marking(marks, tag: str = "job"):
    """The payload of a `marked_echo` unit: it notes each run in ``marks/<tag>`` and returns "marked"."""
    return (str(marks), tag, "marked")


def runs(marks, tag: str = "job") -> int:
    path = marks / tag
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_submit_repeated_with_its_request_id_runs_once_and_every_future_gets_its_outcome(fleet_name, tmp_path):
    marks = tmp_path
    with Fleetd(fleet_name, marking_roles()) as d:
        client = d.connect()
        try:
            # a submit whose reply its caller never saw: sent on a connection of its own
            with control.ControlClient(client.path) as lost:
                first = lost.call("submit", role="mark", payload=marking(marks), request_id="job-1")
            again = client.submit("mark", marking(marks), request_id="job-1")
            assert again.unit_id == first["unit"] and again.result(BOUND_S) == "marked"
            later = client.submit("mark", marking(marks), request_id="job-1")  # its unit has ended: still known
            assert later.unit_id == first["unit"] and later.result(BOUND_S) == "marked"
            assert runs(marks) == 1
            with pytest.raises(fleet.RequestIdReused, match="job-1"):
                client.submit("mark", marking(marks, "other"), request_id="job-1").result(BOUND_S)
            assert client.submit("mark", marking(marks), request_id="job-2").result(BOUND_S) == "marked"
            assert runs(marks) == 2
            ledger = client.ledger()
            assert ledger["submitted"] == ledger["solved"] == 2
        finally:
            client.close()


def test_a_submit_without_a_reply_says_it_may_have_run_and_its_retry_runs_it_once(fleet_name, tmp_path):
    marks = tmp_path
    with Fleetd(fleet_name, marking_roles()) as d:
        client = d.connect(timeout=0.5)
        try:
            d.signal(signal.SIGSTOP)  # the request goes out; no reply comes within the timeout
            # ... once every thread of it has stopped: a control thread still running would
            # admit the unit, whose outcome then waits for the daemon (no uncertainty)
            for tid in os.listdir(f"/proc/{d.proc.pid}/task"):
                wait_state(int(tid), "Tt")
            try:
                with pytest.raises(fleet.SubmitUncertain, match="may have been admitted") as err:
                    client.submit("mark", marking(marks), request_id="job-1").result(BOUND_S)
                assert err.value.request_id == "job-1" and "is safe" in str(err.value)
                with pytest.raises(fleet.SubmitUncertain, match="give submit a request_id"):
                    client.submit("sq", 2).result(BOUND_S)
            finally:
                d.signal(signal.SIGCONT)
            retry = client.submit("mark", marking(marks), request_id="job-1")
            assert retry.result(BOUND_S) == "marked"
            wait_until(lambda: client.ledger()["inflight"] == 0, "the sq unit, if it was admitted, to end")
            assert runs(marks) == 1
            ledger = client.ledger()
            assert ledger["submitted"] - ledger["solved"] == 0 and ledger["submitted"] in (1, 2)
        finally:
            client.close()


def test_submits_racing_the_clients_shutdown_each_raise_or_get_their_outcome(served):
    import threading

    client = served.connect()
    futures, raised = [], []

    def hammer():
        while True:
            try:
                futures.append(client.submit("sq", 3))
            except fleet.FleetClosed:
                raised.append(1)
                return

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(futures) >= 200, "200 submits")
    client.shutdown(wait=True)
    for t in threads:
        t.join(BOUND_S)
    assert len(raised) == len(threads)
    # shutdown(wait=True) waited for every future a submit returned: none is left pending
    assert all(fut.done() for fut in futures)
    assert [fut.result(0) for fut in futures] == [9] * len(futures)


def _queue(client, name: str) -> dict:
    return {q["name"]: q for q in client.status()["queues"]}[name]


def test_cancelling_a_queued_unit_cancels_it_in_the_fleet(served, client):
    before = client.ledger()
    gate = os.path.join(tempfile.mkdtemp(prefix="cq-", dir="/tmp"), "go")
    try:
        blocker = client.submit("gate", (gate, 1))
        wait_until(lambda: _queue(client, "gate")["in_use"] == 1, "the blocker to hold the one slot")
        queued = client.submit("gate", (None, 4))
        wait_until(lambda: _queue(client, "gate")["queue_depth"] == 1, "the unit to wait in the queue")
        assert queued.cancel() is True and queued.cancelled()
        kept = client.submit("gate", (None, 5))
    finally:
        open(gate, "a").close()
    assert blocker.result(BOUND_S) == 1 and kept.result(BOUND_S) == 25
    os.unlink(gate)
    os.rmdir(os.path.dirname(gate))

    def settled():
        now = client.ledger()
        return now["inflight"] == before["inflight"] and now

    after = wait_until(settled, "the cancelled unit to be counted")
    assert after["solved"] - before["solved"] == 2  # the cancelled unit never ran
    cancelled = after["failed_by_reason"].get("Cancelled", 0) - before["failed_by_reason"].get("Cancelled", 0)
    assert cancelled == 1


def test_cancelling_a_running_unit_is_refused_and_it_runs_to_its_outcome(served, client):
    running = client.submit("hang", 1.0)
    wait_until(lambda: running_slot(client), "the unit to be running")
    assert running.cancel() is False and not running.cancelled()
    assert running.result(BOUND_S) == "woke"


def test_cancel_op_is_validated(client):
    for bad in (0, -3, "7", None, 1.5):
        with pytest.raises((control.ProtocolError, control.RemoteError)) as err:
            client._call("cancel", unit=bad)
        assert "unit" in str(err.value)
    assert client._call("cancel", unit=10**9) == {"unit": 10**9, "cancelled": False, "state": "unknown", "children": 0}  # never handed out


def test_a_value_that_cannot_be_pickled_twice_reaches_the_client_and_the_ledger_says_solved(client):
    import threading

    before = client.ledger()
    value = client.submit("oneway").result(BOUND_S)
    assert isinstance(value, type(threading.Lock()))
    after = client.ledger()
    assert after["solved"] - before["solved"] == 1
    assert after["failed_by_reason"].get("ResultError", 0) == before["failed_by_reason"].get("ResultError", 0)


def test_a_remote_map_reaches_the_ledger_in_units_and_items(served, client):
    """The daemon never unpickles a chunk: the client says how many items it holds."""
    before = client.ledger()
    assert list(client.map("sq", range(1000), chunksize=64)) == [i * i for i in range(1000)]
    after = client.ledger()
    assert after["submitted"] - before["submitted"] == 16  # 15 chunks of 64 and one of 40
    assert after["items"]["submitted"] - before["items"]["submitted"] == 1000
    assert after["items"]["solved"] - before["items"]["solved"] == 1000
    wait_until(lambda: json.loads(served.ctl("status", "--json").stdout)["ledger"]["items"]["submitted"]
               == after["items"]["submitted"], "the table to publish the ledger")


class _BootPolls:
    """`time` as `fleet.api.client` sees it, counting the boot wait's polls (its
    sleeps); `on_first` runs at the first (then the poll sleeps as it would)."""

    def __init__(self, on_first=None):
        self.polls = 0
        self._on_first = on_first

    def sleep(self, seconds):
        self.polls += 1
        if self.polls == 1 and self._on_first is not None:
            self._on_first()
        time.sleep(seconds)

    def __getattr__(self, name):
        return getattr(time, name)


def test_connect_waits_for_a_fleet_that_is_booting(fleet_name, monkeypatch):
    import os

    from fleet.api import client as client_mod
    from fleet.shm.table import SlotTable
    from tests import fleet_tables as ft

    with tempfile.TemporaryDirectory(dir="/tmp") as run:
        env = {"RUNTIME_DIRECTORY": run}
        path = os.path.join(run, f"{fleet_name}.sock")
        # A live service-mode fleet's table, naming the socket it will open: booting.
        table = SlotTable.create(fleet_name, ft.ROLES, ft.N_SLOTS,
                                 meta={**ft.boot_meta(fleet_name), "socket": path})
        server = control.ControlServer(path, control.inline_dispatch(object()))
        try:
            with pytest.raises(fleet.NotRunning, match="booting"):
                fleet.connect(fleet_name, env=env, boot_wait=0.3)
            # the socket opens only once connect has found the fleet booting and waited
            clock = _BootPolls(on_first=server.start)
            monkeypatch.setattr(client_mod, "time", clock)
            client = fleet.connect(fleet_name, env=env, boot_wait=BOUND_S)
            try:
                assert client.ping()["pong"] is True
                assert clock.polls >= 1  # it did wait for the socket
            finally:
                client.close()
        finally:
            server.close()
            table.close()
            table.unlink()


def test_connect_does_not_wait_for_an_embedded_or_absent_fleet(fleet_name, monkeypatch):
    import os

    from fleet.api import client as client_mod
    from fleet.shm.table import SlotTable
    from tests import fleet_tables as ft

    clock = _BootPolls()
    monkeypatch.setattr(client_mod, "time", clock)
    with tempfile.TemporaryDirectory(dir="/tmp") as run:
        env = {"RUNTIME_DIRECTORY": run}
        with pytest.raises(fleet.NotRunning, match="not running"):
            fleet.connect(fleet_name, env=env, boot_wait=BOUND_S)
        meta = {**ft.boot_meta(fleet_name), "mode": "embedded", "socket": os.path.join(run, "x.sock")}
        table = SlotTable.create(fleet_name, ft.ROLES, ft.N_SLOTS, meta=meta)
        try:
            with pytest.raises(fleet.NotRunning, match="not running"):
                fleet.connect(fleet_name, env=env, boot_wait=BOUND_S)
        finally:
            table.close()
            table.unlink()
    assert clock.polls == 0  # neither waited


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
    assert poll.result(0) == {"outcomes": [], "first": 0, "more": False, "closing": False}


def test_store_sends_again_what_a_lost_reply_carried_until_it_is_acknowledged():
    store = OutcomeStore(clock=Clock())
    store.hold(TOKEN)
    store.put(TOKEN, solved(1))
    store.put(TOKEN, solved(2))
    lost = store.collect(TOKEN, 10, ack=0).result(0)  # a reply the client never read
    assert lost["first"] == 0 and [r["seq"] for r in lost["outcomes"]] == [1, 2]
    assert store.undelivered() == 0  # sent: fleetd's linger does not wait for the ack
    again = store.collect(TOKEN, 10, ack=0).result(0)  # the client asks again, having none
    assert again["first"] == 0 and [r["seq"] for r in again["outcomes"]] == [1, 2]
    waiting = store.collect(TOKEN, 10, ack=2)  # has both now: they go, nothing is ready
    assert not waiting.done()
    store.put(TOKEN, solved(3))
    reply = waiting.result(0)
    assert reply["first"] == 2 and [r["seq"] for r in reply["outcomes"]] == [3]
    with pytest.raises(control.ProtocolError, match="ack 9 is past"):
        store.collect(TOKEN, 0, ack=9).result(0)
    assert store.collect(TOKEN, 0).result(0)["outcomes"] == []  # no ack: what was sent counts as had


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
    with pytest.raises(control.OutcomesDropped, match=r"nobody collected them for 60s \(limits.held_outcome_ttl_s\)"):
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
