"""UnitFuture against the stdlib Future: the same answers on the same scenarios, the
moves of `fleet.runtime.future.TRANSITIONS` against a table written out here, `wait()` and
`as_completed()` over mixed futures, and threaded runs in which no wake-up may be lost."""
from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import random
import sys
import threading
import time
import weakref
from concurrent.futures import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    FIRST_EXCEPTION,
    CancelledError,
    Future,
    InvalidStateError,
    as_completed,
    wait,
)
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING, RUNNING

import pytest

from fleet.runtime import future as uf
from fleet.runtime.future import UnitFuture

KINDS = pytest.mark.parametrize("kind", [Future, UnitFuture], ids=["stdlib", "unit"])
#: how long a test thread may block before the test calls it stuck (never reached when green)
STUCK_S = 10.0


class Boom(Exception):
    pass


# --- futures in each reachable state -------------------------------------------------
def _pending(f):
    return f


def _running(f):
    f.set_running_or_notify_cancel()
    return f


def _cancelled(f):
    f.cancel()
    return f


def _notified(f):
    f.cancel()
    f.set_running_or_notify_cancel()
    return f


def _returned(f):
    f.set_result(7)
    return f


def _raised(f):
    f.set_exception(Boom("x"))
    return f


STARTS = {"pending": _pending, "running": _running, "cancelled": _cancelled,
          "cancelled_and_notified": _notified, "returned": _returned, "raised": _raised}
START_STATE = {"pending": PENDING, "running": RUNNING, "cancelled": CANCELLED,
               "cancelled_and_notified": CANCELLED_AND_NOTIFIED, "returned": FINISHED, "raised": FINISHED}
EVENTS = {
    uf.CANCEL: lambda f: f.cancel(),
    uf.START: lambda f: f.set_running_or_notify_cancel(),
    uf.SET_RESULT: lambda f: f.set_result(1),
    uf.SET_EXCEPTION: lambda f: f.set_exception(Boom("y")),
}

# Written out from the stdlib's code, independently of fleet.runtime.future.TRANSITIONS.
EXPECTED_LEGAL = {
    (PENDING, uf.CANCEL): CANCELLED,
    (CANCELLED, uf.CANCEL): CANCELLED,
    (CANCELLED_AND_NOTIFIED, uf.CANCEL): CANCELLED_AND_NOTIFIED,
    (PENDING, uf.START): RUNNING,
    (CANCELLED, uf.START): CANCELLED_AND_NOTIFIED,
    (PENDING, uf.SET_RESULT): FINISHED,
    (RUNNING, uf.SET_RESULT): FINISHED,
    (PENDING, uf.SET_EXCEPTION): FINISHED,
    (RUNNING, uf.SET_EXCEPTION): FINISHED,
}


def _outcome(f, event):
    """What `event` answers on `f`, and what `f` then looks like."""
    try:
        answer = ("returned", EVENTS[event](f))
    except Exception as e:  # noqa: BLE001 - the exception's type is the answer
        answer = ("raised", type(e))
    exc = None
    if f.done() and not f.cancelled():
        exc = type(f.exception(0))
    return answer, f._state, f.cancelled(), f.running(), f.done(), exc


def test_table_is_the_expected_one():
    table = {(state, event): nxt for event, row in uf.TRANSITIONS.items() for state, nxt in row.items()}
    assert table == EXPECTED_LEGAL


@pytest.mark.parametrize("start, event", list(itertools.product(STARTS, EVENTS)))
def test_every_state_event_pair_matches_the_stdlib(start, event):
    ours = _outcome(STARTS[start](UnitFuture()), event)
    theirs = _outcome(STARTS[start](Future()), event)
    assert ours == theirs
    expected = EXPECTED_LEGAL.get((START_STATE[start], event))
    assert ours[1] == (expected if expected is not None else START_STATE[start])


@pytest.mark.parametrize("start", list(STARTS))
@KINDS
def test_illegal_moves_leave_result_and_exception_alone(kind, start):
    f = STARTS[start](kind())
    before = (f._state, f._result, f._exception)
    for event in EVENTS:
        if (f._state, event) not in EXPECTED_LEGAL:
            if event == uf.CANCEL:
                assert f.cancel() is False
            else:
                with pytest.raises((InvalidStateError, RuntimeError)):
                    EVENTS[event](f)
            assert (f._state, f._result, f._exception) == before


