"""A service client's inlet: its submits straight into the supervisor's loop, through
shared memory, with no thread of fleetd's between.

Why. Through the socket a submit crosses fleetd's control thread: it is woken, reads
the frame, decodes and checks its JSON, queues the units to the loop and rings it, and
the loop then waits for the GIL the control thread holds while it writes its reply
(`docs/internals.md`, "Where a service-mode round trip's time goes"). An inlet is one
byte ring per client connection (`fleet.shm.dataplane`'s format), in a sealed memfd
fleetd makes and hands the client over that connection (SCM_RIGHTS): the client pushes
a batch of plain units into it and rings the loop's bell, and the loop takes the batch
on its next turn itself (`fleet.service.inlets`).

Trust. The client writes the ring's pages and its words: the loop reads it with the
capacity it made it with and checks every frame before a byte is copied
(`fleet._rings.pop_many_checked`); a ring whose words make no sense is an error of that
inlet alone. The memfd is sealed against shrinking and growing, so a client cannot
truncate the pages under the loop (SIGBUS). An inlet is handed only to a client that
may submit (fleetd's uid or root: the mutating ops' rule), which may open the fleet's
data segment itself, bell included; the inlet gives it nothing more.

Format of a message (tag `BATCH`, little-endian): a ``submit_batch`` of plain units, what
its frame would say (`fleet.service.control.ops.units.SubmitBatchOp`): ``rid`` (u64, the
request id its reply on the connection echoes), ``ack`` (i64, how many of the token's
outcomes the client has; -1: none said), flags (u8: 1 the client takes values in memfds,
2 in parcels), the token (u8 length, ASCII), ``n`` (u32) units, each ``seq`` (u64),
``role`` (u16 length, UTF-8) and ``payload`` (u32 length, the pickled bytes).
"""
from __future__ import annotations

import fcntl
import mmap
import os
import struct

from fleet import _rings
from fleet._native import ffi, lib
from fleet.shm import segments
from fleet.shm.dataplane import DataPlaneError, Ring

#: The inlet ring's capacity: a batch of up to half of it travels in one message
#: (`Ring.max_message`); a larger one goes on the socket.
CAPACITY = 1 << 20
#: The one message tag an inlet carries.
BATCH = 1
_HEAD = struct.Struct("<QqBBI")
_UNIT = struct.Struct("<QHI")
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


class InletError(DataPlaneError, ValueError):
    """An inlet message, or the inlet's ring, is not what a client may send."""


def size_for(capacity: int) -> int:
    """The memfd's bytes: the ring, to whole pages."""
    page = mmap.PAGESIZE
    return (int(lib.fleet_ring_bytes(capacity)) + page - 1) // page * page


