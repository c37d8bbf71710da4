"""Large data beside the control frames: sealed memfds passed with SCM_RIGHTS.

A pickled payload (or a relayed result) of `MEMFD_MIN` bytes or more does not travel
base64 inside its JSON frame: it is written into an anonymous memory file
(``memfd_create``), sealed so that nobody can change its size or its bytes any more
(F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_WRITE, then F_SEAL_SEAL), and its descriptor goes
with the frame that names it (``"payload_fd": <index among the frame's fds>``). Nothing
is named in /dev/shm: the kernel frees the bytes with the last descriptor, whichever
side dies first, and the peer's uid does not matter.

The receiver treats every descriptor as hostile (`open_sealed`): it must be a regular
file, sealed at least against shrinking, growing and writing (else the sender could cut
it under the receiver's mapping: SIGBUS), and exactly as long as the frame says. A frame
carries at most `MAX_FRAME_FDS`; every descriptor a frame brought and did not claim is
closed, as are those of a frame refused, cut short, or of a connection that closes.
`Arrivals` keeps which descriptors came with which bytes of a stream.

One kind of descriptor is not a memfd: a large result fleetd relays from its worker's
parcel goes to a client that takes them (``parcels``) as a read-only descriptor of that
parcel itself (`Held`), so that its bytes are written once, by the worker, and never
copied on the way. A parcel cannot be sealed (only a memfd can); what the client checks
instead (`open_parcel`) is that it is a regular file no name reaches any more (unlinked:
nobody can open it again to change it) of the size the record gives. Its writer has let
it go and fleetd never writes it: the client trusts its fleetd that far, as it already
does when it unpickles what fleetd sends.
"""
from __future__ import annotations

import array
import collections
import contextlib
import fcntl
import mmap
import os
import socket
import stat
from collections.abc import Callable

from fleet.shm import segments
from fleet.service.control.errors import E_INVALID_ARGS, ProtocolError

#: Pickled bytes from which a payload or a result travels in a memfd rather than base64
#: in its frame (base64 in JSON costs a third more bytes and a pass to encode and decode).
MEMFD_MIN = 256 * 1024
#: Most descriptors one frame may carry.
MAX_FRAME_FDS = 64
#: Most descriptors a connection may hold received and not yet claimed by a frame.
MAX_HELD_FDS = 2 * MAX_FRAME_FDS
#: The seals a receiver requires: no shrinking, growing or writing after it looked.
REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
#: Ancillary room of one recvmsg: one descriptor more than a frame may carry, so that a
#: sender passing more in one message is seen (the excess is cut: MSG_CTRUNC).
ANCILLARY_SPACE = socket.CMSG_SPACE((MAX_FRAME_FDS + 1) * array.array("i").itemsize)
#: recvmsg's flag as a plain int: the socket module's IntFlag would cost three Python calls
#: (enum's) on every read of every connection.
_MSG_CTRUNC = int(socket.MSG_CTRUNC)


def refused(message: str) -> ProtocolError:
    """The InvalidArgs error of a descriptor (or of the descriptors of a frame)."""
    return ProtocolError(E_INVALID_ARGS, message)


def sealed(data, name: str = "fleet-data") -> int:
    """A sealed memfd holding `data` (a buffer, or a list of buffers written one after the
    other; at least one byte in all); the caller's to close."""
    views = [memoryview(piece).cast("B") for piece in (data if isinstance(data, list) else [data])]
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, sum(view.nbytes for view in views))
        at = 0
        for view in views:
            done = 0
            while done < view.nbytes:  # pwrite lets other threads run while it copies
                done += os.pwrite(fd, view[done:done + (1 << 30)], at + done)
            at += done
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, REQUIRED_SEALS | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    finally:
        for view in views:
            view.release()
    return fd


class Held:
    """A descriptor this process owns and the bytes of what it holds, until `close`
    (idempotent; also when dropped, so one that never went out leaks nothing): a frame
    carries it beside its bytes (`fleet.service.control.wire`). As fleetd sends it and as
    a client receives it (`open_parcel`), a relayed parcel's read-only descriptor, which
    `fleet.worker.codec.value_in_parcel` builds the value over."""

    __slots__ = ("fd", "size")

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self):
        self.close()


class HandedOff(Held):
    """A descriptor a reply gives away (an inlet's memfd, `open_inlet`): closed here as soon
    as the frame holds its own copy (`wire`), so the sender keeps none of it."""

    __slots__ = ()


