"""A client's submits through its inlet (`fleet.service.inlets`, `fleet.shm.inlet`),
against a real fleetd: batches of plain units go through shared memory, answered on the
connection as frames are; a batch the fleet refuses part of, or the check refuses
whole, is answered as a frame would be; an inlet a client writes anything into is
closed, and fleetd serves on; an inlet lives as long as its connection; a uid that may
not submit gets none."""
from __future__ import annotations

import os
import pickle
import signal
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.service import control
from fleet.service.control.wire import decode_reply, decode_stream
from fleet.shm import inlet as inlet_mod
from fleet.shm.dataplane import DataSegment
from tests import require
from tests.daemons import BOUND_S, Fleetd, served_fleetd, wait_until
from tests.fleets import role
from tests.stalls import wait_state
from tests.uids import NOBODY, as_nobody

TOKEN = "inlet-token-0123456789"


def roles():
    return {"sq": {k: v for k, v in role("square", slots=1).items() if k != "peak_cpus"}}


_OP = control.OPS.get("submit_batch")


def _verdict(fn):
    try:
        return "admitted", fn()
    except control.ProtocolError as exc:
        return "refused", exc.code, exc.message


@settings(max_examples=400, deadline=None)
@given(token=st.one_of(st.sampled_from(["token-0123456789", "bad token!", "short", "x" * 129]),
                       st.text(alphabet="ab_-9 ", max_size=14)),
       ack=st.integers(-2, 4),
       units=st.lists(st.tuples(st.one_of(st.integers(-2, 4), st.sampled_from([(1 << 63) - 1, 1 << 63])),
                                st.sampled_from(["work", "", "other"]), st.binary(max_size=3)), max_size=5))
def test_an_inlets_batch_is_checked_by_the_rules_a_frames_is(token, ack, units):
    """What the loop admits from an inlet (`check_plain`, on the units the ring typed) is
    what `validate` admits from the same batch as a frame, checked the same, and refused
    with the same error; where the plain rule does not take a unit, `validate` refuses it."""
    wire = {"v": 2, "token": token, "ack": ack, "fds": True, "parcels": True,
            "units": [{"role": role, "payload": payload, "encoding": "pickle", "seq": seq}
                      for seq, role, payload in units]}
    plain = _verdict(lambda: _OP.check_plain(token, ack, units))
    full = _verdict(lambda: _OP.validate(wire)["units"])
    if plain == ("admitted", None):
        assert full[0] == "refused"
    else:
        assert plain == full


@pytest.fixture(scope="module")
def served():
    with served_fleetd("inl", roles()) as d:
        yield d


def inlet_fds(pid: int) -> int:
    """fleetd's mappings of inlet memfds (its descriptor of one goes with the reply)."""
    with open(f"/proc/{pid}/maps") as maps:
        return sum("/memfd:fleet-inlet" in line for line in maps)


class Raw:
    """A connection with an inlet, driven by hand: what fleet.Client does, and what a
    hostile client could do instead."""

    def __init__(self, d):
        self.client = control.ControlClient(d.socket_path, timeout=BOUND_S)
        reply = self.client.call("open_inlet")
        self.sock = self.client._sock
        held = reply["inlet"]
        self.fd = os.dup(held.fd)
        self.inlet = inlet_mod.Inlet.open(held.fd, reply["capacity"])
        held.fd = -1
        self.segment = DataSegment.attach(reply["fleet"])
        self.buf = b""

    def push(self, rid: int, units, ack=None) -> None:
        assert self.inlet.push(rid, TOKEN, ack, True, True, units)
        self.segment.bell.ring()

    def frame(self):
        while b"\n" not in self.buf:
            data = self.sock.recv(65536)
            assert data, "fleetd closed the connection"
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return decode_stream(line)

    def reply(self):
        """The next reply, past the outcomes pushed meanwhile (kept in `pushed`)."""
        while True:
            frame = self.frame()
            if isinstance(frame, control.wire.Push):
                self.pushed.extend(frame.outcomes)
                continue
            return frame

    pushed: list

    def close(self) -> None:
        self.inlet.close()
        self.segment.close()
        os.close(self.fd)
        self.client.close()


@pytest.fixture
def raw(served):
    r = Raw(served)
    r.pushed = []
    yield r
    r.close()


