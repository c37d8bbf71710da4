"""A process forked off a worker is not the worker: it never comes back into fleet's code.

A handler may fork (``if os.fork() == 0: return x`` is sloppy, but libraries do worse).
The child is a copy of the worker: the same rings mapped, the same table, the same
slot its parent is running. Were it to return into the worker's loop it would deliver
a result for its parent's unit, end its parent's slot, and then take units off the
seat's task ring as a second worker nobody forked, watches or kills.

So each worker records, when it starts (`arm`), that it is the process it started as,
and an at-fork hook marks every child forked off it (`stray`). Wherever control comes
back from a unit's code into fleet's (a handler returned or raised, a payload was
unpickled or a result pickled, a thread of the I/O runner finished its call, the seat's
event loop turns) the worker looks at the mark, and a stray ends there (`leave`),
touching no ring, slot or ledger, exactly as a Python process ends when its code does:
status 0 for a return, the `SystemExit` code for ``sys.exit``, 1 with the traceback on
stderr for any other exception. The unit's outcome is its parent's: the worker that
forked it goes on, unaware.

A chunk of a map runs its items in one C loop (`fleet._chunk.run_items`, or the builtin
``map`` over an Executor chunk's list), where no Python of fleet's runs between items.
Both read the list's length before each item, so the at-fork hook empties, in the
child, the item lists of the chunks that are running (`watch`): a child ends after the
item that forked it and runs none of its parent's later items.

The mark comes from Python's own at-fork hooks, which run for `os.fork` and whatever
forks through it (multiprocessing's fork, `os.forkpty`). A fork(2) made from C that
runs no hooks is caught where a unit's slot ends (`fleet.worker.process`), which also
compares the pid (`is_stray`): the child then ends before it writes to the table.

While it runs, such a child is named after its worker with ``-child`` appended
(``fleet-<fleet>-<seat>-child`` in ``ps``), so it is never taken for a second worker.
"""
from __future__ import annotations

import logging
import os
import sys
import traceback

from fleet.host.proctitle import mark_child

TYPE_CHECKING = False  # typing's flag, without typing (~2 ms of the fork server's start)
if TYPE_CHECKING:
    from typing import NoReturn

log = logging.getLogger("fleet.worker.process")

#: True in a process forked off the worker (the at-fork hook sets it in the child).
stray = False
#: The worker's pid (0: not armed: this process is no worker, e.g. the zygote or a test).
_worker_pid = 0
#: The item lists of the chunks running now, emptied in a child (see the module doc).
_running: dict[int, list] = {}


def arm() -> None:
    """Called once by a worker as it starts: this process is the worker."""
    global _worker_pid
    if _worker_pid == 0:
        os.register_at_fork(after_in_child=_forked)
    _worker_pid = os.getpid()


def _forked() -> None:
    global stray
    stray = True
    for items in list(_running.values()):
        items.clear()  # the C loop running them stops after the current item (in this child only)
    _running.clear()
    mark_child()  # ps shows `fleet-<fleet>-<seat>-child`: no second worker of the seat by name


def is_stray() -> bool:
    """This process is not the worker it started as, even if no at-fork hook ran (a
    system call: for once per unit, not per item)."""
    return stray or (_worker_pid != 0 and os.getpid() != _worker_pid)


def watch(items: list) -> None:
    """`items` are a running chunk's: a child forked while they run stops after its item."""
    _running[id(items)] = items


def unwatch(items: list) -> None:
    _running.pop(id(items), None)


def leave(exc: BaseException | None = None) -> NoReturn:
    """End this stray process as its code ended: returned (`exc` None), or raised `exc`."""
    code = 0
    try:
        if isinstance(exc, SystemExit):
            code = _exit_code(exc.code)
        elif exc is not None:
            code = 1
            traceback.print_exception(type(exc), exc, exc.__traceback__)
        log.warning("pid %d, forked off worker pid %d by a unit's code, came back into fleet's worker: "
                    "it exits (status %d); the unit's outcome is its parent's", os.getpid(), _worker_pid, code)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # what the child printed is its own: os._exit would drop it
    except BaseException:  # noqa: BLE001 - nothing may keep a stray from ending
        pass
    finally:
        os._exit(code)


def _exit_code(code) -> int:
    """The status a process exits with for ``sys.exit(code)`` (the text of a non-int
    code goes to stderr, as Python's own exit does)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
