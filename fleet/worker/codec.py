"""The task and result codec: what travels in a message body (beside fleet.shm.messages,
which frames the headers), and the one guard every pickle crossing a process goes through.

A task body is `(payload, key, lane, request_id)`, pickled once in the submitting
process (so an unpicklable payload is refused there, synchronously). A body too large
for its ring, or holding large out-of-band buffers, travels beside it (`pack`: a parcel,
fleet.shm.parcels) and the ring message names it; `loads` rebuilds the object over the
parcel's mapping wherever it is received. A
payload a service-mode client pickled at its end travels as `_Pickled`: the worker
unpickles it, nobody else. A result body is decoded here into the unit's `Outcome`,
its value, and the handler's original exception when there was one.

The guard (`dumps`, `loads`). Pickling and unpickling run code a unit brought along
(``__reduce__``, the callables it names, ``__setstate__``), and that code may raise
anything: SystemExit, KeyboardInterrupt, RecursionError, MemoryError. Whatever it
does becomes a `CodecError` naming what could not be (un)pickled and why, and that
becomes the unit's own outcome (ResultError, or HandlerError for a payload); the
process that hit it (the supervisor's loop, a worker, a client) carries on. A
handler's exception travels pickled on its own, apart from its traceback text, so a
result body always decodes to its outcome even when that exception cannot be rebuilt
here (then the text says why, and the outcome has no original exception).
"""
from __future__ import annotations

import contextvars
import io
import mmap
import os
import pickle
import struct
import sys
import threading
import weakref

from fleet._codec import BlobScan
from fleet.shm import messages as M
from fleet.shm import parcels, segments
from fleet.worker.calls import Calls
from fleet.rules.outcomes import FAILED, SOLVED, SUPPRESSED, Refused
from fleet.rules.vocab import Reason
from fleet.rules.unit import Outcome, PayloadTooLarge, PayloadUnpicklable

_SOLVED = Outcome(SOLVED)

#: Traceback text kept per failed outcome (the head is cut; the last lines matter).
MAX_DETAIL_CHARS = 64 * 1024
#: A handler's exception travels pickled only below this size (its text always does).
MAX_ERROR_BYTES = 128 * 1024
#: Characters of an exception's own text kept when a failure names it.
MAX_WHY_CHARS = 500
#: The guard's recursion bound. Pickle recurses once or twice per level of nesting on
#: the C stack, counted against the interpreter's recursion limit: at the default limit
#: (1,000) a value nested too deep is a RecursionError, but a process that raised the
#: limit (a handler may) lets pickle overflow the stack and die (a 50,000-deep list
#: pickled under a limit of 10**7 segfaults). 10,000 levels fit a 2 MB thread stack.
MAX_DEPTH = 10_000


#: A buffer pickle protocol 5 hands out (an array's memory, a bytearray: anything exposing a
#: PickleBuffer) at least this large travels beside the ring, out of band: copied once, into
#: a parcel (`fleet.shm.parcels`), and the receiver's object is built over the mapping.
OOB_MIN = 256 * 1024
#: A pickle larger than this travels beside its ring whole (a ring message stays small).
INLINE_MAX = 1 << 20
#: A result's pickle larger than this travels in a parcel its worker lends (warm: written
#: into pages already allocated), where the supervisor unpickles it in place and gives the
#: parcel back at once: one copy fewer than out of the ring (taken out whole, then
#: unpickled), and the ring's pages in use stay those of small messages. A map of 1 KiB
#: `bytes` results, whose batches come back 0.2-0.7 MiB each: the parent's peak RSS over
#: the bytes moved 0.93-1.24 in its first round, against 1.69-1.96 with INLINE_MAX
#: (tools/bench/data_bench.py's measure, in fresh processes).
RESULT_INLINE_MAX = 128 << 10
#: Containers looked into for large `bytes` (`_holds_blob`): this deep, this long at most.
SCAN_DEPTH, SCAN_LEN = 4, 64
#: The first byte of a body that names a parcel ("P"); a pickle's first byte is PROTO (0x80).
PARCEL = 0x50
#: After it: whether the receiver takes the parcel (a result) or its sender keeps it (a task),
#: or the receiver copies out of it and gives it back to its writer (a worker's result).
_TAKE, _KEEP, _LEND = ord("T"), ord("K"), ord("L")
#: Or: the payload is in a memfd handed to the worker beside the task (`fleet.shm.handoff`).
_HANDED = ord("H")
#: A worker's end of its seat's descriptor channel (`fleet.shm.handoff.Inbox`), set as it
#: starts in a service-mode fleet; None elsewhere.
_INBOX = None


def set_inbox(inbox) -> None:
    """This worker takes handed payloads' descriptors from `inbox` (`fleet.shm.handoff.Inbox`)."""
    global _INBOX
    _INBOX = inbox


class CodecError(Exception):
    """Something a unit brought could not be pickled, or unpickled here; the message
    names what and why (``<what> cannot be unpickled here: SystemExit: 7``)."""


def dumps(value, what: str) -> bytes:
    """`value` pickled, under the guard. Raises CodecError naming `what`."""
    return _guarded(_dumps, value, what, None)


def loads(data, what: str, where: str = "here"):
    """The object pickled in `data`, under the guard. Raises CodecError naming `what`
    and `where` ("here", or the process it is unpickled in, e.g. "in the worker")."""
    return _guarded(_load, data, what, where)


def _dumps(value) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def pack(value, what: str, fleet: str | None, *, take: bool, inline_max: int = INLINE_MAX,
         reserve=None, writer=None, lend: bool = False) -> tuple[bytes, str | None]:
    """`value` as a ring message's body, under the guard: (body, the parcel's name or None).

    Pickled with protocol 5: each buffer of OOB_MIN bytes or more is set aside out of band,
    and so is each `bytes` object that large found in the value's first levels (`_holds_blob`:
    pickle keeps bytes in band, which would copy it into the pickle first); if there is one,
    or the pickle is over `inline_max` bytes, the pickle and what was set aside are written
    once into a parcel of `fleet` and the body only names it. ``take``: the receiver owns the
    parcel (a result); else the sender does (a task: removed at the unit's outcome).
    ``fleet`` None: no parcel (the body is the pickle, whatever its size). ``reserve(n)``:
    called with the parcel's size before it is written (it may wait, or raise). ``writer``:
    what writes the parts (`parcels.Warm.write`); a new parcel of `fleet` by default.
    ``lend`` (with a `parcels.Lender`'s writer): the receiver copies the value out of the
    parcel and gives it back to be written into again (`_unparcel`), when the writer lent
    it (else the receiver takes it).

    Raises CodecError (it cannot be pickled), parcels.ParcelError (no room in /dev/shm)."""
    if fleet is None:
        return dumps(value, what), None
    pickled = _pickled(value, what)
    body = _inline(pickled, inline_max)
    if body is not None:
        return body, None
    return _parcelled(pickled, fleet, take=take, reserve=reserve, writer=writer, lend=lend)