# --- reads -----------------------------------------------------------------------------
@KINDS
def test_result_and_exception_of_a_finished_future(kind):
    f = kind()
    f.set_result([1, 2])
    assert f.result() == [1, 2] and f.result(0) == [1, 2]
    assert f.exception() is None and f.exception(timeout=0) is None
    g = kind()
    err = Boom("bad")
    g.set_exception(err)
    with pytest.raises(Boom) as got:
        g.result()
    assert got.value is err
    assert g.exception(0) is err


@KINDS
def test_set_exception_none_reads_as_a_none_result(kind):
    f = kind()
    f.set_exception(None)
    assert f.done() and f.result(0) is None and f.exception(0) is None


@pytest.mark.parametrize("start", ["pending", "running"])
@KINDS
def test_result_and_exception_time_out_when_not_done(kind, start):
    f = STARTS[start](kind())
    with pytest.raises(TimeoutError):
        f.result(timeout=0.01)
    with pytest.raises(TimeoutError):
        f.exception(timeout=0)
    assert not f.done()


@pytest.mark.parametrize("start", ["cancelled", "cancelled_and_notified"])
@KINDS
def test_a_cancelled_future_raises_cancelled_error(kind, start):
    f = STARTS[start](kind())
    with pytest.raises(CancelledError):
        f.result()
    with pytest.raises(CancelledError):
        f.exception(timeout=0)


@pytest.mark.parametrize("start", list(STARTS))
@KINDS
def test_predicates(kind, start):
    f = STARTS[start](kind())
    state = START_STATE[start]
    assert f.cancelled() is (state in (CANCELLED, CANCELLED_AND_NOTIFIED))
    assert f.running() is (state == RUNNING)
    assert f.done() is (state in (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED))


@pytest.mark.parametrize("start", list(STARTS))
def test_repr_matches_the_stdlib_but_for_the_class_name(start):
    ours, theirs = STARTS[start](UnitFuture()), STARTS[start](Future())
    strip = lambda f: repr(f).replace(type(f).__name__, "").replace(hex(id(f)), "")  # noqa: E731
    assert strip(ours) == strip(theirs)


@KINDS
def test_a_raised_result_does_not_keep_the_future_alive_through_its_traceback(kind):
    f = kind()
    f.set_exception(Boom("cycle"))
    with pytest.raises(Boom):
        f.result()
    ref = weakref.ref(f)
    gc.disable()
    try:
        del f
        # Only the exception's own traceback refers back to a result() frame; with the
        # frame's locals cleared, refcounting alone frees the future.
        assert ref() is None
    finally:
        gc.enable()


# --- blocking reads woken from another thread --------------------------------------------
# A lost wake-up shows as a thread that never returns: the readers here wait without a
# timeout (a finite one would hide the loss behind a late, correct answer), in daemon
# threads that the test gives STUCK_S to come back.
def _frames(thread):
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        yield frame.f_code.co_name
        frame = frame.f_back


def _blocked_in(thread, fn_name):
    """Until `thread` has `fn_name` on its stack: it is blocking there (or about to)."""
    deadline = time.monotonic() + STUCK_S
    while fn_name not in _frames(thread):
        assert time.monotonic() < deadline, f"{thread.name} never reached {fn_name}"
        time.sleep(0.001)
    time.sleep(0.01)  # the few bytecodes from entering it to blocking in it


class Blocking:
    """`fn(*args)` on a daemon thread; `outcome()` is what it returned or raised."""

    def __init__(self, fn, *args, blocks_in="wait"):
        self._box = []
        self.thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self.thread.start()
        if blocks_in:
            _blocked_in(self.thread, blocks_in)

    def _run(self, fn, args):
        try:
            self._box.append(("returned", fn(*args)))
        except BaseException as e:  # noqa: BLE001 - the outcome is the exception
            self._box.append(("raised", e))

    def outcome(self):
        self.thread.join(STUCK_S)
        assert not self.thread.is_alive(), "still blocked: a wake-up was lost"
        return self._box[0]

    def value(self):
        how, value = self.outcome()
        if how == "raised":
            raise value
        return value


@pytest.mark.parametrize("read", ["result", "exception"])
@pytest.mark.parametrize("start, resolve", [("pending", "set_result"), ("pending", "set_exception"),
                                            ("pending", "cancel"), ("running", "set_result"),
                                            ("running", "set_exception")])
