"""The data plane: single-producer single-consumer byte rings in shared memory.

The supervisor sends unit messages to each worker through the worker's *tasks* ring
and receives results through its *results* ring. Both live in one posix shared-memory
segment per fleet, ``/fleet.<name>.data``, beside the slot table:

    header (128 B) | bell line (64 B) | seat 0: tasks ring, results ring | seat 1: ... |

Each ring is 64-byte aligned (see ``native/fleet_native.h`` for its own layout and
message framing). Rules that keep it fast and safe:

* A ring has exactly one producer and one consumer, each in one thread. Pushes only
  publish; ``notify()`` wakes the peer, and issues a syscall only if the peer sleeps,
  so a busy ring costs no syscalls and an idle one burns no CPU (futex sleeps).
* The supervisor waits on one *bell* that every worker rings after pushing results,
  instead of waiting on n rings.
* The segment's lifecycle is `fleet.shm.segments`'s, shared with the slot table: only the
  creator sizes it, exclusively; the magic is written last; a stale data segment of
  this fleet (its creator is dead) is reclaimed, one whose creator lives is refused,
  anything else under its name is left alone; attachers never pass a size (a size
  would shrink it and SIGBUS every reader).
* It carries unit payloads and results: mode 0600, never shared with a group (the
  table may be; see `fleet.shm.segments`).
* Views into the mapping are made with ``ffi.from_buffer(mm)``, which pins the
  mapping: it cannot be unmapped while a Ring or Bell still points into it.
* Calls that cannot block (push, pop, notify, a bell's ring) go through `fleet._rings`
  and keep the GIL; only the waits go through cffi, which releases it. A released GIL
  is handed to whichever thread waits for it (a caller submitting, while the loop
  pushes its grants), and getting it back cost far more than the call itself.
"""
from __future__ import annotations

import functools
import logging
import mmap
import operator
import os
import threading
import time

from fleet import _rings
from fleet.shm import segments as shm
from fleet.shm.header import HeaderLayout
from fleet._native import ffi, lib
from fleet.rules.errors import EXIT_NO_PERMISSION, EXIT_TABLE_IN_USE, FleetError

log = logging.getLogger(__name__)

MAGIC = 0x32415441444C4621  # "!FLDATA2" little-endian
LAYOUT_VERSION = 3
LINE = 64
HEADER_SIZE = 192
#: The bell word and its waiting word share one line, alone but for the zygote's news
#: count (and its never-set flag) at +8: what the zygote bumps before it rings.
BELL_OFF = HEADER_SIZE
ZYGOTE_NEWS_OFF = BELL_OFF + 8
RINGS_OFF = BELL_OFF + LINE
MAX_SEATS = 4096
MIN_CAPACITY = 4096
MAX_CAPACITY = 1 << 31  # the C side keeps message lengths in 32 bits
DEFAULT_CAPACITY = 1 << 18

HEADER_FIELDS = (
    ("magic", "Q"),
    ("version", "I"),
    ("n_seats", "I"),
    ("task_capacity", "Q"),
    ("result_capacity", "Q"),
    ("creator_pid", "Q"),
    ("creator_start", "Q"),
    ("created_ns", "Q"),
    ("total_size", "Q"),
    ("rings_off", "Q"),
    ("seat_stride", "Q"),
    ("name", "64s"),  # the fleet's name: a reclaimer checks it is this fleet's segment
)
HEADER = HeaderLayout(HEADER_FIELDS, HEADER_SIZE)

_EAGAIN, _EMSGSIZE = -11, -90
_U32 = 0xFFFFFFFF


class DataPlaneError(FleetError):
    """Base of data-plane errors."""


class MessageTooLarge(DataPlaneError, ValueError):
    """A message longer than the ring can ever hold (len + 16 > capacity / 2)."""

    def __init__(self, size: int, limit: int, ring: str = "ring"):
        self.size, self.limit = size, limit
        super().__init__(f"message of {size} bytes is larger than {ring} can hold (limit {limit} bytes)")


class DataSegmentNotFound(DataPlaneError):
    """No data segment of this name exists (the fleet is not running)."""