def _pickled(value, what: str, scan=None) -> tuple[bytes | memoryview, list, list]:
    """`pack`'s first half: `value` pickled, what was set aside beside it (`_set_aside`;
    ``scan``: what the look for large `bytes` looks at, when not `value` itself).
    The pickle may be a view of this thread's staging buffer (`_Staging`), valid until
    the thread's next pickle: `_inline` and `_parcelled` take it at once."""
    global _stage_next
    if type(value) in _ATOMS:  # nothing in it to set aside, nothing that fails to pickle
        return pickle.dumps(value, protocol=5), (), ()
    if _plain(value):  # small atoms alone: nothing in it to set aside, nothing that fails to pickle
        data = pickle.dumps(value, protocol=5)
        if len(data) < STAGE_MIN:
            _stage_next = False  # as `_set_aside` leaves it after a pickle this small
            return data, (), ()
    return _set_aside(value, what, True, scan)


def _inline(pickled: tuple, inline_max: int) -> bytes | None:
    """The pickle as a ring message's body, when nothing was set aside and it is at most
    `inline_max` bytes; else None (it travels in a parcel: `_parcelled`). A body of its
    own: a pickle made in the staging buffer is copied out of it (the unit keeps its body)."""
    data, aside, blobs = pickled
    if aside or blobs or len(data) > inline_max:
        return None
    return data if type(data) is bytes else bytes(data)


def _parcelled(pickled: tuple, fleet: str, *, take: bool, reserve, writer, lend: bool) -> tuple[bytes, str]:
    """`pack`'s second half for what does not go inline: written into a parcel (see `pack`)."""
    data, aside, blobs = pickled
    parts = [data, *aside, *blobs]
    sizes = [memoryview(p).nbytes for p in parts]
    if reserve is not None:
        reserve(parcels.layout(sizes)[1])
    written = parcels.write(fleet, parts) if writer is None else writer(parts)
    name, offsets = written[0], written[1]
    lent = lend and written[2]  # a lender's writer says whether it lends this one
    mode = _LEND if lent else _TAKE if take else _KEEP
    ref = bytes((PARCEL, mode)) + pickle.dumps((name, offsets, sizes, len(aside)), protocol=5)
    return ref, name


def _set_aside(value, what: str, staged: bool = False, scan=None) -> tuple[bytes | memoryview, list, list]:
    """`value` pickled with protocol 5 under the guard, with each buffer of OOB_MIN bytes or
    more set aside out of band and each `bytes` that large found in its first levels set
    aside as a blob: (the pickle, the buffers as views of their memory, the blobs). Nothing
    set aside is copied. ``staged``: the pickle may be made in this thread's staging
    buffer (`_Staging`: after a pickle of STAGE_MIN bytes or more), and is then a view of
    it, valid until the thread's next staged pickle. ``scan``: the value the look for
    `bytes` looks at instead (a task whose chunk travels as its `Calls.wire`: the look
    goes as deep into its items as into the chunk's)."""
    global _stage_next
    aside: list = []
    blobs: list = []

    def inline(buf) -> bool:  # pickle's buffer_callback: True keeps `buf` in the pickle
        view = memoryview(buf)
        if view.nbytes < OOB_MIN or not view.contiguous:
            return True
        aside.append(buf.raw())  # bytes, in C or Fortran order alike
        return False

    holds_blob = _holds_blob(value if scan is None else scan)
    if staged and _stage_next and _stage_free():
        data = _guarded(_dump_staged, (value, inline, blobs if holds_blob else None), what, None)
    elif holds_blob:
        data = _guarded(lambda v: _dump_with_blobs(v, inline, blobs), value, what, None)
    else:
        data = _guarded(_dump_with_aside, (value, inline), what, None)
    if staged:
        # Staged from here while pickles come this large: not smaller ones (pickle.dumps is
        # cheaper for those), nor larger than the buffers keep (a buffer grown past it is
        # copied as it grows, and let go; pickle.dumps grows its block in place)
        _stage_next = STAGE_MIN <= len(data) <= STAGE_KEEP
    return data, aside, blobs


def _dump_with_aside(value_and_callback: tuple) -> bytes:
    """`_set_aside`'s pickling when no large `bytes` is in the value (the common case: a
    function, not a lambda made per submit, under the guard)."""
    return pickle.dumps(value_and_callback[0], protocol=5, buffer_callback=value_and_callback[1])


class _BlobPickler(pickle.Pickler):
    """Protocol 5, with each large `bytes` set aside as a blob (its index in the pickle)."""

    def __init__(self, file, inline, blobs: list):
        super().__init__(file, protocol=5, buffer_callback=inline)
        self._blobs, self._seen = blobs, {}

    def persistent_id(self, obj):
        if type(obj) is not bytes or len(obj) < OOB_MIN:
            return None
        at = self._seen.get(id(obj))
        if at is None:
            at = self._seen[id(obj)] = len(self._blobs)
            self._blobs.append(obj)
        return at


def _dump_with_blobs(value, inline, blobs: list) -> bytes:
    out = io.BytesIO()
    _BlobPickler(out, inline, blobs).dump(value)
    return out.getvalue()


#: A pickle of at least this many bytes (and at most STAGE_KEEP) made by `_pickled` sends
#: the next ones through their thread's staging buffer (`_Staging`), until one comes out
#: smaller or larger. Such pickles travel in a parcel (beside the ring, from INLINE_MAX),
#: so each is copied once more anyway; made by pickle.dumps, each is a fresh block of
#: memory as large, which glibc's malloc maps (and the kernel zeroes, page by page, as the
#: pickle is written) and unmaps again for most sizes: a map over 64 KiB `bytes` (batches
#: of 8 MiB) faulted in every byte it moved in the parent (17k faults a round of 62.5
#: MiB), and ran at 0.75-1.0 GB/s in most rounds, 3.1-3.4 in the others. The staging
#: buffer's pages stay.
STAGE_MIN = INLINE_MAX
#: Most bytes the staging buffers of all this process's threads hold between pickles: a
#: buffer is let go once its pickle is taken while they hold more (one outsized payload,
#: or many threads pickling large values, does not stay resident). Twice a batching map's
#: most bytes (pace.BATCH_BYTES).
STAGE_KEEP = 16 << 20
#: Whether the next pickle `_pickled` makes is staged (any thread's last one was large). A
#: hint: a race costs at most one pickle made the other way.
_stage_next = False
_stages = threading.local()
#: Every thread's staging buffer alive (one whose thread ended, or that was let go, leaves).
_stagings: weakref.WeakSet = weakref.WeakSet()
_stage_lock = threading.Lock()  # over `_stagings`: threads add to it and read it


