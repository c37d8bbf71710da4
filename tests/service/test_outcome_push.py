"""Outcomes pushed on a client's submit connection (``submit_batch`` v2): the daemon's
`OutcomeStore` with a stand-in for the connection's push side, on a fake clock. One
wake-up carries every record held meanwhile; the supervisor's loop writes what its
delivery held at its end, waking no other thread; a poll waits while a stream is
attached and takes over every record not acknowledged when it closes; an ack older than
one heard before drops nothing; and the client takes each numbered record once, whatever
path and thread brought it."""
from __future__ import annotations

import json
import threading
from concurrent.futures import Future

import pytest

from fleet.service import control
from fleet.service.control.outcome_record import encode as encode_outcome
from fleet.service.control.wire import Push, decode_stream, encode_push
from fleet.service.daemon import OutcomeStore

TOKEN = "push-token-0123456789"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class FakeStream:
    """The push side of a connection: `ready` queues a pull, as the control thread would
    run it; `write` makes and writes one from the caller's thread."""

    def __init__(self):
        self.pulls, self.sent, self.closers = [], [], []
        self.behind = False  # the peer has not read what went before

    def room(self):
        return not self.behind

    def ready(self, pull):
        self.pulls.append(pull)

    def write(self, pull):
        data = pull()
        if data is not None:
            self.sent.append(data)

    def on_close(self, fn):
        self.closers.append(fn)

    def run(self) -> list:
        """What the control thread would write: the frames of the pulls asked, in order."""
        frames = []
        while self.pulls:
            frame = self.pulls.pop(0)()
            if frame is not None:
                frames.append(frame)
        return frames

    def close(self):
        for fn in self.closers:
            fn()


def solved(seq):
    fut = Future()
    fut.unit_id = seq
    fut.set_result(seq * seq)
    return encode_outcome(seq, "r", fut)


def pushed(frame: bytes) -> Push:
    push = decode_stream(frame)
    assert type(push) is Push and push.token == TOKEN
    return push


def test_records_held_meanwhile_ride_one_push_numbered_from_the_first():
    store, stream = OutcomeStore(clock=Clock()), FakeStream()
    store.hold(TOKEN)
    store.attach(TOKEN, stream)
    for seq in (1, 2, 3):
        store.put(TOKEN, solved(seq))
    assert len(stream.pulls) == 1  # one wake-up for the three
    [frame] = stream.run()
    push = pushed(frame)
    assert push.first == 0 and [r["seq"] for r in push.outcomes] == [1, 2, 3]
    store.put(TOKEN, solved(4))
    [frame] = stream.run()
    assert pushed(frame).first == 3 and [r["seq"] for r in pushed(frame).outcomes] == [4]
    assert store.undelivered() == 0


def test_the_loops_delivery_writes_its_records_at_its_end_waking_no_thread():
    store, stream = OutcomeStore(clock=Clock()), FakeStream()
    store.attach(TOKEN, stream)
    store.flush()  # the loop's first delivery: this thread is the loop's from now on
    for seq in (1, 2):
        store.put(TOKEN, solved(seq))
    assert stream.pulls == [] and stream.sent == []  # nothing woken, nothing written yet
    store.flush()  # the delivery's end
    [frame] = stream.sent
    assert [r["seq"] for r in pushed(frame).outcomes] == [1, 2] and stream.pulls == []
    other = threading.Thread(target=store.put, args=(TOKEN, solved(3)))
    other.start()
    other.join()
    assert len(stream.pulls) == 1  # held on another thread: the control thread is asked


def test_records_held_on_the_loops_thread_outside_a_delivery_go_out_at_the_next_expiry():
    store, stream = OutcomeStore(clock=Clock()), FakeStream()
    store.attach(TOKEN, stream)
    store.flush()
    store.put(TOKEN, solved(1))  # on the loop's thread, but no delivery's end follows
    assert stream.pulls == [] and stream.sent == []
    store.expire()
    [frame] = stream.run()
    assert [r["seq"] for r in pushed(frame).outcomes] == [1]
    store.flush()
    assert stream.sent == []  # taken once


def test_a_client_behind_on_its_pushes_gets_the_next_from_the_control_thread_once_it_reads():
    store, stream = OutcomeStore(clock=Clock()), FakeStream()
    store.attach(TOKEN, stream)
    store.flush()
    stream.behind = True  # past the connection's high-water mark
    store.put(TOKEN, solved(1))
    store.flush()
    assert stream.sent == [] and len(stream.pulls) == 1  # not written past the mark: asked
    [frame] = stream.run()  # the control thread makes it when the peer has read
    assert [r["seq"] for r in pushed(frame).outcomes] == [1]


def test_a_poll_waits_while_attached_and_takes_every_unacknowledged_record_when_the_stream_closes():
    store, stream = OutcomeStore(clock=Clock()), FakeStream()
    store.attach(TOKEN, stream)
    poll = store.collect(TOKEN, 10, ack=0)
    store.put(TOKEN, solved(1))
    store.put(TOKEN, solved(2))
    assert not poll.done()  # the stream carries them
    [frame] = stream.run()  # pushed; then the connection breaks before the client read it
    assert pushed(frame).first == 0
    poll = store.collect(TOKEN, 10, ack=0)  # a poll that comes with records held waits too
    assert not poll.done()
    stream.close()
    reply = poll.result(0)
    assert reply["first"] == 0 and [r["seq"] for r in reply["outcomes"]] == [1, 2]


