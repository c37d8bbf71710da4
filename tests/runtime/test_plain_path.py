"""Two paths, one outcome: a plain unit (no route, a role no gate holds) is accepted in
bulk and its solved result taken in bulk; a unit with a gate, and every end but a solved
one, keeps the one-unit path (fleet.runtime.accept, fleet.runtime.results). The counters
`Acceptor.batched` and `Results.batched` say which path each unit took; the ledger says
every unit got exactly one outcome on either.
"""
from __future__ import annotations

import pickle
import types
from concurrent.futures import Future

import pytest

import fleet
from fleet.rules.ledger import Ledger
from fleet.rules.pace import Pace
from fleet.runtime.accept import Acceptor
from fleet.runtime.books import Books
from fleet.runtime.config import load_config
from fleet.runtime.future import UnitFuture
from fleet.runtime.gates import Gates
from fleet.runtime.intake import Intake, QueueRoom
from fleet.runtime.results import Results
from fleet.runtime.submit import LoopUnit
from fleet.shm import messages as M

from ..admission_catalog import GLM_AZ, ONE_REFUSAL, catalog
from ..fleets import config, hold_loop, role, running, unique_name

WAIT_S = 60.0


def _paths(f) -> tuple[int, int]:
    """(units accepted in bulk, solved results taken in bulk), read on the loop."""
    return f._sup.inspect(lambda sup: (sup._accept.batched, sup._results.batched), timeout=WAIT_S)


def _one_outcome_each(f, n: int) -> dict:
    counts = f.ledger()
    assert counts["submitted"] == n
    assert counts["submitted"] == counts["solved"] + counts["suppressed"] + counts["failed"]
    assert counts["inflight"] == 0
    return counts


def test_a_run_of_plain_submits_is_accepted_and_taken_in_bulk():
    with running(config(unique_name("plain"), {"work": role("echo", slots=2)})) as f:
        go = hold_loop(f)
        futures = [f.submit("work", i) for i in range(50)]
        go.set()
        assert [x.result(WAIT_S) for x in futures] == list(range(50))
        accepted, taken = _paths(f)
        assert accepted == 50  # the run the held loop found queued
        assert taken == 50  # every solved plain result
        assert _one_outcome_each(f, 50)["solved"] == 50


def test_a_maps_chunks_whose_items_all_solved_are_taken_in_bulk_and_counted_by_item():
    with running(config(unique_name("plain"), {"work": role("echo", slots=2)})) as f:
        assert list(f.map("work", range(100), chunksize=10)) == list(range(100))
        assert _paths(f)[1] == 10  # every chunk's values, on the batch path
        counts = f.ledger()
        assert (counts["submitted"], counts["solved"], counts["inflight"]) == (10, 10, 0)
        assert (counts["items"]["submitted"], counts["items"]["solved"], counts["items"]["inflight"]) == (100, 100, 0)


def test_a_chunk_with_an_item_that_failed_keeps_the_one_unit_path():
    with running(config(unique_name("plain"), {"work": role("square", slots=2)})) as f:
        assert list(f.map("work", range(20), chunksize=10)) == [i * i for i in range(20)]  # both chunks in bulk
        with pytest.raises(TypeError):  # "x" * "x": the item's own exception
            list(f.map("work", [1, 2, "x", 4], chunksize=4))
        assert _paths(f)[1] == 2  # the failed item's chunk ended on the one-unit path
        counts = f.ledger()
        assert (counts["submitted"], counts["solved"], counts["failed"], counts["inflight"]) == (3, 2, 1, 0)
        assert (counts["items"]["solved"], counts["items"]["failed"]) == (20, 4)


def test_a_lone_plain_submit_still_ends_in_bulk():
    with running(config(unique_name("plain"), {"work": role("echo", slots=2)})) as f:
        assert f.submit("work", 7).result(WAIT_S) == 7
        assert _paths(f)[1] == 1
        _one_outcome_each(f, 1)


