"""Service-mode submits travel coalesced (`fleet.api.submit_pipe`, the ``submit_batch`` op)
against a real fleetd: a lone submit goes out at once, the ones made while a frame is in
flight go out together in the next; a refused unit is refused alone; a malformed batch
frame is refused whole, naming what was wrong, and admits nothing; a batch whose sender
leaves before the reply still gives each unit one outcome; an idle and a hostile
connection cost a client nothing."""
from __future__ import annotations

import base64
import pickle
import signal
import socket
import threading

import pytest

import fleet
from fleet.service import control
from fleet.service.control.ops.units import MAX_BATCH_UNITS
from fleet.service.control.wire import MAX_FRAME, encode_request
from tests.daemons import BOUND_S, idle_connections, outcome_of, served_fleetd, wait_until
from tests.fleets import role

TOKEN = "batch-token-0123456789"


def roles():
    return {name: {k: v for k, v in role(handler, slots=1).items() if k != "peak_cpus"}
            for name, handler in (("sq", "square"), ("held", "wait_for_file"), ("echo", "echo"))}


@pytest.fixture(scope="module")
def served():
    with served_fleetd("sb", roles()) as d:
        yield d


@pytest.fixture
def client(served):
    c = served.connect()
    yield c
    c.close()


def unit(seq: int, value=3, **extra) -> dict:
    return {"role": "sq", "payload": base64.b64encode(pickle.dumps(value)).decode(), "encoding": "pickle",
            "seq": seq, **extra}


def settled(d) -> int:
    with control.ControlClient(d.socket_path) as c:
        counts = c.call("ledger")
    assert counts["submitted"] == counts["solved"] + counts["suppressed"] + counts["failed"] + counts["inflight"]
    return counts["inflight"]


def all_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (SIGSTOP takes effect after kill() returns)."""
    import os

    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
    return bool(states) and all(state == "T" for state in states)


@pytest.fixture
def stopped(served):
    """Stops fleetd (SIGSTOP) for the test's block, every thread of it; always goes on (SIGCONT)."""
    def stop():
        served.signal(signal.SIGSTOP)
        wait_until(lambda: all_stopped(served.proc.pid), "every thread of fleetd to stop")
    try:
        yield stop
    finally:
        served.signal(signal.SIGCONT)


def answered(client) -> None:
    """Wait until every frame of ``client``'s has its reply (an outcome may come first: it is
    pushed from the supervisor's loop, the reply from the control thread)."""
    wait_until(lambda: client._pipe.in_flight() == 0, "the submit replies")


def test_a_lone_submit_goes_out_at_once_and_those_made_meanwhile_go_out_as_one_frame(served, client, stopped):
    assert client.submit("sq", 1).result(BOUND_S) == 1
    answered(client)
    before = client._pipe.frames
    stopped()  # fleetd reads nothing now: the frame stays in flight
    lone = client.submit("sq", 2)
    # written on the caller's thread before submit returned: no timer, no other thread
    assert client._pipe.frames == before + 1 and client._pipe.in_flight() == 1
    more = [client.submit("sq", i) for i in range(50)]
    assert client._pipe.frames == before + 1  # queued behind the frame in flight
    served.signal(signal.SIGCONT)
    assert lone.result(BOUND_S) == 4
    assert [f.result(BOUND_S) for f in more] == [i * i for i in range(50)]
    assert client._pipe.frames == before + 2  # the fifty went out together, once the reply came
    ids = [f.unit_id for f in [lone, *more]]
    assert len(set(ids)) == 51 and all(isinstance(i, int) for i in ids)


def test_a_unit_the_fleet_refuses_is_refused_alone_and_its_batch_runs(served, client, stopped):
    client.submit("sq", 1).result(BOUND_S)
    answered(client)
    base = served.submitted()
    stopped()
    first = client.submit("sq", 2)
    frames = client._pipe.frames
    batch = [client.submit("sq", 3), client.submit("nope", 4), client.submit("sq", 5, key="k"),
             client.submit("sq", 6)]
    served.signal(signal.SIGCONT)
    assert first.result(BOUND_S) == 4
    good, unknown, keyed, last = batch
    assert good.result(BOUND_S) == 9 and last.result(BOUND_S) == 36
    with pytest.raises(fleet.UnknownRoleError, match="unknown role 'nope'"):
        unknown.result(BOUND_S)
    with pytest.raises(fleet.BadUnit, match="takes no key"):
        keyed.result(BOUND_S)
    assert client._pipe.frames == frames + 1  # the four travelled in one frame
    assert unknown.unit_id is None and keyed.unit_id is None and isinstance(good.unit_id, int)
    wait_until(lambda: settled(served) == 0, "the units to end")
    assert served.submitted() - base == 3  # the refused ones were never units