class DataSegmentInUse(DataPlaneError):
    """A live process owns a data segment of this name."""

    exit_code = EXIT_TABLE_IN_USE

    def __init__(self, name: str, pid: int):
        self.name, self.pid = name, pid
        super().__init__(f"fleet {name!r} is already running (data segment owned by live pid {pid})")


class DataSegmentCorrupt(DataPlaneError):
    """The segment exists but is not a data segment this code can read."""


class DataSegmentAccessDenied(DataPlaneError):
    """This uid may not open the data segment (only its owner and root may)."""

    exit_code = EXIT_NO_PERMISSION


#: The data segment as a kind of fleet segment (see fleet.shm.segments).
KIND = shm.Kind(
    label="data segment",
    suffix=".data",
    magic=MAGIC,
    header_size=HEADER_SIZE,
    name_off=HEADER.offset("name"),
    name_len=HEADER.size("name"),
    start_off=HEADER.offset("creator_start"),
    pid_off=HEADER.offset("creator_pid"),
    errors=shm.Errors(
        base=DataPlaneError, not_found=DataSegmentNotFound, in_use=DataSegmentInUse, corrupt=DataSegmentCorrupt,
        denied=DataSegmentAccessDenied,
    ),
    group_readable=False,
    access_hint="only its owner and root may open it: it carries unit payloads and results",
    logger=log,
)


def data_segment_name(name: str) -> str:
    return shm.segment_name(name, KIND)


def _timeout_ns(timeout_s: float | None) -> int:
    if timeout_s is None:
        return -1
    return max(0, int(timeout_s * 1e9))


def _check_capacity(what: str, capacity: int) -> None:
    if not (MIN_CAPACITY <= capacity <= MAX_CAPACITY) or capacity & (capacity - 1):
        raise DataPlaneError(
            f"{what} = {capacity} must be a power of two in [{MIN_CAPACITY}, {MAX_CAPACITY}]"
        )