class _Staging:
    """A thread's pickling buffer, a file for pickle.Pickler: the pickle's frames and its
    large in-band objects are copied in as pickle writes them, into pages that stay from
    one pickle to the next (STAGE_KEEP bytes for all threads together). `taken()` gives
    the pickle as a view of the buffer, valid until this thread's next staged pickle; one
    pickled while another is being made on the thread (a `__reduce__` that submits) is
    made by pickle.dumps."""

    __slots__ = ("buf", "mem", "end", "busy", "__weakref__")

    def __init__(self, size: int = STAGE_MIN):
        self.buf = bytearray(size)
        self.mem = memoryview(self.buf)
        self.end = 0
        self.busy = False
        with _stage_lock:
            _stagings.add(self)

    def write(self, data) -> int:
        view = data.raw() if type(data) is pickle.PickleBuffer else memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        n = view.nbytes
        end = self.end + n
        if end > len(self.buf):
            self._grow(end)
        self.mem[self.end:end] = view
        self.end = end
        return n

    def _grow(self, need: int) -> None:
        buf = bytearray(max(need, 2 * len(self.buf)))
        buf[: self.end] = self.mem[: self.end]
        self.buf, self.mem = buf, memoryview(buf)

    def taken(self) -> memoryview:
        data = self.mem[: self.end]
        if staged_bytes() > STAGE_KEEP:
            _stages.staging = None  # the view keeps its bytes alive while they are read
        return data


def staged_bytes() -> int:
    """Bytes the staging buffers of this process's threads hold now."""
    with _stage_lock:
        return sum(len(stage.buf) for stage in _stagings)


def _stage_free() -> bool:
    """Whether this thread's staging buffer may take a pickle: not while another is being
    made into it (a pickle within a pickle, on this thread: made by pickle.dumps)."""
    stage = getattr(_stages, "staging", None)
    return stage is None or not stage.busy


def _dump_staged(args: tuple):
    """`_set_aside`'s pickling into this thread's staging buffer, which is free
    (`_stage_free`) (``args``: the value, the buffer callback, the blobs' list or None
    when no large `bytes` is in the value)."""
    value, inline, blobs = args
    stage = getattr(_stages, "staging", None)
    if stage is None:
        stage = _stages.staging = _Staging()
    stage.busy = True
    try:
        if blobs is None:
            pickle.Pickler(stage, protocol=5, buffer_callback=inline).dump(value)
        else:
            _BlobPickler(stage, inline, blobs).dump(value)
        return stage.taken()
    finally:
        stage.end = 0
        stage.busy = False


class _BlobUnpickler(pickle.Unpickler):
    """The unpickler of `_BlobPickler`'s pickles: a blob's index gives it back."""

    def __init__(self, file, buffers, blobs: list):
        super().__init__(file, buffers=buffers)
        self._blobs = blobs

    def persistent_load(self, pid):
        return self._blobs[pid]


def _load_parts(stream, buffers, blobs: list):
    """The object of a pickle and what was set aside from it (`pack`)."""
    if not blobs:
        return pickle.loads(stream, buffers=buffers)
    return _BlobUnpickler(io.BytesIO(stream), buffers, blobs).load()


#: The mappings of task parcels the running unit was lent (`lending`), in this context.
_LENT: contextvars.ContextVar = contextvars.ContextVar("fleet_lent", default=None)


def names_parcel(body, routed: bool = False) -> bool:
    """Whether unpickling task `body` may map a parcel (it names one, or a memfd handed
    beside it), which `lending` gives back at the unit's end; an inline body maps
    nothing. ``routed``: the body carries its route in front (looked past by `split_route`)."""
    return routed or (len(body) > 0 and body[0] == PARCEL)


class lending:
    """Around a unit's run in the worker: the task parcels mapped meanwhile are given back
    at its end, before its result is sent, so that its supervisor may write the next
    payload into them (`parcels.Warm`). Each mapping is unmapped; one an object the unit's
    code kept still uses is first made this process's own (`parcels.privatize`: its pages
    copied as written), so that object never sees the next payload."""

    __slots__ = ("_token",)

    def __enter__(self):
        self._token = _LENT.set([])

    def __exit__(self, *exc):
        lent = _LENT.get()
        _LENT.reset(self._token)
        give_back(lent)


def give_back(lent: list) -> None:
    """Unmap each of `lent`'s mappings, or make it private when an object still uses it."""
    for mm in lent:
        try:
            mm.close()
        except BufferError:  # an object the unit's code kept is built over it
            parcels.privatize(mm)


def parcel_of(body) -> tuple[str, int] | None:
    """(name, bytes) of the parcel a body names; None for an inline body."""
    if not (len(body) and body[0] == PARCEL):
        return None
    name, _offsets, sizes, _n = pickle.loads(body[2:])
    return name, parcels.layout(sizes)[1]


def drop_parcel(status: int, body) -> None:
    """Remove the parcel a result body names, if it names one (a stray result: nobody takes it)."""
    if status not in (M.ST_SOLVED, *_CHUNK_STATUSES) or not (len(body) and body[0] == PARCEL):
        return
    try:
        parcels.remove(parcel_of(body)[0])
    except Exception:  # noqa: BLE001 - bytes that only look like a parcel's name: nothing of ours to remove
        pass


_CHUNK_STATUSES = (M.ST_CHUNK, M.ST_CHUNK_SUPPRESSED, M.ST_CHUNK_FAILED)


def _load(data):
    """pickle.loads, and a body naming a parcel rebuilt over the parcel's mapping."""
    if len(data) and data[0] == PARCEL:
        return _unparcel(data)
    return pickle.loads(data)


