"""The selector of an I/O seat's event loop: epoll with timeouts to the nanosecond.

`selectors.EpollSelector` hands epoll_wait whole milliseconds, rounded up, so every
timer of an asyncio loop (``asyncio.sleep``, ``wait_for``, ``call_later``) fires up to
a millisecond late, and a little under half a millisecond late on average. On an I/O
seat that is most of the overhead of a short wait: a unit that sleeps 10 ms took
10.9 ms. `PreciseEpollSelector` waits with epoll_pwait2 (Linux 5.11), which takes the
timeout in nanoseconds, so a timer fires when it is due (plus the kernel's timer
slack, 50 us by default).

It is an `EpollSelector` in everything else (registration, the events it reports). On
a kernel without epoll_pwait2 (or a seccomp filter that refuses it) it says so once in
the log and waits as `EpollSelector` does from then on.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import math
import os
import select
import selectors
import time

from fleet import _native

log = logging.getLogger(__name__)

#: Events reported per wait at most (the C side's batch; level-triggered fds that are
#: still ready come back at the next wait, as with epoll_wait).
MAX_EVENTS = 256
_NOT_OFFERED = (errno.ENOSYS, errno.EPERM)
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
#: The wait itself: (epfd, out, max_events, timeout_ns) -> count or -errno (C, no GIL).
_wait = _native.lib.fleet_epoll_wait_ns


def timeout_ns(timeout: float | None) -> int:
    """A selector's timeout in seconds as epoll_pwait2's nanoseconds: -1 waits without
    limit (None), 0 only looks, and a positive timeout rounds up to the next
    nanosecond (a wait is never shorter than asked), never to a whole millisecond."""
    if timeout is None:
        return -1
    if timeout <= 0:
        return 0
    return math.ceil(timeout * 1e9)


class PreciseEpollSelector(selectors.EpollSelector):
    """`selectors.EpollSelector` whose waits end when their timeout is due (see the
    module doc). Use ``asyncio.SelectorEventLoop(PreciseEpollSelector())``."""

    def __init__(self):
        super().__init__()
        #: False once the kernel refused epoll_pwait2: every later wait is EpollSelector's.
        self.precise = True
        self._out = _native.ffi.new("uint64_t[]", MAX_EVENTS)

    def select(self, timeout=None):
        if not self.precise:
            return super().select(timeout)
        ns = timeout_ns(timeout)
        deadline = None if ns < 0 else time.monotonic_ns() + ns
        max_events = min(max(len(self._fd_to_key), 1), MAX_EVENTS)
        out = self._out
        while True:
            n = _wait(self._selector.fileno(), out, max_events, ns)
            if n >= 0:
                break
            if -n == errno.EINTR:
                # A signal came: its Python handler runs as this loops back (raising out
                # of select, if it raises), then the wait goes on for what is left
                # (PEP 475), as select.epoll's does.
                if deadline is not None:
                    ns = max(0, deadline - time.monotonic_ns())
                continue
            if -n in _NOT_OFFERED:
                self.precise = False
                log.info("epoll_pwait2 is not offered here (%s): I/O seat timers fire on whole "
                         "milliseconds", os.strerror(-n))
                return super().select(timeout)
            raise OSError(-n, os.strerror(-n))
        ready = []
        key_of = self._fd_to_key.get
        for i in range(n):
            word = out[i]
            event, fd = word >> 32, word & 0xFFFFFFFF
            events = 0
            if event & ~select.EPOLLIN:
                events |= _WRITE
            if event & ~select.EPOLLOUT:
                events |= _READ
            key = key_of(fd)
            if key:
                ready.append((key, events & key.events))
        return ready


def new_event_loop():
    """An I/O seat's event loop: a selector loop on `PreciseEpollSelector`, unless the
    process set an event loop policy of its own (uvloop's, say): then the policy's."""
    if type(asyncio.get_event_loop_policy()) is asyncio.DefaultEventLoopPolicy:
        return asyncio.SelectorEventLoop(PreciseEpollSelector())
    return asyncio.new_event_loop()
