"""Handoff: a payload's sealed memfd passed to the worker that runs it, so fleetd copies nothing.

A service-mode client sends a large payload in a sealed memfd (`fleet.service.control.fds`).
Copied into a parcel, its bytes would be written twice on the way in: once by the client,
once by fleetd. Instead fleetd keeps the memfd and hands the worker a descriptor of it.

Each worker of a service-mode fleet has a channel: a SOCK_SEQPACKET socketpair made for it
before its fork (the supervisor keeps one end, the worker inherits the other through the
fork server; `fleet.runtime.workers.Workers.channel`). When the loop sends a task whose payload is in a memfd, it first sends the
memfd's descriptor on the seat's channel, one record per task: the memfd's inode number
and the descriptor (SCM_RIGHTS). The task's body names that inode
(`fleet.worker.codec`). The worker takes the descriptor from its channel as it decodes the
task (`Inbox.take`), maps it privately and builds the payload over the mapping: the arrays it
gets are writable and their own (copy-on-write), and the memfd is sealed, so nobody can change
or cut it under them.

Ownership. The unit owns the supervisor's descriptor (`Handed`) until its outcome,
whatever it is, so a unit that runs again (its worker died, it was refused) is handed
it again. The worker's copy is its own: mapped, then closed. A record for a task the
worker hands back unrun is dropped (`Inbox.drop`). A worker that dies takes its end
with it, and the records still in the channel are freed by the kernel with the
supervisor's end, which is closed as the death is handled: the tasks it never took go to
the seat's next worker, and their records on that worker's new channel. Nothing is ever named:
/dev/shm never sees these bytes, and the kernel frees them with the last descriptor.

A record goes out before its task is pushed, so the worker finds it waiting when it
reads the task: `take` never waits. A record the channel cannot take (its worker stopped
reading for a long while: the supervisor's end holds `SEND_BUFFER` bytes) is logged, and
the unit fails for want of its payload when the worker reads its task.
"""
from __future__ import annotations

import array
import contextlib
import errno
import logging
import os
import queue
import socket
import struct
import threading

log = logging.getLogger(__name__)

#: One record: the memfd's inode number (the task's body names it).
RECORD = struct.Struct("<Q")
#: The supervisor's send buffer on a channel: records are tiny, and a seat is sent at
#: most the tasks it has room for ahead, so this is far more than it ever holds.
SEND_BUFFER = 1 << 20
_FD_SPACE = socket.CMSG_SPACE(array.array("i").itemsize)
_MSG_CTRUNC = int(socket.MSG_CTRUNC)


class HandoffError(Exception):
    """A task's payload descriptor did not come with it (the text says what was looked for)."""


