"""The shared-memory table: slot words, posture, ledger counters, bulkheads.

`SlotTable` is the owner's and workers' handle (transitions through numba kernels,
loaded lazily); `snapshot.take` / `SlotTable.snapshot` is the lock-free reader.
"""
from .segment import (
    BadFleetName,
    TableCorrupt,
    TableError,
    TableInUse,
    TableNotFound,
    TableVersionError,
)
from .table import SlotTable, TransitionRejected, UnknownEvent, event_code

__all__ = [
    "BadFleetName",
    "SlotTable",
    "TableCorrupt",
    "TableError",
    "TableInUse",
    "TableNotFound",
    "TableVersionError",
    "TransitionRejected",
    "UnknownEvent",
    "event_code",
]
