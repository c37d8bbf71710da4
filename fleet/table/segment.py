"""Create, attach and remove the fleet's shared-memory segment.

One segment per fleet, named ``/fleet.<name>`` (``/dev/shm/fleet.<name>``). Rules:

* Only the creator sizes the segment, and creates it exclusively (O_CREX). Opening
  an existing segment with a size would shrink it and kill every reader with
  SIGBUS, so attachers never pass one.
* The creator writes the header's magic LAST: an attacher that sees the magic sees
  a fully initialised table.
* A segment whose creator is gone (its pid is dead, or reused by a process that
  started at another time) is stale: `create` reclaims it and logs that. One whose
  creator lives is in use: `create` refuses, naming the pid.
* Attaching validates magic, layout version and every size and offset against the
  mapped size; a corrupt or foreign header is a typed error and nothing is written.

This module imports posix_ipc only (no numpy, no numba), so read-only tools stay fast.
"""
from __future__ import annotations

import json
import logging
import mmap
import os
import re
import time
import uuid
from dataclasses import dataclass

import posix_ipc

from ..errors import EXIT_TABLE_IN_USE, FleetError
from . import layout as L

log = logging.getLogger("fleet.table")

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
#: A segment with no magic yet, older than this, is a creator that died mid-boot.
UNINITIALISED_GRACE_S = 2.0


class TableError(FleetError):
    """Base of shared-table errors."""


class TableInUse(TableError):
    """A live process owns a table of this name."""

    exit_code = EXIT_TABLE_IN_USE

    def __init__(self, name: str, pid: int):
        self.name, self.pid = name, pid
        super().__init__(f"fleet {name!r} is already running (table owned by live pid {pid})")


class TableNotFound(TableError):
    """No table of this name exists (the fleet is not running)."""


class TableCorrupt(TableError):
    """The segment exists but its header is not a fleet table this code can read."""


class TableVersionError(TableCorrupt):
    """The table was laid out by another version of fleet."""


class BadFleetName(TableError, ValueError):
    """A fleet name that cannot name a segment, socket or unit."""


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise BadFleetName(
            f"bad fleet name {name!r}: 1-63 characters of letters, digits, '_', '.', '-', starting alphanumeric"
        )
    return name


def segment_name(name: str) -> str:
    return f"/fleet.{validate_name(name)}"


def process_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    return int(fields[19])  # field 22 overall


def creator_alive(pid: int, start: int) -> bool:
    return pid > 0 and process_start_time(pid) == start


@dataclass
class Segment:
    """A mapped table segment. `header` is a live view; `buf` the whole mapping."""

    name: str
    mm: mmap.mmap
    header: L.HeaderView  # the header fields, in place
    created: bool

    @property
    def size(self) -> int:
        return len(self.mm)

    def view_u64(self, offset: int, n_fields: int):
        """A numpy uint64 view of part of the mapping (the owner's and workers' side)."""
        import numpy as np  # here, not at import: read-only tools never need numpy

        return np.frombuffer(self.mm, dtype="<u8", count=n_fields, offset=offset)

    def close(self) -> None:
        """Unmap now, or when the last numpy view of the mapping is gone."""
        self.header = None
        self.__dict__.pop("_reader", None)
        _close_quietly(self.mm)


