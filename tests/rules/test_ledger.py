"""The outcome ledger: exactly one outcome per unit, and a loud fuse otherwise.

A hypothesis state machine drives the real ledger beside a plain model."""
from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fleet.rules.ledger import FuseTripped, Ledger
from fleet.rules.outcomes import FAILURE_REASONS


class Fuse:
    def __init__(self):
        self.trips = []

    def __call__(self, error):
        self.trips.append(error)


def test_exact_counts():
    ledger = Ledger(on_fuse=Fuse())
    for uid in range(5):
        ledger.submitted(uid)
    ledger.record(0, "solved")
    ledger.record(1, "suppressed")
    ledger.record(2, "failed", "LaneDeath")
    counts = ledger.counts()
    assert (counts.submitted, counts.solved, counts.suppressed, counts.failed, counts.inflight) == (5, 1, 1, 1, 2)
    assert counts.failed_by_reason == {"LaneDeath": 1}


def test_a_chunk_is_one_unit_of_its_items_and_its_items_go_where_its_outcome_goes():
    ledger = Ledger(on_fuse=Fuse())
    ledger.submitted(1, 64)  # a chunk of a map
    ledger.submitted(2)  # a plain submit: one item
    ledger.submitted_many([3, 4, 5], [64, 64, 40])
    ledger.record(1, "solved")
    ledger.record(3, "failed", "HandlerError")
    ledger.solved_many([2, 5])
    counts = ledger.counts()
    assert (counts.submitted, counts.solved, counts.failed, counts.inflight) == (5, 3, 1, 1)
    assert counts.items == {"submitted": 233, "solved": 105, "suppressed": 0, "failed": 64, "inflight": 64}
    assert counts.to_dict()["items"] == counts.items
    ledger.record(4, "suppressed")
    assert ledger.counts().items == {"submitted": 233, "solved": 105, "suppressed": 64, "failed": 64, "inflight": 0}


def test_a_batch_of_submits_with_items_needs_one_count_per_unit():
    ledger = Ledger(on_fuse=Fuse())
    with pytest.raises(ValueError):
        ledger.submitted_many([1, 2], [64])


def test_a_duplicate_outcome_trips_the_fuse():
    fuse = Fuse()
    ledger = Ledger(on_fuse=fuse)
    ledger.submitted(1)
    assert ledger.record(1, "solved")
    assert not ledger.record(1, "failed", "Timeout")
    assert len(fuse.trips) == 1 and isinstance(fuse.trips[0], FuseTripped)
    assert "not open" in str(fuse.trips[0]) and fuse.trips[0].exit_code == 83


def test_the_fuses_report_names_the_fleet_the_unit_the_contradiction_and_who_recorded_it():
    fuse = Fuse()
    ledger = Ledger(on_fuse=fuse, name="prod")
    ledger.submitted(7)
    ledger.record(7, "solved")
    ledger.record(7, "failed", "Timeout")
    ledger.solved_many([7])
    report = [str(trip) for trip in fuse.trips]
    assert len(report) == 2
    for text in report:
        assert text.startswith("fleet prod: ledger fuse tripped: outcome ")
        assert "for unit 7, which is not open" in text
        where = "recorded by tests.rules.test_ledger.test_the_fuses_report_names_the_fleet_the_unit_the_contradiction"
        assert where in text, text


def test_stray_results_are_counted_apart_from_outcomes():
    ledger = Ledger(on_fuse=Fuse())
    ledger.submitted(1)
    assert ledger.stray_result() == 1 and ledger.stray_result() == 2
    counts = ledger.counts()
    assert (counts.stray_results, counts.inflight, counts.solved, counts.failed) == (2, 1, 0, 0)
    assert counts.to_dict()["stray_results"] == 2


def test_an_unknown_unit_trips_the_fuse():
    fuse = Fuse()
    Ledger(on_fuse=fuse).record(99, "solved")
    assert fuse.trips


def test_a_missing_outcome_trips_the_fuse_at_close():
    fuse = Fuse()
    ledger = Ledger(on_fuse=fuse)
    ledger.submitted(1)
    ledger.submitted(2)
    ledger.record(1, "solved")
    ledger.close()
    assert len(fuse.trips) == 1 and "never got an outcome" in str(fuse.trips[0])


def test_a_unit_submitted_twice_trips_the_fuse():
    fuse = Fuse()
    ledger = Ledger(on_fuse=fuse)
    ledger.submitted(1)
    ledger.submitted(1)
    assert fuse.trips


def test_a_batch_of_submits_counts_each_and_trips_on_one_seen_before():
    fuse = Fuse()
    ledger = Ledger(on_fuse=fuse)
    ledger.submitted_many([1, 2, 3])
    assert ledger.counts().submitted == 3 and ledger.counts().inflight == 3 and not fuse.trips
    ledger.submitted_many([4, 2])  # 4 counts; 2 was submitted already
    assert len(fuse.trips) == 1 and "unit 2 submitted twice" in str(fuse.trips[0])
    assert ledger.counts().submitted == 4 and ledger.is_open(4)


def test_a_slice_of_solved_units_is_ledgered_at_once_and_trips_on_one_not_open():
    fuse = Fuse()
    ledger = Ledger(on_fuse=fuse)
    ledger.submitted_many([1, 2, 3, 4])
    assert ledger.solved_many([1, 3]) == 2
    counts = ledger.counts()
    assert (counts.solved, counts.inflight) == (2, 2) and not fuse.trips
    assert ledger.solved_many([2, 3, 99]) == 1  # 2 closes; 3 was closed already, 99 never opened
    assert len(fuse.trips) == 2 and "unit 3, which is not open" in str(fuse.trips[0])
    counts = ledger.counts()
    assert (counts.submitted, counts.solved, counts.inflight) == (4, 3, 1) and ledger.is_open(4)


