"""Submit from inside (issue 47, items 1 and 2) on the Executor face: a task submits tasks
and maps to the executor that runs it, joins them with the futures API, and a tree of
any depth completes even when every worker holds a waiting task.

Real executors (zygote, workers, rings); every wait is bounded by a timeout.
"""
from __future__ import annotations

import pytest

import fleet
from tests import inside_calls as C
from tests.fleets import executor_left_clean

WAIT_S = 120


@pytest.fixture(scope="module")
def ex():
    """One executor of two workers for the cases that leave it as they found it."""
    yield from executor_left_clean()


def balanced(ledger: dict) -> bool:
    return ledger["inflight"] == 0 and ledger["submitted"] == ledger["solved"] + ledger["failed"] + ledger["suppressed"]


def test_a_task_fans_out_and_joins_its_children(ex):
    before = ex.fleet.ledger()
    assert ex.submit(C.fan_out, 20).result(WAIT_S) == sum(i * i for i in range(20))
    after = ex.fleet.ledger()
    assert after["submitted"] - before["submitted"] == 21  # the parent and its 20 children, each counted
    assert after["solved"] - before["solved"] == 21
    assert balanced(after)


def test_a_parent_that_solved_leaves_no_record_of_its_children(ex):
    """A plain parent's solved end takes the batch path (`Books.close_solved`): the loop
    forgets its children as any end does (`Inside.solved`), or the record would grow with
    every parent that ever ran."""
    future = ex.submit(C.fan_out, 5)
    assert future.result(WAIT_S) == sum(i * i for i in range(5))
    assert ex._sup.inspect(lambda sup: future.unit_id in sup.inside._of or bool(sup.books.get(future.unit_id)),
                           timeout=WAIT_S) is False
    assert ex._sup.inspect(lambda sup: sup._results.batched, timeout=WAIT_S) > 0  # the path it took


@pytest.mark.parametrize("chunksize", [1, 4])
def test_a_task_maps_over_its_children_in_order(ex, chunksize):
    assert ex.submit(C.fan_map, 30, chunksize).result(WAIT_S) == [i * i for i in range(30)]


def test_the_childrens_futures_are_real_futures_in_the_worker(ex):
    done, finished, pending, called, exc_type, exc_text, module = ex.submit(C.futures_api, 6).result(WAIT_S)
    assert done == [i * i for i in range(6)]  # as_completed
    assert (finished, pending) == (6, 0)  # wait
    assert called == [0]  # a callback added in the worker ran there
    assert (exc_type, exc_text) == ("ValueError", "boom 7")  # exception() is the child's own
    assert module == "concurrent.futures._base"


def test_every_worker_holding_a_waiting_task_still_completes(ex):
    # Four parents on two workers: at some point both slots hold a parent that waits, with
    # its children queued behind it; they ride the parents' slots.
    futures = [ex.submit(C.fan_out, 8) for _ in range(4)]
    assert [f.result(WAIT_S) for f in futures] == [140] * 4


def test_a_tree_three_deep_completes(ex):
    assert ex.submit(C.depth, 3, 3).result(WAIT_S) == 27


def test_current_fleet_outside_a_unit_says_why():
    with pytest.raises(fleet.NotInsideUnit, match="inside a running unit") as caught:
        fleet.current_fleet()
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, fleet.FleetError)


def test_current_fleet_in_a_thread_the_task_started_says_why(ex):
    assert ex.submit(C.outside).result(WAIT_S) == ["NotInsideUnit"]


def test_a_childs_payload_and_value_too_large_for_a_ring_travel_beside_it(ex):
    n = 3 << 20  # past INLINE_MAX (1 MiB): parcels in /dev/shm, each removed at its outcome
    assert ex.submit(C.big, n).result(WAIT_S) == (n, n)


def test_shutdown_waits_for_a_parent_whose_children_come_after_it_began():
    with fleet.Executor(max_workers=2) as executor:
        parent = executor.submit(C.fan_out, 30)
    # the executor closed while the parent ran: its children were still taken, and ran
    assert parent.result(0) == sum(i * i for i in range(30))


def test_the_handle_passed_to_a_thread_the_task_started_submits_for_the_task(ex):
    # the task's own thread waits in join(): it seceded all the same, so its children ran
    assert ex.submit(C.from_thread, 10).result(WAIT_S) == [285]