def test_a_clients_submits_go_through_its_inlet(served):
    base = served.submitted()
    with served.connect() as client:
        futs = [client.submit("sq", i) for i in range(40)]
        lone = [client.submit("sq", i).result(BOUND_S) for i in range(5)]
        assert [f.result(BOUND_S) for f in futs] == [i * i for i in range(40)]
        assert lone == [0, 1, 4, 9, 16]
        assert client._pipe.frames >= 6 and client._pipe.inlet_frames == client._pipe.frames
    assert served.submitted() - base == 45


def test_a_burst_split_over_the_inlet_and_the_socket_keeps_its_order(served):
    """Units queued past one batch while a frame is in flight, with one the inlet does not
    carry (a timeout) among them: the frames that take them go one way at a time, so every
    reply comes in the order its frame went (a batch through the inlet is answered at the
    loop's turn, one on the socket by the control thread, sooner), and the units are
    admitted in the order they were submitted (their ids rise)."""
    with served.connect() as client:
        client.submit("sq", 0).result(BOUND_S)  # connected, its inlet open
        threads = [int(t) for t in os.listdir(f"/proc/{served.proc.pid}/task")]
        served.signal(signal.SIGSTOP)  # the next frame stays in flight while the rest queue
        try:
            for tid in threads:
                wait_state(tid, "Tt")
            futs = [client.submit("sq", i) for i in range(5000)]
            futs.append(client.submit("sq", 5000, timeout=30.0))
            futs += [client.submit("sq", i) for i in range(5001, 5200)]
        finally:
            served.signal(signal.SIGCONT)
        assert [f.result(BOUND_S) for f in futs] == [i * i for i in range(5200)]
        ids = [f.unit_id for f in futs]
        assert ids == sorted(ids)
        assert 0 < client._pipe.inlet_frames < client._pipe.frames  # both ways were taken


def test_a_batch_is_answered_as_a_frame_is_a_refusal_for_its_unit_alone(served, raw):
    base = served.submitted()
    raw.push(1, [(1, "sq", pickle.dumps(3)), (2, "nope", pickle.dumps(4)), (3, "sq", pickle.dumps(5))])
    reply = raw.reply()
    assert reply.ok and reply.id == 1, reply
    ids, errors = reply.result["units"], reply.result["errors"]
    assert ids[0] is not None and ids[1] is None and ids[2] is not None
    assert list(errors) == ["1"] and errors["1"]["type"] == "UnknownRoleError"
    while len(raw.pushed) < 2:  # the socket's timeout bounds each read
        raw.pushed.extend(_pushes(raw))
    assert sorted((r["seq"], r["kind"]) for r in raw.pushed) == [(1, "solved"), (3, "solved")]
    assert served.submitted() - base == 2


def _pushes(raw) -> list:
    frame = raw.frame()
    assert isinstance(frame, control.wire.Push), frame
    return frame.outcomes


@pytest.mark.parametrize("units, says", [
    ([(1, "", pickle.dumps(1))], "units[0]: submit: role must be a non-empty string"),
    ([(1, "sq", pickle.dumps(1)), (1, "sq", pickle.dumps(2))], "units[1]: seq 1 is given twice"),
    ([], "units must hold 1-4096 units, got 0"),
])
def test_a_malformed_batch_is_refused_whole_and_admits_nothing(served, raw, units, says):
    base = served.submitted()
    raw.push(7, units)
    reply = raw.reply()
    assert not reply.ok and reply.id == 7 and reply.error_type == "InvalidArgs", reply
    assert says in reply.error_message
    assert served.submitted() == base


def _harm_words(raw) -> None:  # head far past anything written
    struct.pack_into("<Q", raw.inlet._mm, 0, 1 << 40)


def _harm_tag(raw) -> None:  # a message of another tag
    assert raw.inlet.ring.push(9, b"x" * 16)


def _harm_body(raw) -> None:  # a batch whose count says more units than it holds
    assert raw.inlet.ring.push(inlet_mod.BATCH, struct.pack("<QqBBI", 3, -1, 0, 4, 5) + b"tokn")


