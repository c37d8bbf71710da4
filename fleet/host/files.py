"""Reading a file fleet was pointed at (a config, a trace, a report): a regular file
only, and at most a stated number of bytes of it.

Anything else is refused without being read: a FIFO (a blocking open waits for a
writer), a device (``/dev/zero`` never ends), a directory, a socket. The kind is looked
at before the open, and again on the open file, which is opened non-blocking so that a
FIFO swapped in between cannot hold the open either. Each caller turns the refusal into
its own typed error (ConfigError, TraceError, ReportError).
"""
from __future__ import annotations

import os
import stat

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotRegularFile(ValueError):
    """The path names something other than a regular file (the message says what)."""


class FileTooLarge(ValueError):
    """The file holds more than the caller reads; ``limit`` is that bound in bytes."""

    def __init__(self, limit: int):
        self.limit = limit
        super().__init__(f"larger than {limit} bytes")


def read_regular(path, limit: int) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them.

    Raises NotRegularFile, FileTooLarge, OSError (missing, unreadable) or ValueError (a
    path the OS cannot take, e.g. with a NUL byte)."""
    _check_regular(os.stat(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _check_regular(os.fstat(fd))
        chunks, size = [], 0
        while size <= limit:  # read past the size stat gave: the file may grow meanwhile
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise FileTooLarge(limit)
    return b"".join(chunks)


def _check_regular(st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
        raise NotRegularFile(f"it is {kind}, not a regular file")
