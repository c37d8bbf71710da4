"""The outcome ledger: every submitted unit ends exactly once.

Rules:
* `submitted(id)` opens a unit; an id opened twice trips the fuse.
* `record(id, kind, reason)` closes it with one outcome; an outcome for a unit that
  is not open (never submitted, or already closed: a duplicate) trips the fuse.
* `fsm_refused()` counts a transition the slot FSM refused the runtime (a grant, a
  start, a completion, a dead seat's reset): a broken rule, kept apart from worker
  deaths so it is seen (status shows it; the unit it cost fails `FsmRefused`).
* `stray_result()` counts a message from a worker that was no owed unit's outcome (a
  duplicate, another seat's unit: `fleet.runtime.results`). Only a unit's own code
  makes one, and a unit may not stop the fleet: it is dropped before it gets here, and
  counted here so that status shows it.
* solved + suppressed + failed + in flight == submitted holds after every call; the
  ledger checks it, and `close()` at shutdown checks that nothing is still open (a
  missing outcome) — either way the fuse trips.
* It counts units and items: a unit is one submit, or one chunk of a map, which carries
  its items (a plain submit is one item). A unit's items go where its outcome goes, so
  the same sum holds for items.

A tripped fuse is loud, never silent: it is logged at error, naming the fleet, the
unit and the contradiction, and the code that recorded it; then the fuse action runs.
The default action aborts the process (the design's loud stop: a duplicate or lost
outcome the supervisor recorded itself is a bug no retry may paper over); tests
inject their own.
"""
from __future__ import annotations

import itertools
import logging
import os
import sys
import threading

from admission.records import field, record
from fleet.rules.errors import EXIT_FUSE_TRIPPED, FleetError
from fleet.rules.outcomes import FAILED, FAILURE_REASONS, KINDS, SOLVED, SUPPRESSED

log = logging.getLogger(__name__)


class FuseTripped(FleetError):
    """The ledger found a duplicate or a missing outcome."""

    exit_code = EXIT_FUSE_TRIPPED


def abort_process(error: FuseTripped) -> None:
    """The default fuse action: the loud stop."""
    logging.shutdown()
    os.abort()


#: The item counts, in the order the table stores them.
ITEM_COUNTS = ("submitted", "solved", "suppressed", "failed", "inflight")


@record
class LedgerCounts:
    submitted: int
    solved: int
    suppressed: int
    failed: int
    inflight: int
    failed_by_reason: dict = field(default_factory=dict)
    fsm_refused: int = 0
    #: Messages from workers that were no owed unit's outcome, dropped (`stray_result`).
    stray_results: int = 0
    #: The same five counts in items (`ITEM_COUNTS` keys): a chunk of a map is one unit of many.
    items: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "submitted": self.submitted,
            "solved": self.solved,
            "suppressed": self.suppressed,
            "failed": self.failed,
            "inflight": self.inflight,
            "failed_by_reason": dict(self.failed_by_reason),
            "fsm_refused": self.fsm_refused,
            "stray_results": self.stray_results,
            "items": dict(self.items),
        }


