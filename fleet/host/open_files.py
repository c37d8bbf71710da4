"""fleetd's limit on open files, and the one the code it runs for its users keeps.

fleetd holds a descriptor per client connection, per large value in flight (a sealed
memfd, a result's parcel it has yet to write out) and per worker (a pidfd). The soft
limit a service starts with is 1024 almost everywhere (systemd's default, kept low for
programs that still use select(), which fails past 1024), and a burst of large results
would exhaust it long before memory. So fleetd raises its soft limit to its hard limit
at boot (`raise_soft`), as systemd advises a service that needs more to do; and, as it
also advises, the processes that run user code (the fork server and the workers it
forks) get the soft limit fleetd found (`found_soft`, passed to the fork server, which
puts it back first thing: `restore_soft`). An embedded fleet never changes its
program's limits.
"""
from __future__ import annotations

import resource

#: The most descriptors the kernel lets one process have (``fs.nr_open``): no limit can
#: be set above it.
NR_OPEN_PATH = "/proc/sys/fs/nr_open"

_found: int | None = None  # the soft limit before this process raised it


def _nr_open() -> int:
    try:
        with open(NR_OPEN_PATH) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20  # the kernel's default


def raise_soft() -> tuple[int, int] | None:
    """Raise this process's soft limit on open files to its hard limit (at most
    ``fs.nr_open``): (before, after), or None when it was there already."""
    global _found
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, _nr_open())  # Linux has no unlimited hard limit on open files
    if soft >= target:
        return None
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    _found = soft
    return soft, target


def found_soft() -> int | None:
    """The soft limit this process had before `raise_soft` raised it (None: not raised):
    what the processes it starts for user code get back."""
    return _found


def restore_soft(soft: int) -> None:
    """Set this process's soft limit on open files to ``soft`` (at most its hard limit)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, hard), hard))
