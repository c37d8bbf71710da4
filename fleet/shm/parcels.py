"""Parcels: what does not fit a ring travels beside it, one POSIX shared-memory segment per message.

A message body too large for its ring (a big pickle, or a pickle with large out-of-band
buffers: `fleet.worker.codec.pack`) is written once into a parcel, and the ring message
carries only the parcel's name and layout. The receiver maps it and rebuilds the object
over the mapping: an array's memory *is* the mapping, so the mapping lives exactly as
long as the object does (no view into memory that is reused later).

Names. ``/fleet.<fleet>.p<creator pid>.<16 random hex digits>``: under the fleet's own
prefix (fleet names hold no ``.``, so no fleet's table or data segment is named like a
parcel), made with ``O_CREAT|O_EXCL|O_NOFOLLOW`` mode 0600 (no one can stand there first,
and only the owner may open it), its random part unpredictable. A receiver opens only a
name of that shape (no path can be smuggled in a ring message) and a regular file of its
own uid.

Ownership, one owner per parcel, so every path reclaims it:

* A task's parcel is made by the supervisor's process at submit and belongs to the
  unit: the worker maps it privately (copy-on-write: the array it gets is writable, and a
  run again after a refusal reads the payload as it was sent) and never removes it; the
  supervisor removes it at the unit's outcome, whatever it is (solved, failed, cancelled,
  timed out, its worker killed, shut down).
* A result's parcel is made by the worker; the supervisor takes it: removes its name as
  it maps it, so it is freed with the object built over it. A worker that dies before its
  result message reaches the supervisor leaves parcels named with its pid: the supervisor
  removes them once it has read what that worker sent (`sweep`, with the pid).
* A supervisor killed before its teardown leaves its fleet's parcels: the next boot of the
  fleet's name removes them before it makes any (`sweep`), and an Executor (whose names are
  made per process, never booted again) removes those of fleets that have no table any more
  (`sweep_orphans`).

Warm parcels (`Warm`). A fresh segment's every page is allocated by the kernel as it is
written (a fault per 4 KiB page, and the page freed again at the outcome): on this kind of
host that costs more than the copy itself (a write into a fresh segment moves ~3 GB/s, into
mapped pages ~8 GB/s). So the supervisor keeps its task parcels mapped and, once a unit
is solved, renames its parcel ``/fleet.<fleet>.w<pid>.<hex>`` (warm: free, never opened by
a receiver) and writes the next payload into its pages under a fresh parcel name. That is
safe because the worker gives its mapping back before it sends the result
(`fleet.worker.codec.lending`): it unmaps it, or, when the unit's code kept an object built
over it, first makes every page of its private mapping its own (copy-on-write), so nothing
the worker holds ever sees the next payload. Any other outcome (failed, cancelled, timed
out, a worker killed) removes the parcel as before. Warm parcels are swept with the rest.

This module imports no numpy.
"""
from __future__ import annotations

import mmap
import os
import re
import stat
import threading
import time

from fleet._native import ffi, lib
from fleet.rules.errors import FleetError
from fleet.shm.segments import OWNER_ONLY, SHM_DIR

#: Between a fleet's name and the creator's pid in a parcel's name.
MARK = ".p"
#: Where each part of a parcel starts: an array rebuilt over it is aligned for any dtype.
ALIGN = 64
#: Most bytes one write(2) moves on Linux.
_WRITE_MAX = 0x7FFFF000
#: Between a fleet's name and the creator's pid in a warm (free) parcel's name.
WARM_MARK = ".w"
_NAME_RE = re.compile(r"fleet\.([^./~]+)\.p([0-9]+)\.[0-9a-f]{16}")
#: A parcel's name or a warm one's: what the sweeps remove.
_OURS_RE = re.compile(r"fleet\.([^./~]+)\.([pw])[0-9]+\.[0-9a-f]{16}")
#: From this size a copy or a prefault runs in C with the GIL released, so that the other
#: threads of the process (a supervisor's loop, fleetd's control thread) run meanwhile.
#: Below it, it keeps the GIL: giving it up costs the copying thread up to a switch
#: interval (5 ms) to get it back beside a busy thread, where holding it costs the others
#: at most ~0.5 ms (a copy of 8 MiB here: 0.5 ms held against 5.4 ms released; of 1 MiB
#: 19 us against 103 us).
GIL_FREE_MIN = 8 << 20
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
#: Most bytes of warm parcels a fleet keeps free (and a cap's quarter when that is less).
WARM_MAX = 1 << 30
#: A warm parcel free this long is let go at the next write or outcome (an idle fleet
#: does not hold the pages of a burst long past it).
WARM_IDLE_S = 60.0


