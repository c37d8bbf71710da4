"""An inlet (`fleet.shm.inlet`): a ring in a sealed memfd that a service client writes and
fleetd's loop reads, checking every word the client could have written before it reads
by it, and every message before it admits anything of it."""
from __future__ import annotations

import os
import struct

import pytest

from fleet.shm import inlet as inlet_mod
from fleet.shm.inlet import Inlet, InletError, decode

#: The ring header's words (native/fleet_native.c, struct ring_hdr), and where its data starts.
HEAD, TAIL, DATA = 0, 64, 256
CAP = 1 << 16


@pytest.fixture
def pair():
    """fleetd's side and a client's side of one inlet."""
    fleetd = Inlet.make(CAP)
    client = Inlet.open(os.dup(fleetd.fd), CAP)
    yield fleetd, client
    client.close()
    fleetd.close()


def words(inlet) -> tuple[int, int]:
    return struct.unpack_from("<Q", inlet._mm, HEAD)[0], struct.unpack_from("<Q", inlet._mm, TAIL)[0]


def test_a_batch_pushed_is_taken_whole(pair):
    fleetd, client = pair
    assert client.push(7, "tok-12345678", 3, True, False, [(1, "sq", b"\x80\x05K\x02."), (2, "echo", b"")])
    assert client.push(8, "tok-12345678", None, False, True, [(3, "sq", b"x" * 1000)])
    got = fleetd.take()
    assert [tag for tag, _ in got] == [inlet_mod.BATCH, inlet_mod.BATCH]
    assert decode(got[0][1]) == (7, "tok-12345678", 3, True, False, [(1, "sq", b"\x80\x05K\x02."), (2, "echo", b"")])
    assert decode(got[1][1]) == (8, "tok-12345678", None, False, True, [(3, "sq", b"x" * 1000)])
    assert fleetd.take() == []


def test_the_memfd_cannot_change_size_under_the_loop(pair):
    fleetd, _client = pair
    fd = os.dup(fleetd.fd)  # what a client holds
    try:
        for size in (0, inlet_mod.size_for(CAP) * 2):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, size)
    finally:
        os.close(fd)


def test_an_inlet_of_another_size_is_refused(pair):
    fleetd, _client = pair
    with pytest.raises(InletError, match="capacity"):
        Inlet.open(os.dup(fleetd.fd), CAP * 2)


def _set(inlet, offset: int, value: int) -> None:
    struct.pack_into("<Q", inlet._mm, offset, value % (1 << 64))


@pytest.mark.parametrize("harm", ["head far ahead", "head behind tail", "tail not aligned", "length past max",
                                  "length that pads to 0", "frame past the end", "wrap with nothing after"])
def test_words_a_client_wrote_never_take_a_read_outside_the_ring(pair, harm):
    fleetd, client = pair
    assert client.push(1, "tok-12345678", None, False, False, [(1, "sq", b"ok")])
    head, tail = words(fleetd)
    if harm == "head far ahead":
        _set(fleetd, HEAD, tail + CAP * 4)
    elif harm == "head behind tail":
        _set(fleetd, HEAD, tail - 8)
    elif harm == "tail not aligned":
        _set(fleetd, TAIL, tail + 3)
    elif harm == "length past max":
        struct.pack_into("<I", fleetd._mm, DATA, CAP)  # the frame says a message larger than ever fits
    elif harm == "length that pads to 0":  # rounded up to 8 in 32 bits, it would be 0 bytes
        struct.pack_into("<I", fleetd._mm, DATA, 0xFFFFFFF9)
    elif harm == "frame past the end":
        # the frame at the ring's last 16 bytes says 64: it would run past the data area
        # (head just past it: that frame alone is published)
        _set(fleetd, TAIL, CAP - 16)
        _set(fleetd, HEAD, CAP - 16 + 8 + 64)
        struct.pack_into("<II", fleetd._mm, DATA + CAP - 16, 64, inlet_mod.BATCH)
    else:  # a wrap marker, and head published it alone (head is short of the ring's end)
        _set(fleetd, TAIL, CAP - 16)
        _set(fleetd, HEAD, CAP - 8)
        struct.pack_into("<II", fleetd._mm, DATA + CAP - 16, 0xFFFFFFFF, 0)
    before = words(fleetd)
    with pytest.raises(InletError, match="corrupt"):
        fleetd.take()
    assert words(fleetd) == before  # nothing taken: the inlet is closed as it is


def test_a_frame_checked_right_at_the_end_is_still_taken(pair):
    """The checks refuse what passes the ring's end, not what ends on it."""
    fleetd, _client = pair
    _set(fleetd, TAIL, CAP - 16)
    _set(fleetd, HEAD, CAP)
    struct.pack_into("<II", fleetd._mm, DATA + CAP - 16, 8, 5)
    fleetd._mm[DATA + CAP - 8:DATA + CAP] = b"12345678"
    got = fleetd.take()
    assert [(tag, bytes(view)) for tag, view in got] == [(5, b"12345678")]
    assert words(fleetd) == (CAP, CAP)


def _message(units=((1, b"sq", b"pay"),), token=b"tok-12345678", n=None, tail=b"") -> bytes:
    head = struct.pack("<QqBBI", 9, -1, 0, len(token), len(units) if n is None else n) + token
    body = b"".join(struct.pack("<QHI", seq, len(role), len(payload)) + role + payload
                    for seq, role, payload in units)
    return head + body + tail


@pytest.mark.parametrize("data, says", [
    (b"\x00" * 10, "shorter than its head"),
    (struct.pack("<QqBBI", 9, -1, 0, 200, 0) + b"tok", "ends inside its token"),
    (_message(n=2), "unit 1 of 2: the message ends at its head"),
    (_message(units=((1, b"sq", b"pay"),))[:-1], "pass the message's end"),
    (_message(tail=b"xx"), "2 bytes after the 1 units"),
    (_message(units=((1, b"\xff\xfe", b""),)), "its role is not UTF-8"),
    (_message(token=b"tok-\xff2345678"), "token is not ASCII"),
])
def test_a_message_that_does_not_parse_says_what_is_wrong(data, says):
    with pytest.raises(InletError, match=says):
        decode(memoryview(data))


def test_a_message_parses_to_what_was_pushed():
    assert decode(memoryview(_message(units=((5, b"r\xc3\xa9", b"\x00\x01"),)))) == (
        9, "tok-12345678", None, False, False, [(5, "ré", b"\x00\x01")])
