"""fleet._rings: the rings' non-blocking calls, made with the GIL held, over the same
ring code as fleet._native. Round trips against the cffi side (one implementation,
two ways to call it), and bad arguments refused with nothing changed."""
from __future__ import annotations

import errno
import threading
import time

import pytest

from fleet import _rings
from fleet._native import ffi, lib
from fleet.shm.dataplane import MessageTooLarge, Pulse

from ..shm.test_dataplane import anon_ring, returned


@pytest.fixture
def ring():
    r = anon_ring()  # the Ring pins its mapping while it lives
    return r, r._p, r._a


def test_what_one_side_pushes_the_other_pops(ring):
    r, base, addr = ring
    assert _rings.push_many(addr, 7, [b"a", b"bb", b""], False) == 3
    assert _rings.used(addr) == int(lib.fleet_ring_used(base)) > 0
    tag, n = ffi.new("uint32_t *"), ffi.new("uint32_t *")
    out = ffi.new("char[]", 16)
    assert lib.fleet_ring_pop(base, tag, out, 16, n) == 1 and tag[0] == 7 and ffi.unpack(out, 1) == b"a"
    assert lib.fleet_ring_push(base, 9, b"xyz", 3) == 0
    assert [(t, bytes(v)) for t, v in _rings.pop_many(addr, 1 << 16, 64)] == [(7, b"bb"), (7, b""), (9, b"xyz")]
    assert _rings.used(addr) == 0 and _rings.pop_many(addr, 1 << 16, 64) == []


def test_push_many_joins_a_pair_as_it_copies(ring):
    r, _base, addr = ring
    assert _rings.push_many(addr, 5, [(b"head:", b"body"), b"plain", (b"", b""), (b"h", b"")], True) == 4
    assert [(t, bytes(v)) for t, v in r.pop_many()] == [(5, b"head:body"), (5, b"plain"), (5, b""), (5, b"h")]


def test_pop_many_views_share_one_buffer_and_outlive_later_calls(ring):
    r, _base, addr = ring
    r.push_many(1, [b"first", b"second"])
    (_, a), (_, b) = _rings.pop_many(addr, 1 << 16, 8)
    assert isinstance(a, memoryview) and a.obj is b.obj
    r.push_many(2, [b"later"])
    assert [bytes(v) for _, v in r.pop_many()] == [b"later"]
    assert (bytes(a), bytes(b)) == (b"first", b"second")