@KINDS
def test_a_blocked_read_wakes_on_resolve(kind, start, read, resolve):
    f = STARTS[start](kind())
    reader = Blocking(getattr(f, read))
    err = Boom("late")
    if resolve == "cancel":
        assert f.cancel()
    else:
        getattr(f, resolve)(err if resolve == "set_exception" else 5)
    how, got = reader.outcome()
    if resolve == "cancel":
        assert how == "raised" and isinstance(got, CancelledError)
    elif resolve == "set_exception":
        assert (how, got) == (("raised", err) if read == "result" else ("returned", err))
    else:
        assert (how, got) == ("returned", 5 if read == "result" else None)


@KINDS
def test_many_blocked_readers_all_wake(kind):
    f = kind()
    readers = [Blocking(f.result) for _ in range(8)]
    f.set_result("all")
    assert [r.value() for r in readers] == ["all"] * 8


def test_a_stray_notify_does_not_end_a_wait_early():
    f = UnitFuture()
    reader = Blocking(f.result, 60)
    cond = f._condition
    with cond:
        cond.notify_all()
    _blocked_in(reader.thread, "wait")
    assert reader.thread.is_alive()
    f.set_result("late")
    assert reader.value() == "late"


def test_lock_free_reads_never_see_a_half_finished_future():
    # Stop the resolving thread at every bytecode of its move and read the future the
    # lock-free way: once it reads FINISHED, the result must be there already.
    for resolve, value in (("set_result", "v"), ("set_exception", Boom("e"))):
        f = UnitFuture()
        seen = []

        def look(frame, event, arg):
            if event == "opcode" and f._state == FINISHED:
                try:
                    seen.append(f.result(0))
                except Boom as e:
                    seen.append(e)
            return look

        def tracer(frame, event, arg):
            if frame.f_code is UnitFuture.settle.__code__:
                frame.f_trace_opcodes = True
                return look
            return None

        old = sys.gettrace()
        sys.settrace(tracer)
        try:
            getattr(f, resolve)(value)
        finally:
            sys.settrace(old)
        assert seen and all(v is value for v in seen), seen


# --- callbacks -----------------------------------------------------------------------------
@pytest.mark.parametrize("resolve", ["set_result", "set_exception", "cancel", "cancel_then_start"])
@KINDS
def test_callbacks_run_once_in_order_before_and_after_done(kind, resolve):
    f = kind()
    calls = []
    f.add_done_callback(lambda g: calls.append(("a", g is f, g.done())))
    f.add_done_callback(lambda g: calls.append(("b", g is f, g.done())))
    assert calls == []
    if resolve == "set_result":
        f.set_result(1)
    elif resolve == "set_exception":
        f.set_exception(Boom())
    else:
        f.cancel()
        if resolve == "cancel_then_start":
            assert f.set_running_or_notify_cancel() is False
    f.cancel()  # a second cancel of a cancelled one, or a refused one: no rerun either way
    assert calls == [("a", True, True), ("b", True, True)]
    f.add_done_callback(lambda g: calls.append(("c", g is f, g.done())))
    assert calls[-1] == ("c", True, True) and len(calls) == 3


@KINDS
def test_callbacks_run_on_the_resolving_thread(kind):
    f = kind()
    seen = []
    f.add_done_callback(lambda g: seen.append(threading.get_ident()))
    t = threading.Thread(target=f.set_result, args=(1,))
    t.start()
    t.join()
    assert seen == [t.ident]


@KINDS
def test_a_callback_exception_is_logged_and_the_rest_still_run(kind, caplog):
    f = kind()
    calls = []

    def bad(g):
        raise Boom("in callback")

    f.add_done_callback(bad)
    f.add_done_callback(lambda g: calls.append("after"))
    with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
        f.set_result(1)
        f.add_done_callback(bad)  # added after done: runs at once, also logged
    assert calls == ["after"]
    logged = [r for r in caplog.records if r.name == "concurrent.futures"]
    assert len(logged) == 2
    assert all(r.getMessage().startswith("exception calling callback for <") for r in logged)
    assert all(r.exc_info and r.exc_info[0] is Boom for r in logged)
    assert f.result() == 1