def _unparcel(data):
    """The object a parcel holds. Its out-of-band buffers are views of the mapping, which
    lives as long as the objects built over them (an array's base is the mapping): no copy
    and no view into memory reused later. The mapping is writable, and the receiver's own:
    a result's is taken; a task's is private and given back at the unit's end (`lending`).
    Its blobs (large `bytes`) are read into bytes of their own: one copy, no mapping."""
    if data[1] == _HANDED:
        return _from_handed(data)
    name, offsets, sizes, n_oob = pickle.loads(data[2:])
    if data[1] == _LEND:
        return _adopted(name, offsets, sizes, n_oob)
    take = data[1] == _TAKE

    def mapped(fd: int, size: int) -> mmap.mmap:
        mm = parcels.map_(fd, size, take=take)
        if not take:
            lent = _LENT.get()
            if lent is None:
                parcels.privatize(mm)  # no unit's run to give it back at: its own pages from now
            else:
                lent.append(mm)
        return mm

    fd, size = parcels.open_fd(name, take=take)
    try:
        return _built(fd, size, offsets, sizes, n_oob, mapped)
    finally:
        os.close(fd)


def _from_handed(data):
    """A task whose payload is a memfd handed beside it (`_handed_task`): the descriptor
    taken from this worker's channel, mapped privately (writable, copy-on-write: the memfd
    is sealed), and the task's pickle loaded with each of its buffers a view of that
    mapping, which lives as long as the objects built over it."""
    from fleet.shm.handoff import HandoffError

    ino, size, stream, spans, n_oob = pickle.loads(data[2:])
    if _INBOX is None:
        raise HandoffError("this worker has no descriptor channel for a payload handed beside its task")
    fd = _INBOX.take(ino)
    try:
        held = os.fstat(fd).st_size
        if held < size:
            raise HandoffError(f"the payload's memfd holds {held} bytes, its task says {size}")
        # The payload's pickle and its blobs are read (into bytes of their own: one copy, as
        # from a parcel); only its out-of-band buffers are views of the mapping.
        parts = [parcels.read(fd, o, n) for o, n in spans[:1]]
        if n_oob:
            view = memoryview(mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE))
            parts += [view[o : o + n] for o, n in spans[1 : 1 + n_oob]]
        parts += [parcels.read(fd, o, n) for o, n in spans[1 + n_oob:]]
    finally:
        os.close(fd)
    return pickle.loads(stream, buffers=parts)


def handed_inode(body, routed: bool = False) -> int | None:
    """The inode of the memfd a task body's payload is handed in (`_handed_task`); None
    for any other body. ``routed``: the body carries its route in front (F_ROUTED)."""
    if routed:
        body = _after_route(body)[1]
    if len(body) > 1 and body[0] == PARCEL and body[1] == _HANDED:
        return pickle.loads(body[2:])[0]
    return None


def let_go_handed(body, routed: bool = False) -> None:
    """A task this worker hands back unrun: the descriptor handed with it, if any, is
    closed (the supervisor hands it again with the task's next run)."""
    if _INBOX is not None:
        ino = handed_inode(body, routed)
        if ino is not None:
            _INBOX.drop(ino)


def value_in_parcel(fd: int, size: int, spans, n_oob: int):
    """The object a parcel holds, from a read-only descriptor of it (a client of fleetd's:
    `fleet.service.control.fds.open_parcel`), as `_unparcel` builds a taken one: its
    out-of-band buffers are views of a private writable mapping (the file is never written
    through it), which lives as long as the objects built over them; its blobs are read
    into bytes of their own. The descriptor stays the caller's. Raises CodecError when
    the layout (each part's ``(offset, bytes)``) does not fit the file or the bytes cannot
    be unpickled."""
    fault = parcels.spans_fault(spans, n_oob, size, spans_name="value_spans", oob_name="value_oob",
                                file="the parcel")
    if fault is not None:
        raise CodecError(f"the value's layout does not fit its parcel of {size} bytes: {fault}")
    offsets, sizes = zip(*spans)

    def mapped(fd: int, size: int) -> mmap.mmap:
        return mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)

    return _guarded(lambda _: _built(fd, size, offsets, sizes, n_oob, mapped), None, "the result", "here")


def _built(fd: int, size: int, offsets, sizes, n_oob: int, mapped):
    """The object of an open parcel's pickle, buffers and blobs (`pack`'s layout): the
    blobs read into bytes of their own, the buffers views of ``mapped(fd, size)``."""
    blobs = [parcels.read(fd, o, n) for o, n in zip(offsets[1 + n_oob:], sizes[1 + n_oob:])]
    if not n_oob:
        return _load_parts(parcels.read(fd, offsets[0], sizes[0]), (), blobs)
    view = memoryview(mapped(fd, size))
    stream = view[offsets[0] : offsets[0] + sizes[0]]
    buffers = [view[o : o + n] for o, n in zip(offsets[1 : 1 + n_oob], sizes[1 : 1 + n_oob])]
    return _load_parts(stream, buffers, blobs)


def _adopted(name: str, offsets, sizes, n_oob: int):
    """The object a lent parcel holds, built over the parcel itself: its out-of-band
    buffers are views of a shared writable mapping of it, which the objects built over
    them own (no copy: the worker's write was the one; an array's base is the mapping);
    its blobs are read into bytes of their own (a `bytes` owns its memory). The parcel
    goes back to its writer (`parcels.give_back`: it writes into it again only then) once
    the mapping is gone, when the last object built over it is: never while an object
    still shows it. Until then its name stays in /dev/shm, as the value's memory (a
    teardown's sweep removes the name, never the memory: the mapping stays valid and the
    give-back finds nothing). With no buffer, or no mapping to be had (the guard reports
    why), nothing shows it and it goes back at once."""
    fd, size = parcels.open_fd(name, take=False, writable=True)
    mm = None
    try:
        if n_oob:
            mm = parcels.populated(fd, size)
            weakref.finalize(mm, _give_back_from, os.getpid(), name)
        return _built(fd, size, offsets, sizes, n_oob, lambda _fd, _size: mm)
    finally:
        os.close(fd)
        if mm is None:
            parcels.give_back(name)


def _give_back_from(pid: int, name: str) -> None:
    """Give the parcel `name` back, from the process that built a value over it (`pid`)
    only: a child forked meanwhile holds a copy of the value and of this finalizer, and
    dropping its copy (or exiting) must not hand back a parcel its parent's value shows."""
    if os.getpid() == pid:
        parcels.give_back(name)


def _guarded(action, arg, what: str, where: str | None):
    """THE guard: `action(arg)` (pickling `arg` when `where` is None, else unpickling it
    `where`) with recursion bounded; whatever it raises becomes a CodecError. The cause
    is not chained: it is the unit's code and objects, and only its description leaves."""
    try:
        if _capped or sys.getrecursionlimit() > MAX_DEPTH:
            return _under_cap(action, arg)
        return action(arg)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and the like too: it is the unit's failure
        why = describe(exc)
    raise CodecError(f"{what} cannot be {'pickled' if where is None else 'unpickled ' + where}: {why}")