class Ring:
    """One SPSC byte ring. One process pushes, one pops; neither side is thread-safe.

    Messages carry a uint32 `tag` and up to `max_message` bytes.
    """

    __slots__ = ("_p", "_a", "_keep", "name", "capacity", "max_message")

    def __init__(self, ptr, keepalive, name: str = "ring"):
        # ptr is derived arithmetic on a from_buffer cdata and does not own it:
        # `keepalive` holds the mapping pinned for as long as this Ring lives.
        if lib.fleet_ring_check(ptr) != 0:
            raise DataSegmentCorrupt(f"{name}: not an initialised ring (bad magic or capacity)")
        self._p = ptr
        self._a = int(ffi.cast("uintptr_t", ptr))  # its address, for fleet._rings
        self._keep = keepalive
        self.name = name
        self.capacity = int(lib.fleet_ring_capacity(ptr))
        self.max_message = int(lib.fleet_ring_max_message(ptr))

    def _too_large(self, size: int) -> MessageTooLarge:
        return MessageTooLarge(size, self.max_message, self.name)

    # -- producer ---------------------------------------------------------------
    def push(self, tag: int, data) -> bool:
        """Append one message; False when there is no room now. Does not wake the consumer:
        call `notify()` after a batch. Raises MessageTooLarge if it can never fit."""
        return self._pushed(_rings.push(self._a, tag, data, b""), data)

    def push2(self, tag: int, head, body) -> bool:
        """Append one message whose payload is `head` followed by `body`, without joining
        them in Python first. Same results as `push`."""
        return self._pushed(_rings.push(self._a, tag, head, body), head, body)

    def _pushed(self, rc: int, *parts) -> bool:
        if rc == 0:
            return True
        if rc == _EAGAIN:
            return False
        raise self._too_large(sum(memoryview(p).nbytes for p in parts))

    def push_many(self, tag: int, messages: list, notify: bool = True) -> int:
        """Append `messages` in order, in one call, until one does not fit: how many were
        pushed (the rest are the caller's to retry; push reports one that can never fit).
        A message is bytes, or a pair (head, body) of bytes pushed as one message, as
        `push2` does. `notify`: wake the consumer once after them."""
        return _rings.push_many(self._a, tag, messages, notify)

    def notify(self) -> bool:
        """Tell the consumer messages were pushed; True if it was asleep and got woken."""
        return _rings.notify(self._a)

    def wait_space(self, n: int, timeout_s: float | None = None) -> bool:
        """Block until a message of `n` payload bytes may fit (True) or the timeout ends
        (False). None waits forever. Raises MessageTooLarge if it can never fit."""
        rc = lib.fleet_ring_wait_space(self._p, min(n, _U32), _timeout_ns(timeout_s))
        if rc == _EMSGSIZE:
            raise self._too_large(n)
        return rc == 0

    def send(self, tag: int, data, timeout_s: float | None = None) -> bool:
        """Push one message, sleeping while the ring is full, then notify.
        False if the ring stayed full for `timeout_s` (None: wait forever)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.push(tag, data):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self.wait_space(len(data) if type(data) is bytes else memoryview(data).nbytes, left)
        self.notify()
        return True

    # -- consumer ---------------------------------------------------------------
    def pop(self):
        """Take one message: (tag, bytes), or None when the ring is empty."""
        one = _rings.pop_many(self._a, 1 << 16, 1)
        return (one[0][0], bytes(one[0][1])) if one else None

    def pop_many(self, max_bytes: int = 1 << 16, max_msgs: int = 1024) -> list:
        """Take every message there is, up to `max_bytes` of payload and `max_msgs`
        messages, in one call: a list of (tag, memoryview). The views share one fresh
        bytearray (valid after later calls); [] when the ring is empty. A single
        message larger than `max_bytes` is still returned, alone."""
        return _rings.pop_many(self._a, max_bytes, max_msgs)

    def taker(self):
        """`pop_many` as ``take(max_bytes, max_msgs)`` with no Python frame around the C
        call: for a consumer that polls the ring every turn (the loop, each result ring),
        most often to find it empty."""
        return functools.partial(_rings.pop_many, self._a)

    def wait(self, timeout_s: float | None = None, spin_s: float = 0.0) -> bool:
        """Block until a message may be there (True) or the timeout ends (False).
        Returns at once when the ring is non-empty; None waits forever. The GIL is
        released while it sleeps. `spin_s`: look for that long first (yielding the CPU
        between looks) before the usual short spin and sleep; part of the timeout."""
        if spin_s > 0:
            return lib.fleet_ring_wait_spin(self._p, _timeout_ns(timeout_s), int(spin_s * 1e9)) == 0
        return lib.fleet_ring_wait(self._p, _timeout_ns(timeout_s)) == 0

    def looked(self) -> tuple[int, int, int]:
        """What the consumer's looks for a message (`wait` with `spin_s`) took since the
        ring was made, in ns: on CPU; off it in short yields (threads that look too,
        handing the CPU straight back); off it in yields of 500 us or more (a task that
        ran a slice of its own beside it). The contention watch takes the first two out
        of its reading of the consumer's wait (`fleet.rules.contention`)."""
        out = ffi.new("uint64_t[3]")
        lib.fleet_ring_looked(self._p, out)
        return int(out[0]), int(out[1]), int(out[2])

    def seq(self) -> int:
        """The ring's notify count, for `wait_since` (read it before looking for work)."""
        return _rings.seq(self._a)

    def wait_since(self, seen: int, timeout_s: float | None = None) -> bool:
        """Like `wait`, but also returns at once when any `notify()` came after `seen`
        was read from `seq()`. A consumer whose own threads hand it work too (they call
        `notify()`, which is atomics only and safe from any thread) waits with this:
        ``seen = ring.seq()``; look at both kinds of work; if none, ``wait_since(seen)``
        — no wake-up is lost between the look and the sleep."""
        return lib.fleet_ring_wait_since(self._p, seen & _U32, _timeout_ns(timeout_s)) == 0

    @property
    def used(self) -> int:
        """Bytes in flight (frames, padding and wrap gaps included)."""
        return _rings.used(self._a)

    def __repr__(self) -> str:
        return f"<Ring {self.name} capacity={self.capacity} used={self.used}>"