@KINDS
def test_a_callback_may_add_a_callback(kind):
    f = kind()
    calls = []
    f.add_done_callback(lambda g: g.add_done_callback(lambda h: calls.append("inner")))
    f.set_result(1)
    assert calls == ["inner"]


def test_run_callbacks_are_dropped():
    f = UnitFuture()

    class Probe:
        def __call__(self, g):
            pass

    probe = Probe()
    ref = weakref.ref(probe)
    f.add_done_callback(probe)
    del probe
    f.set_result(1)
    assert ref() is None


@KINDS
def test_set_running_or_notify_cancel_logs_critical_when_refused(kind, caplog):
    f = kind()
    f.set_result(1)
    with caplog.at_level(logging.CRITICAL, logger="concurrent.futures"):
        with pytest.raises(RuntimeError, match="unexpected state"):
            f.set_running_or_notify_cancel()
    assert [r.levelno for r in caplog.records] == [logging.CRITICAL]


@pytest.mark.parametrize("second", ["set_result", "set_exception"])
@pytest.mark.parametrize("first", ["set_result", "set_exception", "cancel"])
@KINDS
def test_double_resolve_raises_invalid_state(kind, first, second):
    f = kind()
    getattr(f, first)(*(() if first == "cancel" else (Boom("1") if first == "set_exception" else 1,)))
    state = f._state
    with pytest.raises(InvalidStateError, match=state):
        getattr(f, second)(Boom("2") if second == "set_exception" else 2)
    assert f._state == state
    if first == "set_result":
        assert f.result() == 1
    elif first == "set_exception":
        assert str(f.exception()) == "1"


# --- wait() and as_completed() over mixed futures ---------------------------------------------
def _mixed(n=6):
    return [UnitFuture() if i % 2 else Future() for i in range(n)]


def _no_waiters_left(fs):
    return all(not f._waiters for f in fs)


@pytest.mark.parametrize("mode", [FIRST_COMPLETED, FIRST_EXCEPTION, ALL_COMPLETED])
def test_wait_on_done_futures_returns_at_once(mode):
    fs = _mixed()
    for f in fs:
        f.set_result(1)
    done, not_done = wait(fs, timeout=0, return_when=mode)
    assert done == set(fs) and not not_done


@pytest.mark.parametrize("which", [0, 1])  # a stdlib or a unit future finishes first
def test_wait_first_completed(which):
    fs = _mixed()
    waiter = Blocking(wait, fs, None, FIRST_COMPLETED)
    fs[which].set_result("first")
    done, not_done = waiter.value()
    assert done == {fs[which]} and not_done == set(fs) - {fs[which]}
    assert _no_waiters_left(fs)


@pytest.mark.parametrize("which", [0, 1])
def test_wait_first_exception_stops_at_the_exception(which):
    fs = _mixed()
    fs[2].set_result("early")
    fs[3].set_result("early")
    waiter = Blocking(wait, fs, None, FIRST_EXCEPTION)
    fs[4].set_result("ok")
    fs[which].set_exception(Boom())
    done, not_done = waiter.value()
    assert done == {fs[which], fs[2], fs[3], fs[4]} and not_done == {fs[1 - which], fs[5]}
    assert _no_waiters_left(fs)


@KINDS
def test_wait_first_exception_counts_set_exception_none(kind):
    fs = [kind(), kind()]
    waiter = Blocking(wait, fs, None, FIRST_EXCEPTION)
    fs[0].set_exception(None)
    done, not_done = waiter.value()
    assert done == {fs[0]} and not_done == {fs[1]}


def test_wait_first_exception_without_one_is_all_completed():
    fs = _mixed()
    waiter = Blocking(wait, fs, None, FIRST_EXCEPTION)
    for f in fs:
        f.set_result(0)
    done, not_done = waiter.value()
    assert done == set(fs) and not not_done


def test_wait_all_completed_with_results_exceptions_and_cancels():
    fs = _mixed(8)
    fs[0].set_result("already")
    waiter = Blocking(wait, fs, None, ALL_COMPLETED)
    for i, f in enumerate(fs[1:], 1):
        if i % 3 == 0:
            f.set_exception(Boom(i))
        elif i % 3 == 1:
            f.cancel()
            f.set_running_or_notify_cancel()  # what tells wait() of a cancel
        else:
            f.set_running_or_notify_cancel()
            f.set_result(i)
    done, not_done = waiter.value()
    assert done == set(fs) and not not_done
    assert _no_waiters_left(fs)


