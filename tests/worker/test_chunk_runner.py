"""fleet._chunk.run_items: a chunk's items through their handler in one C loop.

The worker's chunk path (`Worker._run_chunk`) rests on it: every item gets a Unit with
its own payload and the chunk's other fields, values come back in order, and an item
that raises stops the loop at that item, with its exception and traceback, so the
worker records it and resumes at the next one."""
from __future__ import annotations

import gc
import sys
import weakref
import traceback

import pytest

import fleet
from fleet._chunk import hand_out, run_items
from fleet.rules.unit import RUNNING, Unit, _Running
from fleet.worker.process import _PAYLOAD_AT

TEMPLATE = Unit(7, "resolve", None, "k", "batch", "req-1")


def run_all(handler, payloads):
    """As the worker runs a chunk: (values, {index: exception})."""
    values, failures, start = [], {}, 0
    while (failed := run_items(handler, TEMPLATE, _PAYLOAD_AT, payloads, values, start)) is not None:
        index, exc = failed
        failures[index] = exc
        values.append(None)
        start = index + 1
    return values, failures


def test_each_item_gets_a_unit_of_the_chunk_with_its_own_payload():
    seen = []
    values, failures = run_all(lambda u: seen.append(u) or u.payload * 2, [1, 2, 3])
    assert values == [2, 4, 6] and failures == {}
    assert [type(u) for u in seen] == [Unit] * 3
    assert seen == [TEMPLATE._replace(payload=p) for p in (1, 2, 3)]


def test_a_failing_item_stops_the_loop_there_with_its_exception_and_traceback():
    def handler(u):
        if u.payload == 2:
            raise ValueError(f"bad {u.payload}")
        return u.payload

    values, failures = run_all(handler, [1, 2, 3, 2, 5])
    assert values == [1, None, 3, None, 5]
    assert sorted(failures) == [1, 3]
    exc = failures[1]
    assert isinstance(exc, ValueError) and str(exc) == "bad 2"
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    assert "in handler" in text and "raise ValueError" in text


def test_a_base_exception_is_an_item_outcome_too():
    def handler(u):
        raise KeyboardInterrupt("stop")

    values, failures = run_all(handler, ["a"])
    assert values == [None] and isinstance(failures[0], KeyboardInterrupt)


def test_start_skips_the_items_already_run():
    values = ["x"]
    assert run_items(lambda u: u.payload, TEMPLATE, _PAYLOAD_AT, [0, 1, 2], values, 1) is None
    assert values == ["x", 1, 2]


def test_an_empty_chunk_runs_nothing():
    values = []
    assert run_items(lambda u: 1 / 0, TEMPLATE, _PAYLOAD_AT, [], values, 0) is None
    assert values == []


def test_payload_at_names_the_field_the_payload_fills():
    values = []
    run_items(lambda u: u, ("a", "b", "c"), 0, [1], values, 0)
    assert values == [(1, "b", "c")] and type(values[0]) is tuple


def test_no_reference_is_leaked_or_lost():
    payload = object()
    kept = []
    before = sys.getrefcount(payload)
    run_all(lambda u: None, [payload] * 100)
    assert sys.getrefcount(payload) == before
    run_all(lambda u: kept.append(u), [payload] * 10)  # units the handler keeps stay whole
    assert all(u.payload is payload and u.role == "resolve" for u in kept)
    assert sys.getrefcount(payload) == before + 10


def test_a_handler_that_grows_the_list_is_safe():
    payloads = [1]

    def handler(u):
        if u.payload < 3:
            payloads.append(u.payload + 1)
        return u.payload

    values, _ = run_all(handler, payloads)
    assert values == [1, 2, 3]


def test_running_holds_each_item_while_its_handler_runs_and_none_between():
    running, seen = _Running(), []

    def handler(u):
        fleet.report_cost(0.5)
        seen.append(fleet.current_unit() is u and running.unit is u)
        return u.payload

    token = RUNNING.set(running)
    try:
        values = []
        assert run_items(handler, TEMPLATE, _PAYLOAD_AT, [1, 2, 3], values, 0, running) is None
    finally:
        RUNNING.reset(token)
    assert values == [1, 2, 3] and seen == [True] * 3
    assert running.unit is None and running.cost == 1.5
    # an item that raises leaves it None too (the worker resumes after it)
    assert run_items(lambda u: 1 / 0, TEMPLATE, _PAYLOAD_AT, [1], [], 0, running)[0] == 0
    assert running.unit is None


def test_with_running_no_reference_is_leaked_and_units_are_still_reused():
    payload, running, ids = object(), _Running(), set()
    before = sys.getrefcount(payload)
    run_items(lambda u: ids.add(id(u)), TEMPLATE, _PAYLOAD_AT, [payload] * 100, [], 0, running)
    assert sys.getrefcount(payload) == before
    assert len(ids) == 1  # the field's reference is dropped before the reuse test


class _NoSlot:
    unit = None


@pytest.mark.parametrize("running", [object(), _NoSlot(), 5])
def test_a_running_object_without_a_unit_slot_is_refused(running):
    values = []
    with pytest.raises(TypeError, match="__slots__ field 'unit'"):
        run_items(lambda u: u, TEMPLATE, _PAYLOAD_AT, [1], values, 0, running)
    assert values == []


@pytest.mark.parametrize("args, error", [
    ((print, TEMPLATE, _PAYLOAD_AT, (1, 2), [], 0), TypeError),  # payloads not a list
    ((print, TEMPLATE, _PAYLOAD_AT, [1], (), 0), TypeError),  # values not a list
    ((print, [1, 2], 0, [1], [], 0), TypeError),  # template not a tuple
    ((print, TEMPLATE, 7, [1], [], 0), ValueError),  # payload_at past the fields
    ((print, TEMPLATE, -1, [1], [], 0), ValueError),
    ((print, TEMPLATE, _PAYLOAD_AT, [1], [], -1), ValueError),
    ((print, TEMPLATE, _PAYLOAD_AT, [1], []), TypeError),  # too few arguments
])
def test_bad_arguments_are_refused_and_run_nothing(args, error):
    with pytest.raises(error):
        run_items(*args)
    if len(args) > 4:
        assert len(args[4]) == 0  # no item ran


# --- hand_out: the caller's side of a map -------------------------------------------------
class _Value:
    """A value a test can hold a weak reference to (an int cannot be)."""


def test_hand_out_gives_the_values_in_order_and_lets_go_of_each_on_the_way():
    values = [_Value(), _Value(), 3]
    it = hand_out(values)
    assert it.__length_hint__() == 3
    first = next(it)
    ref = weakref.ref(first)
    del first
    assert ref() is None  # the list no longer holds it: freed as the caller dropped it
    assert values[0] is None and isinstance(values[1], _Value) and it.__length_hint__() == 2
    rest = list(it)
    assert isinstance(rest[0], _Value) and rest[1] == 3 and values == [None, None, None]
    assert list(it) == [] and it.__length_hint__() == 0


def test_hand_out_of_an_empty_list_ends_and_of_a_non_list_is_a_type_error():
    assert list(hand_out([])) == []
    with pytest.raises(TypeError, match="hand_out takes a list, not tuple"):
        hand_out((1, 2))


def test_a_hand_out_in_a_cycle_is_collected():
    value = _Value()
    value.it = hand_out([value])  # the iterator holds the list that holds what holds it
    ref = weakref.ref(value)
    del value
    gc.collect()
    assert ref() is None
