"""The shared-memory table: slot words, posture, ledger counters, bulkheads.

`SlotTable` is the owner's and workers' handle (transitions through the kernels:
numba's, built at install as C entry points, called through fleet._table and loaded
lazily; see kernel_load); `snapshot.take` / `SlotTable.snapshot` is the lock-free reader.
"""
from fleet.shm.table.segment import (
    BadFleetName,
    TableAccessDenied,
    TableCorrupt,
    TableError,
    TableInUse,
    TableNotFound,
    TableVersionError,
)


def __getattr__(name):
    # The owner's handle (numpy, the kernels on first transition) loads on first use, so a
    # reader that only needs `snapshot.read` imports neither.
    if name in ("SlotTable", "TransitionRejected", "UnknownEvent", "event_code"):
        from fleet.shm.table import table

        return getattr(table, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "BadFleetName",
    "SlotTable",
    "TableAccessDenied",
    "TableCorrupt",
    "TableError",
    "TableInUse",
    "TableNotFound",
    "TableVersionError",
    "TransitionRejected",
    "UnknownEvent",
    "event_code",
]