_cap_lock = threading.Lock()
_capped = 0  # guards running under the lowered limit
_limit_before = 0  # the limit to give back when the last of them ends


def _under_cap(action, arg):
    """`action(arg)` with the recursion limit lowered to MAX_DEPTH. The limit is the
    interpreter's, so a thread of this process recursing deeper meanwhile gets a
    RecursionError: only a process that raised the limit past MAX_DEPTH pays that."""
    global _capped, _limit_before
    with _cap_lock:
        if not _capped:
            _limit_before = sys.getrecursionlimit()
            sys.setrecursionlimit(min(_limit_before, MAX_DEPTH))
        _capped += 1
    try:
        return action(arg)
    finally:
        with _cap_lock:
            _capped -= 1
            if not _capped:
                sys.setrecursionlimit(_limit_before)


def describe(exc: BaseException) -> str:
    """``Type: text`` of an exception, whatever its text does (raise, exit, recurse, run long)."""
    text = safe_str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def safe_str(obj, limit: int = MAX_WHY_CHARS) -> str:
    """str(obj), cut to `limit` characters; a placeholder when str() raises (anything)."""
    try:
        text = str.__str__(str(obj))  # a str subclass's own methods never run later
    except BaseException:  # noqa: BLE001
        return f"(the text of a {type(obj).__name__} cannot be read)"
    return text if len(text) <= limit else text[:limit] + "..."


def error_parts(traceback_text: str, exc: BaseException) -> tuple[str, bytes | None]:
    """A handler's exception as it crosses back: (its traceback text, cut to
    MAX_DETAIL_CHARS; the exception pickled, or None when it cannot be pickled or is
    over MAX_ERROR_BYTES, and then the text says so first)."""
    text = clip_detail(traceback_text)
    try:
        raw = dumps(exc, "the handler's exception")
    except CodecError as err:
        return f"{err}\n{text}", None
    if len(raw) > MAX_ERROR_BYTES:
        return f"the handler's exception is {len(raw)} bytes pickled, over {MAX_ERROR_BYTES}; its text:\n{text}", None
    return text, raw


def handler_error(text: str | None, raw: bytes | None, relay: bool = False) -> tuple[str | None, object]:
    """(detail, original exception) of a handler error from its `error_parts`: the
    exception rebuilt here, None (and the detail says why first) when it cannot be.
    ``relay``: kept pickled (`_Pickled`), for fleetd to pass to its client."""
    if raw is None:
        return text, None
    if relay:
        return text, _Pickled(bytes(raw))
    try:
        return text, loads(raw, "the handler's exception")
    except CodecError as err:
        return (f"{err}\n{text}" if text else str(err)), None


class _Pickled:
    """Bytes pickled at one end for the other: a remote client's payload (the worker
    unpickles it) or a worker's value relayed by fleetd (its client unpickles it).

    (The worker recognises it by this class name.)"""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def pieces(self) -> list:
        """The pickled bytes as buffers to write one after the other (here, one: `data`)."""
        return [self.data]

    def release(self) -> None:
        """Done with the bytes (nothing to let go here; `_InParcel` closes its parcel)."""

    def __reduce__(self):
        data = self.data
        if type(data) is not bytes:
            # A mapping fleetd received (a client's memfd): out of band when large, so its
            # bytes are copied once, into the parcel, never into the pickle first.
            data = pickle.PickleBuffer(data)
        return (_Pickled, (data,))

    def load(self, what: str = "the value", where: str = "here"):
        """The object, unpickled under the guard (CodecError if it cannot be)."""
        return loads(self.data, what, where)


#: Whether a value holds a `bytes` of OOB_MIN bytes or more: itself, or in the tuples,
#: lists, dicts (values) and map chunks (`Calls`: its calls' arguments) of its first
#: SCAN_DEPTH levels of at most SCAN_LEN items each (a call's arguments, a task body, a
#: chunk, a result); deeper, or in longer containers, one stays in band. It runs on every
#: submit, so it is C (native/fleet_codec.c, where the rule is written out): ~4% of the
#: Executor's submit throughput went to the same walk in Python.
_scan = BlobScan(OOB_MIN, SCAN_LEN, SCAN_DEPTH, _Pickled, Calls)
_holds_blob = _scan.holds
#: Whether a value is small atoms alone (None, bool, int, float, complex, str and bytes
#: under OOB_MIN) in the tuples, lists and dicts of the same first levels: `_pickled`
#: pickles it as it is, with no guard, no look for buffers and no staging (a call by name
#: of a few small arguments, most results). The same C walk (native/fleet_codec.c):
#: in Python the look would cost what it saves.
_plain = _scan.plain
#: Values `_pickled` pickles as they are, with no look: no buffer or `bytes` in them to set
#: aside, and none can fail to pickle (a no-op's None, a number, a string: most small results)
_ATOMS = frozenset((type(None), bool, int, float, complex, str))


class _Laid(_Pickled):
    """A service-mode client's payload as its client laid it out in its memfd (`lay_out`):
    its pickle, then its out-of-band buffers, then its blobs, each at its span, in fleetd's
    writable private mapping of the memfd (`data`, the whole of it), with the memfd's
    descriptor (`fd`). Packed into a task, each part is a buffer of its own (`__reduce__`),
    out of band: fleetd hands the memfd itself to the worker (`_handed_task`), which builds
    the object over its mapping of it (`_from_parts`), its arrays without a copy of their
    own; where it cannot be handed, the parts are copied once into the task's parcel.
    fleetd never reads the pickle: it only cuts the memfd where the client said
    (`SubmitOp` checked the spans)."""

    __slots__ = ("spans", "n_oob", "fd")

    def __init__(self, data, spans, n_oob: int, fd: int = -1):
        super().__init__(data)
        self.spans, self.n_oob = spans, n_oob
        self.fd = fd  # the memfd's descriptor, fleetd's until its call ends (-1: none kept)

    def __reduce__(self):
        parts = [pickle.PickleBuffer(self.data[o : o + n]) for o, n in self.spans]
        n_oob = self.n_oob
        return (_from_parts, (parts[0], parts[1 : 1 + n_oob], parts[1 + n_oob:]))


