"""The cyclic garbage collector held off while a fleet boots (`paused`).

A boot imports the runtime (numpy, fleet's modules: ~100k objects, most of them alive
for the process's life) and builds the supervisor. With the collector on, each 700
allocations run a collection of the young objects, and the older generations' are
walked again as they fill, finding almost nothing to free: ~1% of an Executor's boot
(callgrind: 13 M of its process's 0.99 G instructions to the first result). Held off,
the boot's end makes the one full collection it makes anyway (`fleet.runtime.boot`:
while the fork server boots, then `gc.freeze`).

Paused process-wide, as the collector is: another thread of the program allocates
without collections for those tenths of a second, which frees its cycles later, not
never. Boots in several threads at once nest: the collector comes back on when the
last of them ends, and only if it was on when the first began (a program that runs
with it off keeps it off).
"""
from __future__ import annotations

import contextlib
import gc
import threading

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def paused():
    """The collector off for the block, then back as it was (also when the block raises)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
