"""A fleet's POSIX shared-memory segments: names, modes, create, attach, reclaim, unlink.

A fleet has two segments, each a `Kind`: its slot table (``/fleet.<name>``,
`fleet.shm.table.segment`) and its data plane (``/fleet.<name>.data``, `fleet.shm.dataplane`).
This module is their one lifecycle; each kind adds only its own header and layout.

Names. A segment is ``/fleet.<fleet name><kind suffix>``. Fleet names hold no ``.``
(`fleet.rules.names`), so a segment name says which fleet and which kind it is: no fleet's
table can be named like another fleet's data segment.

Access. Every segment is created mode 0600 (owner only) with ``O_CREAT|O_EXCL``; the
umask can only narrow that. Before the segment has a size, let alone contents, its
fd is given its final access: ``fchown`` to the readers' group when one is asked
for (the table only: status readers, fleetd's ``--socket-group``), then ``fchmod`` to
exactly 0640 (with a group) or 0600, whatever the umask took away. So there is no
moment at which the segment is wider than its final mode, and the data segment --
unit payloads and results -- is never readable by anyone but its owner (and root).
Readers that may not write open it read-only (``O_RDONLY``, ``PROT_READ``).

Lifecycle rules:

* Only the creator sizes a segment, and creates it exclusively (O_CREX). Opening an
  existing segment with a size would shrink it and kill every reader with SIGBUS, so
  attachers never pass one.
* The creator writes its identity first (fleet name, creator start time, creator
  pid: `Kind` says where in its header) and the kind's magic last: an attacher that
  sees the magic sees an initialised segment.
* Reclaim. A create that finds the name taken inspects the segment read-only and
  unlinks it only when its header says it is a *stale segment of this kind for this
  fleet*: the kind's magic (or no magic yet, with this fleet's identity or none at
  all), this fleet's name, and a creator that is gone (its pid is dead, or reused by
  a process that started at another time). A live creator -> the kind's InUse error
  naming its pid; a header of another kind, of another fleet, or of something else
  -> the kind's Corrupt error, and the segment is left alone.
* Owners. A segment under the fleet's name that belongs to another uid is never
  reclaimed, whatever it holds: boot fails with `ForeignSegment` naming it and its
  owner (another user made it, or ran this fleet before). Its bytes are not read.
  An attach maps a segment only when its owner is trusted (`fleet.host.trust`): a table
  another user made under our fleet's name tells us nothing we may believe.

This module imports posix_ipc only (no numpy, no numba), so read-only tools stay fast.
"""
from __future__ import annotations

import dataclasses
import logging
import mmap
import os
import stat
import struct
import time

import posix_ipc

from fleet.rules.errors import EXIT_FOREIGN_SEGMENT, FleetError
from fleet.host.groups import resolve_gid
from fleet.rules.names import validate_fleet_name
from fleet.host.trust import check_owner, trusted_uids

#: A segment with no magic and no creator recorded, older than this, is a creator that
#: died before writing anything. Younger, a creator may be writing it right now.
UNINITIALISED_GRACE_S = 2.0
#: Mode of a segment only its owner may open.
OWNER_ONLY = 0o600
#: Mode of a segment its readers' group may read (never write).
GROUP_READ = 0o640
SHM_DIR = "/dev/shm"

_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")


class ForeignSegment(FleetError):
    """A segment under the fleet's name belongs to another uid: not ours to reclaim or use."""

    exit_code = EXIT_FOREIGN_SEGMENT

    def __init__(self, where: str, label: str, uid: int, euid: int):
        self.path, self.uid = where, uid
        super().__init__(
            f"the {label} {where} belongs to uid {uid}, not to uid {euid} that runs this fleet; "
            "not reclaiming it (another user made it, or ran this fleet before): "
            "if nothing uses it, remove it by hand"
        )


