"""The data plane: SPSC byte rings and the doorbell in shared memory, between real
processes. Single-process tests pin the framing (wrap-around, full ring, batches)
against a model; multi-process tests pin the wake-ups (no lost wake-up, no busy
waiting) and the segment's lifecycle (stale reclaim, typed errors, cleanup)."""
from __future__ import annotations

import faulthandler
import mmap
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
import zlib
from collections import deque

import numpy as np
import posix_ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.shm import dataplane as dp
from fleet._native import ffi, lib
from fleet.shm.dataplane import DataSegment, MessageTooLarge, Ring
from fleet.rules.names import InvalidFleetName
from tests.wakeups import switches_by_thread, woken

COMPLETION_BOUND_S = 120.0  # generous: a lost wake-up hangs forever, a slow CI box does not


# -- helpers -----------------------------------------------------------------------
def anon_ring(capacity=4096):
    """A ring in an anonymous shared mapping (no segment name to clean up)."""
    mm = mmap.mmap(-1, lib.fleet_ring_bytes(capacity), mmap.MAP_SHARED)
    base = ffi.from_buffer(mm)
    assert lib.fleet_ring_init(base, capacity) == 0
    return Ring(base, base, "test ring")


def payload(i, size):
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


def pad8(n):
    return (n + 7) & ~7


