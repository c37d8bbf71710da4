"""A fleet's POSIX shared-memory segments: names, modes, create, attach, reclaim, unlink.

A fleet has two segments, each a `Kind`: its slot table (``/fleet.<name>``,
`fleet.shm.table.segment`) and its data plane (``/fleet.<name>.data``, `fleet.shm.dataplane`).
This module is their one lifecycle; each kind adds only its own header and layout.

Names. A segment is ``/fleet.<fleet name><kind suffix>`` (in ``/dev/shm``). Fleet names
hold no ``.`` (`fleet.rules.names`), so a segment name says which fleet and which kind it
is: no fleet's table can be named like another fleet's data segment.

Names are protected by ownership, not by being secret. ``/dev/shm`` is writable by every
user, so anyone may put anything under a fleet's name before the fleet boots: a file of
any size and content, an empty or zero-filled one, a symlink, a FIFO, a directory. None of
it can stop the fleet or be taken for its segment:

* What belongs to another uid is never opened, read, judged or removed (a FIFO would block
  an open; a symlink would lead elsewhere; contents are that user's to choose). Boot
  looks at it with ``lstat`` only, leaves it where it is, and creates its segment under
  an alternate name no one can predict: ``/fleet.<name><suffix>~<16 random hex digits>``
  (``O_CREAT|O_EXCL|O_NOFOLLOW``, so nothing can be made to stand there first), logging
  one warning naming the squatter's uid and the name used.
* Readers (`fleetctl status`, `fleet.connect`, the workers) find the segment without
  asking the fleet: `locate` lists the fleet's names in ``/dev/shm`` -- the plain one and
  its alternates -- and takes only a regular file whose owner is a uid the reader trusts
  (`fleet.host.trust`: its own, root, and those it was told to trust), preferring one whose
  creator lives, then its own uid's, then root's, then the plain name. A squatter's file,
  whatever it is named, belongs to the squatter: no reader believes it.
* One uid runs at most one live segment per fleet and kind: before creating, boot judges
  every segment of its own uid under the fleet's names (stale: reclaimed; live: InUse),
  and after creating it looks again: if another segment of its uid appeared meanwhile (a
  second boot racing this one), the later one gives way (InUse) -- never two live.

Access. Every segment is created mode 0600 (owner only) with ``O_CREAT|O_EXCL``; the
umask can only narrow that. Before the segment has a size, let alone contents, its
fd is given its final access: ``fchown`` to the readers' group when one is asked
for (the table only: status readers, fleetd's ``--socket-group``), then ``fchmod`` to
exactly 0640 (with a group) or 0600, whatever the umask took away. So there is no
moment at which the segment is wider than its final mode, and the data segment --
unit payloads and results -- is never readable by anyone but its owner (and root).
Readers that may not write open it read-only (``O_RDONLY``, ``PROT_READ``). Every open of
an existing name is ``O_NOFOLLOW|O_NONBLOCK`` and checked with ``fstat`` (a regular file,
the owner expected) before a byte is read.

Lifecycle rules:

* Only the creator sizes a segment, and creates it exclusively. Opening an existing
  segment with a size would shrink it and kill every reader with SIGBUS, so attachers
  never pass one.
* The creator writes its identity first (fleet name, creator start time, creator
  pid: `Kind` says where in its header) and the kind's magic last: an attacher that
  sees the magic sees an initialised segment.
* Reclaim. A segment of this uid under one of the fleet's names is judged read-only and
  unlinked only when its header says it is a *stale segment of this kind for this
  fleet*: the kind's magic (or no magic yet, with this fleet's identity or none at
  all), this fleet's name, and a creator that is gone (its pid is dead, or reused by
  a process that started at another time). A live creator -> the kind's InUse error
  naming its pid; a header of another kind, of another fleet, or of something else
  (or not a regular file) -> the kind's Corrupt error, and it is left alone: what this
  uid itself put there is its own to remove.

This module imports no numpy and no numba, so read-only tools stay fast.
"""
from __future__ import annotations

import errno
import importlib
import logging
import mmap
import os
import re
import stat
import struct
import time

from admission.records import record
from fleet.rules.errors import FleetError
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
#: Between a fleet's name and an alternate's random part (no fleet name holds it).
ALTERNATE = "~"
_TOKEN_RE = re.compile(r"[0-9a-f]{16}")
#: Alternate names tried before giving up (each a fresh 64-bit random: a collision is a squatter's luck).
_ALTERNATE_TRIES = 8
_OPEN_EXISTING = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")