class Ledger:
    """Counts outcomes and guards exactly-once. Thread-safe. `name`: the fleet's, for the
    fuse's report."""

    def __init__(self, on_fuse=abort_process, name: str | None = None):
        self._on_fuse = on_fuse
        self._name = name
        self._lock = threading.Lock()
        self._open: dict[int, int] = {}  # unit id -> its items
        self._submitted = 0
        self._by_kind = dict.fromkeys(KINDS, 0)
        self._items_submitted = 0
        self._items_by_kind = dict.fromkeys(KINDS, 0)
        self._items_open = 0
        self._by_reason = [0] * len(FAILURE_REASONS)
        self._fsm_refused = 0
        self._stray_results = 0
        self.tripped: FuseTripped | None = None

    def _trip(self, message: str) -> None:
        fleet = "" if self._name is None else f"fleet {self._name}: "
        error = FuseTripped(f"{fleet}ledger fuse tripped: {message} (recorded by {_recorder()})")
        self.tripped = error
        log.error("%s", error)
        self._on_fuse(error)

    def submitted(self, unit_id: int, items: int = 1) -> None:
        """Open a unit of `items` items (a chunk of a map: its length; else 1)."""
        with self._lock:
            self._submitted_locked(unit_id, items)

    def submitted_many(self, unit_ids, items=None) -> None:
        """`submitted` for each of `unit_ids`, under one lock (a batch of submits);
        `items`: each one's item count, in the same order (None: one each)."""
        if items is None:
            items = itertools.repeat(1, len(unit_ids))
        elif len(items) != len(unit_ids):
            raise ValueError(f"{len(items)} item counts for {len(unit_ids)} units")
        # The hot path of a burst of submits: the loop inlined, the counters added once.
        opened = self._open
        units = total = 0
        with self._lock:
            for unit_id, n in zip(unit_ids, items):
                if unit_id in opened:
                    self._trip(f"unit {unit_id} submitted twice")
                    continue
                opened[unit_id] = n
                units += 1
                total += n
            self._submitted += units
            self._items_submitted += total
            self._items_open += total

    def _submitted_locked(self, unit_id: int, items: int) -> None:
        if unit_id in self._open:
            self._trip(f"unit {unit_id} submitted twice")
            return
        self._open[unit_id] = items
        self._submitted += 1
        self._items_submitted += items
        self._items_open += items

    def record(self, unit_id: int, kind: str, reason: str | None = None) -> bool:
        """Close a unit with its outcome. False (after tripping the fuse) when it was not open."""
        if kind not in KINDS:
            raise ValueError(f"unknown outcome kind {kind!r}; one of {', '.join(KINDS)}")
        if kind == FAILED and reason not in FAILURE_REASONS:
            raise ValueError(f"unknown failure reason {reason!r}; one of {', '.join(FAILURE_REASONS)}")
        with self._lock:
            closed = self._close_locked(unit_id, kind, reason)
            self._check_locked()
        return closed

    def solved_many(self, unit_ids) -> int:
        """`record(unit_id, SOLVED)` for each of `unit_ids`, under one lock (the units a
        slice of results solved); returns how many were open (the fuse trips for any other)."""
        # The hot path of results: the loop inlined, the counters added once.
        opened = self._open
        closed = total = 0
        with self._lock:
            for unit_id in unit_ids:
                items = opened.pop(unit_id, None)
                if items is None:
                    self._trip(f"outcome {SOLVED}(None) for unit {unit_id}, which is not open (duplicate or unknown)")
                    continue
                closed += 1
                total += items
            self._by_kind[SOLVED] += closed
            self._items_by_kind[SOLVED] += total
            self._items_open -= total
            self._check_locked()
        return closed

    def _close_locked(self, unit_id: int, kind: str, reason: str | None) -> bool:
        try:
            items = self._open.pop(unit_id)
        except KeyError:
            self._trip(f"outcome {kind}({reason}) for unit {unit_id}, which is not open (duplicate or unknown)")
            return False
        self._by_kind[kind] += 1
        self._items_by_kind[kind] += items
        self._items_open -= items
        if kind == FAILED:
            self._by_reason[FAILURE_REASONS.index(reason)] += 1
        return True

    def fsm_refused(self) -> None:
        """Count one transition the slot FSM refused the runtime."""
        with self._lock:
            self._fsm_refused += 1

    def stray_result(self) -> int:
        """Count one message from a worker that was no owed unit's outcome; returns the count."""
        with self._lock:
            self._stray_results += 1
            return self._stray_results

    def _check_locked(self) -> None:
        closed = self._by_kind[SOLVED] + self._by_kind[SUPPRESSED] + self._by_kind[FAILED]
        if closed + len(self._open) != self._submitted:
            self._trip(f"{closed} outcomes + {len(self._open)} in flight != {self._submitted} submitted")
        items = self._items_by_kind[SOLVED] + self._items_by_kind[SUPPRESSED] + self._items_by_kind[FAILED]
        if items + self._items_open != self._items_submitted:
            self._trip(f"{items} items with outcomes + {self._items_open} in flight != {self._items_submitted} "
                       "items submitted")

    def check(self) -> None:
        with self._lock:
            self._check_locked()

    def close(self) -> None:
        """At shutdown: every submitted unit must have its outcome."""
        with self._lock:
            self._check_locked()
            if self._open:
                sample = sorted(self._open)[:10]
                self._trip(f"{len(self._open)} units never got an outcome (e.g. {sample})")

    def is_open(self, unit_id: int) -> bool:
        return unit_id in self._open

    def counts(self) -> LedgerCounts:
        with self._lock:
            return LedgerCounts(
                submitted=self._submitted,
                solved=self._by_kind[SOLVED],
                suppressed=self._by_kind[SUPPRESSED],
                failed=self._by_kind[FAILED],
                inflight=len(self._open),
                failed_by_reason={r: n for r, n in zip(FAILURE_REASONS, self._by_reason) if n},
                fsm_refused=self._fsm_refused,
                stray_results=self._stray_results,
                items=dict(zip(ITEM_COUNTS, self._item_counts_locked())),
            )

    def _item_counts_locked(self) -> tuple[int, ...]:
        k = self._items_by_kind
        return self._items_submitted, k[SOLVED], k[SUPPRESSED], k[FAILED], self._items_open

    def publish(self, table) -> None:
        """Write the counters into the shared table (the ledger is their single writer)."""
        with self._lock:
            table.set_ledger(
                submitted=self._submitted,
                solved=self._by_kind[SOLVED],
                suppressed=self._by_kind[SUPPRESSED],
                failed=self._by_kind[FAILED],
                inflight=len(self._open),
                failed_by_reason=self._by_reason,
                fsm_refused=self._fsm_refused,
                stray_results=self._stray_results,
                items=self._item_counts_locked(),
            )


def _recorder() -> str:
    """Where the call that tripped the fuse came from: the first frame outside this module."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is None:
        return "an unknown caller"
    module = frame.f_globals.get("__name__", "?")
    return f"{module}.{frame.f_code.co_name}, line {frame.f_lineno}"