class Inlet:
    """One inlet's mapping: `make` on fleetd's side (the consumer), `open` on the client's
    (the producer). ``fd`` is fleetd's descriptor of the memfd until `close`."""

    __slots__ = ("ring", "capacity", "fd", "_mm", "_base", "_addr")

    def __init__(self, mm: mmap.mmap, capacity: int, fd: int, producer: bool):
        self._mm, self.capacity, self.fd = mm, capacity, fd
        self._base = ffi.from_buffer(mm)  # pins the mapping while the ring lives
        self._addr = int(ffi.cast("uintptr_t", self._base))
        # The producer trusts fleetd's ring (its words checked once); the consumer never
        # makes a Ring of what a client writes (`take` checks every frame).
        self.ring = Ring(self._base, self._base, "inlet") if producer else None

    @classmethod
    def make(cls, capacity: int = CAPACITY) -> "Inlet":
        """A new inlet (fleetd): a memfd holding an empty ring, sealed at its size."""
        size = size_for(capacity)
        fd = os.memfd_create("fleet-inlet", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            try:
                if lib.fleet_ring_init(ffi.from_buffer(mm), capacity) != 0:
                    raise InletError(f"cannot lay out an inlet ring of {capacity} bytes")
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            except BaseException:
                mm.close()
                raise
        except BaseException:
            os.close(fd)
            raise
        return cls(mm, capacity, fd, producer=False)

    @classmethod
    def open(cls, fd: int, capacity: int) -> "Inlet":
        """The client's side of an inlet fleetd handed over (owns ``fd``: closed here, the
        mapping keeps the memfd). InletError when it is not one."""
        try:
            st = os.fstat(fd)
            if st.st_size != size_for(capacity):
                raise InletError(f"an inlet of capacity {capacity} is {size_for(capacity)} bytes, this one "
                                 f"{st.st_size}")
            mm = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        inlet = cls(mm, capacity, -1, producer=True)
        if inlet.ring.capacity != capacity:
            inlet.close()
            raise InletError(f"the inlet's ring says capacity {inlet.ring.capacity}, fleetd said {capacity}")
        return inlet

    # -- the client's side
    def push(self, rid: int, token: str, ack: int | None, fds: bool, parcels: bool, units: list) -> bool:
        """One batch, ``units`` as ``[(seq, role, payload bytes), ...]``; False when the ring
        has no room for it now. Raises MessageTooLarge when it never could (the socket
        takes it then). The caller rings the loop's bell."""
        name = token.encode("ascii")
        parts = [_HEAD.pack(rid, -1 if ack is None else ack, fds | parcels << 1, len(name), len(units)), name]
        for seq, role, payload in units:
            role_bytes = role.encode()
            parts += (_UNIT.pack(seq, len(role_bytes), len(payload)), role_bytes, payload)
        return self.ring.push(BATCH, b"".join(parts))

    # -- fleetd's side
    def take(self, max_bytes: int = 1 << 20, max_msgs: int = 64) -> list:
        """The messages the client pushed, ``[(tag, memoryview), ...]``, each checked to lie
        in the ring; InletError when the ring's words make no sense."""
        try:
            return _rings.pop_many_checked(self._addr, self.capacity, max_bytes, max_msgs)
        except ValueError as exc:
            raise InletError(f"the inlet's ring is corrupt: {exc}") from None

    def hand_over(self) -> int:
        """fleetd's descriptor of the memfd, given up (to the reply that hands it to the
        client): the mapping keeps the memfd as long as the inlet lives."""
        fd, self.fd = self.fd, -1
        return fd

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
        self.ring = None
        self._base = None
        segments.close_quietly(self._mm)


def decode(view) -> tuple[int, str, int | None, bool, bool, list]:
    """An inlet message: ``(rid, token, ack, fds, parcels, [(seq, role, payload bytes), ...])``.
    InletError naming what is wrong (the counts and lengths must fit the message exactly;
    what the values say is the batch's check, `SubmitBatchOp`'s)."""
    end = len(view)
    if end < _HEAD.size:
        raise InletError(f"an inlet message of {end} bytes is shorter than its head ({_HEAD.size})")
    rid, ack, flags, token_len, n = _HEAD.unpack_from(view)
    at = _HEAD.size + token_len
    if at > end:
        raise InletError(f"an inlet message of {end} bytes ends inside its token")
    try:
        token = bytes(view[_HEAD.size:at]).decode("ascii")
    except UnicodeDecodeError:
        raise InletError("an inlet message's token is not ASCII") from None
    units = []
    for i in range(n):
        if at + _UNIT.size > end:
            raise InletError(f"unit {i} of {n}: the message ends at its head")
        seq, role_len, payload_len = _UNIT.unpack_from(view, at)
        at += _UNIT.size
        if at + role_len + payload_len > end:
            raise InletError(f"unit {i} of {n}: its role and payload ({role_len} + {payload_len} bytes) "
                             "pass the message's end")
        try:
            role = bytes(view[at:at + role_len]).decode()
        except UnicodeDecodeError:
            raise InletError(f"unit {i} of {n}: its role is not UTF-8") from None
        at += role_len
        units.append((seq, role, bytes(view[at:at + payload_len])))
        at += payload_len
    if at != end:
        raise InletError(f"{end - at} bytes after the {n} units of an inlet message")
    return rid, token, None if ack < 0 else ack, bool(flags & 1), bool(flags & 2), units