@dataclasses.dataclass(frozen=True)
class Errors:
    """The typed errors a kind raises (each kind keeps its own, for its callers)."""

    base: type  # anything else: a bad group, a size out of range
    not_found: type  # called with a message
    in_use: type  # called with (fleet name, pid)
    corrupt: type  # called with a message
    denied: type  # called with a message


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of fleet segment: where its name, magic and creator identity live."""

    label: str  # "table", "data segment": used in messages
    suffix: str  # after /fleet.<name>: "" or ".<kind>"
    magic: int  # first 8 bytes (little-endian) of a published segment
    header_size: int
    name_off: int  # the fleet name, NUL-padded, `name_len` bytes
    name_len: int
    start_off: int  # creator's start time (u64, clock ticks since boot)
    pid_off: int  # creator's pid (i64)
    errors: Errors
    #: May a readers' group be given read access (the table: status readers)? Never
    #: for a segment that carries unit payloads.
    group_readable: bool
    #: Who may open it, for permission errors.
    access_hint: str
    logger: logging.Logger

    def __post_init__(self):
        for off, width in ((0, 8), (self.name_off, self.name_len), (self.start_off, 8), (self.pid_off, 8)):
            if off + width > self.header_size:
                raise ValueError(f"{self.label}: header field at {off} overruns the {self.header_size}-byte header")
        _KINDS[self.magic] = self


#: Every kind by magic, so that a refusal can say what a segment really is.
_KINDS: dict[int, Kind] = {}


# ------------------------------------------------------------------------ names


def segment_name(fleet: str, kind: Kind) -> str:
    """``/fleet.<fleet><suffix>``; raises InvalidFleetName for a bad fleet name."""
    return f"/fleet.{validate_fleet_name(fleet)}{kind.suffix}"


def path(fleet: str, kind: Kind) -> str:
    """Where the segment shows in the file system (``/dev/shm/fleet...``)."""
    return SHM_DIR + segment_name(fleet, kind)


def exists(fleet: str, kind: Kind) -> bool:
    return os.path.exists(path(fleet, kind))


def unlink(fleet: str, kind: Kind) -> bool:
    """Remove the segment's name (mappings stay valid until unmapped). True if it existed."""
    try:
        posix_ipc.unlink_shared_memory(segment_name(fleet, kind))
        return True
    except posix_ipc.ExistentialError:
        return False


# -------------------------------------------------------------------- creators


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


# ---------------------------------------------------------------------- create


def group_id(group: int | str, kind: Kind) -> int:
    """The gid of a group given by number or name; the kind's base error if there is none."""
    try:
        return resolve_gid(group)
    except ValueError as exc:
        raise kind.errors.base(str(exc)) from None


def create(fleet: str, kind: Kind, size: int, *, readers_group: int | str | None = None) -> mmap.mmap:
    """Create the segment exclusively (reclaiming a stale one), sized, with its final access,
    and the creator's identity written; returns its writable mapping.

    ``readers_group`` (a gid or group name) may read the segment (mode 0640); without
    it only the owner may (0600). The caller initialises its header, then publishes
    the magic. Raises ForeignSegment (the name holds another uid's segment), the
    kind's InUse (a live creator), Corrupt (the name holds something else),
    AccessDenied, or base error (a bad group).
    """
    seg = segment_name(fleet, kind)
    gid = None
    if readers_group is not None:
        if not kind.group_readable:
            raise kind.errors.base(f"the {kind.label} {seg} is never shared with a group (it carries unit data)")
        gid = group_id(readers_group, kind)
    shm = _create_exclusive(fleet, kind, seg)
    try:
        try:
            _set_access(shm.fd, gid)
        except PermissionError as exc:
            raise kind.errors.denied(
                f"cannot give the {kind.label} {seg} to group {gid}: {exc.strerror} "
                "(its owner must belong to the group, or be root)"
            ) from None
        os.ftruncate(shm.fd, size)
        mm = _map(shm, writable=True)
    except BaseException:
        shm.close_fd()  # idempotent
        unlink(fleet, kind)
        raise
    name = fleet.encode()
    mm[kind.name_off : kind.name_off + len(name)] = name
    _U64.pack_into(mm, kind.start_off, process_start_time(os.getpid()))
    _I64.pack_into(mm, kind.pid_off, os.getpid())  # last: a recorded pid comes with its start and name
    return mm


def _create_exclusive(fleet: str, kind: Kind, seg: str) -> posix_ipc.SharedMemory:
    try:
        return _open_new(seg)
    except posix_ipc.ExistentialError:
        pass
    reclaim_if_stale(fleet, kind)  # raises unless the old one was stale (and is now gone)
    try:
        return _open_new(seg)
    except posix_ipc.ExistentialError:
        # Another creator took the name between the reclaim and this create.
        _refuse_foreign(fleet, kind, _owner(fleet, kind))
        raise kind.errors.in_use(fleet, _recorded_pid(seg, kind)) from None


def _open_new(seg: str) -> posix_ipc.SharedMemory:
    # size 0: the segment gets its size only after its access is final (see _set_access).
    return posix_ipc.SharedMemory(seg, posix_ipc.O_CREX, mode=OWNER_ONLY, size=0)


def _set_access(fd: int, gid: int | None) -> None:
    """Give a new, empty segment its final owner group and mode.

    It was created 0600 less the umask, so nobody but the owner can have opened it.
    The group changes first, while the mode still gives a group nothing; then the
    mode is set exactly (the umask may have taken bits the owner needs).
    """
    if gid is not None:
        os.fchown(fd, -1, gid)
    os.fchmod(fd, OWNER_ONLY if gid is None else GROUP_READ)


