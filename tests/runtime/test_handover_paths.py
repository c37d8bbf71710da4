"""Who says what of the GIL handover (fleet.runtime.future.HANDOVER, the rule in
fleet.shm.dataplane.Handover): a caller's own submit that wakes the loop says it still
holds the GIL, a submit of fleetd's control thread (block=False, submit_pickled) does
not (it watches for no result, so nothing would ever clear its word); the loop says
so as it settles futures, and its next wait clears it. A real fleet, its loop held on
a command while a post is made, so that post is the one that finds the intake empty
and rings."""
from __future__ import annotations

import contextlib
import pickle
import threading
import time

import pytest

from fleet.runtime.future import HANDOVER
from fleet.runtime.intake import Intake
from fleet.shm.dataplane import Pulse

from ..fleets import config, hold_loop, role, running, unique_name

WAIT_S = 60.0


def _caller_word_cleared() -> None:
    """A caller's watch begins (its word cleared), as after a result it waited for."""
    pulse = Pulse()
    assert pulse.watch(pulse.value + 1, 0.0, HANDOVER) is True
    assert HANDOVER.held[1] is False


@contextlib.contextmanager
def _loop_held(f):
    """The loop held on a command for the block (its intake then empty)."""
    go = hold_loop(f, WAIT_S)
    try:
        yield
    finally:
        go.set()


def _posted_while_held(f, post) -> bool:
    """Whether `post()` (made while the loop is held) left the caller's word set; its
    units then taken to their end."""
    with _loop_held(f):
        _caller_word_cleared()
        futures = post()
        said = HANDOVER.held[1]
    for future in futures:
        future.result(WAIT_S)
    return said


def test_an_intake_post_says_the_caller_holds_the_gil_only_when_asked_and_only_as_it_rings():
    wakes: list = []
    intake = Intake(lambda: wakes.append(1))
    _caller_word_cleared()
    intake.post(len, ())
    assert (len(wakes), HANDOVER.held[1]) == (1, False)  # a command, a view: nobody watches after it
    intake.drain()
    intake.post(len, (), hand_over=True)
    assert (len(wakes), HANDOVER.held[1]) == (2, True)
    _caller_word_cleared()
    intake.post(len, (), hand_over=True)  # the queue was not empty: no ring, nothing to hand over
    assert (len(wakes), HANDOVER.held[1]) == (2, False)
    assert intake.drain() == 2


def test_a_callers_submits_hand_over_and_fleetds_do_not():
    with running(config(unique_name("handover"), {"work": role("echo", slots=2)})) as f:
        sub = f._sup._submitter
        assert _posted_while_held(f, lambda: [f.submit("work", 1)]) is True  # the plain path (the Executor's)
        assert _posted_while_held(f, lambda: [f.submit("work", 1, priority=1)]) is True  # submit's whole path
        assert _posted_while_held(f, lambda: sub.submit_many("work", [1, 2])) is True  # a map's runs
        # fleetd's control thread: a submit that never waits, and a batch of pickled payloads
        assert _posted_while_held(f, lambda: [f.submit("work", 1, block=False)]) is False
        assert _posted_while_held(f, lambda: sub.submit_pickled("work", [pickle.dumps(3)])) is False


def test_the_loop_says_it_holds_the_gil_as_it_settles_and_its_next_wait_clears_it():
    with running(config(unique_name("handover"), {"work": role("echo", slots=2)})) as f:
        settled, seen = [], []  # (on the loop) a future settled this delivery; the word at its end

        def delivered():
            if settled:
                settled.clear()
                seen.append(HANDOVER.held[0])

        loop = f._sup.inspect(lambda sup: (setattr(sup.books, "on_delivered", delivered), threading.get_ident())[1],
                              timeout=WAIT_S)

        def on_the_loop(future):
            assert threading.get_ident() == loop
            settled.append(future)

        for i in range(3):
            with _loop_held(f):
                future = f.submit("work", i)
                future.add_done_callback(on_the_loop)
            assert future.result(WAIT_S) == i
        assert seen == [True] * 3  # each delivery that settled a future ended with the word set
        end = time.monotonic() + WAIT_S
        while HANDOVER.held[0]:  # and the loop's wait that followed cleared it
            if time.monotonic() > end:
                pytest.fail("the loop's word is still set: its wait never cleared it")
            time.sleep(0.001)