class ParcelError(FleetError):
    """A parcel cannot be made or opened (the text names it, its size and why)."""


def name_for(fleet: str, pid: int | None = None) -> str:
    """A fresh parcel name of `fleet` for the creator `pid` (default: this process), without the '/'."""
    return f"fleet.{fleet}{MARK}{os.getpid() if pid is None else pid}.{os.urandom(8).hex()}"


def _path(name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise ParcelError(f"{name!r} is not a parcel's name")
    return os.path.join(SHM_DIR, name)


def layout(sizes) -> tuple[list[int], int]:
    """(offset of each part, total size): parts one after another, each at a multiple of ALIGN."""
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // ALIGN) * ALIGN
    return offsets, end


def spans_fault(spans, n_oob: int, size: int, *, spans_name: str, oob_name: str, file: str) -> str | None:
    """What is wrong with a parcel's layout received from a peer (each part's ``(offset,
    bytes)``: the pickle, then ``n_oob`` out-of-band buffers, then blobs), in a file of
    ``size`` bytes: a part before the end of the one before it or past the file's end, or
    a count of buffers out of range; None when nothing is. The message names the part by
    ``spans_name`` and the count by ``oob_name``; ``file`` names the file."""
    end = 0
    for i, (offset, nbytes) in enumerate(spans):
        if offset < end or offset + nbytes > size:
            return (f"{spans_name}[{i}] [{offset}, {nbytes}] must follow the part before it (at {end}) and end "
                    f"within {file}'s {size} bytes")
        end = offset + nbytes
    if not 0 <= n_oob < len(spans):
        return f"{oob_name} must be 0-{len(spans) - 1} (the parts but the pickle), got {n_oob}"
    return None


def _bytes_views(parts) -> list[memoryview]:
    return [p if isinstance(p, memoryview) and p.format == "B" and p.ndim == 1 else memoryview(p).cast("B")
            for p in parts]


def write(fleet: str, parts: list, *, keep_fd: bool = False, size: int | None = None):
    """A new parcel of `fleet` holding `parts` (buffers) at `layout`'s offsets: (its name,
    the offsets). Each byte is copied once, by the kernel, into the segment. Raises
    ParcelError (nothing left behind) when it cannot be made: /dev/shm full, no fds.
    ``size``: the segment's size when larger than the parts need (a warm parcel's);
    ``keep_fd``: the open descriptor is returned third, the caller's to close."""
    views = _bytes_views(parts)
    offsets, total = layout(v.nbytes for v in views)
    total = max(total, size or 0)
    for _ in range(8):
        name = name_for(fleet)
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         OWNER_ONLY)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise ParcelError(f"cannot make a parcel of {total} bytes in {SHM_DIR}: {exc.strerror}") from None
    else:
        raise ParcelError(f"no free parcel name for fleet {fleet!r} in {SHM_DIR}")
    try:
        os.fchmod(fd, OWNER_ONLY)  # exactly, whatever the umask took
        os.ftruncate(fd, total)
        for view, off in zip(views, offsets):
            done = 0
            while done < view.nbytes:
                done += os.pwrite(fd, view[done : done + _WRITE_MAX], off + done)
    except OSError as exc:
        os.close(fd)
        remove(name)
        raise ParcelError(f"cannot write a parcel of {total} bytes in {SHM_DIR}: {exc.strerror}") from None
    if keep_fd:
        return name, offsets, fd
    os.close(fd)
    return name, offsets


def open_(name: str, *, take: bool) -> mmap.mmap:
    """A writable mapping of the parcel `name`. ``take``: the receiver owns it from here
    (a result): its name is removed now, and the mapping is shared (nobody else maps it).
    Else (a task, which its supervisor owns) the mapping is private, copy-on-write.
    Raises ParcelError when it is gone, not a regular file, or not this uid's."""
    fd, size = open_fd(name, take=take)
    try:
        return map_(fd, size, take=take)
    finally:
        os.close(fd)