def test_push_many_stops_at_the_first_message_that_does_not_fit(ring):
    r, _base, addr = ring
    big = b"x" * (r.max_message // 2)
    pushed = _rings.push_many(addr, 3, [big] * 8, True)
    assert 0 < pushed < 8
    assert len(r.pop_many(max_bytes=1 << 20)) == pushed
    # one that can never fit stops the run too: push is the call that names it
    assert _rings.push_many(addr, 3, [b"ok", b"y" * (r.max_message + 1), b"never"], True) == 1
    with pytest.raises(MessageTooLarge):
        r.push(3, b"y" * (r.max_message + 1))


def test_push_reports_no_room_and_too_large(ring):
    r, _base, addr = ring
    assert _rings.push(addr, 1, b"head", bytearray(b"body")) == 0
    assert bytes(r.pop_many()[0][1]) == b"headbody"
    assert _rings.push(addr, 1, b"z" * (r.max_message + 1), b"") == -errno.EMSGSIZE
    while _rings.push(addr, 1, b"f" * 512, b"") == 0:
        pass
    assert _rings.push(addr, 1, b"f" * 512, b"") == -errno.EAGAIN


@pytest.mark.parametrize("call, args, error", [
    ("push_many", (1, [b"ok", "not bytes"], True), TypeError),
    ("push_many", (1, (b"a tuple",), True), TypeError),
    ("push_many", (1, [b"ok", (b"head", "not bytes")], True), TypeError),
    ("push_many", (1, [(b"one", b"two", b"three")], True), TypeError),
    ("push_many", (2**32, [b"tag too big"], True), OverflowError),
    ("push", (1, "str", b""), TypeError),
    ("pop_many", (-1, 8), ValueError),
    ("pop_many", (1024, 0), ValueError),
])
def test_bad_arguments_are_refused_and_change_nothing(ring, call, args, error):
    r, _base, addr = ring
    r.push_many(5, [b"kept"])
    used = _rings.used(addr)
    with pytest.raises(error):
        getattr(_rings, call)(addr, *args)
    assert _rings.used(addr) == used
    assert [bytes(v) for _, v in r.pop_many()] == [b"kept"]


@pytest.mark.parametrize("address", ["0x10", 1.5, None, 0])
def test_an_address_must_be_a_nonzero_int(address):
    with pytest.raises((TypeError, ValueError)):
        _rings.used(address)
    with pytest.raises((TypeError, ValueError)):
        _rings.bell_ring(address, address)


def test_wrong_argument_counts_are_refused():
    with pytest.raises(TypeError, match="takes 3 arguments"):
        _rings.pop_many(1)
    with pytest.raises(TypeError, match="takes 4 arguments"):
        _rings.push_many(1, 2, [])


def test_bell_ring_bumps_the_bell_and_wakes_only_a_sleeper():
    words = ffi.new("uint32_t[2]")
    bell, waiting = int(ffi.cast("uintptr_t", words)), int(ffi.cast("uintptr_t", words + 1))
    assert _rings.bell_ring(bell, waiting) is False and words[0] == 1
    words[1] = 1  # a waiter announced its sleep: the ring wakes it
    assert _rings.bell_ring(bell, waiting) is True and words[0] == 2
    # ... and leaves its flag to it (see the wakers below): a second ring wakes it too
    assert words[1] == 1 and _rings.bell_ring(bell, waiting) is True and words[0] == 3


# --- wakers leave the sleeper's flag alone ------------------------------------------------
# A waiter sets its flag, sleeps, and clears the flag once awake; a waker that sees the
# flag wakes it. Were a waker to clear the flag, one that read it during one sleep and
# ran on after the waiter had woken and gone back to sleep would clear the flag of that
# next sleep: every later waker would see nobody asleep, and the waiter (a worker with
# a unit on its ring) would sleep for good. These pin the rule: only the waiter clears.
CONSUMER_WAITING, PRODUCER_WAITING, SPACE_SEQ = 132, 196, 192  # byte offsets in the ring header


def _word(base, offset):
    return ffi.cast("uint32_t *", ffi.cast("char *", base) + offset)


def test_a_notify_wakes_a_sleeping_consumer_and_leaves_its_flag(ring):
    r, base, addr = ring
    flag = _word(base, CONSUMER_WAITING)
    flag[0] = 1
    assert _rings.notify(addr) is True and flag[0] == 1
    assert r.notify() is True and flag[0] == 1  # every notify while it sleeps wakes it
    assert _rings.push_many(addr, 1, [b"x"], True) == 1 and flag[0] == 1
    flag[0] = 0  # awake: it cleared its own flag
    assert r.notify() is False


def test_a_pop_wakes_a_producer_waiting_for_room_and_leaves_its_flag(ring):
    r, base, addr = ring
    flag, seq = _word(base, PRODUCER_WAITING), _word(base, SPACE_SEQ)
    r.push_many(1, [b"a", b"b"])
    flag[0] = 1
    before = seq[0]
    assert len(r.pop_many(max_msgs=1)) == 1
    assert seq[0] == before + 1 and flag[0] == 1
    assert len(r.pop_many(max_msgs=1)) == 1
    assert seq[0] == before + 2 and flag[0] == 1


def test_a_consumer_woken_by_notify_sleeps_again_and_is_woken_again(ring):
    """The full cycle, with real sleeps: every push after a wake-up reaches the consumer."""
    r, _base, _addr = ring
    got, stop = [], threading.Event()

    def consume():
        while not stop.is_set():
            if not r.wait(5.0):
                return  # a wake-up was lost: the test below sees the missing messages
            got.extend(bytes(v) for _t, v in r.pop_many())

    t = threading.Thread(target=consume)
    t.start()
    try:
        for i in range(200):
            time.sleep(0.0005 if i % 2 else 0)  # sometimes asleep, sometimes still looking
            r.push_many(1, [str(i).encode()])
            deadline = time.monotonic() + 5
            while len(got) <= i and time.monotonic() < deadline:
                time.sleep(0.0001)
            assert len(got) == i + 1, f"message {i} never reached the consumer"
    finally:
        stop.set()
        r.notify()
        t.join(10)
    assert got == [str(i).encode() for i in range(200)]


def test_notify_and_seq(ring):
    _r, base, addr = ring
    seen = _rings.seq(addr)
    assert _rings.notify(addr) is False  # nobody waits
    assert _rings.seq(addr) == (seen + 1) & 0xFFFFFFFF == int(lib.fleet_ring_seq(base))


# --- looking before sleeping -------------------------------------------------------------
def _later(seconds, fn):
    t = threading.Timer(seconds, fn)
    t.start()
    return t


def test_a_pulse_counts_bumps_and_a_watch_ends_on_one():
    pulse = Pulse()
    seen = pulse.value
    assert pulse.watch(seen, 0.001) is False  # nothing came: the watch runs out
    pulse.bump()
    assert pulse.value == (seen + 1) & 0xFFFFFFFF
    assert pulse.watch(seen, 30.0) is True  # changed already: at once
    seen = pulse.value
    timer = _later(0.02, pulse.bump)
    assert returned(pulse.watch, seen, 3600.0) is True  # the bump ended an hour's watch
    timer.join()


def test_a_ring_wait_with_a_spin_takes_a_message_pushed_meanwhile(ring):
    r, _base, _addr = ring
    timer = _later(0.02, lambda: r.push_many(3, [b"x"]))
    assert r.wait(30.0, spin_s=30.0) is True
    assert [(t, bytes(v)) for t, v in r.pop_many()] == [(3, b"x")]
    timer.join()


def test_a_ring_wait_spin_is_part_of_its_timeout(ring):
    r, _base, _addr = ring
    assert returned(r.wait, 0.05, 3600.0) is False  # an hour's spin inside a 50 ms wait: the wait's end ends it
