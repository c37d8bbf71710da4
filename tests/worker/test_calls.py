"""fleet.worker.calls: a call unit's handler and the chunk of map calls (pure: no fleet)."""
from __future__ import annotations

import operator
import pickle

import pytest

from fleet.rules.unit import Unit
from fleet.worker import calls
from tests import executor_calls as C


def unit(payload) -> Unit:
    return Unit(1, "call", payload, None, None, None)


def test_a_call_passes_its_args_and_its_kwargs_only_when_there_are_some():
    assert calls.call(unit((C.add, (2,), {"y": 5}))) == 7
    assert calls.call(unit((C.add, (2, 3), calls.NO_KWARGS))) == 5


def test_a_chunk_calls_its_function_once_per_item_and_star_spreads_each_item():
    values = []
    assert calls.run_chunk(calls.Calls(C.square, [1, 2, 3]), values) is None
    assert values == [1, 4, 9]
    values = []
    assert calls.run_chunk(calls.Calls(C.add, [(1, 2), (3, 4)], star=True), values) is None
    assert values == [3, 7]
    # one iterable of tuples, not star: each tuple is the one argument (the builtin map's rule)
    values = []
    assert calls.run_chunk(calls.Calls(len, [(1, 2), (3, 4, 5)]), values) is None
    assert values == [2, 3]


def test_a_raising_call_stops_the_run_at_its_index_keeping_the_values_before_it():
    chunk = calls.Calls(C.divide, [(1, 1), (2, 1), (1, 0), (3, 1), (1, 0), (4, 2)], star=True)
    values = []
    index, exc = calls.run_chunk(chunk, values)
    assert (index, type(exc), values) == (2, ZeroDivisionError, [1.0, 2.0])
    values.append(None)  # what the worker records for the failed call
    index, exc = calls.run_chunk(chunk, values, index + 1)
    assert (index, values) == (4, [1.0, 2.0, None, 3.0])
    values.append(None)
    assert calls.run_chunk(chunk, values, index + 1) is None
    assert values == [1.0, 2.0, None, 3.0, None, 2.0]


def test_a_chunk_counts_its_calls_and_pickles_its_function_once():
    chunk = calls.Calls(C.add, zip(range(64), range(64)), star=True)
    assert len(chunk) == 64 and "add" in repr(chunk) and "64" in repr(chunk)
    back = pickle.loads(pickle.dumps(chunk))
    assert (back.fn, back.items, back.star) == (C.add, chunk.items, True)
    body = pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL)
    assert body.count(b"executor_calls") == 1
    as_tuples = pickle.dumps([(C.add, (i, i), calls.NO_KWARGS) for i in range(64)], protocol=pickle.HIGHEST_PROTOCOL)
    assert len(body) < len(as_tuples)


def test_a_chunk_of_a_module_level_function_travels_by_name_as_a_plain_tuple():
    chunk = calls.Calls(C.add, [(1, 2), (3, 4)], star=True)
    assert chunk.wire == (calls.WIRE, "tests.executor_calls", "add", chunk.items, True)
    body = pickle.dumps(chunk.wire, protocol=pickle.HIGHEST_PROTOCOL)
    assert b"Calls" not in body  # no reference pickle would look up: the class, nor the function
    calls._FOUND.pop(("tests.executor_calls", "add"), None)
    back = calls.Calls.from_wire(pickle.loads(body))
    assert (back.fn, back.items, back.star, len(back)) == (C.add, chunk.items, True, 2)
    assert calls._FOUND[("tests.executor_calls", "add")] is C.add
    values = []
    assert calls.run_chunk(back, values) is None and values == [3, 7]
    assert calls.Calls.is_wire(chunk.wire)
    # a chunk of items (a role's own handler's) is no wire, whatever it holds
    for payload in (list(chunk.wire), chunk.wire[:4], ("other", "m", "f", [], False), (calls.WIRE, "m", "f", (), 0)):
        assert not calls.Calls.is_wire(payload)


def test_a_chunk_whose_function_does_not_travel_by_name_is_pickled_as_itself(monkeypatch):
    def nested(x):
        return x

    for fn in (nested, operator.itemgetter(0), C.square.__call__):
        assert calls.Calls(fn, [1]).wire is not None and type(calls.Calls(fn, [1]).wire) is calls.Calls
    original = C.square
    monkeypatch.setattr(C, "square", lambda x: -x)  # rebound: no longer its module's own name
    assert type(calls.Calls(original, [1]).wire) is calls.Calls


def test_a_chunk_name_the_worker_cannot_find_fails_as_its_unpickling_would():
    from fleet.worker.codec import CodecError

    with pytest.raises(CodecError, match=r"the payload cannot be unpickled in the worker: AttributeError"):
        calls.Calls.from_wire((calls.WIRE, "tests.executor_calls", "no_such_function", [1], False))