@pytest.mark.parametrize("mode", [FIRST_COMPLETED, FIRST_EXCEPTION, ALL_COMPLETED])
def test_wait_times_out_with_the_rest_not_done(mode):
    fs = _mixed()
    fs[1].set_result(1)  # a done unit future; only FIRST_COMPLETED returns on it at once
    done, not_done = wait(fs, timeout=0.02, return_when=mode)
    assert done == {fs[1]} and not_done == set(fs) - {fs[1]}
    assert _no_waiters_left(fs)


@KINDS
def test_a_cancel_reaches_wait_only_at_set_running_or_notify_cancel(kind):
    f, other = kind(), kind()
    f.cancel()
    done, _ = wait([f, other], timeout=0.02, return_when=FIRST_COMPLETED)
    assert done == set()  # CANCELLED is not done yet for wait(), in both classes
    waiter = Blocking(wait, [f, other], None, FIRST_COMPLETED)
    assert f.set_running_or_notify_cancel() is False
    done, _ = waiter.value()
    assert done == {f}


def test_as_completed_yields_in_finishing_order_and_dedups():
    fs = _mixed()
    fs[3].set_result("done before")
    order = [4, 1, 0, 5, 2]
    collector = Blocking(lambda: list(as_completed(fs + fs[:2])))
    for i in order:
        fs[i].set_result(i)
    got = collector.value()
    assert got[0] is fs[3] and got[1:] == [fs[i] for i in order]
    assert _no_waiters_left(fs)


def test_as_completed_one_at_a_time():
    fs = _mixed(4)
    it = as_completed(fs)
    for f in reversed(fs):
        step = Blocking(next, it)
        f.set_result(None)
        assert step.value() is f
    assert _no_waiters_left(fs)


def test_as_completed_times_out_and_removes_its_waiter():
    fs = _mixed(4)
    fs[0].set_result(0)
    it = as_completed(fs, timeout=0.02)
    assert next(it) is fs[0]
    with pytest.raises(TimeoutError):
        next(it)
    assert _no_waiters_left(fs)


def test_as_completed_with_a_cancelled_and_notified_unit_future():
    f = UnitFuture()
    collector = Blocking(lambda: list(as_completed([f])))
    f.cancel()
    f.set_running_or_notify_cancel()
    assert collector.value() == [f]


# --- the rules that keep wake-ups from being lost ---------------------------------------------
class _EventWaiter:
    """A `wait()`-style waiter: the future calls add_result/add_exception/add_cancelled."""

    def __init__(self):
        self.event = threading.Event()

    def add_result(self, f):
        self.event.set()

    add_exception = add_cancelled = add_result


def test_a_move_reads_the_condition_under_the_lock():
    # The race: a resolver is on its way to the lock while a waiter builds the future's
    # Condition and installs itself. Once the resolver holds the lock it must see both,
    # tell the waiter and notify - not act on what it saw before it had the lock.
    f = UnitFuture()
    told = _EventWaiter()
    with f._lock:
        resolver = Blocking(f.set_result, "x", blocks_in="settle")
        cond = f._condition  # reentrant: this thread holds the lock
        assert not f.done()
        f._waiters.append(told)
        notified = cond.wait(STUCK_S)  # lets the resolver in; a hang guard, not a deadline
    assert resolver.value() is None
    assert notified, "the sleeping waiter was never notified"
    assert told.event.is_set(), "the installed waiter was never told"
    assert f.result(0) == "x"


def test_a_callback_added_while_the_future_finishes_still_runs():
    # The adder saw PENDING, then waited for the lock while the future finished and ran
    # its callbacks: it must notice the future is done and run the callback itself.
    f = UnitFuture()
    calls = []
    with f._lock:
        adder = Blocking(f.add_done_callback, calls.append, blocks_in="add_done_callback")
        f.set_result(1)  # reentrant: this thread holds the lock
        assert calls == []
    adder.value()
    assert calls == [f]


def test_two_threads_building_the_condition_at_once_get_one():
    f = UnitFuture()
    with f._lock:
        births = [Blocking(lambda: f._condition, blocks_in="_condition") for _ in range(2)]
    got = [b.value() for b in births]
    assert got[0] is got[1] is f._condition


