"""A payload's memfd handed to its worker (`fleet.shm.handoff`), on real socketpairs and memfds in
this process: a task packed with ``handoff`` names the memfd and is built over it at the other
end; records are taken by inode whatever their order; a record that does not match is
refused by name; nothing is left open. fleetd's whole path is in
tests/service/test_large_data.py."""
from __future__ import annotations

import contextlib
import logging
import mmap
import os
import pickle
import socket

import numpy as np
import pytest

from fleet.service.control import fds as fdpass
from fleet.shm import handoff
from fleet.worker import codec


def open_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def memfd(data: bytes) -> int:
    return fdpass.sealed(data)


@pytest.fixture
def pair():
    ours, theirs = handoff.channel()
    inbox = handoff.Inbox(theirs)
    try:
        yield ours, inbox
    finally:
        ours.close()
        theirs.close()


@pytest.fixture
def inbox_set(pair):
    ours, inbox = pair
    codec.set_inbox(inbox)
    try:
        yield ours
    finally:
        codec.set_inbox(None)


def laid(value):
    """A `codec._Laid` of `value` in a sealed memfd, as fleetd holds a client's payload."""
    pieces, spans, n_oob = codec.lay_out(value, "payload")
    fd = memfd(pieces)
    mm = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    return codec._Laid(memoryview(mm), [tuple(s) for s in spans], n_oob, fd), fd


@contextlib.contextmanager
def handed_task(value, key=None):
    """A task packed with handoff, its payload `value` laid out in a memfd as fleetd holds
    it: (the payload, its memfd, the body, the `Handed`, its size); each closed after."""
    payload, fd = laid(value)
    handed = None
    try:
        body, handed, size = codec.pack_task("r", None, key, None, None, pickled_payload=payload, limit=None,
                                             fleet="handofftest", handoff=True)
        yield payload, fd, body, handed, size
    finally:
        if handed is not None:
            handed.close()
        os.close(fd)


def test_records_are_taken_by_inode_whatever_their_order(pair):
    ours, inbox = pair
    a, b = handoff.Handed(memfd(b"a" * 10), 10), handoff.Handed(memfd(b"b" * 20), 20)
    try:
        assert a.send(ours, 0) and b.send(ours, 0)
        got_b = inbox.take(b.ino)  # the first record waits for its own task
        got_a = inbox.take(a.ino)
        assert os.pread(got_b, 20, 0) == b"b" * 20 and os.pread(got_a, 10, 0) == b"a" * 10
        os.close(got_a)
        os.close(got_b)
    finally:
        a.close()
        b.close()


def test_a_task_whose_record_never_came_is_refused_by_name(pair):
    _ours, inbox = pair
    with pytest.raises(handoff.HandoffError, match=r"\(inode 12345\) did not come with its task"):
        inbox.take(12345)


def test_a_record_naming_another_file_is_refused_and_its_descriptor_closed(pair):
    ours, inbox = pair
    real = handoff.Handed(memfd(b"x"), 1)
    try:
        before = open_count()
        forged = real.ino + 1
        ours.sendmsg([handoff.RECORD.pack(forged)],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, __import__("array").array("i", [real.fd]))])
        with pytest.raises(handoff.HandoffError, match="of another file"):
            inbox.take(forged)
        assert open_count() == before
    finally:
        real.close()


def test_a_malformed_record_is_dropped_and_logged_and_the_next_one_taken(pair, caplog):
    ours, inbox = pair
    good = handoff.Handed(memfd(b"g"), 1)
    try:
        ours.send(b"short")  # no descriptor, wrong length
        assert good.send(ours, 3)
        with caplog.at_level(logging.ERROR, logger="fleet.shm.handoff"):
            fd = inbox.take(good.ino)
        os.close(fd)
        assert "malformed record" in caplog.text
    finally:
        good.close()


def test_a_task_handed_back_unrun_lets_its_descriptor_go(pair):
    ours, inbox = pair
    one = handoff.Handed(memfd(b"z" * 5), 5)
    try:
        before = open_count()
        assert one.send(ours, 0)
        inbox.drop(one.ino)  # read from the channel and closed
        assert open_count() == before
        with pytest.raises(handoff.HandoffError):
            inbox.take(one.ino)  # gone
        assert one.send(ours, 0)  # sent again with its next run: taken then
        os.close(inbox.take(one.ino))
    finally:
        one.close()


def test_a_channel_whose_worker_is_gone_refuses_the_send_quietly(caplog):
    ours, theirs = handoff.channel()
    theirs.close()
    one = handoff.Handed(memfd(b"q"), 1)
    try:
        with caplog.at_level(logging.ERROR, logger="fleet.shm.handoff"):
            assert one.send(ours, 7) is False
        assert caplog.text == ""  # a dead worker's death is told apart
        assert one.send(None, 7) is False
        assert "seat 7 has no descriptor channel" in caplog.text
    finally:
        one.close()
        ours.close()