def _recorded_pid(seg: str, kind: Kind) -> int:
    try:
        shm = posix_ipc.SharedMemory(seg, read_only=True)
    except posix_ipc.Error:
        return 0
    try:
        head = os.pread(shm.fd, kind.header_size, 0)
    finally:
        shm.close_fd()
    return _I64.unpack_from(head, kind.pid_off)[0] if len(head) >= kind.pid_off + 8 else 0


# ---------------------------------------------------------------------- attach


def attach(fleet: str, kind: Kind, *, writable: bool, trust: frozenset[int] | None = None) -> mmap.mmap:
    """Map an existing segment (read-only unless ``writable``). Never resizes anything.

    The segment must belong to a uid in ``trust`` (default `fleet.host.trust.trusted_uids`:
    ours and root), else UntrustedPeer, before a byte of it is read. Validating the
    header is the kind's job; this checks only that there is one.
    """
    seg = segment_name(fleet, kind)
    try:
        shm = posix_ipc.SharedMemory(seg, read_only=not writable)  # flags=0: open only, no size
    except posix_ipc.ExistentialError:
        raise kind.errors.not_found(f"fleet {fleet!r} is not running (no {kind.label} {path(fleet, kind)})") from None
    except posix_ipc.PermissionsError:
        raise kind.errors.denied(_denied(fleet, kind, "read-write" if writable else "read-only")) from None
    try:
        # fstat, not stat: the owner of the very object mapped, not of whatever the name holds now
        check_owner(f"the {kind.label} {path(fleet, kind)}", os.fstat(shm.fd).st_uid,
                    trusted_uids() if trust is None else trust)
        size = shm.size  # read before close_fd: posix_ipc asks the fd
        if size < kind.header_size:
            raise kind.errors.corrupt(f"{kind.label} {seg} is {size} bytes, smaller than its header")
    except BaseException:
        shm.close_fd()
        raise
    return _map(shm, writable)


def _denied(fleet: str, kind: Kind, how: str) -> str:
    where = path(fleet, kind)
    try:
        st = os.stat(where)
        what = f"it is mode {stat.S_IMODE(st.st_mode):04o}, uid {st.st_uid}, gid {st.st_gid}"
    except OSError:
        what = "it cannot be inspected"
    return (
        f"cannot open the {kind.label} {where} {how} as uid {os.geteuid()}: permission denied "
        f"({what}; {kind.access_hint})"
    )


def _map(shm: posix_ipc.SharedMemory, writable: bool) -> mmap.mmap:
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    try:
        return mmap.mmap(shm.fd, shm.size, mmap.MAP_SHARED, prot)
    finally:
        shm.close_fd()


def close_quietly(mm: mmap.mmap) -> None:
    """Unmap now, or when the last view that pins the mapping is gone."""
    try:
        mm.close()
    except BufferError:
        # Views are still alive (a caller kept an array). np.frombuffer and
        # ffi.from_buffer hold the buffer export, so the mapping cannot vanish under
        # them: it is unmapped when the last view is collected. (np.ndarray(buffer=mm)
        # would NOT hold it, and a later access would touch unmapped memory.)
        pass


# --------------------------------------------------------------------- reclaim


def reclaim_if_stale(fleet: str, kind: Kind, *, level: int = logging.WARNING) -> None:
    """Unlink the segment if it is a stale segment of `kind` for `fleet` (and log why, at `level`).

    Raises ForeignSegment when it belongs to another uid, the kind's InUse when its
    creator lives (or may be writing it now), its Corrupt when it is not this fleet's
    segment of this kind, its AccessDenied when it cannot be read. Does nothing if
    there is no such segment.
    """
    seg = segment_name(fleet, kind)
    try:
        shm = posix_ipc.SharedMemory(seg, read_only=True)
    except posix_ipc.ExistentialError:
        return  # gone in between: nothing to reclaim
    except posix_ipc.PermissionsError:
        _refuse_foreign(fleet, kind, _owner(fleet, kind))  # the likely reason: say whose it is
        raise kind.errors.denied(_denied(fleet, kind, "to inspect it")) from None
    try:
        st = os.fstat(shm.fd)
        _refuse_foreign(fleet, kind, st.st_uid)  # before reading it: its bytes are another user's to choose
        head = os.pread(shm.fd, kind.header_size, 0)
    finally:
        shm.close_fd()
    reason = stale_reason(head, fleet, kind, age_s=time.time() - st.st_mtime)
    try:
        if os.stat(path(fleet, kind)).st_ino != st.st_ino:
            return  # another creator reclaimed it meanwhile: this name is no longer the one judged
    except FileNotFoundError:
        return
    unlink(fleet, kind)
    kind.logger.log(level, "reclaimed stale fleet %s %s: %s", kind.label, seg, reason)