class Sealed(Held):
    """A sealed memfd a sender holds until its frame went out."""

    __slots__ = ()

    def __init__(self, data):
        """`data`: a buffer, or a list of buffers written one after the other (`sealed`)."""
        self.fd = -1  # until it is made: a failed make leaves nothing for `close`
        self.size = sum(memoryview(piece).nbytes for piece in (data if isinstance(data, list) else [data]))
        self.fd = sealed(data)


def open_parcel(fd: int, length: int, what: str) -> Held:
    """Take a parcel's descriptor fleetd sent as `length` bytes of `what`, after checking
    it is a regular file of exactly that size that no name reaches (see the module's text).
    Closes `fd` when it is refused. Raises InvalidArgs naming what was wrong."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refused(f"{what}: the descriptor is not a regular file (a parcel is required)")
        if st.st_nlink != 0:
            raise refused(f"{what}: the file still has a name ({st.st_nlink} link(s)): a relayed parcel is unlinked")
        if st.st_size != length:
            raise refused(f"{what}: the parcel holds {st.st_size} bytes, the record says {length}")
        if length < 1:
            raise refused(f"{what}: an empty parcel carries nothing")
    except BaseException:
        os.close(fd)
        raise
    return Held(fd, length)


class Mapped:
    """The bytes of a received memfd, mapped: ``view`` (a memoryview) until `close`; and,
    when it was kept (`open_sealed`'s ``keep``), its descriptor ``fd`` (else -1), closed then too."""

    __slots__ = ("_mm", "view", "fd")

    def __init__(self, mm: mmap.mmap, fd: int = -1):
        self._mm, self.view, self.fd = mm, memoryview(mm), fd

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
        if self._mm is None:
            return
        self.view.release()
        segments.close_quietly(self._mm)  # a view outliving this call takes the mapping (and its descriptor)
        self._mm = None


def open_sealed(fd: int, length: int, what: str, private: bool = False, keep: bool = False) -> Mapped:
    """Map a descriptor a peer sent as `length` bytes of `what`, after checking it is a
    sealed memory file of exactly that size. Closes `fd` (the mapping keeps what it
    needs), unless ``keep``: then the mapping holds it (``Mapped.fd``) until it is closed,
    refused or not. ``private``: the mapping is private and writable, never written (a
    payload's: its parts, packed out of band, reach the worker as writable buffers, as an
    embedded caller's arrays do); else shared and read-only. Raises InvalidArgs naming
    what was wrong."""
    kept = False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refused(f"{what}: the descriptor is not a regular file (a sealed memfd is required)")
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            seals = 0
        missing = REQUIRED_SEALS & ~seals
        if missing:
            raise refused(f"{what}: the memfd is not sealed against {_seal_names(missing)} "
                          "(F_SEAL_SHRINK, F_SEAL_GROW and F_SEAL_WRITE are required)")
        if st.st_size != length:
            raise refused(f"{what}: the memfd holds {st.st_size} bytes, the frame says {length}")
        if length < 1:
            raise refused(f"{what}: an empty memfd carries nothing (send the bytes in the frame)")
        if private:
            mm = mmap.mmap(fd, length, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        else:
            mm = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ)
        kept = keep
        return Mapped(mm, fd if keep else -1)
    finally:
        if not kept:
            os.close(fd)


def _seal_names(seals: int) -> str:
    names = [n for n, bit in (("shrinking", fcntl.F_SEAL_SHRINK), ("growing", fcntl.F_SEAL_GROW),
                              ("writing", fcntl.F_SEAL_WRITE)) if seals & bit]
    return ", ".join(names)


def received(ancdata: list) -> list[int]:
    """The descriptors of one recvmsg's ancillary data (SCM_RIGHTS), in order."""
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            ints = array.array("i")
            ints.frombytes(data[:len(data) - len(data) % ints.itemsize])
            fds.extend(ints)
    return fds


def claim(items: list[tuple], fds: list[int], refuse: Callable[[str], Exception],
          noun: str) -> list[Mapped | Held | None]:
    """Map the memfds a frame brought, each in the place of the one item that names it.

    ``items[k]`` is ``(index, length, what, who)``: the index of its descriptor among ``fds``
    (None: it names none; otherwise an int >= 0, as its caller's schema checked), the length
    the frame gives it, ``what`` names the field in messages ("units[1]: payload_fd"), and
    ``who`` the item ("units[1]"); a fifth element, when there is one, is what checks and
    opens its descriptor (`open_parcel`), else `open_sealed`. Every descriptor must be named
    by exactly one item. Returns what each opened, in item order (None for an item that
    names none). Owns ``fds``: on a refusal it raises ``refuse(message)`` (the
    caller's typed error: the daemon's InvalidArgs, the client's BadOutcomeRecord) after
    closing every descriptor and releasing every mapping made; `noun` names the items in the
    message about a descriptor none of them names."""
    fds, mapped = list(fds), []
    try:
        named: dict[int, str] = {}
        for index, _length, what, who, *_opener in items:
            if index is None:
                continue
            if index >= len(fds):
                raise refuse(f"{what} {index} names no descriptor: the frame brought {len(fds)}")
            if index in named:
                raise refuse(f"{what} {index} is named by {named[index]} too")
            named[index] = who
        if len(named) < len(fds):
            unnamed = sorted(set(range(len(fds))) - set(named))
            raise refuse(f"the frame brought {len(fds)} file descriptor(s); no {noun} names "
                         f"{', '.join(map(str, unnamed))}")
        for index, length, what, _who, *opener in items:
            if index is None:
                mapped.append(None)
                continue
            fd, fds[index] = fds[index], -1
            try:
                mapped.append((opener[0] if opener else open_sealed)(fd, length, f"{what} {index}"))
            except ProtocolError as exc:
                raise refuse(exc.message) from None
    except BaseException:
        close_all(fd for fd in fds if fd >= 0)
        for one in mapped:
            if one is not None:
                one.close()
        raise
    return mapped


def close_all(fds) -> None:
    """Close each of `fds`; one closed already (EBADF) is what this call is for, done."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def send_with_fds(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    """Send all of `data` (one frame), the descriptors with its first bytes (one sendmsg of
    that frame's bytes alone: see `Arrivals`), the rest after."""
    if not fds:
        sock.sendall(data)
        return
    sent = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])