def _close_quietly(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        # Views are still alive (a caller kept an array). np.frombuffer holds the
        # buffer export, so the mapping cannot vanish under them: it is unmapped
        # when the last view is collected. (np.ndarray(buffer=mm) would NOT hold
        # it, and a later access would touch unmapped memory.)
        pass


def _map(shm: posix_ipc.SharedMemory, writable: bool) -> mmap.mmap:
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    try:
        return mmap.mmap(shm.fd, shm.size, mmap.MAP_SHARED, prot)
    finally:
        shm.close_fd()


def _header_view(mm: mmap.mmap) -> L.HeaderView:
    return L.HeaderView(mm)


def create(name: str, n_slots: int, n_roles: int, n_bulkheads: int, *, now_ns=time.time_ns) -> Segment:
    """Create the table segment exclusively, reclaiming a stale one.

    Raises TableInUse when a live process owns a segment of this name.
    """
    seg_name = segment_name(name)
    for what, count, low, high in (
        ("n_slots", n_slots, 1, L.MAX_SLOTS),
        ("n_roles", n_roles, 1, L.MAX_ROLES),
        ("n_bulkheads", n_bulkheads, 0, L.MAX_BULKHEADS),
    ):
        if not low <= count <= high:
            raise TableError(f"{what} = {count} is out of range [{low}, {high}]")
    offsets = L.region_offsets(n_slots, n_roles, n_bulkheads)
    try:
        shm = posix_ipc.SharedMemory(seg_name, posix_ipc.O_CREX, mode=0o644, size=offsets["total_size"])
    except posix_ipc.ExistentialError:
        _reclaim_if_stale(name)
        shm = posix_ipc.SharedMemory(seg_name, posix_ipc.O_CREX, mode=0o644, size=offsets["total_size"])
    mm = _map(shm, writable=True)
    header = _header_view(mm)
    header["version"] = L.LAYOUT_VERSION
    header["header_size"] = L.HEADER_SIZE
    header["total_size"] = offsets["total_size"]
    header["boot_id"] = uuid.uuid4().bytes
    header["creator_pid"] = os.getpid()
    header["creator_start"] = process_start_time(os.getpid())
    header["created_ns"] = now_ns()
    header["n_slots"], header["n_roles"], header["n_bulkheads"] = n_slots, n_roles, n_bulkheads
    for key in ("posture_off", "ledger_off", "roles_off", "slots_off", "bulkheads_off", "meta_off"):
        header[key] = offsets[key]
    header["name"] = name.encode()
    return Segment(name=name, mm=mm, header=header, created=True)


def write_meta(segment: Segment, meta: dict) -> None:
    """Store the boot metadata (JSON) before `publish`; it never changes afterwards."""
    blob = json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()
    if len(blob) > L.META_SIZE:
        raise TableError(f"table metadata is {len(blob)} bytes; the table holds {L.META_SIZE}")
    off = int(segment.header["meta_off"])
    segment.mm[off : off + len(blob)] = blob
    segment.header["meta_len"] = len(blob)


def read_meta(segment: Segment) -> dict:
    off, n = int(segment.header["meta_off"]), int(segment.header["meta_len"])
    if n == 0:
        return {}
    try:
        return json.loads(bytes(segment.mm[off : off + n]))
    except ValueError as exc:
        raise TableCorrupt(f"table {segment_name(segment.name)}: metadata is not valid JSON ({exc})") from None


def publish(segment: Segment) -> None:
    """Mark the table initialised: the magic is the last word the creator writes."""
    magic = segment.view_u64(0, 1)
    # x86-64 keeps stores in order; the magic store is the release point for readers.
    magic[0] = L.MAGIC


def _reclaim_if_stale(name: str) -> None:
    seg_name = segment_name(name)
    try:
        shm = posix_ipc.SharedMemory(seg_name)
    except posix_ipc.ExistentialError:
        return  # gone in between: nothing to reclaim
    size = shm.size
    age_s = time.time() - os.fstat(shm.fd).st_mtime
    mm = _map(shm, writable=False)
    try:
        if size >= L.HEADER_SIZE:
            header = _header_view(mm)
            magic, pid, start = int(header["magic"]), int(header["creator_pid"]), int(header["creator_start"])
            del header
        else:
            magic, pid, start = 0, 0, 0
    finally:
        _close_quietly(mm)
    if magic == L.MAGIC or pid > 0:
        if creator_alive(pid, start):
            raise TableInUse(name, pid)
        reason = f"creator pid {pid} is gone"
    elif age_s < UNINITIALISED_GRACE_S:
        raise TableInUse(name, pid)  # a creator is initialising it right now
    else:
        reason = "it was never initialised"
    unlink(name)
    log.warning("reclaimed stale fleet table %s: %s", seg_name, reason)


def attach(name: str, *, writable: bool = False) -> Segment:
    """Map an existing table after validating its header. Never resizes anything."""
    seg_name = segment_name(name)
    try:
        shm = posix_ipc.SharedMemory(seg_name)  # flags=0: open only, no size
    except posix_ipc.ExistentialError:
        raise TableNotFound(f"fleet {name!r} is not running (no table {seg_name})") from None
    except posix_ipc.PermissionsError as exc:
        raise TableError(f"cannot open table {seg_name}: {exc}") from None
    size = shm.size  # read before close_fd: posix_ipc asks the fd
    if size < L.HEADER_SIZE:
        shm.close_fd()
        raise TableCorrupt(f"table {seg_name} is {size} bytes, smaller than a header")
    mm = _map(shm, writable=writable)
    try:
        header = _header_view(mm)
        validate_header(header, len(mm), seg_name)
    except TableError:
        header = None
        _close_quietly(mm)
        raise
    return Segment(name=name, mm=mm, header=header, created=False)


def validate_header(header: L.HeaderView, mapped_size: int, seg_name: str) -> None:
    """Raise TableCorrupt / TableVersionError naming the first field that is wrong."""
    if int(header["magic"]) != L.MAGIC:
        raise TableCorrupt(f"table {seg_name}: bad magic {int(header['magic']):#018x} (not initialised or not a fleet table)")
    if int(header["version"]) != L.LAYOUT_VERSION:
        raise TableVersionError(
            f"table {seg_name}: layout version {int(header['version'])}, this fleet reads {L.LAYOUT_VERSION}"
        )
    n_slots, n_roles, n_bulk = int(header["n_slots"]), int(header["n_roles"]), int(header["n_bulkheads"])
    checks = (
        ("header_size", int(header["header_size"]) == L.HEADER_SIZE),
        ("n_slots", 0 < n_slots <= L.MAX_SLOTS),
        ("n_roles", 0 < n_roles <= L.MAX_ROLES),
        ("n_bulkheads", 0 <= n_bulk <= L.MAX_BULKHEADS),
    )
    for field, ok in checks:
        if not ok:
            raise TableCorrupt(f"table {seg_name}: header field {field} = {int(header[field])} is out of range")
    expected = L.region_offsets(n_slots, n_roles, n_bulk)
    if int(header["meta_len"]) > L.META_SIZE:
        raise TableCorrupt(f"table {seg_name}: header field meta_len = {int(header['meta_len'])} is out of range")
    for field, value in expected.items():
        if int(header[field]) != value:
            raise TableCorrupt(f"table {seg_name}: header field {field} = {int(header[field])}, expected {value}")
    if mapped_size != expected["total_size"]:
        raise TableCorrupt(f"table {seg_name}: segment is {mapped_size} bytes, header says {expected['total_size']}")


def unlink(name: str) -> bool:
    """Remove the segment name (mappings stay valid until unmapped). True if it existed."""
    try:
        posix_ipc.unlink_shared_memory(segment_name(name))
        return True
    except posix_ipc.ExistentialError:
        return False


def exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/fleet.{validate_name(name)}")