GOOD = unit(1)

MALFORMED = [
    ({"v": 3}, "batch version 3 is not spoken here (this daemon speaks 1, 2)"),
    ({"v": 1, "ack": 0}, "ack must be an integer >= 0, with v 2 or later; got ack 0 with v 1"),
    ({"v": 2, "ack": -1}, "ack must be an integer >= 0"),
    ({"v": 2, "ack": "3"}, "argument ack must be integer or null, got string"),
    ({"token": "not a token!"}, "token must be 8-128 letters"),
    ({"units": "x"}, "argument units must be array, got string"),
    ({"units": []}, f"units must hold 1-{MAX_BATCH_UNITS} units, got 0"),
    ({"units": [unit(i) for i in range(MAX_BATCH_UNITS + 1)]}, f"got {MAX_BATCH_UNITS + 1}"),
    ({"units": [GOOD, 5]}, "units[1] must be an object, got integer"),
    ({"units": [GOOD, unit(2, token=TOKEN)]}, "units[1]: unknown argument(s) token (the batch's token"),
    ({"units": [GOOD, unit(2, bogus=1)]}, "units[1]: unknown argument(s) bogus"),
    ({"units": [GOOD, {k: v for k, v in unit(2).items() if k != "seq"}]}, "units[1]: seq is required"),
    ({"units": [GOOD, unit(1)]}, "units[1]: seq 1 is given twice in this batch"),
    ({"units": [GOOD, unit(2, payload="!!not base64")]}, "units[1]: submit: payload is not valid base64"),
    ({"units": [GOOD, unit(-1)]}, "units[1]: submit: seq"),
    ({"units": [GOOD, unit(2, priority="high")]}, "units[1]: submit: argument priority must be integer"),
    ({"units": [GOOD, unit(2, role="")]}, "units[1]: submit: role must be a non-empty string"),
    ({"units": [GOOD, unit(2, payload=5)]}, "units[1]: submit: a pickle payload must be a base64 string"),
]


@pytest.mark.parametrize("change, needle", MALFORMED, ids=[m[1][:40] for m in MALFORMED])
def test_a_malformed_batch_is_refused_whole_naming_what_was_wrong_and_admits_nothing(served, change, needle):
    base = served.submitted()
    args = {"v": 1, "token": TOKEN, "units": [GOOD], **change}
    with control.ControlClient(served.socket_path) as c:
        reply = c.send_raw(encode_request("submit_batch", args, 7))
        assert not reply.ok and reply.id == 7
        assert reply.error_type == control.E_INVALID_ARGS and needle in reply.error_message, reply.error_message
        # the connection goes on: the same frame, well formed, is served on it
        again = c.send_raw(encode_request("submit_batch", {"v": 1, "token": TOKEN, "units": [unit(9)]}, 8))
        assert again.ok and isinstance(again.result["units"][0], int)
    wait_until(lambda: settled(served) == 0, "the well-formed unit to end")
    assert served.submitted() - base == 1  # the malformed frame admitted no unit, not even its good one