class RingRelay:
    """A ring's wake-ups as a readable fd, for a consumer that waits in an event loop.

    A thread of its own sits in C (`fleet_ring_relay`, no GIL) waiting on the ring, and
    writes a byte to a pipe when a message or a notify came; the consumer watches
    `fileno()` (``loop.add_reader``). Pattern, as with `Ring.wait_since`:
    ``seen = ring.seq()``; look at every kind of work; if none, ``relay.arm(seen)``.
    The relay fires once per arming; `clear()` reads the bytes it wrote.
    """

    def __init__(self, ring: Ring):
        self.ring = ring
        self._arm = ffi.new("uint32_t[2]")
        self._rfd, self._wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name=f"relay {ring.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rc = lib.fleet_ring_relay(self.ring._p, self._arm, self._wfd)
        if rc < 0:
            log.error("%s: relay stopped: %s", self.ring.name, os.strerror(-rc))

    def fileno(self) -> int:
        return self._rfd

    def arm(self, seen: int) -> None:
        """Fire once the ring has a message, or a notify came after `seen` was read."""
        lib.fleet_ring_relay_arm(self._arm, seen & _U32)

    def clear(self) -> None:
        try:
            while os.read(self._rfd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        lib.fleet_ring_relay_stop(self._arm)
        self._thread.join()
        os.close(self._rfd)
        os.close(self._wfd)


class Bell:
    """A doorbell: many processes ring it, one thread waits on it.

    Waiting pattern (no lost wake-up): ``seen = bell.value``; drain everything; if
    nothing was found, ``bell.wait(seen, timeout)``. A ring after `seen` was read
    makes the wait return at once."""

    __slots__ = ("_bell", "_waiting", "_keep", "_word", "_addrs", "count")

    def __init__(self, bell_ptr, waiting_ptr, keepalive):
        self._bell, self._waiting, self._keep = bell_ptr, waiting_ptr, keepalive
        self._addrs = (int(ffi.cast("uintptr_t", bell_ptr)), int(ffi.cast("uintptr_t", waiting_ptr)))
        # Read as a plain aligned 32-bit load, not a cffi call: the loop reads it every turn,
        # and a cffi call gives the GIL away. Its ordering before the ring loads that follow
        # (the waiting pattern needs it) holds all the same: each ring read is a cffi call,
        # which releases the GIL (a mutex operation, a full barrier) before it loads.
        self._word = memoryview(ffi.buffer(bell_ptr, 4)).cast("I")
        #: count() is `value` with no Python frame between (C calls that keep the GIL):
        #: the loop reads it twice a turn
        self.count = functools.partial(operator.getitem, self._word, 0)

    @property
    def value(self) -> int:
        return self._word[0]

    def ring(self) -> bool:
        """Bump the bell; True if the waiter was asleep and got woken."""
        return _rings.bell_ring(*self._addrs)

    def wait(self, seen: int, timeout_s: float | None = None, spin_s: float = 0.0,
             handover: Handover | None = None) -> bool:
        """Sleep while the bell still reads `seen`: True when it rang (or a spurious
        wake-up), False on timeout. None waits forever. `spin_s`: look for that long
        first (yielding the CPU between looks) before the usual short spin and sleep;
        the spin is part of the wait (it never outlasts `timeout_s`). `handover`: the
        waiter is the loop of that `Handover` (its word cleared, a caller's awaited)."""
        if handover is not None:
            return lib.fleet_bell_wait_spin_held(self._bell, self._waiting, seen & _U32, _timeout_ns(timeout_s),
                                                 int(spin_s * 1e9), handover.loop_word, handover.caller_word,
                                                 handover.bound_ns) == 0
        if spin_s > 0:
            return lib.fleet_bell_wait_spin(self._bell, self._waiting, seen & _U32, _timeout_ns(timeout_s),
                                            int(spin_s * 1e9)) == 0
        return lib.fleet_bell_wait(self._bell, self._waiting, seen & _U32, _timeout_ns(timeout_s)) == 0


#: Longest a woken thread looks on for the other to let go of the GIL (`Handover`): the
#: Python a thread runs between its wake-up call and its wait (a submit's return and
#: `result()`; the rest of the loop's turn) is a few microseconds.
HANDOVER_S = 20e-6


class Handover:
    """Two threads of this process handing the GIL to each other as they wake each other:
    the supervisor's loop (as it settles futures) and a caller (as its submit wakes the
    loop). A thread that wakes the other and still runs Python after it says so
    (`loop_holds`, `caller_holds`: a plain store, the GIL held); its next wait clears
    its word in C, once the GIL is let go (`Bell.wait` for the loop, `Pulse.watch` for
    a caller, given this handover). The woken thread, having seen its news while it
    spun, looks on while the other's word is set, up to `bound_s` (`HANDOVER_S`), and
    only then asks for the GIL.

    Why. A thread that asks for the GIL while another holds it sleeps on the GIL's
    condition and is woken when the holder lets go: one more wake-up (20-50 us on a VM,
    where waking another vCPU is an interrupt across the hypervisor), after the one
    the spin already saved. On a one-at-a-time round trip that happens twice (the
    loop waking for the submit, the caller for its result): measured with
    tools/bench/latency_stages.py on 2 vCPUs, "post -> loop accepts" 33-48 us and
    "delivered -> caller back" 31-49 us without the handover, 8-17 and 7-22 us with it.
    A hint, never a promise: a word is awaited only when it was clear as the wait
    began (one left set by a thread that went on running, as through a burst of
    submits, is not the ringer's), a word never cleared costs the other at most
    `bound_s` once, and the GIL is then taken as before."""

    __slots__ = ("_words", "_view", "loop_word", "caller_word", "bound_ns")

    def __init__(self, bound_s: float | None = None):
        self.bound_ns = int((HANDOVER_S if bound_s is None else bound_s) * 1e9)
        self._words = ffi.new("uint32_t[2]")
        self._view = memoryview(ffi.buffer(self._words, 8)).cast("I")
        self.loop_word, self.caller_word = self._words, self._words + 1

    def loop_holds(self) -> None:
        """The loop woke callers (it settled futures) and runs on: its next wait clears it."""
        self._view[0] = 1

    def caller_holds(self) -> None:
        """A caller woke the loop (it posted a submit) and runs on: its next watch clears it."""
        self._view[1] = 1

    @property
    def held(self) -> tuple[bool, bool]:
        """(the loop's word, a caller's word): set, not yet cleared by a wait."""
        return bool(self._view[0]), bool(self._view[1])


class Pulse:
    """A counter one thread bumps and other threads of the process watch for a short
    while without sleeping (the GIL released): a hint, never a promise. A watcher
    reads `value`, checks what it waits for, then `watch(seen, spin_s)`; when the
    watch runs out it falls back to a real wait, so a missed or absent bump only costs
    the spin. What it buys is the wake-up: a thread that keeps looking is on its CPU
    when the news comes, where a sleeping one is woken tens of microseconds later.

    `words`: two uint32 words (the count, and a flag never set) in memory that other
    processes map too (`keepalive` pins it), for a count another process bumps; by
    default the process's own."""

    __slots__ = ("_words", "_addrs", "_word", "_keep", "count")

    def __init__(self, words=None, keepalive=None):
        self._words = ffi.new("uint32_t[2]") if words is None else words
        self._keep = keepalive
        self._addrs = (int(ffi.cast("uintptr_t", self._words)), int(ffi.cast("uintptr_t", self._words + 1)))
        self._word = memoryview(ffi.buffer(self._words, 4)).cast("I")
        #: count() is `value` with no Python frame between (the loop reads one every turn)
        self.count = functools.partial(operator.getitem, self._word, 0)

    @property
    def value(self) -> int:
        return self._word[0]

    def bump(self) -> None:
        _rings.bell_ring(*self._addrs)  # an atomic add; nobody sleeps on it, so no wake-up call

    def watch(self, seen: int, spin_s: float, handover: Handover | None = None) -> bool:
        """Look until the count differs from `seen` (True) or `spin_s` passed (False),
        yielding the CPU between looks. `handover`: the watcher is a caller of that
        `Handover` (its word cleared, the loop's awaited)."""
        if handover is not None:
            return lib.fleet_word_watch_held(self._words, seen & _U32, int(spin_s * 1e9), handover.caller_word,
                                             handover.loop_word, handover.bound_ns) == 0
        return lib.fleet_word_watch(self._words, seen & _U32, int(spin_s * 1e9)) == 0


def _lay_out(mm: mmap.mmap, n_seats: int, task_capacity: int, result_capacity: int) -> None:
    """A new segment's header and rings in `mm`, published (its magic written last)."""
    stride, total = _layout(n_seats, task_capacity, result_capacity)
    h = HEADER.view(mm)
    h["version"] = LAYOUT_VERSION
    h["n_seats"] = n_seats
    h["task_capacity"], h["result_capacity"] = task_capacity, result_capacity
    h["created_ns"] = time.time_ns()
    h["total_size"], h["rings_off"], h["seat_stride"] = total, RINGS_OFF, stride
    base = ffi.from_buffer(mm)
    task_bytes = lib.fleet_ring_bytes(task_capacity)
    for seat in range(n_seats):
        off = RINGS_OFF + seat * stride
        for ring_off, cap in ((off, task_capacity), (off + task_bytes, result_capacity)):
            rc = lib.fleet_ring_init(base + ring_off, cap)
            if rc != 0:  # only a layout bug gets here: capacities were checked
                raise DataPlaneError(f"cannot initialise ring at offset {ring_off}: errno {-rc}")
    # Magic last, with a release store: an attacher that sees it sees every ring.
    lib.fleet_store_release_u64(ffi.cast("uint64_t *", base), MAGIC)


def _layout(n_seats: int, task_capacity: int, result_capacity: int) -> tuple[int, int]:
    """(seat_stride, total_size); every ring offset is a multiple of 64."""
    stride = lib.fleet_ring_bytes(task_capacity) + lib.fleet_ring_bytes(result_capacity)
    return stride, RINGS_OFF + n_seats * stride


class DataSegment:
    """The fleet's data segment: a bell and one tasks + results ring pair per seat."""

    def __init__(self, name: str, mm: mmap.mmap, created: bool):
        self.name = name
        self.created = created
        self._mm = mm
        self._base = ffi.from_buffer(mm)  # pins the mapping while any view lives
        h = HEADER.view(mm)
        self.n_seats = int(h["n_seats"])
        self.task_capacity = int(h["task_capacity"])
        self.result_capacity = int(h["result_capacity"])
        self.creator_pid = int(h["creator_pid"])
        self._stride = int(h["seat_stride"])
        self._task_bytes = lib.fleet_ring_bytes(self.task_capacity)
        self._rings: dict = {}
        self._bell = Bell(
            ffi.cast("uint32_t *", self._base + BELL_OFF),
            ffi.cast("uint32_t *", self._base + BELL_OFF + 4),
            self._base,
        )
        #: Bumped by the zygote before it rings the bell for an event it sent: the
        #: supervisor reads the zygote's socket when this moved, not after every ring
        #: (a read is a system call and a raised BlockingIOError, tens of microseconds
        #: on a busy VM, on the path of every result that wakes the loop).
        self.zygote_news = Pulse(ffi.cast("uint32_t *", self._base + ZYGOTE_NEWS_OFF), self._base)

    # -- lifecycle --------------------------------------------------------------
    @classmethod
    def create(
        cls,
        name: str,
        n_seats: int,
        task_capacity: int = DEFAULT_CAPACITY,
        result_capacity: int = DEFAULT_CAPACITY,
    ) -> "DataSegment":
        """Create the segment exclusively, reclaiming a stale one (its creator is dead).

        Raises DataSegmentInUse when a live process owns one of this name."""
        data_segment_name(name)  # a bad name is refused before anything else
        if not 1 <= n_seats <= MAX_SEATS:
            raise DataPlaneError(f"n_seats = {n_seats} is out of range [1, {MAX_SEATS}]")
        _check_capacity("task_capacity", task_capacity)
        _check_capacity("result_capacity", result_capacity)
        # 0600; name, creator pid and start written
        mm = shm.create(name, KIND, _layout(n_seats, task_capacity, result_capacity)[1])
        _lay_out(mm, n_seats, task_capacity, result_capacity)
        return cls(name, mm, created=True)

    @classmethod
    def scratch(cls, name: str, n_seats: int = 1, capacity: int = MIN_CAPACITY) -> "DataSegment":
        """A data segment of this process alone, in anonymous memory (nothing in /dev/shm,
        no creator recorded): the fork server's rehearsal runs a worker's loop over it
        (`fleet.worker.rehearsal`). `name`: its fleet's (what a worker names its parcels by)."""
        mm = mmap.mmap(-1, _layout(n_seats, capacity, capacity)[1])
        _lay_out(mm, n_seats, capacity, capacity)
        return cls(name, mm, created=False)

    @classmethod
    def attach(cls, name: str, trust: frozenset[int] | None = None) -> "DataSegment":
        """Map an existing segment after validating it. Never passes a size. ``trust``: the
        uids its owner may be (`fleet.shm.segments.attach`; default ours and root)."""
        mm = shm.attach(name, KIND, writable=True, trust=trust)
        try:
            _validate(mm, data_segment_name(name))
            return cls(name, mm, created=False)
        except DataPlaneError:
            shm.close_quietly(mm)
            raise

    def close(self) -> None:
        """Unmap now, or when the last Ring/Bell handed out is gone."""
        self._rings.clear()
        self._bell = None
        self._base = None
        shm.close_quietly(self._mm)

    def unlink(self) -> bool:
        """Remove the segment's name; mappings stay valid until unmapped."""
        return unlink(self.name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- views ------------------------------------------------------------------
    def _ring(self, seat: int, which: int) -> Ring:
        key = (seat, which)
        ring = self._rings.get(key)
        if ring is None:
            if self._base is None:
                raise DataPlaneError(f"data segment of fleet {self.name!r} is closed")
            if not 0 <= seat < self.n_seats:
                raise DataPlaneError(f"seat {seat} is out of range [0, {self.n_seats})")
            off = RINGS_OFF + seat * self._stride + (self._task_bytes if which else 0)
            label = f"{'results' if which else 'tasks'} ring of seat {seat}"
            ring = self._rings[key] = Ring(self._base + off, self._base, label)
        return ring

    def tasks(self, seat: int) -> Ring:
        """The supervisor -> worker ring of `seat`."""
        return self._ring(seat, 0)

    def results(self, seat: int) -> Ring:
        """The worker -> supervisor ring of `seat`."""
        return self._ring(seat, 1)

    @property
    def bell(self) -> Bell:
        """The supervisor's doorbell: workers ring it after pushing results."""
        if self._bell is None:
            raise DataPlaneError(f"data segment of fleet {self.name!r} is closed")
        return self._bell


def _validate(mm: mmap.mmap, seg: str) -> None:
    """Raise DataSegmentCorrupt naming the first field that is wrong."""
    h = HEADER.view(mm)
    magic = int(lib.fleet_load_acquire_u64(ffi.cast("uint64_t *", ffi.from_buffer(mm))))
    if magic != MAGIC:
        raise DataSegmentCorrupt(f"data segment {seg}: bad magic {magic:#018x} (not initialised or not a fleet data segment)")
    if int(h["version"]) != LAYOUT_VERSION:
        raise DataSegmentCorrupt(f"data segment {seg}: layout version {int(h['version'])}, this fleet reads {LAYOUT_VERSION}")
    n_seats = int(h["n_seats"])
    if not 1 <= n_seats <= MAX_SEATS:
        raise DataSegmentCorrupt(f"data segment {seg}: n_seats = {n_seats} is out of range")
    for field in ("task_capacity", "result_capacity"):
        try:
            _check_capacity(field, int(h[field]))
        except DataPlaneError as exc:
            raise DataSegmentCorrupt(f"data segment {seg}: {exc}") from None
    stride, total = _layout(n_seats, int(h["task_capacity"]), int(h["result_capacity"]))
    for field, want in (("rings_off", RINGS_OFF), ("seat_stride", stride), ("total_size", total)):
        if int(h[field]) != want:
            raise DataSegmentCorrupt(f"data segment {seg}: header field {field} = {int(h[field])}, expected {want}")
    if len(mm) != total:
        raise DataSegmentCorrupt(f"data segment {seg}: segment is {len(mm)} bytes, header says {total}")


def unlink(name: str) -> bool:
    """Remove the data segment's name. True if it existed."""
    return shm.unlink(name, KIND)


def exists(name: str) -> bool:
    return shm.exists(name, KIND)