def lay_out(value, what: str) -> tuple[list, list, int]:
    """`value` laid out for a memfd of a service-mode client's payload, as `pack` lays out a
    parcel: (the pieces to write one after the other, padding between them included, each
    part's ``[offset, bytes]``, how many are out-of-band buffers). Its large buffers and
    `bytes` are pieces of their own, views of the caller's objects, so writing the pieces
    out is their one copy; they must not change until then. Raises CodecError."""
    if _plain(value):  # small atoms alone (most calls): one pickle, nothing to set aside or to fail
        data, aside, blobs = pickle.dumps(value, protocol=5), (), ()
    else:
        data, aside, blobs = _set_aside(value, what)
    parts = [data, *aside, *blobs]
    sizes = [memoryview(p).nbytes for p in parts]
    offsets, _total = parcels.layout(sizes)
    pieces, at = [], 0
    for part, offset, size in zip(parts, offsets, sizes):
        if offset > at:
            pieces.append(bytes(offset - at))
        pieces.append(part)
        at = offset + size
    return pieces, [[o, n] for o, n in zip(offsets, sizes)], len(aside)


#: What multiprocessing says of an object only its children may inherit (a Queue, a Lock,
#: a Pipe end: `multiprocessing.context.assert_spawning`) ...
_INHERITED_ONLY = "through inheritance"
#: ... and what reaches a fleet worker instead.
NOT_CHILDREN = ("fleet's workers are not multiprocessing children, so they inherit nothing from this process: "
                "pass a multiprocessing.Manager() proxy (manager.Queue(), manager.Lock(), ...) instead")


def unpicklable(exc: CodecError) -> PayloadUnpicklable:
    """The refusal of something a unit brought that cannot be pickled, saying what to pass
    instead when it is an object only multiprocessing children inherit."""
    text = str(exc)
    return PayloadUnpicklable(f"{text}; {NOT_CHILDREN}" if _INHERITED_ONLY in text else text)


def task_body(role: str, payload, key, lane, request_id, *, pickled_payload: bytes | None, limit: int | None) -> bytes:
    """The pickled body of one task, inline whatever its size (`pack_task` without a parcel)."""
    return pack_task(role, payload, key, lane, request_id, pickled_payload=pickled_payload, limit=limit, fleet=None)[0]


def pack_task(role: str, payload, key, lane, request_id, *, pickled_payload: bytes | None, limit: int | None,
              fleet: str | None, inline_max: int = INLINE_MAX, room=None, block: bool = True,
              block_timeout: float | None = None, writer=None, handoff: bool = False) -> tuple[bytes, object, int]:
    """The body of one task, the name of the parcel it travels in beside the ring (None:
    inline) and the parcel's size in bytes (0: none). The parcel is the caller's to remove
    at the unit's outcome (`parcels.remove`), and its room to give back to `room`.

    ``handoff``: the fleet hands memfds to its workers (`fleet.shm.handoff`): a payload
    fleetd received in a memfd (`_Laid` with its descriptor) is not copied into a parcel;
    a `fleet.shm.handoff.Handed` takes the parcel's place (the caller's to close at the
    outcome; its bytes take room as a parcel's would).

    ``writer``: what writes a parcel (`pack`'s).
    ``room``: where a parcel of `n` bytes takes room before it is written (``room.take(n, what,
    block=, timeout=)`` may wait, or refuse: fleet.runtime.beside); given back here
    (``room.give(n)``) when the parcel is not made.

    Raises:
        PayloadUnpicklable: the payload (or key) cannot be pickled.
        PayloadTooLarge: the body is over `limit` bytes (limits.max_payload_bytes, when
            configured), over what `room` can ever hold, or /dev/shm has no room for it.
        QueueFull: `room` refused to wait for room.
    """
    if pickled_payload is not None:
        payload = pickled_payload if isinstance(pickled_payload, _Pickled) else _Pickled(pickled_payload)
    what = f"payload for role {role!r}"
    reserve = None  # made only for a parcel: most tasks go inline, and this runs on every submit
    try:
        if handoff and type(payload) is _Laid and payload.fd >= 0 and fleet is not None:
            reserve = _Reserve(what, limit, room, block, block_timeout)
            handed = _handed_task(payload, key, lane, request_id, reserve)
            if handed is not None:
                return handed
        task = (payload, key, lane, request_id)
        body = _relayed_inline(pickled_payload, task, fleet, inline_max)
        # an executor's chunk travels as its wire form (`Calls.wire`): by its function's name
        wire = (payload.wire, key, lane, request_id) if type(payload) is Calls else task
        if body is not None:
            parcel = None
        elif fleet is None:
            body, parcel = pack(wire, what, None, take=False)
        else:
            pickled = _pickled(wire, what, task)
            body, parcel = _inline(pickled, inline_max), None
            if body is None:
                if reserve is None:
                    reserve = _Reserve(what, limit, room, block, block_timeout)
                body, parcel = _parcelled(pickled, fleet, take=False, reserve=reserve, writer=writer, lend=False)
    except CodecError as exc:
        raise unpicklable(exc) from None
    except parcels.ParcelError as exc:
        if reserve is not None:
            reserve.give_back()
        raise PayloadTooLarge(f"{what}: {exc}") from None
    if parcel is None and limit is not None and len(body) > limit:
        raise PayloadTooLarge(f"{what} is {len(body)} bytes pickled; limits.max_payload_bytes is {limit}")
    return body, parcel, (reserve.bytes if parcel is not None else 0)


def _relayed_inline(pickled_payload, task: tuple, fleet: str | None, inline_max: int) -> bytes | None:
    """The body of `task` (``(payload, key, lane, request_id)``) when its payload is bytes
    a client pickled, nothing else travels beside them and they go inline (fleetd's common
    unit): pickled as it is, with no guard, no look for buffers and no staging, since
    bytes wrapped in `_Pickled` set nothing aside and cannot fail to pickle. None:
    `pack_task`'s whole path decides."""
    if type(pickled_payload) is not bytes or fleet is None or len(pickled_payload) >= inline_max \
            or task[1] is not None or task[2] is not None or task[3] is not None:
        return None
    body = pickle.dumps(task, protocol=5)
    return body if len(body) <= inline_max else None


class _Reserve:
    """`pack_task`'s ``reserve(n)`` for a task's parcel of `n` bytes: refused over `limit`
    (limits.max_payload_bytes), then room taken in `room` (which may wait or refuse:
    fleet.runtime.beside); `give_back` returns that room when the parcel is not made."""

    __slots__ = ("what", "limit", "room", "block", "timeout", "bytes", "_taken")

    def __init__(self, what: str, limit: int | None, room, block: bool, timeout: float | None):
        self.what, self.limit, self.room, self.block, self.timeout = what, limit, room, block, timeout
        self.bytes, self._taken = 0, False

    def __call__(self, n: int) -> None:
        if self.limit is not None and n > self.limit:
            raise PayloadTooLarge(f"{self.what} is {n} bytes pickled; limits.max_payload_bytes is {self.limit}")
        if self.room is not None:
            self.room.take(n, self.what, block=self.block, timeout=self.timeout)
            self._taken = True
        self.bytes = n

    def give_back(self) -> None:
        if self._taken:
            self._taken = False
            self.room.give(self.bytes)