def test_the_condition_is_built_around_the_futures_own_lock():
    f = UnitFuture()
    lock = f._lock
    with f._condition:
        # Held through the Condition, so no other thread can move the future now.
        assert lock._is_owned()
        assert Blocking(f.set_result, 1, blocks_in="settle").thread.is_alive()
    assert f.result(STUCK_S) == 1


def test_a_future_no_one_waits_on_gets_no_condition():
    f = UnitFuture()
    f.add_done_callback(lambda g: None)
    f.set_running_or_notify_cancel()
    f.set_result(1)
    assert f.result() == 1 and f.exception() is None and f.done()
    assert f._cond is None


@pytest.fixture
def fine_switching():
    # Switch threads every few bytecodes, so the windows between a read and a lock open often.
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _resolve(f, i):
    if i % 5 == 4:
        f.cancel()
        f.set_running_or_notify_cancel()
    elif i % 2:
        f.set_running_or_notify_cancel()
        f.set_exception(Boom(i))
    else:
        f.set_result(i)


def _expect(i):
    return "cancelled" if i % 5 == 4 else ("boom", i) if i % 2 else ("ok", i)


def _read(f, poll):
    """What a reader sees of `f`. A poller retries short timeouts; the others block."""
    while True:
        try:
            return "ok", f.result(0.0005 if poll else None)
        except Boom as e:
            return "boom", e.args[0]
        except CancelledError:
            return "cancelled"
        except TimeoutError:
            assert poll


def _reader(fs, picks, how):
    """One stress reader's view: per pick, what it saw; a lost wake-up never returns."""
    chosen = [fs[i] for i in picks]
    if how in ("block", "poll"):
        return [_read(f, how == "poll") for f in chosen]
    if how == "wait_all":
        done, not_done = wait(chosen, None, ALL_COMPLETED)
        assert not not_done
    elif how == "as_completed":
        assert set(as_completed(chosen)) == set(chosen)
    else:
        left = set(chosen)
        while left:
            _, left = wait(left, None, FIRST_COMPLETED)
    return [_read(f, False) for f in chosen]


def test_stress_no_lost_wake_ups(fine_switching):
    rng = random.Random(1234)
    n, hows = 60, ["block", "poll", "wait_all", "as_completed", "wait_first"] * 3
    for _ in range(20):
        fs = [UnitFuture() if i % 3 else Future() for i in range(n)]
        picks = [rng.sample(range(n), 10) for _ in hows]
        readers = [Blocking(_reader, fs, p, how, blocks_in=None) for p, how in zip(picks, hows)]
        order = rng.sample(range(n), n)
        resolvers = [Blocking(lambda part=order[j::3]: [(_resolve(fs[i], i), time.sleep(0)) for i in part],
                              blocks_in=None) for j in range(3)]
        for r in resolvers:
            r.value()
        for r, p in zip(readers, picks):
            assert r.value() == [_expect(i) for i in p]
        assert _no_waiters_left(fs)


def test_stress_callbacks_race_resolves(fine_switching):
    # add_done_callback on one thread while another resolves: each callback runs exactly once.
    for _ in range(200):
        f = UnitFuture()
        calls = []
        adder = Blocking(lambda: [f.add_done_callback(lambda g, i=i: calls.append(i)) for i in range(20)],
                         blocks_in=None)
        f.set_result(None)
        adder.value()
        assert sorted(calls) == list(range(20))


# --- interop details ----------------------------------------------------------------------------
def test_stdlib_methods_called_unbound_stay_coherent():
    # fleet.api.client calls Future.set_running_or_notify_cancel(fut) on its futures.
    f = UnitFuture()
    calls = []
    Future.add_done_callback(f, lambda g: calls.append("base"))
    f.add_done_callback(lambda g: calls.append("own"))
    assert Future.set_running_or_notify_cancel(f) is True and f.running()
    reader = Blocking(f.result)
    base_reader = Blocking(Future.result, f)
    Future.set_result(f, 3)
    assert reader.value() == 3 and base_reader.value() == 3
    assert calls == ["base", "own"] and Future.done(f) and Future.exception(f) is None
    with pytest.raises(InvalidStateError):
        f.set_result(4)
    g = UnitFuture()
    reader = Blocking(Future.result, g)
    g.set_result(5)
    assert reader.value() == 5