def test_ends_other_than_solved_take_the_one_unit_path_and_each_unit_ends_once():
    roles = {"work": role("echo", slots=2), "fails": role("fail", slots=1), "bad": role("unreadable", slots=1)}
    for name in ("fails", "bad"):
        del roles[name]["peak_cpus"]  # the declared peaks add up against the quota
    with running(config(unique_name("plain"), roles)) as f:
        go = hold_loop(f)
        ok = [f.submit("work", i) for i in range(10)]
        failed = [f.submit("fails", i) for i in range(3)]
        unreadable = f.submit("bad", None)
        go.set()
        assert [x.result(WAIT_S) for x in ok] == list(range(10))
        for x in failed:
            with pytest.raises(ValueError, match="bad payload"):  # the handler's own exception
                x.result(WAIT_S)
        with pytest.raises(fleet.UnitFailed) as info:
            unreadable.result(WAIT_S)
        assert info.value.reason == "ResultError"  # read in the bulk pass, ended on the one-unit path
        accepted, taken = _paths(f)
        assert accepted == 14
        assert taken == 10
        counts = _one_outcome_each(f, 14)
        assert (counts["solved"], counts["failed"]) == (10, 4)


def test_a_unit_with_a_route_keeps_the_gated_path():
    cfg = config(unique_name("plain"), {"plain": {"kind": "pooled", "handler": "tests.provider_handlers:call",
                                                  "slots": 2, "peak_cpus": 1, "queue_bound": 1000}})
    cfg["admission"] = catalog(**ONE_REFUSAL)
    with running(cfg) as f:
        go = hold_loop(f)
        before = [f.submit("plain", {}) for _ in range(5)]
        routed = f.submit("plain", {"cost": 0.5}, route=GLM_AZ)
        after = [f.submit("plain", {}) for _ in range(5)]
        go.set()
        assert routed.result(WAIT_S) == str(GLM_AZ)
        assert [x.result(WAIT_S) for x in before + after] == [None] * 10
        accepted, taken = _paths(f)
        assert (accepted, taken) == (10, 10)  # all but the routed unit
        # the provider gate heard of the routed unit's end (its pool took the reported cost)
        pools = {b["pool"]: b for b in f.status()["admission"]["bulkheads"]}
        assert pools[str(GLM_AZ)]["mean_cost"] == pytest.approx(0.5)
        _one_outcome_each(f, 11)


class _Dispatcher:
    """The dispatcher's side of a result slice: where each unit was sent, what completed."""

    def __init__(self, where: dict):
        self.where, self.completed = dict(where), []

    def slot_of(self, unit_id):
        return self.where.get(unit_id)

    def complete(self, unit_id, final):
        self.completed.append(unit_id)
        return self.where.pop(unit_id)


class _Seats:
    slot_seats = (0, 0, 0)

    def seat_of(self, slot):
        return self.slot_seats[slot]

    def name(self, seat):
        return f"seat-{seat}"


def _result(unit_id: int, slot: int, status: int, body: bytes) -> tuple:
    return M.RESULT, memoryview(M.RESULT_HEAD.pack(unit_id, slot, status, 0, 1e-6, float("nan"), float("nan")) + body)


def test_outcomes_in_a_slice_resolve_in_the_order_their_results_came_on_both_paths():
    roles = load_config({"roles": {"work": role("echo")}}, env={}).roles
    books = Books("t", roles, Ledger(name="t"), QueueRoom([100]), Gates(None, 1))
    units = [LoopUnit(unit_id=i, role=0, future=UnitFuture(), body=b"", flags=0, timeout=None, plain=True,
                      queued=False) for i in (1, 2, 3)]
    for unit in units:
        books.enter(unit)
    order = []
    for unit in units:
        unit.future.add_done_callback(lambda f, i=unit.unit_id: order.append(i))
    results = Results(_Seats(), books, _Dispatcher({1: 0, 2: 1, 3: 2}), None, None, roles, None, None, None)
    # plain solved, then a suppressed one (the one-unit path), then a plain chunk that solved
    chunk = ([1, 2], {})
    results.take([_result(1, 0, M.ST_SOLVED, pickle.dumps("a")), _result(2, 1, M.ST_SUPPRESSED, b"no"),
                  _result(3, 2, M.ST_CHUNK, pickle.dumps(chunk))], 0)
    books.deliver()
    assert order == [1, 2, 3]
    assert results.batched == 2
    assert (units[0].future.result(0), units[2].future.result(0)) == ("a", chunk)
    counts = books.ledger.counts()
    assert (counts.submitted, counts.solved, counts.suppressed, counts.inflight) == (3, 2, 1, 0)


