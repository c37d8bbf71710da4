"""The cyclic garbage collector held off while a fleet boots (`paused`).

A boot imports the runtime (numpy, fleet's modules: ~100k objects, most of them alive
for the process's life) and builds the supervisor. With the collector on, each 700
allocations run a collection of the young objects, and the older generations' are
walked again as they fill, finding almost nothing to free: ~1% of an Executor's boot
(callgrind: 13 M of its process's 0.99 G instructions to the first result). Held off,
the boot makes no collection at all: with `gc_freeze` its end freezes what is alive
(`freeze_for_fleet`), without a collection first.

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
_frozen_by = 0  # fleets of this process running with their boot's objects frozen
_frozen_before = 0  # objects the program itself had frozen when the first of them froze


def freeze_for_fleet() -> None:
    """A fleet's boot ends with `gc_freeze` (fleet.runtime.boot.settle): what is alive now
    (the modules imported, the supervisor just built) leaves the collector's sight, so a
    full collection no longer walks it all while the fleet runs. Held until the last such
    fleet of the process stops (`thaw_after_fleet`).

    No collection comes first: a full one took ~12 ms of an Executor's way to its first
    result (22k objects walked) to free ~90 objects, the boot's own cycles. Those, and any
    cyclic garbage the program had left uncollected, are frozen with the rest, and freed
    at the thaw."""
    global _frozen_by, _frozen_before
    with _lock:
        if _frozen_by == 0:
            _frozen_before = gc.get_freeze_count()
        gc.freeze()
        _frozen_by += 1


def thaw_after_fleet() -> None:
    """A fleet that froze at boot has stopped. When it was the last, the objects are put
    back in the collector's sight: a stopped fleet is a cycle of objects (its supervisor,
    its seats, the views that keep its shared memory mapped) that only the collector can
    free, and frozen it would stay until the process exits. A program that had frozen
    objects of its own before the first fleet's boot keeps them frozen (`gc.unfreeze`
    cannot tell whose they are), and so keeps the stopped fleets' too."""
    global _frozen_by
    with _lock:
        _frozen_by -= 1
        if _frozen_by == 0 and _frozen_before == 0:
            gc.unfreeze()


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