@KINDS
def test_asyncio_wrap_future_awaits_and_cancels(kind):
    async def main():
        f, g = kind(), kind()
        threading.Thread(target=f.set_result, args=(9,)).start()
        got = await asyncio.wait_for(asyncio.wrap_future(f), STUCK_S)
        wrapped = asyncio.wrap_future(g)
        wrapped.cancel()
        with pytest.raises(asyncio.CancelledError):
            await wrapped
        await asyncio.sleep(0)  # the cancel reaches the future one loop turn later
        return got, g.cancelled()

    assert asyncio.run(main()) == (9, True)


def test_generic_alias():
    assert UnitFuture[int].__origin__ is UnitFuture


def test_unit_id_lives_in_a_slot():
    f = UnitFuture()
    assert "unit_id" in UnitFuture.__slots__
    assert getattr(f, "unit_id", None) is None
    with pytest.raises(AttributeError):
        f.unit_id
    f.unit_id = 42
    f.add_done_callback(lambda g: None)
    f.set_running_or_notify_cancel()
    f.set_result(1)
    f.result()
    wait([f])
    assert f.unit_id == 42 and isinstance(f, Future)
    assert vars(f) == {}, "every attribute it uses is a slot"


# --- the runner's one-call moves --------------------------------------------------------
@pytest.mark.parametrize("start, may_run, state_after", [
    ("pending", True, RUNNING), ("running", True, RUNNING), ("cancelled", False, CANCELLED_AND_NOTIFIED),
    ("cancelled_and_notified", False, CANCELLED_AND_NOTIFIED), ("returned", True, FINISHED),
    ("raised", True, FINISHED)])
def test_claim_answers_whether_the_unit_may_run(start, may_run, state_after):
    f = STARTS[start](UnitFuture())
    assert f.claim() is may_run
    assert f._state == state_after


def test_claim_of_a_cancelled_future_tells_wait_as_set_running_does():
    f, other = UnitFuture(), UnitFuture()
    f.cancel()
    waiter = threading.Thread(target=wait, args=([f, other],), kwargs={"return_when": FIRST_COMPLETED})
    waiter.start()
    f.claim()
    waiter.join(STUCK_S)
    assert not waiter.is_alive()


@pytest.mark.parametrize("raised", [False, True])
def test_settle_finishes_once_and_refuses_what_is_done(raised):
    f = _running(UnitFuture())
    calls = []
    f.add_done_callback(calls.append)
    value = Boom("e") if raised else "v"
    assert f.settle(None if raised else value, value if raised else None, raised) is True
    assert calls == [f]
    if raised:
        assert f.exception() is value
    else:
        assert f.result() == "v"
    assert f.settle("again", None, False) is False and calls == [f]
    assert (f.exception() is value) if raised else f.result() == "v"
    cancelled = _cancelled(UnitFuture())
    assert cancelled.settle(1, None, False) is False and cancelled.cancelled()


# --- the watch before the sleep (SETTLED, bumped by the fleet's loop) -------------------
def test_a_blocked_read_takes_a_settle_its_watch_sees_without_sleeping(monkeypatch):
    monkeypatch.setattr(uf, "RESULT_SPIN_S", 30.0)  # the whole wait is the watch
    f = UnitFuture()
    reader = Blocking(f.result, blocks_in="_watch")
    f.settle("seen", None, False)
    uf.SETTLED.bump()
    assert reader.value() == "seen"
    assert f._cond is None  # it never slept on the Condition


def test_a_settle_nobody_bumps_for_is_still_taken_once_the_watch_ends(monkeypatch):
    monkeypatch.setattr(uf, "RESULT_SPIN_S", 0.05)
    f = UnitFuture()
    reader = Blocking(f.result, blocks_in=None)
    time.sleep(0.2)  # past the watch: asleep on the Condition
    _blocked_in(reader.thread, "wait")
    f.set_result("late")  # no bump: the Condition wakes it
    assert reader.value() == "late"


def test_the_watch_is_part_of_the_timeout(monkeypatch):
    monkeypatch.setattr(uf, "RESULT_SPIN_S", 3600.0)  # an hour's watch inside a 50 ms timeout
    f = UnitFuture()
    how, error = Blocking(f.result, 0.05, blocks_in=None).outcome()  # fails if it watches on
    assert how == "raised" and isinstance(error, TimeoutError)
    with pytest.raises(TimeoutError):
        f.exception(timeout=0)  # no watch at all