def test_a_run_in_the_intake_is_drained_in_one_call_in_order_between_other_commands():
    intake = Intake(lambda: None)
    seen = []

    def one(x):
        seen.append(("one", x))

    intake.take_runs(one, lambda run: seen.append(("run", [args[0] for args in run])))
    for x in (1, 2, 3):
        intake.post(one, x)
    intake.post(seen.append, "other")
    intake.post(one, 4)
    for x in (5, 6):
        intake.post(one, x)
    assert intake.drain(limit=7) == 7
    assert seen == [("run", [1, 2, 3]), "other", ("run", [4, 5, 6])]


def test_a_run_stops_at_the_drain_limit_and_at_a_command_awaiting_its_reply():
    intake = Intake(lambda: None)
    seen = []

    def one(x):
        seen.append(x)
        return x

    intake.take_runs(one, lambda run: seen.append([args[0] for args in run]))
    for x in (1, 2, 3):
        intake.post(one, x)
    assert intake.drain(limit=2) == 2
    assert seen == [[1, 2]]
    reply = Future()
    intake.post(one, 4, reply=reply)
    intake.post(one, 5)
    assert intake.drain() == 3
    assert seen == [[1, 2], 3, 4, 5] and reply.result(0) == 4


def test_what_a_failed_run_did_not_take_goes_back_to_the_head_of_the_intake():
    intake = Intake(lambda: None)
    took, turned_away = [], []

    def one(x):
        took.append(x)

    def many(run):
        took.extend(args[0] for args in run[:2])
        del run[:2]  # took the first two, then failed
        raise RuntimeError("a bug")

    intake.take_runs(one, many)
    for x in (1, 2, 3, 4):
        intake.post(one, x, refused=lambda error, x: turned_away.append(x))
    with pytest.raises(RuntimeError):
        intake.drain()
    assert took == [1, 2]
    intake.close("stopped")
    assert turned_away == [3, 4]  # back in order, with their own refusal: not lost


class _Door:
    closing = False
    role_stops = types.SimpleNamespace(view=frozenset())


def test_a_run_that_fails_at_one_unit_hands_back_only_the_units_after_it():
    entered = []
    books = types.SimpleNamespace(enter_many=lambda units: entered.extend(u.unit_id for u in units))
    gates = types.SimpleNamespace(open_to=lambda unit: unit.route is None)
    dispatcher = types.SimpleNamespace(enqueue_many=lambda units: None)
    acceptor = Acceptor(_Door(), books, gates, dispatcher, None)

    def broken(unit, arrival):
        raise RuntimeError("a bug")

    acceptor.accept = broken
    units = [LoopUnit(unit_id=i, role=0, future=UnitFuture(), body=b"", flags=0, timeout=None) for i in range(1, 6)]
    units[2].route = "routed"  # takes `accept`, which fails
    posted = [(unit, None) for unit in units]
    with pytest.raises(RuntimeError):
        acceptor.accept_run(posted)
    assert entered == [1, 2]
    assert [unit.unit_id for unit, _ in posted] == [4, 5]  # what goes back to the intake


@pytest.mark.parametrize("runs", [[1e-6] * 5, [0.5, 1e-6, 1e-6], [1e-6, float("nan"), -1.0, 0.2], [0.3]])
def test_pacing_a_slice_at_once_leaves_what_pacing_it_unit_by_unit_leaves(runs):
    one, many = Pace([16]), Pace([16])
    for s in runs:
        one.ran(0, s)
    before = many.depths[0]
    depth = many.ran_many(0, runs)
    assert (one.run_s(0), one.depths) == (many.run_s(0), many.depths)
    assert depth == (None if many.depths[0] == before else many.depths[0])  # told only of a change