def reclaim_stale_of(prefix: str) -> list[str]:
    """Reclaim every stale segment (creator gone) of this uid whose fleet name starts with
    `prefix`; returns the segments removed. For fleets whose names are made per process
    (``fleet.Executor``: ``executor-<pid>-<n>``): no later boot takes such a name again, so
    a process killed before its teardown (SIGKILL, SIGTERM's default action) would leave
    its segments in /dev/shm forever. A segment that is live, of another uid, or not
    plainly a fleet's is left alone, as `reclaim_if_stale` judges it."""
    removed = []
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return removed
    kinds = sorted(_KINDS.values(), key=lambda k: -len(k.suffix))  # ".data" before ""
    for entry in sorted(entries):
        if not entry.startswith(f"fleet.{prefix}"):
            continue
        rest = entry[len("fleet."):]
        kind = next(k for k in kinds if rest.endswith(k.suffix))
        fleet = rest[: len(rest) - len(kind.suffix)] if kind.suffix else rest
        try:
            if os.stat(os.path.join(SHM_DIR, entry)).st_uid != os.geteuid():
                continue
            if exists(fleet, kind):
                # INFO: the sweep runs inside a user's program, whose stderr stays its own
                reclaim_if_stale(fleet, kind, level=logging.INFO)
                if not exists(fleet, kind):
                    removed.append(entry)
        except (FleetError, OSError):
            continue  # live, foreign, unreadable or not a fleet's: not ours to remove
    return removed


def _refuse_foreign(fleet: str, kind: Kind, owner: int | None) -> None:
    """Raise ForeignSegment if the segment belongs to a uid other than ours (None: no segment).

    Root is no exception: a segment another user made under our name is theirs to
    remove, never ours to judge by contents they chose.
    """
    if owner is not None and owner != os.geteuid():
        raise ForeignSegment(path(fleet, kind), kind.label, owner, os.geteuid())


def _owner(fleet: str, kind: Kind) -> int | None:
    try:
        return os.stat(path(fleet, kind)).st_uid
    except FileNotFoundError:
        return None


def stale_reason(head: bytes, fleet: str, kind: Kind, *, age_s: float, alive=creator_alive) -> str:
    """Why the segment whose header is `head` may be reclaimed; raises if it may not.

    Pure apart from ``alive(pid, start)``. ``age_s`` is the time since the segment
    was last written (its mtime).
    """
    seg = segment_name(fleet, kind)
    magic = _U64.unpack_from(head)[0] if len(head) >= 8 else 0
    if magic not in (0, kind.magic):
        other = _KINDS.get(magic)
        what = f"a fleet {other.label}" if other is not None else f"magic {magic:#018x}"
        raise kind.errors.corrupt(
            f"{seg} is not a fleet {kind.label} ({what}); not reclaiming it -- "
            f"if nothing uses it, remove {SHM_DIR}{seg} by hand"
        )
    if len(head) < kind.header_size:
        if any(head):
            raise kind.errors.corrupt(f"{seg} is {len(head)} bytes of something else; not reclaiming it")
        identity = None
    else:
        identity = _identity(head, kind)
    if identity is None:
        if magic == kind.magic:
            raise kind.errors.corrupt(f"{seg} has the {kind.label} magic but no creator; not reclaiming it")
        if age_s < UNINITIALISED_GRACE_S:
            raise kind.errors.in_use(fleet, 0)  # a creator is writing its identity right now
        if any(head):
            raise kind.errors.corrupt(f"{seg} is not a fleet {kind.label} (no magic, no creator); not reclaiming it")
        return "it was never initialised"
    owner, pid, start = identity
    if owner != fleet:
        raise kind.errors.corrupt(
            f"{seg} is a {kind.label} of fleet {owner!r}, not of {fleet!r}; not reclaiming it"
        )
    if alive(pid, start):
        raise kind.errors.in_use(fleet, pid)
    if magic == 0:
        return f"creator pid {pid} is gone (it died before publishing it)"
    return f"creator pid {pid} is gone"


def _identity(head: bytes, kind: Kind) -> tuple[str, int, int] | None:
    """(fleet name, creator pid, creator start) recorded in a header; None if no creator is."""
    pid = _I64.unpack_from(head, kind.pid_off)[0]
    if pid <= 0:
        return None
    raw = head[kind.name_off : kind.name_off + kind.name_len].rstrip(b"\0")
    owner = raw.decode("ascii", "replace")
    return owner, pid, _U64.unpack_from(head, kind.start_off)[0]