def test_a_chunk_of_a_builtin_and_of_no_items_runs():
    values = []
    assert calls.run_chunk(calls.Calls(operator.neg, []), values) is None and values == []
    assert calls.run_chunk(calls.Calls(operator.neg, range(3)), values) is None and values == [0, -1, -2]


def test_a_base_exception_of_a_call_is_that_calls_outcome_too():
    def leaves(x):
        raise SystemExit(x)
    values = []
    index, exc = calls.run_chunk(calls.Calls(leaves, [7]), values)
    assert index == 0 and isinstance(exc, SystemExit) and values == []


@pytest.mark.parametrize("start", [1, 2])
def test_a_run_resumed_past_the_start_calls_only_the_rest(start):
    seen = []
    chunk = calls.Calls(seen.append, ["a", "b", "c"])
    values = [None] * start
    assert calls.run_chunk(chunk, values, start) is None
    assert seen == ["a", "b", "c"][start:] and len(values) == 3


def test_a_module_level_function_travels_by_name_and_the_worker_finds_it_once():
    import math

    payload = calls.call_payload(C.add, (2, 3), calls.NO_KWARGS)
    assert payload == ("tests.executor_calls", "add", (2, 3), calls.NO_KWARGS)
    assert calls.call_payload(math.sqrt, (9,), calls.NO_KWARGS)[:2] == ("math", "sqrt")
    assert calls.call_payload(pow, (2, 3), calls.NO_KWARGS)[:2] == ("builtins", "pow")
    assert list(calls.payloads(C.add, [(1, 2), (3,)])) == [("tests.executor_calls", "add", (1, 2), calls.NO_KWARGS),
                                                         ("tests.executor_calls", "add", (3,), calls.NO_KWARGS)]
    calls._FOUND.pop(("tests.executor_calls", "add"), None)
    assert calls.call(unit(pickle.loads(pickle.dumps(payload)))) == 5
    assert calls._FOUND[("tests.executor_calls", "add")] is C.add  # imported once, then looked up
    assert calls.call(unit(("tests.executor_calls", "add", (2,), {"y": 5}))) == 7


def test_what_is_not_its_modules_own_name_travels_as_pickle_writes_it():
    import functools

    def nested(x):
        return x

    class Thing:
        def method(self):
            return 1

    for fn in (lambda x: x, nested, functools.partial(C.add, 1), [].append, Thing().method, Thing.method,
               operator.itemgetter(0), C.square.__call__):
        assert calls.call_payload(fn, (1,), calls.NO_KWARGS)[0] is fn  # (fn, args, kwargs): pickle's way
    assert not {id(fn) for fn in calls._NAMES} & {id(nested), id(Thing.method)}  # nor kept (a closure made per call)


def test_a_function_its_module_no_longer_holds_goes_the_whole_way_again(monkeypatch):
    """Checked at every call, as pickle checks at every pickle: rebound in its module, the
    function is no longer that name, and pickle says so (its PicklingError, at submit)."""
    original = C.square
    assert calls.call_payload(original, (2,), calls.NO_KWARGS)[:2] == ("tests.executor_calls", "square")
    monkeypatch.setattr(C, "square", lambda x: -x)
    assert calls.call_payload(original, (2,), calls.NO_KWARGS)[0] is original
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(original)
    assert calls.payloads(original, [(1,), (2,)]).__next__()[0] is original  # a map looks once, the same way


def test_a_name_the_worker_cannot_find_fails_as_its_unpickling_would():
    from fleet.worker.codec import CodecError

    with pytest.raises(CodecError, match=r"the payload cannot be unpickled in the worker: AttributeError"):
        calls.call(unit(("tests.executor_calls", "no_such_function", (), calls.NO_KWARGS)))
    with pytest.raises(CodecError, match=r"cannot be unpickled in the worker: ModuleNotFoundError"):
        calls.call(unit(("tests.no_such_module_here", "f", (), calls.NO_KWARGS)))
    assert ("tests.executor_calls", "no_such_function") not in calls._FOUND


def test_the_callers_names_are_a_cache_that_starts_afresh_past_its_bound(monkeypatch):
    monkeypatch.setattr(calls, "NAMES_KEPT", 2)
    calls._NAMES.clear()
    for fn in (C.add, C.square, C.divide):
        assert calls.call_payload(fn, (1,), calls.NO_KWARGS)[1] == fn.__name__
    assert list(calls._NAMES) == [C.divide]  # the third found it full: it began again
    assert calls.call_payload(C.add, (1, 2), calls.NO_KWARGS) == ("tests.executor_calls", "add", (1, 2), calls.NO_KWARGS)