class RingModel:
    """Byte accounting of the ring, from its documented framing: 8-byte frame + payload
    padded to 8; a message that would straddle the end skips to offset 0, and so does
    one pushed into an empty ring from offset min(64 KiB, capacity / 4) on, when it
    fits before that offset (early wrap)."""

    def __init__(self, capacity):
        self.cap, self.head, self.tail, self.q = capacity, 0, 0, deque()

    def push(self, tag, data):
        need = 8 + pad8(len(data))
        pos = self.head % self.cap
        to_end = self.cap - pos
        if pos >= min(64 * 1024, self.cap // 4) and self.head == self.tail and need <= pos:
            total = to_end + need
        else:
            total = need if need <= to_end else to_end + need
        if self.head - self.tail + total > self.cap:
            return False
        self.head += total
        self.q.append((tag, data, total))
        return True

    def pop(self):
        tag, data, total = self.q.popleft()
        self.tail += total
        return tag, data

    @property
    def used(self):
        return self.head - self.tail


def _fork(fn, *args):
    """Run fn(*args) in a forked child; its return value (or 1 on exception) is the exit code."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            # A child that hangs shows where: `_wait_all` asks for every thread's stack.
            faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
            code = fn(*args) or 0
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    return pid


def _wait_all(pids, timeout_s=COMPLETION_BOUND_S, state=lambda: ""):
    """Exit codes of every pid; kills the lot and fails the test if they do not finish in
    time, saying where each one was (its scheduler state, kernel wait channel and cgroup;
    its Python stack on stderr, from `_fork`'s handler) and ``state()``, the test's own."""
    deadline = time.monotonic() + timeout_s
    codes = {}
    while len(codes) < len(pids) and time.monotonic() < deadline:
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    if len(codes) < len(pids):
        stuck = sorted(set(pids) - set(codes))
        where = {pid: _where(pid) for pid in stuck}
        for pid in stuck:
            os.kill(pid, signal.SIGUSR1)  # its stack to stderr (captured with the test's output)
        time.sleep(0.5)
        for pid in stuck:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        pytest.fail(f"processes {stuck} did not finish in {timeout_s} s (lost wake-up?): {where}; "
                    f"load {os.getloadavg()}; {state()}")
    return [codes[p] for p in pids]


def _where(pid: int) -> dict:
    """A live process's scheduler state, kernel wait channel and cgroups, from /proc."""
    out = {}
    for key, path in (("stat", f"/proc/{pid}/stat"), ("wchan", f"/proc/{pid}/wchan"),
                      ("cgroup", f"/proc/{pid}/cgroup")):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError as exc:
            text = f"unreadable: {exc}"
        out[key] = text.rsplit(")", 1)[-1].split()[0] if key == "stat" and ")" in text else text
    return out


def _shared_counters(n):
    """uint64 counters in an anonymous shared mapping, inherited by forked children."""
    mm = mmap.mmap(-1, 8 * n, mmap.MAP_SHARED)
    return np.frombuffer(mm, dtype=np.uint64)


# -- the C ring's contract -----------------------------------------------------------
@pytest.mark.parametrize("capacity", [0, 2048, 4095, 4097, 6144, 1 << 32])
def test_init_refuses_a_bad_capacity(capacity):
    mm = mmap.mmap(-1, 1 << 16, mmap.MAP_SHARED)
    assert lib.fleet_ring_init(ffi.from_buffer(mm), capacity) == -22  # -EINVAL


def test_init_refuses_a_misaligned_ring_and_check_refuses_garbage():
    mm = mmap.mmap(-1, 1 << 16, mmap.MAP_SHARED)
    base = ffi.from_buffer(mm)
    assert lib.fleet_ring_init(base + 8, 4096) == -22
    assert lib.fleet_ring_check(base) == -22  # zeros: no magic
    with pytest.raises(dp.DataSegmentCorrupt, match="not an initialised ring"):
        Ring(base, base)
    assert lib.fleet_ring_init(base, 4096) == 0 and lib.fleet_ring_check(base) == 0
    assert lib.fleet_ring_bytes(4096) == 256 + 4096


def test_round_trip_keeps_tags_bytes_and_order():
    r = anon_ring()
    msgs = [(0, b""), (1, b"x"), (0xFFFFFFFF, b"hello world"), (7, bytes(range(256)))]
    for tag, data in msgs:
        assert r.push(tag, data)
    assert r.push(8, bytearray(b"from a bytearray")) and r.push(9, memoryview(b"from a view"))
    assert r.push2(10, b"head|", bytearray(b"body"))
    got = [r.pop() for _ in range(7)]
    assert got == msgs + [(8, b"from a bytearray"), (9, b"from a view"), (10, b"head|body")]
    assert r.pop() is None and r.used == 0


def test_full_ring_refuses_then_takes_after_a_pop():
    r = anon_ring(4096)
    n = 0
    while r.push(n, payload(n, 100)):
        n += 1
    assert n == 4096 // (8 + 104)  # every byte accounted for: frame + padded payload
    assert r.used == n * 112
    assert not r.wait_space(100, 0.001)  # still full: times out
    assert r.pop() == (0, payload(0, 100))
    assert r.wait_space(100, 0) and r.push(n, payload(n, 100))
    assert [r.pop()[0] for _ in range(n)] == list(range(1, n + 1))


def test_push_many_pushes_in_order_until_one_does_not_fit():
    r = anon_ring(4096)
    msgs = [payload(i, 100) for i in range(50)]  # 36 fit (frame + padded payload: 112 bytes each)
    assert r.push_many(5, []) == 0
    pushed = r.push_many(5, msgs[:3])
    assert pushed == 3 and [r.pop() for _ in range(3)] == [(5, m) for m in msgs[:3]]
    r = anon_ring(4096)
    pushed = r.push_many(6, msgs)
    assert pushed == 4096 // 112 and r.used == pushed * 112
    assert [r.pop() for _ in range(pushed)] == [(6, m) for m in msgs[:pushed]]
    assert r.pop() is None
    # The rest is the caller's to retry: in order, after the ring made room.
    assert r.push_many(6, msgs[pushed:]) == len(msgs) - pushed
    assert [r.pop()[1] for _ in range(len(msgs) - pushed)] == msgs[pushed:]


def test_push_many_stops_before_a_message_that_can_never_fit():
    r = anon_ring(4096)
    big = bytes(r.max_message + 1)
    assert r.push_many(1, [b"a", big, b"b"]) == 1  # "b" is not pushed past the one that cannot fit
    assert r.pop() == (1, b"a") and r.pop() is None
    with pytest.raises(MessageTooLarge):
        r.push(1, big)  # and push names it


def test_push_many_wakes_a_sleeping_consumer_once(fleet_name, reaper):
    seg = DataSegment.create(fleet_name, 1, 4096, 4096)
    ring = seg.tasks(0)

    def consumer():
        r = DataSegment.attach(fleet_name).tasks(0)
        got = []
        while len(got) < 3:
            batch = r.pop_many()
            if not batch:
                r.wait(None)
            got += [(tag, bytes(view)) for tag, view in batch]
        return 0 if got == [(4, b"x"), (4, b"y"), (4, b"z")] else 3

    pid = _fork(consumer)
    reaper.append(pid)
    deadline = time.monotonic() + 30
    hdr = ffi.cast("uint32_t *", ring._p)
    while lib.fleet_load_acquire_u32(hdr + 33) == 0 and time.monotonic() < deadline:  # consumer_waiting
        time.sleep(0.005)
    assert ring.push_many(4, [b"x", b"y", b"z"]) == 3  # no notify() after it: push_many woke it
    assert _wait_all([pid]) == [0]


def test_message_too_large_names_size_and_limit():
    r = anon_ring(4096)
    assert r.max_message == 4096 // 2 - 16
    assert r.push(1, bytes(r.max_message))  # the limit itself fits
    with pytest.raises(MessageTooLarge, match=rf"{r.max_message + 1} bytes.*limit {r.max_message}") as exc:
        r.push(1, bytes(r.max_message + 1))
    assert exc.value.size == r.max_message + 1 and exc.value.limit == r.max_message
    with pytest.raises(MessageTooLarge):
        r.push2(1, bytes(1000), bytes(1100))
    with pytest.raises(MessageTooLarge):
        r.wait_space(5000, 0)
    assert isinstance(exc.value, dp.FleetError)


def test_limit_sized_message_fits_an_empty_ring_at_every_offset():
    # The cap/2 rule exists so that an empty ring always accepts: check it at every
    # 8-byte offset, where the largest message forces a wrap.
    r = anon_ring(4096)
    for offset in range(0, 4096, 8):
        assert r.used == 0
        assert r.push(offset, bytes(r.max_message)), f"refused at offset {offset}"
        assert r.pop() == (offset, bytes(r.max_message))
        r.push(0, b"") and r.pop()  # advance the indices by one 8-byte frame


def test_pop_grows_its_buffer_for_a_big_message():
    r = anon_ring(1 << 18)
    big = payload(3, 100_000)  # larger than pop's initial 64 KiB scratch
    assert r.push(5, b"small") and r.push(6, big) and r.push(7, b"after")
    assert [r.pop() for _ in range(3)] == [(5, b"small"), (6, big), (7, b"after")]


def test_pop_many_drains_a_batch_into_one_buffer():
    r = anon_ring(1 << 16)
    sizes = [0, 1, 7, 8, 9, 100, 333]
    for i, n in enumerate(sizes):
        assert r.push(i, payload(i, n))
    batch = r.pop_many()
    assert [(t, bytes(v)) for t, v in batch] == [(i, payload(i, n)) for i, n in enumerate(sizes)]
    assert len({id(v.obj) for _, v in batch}) == 1  # one bytearray for the whole batch
    assert r.pop_many() == [] and r.used == 0


def test_pop_many_respects_max_bytes_and_max_msgs():
    r = anon_ring(1 << 16)
    for i in range(10):
        r.push(i, payload(i, 100))
    assert [t for t, _ in r.pop_many(max_bytes=350)] == [0, 1, 2]  # 104 + 104 + 100 <= 350
    assert [t for t, _ in r.pop_many(max_msgs=4)] == [3, 4, 5, 6]
    r.push(10, payload(10, 5000))
    assert [t for t, _ in r.pop_many(max_bytes=1000)] == [7, 8, 9]  # the big one waits: it did not fit with them
    (t, v), = r.pop_many(max_bytes=64)  # alone, it is returned even though larger than max_bytes
    assert t == 10 and bytes(v) == payload(10, 5000)


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 4096 // 2 - 16)),
        st.tuples(st.just("push"), st.integers(0, 64)),
        st.tuples(st.just("pop"), st.just(0)),
        st.tuples(st.just("pop_many"), st.integers(0, 3000)),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_random_sizes_and_wrap_around_match_a_model(ops):
    r = anon_ring(4096)
    model = RingModel(4096)
    counter = 0
    for op, n in ops:
        if op == "push":
            counter += 1
            data = payload(counter, n)
            if counter % 2:
                assert r.push(counter, data) == model.push(counter, data)
            else:
                assert r.push2(counter, data[:3], data[3:]) == model.push(counter, data)
        elif op == "pop":
            assert r.pop() == (model.pop() if model.q else None)
        else:
            got = [(t, bytes(v)) for t, v in r.pop_many(max_bytes=n)]
            want, room = [], n
            while model.q and (not want or len(model.q[0][1]) <= room):
                tag, data = model.pop()
                want.append((tag, data))
                room -= pad8(len(data))
            assert got == want
        assert r.used == model.used
    while model.q:
        assert r.pop() == model.pop()
    assert r.pop() is None


def test_a_ring_uses_the_pages_of_its_backlog_not_of_its_capacity():
    """Early wrap: a consumer that keeps up keeps its producer within the ring's first
    64 KiB, and a backlog of B bytes uses about B more. Counted as the pages of a memfd's
    (tmpfs) file, allocated as they are first written: without early wrap, every byte
    that crosses a ring touches a page until the whole capacity is held."""
    cap = 8 << 20
    size = lib.fleet_ring_bytes(cap)
    fd = os.memfd_create("fleet-test-ring-pages")
    try:
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size)
        base = ffi.from_buffer(mm)
        try:
            assert lib.fleet_ring_init(base, cap) == 0
            r = Ring(base, base, "paged ring")

            def held() -> int:
                return os.fstat(fd).st_blocks * 512

            msg = bytes(range(250)) * 4
            for i in range(4096):  # 4 MiB through a ring its consumer keeps empty
                assert r.push(i, msg)
                assert r.pop() == (i, msg)
            assert held() <= 64 * 1024 + 2 * mmap.PAGESIZE, held()
            for _ in range(8):  # 512 KiB at a time, then all of it taken
                for i in range(512):
                    assert r.push(i, msg)
                taken = 0
                while batch := r.pop_many(max_bytes=1 << 20, max_msgs=4096):
                    taken += len(batch)
                assert taken == 512
            assert 512 * 1024 <= held() <= 512 * 1024 + 64 * 1024 + 2 * mmap.PAGESIZE, held()
            del r
        finally:
            ffi.release(base)
            mm.close()
    finally:
        os.close(fd)


# -- wake-ups between processes ---------------------------------------------------------
def test_notify_wakes_only_a_sleeping_consumer(fleet_name, reaper):
    seg = DataSegment.create(fleet_name, 1, 4096, 4096)
    ring = seg.tasks(0)
    ring.push(1, b"a")
    assert ring.notify() is False  # nobody waits: no syscall
    assert ring.pop() == (1, b"a")

    def consumer():
        r = DataSegment.attach(fleet_name).tasks(0)
        while (m := r.pop()) is None:
            r.wait(None)
        return 0 if m == (2, b"wake") else 3

    pid = _fork(consumer)
    reaper.append(pid)
    woke = False
    deadline = time.monotonic() + 30
    # The consumer sleeps at some point after fork; wait until it announced it.
    hdr = ffi.cast("uint32_t *", ring._p)  # consumer_waiting: word 33 (line 2, after data_seq)
    while lib.fleet_load_acquire_u32(hdr + 33) == 0 and time.monotonic() < deadline:  # consumer_waiting
        time.sleep(0.005)
    ring.push(2, b"wake")
    woke = ring.notify()
    assert _wait_all([pid]) == [0]
    assert woke is True


def _stress_producer(name, n, stats, block):
    ring = DataSegment.attach(name).tasks(0)
    for seq in range(n):
        body = block[seq % 997 : seq % 997 + (seq * 7919) % 301]
        head = struct.pack("<QI", seq, zlib.crc32(body))
        tag = seq & 0xFFFFFFFF
        while not (ring.push2(tag, head, body) if seq % 2 else ring.push(tag, head + body)):
            stats[0] += 1  # ring full: sleep until the consumer makes room
            ring.notify()
            ring.wait_space(len(head) + len(body), None)
        if seq % 8 == 7 or seq == n - 1:
            stats[1] += ring.notify()
        if seq % (n // 10) == n // 20:
            # Let the consumer drain and fall asleep, so the next notify must wake it.
            # (Half a period off the consumer's pauses, so the two never wait on each other.)
            # Wait for the ring to be empty, not for the consumer to count one more empty
            # look: it may have drained and counted before this pause began, and then it
            # sleeps with nothing to read, rightly woken by no notify (both waited for ever,
            # the ring holding 0 bytes: a hang of this test, not a lost wake-up).
            ring.notify()
            while ring.used:
                time.sleep(0.001)
            time.sleep(0.02)
    return 0


def _stress_consumer(name, n, stats, block):
    ring = DataSegment.attach(name).tasks(0)
    expect = 0
    pauses = 0
    while expect < n:
        batch = ring.pop_many(max_bytes=2048) if expect % 3 else [m for m in [ring.pop()] if m]
        if not batch:
            stats[2] += 1  # empty: about to sleep
            ring.wait(None)
            continue
        for tag, msg in batch:
            seq, crc = struct.unpack_from("<QI", msg)
            body = bytes(msg[12:])
            want = block[seq % 997 : seq % 997 + (seq * 7919) % 301]
            if seq != expect or tag != seq & 0xFFFFFFFF:
                print(f"order: got seq {seq} tag {tag}, expected {expect}", file=sys.stderr)
                return 4
            if crc != zlib.crc32(body) or body != want:
                print(f"content of seq {seq} is corrupt", file=sys.stderr)
                return 5
            expect += 1
        if expect >= (pauses + 1) * (n // 10) and pauses < 9:
            # Stop reading until the producer hits a full ring, so its wait must be woken.
            # (It may already be asleep on a full ring: then `used` says so.)
            pauses += 1
            seen = int(stats[0])
            while int(stats[0]) == seen and ring.used < ring.capacity // 2:
                time.sleep(0.001)
            time.sleep(0.02)
    return 0


def test_two_process_stress_no_loss_no_lost_wakeup(fleet_name, reaper):
    n = 200_000
    seg = DataSegment.create(fleet_name, 1, 4096, 4096)  # small: it wraps and fills constantly
    stats = _shared_counters(3)  # [producer found it full, notifies that woke, consumer found it empty]
    block = os.urandom(1400)
    pids = [_fork(_stress_consumer, fleet_name, n, stats, block), _fork(_stress_producer, fleet_name, n, stats, block)]
    reaper.extend(pids)
    ring = seg.tasks(0)
    assert _wait_all(pids, state=lambda: f"full {stats[0]}, woke {stats[1]}, empty {stats[2]}, ring holds "
                                         f"{ring.used} of {ring.capacity} bytes") == [0, 0]
    assert stats[0] > 0, "the producer never found the ring full"
    assert stats[1] > 0, "no notify ever woke a sleeping consumer"
    assert stats[2] > 0, "the consumer never found the ring empty"
    assert seg.tasks(0).used == 0


def _bell_worker(name, seat, n):
    seg = DataSegment.attach(name)
    ring, bell = seg.results(seat), seg.bell
    for i in range(n):
        data = struct.pack("<II", seat, i)
        while not ring.push(i, data):
            bell.ring()
            ring.wait_space(len(data), None)
        if i % 16 == 15 or i == n - 1:
            bell.ring()
    return 0


def _bell_supervisor(name, n_seats, n):
    seg = DataSegment.attach(name)
    rings, bell = [seg.results(s) for s in range(n_seats)], seg.bell
    nxt = [0] * n_seats
    while min(nxt) < n:
        seen = bell.value
        found = False
        for s, r in enumerate(rings):
            for tag, msg in r.pop_many():
                found = True
                if struct.unpack("<II", msg) != (s, nxt[s]) or tag != nxt[s]:
                    return 4
                nxt[s] += 1
        if not found:
            bell.wait(seen, None)
    return 0


def test_one_bell_wakes_the_supervisor_for_many_workers(fleet_name, reaper):
    n_seats, n = 3, 20_000
    DataSegment.create(fleet_name, n_seats, 4096, 4096)
    pids = [_fork(_bell_supervisor, fleet_name, n_seats, n)]
    pids += [_fork(_bell_worker, fleet_name, s, n) for s in range(n_seats)]
    reaper.extend(pids)
    assert _wait_all(pids) == [0] * (n_seats + 1)


def test_bell_wait_returns_at_once_when_it_already_rang_and_times_out_otherwise(fleet_name):
    seg = DataSegment.create(fleet_name, 1, 4096, 4096)
    bell = seg.bell
    seen = bell.value
    assert bell.ring() is False  # nobody waits
    assert bell.value == seen + 1
    assert bell.wait(seen, None) is True  # rang since `seen`: no sleep, even forever
    assert bell.wait(seen + 1, 0.01) is False


def returned(fn, *args, deadline_s: float = COMPLETION_BOUND_S):
    """What ``fn(*args)`` returned, called on a thread of its own (a wait in C lets go of
    the GIL); fails the test if it has not returned by the deadline. With an hour's spin
    in the arguments, returning at all shows what ended the wait."""
    box = []
    thread = threading.Thread(target=lambda: box.append(fn(*args)), daemon=True)
    thread.start()
    thread.join(deadline_s)
    if not box:
        pytest.fail(f"{getattr(fn, '__qualname__', fn)}{args} still waiting after {deadline_s} s")
    return box[0]


def test_a_spinning_bell_wait_catches_a_ring_awake_and_never_outlasts_its_timeout(fleet_name, reaper):
    seg = DataSegment.create(fleet_name, 1, 4096, 4096)
    bell = seg.bell
    seen = bell.value
    assert returned(bell.wait, seen, 0.02, 3600.0) is False  # an hour's spin inside a 20 ms wait: it ends
    bell.ring()
    assert bell.wait(seen, None, spin_s=0.001) is True  # rang already: at once

    def ringer():
        time.sleep(0.05)
        DataSegment.attach(fleet_name).bell.ring()
        return 0

    seen = bell.value
    pid = _fork(ringer)
    reaper.append(pid)
    assert returned(bell.wait, seen, None, 3600.0) is True  # rung while it spun an hour: it returns then
    assert _wait_all([pid]) == [0]
    seen = bell.value
    pid = _fork(ringer)  # and rung after the spin: the sleep that follows wakes
    reaper.append(pid)
    assert bell.wait(seen, 30, spin_s=0.001) is True
    assert _wait_all([pid]) == [0]


def test_a_consumers_looks_for_a_message_are_counted_on_cpu_and_off_it(reaper):
    """`Ring.looked`: what the consumer's looks (`wait` with `spin_s`) took, on CPU, off it
    in short yields and off it in yields that lost the CPU for a slice (beside a busy
    process); the contention watch keeps only the last."""
    ring = anon_ring()
    assert ring.looked() == (0, 0, 0)
    assert ring.wait(0.5, spin_s=0.05) is False  # a 50 ms look, then a sleep to the timeout
    counts = ring.looked()
    assert 0.05e9 <= sum(counts) <= 0.3e9  # the look only, not the sleep after it
    assert ring.wait(0.02) is False and ring.looked() == counts  # no look, nothing counted

    def pusher():
        time.sleep(0.02)
        ring.push(1, b"go")
        ring.notify()

    thread = threading.Thread(target=pusher)
    thread.start()
    assert ring.wait(30, spin_s=30.0) is True  # a message ends the look (and is counted)
    thread.join()
    assert sum(ring.looked()) > sum(counts)
    assert ring.pop() == (1, b"go")

    def look_on_one_cpu(look_s, beside=None, fifo=False):
        """A look of `look_s` on one CPU, with `beside` (code) running in a process on it
        (which ends itself within 20 s, and with this one). `fifo`: this thread SCHED_FIFO
        for the look, so no task of the machine's other work runs on that CPU meanwhile."""
        before = ring.looked()
        cpu, mine = min(os.sched_getaffinity(0)), os.sched_getaffinity(0)
        other = None
        if beside is not None:
            guard = ("import ctypes, sys, time\nctypes.CDLL(None).prctl(1, 9)\nend = time.monotonic() + 20\n"
                     "sys.stdout.write('ready\\n')\nsys.stdout.flush()\n")
            other = subprocess.Popen([sys.executable, "-c", guard + beside], stdout=subprocess.PIPE)
            reaper.append(other)
        try:
            if other is not None:
                assert other.stdout.readline() == b"ready\n"  # started: its loop runs from here
                os.sched_setaffinity(other.pid, {cpu})
            os.sched_setaffinity(0, {cpu})  # this thread only
            if other is not None:
                time.sleep(0.05)  # the other process runs
            if fifo:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
            assert ring.wait(look_s + 0.1, spin_s=look_s) is False
        finally:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            os.sched_setaffinity(0, mine)
            if other is not None:
                other.kill()
                other.wait(10)
        return tuple(a - b for a, b in zip(ring.looked(), before))

    # Beside a busy process, a yield gives it the CPU for a slice: most of the look is
    # held off, which is a neighbour's contention.
    run, short, held = look_on_one_cpu(0.2, beside="while time.monotonic() < end: pass")
    assert run + short + held >= 0.2e9
    assert held > 0.5 * (run + short + held), (run, short, held)
    # With nothing else to run on its CPU, every yield comes straight back: on CPU or in
    # short yields. (Held only while the hypervisor runs something else in this vCPU's
    # stead: a yield is a system call, and the whole look is yields.)
    run, short, held = look_on_one_cpu(0.05, fifo=True)
    assert run + short + held >= 0.05e9
    assert held < 0.1 * (run + short + held), (run, short, held)


@pytest.mark.parametrize("what", ["ring", "space", "bell"])
def test_an_idle_waiter_sleeps_and_still_wakes(fleet_name, reaper, what):
    seg = DataSegment.create(fleet_name, 1, 4096, 4096)
    ring = seg.tasks(0)
    if what == "space":
        while ring.push(0, bytes(1000)):
            pass
    ready_r, ready_w = os.pipe()

    def waiter():
        s = DataSegment.attach(fleet_name)
        r, bell = s.tasks(0), s.bell
        seen = bell.value
        os.write(ready_w, b"x")
        if what == "ring":
            while (m := r.pop()) is None:  # a spurious return just re-checks
                r.wait(None)
            return 0 if m == (1, b"go") else 3
        if what == "space":
            while not r.push(1, bytes(1000)):
                r.wait_space(1000, None)
            return 0
        while bell.value == seen:
            bell.wait(seen, None)
        return 0

    pid = _fork(waiter)
    reaper.append(pid)
    assert os.read(ready_r, 1) == b"x"
    time.sleep(0.2)  # let it reach the futex
    before = switches_by_thread(pid)
    time.sleep(1.0)  # an idle second: a waiter that polled or spun would be switched in
    assert woken(pid, before) == [], f"an idle {what} waiter woke up"
    if what == "ring":
        ring.push(1, b"go")
        ring.notify()
    elif what == "space":
        ring.pop()
    else:
        seg.bell.ring()
    assert _wait_all([pid]) == [0]


# -- the segment's lifecycle --------------------------------------------------------------
def test_segment_layout_and_attach(fleet_name):
    seg = DataSegment.create(fleet_name, 3, 4096, 1 << 14)
    assert os.path.exists(f"/dev/shm/fleet.{fleet_name}.data")
    other = DataSegment.attach(fleet_name)
    assert (other.n_seats, other.task_capacity, other.result_capacity) == (3, 4096, 1 << 14)
    assert other.creator_pid == os.getpid() and not other.created
    for s in range(3):
        for a, b in ((seg.tasks(s), other.tasks(s)), (seg.results(s), other.results(s))):
            assert int(ffi.cast("uintptr_t", a._p)) % 64 == 0
            a.push(s, f"seat {s}".encode())
            assert b.pop() == (s, f"seat {s}".encode())
    addrs = {int(ffi.cast("uintptr_t", r._p)) - int(ffi.cast("uintptr_t", seg._base)) for s in range(3) for r in (seg.tasks(s), seg.results(s))}
    assert len(addrs) == 6 and min(addrs) >= dp.RINGS_OFF
    with pytest.raises(dp.DataPlaneError, match="seat 3 is out of range"):
        seg.tasks(3)


def test_attach_to_a_missing_segment_is_a_typed_error(fleet_name):
    with pytest.raises(dp.DataSegmentNotFound, match=f"fleet '{fleet_name}' is not running"):
        DataSegment.attach(fleet_name)


@pytest.mark.parametrize(
    "field, value, match",
    [("magic", 0, "bad magic"), ("version", 99, "layout version 99"), ("task_capacity", 5000, "task_capacity = 5000"),
     ("total_size", 1, "total_size = 1")],
)
def test_attach_refuses_a_corrupt_header(fleet_name, field, value, match):
    seg = DataSegment.create(fleet_name, 1, 4096, 4096)
    dp.HEADER.view(seg._mm)[field] = value
    with pytest.raises(dp.DataSegmentCorrupt, match=match):
        DataSegment.attach(fleet_name)


def test_attach_refuses_a_segment_smaller_than_its_header(fleet_name):
    shm = posix_ipc.SharedMemory(dp.data_segment_name(fleet_name), posix_ipc.O_CREX, size=64)
    shm.close_fd()
    with pytest.raises(dp.DataSegmentCorrupt, match="smaller than its header"):
        DataSegment.attach(fleet_name)


def test_live_creator_is_refused_naming_its_pid(fleet_name):
    DataSegment.create(fleet_name, 1, 4096, 4096)
    with pytest.raises(dp.DataSegmentInUse, match=f"live pid {os.getpid()}") as exc:
        DataSegment.create(fleet_name, 1, 4096, 4096)
    assert exc.value.pid == os.getpid() and exc.value.exit_code == dp.EXIT_TABLE_IN_USE


def test_stale_segment_of_a_sigkilled_creator_is_reclaimed(fleet_name, reaper, caplog):
    ready_r, ready_w = os.pipe()

    def creator():
        seg = DataSegment.create(fleet_name, 1, 4096, 4096)
        seg.tasks(0).push(1, b"left behind")
        os.write(ready_w, b"x")
        time.sleep(600)

    pid = _fork(creator)
    reaper.append(pid)
    assert os.read(ready_r, 1) == b"x"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert DataSegment.attach(fleet_name).creator_pid == pid  # it outlived its creator
    with caplog.at_level("WARNING", logger="fleet.shm.dataplane"):
        seg = DataSegment.create(fleet_name, 2, 4096, 4096)
    assert f"creator pid {pid} is gone" in caplog.text
    assert seg.creator_pid == os.getpid() and seg.n_seats == 2 and seg.tasks(0).pop() is None


def test_close_keeps_handed_out_rings_valid_and_unlink_leaves_nothing(fleet_name):
    seg = DataSegment.create(fleet_name, 1, 4096, 4096)
    ring = seg.tasks(0)
    seg.close()  # the Ring pins the mapping: no unmap under it
    assert ring.push(1, b"still mapped") and ring.pop() == (1, b"still mapped")
    with pytest.raises(dp.DataPlaneError, match="closed"):
        seg.results(0)
    assert dp.unlink(fleet_name) is True
    assert not os.path.exists(f"/dev/shm/fleet.{fleet_name}.data")
    assert dp.unlink(fleet_name) is False


def test_bad_name_and_sizes_are_refused(fleet_name):
    with pytest.raises(InvalidFleetName, match="is not valid"):
        DataSegment.create("../x", 1)
    with pytest.raises(dp.DataPlaneError, match="task_capacity = 5000 must be a power of two"):
        DataSegment.create(fleet_name, 1, 5000, 4096)
    with pytest.raises(dp.DataPlaneError, match="n_seats = 0"):
        DataSegment.create(fleet_name, 0)
    assert not dp.exists(fleet_name)


def test_the_header_layout_is_the_one_segments_of_this_version_were_written_with():
    # A fleet of the same LAYOUT_VERSION (an older release, a reclaimer) reads these offsets:
    # a field moved is a new version, never the same one read differently.
    want = {"magic": 0, "version": 8, "n_seats": 12, "task_capacity": 16, "result_capacity": 24, "creator_pid": 32,
            "creator_start": 40, "created_ns": 48, "total_size": 56, "rings_off": 64, "seat_stride": 72, "name": 80}
    assert dp.LAYOUT_VERSION == 3
    assert {name: dp.HEADER.offset(name) for name in want} == want and dp.HEADER.size("name") == 64