def test_the_supervisors_end_takes_nothing_back():
    ours, theirs = handoff.channel()
    try:
        assert ours.type == socket.SOCK_SEQPACKET and not ours.getblocking()
        with pytest.raises(OSError):
            theirs.send(b"12345678")
    finally:
        ours.close()
        theirs.close()


def test_a_task_packed_with_handoff_names_the_memfd_and_is_built_over_it_writable(inbox_set):
    ours = inbox_set
    value = {"a": np.arange(1 << 16, dtype=np.float64), "b": b"q" * (1 << 19), "n": 7}
    with handed_task(value, key="k") as (payload, fd, body, handed, size):
        assert isinstance(handed, handoff.Handed) and size == os.fstat(fd).st_size
        assert codec.handed_inode(body) == os.fstat(fd).st_ino
        assert len(body) < 4096  # the payload's bytes stay in the memfd
        assert handed.send(ours, 0)
        got, key, _lane, _rid = codec.loads(body, "the payload", "in the worker")
        assert key == "k" and got["n"] == 7 and got["b"] == value["b"]
        assert np.array_equal(got["a"], value["a"]) and got["a"].flags.writeable
        got["a"][0] = -1.0  # the worker's own page: the memfd is sealed, and no one else sees it
        assert payload.n_oob == 1  # the array; the bytes are a blob
        assert os.pread(fd, 8, payload.spans[1][0]) == np.float64(0.0).tobytes()


def test_a_routed_task_handed_back_unrun_lets_its_descriptor_go(inbox_set):
    ours = inbox_set
    with handed_task(np.ones(1 << 15)) as (_payload, _fd, body, handed, _size):
        routed = codec.with_route(body, ("p", "m"))
        assert codec.handed_inode(routed, routed=True) == handed.ino
        before = open_count()
        assert handed.send(ours, 0)
        codec.let_go_handed(routed, routed=True)
        assert open_count() == before
        with pytest.raises(handoff.HandoffError):
            codec._INBOX.take(handed.ino)  # gone from the channel and from the inbox


def test_without_handoff_or_a_descriptor_a_laid_payload_is_copied_into_a_parcel():
    payload, fd = laid(np.ones(1 << 16))
    try:
        body, parcel, _ = codec.pack_task("r", None, None, None, None, pickled_payload=payload, limit=None,
                                          fleet=None)
        assert parcel is None and codec.handed_inode(body) is None  # no fleet: inline
        payload.fd = -1
        assert codec.pack_task("r", None, None, None, None, pickled_payload=payload, limit=None, fleet=None,
                               handoff=True)[1] is None
    finally:
        os.close(fd)


def test_a_handed_task_in_a_worker_without_a_channel_fails_by_name():
    with handed_task(np.ones(1 << 15)) as (_payload, _fd, body, _handed, _size):
        with pytest.raises(codec.CodecError, match="no descriptor channel"):
            codec.loads(body, "the payload", "in the worker")


def test_the_handed_body_is_a_pickle_of_inode_size_stream_spans_and_buffer_count():
    with handed_task(np.ones(1 << 15)) as (payload, _fd, body, handed, size):
        ino, n, _stream, spans, n_oob = pickle.loads(body[2:])
        assert (ino, n) == (handed.ino, size) and spans == [tuple(s) for s in payload.spans]
        assert n_oob == payload.n_oob == 1


def test_a_large_memfd_is_let_go_on_a_thread_beside_the_loop_and_a_small_one_at_once():
    import threading
    import time

    small = handoff.Handed(memfd(b"s" * 10), 10)
    fd = small.fd
    small.close()
    with pytest.raises(OSError):
        os.fstat(fd)  # closed at once
    size = handoff.CLOSE_ASIDE_MIN
    big = handoff.Handed(os.memfd_create("big"), size)
    fd = big.fd
    big.close()
    assert big.fd == -1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.fstat(fd)
        except OSError:
            break
        time.sleep(0.001)
    else:
        pytest.fail("the large memfd's descriptor was never closed")
    assert "fleet-handoff" in {t.name for t in threading.enumerate()}


def test_a_handed_memfd_dropped_open_is_told_and_closed(caplog):
    import gc

    one = handoff.Handed(memfd(b"d"), 1)
    fd, ino = one.fd, one.ino
    with caplog.at_level(logging.ERROR, logger="fleet.shm.handoff"):
        del one
        gc.collect()
    assert f"(inode {ino}) was dropped before its unit's outcome" in caplog.text
    with pytest.raises(OSError):
        os.fstat(fd)