def channel() -> tuple[socket.socket, socket.socket]:
    """A seat's channel: (the supervisor's end, non-blocking; the worker's end, to pass on)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        ours.setblocking(False)
        ours.shutdown(socket.SHUT_RD)  # nothing comes back this way
    except BaseException:
        ours.close()
        theirs.close()
        raise
    return ours, theirs


class Handed:
    """A payload's memfd the supervisor hands to each worker that runs its unit: its
    descriptor (the unit's own until its outcome: `close`), its inode number and size."""

    __slots__ = ("fd", "ino", "size")

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size
        self.ino = os.fstat(fd).st_ino

    def send(self, end: socket.socket | None, seat: int) -> bool:
        """Send the descriptor on a seat's channel (the supervisor's `end`), before its task
        is pushed. False when it could not go (no channel, the channel full or closed): the
        worker then fails the unit for want of its payload, which says so."""
        if end is None:
            log.error("seat %d has no descriptor channel: a payload in a memfd cannot reach its worker", seat)
            return False
        try:
            end.sendmsg([RECORD.pack(self.ino)],
                        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", (self.fd,)))])
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET):  # a dead worker: its death is handled apart
                log.error("seat %d: a payload's descriptor could not be sent to its worker: %s", seat, exc)
            return False
        return True

    def close(self) -> None:
        """Let the memfd go (the unit's outcome). The last descriptor of a large one frees
        its pages, which takes the kernel a while (~0.1 s a GiB): that close is made on a
        thread of its own, not on the supervisor's loop, which serves every unit."""
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        if self.size >= CLOSE_ASIDE_MIN:
            _closer().put(fd)
        else:
            os.close(fd)

    def __del__(self):
        if self.fd >= 0:
            # Every path of a unit closes it at its outcome: one dropped open is a bug, told
            # (its descriptor still goes here).
            with contextlib.suppress(Exception):  # at interpreter exit logging may be gone; the close matters
                log.error("a handed payload's memfd (inode %d) was dropped before its unit's outcome let it go",
                          self.ino)
        self.close()


#: From this size a handed memfd's descriptor is closed beside the loop (`Handed.close`).
CLOSE_ASIDE_MIN = 8 << 20
_CLOSER: queue.SimpleQueue | None = None
_CLOSER_LOCK = threading.Lock()


def _closer() -> queue.SimpleQueue:
    """The queue of descriptors the closing thread closes (started at its first use)."""
    global _CLOSER
    with _CLOSER_LOCK:
        if _CLOSER is None:
            _CLOSER = queue.SimpleQueue()
            threading.Thread(target=_close_each, args=(_CLOSER,), name="fleet-handoff", daemon=True).start()
    return _CLOSER


def _close_each(fds: queue.SimpleQueue) -> None:
    while True:
        fd = fds.get()
        try:
            os.close(fd)
        except OSError as exc:  # noqa: PERF203 - one bad descriptor must not stop the thread
            log.error("a handed memfd's descriptor %d could not be closed: %s", fd, exc)


class Inbox:
    """A worker's end of its seat's channel: the descriptors sent for its tasks, by inode."""

    def __init__(self, end: socket.socket):
        self._end = end
        self._waiting: dict[int, int] = {}  # inode -> descriptor, received before its task asked
        self._lock = threading.Lock()  # a seceded unit's thread and the ring's server may decode at once

    def take(self, ino: int) -> int:
        """The descriptor sent for the task whose payload is the memfd of inode `ino`
        (the caller's to close). Raises HandoffError when none came."""
        with self._lock:
            fd = self._waiting.pop(ino, None)
            while fd is None:
                got = self._receive()
                if got is None:
                    raise HandoffError(f"the descriptor of the payload's memfd (inode {ino}) did not come with "
                                       f"its task")
                if got[0] == ino:
                    fd = got[1]
                else:
                    self._keep(*got)
        if os.fstat(fd).st_ino != ino:
            os.close(fd)
            raise HandoffError(f"the descriptor sent for inode {ino} is of another file")
        return fd

    def drop(self, ino: int) -> None:
        """A task handed back unrun: its descriptor, if it came, goes (sent again with the task)."""
        with self._lock:
            while True:
                got = self._receive()
                if got is None:
                    break
                self._keep(*got)
            fd = self._waiting.pop(ino, None)
        if fd is not None:
            os.close(fd)

    def _keep(self, ino: int, fd: int) -> None:
        old = self._waiting.pop(ino, None)
        if old is not None:
            os.close(old)  # sent again (the unit was handed back and sent anew): the later one stays
        self._waiting[ino] = fd

    def _receive(self) -> tuple[int, int] | None:
        """The next record on the channel, or None when none is waiting."""
        while True:
            try:
                data, ancdata, flags, _ = self._end.recvmsg(RECORD.size, _FD_SPACE,
                                                            socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
            except OSError:  # nothing waiting (EAGAIN), or no channel any more
                return None
            if not data:
                return None  # the supervisor's end is closed
            fds = [fd for level, kind, raw in ancdata if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                   for fd in array.array("i", raw[:len(raw) - len(raw) % 4])]
            if len(data) != RECORD.size or len(fds) != 1 or flags & _MSG_CTRUNC:
                for fd in fds:
                    os.close(fd)
                log.error("a malformed record on the descriptor channel was dropped")
                continue
            return RECORD.unpack(data)[0], fds[0]
