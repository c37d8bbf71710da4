"""A handler whose value leaves a mark where it is unpickled: which uid ran code that a
worker chose (``tests.unpickle_marks:marking``, payload: a path prefix)."""
from __future__ import annotations

import os


def mark(prefix: str) -> str:
    """Runs while the value is unpickled: writes ``<prefix>.<euid>``."""
    with open(f"{prefix}.{os.geteuid()}", "w") as f:
        f.write(f"{os.getpid()}\n")
    return "marked"


class _Marks:
    def __init__(self, prefix: str):
        self.prefix = prefix

    def __reduce__(self):
        return (mark, (self.prefix,))


def marking(unit):
    return _Marks(unit.payload)