def _handed_task(payload: _Laid, key, lane, request_id, reserve) -> tuple[bytes, object, int] | None:
    """A task whose payload stays in its client's memfd (`pack_task`'s ``handoff``): its
    body names the memfd's inode and carries the task's pickle with every part of the
    payload out of band, at its span in the memfd; the worker maps the memfd handed to it
    and loads the pickle over it (`_from_handed`). None when the task cannot go so (its
    buffers do not match the payload's parts, or the body would pass a ring message's
    bound): it is then packed into a parcel as any other."""
    from fleet.shm.handoff import Handed

    buffers: list = []
    stream = pickle.dumps((payload, key, lane, request_id), protocol=5, buffer_callback=buffers.append)
    if len(buffers) != len(payload.spans):
        return None
    size = memoryview(payload.data).nbytes
    fd = os.dup(payload.fd)  # the unit's own: fleetd's goes when its call ends
    try:
        handed = Handed(fd, size)
    except BaseException:
        os.close(fd)
        raise
    ref = bytes((PARCEL, _HANDED)) + pickle.dumps(
        (handed.ino, size, stream, [tuple(s) for s in payload.spans], payload.n_oob), protocol=5)
    try:
        if len(ref) > INLINE_MAX:
            handed.close()
            return None
        reserve(size)
    except BaseException:
        handed.close()
        raise
    return ref, handed, size


_ROUTE_LEN = struct.Struct("<I")


def with_route(body: bytes, route) -> bytes:
    """A task body carrying the provider route admission chose (sent with flag F_ROUTED).

    The route goes in front (its pickled length, then it), so the payload's bytes,
    pickled once at submit, are never pickled again when admission moves a unit.
    """
    raw = pickle.dumps(tuple(route), protocol=pickle.HIGHEST_PROTOCOL)
    return _ROUTE_LEN.pack(len(raw)) + raw + body


def split_route(body, where: str = "here"):
    """(route, the rest of the body) of a body made by `with_route` (CodecError if it cannot be read)."""
    from admission.route import Route

    route, rest = _after_route(body)
    return Route(*loads(route, "the route", where)), rest


def _after_route(body) -> tuple:
    """(the route's pickle, the rest of the body) of a body made by `with_route`."""
    (n,) = _ROUTE_LEN.unpack_from(body)
    start = _ROUTE_LEN.size
    return body[start : start + n], body[start + n :]


def refused_body(exc: Refused, raised_at: float | None = None) -> bytes:
    """The result body of a handler that raised fleet.Refused (status ST_REFUSED); its instant is
    the one the handler gave, else `raised_at` (when the worker caught it)."""
    at = exc.at if exc.at is not None else raised_at
    return pickle.dumps((exc.status, exc.message, exc.retry_after, at), protocol=pickle.HIGHEST_PROTOCOL)


def result_outcome(status: int, body, relay: bool = False):
    """(Outcome, value, original exception) from a result message's status and body.
    Never raises for what a unit brought: a body that cannot be decoded here is the
    unit's ResultError, naming why.

    ``relay``: a value (a chunk's too) and a handler's exception are kept as the
    worker's pickled bytes (`_Pickled`) for fleetd to pass to its client, never
    unpickled here."""
    try:
        return _outcome(status, body, relay)
    except CodecError as exc:
        return _result_error(exc)


#: What a solved result's body holds, by its status: a unit's value, or a chunk's values
#: (every item solved). The statuses `solved_outcome` decodes, and the names its errors give.
SOLVED_BODIES = {M.ST_SOLVED: "the result", M.ST_CHUNK: "the chunk's results"}


def solved_outcome(status: int, body, relay: bool = False):
    """`result_outcome` of a solved result (a status of `SOLVED_BODIES`: a unit's, or a
    chunk's whose every item solved), the loop's most common call: a value pickled in the
    ring is unpickled under the guard with no frame between (the loop takes each unit's
    result in Python: three frames fewer a unit). A parcel, or a value relayed to fleetd's
    client, takes `result_outcome`'s path."""
    if relay or not len(body) or body[0] == PARCEL:
        return result_outcome(status, body, relay)
    try:
        return _SOLVED, _guarded(pickle.loads, body, SOLVED_BODIES[status], "here"), None
    except CodecError as exc:
        return _result_error(exc)


def _result_error(exc: CodecError):
    """A result that cannot be decoded here: the unit's ResultError, naming why."""
    return Outcome(FAILED, Reason.RESULT_ERROR, str(exc)), None, None


#: What a chunk's status says of it (the worker sums up its items' outcomes).
_CHUNK_OUTCOMES = {
    M.ST_CHUNK: _SOLVED,
    M.ST_CHUNK_SUPPRESSED: Outcome(SUPPRESSED, None, "an item of the chunk was suppressed"),
    M.ST_CHUNK_FAILED: Outcome(FAILED, Reason.HANDLER_ERROR, "an item of the chunk failed"),
}


def _outcome(status: int, body, relay: bool):
    if status == M.ST_SOLVED:
        what = SOLVED_BODIES[status]
        return _SOLVED, (_relayed(body, what) if relay else loads(body, what)), None
    if status in _CHUNK_OUTCOMES:
        what = SOLVED_BODIES[M.ST_CHUNK]  # a chunk's body is its values whatever its items' outcomes
        chunk = _relayed(body, what) if relay else loads(body, what)
        return _CHUNK_OUTCOMES[status], chunk, None
    if status == M.ST_SUPPRESSED:
        return Outcome(SUPPRESSED, None, _text(body)), None, None
    if status == M.ST_HANDLER_ERROR:
        text, original = handler_error(*loads(body, "the handler's error"), relay=relay)
        return Outcome(FAILED, Reason.HANDLER_ERROR, text), None, original
    if status == M.ST_RESULT_ERROR:
        return Outcome(FAILED, Reason.RESULT_ERROR, _text(body)), None, None
    if status == M.ST_REFUSED:
        refusal = Refused(*loads(body, "the refusal"))
        return Outcome(FAILED, Reason.REFUSED, str(refusal)), None, refusal
    if status == M.ST_HELD_AT_CLOSE:
        return Outcome(FAILED, Reason.SHUTDOWN, _text(body)), None, None
    if status in (M.ST_START_REFUSED, M.ST_COMPLETION_REFUSED):
        return Outcome(FAILED, Reason.FSM_REFUSED, _text(body)), None, None
    return Outcome(FAILED, Reason.LANE_DEATH, _text(body)), None, None


