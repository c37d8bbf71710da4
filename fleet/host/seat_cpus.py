"""The CPUs a process may count on: a fleet worker's seat's, else its affinity.

A worker is pinned to its seat's CPUs at its start (`fleet.worker.process.child_setup`),
and those are its budget whatever its affinity is at the moment: a contended seat's
worker is spread over its role's CPUs for a while (`fleet.rules.contention`), and nested
parallel code in it (joblib, BLAS pools, `fleet.Executor`'s quota) counts the cores the
seat was given, not those it borrows. Kept apart and light: every worker imports it
before its fork.
"""
from __future__ import annotations

from fleet.host import affinity

_seat: tuple[int, ...] | None = None


def seat_pinned(cpus) -> None:
    """This process is a worker pinned to `cpus` by its seat."""
    global _seat
    _seat = tuple(sorted(cpus)) if cpus else None


def budget_cpus() -> list[int]:
    """The CPUs this process may count on: its seat's, in a fleet worker; else its affinity
    (the process's mask, its main thread's: not the calling thread's)."""
    if _seat is not None:
        return list(_seat)
    return sorted(affinity.process_cpus())