def open_fd(name: str, *, take: bool, writable: bool = False) -> tuple[int, int]:
    """(an open descriptor, the size) of the parcel `name`, checked as `open_` says; with
    ``take`` its name is removed now. Opened for writing with ``take`` or ``writable`` (a
    shared writable mapping needs it), else read-only. The descriptor is the caller's to close."""
    path = _path(name)
    try:
        fd = os.open(path, (os.O_RDWR if take or writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC)
    except OSError as exc:
        raise ParcelError(f"cannot open the parcel {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise ParcelError(f"{path} is not a parcel of uid {os.geteuid()}")
        if take:
            remove(name)
        if st.st_size == 0:
            raise ParcelError(f"the parcel {path} is empty")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def map_(fd: int, size: int, *, take: bool) -> mmap.mmap:
    """A writable mapping of an open parcel (`open_fd`): shared when taken, else private."""
    # Shared: its pages mapped at once (no fault per page later). Private: left to fault
    # in as read, since populating a private writable mapping copies every page (COW).
    if take:
        return populated(fd, size)
    return mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)


def populated(fd: int, size: int) -> mmap.mmap:
    """A shared writable mapping of `size` bytes of `fd` with every page mapped now, not
    faulted one by one at its first touch (a write into a fresh mapping of 512 MiB: ~235 ms,
    against ~25 ms into one populated). MAP_POPULATE does it in mmap's constructor, which
    holds the GIL meanwhile (~60 ms for 512 MiB here, when every other thread of the
    process waits: a supervisor's loop, fleetd's control thread); from `GIL_FREE_MIN`, a
    read of one byte per page in C (`fleet_prefault`, called with the GIL released) does
    it while they run."""
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    if size < GIL_FREE_MIN:
        return mmap.mmap(fd, size, mmap.MAP_SHARED | _POPULATE, prot)
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
    at = ffi.from_buffer(mm)
    try:
        lib.fleet_prefault(at, size, mmap.PAGESIZE)
    finally:
        ffi.release(at)
    return mm


def read(fd: int, offset: int, n: int) -> bytes:
    """`n` bytes of an open parcel from `offset`, as a new bytes object: one copy, by the
    kernel, with no mapping to fault in (what an immutable bytes needs: its own memory)."""
    chunks, done = [], 0
    while done < n:
        got = os.pread(fd, min(n - done, _WRITE_MAX), offset + done)
        if not got:
            raise ParcelError(f"a parcel ends {n - done} bytes short of its part")
        chunks.append(got)
        done += len(got)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def privatize(mm: mmap.mmap) -> None:
    """Make every page of a private mapping this process's own (a write to each copies it,
    copy-on-write): what the mapping shows no longer follows the file."""
    step = mmap.PAGESIZE
    with memoryview(mm) as view:
        view[::step] = bytes(view[::step])


def remove(name: str) -> bool:
    """Remove a parcel's name (its mappings stay valid); False when it was gone already."""
    try:
        os.unlink(_path(name))
        return True
    except FileNotFoundError:
        return False


def _entries() -> list[str]:
    try:
        return os.listdir(SHM_DIR)
    except OSError:
        return []


def _remove_ours(entries) -> list[str]:
    removed = []
    uid = os.geteuid()
    for entry in entries:
        path = os.path.join(SHM_DIR, entry)
        try:
            if os.lstat(path).st_uid == uid:
                os.unlink(path)
                removed.append(entry)
        except FileNotFoundError:
            continue
    return removed


def sweep(fleet: str, pid: int | None = None) -> list[str]:
    """Remove this uid's parcels of `fleet` (only those `pid` made, when given): the fleet's
    boot and teardown, and a dead worker's. Returns the names removed."""
    tail = "" if pid is None else f"{pid}."
    prefixes = (f"fleet.{fleet}{MARK}{tail}", f"fleet.{fleet}{WARM_MARK}{tail}")
    return _remove_ours(e for e in _entries() if e.startswith(prefixes) and _OURS_RE.fullmatch(e))


def sweep_orphans(prefix: str) -> list[str]:
    """Remove this uid's parcels of fleets named `prefix`... that have no table segment any
    more (``/fleet.<name>``, or an alternate of it): their supervisor is gone, and no boot
    takes a per-process name again. A live fleet's table exists before its first parcel."""
    entries = _entries()
    tables = {e.partition("~")[0] for e in entries if not _OURS_RE.fullmatch(e)}
    orphans = []
    for entry in entries:
        match = _OURS_RE.fullmatch(entry)
        if match and match.group(1).startswith(prefix) and f"fleet.{match.group(1)}" not in tables:
            orphans.append(entry)
    return _remove_ours(orphans)


def count(fleet: str | None = None, *, warm: bool = False) -> int:
    """Parcels in /dev/shm (of `fleet`, when given): for tests and status. ``warm``: the
    warm (free) ones instead of those in use."""
    kind = "w" if warm else "p"
    matches = (_OURS_RE.fullmatch(e) for e in _entries())
    return sum(1 for m in matches if m and m.group(2) == kind and (fleet is None or m.group(1) == fleet))


def _warm_size(total: int) -> int:
    """A warm parcel's size for `total` bytes: rounded up to an eighth of its power of two
    (at most an eighth more), so payloads of about one size take each other's parcels."""
    granule = max(mmap.PAGESIZE, 1 << max(0, total.bit_length() - 4))
    return -(-total // granule) * granule


def _copy_into(mm, offset: int, view: memoryview) -> None:
    """`view`'s bytes into `mm` at `offset`: from `GIL_FREE_MIN` in C with the GIL released
    (`fleet_copy`: other threads run meanwhile, the supervisor's loop may share this
    process), below it a memoryview's copy, the GIL held."""
    if view.nbytes >= GIL_FREE_MIN:
        copy(mm, offset, view)
    else:
        with memoryview(mm) as whole:
            whole[offset : offset + view.nbytes] = view


def copy(dst, offset: int, src) -> None:
    """All of buffer `src` into writable buffer `dst` at `offset`, in C with the GIL released."""
    to, of = ffi.from_buffer(dst, require_writable=True), ffi.from_buffer(src)
    try:
        n = len(of)
        if offset < 0 or offset + n > len(to):
            raise ValueError(f"{n} bytes at offset {offset} do not fit a buffer of {len(to)}")
        lib.fleet_copy(to + offset, of, n)
    finally:
        ffi.release(to)
        ffi.release(of)


class Warm:
    """The warm parcels of one fleet's tasks (see the module's text): each kept mapped here,
    free under a warm name or lent to one unit under a parcel's; at most `keep` bytes free.
    Any thread writes; the loop's thread ends them. One lock; the copies run outside it."""

    def __init__(self, fleet: str, keep: int = WARM_MAX, clock=time.monotonic):
        self._fleet, self._keep, self._clock = fleet, keep, clock
        self._free: list[tuple[int, str, mmap.mmap, float]] = []  # (size, warm name, mapping, freed at)
        self._lent: dict[str, tuple[int, mmap.mmap | None]] = {}  # parcel name -> (size, mapping or None)
        self._lock = threading.Lock()
        self._closed = False

    def write(self, parts: list) -> tuple[str, list[int]]:
        """A parcel holding `parts`, as `write` makes one: into a free warm parcel's pages
        when one fits, else a new one (then kept mapped for the next). Raises ParcelError."""
        views = _bytes_views(parts)
        offsets, total = layout(v.nbytes for v in views)
        warm = self._take(total)
        if warm is not None:
            size, warm_name, mm = warm
            name = name_for(self._fleet)
            try:
                os.rename(os.path.join(SHM_DIR, warm_name), os.path.join(SHM_DIR, name))
            except OSError:  # swept meanwhile (a teardown): a new one instead
                mm.close()
            else:
                with self._lock:
                    self._lent[name] = (size, mm)
                for view, off in zip(views, offsets):
                    _copy_into(mm, off, view)
                return name, offsets
        size = _warm_size(total)
        name, offsets, fd = write(self._fleet, views, keep_fd=True, size=size)
        try:
            # its pages mapped now (~2 ms per 64 MiB), not faulted one by one at its next write
            mm = populated(fd, size)
        except OSError:
            mm = None  # no room for a mapping: the parcel serves once, as a plain one
        finally:
            os.close(fd)
        with self._lock:
            self._lent[name] = (size, mm)
        return name, offsets

    def _take(self, total: int):
        """The smallest free warm parcel of at least `total` bytes and at most twice that."""
        with self._lock:
            self._trim()
            best = None
            for i, (size, _name, _mm, _at) in enumerate(self._free):
                if total <= size <= 2 * total + mmap.PAGESIZE and (best is None or size < self._free[best][0]):
                    best = i
            if best is None:
                return None
            size, name, mm, _at = self._free.pop(best)
            return size, name, mm

    def end(self, name: str, reuse: bool) -> None:
        """The unit lent `name` has ended: with `reuse` (its worker gave its mapping back
        before it answered) the parcel goes back free, warm (the longest free let go when
        the keep would be passed); else it is removed."""
        gone, kept = [], False
        with self._lock:
            size, mm = self._lent.pop(name, (0, None))
            self._trim()
            if reuse and mm is not None and not self._closed and size <= self._keep:
                warm = _warm_name(name)
                try:
                    os.rename(os.path.join(SHM_DIR, name), os.path.join(SHM_DIR, warm))
                except OSError:
                    pass  # swept meanwhile: let it go
                else:
                    # room made by letting the longest free go: the next payloads are likelier
                    # the size of the last ones
                    while self._free and size + self._free_bytes() > self._keep:
                        gone.append(self._free.pop(0))
                    self._free.append((size, warm, mm, self._clock()))
                    kept = True
        for _size, old, old_mm, _at in gone:
            _unlink(old)
            old_mm.close()
        if not kept:
            remove(name)
            if mm is not None:
                mm.close()

    def _free_bytes(self) -> int:
        return sum(size for size, *_ in self._free)

    def _trim(self) -> None:
        """Let go the warm parcels free for WARM_IDLE_S or more (under the lock)."""
        if not self._free:
            return
        now = self._clock()
        old = [w for w in self._free if now - w[3] >= WARM_IDLE_S]
        if old:
            self._free = [w for w in self._free if now - w[3] < WARM_IDLE_S]
            for _size, warm, mm, _at in old:
                _unlink(warm)
                mm.close()

    def free_bytes(self) -> int:
        """Bytes of warm parcels held free now."""
        with self._lock:
            return self._free_bytes()

    def close(self) -> None:
        """Let every warm parcel go, free or lent (the fleet's teardown: its units are over)."""
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
            lent, self._lent = self._lent, {}
        for _size, warm, mm, _at in free:
            _unlink(warm)
            mm.close()
        for name, (_size, mm) in lent.items():
            remove(name)
            if mm is not None:
                mm.close()


def _warm_name(name: str) -> str:
    """The warm name of the parcel `name` (its random part kept)."""
    match = _NAME_RE.fullmatch(name)
    if not match:
        raise ParcelError(f"{name!r} is not a parcel's name")
    return f"fleet.{match.group(1)}{WARM_MARK}{match.group(2)}.{name.rsplit('.', 1)[1]}"


def _unlink(warm: str) -> None:
    try:
        os.unlink(os.path.join(SHM_DIR, warm))
    except FileNotFoundError:
        pass


def give_back(name: str) -> bool:
    """The receiver of a lent parcel (`Lender`) is done with it: it goes back to its
    writer, free, under its warm name. False when it was gone (its writer let it go)."""
    try:
        os.rename(_path(name), os.path.join(SHM_DIR, _warm_name(name)))
        return True
    except FileNotFoundError:
        return False


#: Most parcels a writer keeps of those it lends (`Lender`), and most bytes of them. A
#: parcel is its receiver's while the value built over it lives, so a worker needs one per
#: result in flight (a map's window holds several) to write each into pages it has: past
#: `LEND_KEEP`, a result's parcel is a fresh one (with 4 kept, 1 and 8 MiB arrays came out
#: of data_bench's maps 10-50% slower than with 32).
LEND_KEEP = 32
LEND_MAX = 128 << 20


class Lender:
    """The parcels of a process that sends large values to a receiver (a worker's results,
    `fleet.worker.codec.pack` with ``lend``), which builds each value over its parcel and
    gives the parcel back once the value is gone (`fleet.worker.codec._adopted`): each kept
    mapped here, lent under a parcel's name and given back by its receiver under its warm
    name (`give_back`), then written into again. Fresh shared-memory pages cost more than
    the write itself (each is allocated and zeroed as it is first written, and freed with
    the parcel); a parcel given back has its pages already. At most `keep` parcels and
    `keep_bytes` bytes are kept, until the process ends (its parcels are swept with its pid): past
    them, one given back is let go to make room, and when all are still out a value
    travels in a parcel the receiver takes, as without a lender. A parcel lent is never
    removed before its receiver gave it back; one its receiver removed instead (a stray
    result's) is let go as one given back would be. Any thread writes (one lock; the copies run
    outside it)."""

    def __init__(self, fleet: str, keep: int = LEND_KEEP, keep_bytes: int = LEND_MAX):
        self._fleet, self._keep, self._keep_bytes = fleet, keep, keep_bytes
        self._held: list[list] = []  # [name, size, mapping], oldest lent first
        self._lock = threading.Lock()

    def write(self, parts: list) -> tuple[str, list[int], bool]:
        """A parcel holding `parts`, as `write` makes one: (its name, the offsets, whether it
        is lent: else its receiver takes it). Into a parcel given back whose size fits,
        else a new one. Raises ParcelError."""
        views = _bytes_views(parts)
        offsets, total = layout(v.nbytes for v in views)
        entry = self._reclaim(total)
        if entry is not None:
            for view, off in zip(views, offsets):
                _copy_into(entry[2], off, view)
            return entry[0], offsets, True
        size = _warm_size(total)
        lend = self._room(size)
        name, offsets, fd = write(self._fleet, views, keep_fd=True, size=size if lend else None)
        try:
            if not lend:
                return name, offsets, False
            try:
                mm = populated(fd, size)
            except OSError:
                return name, offsets, False
        finally:
            os.close(fd)
        with self._lock:
            self._held.append([name, size, mm])
        return name, offsets, True

    def _reclaim(self, total: int):
        """A parcel given back whose size fits `total` (at most twice it), lent again under a
        fresh name: [name, size, mapping]; None when there is none."""
        with self._lock:
            for entry in self._held:
                name, size, _mm = entry
                if not total <= size <= 2 * total + mmap.PAGESIZE:
                    continue
                fresh = name_for(self._fleet)
                try:  # succeeds only once its receiver gave it back
                    os.rename(os.path.join(SHM_DIR, _warm_name(name)), os.path.join(SHM_DIR, fresh))
                except OSError:
                    continue
                entry[0] = fresh
                self._held.remove(entry)
                self._held.append(entry)
                return entry
            return None

    def _room(self, size: int) -> bool:
        """Whether a new parcel of `size` may be kept: room under the keep, made by letting
        go parcels given back (oldest first) when needed, and those their receiver removed
        instead (a stray result's: `fleet.worker.codec.drop_parcel`); never one still lent."""
        if size > self._keep_bytes:
            return False
        with self._lock:
            gone = []
            for entry in list(self._held):
                if len(self._held) < self._keep and sum(e[1] for e in self._held) + size <= self._keep_bytes:
                    break
                if not self._let_go(entry[0]):
                    continue
                self._held.remove(entry)
                gone.append(entry)
            room = len(self._held) < self._keep and sum(e[1] for e in self._held) + size <= self._keep_bytes
        for _name, _size, mm in gone:
            mm.close()
        return room

    @staticmethod
    def _let_go(name: str) -> bool:
        """Whether the parcel lent as `name` is free to let go: its lent name is gone, so
        its receiver gave it back (a rename: its warm name, removed here) or removed it."""
        if os.path.exists(os.path.join(SHM_DIR, name)):
            return False  # still lent: its receiver's
        _unlink(_warm_name(name))
        return True

    def held(self) -> int:
        """Parcels kept now (lent or given back)."""
        with self._lock:
            return len(self._held)