def test_the_fuse_is_logged_at_error(caplog):
    ledger = Ledger(on_fuse=Fuse())
    with caplog.at_level("ERROR", logger="fleet.rules.ledger"):
        ledger.record(5, "solved")
    assert any("fuse tripped" in r.getMessage() for r in caplog.records)


def test_the_default_fuse_aborts_the_process():
    import subprocess
    import sys

    code = "from fleet.rules.ledger import Ledger\nLedger().record(1, 'solved')\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -6  # SIGABRT: the loud stop
    assert "fuse tripped" in proc.stderr


@pytest.mark.parametrize("kind,reason", [("exploded", None), ("failed", "Gremlins"), ("failed", None)])
def test_bad_outcomes_are_refused_and_change_nothing(kind, reason):
    ledger = Ledger(on_fuse=Fuse())
    ledger.submitted(1)
    with pytest.raises(ValueError):
        ledger.record(1, kind, reason)
    assert ledger.is_open(1) and ledger.counts().inflight == 1


class LedgerMachine(RuleBasedStateMachine):
    """The real ledger against a model: open ids, and outcomes by kind and reason."""

    def __init__(self):
        super().__init__()
        self.fuse = Fuse()
        self.ledger = Ledger(on_fuse=self.fuse)
        self.open, self.closed = {}, {}  # id -> items; id -> (kind, reason, items)
        self.next_id = 0
        self.trips = 0

    @rule(items=st.integers(1, 1000))
    def submit(self, items):
        self.ledger.submitted(self.next_id, items)
        self.open[self.next_id] = items
        self.next_id += 1

    @rule(sizes=st.lists(st.integers(1, 64), min_size=1, max_size=5))
    def submit_a_batch(self, sizes):
        ids = list(range(self.next_id, self.next_id + len(sizes)))
        self.ledger.submitted_many(ids, sizes)
        self.open.update(zip(ids, sizes))
        self.next_id += len(sizes)

    @rule(data=st.data(), kind=st.sampled_from(["solved", "suppressed", "failed"]),
          reason=st.sampled_from(FAILURE_REASONS))
    def finish(self, data, kind, reason):
        if not self.open:
            return
        uid = data.draw(st.sampled_from(sorted(self.open)))
        self.ledger.record(uid, kind, reason if kind == "failed" else None)
        self.closed[uid] = (kind, reason if kind == "failed" else None, self.open.pop(uid))

    @rule(data=st.data())
    def finish_a_slice(self, data):
        if not self.open:
            return
        uids = data.draw(st.lists(st.sampled_from(sorted(self.open)), min_size=1, unique=True))
        assert self.ledger.solved_many(uids) == len(uids)
        for uid in uids:
            self.closed[uid] = ("solved", None, self.open.pop(uid))

    @rule(data=st.data())
    def duplicate(self, data):
        if not self.closed:
            return
        uid = data.draw(st.sampled_from(sorted(self.closed)))
        self.ledger.record(uid, "solved")
        self.trips += 1

    @invariant()
    def counts_match(self):
        c = self.ledger.counts()
        kinds = [k for k, _, _ in self.closed.values()]
        assert c.submitted == self.next_id and c.inflight == len(self.open)
        assert (c.solved, c.suppressed, c.failed) == (kinds.count("solved"), kinds.count("suppressed"), kinds.count("failed"))
        items = {k: sum(n for kind, _, n in self.closed.values() if kind == k) for k in ("solved", "suppressed", "failed")}
        assert c.items == {"submitted": sum(self.open.values()) + sum(items.values()), **items,
                           "inflight": sum(self.open.values())}
        reasons = {}
        for k, r, _ in self.closed.values():
            if k == "failed":
                reasons[r] = reasons.get(r, 0) + 1
        assert c.failed_by_reason == reasons
        assert len(self.fuse.trips) == self.trips


TestLedgerMachine = LedgerMachine.TestCase


def test_fsm_refusals_are_counted_apart_from_outcomes(fleet_name):
    from fleet.rules.roles import RoleSet, Role
    from fleet.shm.table import SlotTable

    ledger = Ledger(on_fuse=lambda e: None)
    ledger.submitted(1)
    ledger.submitted(2, 64)
    ledger.record(1, "failed", "FsmRefused")
    ledger.fsm_refused()
    ledger.fsm_refused()  # e.g. a dead seat's reset refused: no unit behind it
    counts = ledger.counts()
    assert (counts.failed, counts.failed_by_reason, counts.fsm_refused) == (1, {"FsmRefused": 1}, 2)
    assert counts.to_dict()["fsm_refused"] == 2
    table = SlotTable.create(fleet_name, RoleSet((Role("r", handler="m:f"),)), 1)
    try:
        ledger.publish(table)
        view = table.snapshot().ledger_view()
        assert view["fsm_refused"] == 2
        assert (view["submitted"], view["inflight"]) == (2, 1)
        assert view["items"] == {"submitted": 65, "solved": 0, "suppressed": 0, "failed": 1, "inflight": 64}
        assert view["failed_by_reason"][FAILURE_REASONS.index("FsmRefused")] == 1
    finally:
        table.close()
        table.unlink()