def test_a_poll_that_expires_while_its_records_are_pushed_is_answered_empty():
    clock = Clock()
    store, stream = OutcomeStore(clock=clock), FakeStream()
    store.attach(TOKEN, stream)
    poll = store.collect(TOKEN, 5, ack=0)
    store.put(TOKEN, solved(1))
    stream.run()  # pushed, not yet acknowledged
    clock.now += 6
    store.expire()
    assert poll.result(0)["outcomes"] == []  # the stream carried it: it does not go again


def test_an_attach_pushes_again_from_the_first_record_not_acknowledged():
    store, first, second = OutcomeStore(clock=Clock()), FakeStream(), FakeStream()
    store.attach(TOKEN, first)
    for seq in (1, 2, 3):
        store.put(TOKEN, solved(seq))
    first.run()
    store.acknowledge(TOKEN, 1)  # the client has the first
    store.attach(TOKEN, second)  # its next batch went on a new connection
    [frame] = second.run()
    assert pushed(frame).first == 1 and [r["seq"] for r in pushed(frame).outcomes] == [2, 3]


def test_a_batch_says_its_ack_and_its_connection_with_its_hold():
    """``submit_batch`` v2 says all it says of its token in one `hold`: the client's ack
    lets go of what it has, its connection is attached and pushed to from the first
    record not acknowledged, an ack past what was sent is ignored, and attaching the same
    connection again asks for nothing."""
    store, first, second = OutcomeStore(clock=Clock()), FakeStream(), FakeStream()
    store.hold(TOKEN, True, False, ack=None, stream=first)
    assert store.takes(TOKEN) == (True, False)
    for seq in (1, 2, 3):
        store.put(TOKEN, solved(seq))
    first.run()
    store.hold(TOKEN, ack=1, stream=second)  # the next batch, on a new connection
    [frame] = second.run()
    assert pushed(frame).first == 1 and [r["seq"] for r in pushed(frame).outcomes] == [2, 3]
    store.hold(TOKEN, ack=99, stream=second)  # past what was sent; the same connection
    assert second.pulls == [] and len(second.closers) == 1
    assert store.collect(TOKEN, 0, ack=3).result(0)["first"] == 3  # 1 acknowledged, 2 and 3 by this poll
    second.close()  # detached: nothing more goes to it
    store.put(TOKEN, solved(4))
    assert second.pulls == []


def test_an_ack_older_than_one_heard_before_drops_nothing():
    store, stream = OutcomeStore(clock=Clock()), FakeStream()
    store.attach(TOKEN, stream)
    for seq in range(1, 6):
        store.put(TOKEN, solved(seq))
    stream.run()
    store.acknowledge(TOKEN, 5)  # a batch said the client has all five
    reply = store.collect(TOKEN, 0, ack=3).result(0)  # a poll sent before that batch
    assert reply["outcomes"] == [] and reply["first"] == 5
    store.acknowledge(TOKEN, 99)  # past what was sent: a batch's ack is advisory
    assert store.collect(TOKEN, 0, ack=5).result(0)["first"] == 5


def test_a_client_takes_each_numbered_record_once_whatever_path_brings_it():
    from fleet.api.client import Client, _RemoteUnitFuture

    client = Client("push", "/nonexistent.sock")
    try:
        futures = {}
        for seq in range(1, 41):
            fut = futures[seq] = _RemoteUnitFuture(client)
            client._pending[seq] = (fut, "r")
        records = [solved(seq)[0] for seq in range(1, 41)]
        token = client._token
        # a push and a poll's reply bring overlapping runs, on two threads at once
        runs = [(records[0:30], 0), (records[10:40], 10), (records[0:40], 0)]
        threads = [threading.Thread(target=client._deliver, args=(run, first, token)) for run, first in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert client._received == 40 and not client._pending
        assert {seq: fut.result(0) for seq, fut in futures.items()} == {seq: seq * seq for seq in range(1, 41)}
    finally:
        client.close()


def test_a_client_takes_nothing_from_a_run_that_skips_an_outcome_it_has_not_had():
    from fleet.api.client import Client, _RemoteUnitFuture

    client = Client("push", "/nonexistent.sock")
    try:
        futures = {}
        for seq in (1, 2, 3):
            fut = futures[seq] = _RemoteUnitFuture(client)
            client._pending[seq] = (fut, "r")
        records = [solved(seq)[0] for seq in (1, 2, 3)]
        assert client._deliver(records[1:], 1, client._token) is False  # outcome 0 never came
        assert client._received == 0 and not any(f.done() for f in futures.values())
        assert client._deliver(records, 0, client._token) is True  # sent again from the first
        assert [futures[seq].result(0) for seq in (1, 2, 3)] == [1, 4, 9]
    finally:
        client.close()


@pytest.mark.parametrize("frame, needle", [
    (b'{"push": {"token": "t", "first": -1, "outcomes": []}}', "a push frame must be"),
    (b'{"push": {"token": "t", "first": 0}}', "a push frame must be"),
    (b'{"push": {"token": "t", "first": 0, "outcomes": []}, "id": 1}', "a push frame must be"),
    (b'{"push": [1]}', "a push frame must be"),
    (b'{"id": 1}', "reply must be an object with a boolean 'ok'"),
])
def test_a_malformed_push_frame_is_an_invalid_reply(frame, needle):
    with pytest.raises(control.ProtocolError, match=needle) as err:
        decode_stream(frame)
    assert err.value.code == control.E_INVALID_REPLY


def test_a_push_frame_round_trips():
    frame = encode_push(TOKEN, 7, [{"seq": 1}])
    assert json.loads(frame) == {"push": {"token": TOKEN, "first": 7, "outcomes": [{"seq": 1}]}}
    assert decode_stream(frame) == Push(TOKEN, 7, [{"seq": 1}])