class Arrivals:
    """The descriptors a stream brought, each at the stream position of the last byte of the
    recvmsg it came with, until the frame holding that byte claims them (`take`).

    Why the last byte: Linux hands a message's descriptors to the read that takes its first
    byte, and that read may also hold bytes written before it (a read glues earlier plain
    data in front), never bytes written after it (it stops at a message with descriptors).
    A sender passes a frame's descriptors with a message of that frame's bytes alone (its
    first ones: `send_with_fds`), so the last byte of the read is that frame's. A recvmsg
    whose descriptors were cut (MSG_CTRUNC) marks its position: the frame there is refused."""

    __slots__ = ("_fds", "_cut", "position")

    def __init__(self):
        self._fds: collections.deque[tuple[int, int]] = collections.deque()
        self._cut: collections.deque[int] = collections.deque()
        self.position = 0  # stream position of the first byte not yet taken by a frame

    def __len__(self) -> int:
        return len(self._fds)

    def recv(self, sock: socket.socket, size: int, buffered: int) -> bytes:
        """One read of at most `size` bytes from `sock` (raising as `sock.recvmsg` does), its
        descriptors kept at the position of its last byte; `buffered` is how many bytes read
        before it no frame has taken yet."""
        data, ancdata, flags, _ = sock.recvmsg(size, ANCILLARY_SPACE, socket.MSG_CMSG_CLOEXEC)
        if ancdata or flags & _MSG_CTRUNC:
            self.add(self.position + buffered + max(len(data), 1) - 1, received(ancdata), bool(flags & _MSG_CTRUNC))
        return data

    def add(self, at: int, fds: list[int], cut: bool) -> None:
        for fd in fds:
            self._fds.append((at, fd))
        if cut:
            self._cut.append(at)

    def take(self, nbytes: int) -> tuple[list[int], bool]:
        """The descriptors that came with the stream's next `nbytes` bytes (a frame, its
        newline included), and whether some were cut on the way."""
        end = self.position + nbytes
        fds = []
        while self._fds and self._fds[0][0] < end:
            fds.append(self._fds.popleft()[1])
        cut = False
        while self._cut and self._cut[0] < end:
            self._cut.popleft()
            cut = True
        self.position = end
        return fds, cut

    def close(self) -> None:
        close_all(fd for _, fd in self._fds)
        self._fds.clear()
        self._cut.clear()
