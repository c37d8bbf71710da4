"""Create, attach and remove the fleet's shared-memory table segment.

One table per fleet and user, named ``/fleet.<name>`` (``/dev/shm/fleet.<name>``), or
``/fleet.<name>~<random>`` when another uid holds that name (readers find it by its
owner). Its lifecycle -- exclusive create, access mode, creator identity, stale reclaim,
locate, attach, unlink -- is `fleet.shm.segments`'s, shared with the data plane; this
module adds the table's header and its checks:

* The creator writes the header's magic LAST: an attacher that sees the magic sees
  a fully initialised table.
* The table is mode 0600, or 0640 with the readers' group (fleetd's
  ``--socket-group``): status readers attach it read-only.
* A stale table of this uid (its creator is gone) is reclaimed by the next `create`,
  which logs it; one whose creator lives is refused, naming the pid; something else of
  this uid under the table's names is refused and left alone; anything of another uid
  is left alone unopened, and the table made beside it.
* Attaching validates magic, layout version and every size and offset against the
  mapped size; a corrupt or foreign header is a typed error and nothing is written.

This module imports no numpy and no numba, so read-only tools stay fast.
"""
from __future__ import annotations

import json
import logging
import mmap
import os
import time

from admission.records import record
from fleet.shm import segments as shm
from fleet.rules.errors import EXIT_NO_PERMISSION, EXIT_TABLE_IN_USE, FleetError
from fleet.rules.names import InvalidFleetName
from fleet.shm.segments import creator_alive, process_start_time  # noqa: F401 (re-exported for readers and tests)
from fleet.shm.header import HeaderView
from fleet.shm.table import layout as L

log = logging.getLogger(__name__)


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


class TableAccessDenied(TableError):
    """This uid may not open the table that way (see `fleet.shm.segments` for who may)."""

    exit_code = EXIT_NO_PERMISSION


#: A bad fleet name (the rule is `fleet.rules.names`); the old name stays importable.
BadFleetName = InvalidFleetName


#: The table as a kind of fleet segment (name, magic, creator identity in its header).
KIND = shm.Kind(
    label="table",
    suffix="",
    magic=L.MAGIC,
    header_size=L.HEADER_SIZE,
    name_off=L.HEADER.offset("name"),
    name_len=L.HEADER.size("name"),
    start_off=L.HEADER.offset("creator_start"),
    pid_off=L.HEADER.offset("creator_pid"),
    errors=shm.Errors(
        base=TableError, not_found=TableNotFound, in_use=TableInUse, corrupt=TableCorrupt, denied=TableAccessDenied
    ),
    group_readable=True,
    access_hint="its owner and root may open it, and members of fleetd's --socket-group may read it",
    logger=log,
)


def segment_name(name: str) -> str:
    return shm.segment_name(name, KIND)


@record(frozen=False)
class Segment:
    """A mapped table segment. `header` is a live view; `buf` the whole mapping."""

    name: str
    mm: mmap.mmap
    header: HeaderView  # the header fields, in place
    created: bool

    @property
    def size(self) -> int:
        return len(self.mm)

    def view_u64(self, offset: int, n_fields: int) -> memoryview:
        """A uint64 view of part of the mapping (the owner's and workers' side): ints in,
        ints out, and read-only on a read-only mapping."""
        return memoryview(self.mm)[offset : offset + n_fields * L.U64].cast("Q")

    def close(self) -> None:
        """Unmap now, or when the last view of the mapping is gone."""
        self.header = None
        self.__dict__.pop("_reader", None)
        shm.close_quietly(self.mm)


def create(
    name: str, n_slots: int, n_roles: int, n_bulkheads: int, *, readers_group: int | str | None = None,
    now_ns=time.time_ns,
) -> Segment:
    """Create the table segment exclusively, reclaiming a stale one.

    ``readers_group`` (gid or name) may read the table (mode 0640); else only its
    owner may (0600). Raises TableInUse when a live process owns a segment of this
    name, TableCorrupt when the name holds something that is not this fleet's table.
    """
    shm.segment_name(name, KIND)  # a bad name is refused before anything else
    for what, count, low, high in (
        ("n_slots", n_slots, 1, L.MAX_SLOTS),
        ("n_roles", n_roles, 1, L.MAX_ROLES),
        ("n_bulkheads", n_bulkheads, 0, L.MAX_BULKHEADS),
    ):
        if not low <= count <= high:
            raise TableError(f"{what} = {count} is out of range [{low}, {high}]")
    offsets = L.region_offsets(n_slots, n_roles, n_bulkheads)
    mm = shm.create(name, KIND, offsets["total_size"], readers_group=readers_group)
    # name, creator pid and start are written (fleet.shm.segments)
    return Segment(name=name, mm=mm, header=_lay_out(mm, offsets, n_slots, n_roles, n_bulkheads, now_ns), created=True)


def scratch(n_slots: int, n_roles: int) -> Segment:
    """A table segment of this process alone, in anonymous memory (nothing in /dev/shm, no
    name, no creator recorded, no bulkheads), for the fork server's rehearsal
    (`fleet.worker.rehearsal`); gone with its last mapping."""
    offsets = L.region_offsets(n_slots, n_roles, 0)
    mm = mmap.mmap(-1, offsets["total_size"])
    return Segment(name="", mm=mm, header=_lay_out(mm, offsets, n_slots, n_roles, 0, time.time_ns), created=False)


def _lay_out(mm: mmap.mmap, offsets: dict, n_slots: int, n_roles: int, n_bulkheads: int, now_ns) -> HeaderView:
    """The header of a new table in `mm`: its layout, sizes and boot id (not yet published)."""
    header = L.HEADER.view(mm)
    header["version"] = L.LAYOUT_VERSION
    header["header_size"] = L.HEADER_SIZE
    header["total_size"] = offsets["total_size"]
    header["boot_id"] = os.urandom(16)  # a random id, as uuid4's bytes (without importing uuid)
    header["created_ns"] = now_ns()
    header["n_slots"], header["n_roles"], header["n_bulkheads"] = n_slots, n_roles, n_bulkheads
    for key in ("posture_off", "ledger_off", "roles_off", "slots_off", "bulkheads_off", "meta_off"):
        header[key] = offsets[key]
    return header


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


def attach(name: str, *, writable: bool = False, trust: frozenset[int] | None = None) -> Segment:
    """Map an existing table after validating its header. Never resizes anything.

    Read-only (the default) opens the segment O_RDONLY and maps it PROT_READ, which
    is all a status reader in the table's group is allowed. A table that belongs to
    a uid outside ``trust`` (default: ours and root) is UntrustedPeer (`fleet.shm.segments.attach`).
    """
    mm = shm.attach(name, KIND, writable=writable, trust=trust)
    try:
        header = L.HEADER.view(mm)
        validate_header(header, len(mm), segment_name(name))
    except TableError:
        header = None
        shm.close_quietly(mm)
        raise
    return Segment(name=name, mm=mm, header=header, created=False)


def validate_header(header: HeaderView, mapped_size: int, seg_name: str) -> None:
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
    return shm.unlink(name, KIND)


def exists(name: str) -> bool:
    return shm.exists(name, KIND)