@record
class Errors:
    """The typed errors a kind raises (each kind keeps its own, for its callers)."""

    base: type  # anything else: a bad group, a size out of range
    not_found: type  # called with a message
    in_use: type  # called with (fleet name, pid)
    corrupt: type  # called with a message
    denied: type  # called with a message


@record
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
#: The modules that define the kinds (each registers its own on import); a sweep imports
#: them, so it knows every kind whichever of them its caller imported.
KIND_MODULES = ("fleet.shm.table.segment", "fleet.shm.dataplane")


# ------------------------------------------------------------------------ names


def segment_name(fleet: str, kind: Kind) -> str:
    """``/fleet.<fleet><suffix>``, the plain name; raises InvalidFleetName for a bad fleet name."""
    return f"/fleet.{validate_fleet_name(fleet)}{kind.suffix}"


def path(fleet: str, kind: Kind) -> str:
    """Where the plain name shows in the file system (``/dev/shm/fleet...``)."""
    return SHM_DIR + segment_name(fleet, kind)


@record
class Found:
    """One entry under a fleet's names in /dev/shm, as ``lstat`` saw it (never opened to find it)."""

    entry: str  # its name in SHM_DIR
    st: os.stat_result

    @property
    def path(self) -> str:
        return os.path.join(SHM_DIR, self.entry)

    @property
    def alternate(self) -> bool:
        return ALTERNATE in self.entry

    @property
    def regular(self) -> bool:
        return stat.S_ISREG(self.st.st_mode)

    def what(self) -> str:
        """The entry's type in words, for messages."""
        for test, word in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symlink"),
                           (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket")):
            if test(self.st.st_mode):
                return word
        return "device"


def _split(entry: str) -> tuple[str, str | None]:
    """(plain name, the alternate's random part or None) of an entry in SHM_DIR."""
    plain, sep, token = entry.partition(ALTERNATE)
    return plain, (token if sep else None)


def names_of(fleet: str, kind: Kind) -> list[Found]:
    """Every entry under the fleet's names for `kind` -- the plain name, then the alternates
    in name order -- whoever owns it and whatever it is."""
    plain = segment_name(fleet, kind)[1:]
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    out = []
    for entry in entries:
        base, token = _split(entry)
        if base != plain or (token is not None and not _TOKEN_RE.fullmatch(token)):
            continue
        try:
            out.append(Found(entry, os.lstat(os.path.join(SHM_DIR, entry))))
        except FileNotFoundError:
            continue  # gone meanwhile
    return sorted(out, key=lambda f: (f.alternate, f.entry))


def _ours(found: Found) -> bool:
    return found.st.st_uid == os.geteuid()


def exists(fleet: str, kind: Kind) -> bool:
    """Whether this uid has a segment of `kind` under the fleet's names."""
    return any(_ours(f) and f.regular for f in names_of(fleet, kind))


def unlink(fleet: str, kind: Kind) -> bool:
    """Remove this uid's segments of `kind` under the fleet's names that this process made,
    or whose creator is gone (mappings stay valid until unmapped). A segment another
    process of ours is using, or one of another uid, is left alone. True if any was removed."""
    removed = False
    for found in names_of(fleet, kind):
        if not (_ours(found) and found.regular):
            continue
        head = _read_head(found, kind)
        identity = None if head is None or len(head) < kind.header_size else _identity(head, kind)
        if identity is None:
            if head is None or time.time() - found.st.st_mtime < UNINITIALISED_GRACE_S:
                continue  # unreadable, or a creator may be writing its identity now
        elif identity[1] != os.getpid() and creator_alive(identity[1], identity[2]):
            continue
        removed |= _unlink_entry(found)
    return removed


def _unlink_entry(found: Found) -> bool:
    try:
        os.unlink(found.path)
        return True
    except FileNotFoundError:
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


def _open_found(found: Found, flags: int) -> int:
    """An fd on `found` itself: the same regular file (inode) ``lstat`` saw, opened without
    following a link or waiting on a FIFO. OSError if it is gone or was replaced meanwhile."""
    fd = os.open(found.path, flags | _OPEN_EXISTING)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (found.st.st_dev, found.st.st_ino):
        os.close(fd)
        raise FileNotFoundError(errno.ENOENT, "replaced meanwhile", found.path)
    return fd


def _read_head(found: Found, kind: Kind) -> bytes | None:
    """The header bytes of a regular file of a trusted uid (None: it cannot be read)."""
    try:
        fd = _open_found(found, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.pread(fd, kind.header_size, 0)
    finally:
        os.close(fd)


def _alive(found: Found, fleet: str, kind: Kind) -> bool:
    head = _read_head(found, kind)
    identity = None if head is None or len(head) < kind.header_size else _identity(head, kind)
    return identity is not None and identity[0] == fleet and creator_alive(identity[1], identity[2])


# ---------------------------------------------------------------------- create


def group_id(group: int | str, kind: Kind) -> int:
    """The gid of a group given by number or name; the kind's base error if there is none."""
    try:
        return resolve_gid(group)
    except ValueError as exc:
        raise kind.errors.base(str(exc)) from None


def create(fleet: str, kind: Kind, size: int, *, readers_group: int | str | None = None) -> mmap.mmap:
    """Create the segment exclusively (reclaiming a stale one of this uid, stepping around
    what another uid left under the name), sized, with its final access, and the
    creator's identity written; returns its writable mapping.

    ``readers_group`` (a gid or group name) may read the segment (mode 0640); without
    it only the owner may (0600). The caller initialises its header, then publishes
    the magic. Raises the kind's InUse (a live creator of this uid), Corrupt (one of the
    fleet's names holds something else of this uid), AccessDenied, or base error (a bad
    group).
    """
    seg = segment_name(fleet, kind)
    gid = None
    if readers_group is not None:
        if not kind.group_readable:
            raise kind.errors.base(f"the {kind.label} {seg} is never shared with a group (it carries unit data)")
        gid = group_id(readers_group, kind)
    fd, where = _create_exclusive(fleet, kind)
    try:
        try:
            _set_access(fd, gid)
        except PermissionError as exc:
            raise kind.errors.denied(
                f"cannot give the {kind.label} {where} to group {gid}: {exc.strerror} "
                "(its owner must belong to the group, or be root)"
            ) from None
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        _unlink_path(where)
        raise
    try:
        mm = _map(fd, size, writable=True)  # closes fd, mapped or not
    except BaseException:
        _unlink_path(where)
        raise
    try:
        name = fleet.encode()
        mm[kind.name_off : kind.name_off + len(name)] = name
        _U64.pack_into(mm, kind.start_off, process_start_time(os.getpid()))
        _I64.pack_into(mm, kind.pid_off, os.getpid())  # last: a recorded pid comes with its start and name
        _give_way_to_a_racer(fleet, kind, os.path.basename(where))
    except BaseException:
        close_quietly(mm)
        _unlink_path(where)
        raise
    return mm


def _create_exclusive(fleet: str, kind: Kind) -> tuple[int, str]:
    """(fd, path) of a new, empty segment of this uid under the fleet's names."""
    held = None  # what another uid holds under the plain name
    for found in names_of(fleet, kind):
        if _ours(found):
            _reclaim(found, fleet, kind)  # stale: gone now; live: InUse; anything else: Corrupt
        elif not found.alternate:
            held = found  # another user's: looked at with lstat only, never opened
    plain = path(fleet, kind)
    for _ in range(3):
        try:
            return _open_new(plain), plain
        except FileExistsError:
            pass
        try:
            now = Found(os.path.basename(plain), os.lstat(plain))
        except FileNotFoundError:
            continue  # removed meanwhile: try it again
        if _ours(now):  # a second boot of this uid took it since the look above
            raise kind.errors.in_use(fleet, _recorded_pid(now, kind))
        held = now
        break
    for _ in range(_ALTERNATE_TRIES):
        where = f"{plain}{ALTERNATE}{os.urandom(8).hex()}"
        try:
            fd = _open_new(where)
        except FileExistsError:
            continue
        if held is not None:
            kind.logger.warning(
                "the %s name %s is held by uid %d (a %s; not ours to open or remove): fleet %s's %s is %s "
                "instead, where readers find it by its owner", kind.label, held.path, held.st.st_uid, held.what(),
                fleet, kind.label, where)
        return fd, where
    raise kind.errors.base(f"no free name for the {kind.label} of fleet {fleet!r} under {SHM_DIR}")


def _open_new(where: str) -> int:
    # Size 0: the segment gets its size only after its access is final (see _set_access).
    # O_NOFOLLOW: a link planted under the name is never followed, even by root.
    return os.open(where, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, OWNER_ONLY)


def _give_way_to_a_racer(fleet: str, kind: Kind, mine: str) -> None:
    """After writing our identity: if another live (or still initialising) segment of this
    uid stands under the fleet's names, a second boot of the fleet made it while we made
    ours. Raise InUse (the caller removes ours): the later one gives way, and when two
    see each other both do, so never two live."""
    for found in names_of(fleet, kind):
        if found.entry == mine or not (_ours(found) and found.regular):
            continue
        head = _read_head(found, kind)
        if head is None:
            continue
        if len(head) >= kind.header_size and _identity(head, kind) is not None:
            owner, pid, start = _identity(head, kind)
            if owner == fleet and creator_alive(pid, start):
                raise kind.errors.in_use(fleet, pid)
        elif not any(head) and time.time() - found.st.st_mtime < UNINITIALISED_GRACE_S:
            raise kind.errors.in_use(fleet, 0)


def _set_access(fd: int, gid: int | None) -> None:
    """Give a new, empty segment its final owner group and mode.

    It was created 0600 less the umask, so nobody but the owner can have opened it.
    The group changes first, while the mode still gives a group nothing; then the
    mode is set exactly (the umask may have taken bits the owner needs).
    """
    if gid is not None:
        os.fchown(fd, -1, gid)
    os.fchmod(fd, OWNER_ONLY if gid is None else GROUP_READ)


def _recorded_pid(found: Found, kind: Kind) -> int:
    head = _read_head(found, kind)
    return _I64.unpack_from(head, kind.pid_off)[0] if head and len(head) >= kind.pid_off + 8 else 0


def _unlink_path(where: str) -> None:
    try:
        os.unlink(where)
    except FileNotFoundError:
        pass


# ---------------------------------------------------------------------- attach


def locate(fleet: str, kind: Kind, trust: frozenset[int] | None = None) -> Found:
    """The fleet's segment of `kind` a reader trusting `trust` (default: ours and root)
    believes: a regular file under the fleet's names owned by a trusted uid; among
    several, one whose creator lives, then ours, then root's, then the plain name.

    Raises the kind's NotFound when there is none, UntrustedPeer when the only segment
    there belongs to a uid outside `trust` (it names it).
    """
    trusted = trusted_uids() if trust is None else trust
    found = names_of(fleet, kind)
    believed = [f for f in found if f.regular and f.st.st_uid in trusted]
    if not believed:
        other = next((f for f in found if f.regular), None)
        if other is not None:
            check_owner(f"the {kind.label} {other.path}", other.st.st_uid, trusted)
        raise kind.errors.not_found(f"fleet {fleet!r} is not running (no {kind.label} {path(fleet, kind)})")
    if len(believed) == 1:
        return believed[0]
    euid = os.geteuid()

    def rank(f: Found):
        uid = f.st.st_uid
        return (not _alive(f, fleet, kind), 0 if uid == euid else 1 if uid == 0 else 2, f.alternate, f.entry)

    return min(believed, key=rank)


def attach(fleet: str, kind: Kind, *, writable: bool, trust: frozenset[int] | None = None) -> mmap.mmap:
    """Map an existing segment (read-only unless ``writable``). Never resizes anything.

    The segment is the one `locate` finds for ``trust`` (default: ours and root), and
    its owner is checked again on the fd before a byte of it is read (UntrustedPeer).
    Validating the header is the kind's job; this checks only that there is one.
    """
    segment_name(fleet, kind)  # a bad name is refused first
    if trust is None:
        trust = trusted_uids()
    found = locate(fleet, kind, trust)
    try:
        fd = _open_found(found, os.O_RDWR if writable else os.O_RDONLY)
    except FileNotFoundError:
        raise kind.errors.not_found(f"fleet {fleet!r} is not running (no {kind.label} {found.path})") from None
    except PermissionError:
        raise kind.errors.denied(_denied(found, kind, "read-write" if writable else "read-only")) from None
    try:
        # fstat, not the lstat that found it: the owner of the very object mapped
        st = os.fstat(fd)
        check_owner(f"the {kind.label} {found.path}", st.st_uid, trust)
        if st.st_size < kind.header_size:
            raise kind.errors.corrupt(f"{kind.label} {found.path} is {st.st_size} bytes, smaller than its header")
    except BaseException:
        os.close(fd)
        raise
    return _map(fd, st.st_size, writable)


def _denied(found: Found, kind: Kind, how: str) -> str:
    st = found.st
    what = f"it is mode {stat.S_IMODE(st.st_mode):04o}, uid {st.st_uid}, gid {st.st_gid}"
    return (
        f"cannot open the {kind.label} {found.path} {how} as uid {os.geteuid()}: permission denied "
        f"({what}; {kind.access_hint})"
    )


def _map(fd: int, size: int, writable: bool) -> mmap.mmap:
    """Map `fd` (`size` bytes) shared, then close it: the mapping keeps the segment."""
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    try:
        return mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
    finally:
        os.close(fd)


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
    """Unlink this uid's segments of `kind` under the fleet's names that are stale (and log
    why, at `level`). What another uid put there is left alone, unopened.

    Raises the kind's InUse when a creator lives (or may be writing one now), its
    Corrupt when one is not this fleet's segment of this kind (or not a regular file),
    its AccessDenied when one cannot be read. Does nothing if there is none.
    """
    for found in names_of(fleet, kind):
        if _ours(found):
            _reclaim(found, fleet, kind, level=level)


def _reclaim(found: Found, fleet: str, kind: Kind, *, level: int = logging.WARNING) -> None:
    """Judge one entry of this uid (`stale_reason`) and unlink it if it is stale."""
    if not found.regular:
        raise kind.errors.corrupt(f"{found.path} is a {found.what()}, not a fleet {kind.label}; not reclaiming it "
                                  f"-- if nothing uses it, remove it by hand")
    try:
        fd = _open_found(found, os.O_RDONLY)
    except FileNotFoundError:
        return  # gone (or replaced) in between: nothing of what was judged is left to reclaim
    except PermissionError:
        raise kind.errors.denied(_denied(found, kind, "to inspect it")) from None
    try:
        head = os.pread(fd, kind.header_size, 0)
    finally:
        os.close(fd)
    reason = stale_reason(head, fleet, kind, age_s=time.time() - found.st.st_mtime, seg=found.path)
    try:
        if os.lstat(found.path).st_ino != found.st.st_ino:
            return  # another creator reclaimed it meanwhile: this name is no longer the one judged
    except FileNotFoundError:
        return
    _unlink_entry(found)
    kind.logger.log(level, "reclaimed stale fleet %s %s: %s", kind.label, found.path, reason)


def reclaim_stale_of(prefix: str) -> list[str]:
    """Reclaim every stale segment (creator gone) of this uid whose fleet name starts with
    `prefix`; returns the entries removed. For fleets whose names are made per process
    (``fleet.Executor``: ``executor-<pid>-<n>``): no later boot takes such a name again, so
    a process killed before its teardown (SIGKILL, SIGTERM's default action) would leave
    its segments in /dev/shm forever. A segment that is live, of another uid, or not
    plainly a fleet's is left alone, as `reclaim_if_stale` judges it."""
    removed = []
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return removed
    for module in KIND_MODULES:  # a segment is judged by its kind: every kind known, whatever the caller imported
        importlib.import_module(module)
    kinds = sorted(_KINDS.values(), key=lambda k: -len(k.suffix))  # ".data" before ""
    for entry in sorted(entries):
        plain, token = _split(entry)
        if not plain.startswith(f"fleet.{prefix}") or (token is not None and not _TOKEN_RE.fullmatch(token)):
            continue
        rest = plain[len("fleet."):]
        kind = next((k for k in kinds if rest.endswith(k.suffix)), None)
        if kind is None:
            continue  # no kind of fleet's ends so: not plainly a fleet's
        fleet = rest[: len(rest) - len(kind.suffix)] if kind.suffix else rest
        try:
            found = Found(entry, os.lstat(os.path.join(SHM_DIR, entry)))
            if not _ours(found):
                continue
            # INFO: the sweep runs inside a user's program, whose stderr stays its own
            _reclaim(found, validate_fleet_name(fleet), kind, level=logging.INFO)
            if not os.path.lexists(found.path):
                removed.append(entry)
        except (FleetError, OSError):
            continue  # live, unreadable or not a fleet's: not ours to remove
    return removed


def stale_reason(head: bytes, fleet: str, kind: Kind, *, age_s: float, alive=creator_alive,
                 seg: str | None = None) -> str:
    """Why the segment whose header is `head` may be reclaimed; raises if it may not.

    Pure apart from ``alive(pid, start)``. ``age_s`` is the time since the segment
    was last written (its mtime); ``seg`` names it in messages (default: the plain name).
    """
    seg = segment_name(fleet, kind) if seg is None else seg
    magic = _U64.unpack_from(head)[0] if len(head) >= 8 else 0
    if magic not in (0, kind.magic):
        other = _KINDS.get(magic)
        what = f"a fleet {other.label}" if other is not None else f"magic {magic:#018x}"
        raise kind.errors.corrupt(
            f"{seg} is not a fleet {kind.label} ({what}); not reclaiming it -- "
            f"if nothing uses it, remove it by hand"
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