def _relayed(body, what: str) -> _Pickled:
    """A value kept pickled for fleetd's client, never unpickled here. One that came beside
    the ring (a parcel) is only opened here (taken, or held while lent): its bytes stay in
    the parcel until fleetd writes them out for the client (`_InParcel`), so the loop that
    took the result never copies a large value."""
    if not (len(body) and body[0] == PARCEL):
        return _Pickled(bytes(body))
    name, offsets, sizes, n_oob = pickle.loads(body[2:])
    lent = body[1] == _LEND
    try:
        fd, size = parcels.open_fd(name, take=not lent)
    except parcels.ParcelError as exc:
        raise CodecError(f"{what} cannot be read: {exc}") from None
    return _InParcel(fd, size, name if lent else None, list(zip(offsets, sizes)), n_oob)


class _InParcel(_Pickled):
    """A relayed value whose bytes are still in the parcel its worker wrote, open (`_relayed`).

    `pieces` maps the parcel and gives the value's pickled bytes as views of it: its pickle
    alone, or, with out-of-band buffers or blobs, a pickle of `_Parts` composed around them
    (the pickler hands large buffers to its file as they are, so nothing large is copied to
    compose it), which rebuilds the object at the client's end. Whoever writes them out (a
    memfd: one copy, by the kernel, from the parcel's pages) then calls `release`, which
    unmaps it. `data` is the same bytes joined, for a client that takes them base64. The
    parcel stays open while the value lives, as a value read out would stay in memory: a
    retry of its submit (the same request id) is answered with it again. It is closed, and a
    lent one given back to its writer, when the value is dropped (`close`), which for most
    is as soon as its outcome is written out."""

    __slots__ = ("_fd", "_size", "_lent", "_spans", "_n_oob", "_mm", "_pieces")

    def __init__(self, fd: int, size: int, lent: str | None, spans: list, n_oob: int):
        self._fd, self._size, self._lent, self._spans, self._n_oob = fd, size, lent, spans, n_oob
        self._mm = self._pieces = None

    def pieces(self) -> list:
        if self._pieces is None:
            if self._fd < 0:
                raise CodecError("a relayed value's parcel was closed before it was read")
            # Private and writable (never written: its pages are the parcel's, copied only
            # on a write) so the out-of-band buffers pickle as bytearrays: the client's
            # arrays are built over them writable, without a copy of its own.
            self._mm = mmap.mmap(self._fd, self._size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
            view = memoryview(self._mm)
            spans = [view[o : o + n] for o, n in self._spans]
            if len(spans) == 1:
                self._pieces = [spans[0].toreadonly()]
            else:
                n_oob, out = self._n_oob, _Pieces()
                pickle.Pickler(out, protocol=5).dump(_Parts(
                    pickle.PickleBuffer(spans[0].toreadonly()),
                    [pickle.PickleBuffer(b) for b in spans[1 : 1 + n_oob]],
                    [pickle.PickleBuffer(b.toreadonly()) for b in spans[1 + n_oob:]]))
                self._pieces = out.pieces
        return self._pieces

    def reopened(self) -> tuple[int, int, list, int] | None:
        """A new read-only descriptor of the parcel, for a client to build the value over
        (`value_in_parcel`) with no copy on the way: ``(fd, size, spans, n_oob)``, each span
        a part's ``(offset, bytes)``,
        the descriptor the caller's. None for a lent parcel (its writer writes it again once
        given back) or where it cannot be reopened (no /proc): the bytes are then copied out
        (`pieces`)."""
        if self._lent is not None or self._fd < 0:
            return None
        try:  # its name is gone (taken): the process's own descriptor is the way back to it
            fd = os.open(f"/proc/self/fd/{self._fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        return fd, self._size, self._spans, self._n_oob

    @property
    def data(self) -> bytes:
        try:
            return b"".join(self.pieces())
        finally:
            self.release()

    def release(self) -> None:
        self._pieces = None
        mm, self._mm = self._mm, None
        if mm is not None:
            segments.close_quietly(mm)  # a caller's view of it still alive: unmapped with that view

    def close(self) -> None:
        """Let the parcel go: unmapped and closed, a lent one given back to its writer."""
        self.release()
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
            if self._lent is not None:
                parcels.give_back(self._lent)

    def __del__(self):
        self.close()


class _Pieces:
    """A pickler's file that keeps what it is given, in order, without copying: its small
    writes (frames) as bytes, its large buffers as views of where they are."""

    __slots__ = ("pieces",)

    def __init__(self):
        self.pieces: list = []

    def write(self, data) -> int:
        view = memoryview(data)
        self.pieces.append(data if type(data) is bytes else view)
        return view.nbytes


class _Parts:
    """A pickle, its out-of-band buffers and its blobs, as one in-band pickle (for a client of fleetd)."""

    __slots__ = ("stream", "buffers", "blobs")

    def __init__(self, stream: bytes, buffers: list, blobs: list = ()):
        self.stream, self.buffers, self.blobs = stream, buffers, list(blobs)

    def __reduce__(self):
        return _from_parts, (self.stream, self.buffers, self.blobs)


def _from_parts(stream: bytes, buffers: list, blobs: list = ()):
    """The object `_Parts` (or a client's laid-out payload, `_Laid`) carries. Its buffers as
    they came when writable (an array over one is writable: fleetd's bytearrays at a client,
    a worker's views of its task parcel's private mapping), else copied into bytearrays; its
    blobs as bytes (a view of a parcel is read into bytes of its own)."""
    return _load_parts(stream, [b if type(b) is bytearray or (type(b) is memoryview and not b.readonly)
                                else bytearray(b) for b in buffers],
                       [b if type(b) is bytes else bytes(b) for b in blobs])


def clip_detail(detail: str | None) -> str | None:
    """A failure's text cut to its last `MAX_DETAIL_CHARS` characters (a traceback ends with what matters)."""
    if detail is None or len(detail) <= MAX_DETAIL_CHARS:
        return detail
    return "[... cut ...]\n" + detail[-MAX_DETAIL_CHARS:]


def _text(body) -> str:
    return bytes(body).decode(errors="replace")