def test_a_batch_whose_sender_leaves_before_its_reply_gives_each_unit_one_outcome(served):
    token = "leaver-token-0123456789"
    base = served.submitted()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(served.socket_path)
    frame = encode_request("submit_batch", {"v": 1, "token": token, "units": [unit(1, 1), unit(2, 2), unit(3, 3)]}, 1)
    cut = encode_request("submit_batch", {"v": 1, "token": token, "units": [unit(4, 4)]}, 2)
    sock.sendall(frame + cut[: len(cut) // 2])  # a whole frame, then half of one, then gone
    sock.close()
    got, ack = {}, 0
    with control.ControlClient(served.socket_path) as c:
        while len(got) < 3:
            reply = c.call("collect", token=token, timeout=5.0, ack=ack)
            for record in reply["outcomes"]:
                assert record["seq"] not in got  # one outcome per unit
                got[record["seq"]] = record
            ack = reply["first"] + len(reply["outcomes"])
    assert sorted(got) == [1, 2, 3] and {r["kind"] for r in got.values()} == {"solved"}
    wait_until(lambda: settled(served) == 0, "the units to end")
    assert served.submitted() - base == 3  # the half frame admitted nothing


def test_an_idle_and_a_hostile_connection_cost_a_client_nothing(served, client):
    base = served.submitted()
    with idle_connections(served.socket_path, 1):
        hostile = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        hostile.connect(served.socket_path)
        try:
            hostile.sendall(encode_request("submit_batch", {"v": 1, "token": TOKEN, "units": [[1], {"x": 1}]}, 1))
            # then a batch frame that never ends, past the frame limit
            hostile.sendall(b'{"id": 2, "op": "submit_batch", "args": {"v": 1, "units": [' + b"7," * (MAX_FRAME // 2))
            futs = [client.submit("sq", i) for i in range(20)]
            assert [f.result(BOUND_S) for f in futs] == [i * i for i in range(20)]
            replies = b""
            while data := hostile.recv(65536):  # the two error replies, then the daemon closes it
                replies += data
        finally:
            hostile.close()
    assert b"InvalidArgs" in replies and b"units[0] must be an object, got array" in replies
    assert b"FrameTooLarge" in replies
    wait_until(lambda: settled(served) == 0, "the client's units to end")
    assert served.submitted() - base == 20


def test_many_threads_submitting_at_once_each_get_one_outcome_per_unit(served, client):
    import threading

    results: dict[int, list] = {}

    def submitter(k: int) -> None:
        futs = [client.submit("sq", k * 100 + i) for i in range(40)]
        results[k] = [outcome_of(f) for f in futs]

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND_S)
    assert {k: v for k, v in results.items()} == {
        k: [("solved", (k * 100 + i) ** 2) for i in range(40)] for k in range(4)}


def test_a_unit_admitted_while_its_client_closes_still_gets_its_outcome(served, stopped):
    import threading

    client = served.connect()
    stopped()
    fut = client.submit("sq", 3)  # its first unit: admitted only after the client began to close
    closer = threading.Thread(target=client.shutdown)
    closer.start()
    wait_until(lambda: client._closing, "the client to begin closing")
    served.signal(signal.SIGCONT)
    closer.join(BOUND_S)
    assert not closer.is_alive() and fut.result(0) == 9


def resolving_threads(monkeypatch) -> list:
    """The names of the threads that set a service-mode future's result from now on, filled in
    as they do (the test's client is the only one submitting meanwhile)."""
    from fleet.api.client import _RemoteUnitFuture

    names: list = []
    original = _RemoteUnitFuture.set_result

    def set_result(self, result):
        names.append(threading.current_thread().name)
        return original(self, result)

    monkeypatch.setattr(_RemoteUnitFuture, "set_result", set_result)
    return names


def test_outcomes_come_back_on_the_submit_connection_with_no_poll_carrying_them(served, client, monkeypatch):
    threads = resolving_threads(monkeypatch)
    futs = [client.submit("sq", i) for i in range(30)]
    assert [f.result(BOUND_S) for f in futs] == [i * i for i in range(30)]
    # pushed on the connection the submits went out on, read by its reader: no collect
    # asked for them, no collector thread between the socket and the caller
    assert threads and set(threads) == {"fleet-client-submits"}


def test_outcomes_owed_when_the_submit_connection_breaks_come_by_the_poll(served, client, tmp_path, monkeypatch):
    gate = tmp_path / "go"
    assert client.submit("sq", 2).result(BOUND_S) == 4  # outcomes pushed on the submit connection now
    fut = client.submit("held", (str(gate), 5))
    assert fut.unit_id is not None  # admitted: its reply came; the unit waits for the gate
    threads = resolving_threads(monkeypatch)
    client._pipe._sock.shutdown(socket.SHUT_RDWR)  # that connection breaks before the outcome
    wait_until(lambda: client._pipe._sock is None, "the client to see its connection closed")
    gate.touch()
    assert fut.result(BOUND_S) == 25  # held for the client's poll once the stream was gone
    assert threads == [f"fleet-client-{served.name}"]
    wait_until(lambda: settled(served) == 0, "the units to end")


def test_large_outcomes_pushed_while_replies_go_out_arrive_whole_and_in_full(served, client, monkeypatch):
    # Values of 48 KiB: the pushes outrun the socket (written in part, held back past the
    # high-water mark, finished by the control thread) while batch replies join them.
    blob = bytes(range(256)) * 192
    threads = resolving_threads(monkeypatch)
    futs = [client.submit("echo", (i, blob)) for i in range(120)]
    assert all(f.result(BOUND_S) == (i, blob) for i, f in enumerate(futs))
    assert set(threads) == {"fleet-client-submits"}