@pytest.mark.parametrize("harm", [_harm_words, _harm_tag, _harm_body], ids=["words", "tag", "body"])
def test_an_inlet_written_wrong_is_closed_and_fleetd_serves_on(served, raw, harm):
    base = served.submitted()
    before = inlet_fds(served.proc.pid)
    harm(raw)
    raw.segment.bell.ring()
    frame = raw.reply()
    assert not frame.ok and frame.id is None and frame.error_type == "InvalidArgs", frame
    assert "inlet closed" in frame.error_message
    wait_until(lambda: inlet_fds(served.proc.pid) == before - 1, "fleetd to let the inlet go")
    assert served.submitted() == base
    with served.connect() as client:  # everyone else is served as before
        assert [client.submit("sq", i).result(BOUND_S) for i in range(3)] == [0, 1, 4]
    assert served.proc.poll() is None


def test_a_client_that_reads_no_replies_fills_its_own_inlet_not_fleetds_memory(served, raw):
    """fleetd stops taking from an inlet whose replies wait unread, so its ring fills and
    the client's pushes fail; once it reads, every batch is answered."""
    units = [(seq, "nope", b"") for seq in range(1, 201)]  # each refused: a reply of 200 errors
    pushed = refused_in_a_row = 0
    while refused_in_a_row < 300:  # the ring stays full: fleetd takes nothing more
        if pushed == 2000:
            pytest.fail("fleetd took 2,000 batches whose replies nobody read")
        if raw.inlet.push(pushed + 1, TOKEN, None, True, True, units):
            pushed += 1
            refused_in_a_row = 0
        else:
            refused_in_a_row += 1
            time.sleep(0.01)  # a fleetd taking on would have made room meanwhile
        raw.segment.bell.ring()
    answered = []
    while len(answered) < pushed:
        reply = raw.reply()
        assert reply.ok and list(reply.result["errors"]) == [str(i) for i in range(200)], reply
        answered.append(reply.id)
        if len(answered) == pushed // 2:
            raw.segment.bell.ring()  # the loop turns at once to take the rest
    assert answered == list(range(1, pushed + 1))


def test_an_inlet_lives_as_long_as_its_connection(served):
    before = inlet_fds(served.proc.pid)
    r = Raw(served)
    wait_until(lambda: inlet_fds(served.proc.pid) == before + 1, "fleetd to map the inlet")
    with pytest.raises(control.RemoteError, match="this connection has its inlet already"):
        r.client.call("open_inlet")
    r.close()
    wait_until(lambda: inlet_fds(served.proc.pid) == before, "fleetd to close the inlet with its connection")


def test_a_batch_pushed_just_before_its_client_left_is_still_admitted(served):
    base = served.submitted()
    r = Raw(served)
    r.push(1, [(1, "sq", pickle.dumps(2)), (2, "sq", pickle.dumps(3))])
    r.close()  # at once: the reply is never read
    wait_until(lambda: served.submitted() - base == 2, "the two units admitted")


def test_a_uid_that_may_not_submit_gets_no_inlet(fleet_name):
    with Fleetd(fleet_name, roles(), args=("--socket-group", str(NOBODY))) as d:
        path = d.socket_path

        def child():
            with control.ControlClient(path) as c:
                try:
                    c.call("open_inlet")
                    return "allowed"
                except control.PermissionDenied as exc:
                    return [type(exc).__name__, str(exc)]

        seen = as_nobody(child)
        assert seen[0] == "PermissionDenied" and "uid 65534" in seen[1], seen
        assert inlet_fds(d.proc.pid) == 0
        with d.connect() as client:  # the owner still gets one
            assert client.submit("sq", 4).result(BOUND_S) == 16
            assert client._pipe.inlet_frames == 1


def test_a_client_of_another_uid_that_trusts_fleetds_uid_gets_its_inlet(fleet_name):
    """fleetd runs as uid 65534; this client (root, which may submit to it) trusts that uid,
    and rings the bell in the data segment that uid owns."""
    if os.geteuid() != 0:
        require.lacking("root, to run fleetd as uid 65534")
    with Fleetd(fleet_name, roles(), as_nobody=True) as d:
        with d.connect(trust_uids=(NOBODY,)) as client:
            assert [client.submit("sq", i).result(BOUND_S) for i in range(3)] == [0, 1, 4]
            assert client._pipe.inlet_frames == client._pipe.frames == 3
