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

This module imports no numpy.
"""
from __future__ import annotations

import mmap
import os
import re
import secrets
import stat

from fleet.rules.errors import FleetError
from fleet.shm.segments import OWNER_ONLY, SHM_DIR

#: Between a fleet's name and the creator's pid in a parcel's name.
MARK = ".p"
#: Where each part of a parcel starts: an array rebuilt over it is aligned for any dtype.
ALIGN = 64
#: Most bytes one write(2) moves on Linux.
_WRITE_MAX = 0x7FFFF000
_NAME_RE = re.compile(r"fleet\.([^./~]+)\.p([0-9]+)\.[0-9a-f]{16}")
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


class ParcelError(FleetError):
    """A parcel cannot be made or opened (the text names it, its size and why)."""


def name_for(fleet: str, pid: int | None = None) -> str:
    """A fresh parcel name of `fleet` for the creator `pid` (default: this process), without the '/'."""
    return f"fleet.{fleet}{MARK}{os.getpid() if pid is None else pid}.{secrets.token_hex(8)}"


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


def write(fleet: str, parts: list) -> tuple[str, list[int]]:
    """A new parcel of `fleet` holding `parts` (buffers) at `layout`'s offsets: (its name,
    the offsets). Each byte is copied once, by the kernel, into the segment. Raises
    ParcelError (nothing left behind) when it cannot be made: /dev/shm full, no fds."""
    views = [memoryview(p).cast("B") for p in parts]
    offsets, total = layout(v.nbytes for v in views)
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
        remove(name)
        raise ParcelError(f"cannot write a parcel of {total} bytes in {SHM_DIR}: {exc.strerror}") from None
    finally:
        os.close(fd)
        for view in views:
            view.release()
    return name, offsets


def open_(name: str, *, take: bool) -> mmap.mmap:
    """A writable mapping of the parcel `name`. ``take``: the receiver owns it from here
    (a result): its name is removed now, and the mapping is shared (nobody else maps it).
    Else (a task, which its supervisor owns) the mapping is private, copy-on-write.
    Raises ParcelError when it is gone, not a regular file, or not this uid's."""
    path = _path(name)
    try:
        fd = os.open(path, (os.O_RDWR if take else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
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
        # Shared: its pages mapped at once (no fault per page later). Private: left to fault
        # in as read, since populating a private writable mapping copies every page (COW).
        flags = mmap.MAP_SHARED | _POPULATE if take else mmap.MAP_PRIVATE
        return mmap.mmap(fd, st.st_size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


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
        try:
            if os.lstat(os.path.join(SHM_DIR, entry)).st_uid == uid and remove(entry):
                removed.append(entry)
        except (FileNotFoundError, ParcelError):
            continue
    return removed


def sweep(fleet: str, pid: int | None = None) -> list[str]:
    """Remove this uid's parcels of `fleet` (only those `pid` made, when given): the fleet's
    boot and teardown, and a dead worker's. Returns the names removed."""
    prefix = f"fleet.{fleet}{MARK}" + ("" if pid is None else f"{pid}.")
    return _remove_ours(e for e in _entries() if e.startswith(prefix) and _NAME_RE.fullmatch(e))


def sweep_orphans(prefix: str) -> list[str]:
    """Remove this uid's parcels of fleets named `prefix`... that have no table segment any
    more (``/fleet.<name>``, or an alternate of it): their supervisor is gone, and no boot
    takes a per-process name again. A live fleet's table exists before its first parcel."""
    entries = _entries()
    tables = {e.partition("~")[0] for e in entries if not _NAME_RE.fullmatch(e)}
    orphans = []
    for entry in entries:
        match = _NAME_RE.fullmatch(entry)
        if match and match.group(1).startswith(prefix) and f"fleet.{match.group(1)}" not in tables:
            orphans.append(entry)
    return _remove_ours(orphans)


def count(fleet: str | None = None) -> int:
    """Parcels in /dev/shm (of `fleet`, when given): for tests and status."""
    return sum(1 for e in _entries() if _NAME_RE.fullmatch(e) and (fleet is None or e.startswith(f"fleet.{fleet}.p")))
