"""The GIL handover (fleet.shm.dataplane.Handover): a woken thread looks on until the
thread that woke it has let go of the GIL, and only when that thread's word was set
during its wait. Threads of this process, real waits in C (the GIL let go), no clock
but the waits' own bounds: an hour's bound in a test means only the other thread's
letting go can end the look."""
from __future__ import annotations

import threading
import time

import pytest

from fleet._native import ffi
from fleet.shm.dataplane import HANDOVER_S, Bell, Handover, Pulse

DEADLINE_S = 60.0  # a lost handover would look on for the hour it was given: fail long before
HOUR_S = 3600.0


def local_bell() -> Bell:
    """A bell in this process's memory (the loop's own lives in the data segment)."""
    words = ffi.new("uint32_t[2]")
    return Bell(words, words + 1, words)


def in_thread(fn, *args) -> tuple[threading.Thread, list]:
    box: list = []
    thread = threading.Thread(target=lambda: box.append(fn(*args)), daemon=True)
    thread.start()
    return thread, box


def until(what: str, cond) -> None:
    """Poll `cond` until it holds (a thread reached its wait in C); fail after DEADLINE_S."""
    end = time.monotonic() + DEADLINE_S
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"still waiting for {what} after {DEADLINE_S} s")
        time.sleep(0.001)


def joined(thread: threading.Thread, box: list):
    thread.join(DEADLINE_S)
    if not box:
        pytest.fail(f"the waiting thread has not returned after {DEADLINE_S} s")
    return box[0]


def let_go_as_the_loop(handover: Handover) -> None:
    """What the loop's next wait does first: clear its word (a bell that rang returns at once)."""
    bell = local_bell()
    bell.ring()
    assert bell.wait(bell.value - 1, 0.0, 0.0, handover) is True


def let_go_as_a_caller(handover: Handover) -> None:
    """What a caller's next watch does first: clear its word (a count that moved returns at once)."""
    pulse = Pulse()
    assert pulse.watch(pulse.value + 1, 0.0, handover) is True


def test_each_wait_clears_its_own_word_and_only_its_own():
    h = Handover()
    assert h.held == (False, False)
    h.loop_holds()
    h.caller_holds()
    assert h.held == (True, True)
    let_go_as_the_loop(h)
    assert h.held == (False, True)
    let_go_as_a_caller(h)
    assert h.held == (False, False)
    assert Handover().bound_ns == int(HANDOVER_S * 1e9) and Handover(0.5).bound_ns == 500_000_000


def test_a_caller_that_sees_its_settle_asks_for_the_gil_only_once_the_loop_let_go():
    h, settled = Handover(HOUR_S), Pulse()
    seen = settled.value
    order: list[str] = []

    def caller():
        came = settled.watch(seen, HOUR_S, h)
        order.append("caller back")
        return came

    h.caller_holds()  # its watch clears it as it begins: that says the watch is under way
    thread, box = in_thread(caller)
    until("the caller's watch", lambda: not h.held[1])
    h.loop_holds()  # the loop settles (it holds the GIL) and bumps
    settled.bump()
    time.sleep(0.05)  # a caller that did not look on would be back by now
    order.append("loop let go")
    let_go_as_the_loop(h)
    assert joined(thread, box) is True
    assert order == ["loop let go", "caller back"]


@pytest.mark.parametrize("spin_s", [HOUR_S, 0.0], ids=["rung-while-it-spun", "rung-while-it-slept"])
def test_the_loop_woken_by_a_submit_asks_for_the_gil_only_once_the_caller_let_go(spin_s):
    h, bell = Handover(HOUR_S), local_bell()
    seen = bell.value
    order: list[str] = []

    def loop():
        came = bell.wait(seen, None, spin_s, h)
        order.append("loop back")
        return came

    h.loop_holds()  # its wait clears it as it begins
    thread, box = in_thread(loop)
    until("the loop's wait", lambda: not h.held[0])
    h.caller_holds()  # a caller's submit posts (it holds the GIL) and rings
    bell.ring()
    time.sleep(0.05)
    order.append("caller let go")
    let_go_as_a_caller(h)
    assert joined(thread, box) is True
    assert order == ["caller let go", "loop back"]


def test_a_word_set_before_the_wait_began_is_not_awaited():
    # A burst of submits: the caller's word stays set while it goes on submitting, and
    # the loop, woken by results or by a later submit, must not look on for it.
    h, bell = Handover(HOUR_S), local_bell()
    h.caller_holds()
    seen = bell.value
    thread, box = in_thread(bell.wait, seen, None, HOUR_S, h)
    until("the loop's wait", lambda: thread.is_alive())
    bell.ring()
    assert joined(thread, box) is True
    assert h.held == (False, True)  # still the caller's: nothing cleared it
    # and the caller's side the same: the loop's word set before its watch began
    settled = Pulse()
    h.loop_holds()
    seen = settled.value
    thread, box = in_thread(settled.watch, seen, HOUR_S, h)
    until("the caller's watch", lambda: not h.held[1])
    settled.bump()
    assert joined(thread, box) is True


def test_a_word_nobody_clears_costs_the_waiter_its_bound_and_no_more():
    h, settled = Handover(0.002), Pulse()
    seen = settled.value
    h.caller_holds()
    thread, box = in_thread(settled.watch, seen, HOUR_S, h)
    until("the caller's watch", lambda: not h.held[1])
    h.loop_holds()  # and never let go
    settled.bump()
    assert joined(thread, box) is True
    assert h.held == (True, False)


def test_a_watch_that_times_out_awaits_nothing():
    h = Handover(HOUR_S)
    settled = Pulse()
    h.loop_holds()
    let_go_as_the_loop(h)
    # nobody bumps: the watch runs out (False) and does not look on for the loop's word,
    # set while it watched
    h.caller_holds()
    thread, box = in_thread(settled.watch, settled.value, 0.05, h)
    until("the caller's watch", lambda: not h.held[1])
    h.loop_holds()
    assert joined(thread, box) is False
