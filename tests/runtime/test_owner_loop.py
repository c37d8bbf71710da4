"""The supervisor's one owner: intake, queue room, and the rules driven by an injected clock.

The intake and the queue room are tested as plain objects. The supervisor is tested
with real workers and a fake monotonic clock (`fleet.host.system.FakeClockHost`): restart
intensity's window, unit deadlines and stop's grace move only when the test steps the
clock, so each rule is shown to wait for its time and to act once it has come.
"""
from __future__ import annotations

import os
import signal
import threading
import time
import types
from concurrent.futures import Future

import pytest

from fleet import QueueFull, UnitFailed
from fleet.host.system import FakeClockHost
from fleet.runtime import intake as intake_mod
from fleet.runtime.intake import Intake, QueueRoom, TurnedAway
from fleet.rules.unit import BadUnit, FleetClosed, PayloadUnpicklable

from ..fleets import config, role, running, worker_pids

WAIT_S = 30.0


def eventually(predicate, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# ----------------------------------------------------------------------------- the intake
def test_intake_runs_commands_in_order_and_answers_replies():
    wakes, ran = [], []
    intake = Intake(lambda: wakes.append(1))
    intake.post(ran.append, 1)
    intake.post(ran.append, 2)
    ok, bad = Future(), Future()
    intake.post(lambda: "answer", reply=ok)
    intake.post(lambda: 1 / 0, reply=bad)
    # nothing runs until the loop drains; only the post that found the queue empty
    # rang: the loop drains until it is empty, so the later ones ride on that wake-up
    assert ran == [] and len(wakes) == 1
    assert intake.drain() == 4
    assert ran == [1, 2] and ok.result(0) == "answer"
    with pytest.raises(ZeroDivisionError):
        bad.result(0)
    assert intake.drain() == 0
    intake.post(ran.append, 3)  # the queue is empty again: this one rings
    assert len(wakes) == 2


def test_a_drain_runs_at_most_its_limit_and_leaves_the_rest_queued():
    intake, ran = Intake(lambda: None), []
    for i in range(10):
        intake.post(ran.append, i)
    assert intake.drain(4) == 4 and ran == [0, 1, 2, 3]
    assert intake.drain() == 6 and ran == list(range(10))


def test_a_paced_poster_waits_for_the_loop_to_drain_below_low():
    """A caller that posts faster than the loop drains takes turns with it: at `high`
    queued it waits (GIL released) until the loop has drained below `low`."""
    intake = Intake(lambda: None, high=8, low=2, pace_timeout=30.0)
    posted = []

    def poster():
        for i in range(20):
            intake.post(lambda: None, pace=True)
            posted.append(i)

    t = threading.Thread(target=poster)
    t.start()
    eventually(lambda: len(posted) == 7, "the poster to reach high")
    time.sleep(0.2)
    assert len(posted) == 7  # the 8th post found 8 queued: it waits for the loop
    intake.drain(5)  # 3 left: still not below low
    time.sleep(0.2)
    assert len(posted) == 7
    intake.drain(2)  # 1 left: below low, the poster goes on
    eventually(lambda: len(posted) >= 8, "the poster to go on once drained below low")
    while t.is_alive():
        intake.drain()
        time.sleep(0.01)
    t.join()
    intake.drain()
    assert len(posted) == 20
    # an unpaced post (the loop's own thread, a future's callback) never waits
    for _ in range(20):
        intake.post(lambda: None)
    assert intake.drain() == 20


def test_pacing_slows_a_poster_but_never_strands_it_when_the_loop_does_not_drain():
    intake = Intake(lambda: None, high=4, low=1, pace_timeout=0.01)
    for _ in range(10):  # nobody drains: each post past `high` waits its timeout, then goes on
        intake.post(lambda: None, pace=True)
    assert intake.drain() == 10


def test_a_closed_intake_turns_commands_away_with_fleet_closed():
    intake = Intake(lambda: None)
    queued, refused = Future(), []
    intake.post(lambda: "never", reply=queued)
    intake.close("fleet x has stopped")
    with pytest.raises(FleetClosed, match="has stopped"):
        queued.result(0)
    late = Future()
    intake.post(lambda: "never", reply=late)  # after close: turned away at once, not left waiting
    with pytest.raises(FleetClosed):
        late.result(0)
    intake.post(lambda: "never", refused=refused.append)
    assert len(refused) == 1 and isinstance(refused[0], FleetClosed)
    told = []  # the refusal gets the command's own args: a poster needs no closure per command
    intake.post(lambda unit, n: "never", "unit-7", 3, refused=lambda exc, *args: told.append((type(exc), args)))
    assert told == [(TurnedAway, ("unit-7", 3))]
    assert intake.drain() == 0


def test_intake_call_times_out_when_the_loop_does_not_answer():
    intake = Intake(lambda: None)
    with pytest.raises(TimeoutError):
        intake.call(lambda: 1, timeout=0.05)


# ----------------------------------------------------------------------------- the queue room
def test_queue_room_refuses_a_full_queue_at_once_without_block():
    room = QueueRoom([2, 1])
    room.take(0, "a", block=False)
    room.take(0, "a", block=False)
    with pytest.raises(QueueFull, match=r"role 'a' queue is full \(2 units waiting\)"):
        room.take(0, "a", block=False)
    room.take(1, "b", block=False)  # roles have their own bounds
    room.give(0)
    room.take(0, "a", block=False)
    assert room.waiting(0) == 2 and room.waiting(1) == 1


def test_queue_room_takes_as_much_of_a_batch_as_is_free_and_waits_only_for_none():
    room = QueueRoom([5])
    assert room.take(0, "a", n=3) == 3
    assert room.take(0, "a", n=3) == 2  # what was free, not all three
    with pytest.raises(QueueFull):
        room.take(0, "a", block=False, n=4)
    room.give(0, 2)
    assert room.take(0, "a", timeout=0.1, n=9) == 2 and room.waiting(0) == 5
    got = []
    t = threading.Thread(target=lambda: got.append(room.take(0, "a", n=4)))
    t.start()
    t.join(0.1)
    assert t.is_alive()  # none free: it waits
    room.give(0, 3)
    t.join(5)
    assert got == [3] and room.waiting(0) == 5


def test_queue_room_waits_for_room_and_times_out(monkeypatch):
    # The wait is timed by the room's clock, faked here: each wait on the condition moves
    # it by what was asked, except the first, a wake-up 40 ms in that found no room.
    now = [100.0]
    asked = []

    class Condition(threading.Condition):
        def wait(self, timeout=None):
            assert timeout is not None, "a wait with a timeout waited without limit"
            assert len(asked) < 5, f"still waiting after {asked}"
            asked.append(round(timeout, 9))
            now[0] += min(timeout, 0.04) if len(asked) == 1 else timeout
            return False

    room = QueueRoom([1])
    room.take(0, "a")
    room._cond = Condition(threading.Lock())
    monkeypatch.setattr(intake_mod, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    with pytest.raises(QueueFull, match=r"stayed full \(1 units waiting\) for 0.1 s"):
        room.take(0, "a", timeout=0.1)
    assert asked == [0.1, 0.06]  # the whole timeout, then what was left of it after the wake-up
    assert room.waiting(0) == 1


def test_queue_room_wakes_a_waiter_when_room_is_given():
    room = QueueRoom([1])
    room.take(0, "a")
    got = threading.Event()

    def waiter():
        room.take(0, "a")
        got.set()

    t = threading.Thread(target=waiter)
    t.start()
    assert not got.wait(0.1)  # still full: it waits
    room.give(0)
    assert got.wait(5)
    t.join()


def test_queue_room_bounds_change_live_and_close_wakes_waiters():
    room = QueueRoom([1])
    room.take(0, "a")
    errors = []

    def waiter():
        try:
            room.take(0, "a")
        except FleetClosed as exc:
            errors.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    room.set_bounds([2])  # a reload raised the bound: the waiter gets in
    t.join(5)
    assert not t.is_alive() and not errors and room.waiting(0) == 2
    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    room.close("fleet x has stopped")
    t.join(5)
    assert not t.is_alive() and len(errors) == 1
    with pytest.raises(FleetClosed):
        room.take(0, "a", block=False)


# ----------------------------------------------------------------------------- one owner
def test_operator_calls_and_inspection_run_on_the_loop_thread(fleet_name):
    with running(config(fleet_name, {"w": role("echo", slots=1)}, profile="serial")) as f:
        sup = f._sup
        assert sup.inspect(lambda s: s.door.is_loop_thread(threading.current_thread()))
        assert sup.inspect(lambda s: threading.current_thread().name) == f"fleet-{fleet_name}"
        seen = []
        f.posture_set(cordon_enter_events=3)  # through the loop, and applied there
        assert f.posture_show()["policy"]["cordon_enter_events"] == 3
        sup.call(lambda: seen.append(threading.current_thread().name))
        assert seen == [f"fleet-{fleet_name}"]


def test_a_future_callback_may_submit_and_read_without_deadlock(fleet_name):
    """Callbacks run on the loop thread: a submit from one never waits (it would wait for
    itself), and a view called from one runs in place."""
    cfg = config(fleet_name, {"w": role("echo", slots=1, queue_bound=1)}, profile="serial")
    with running(cfg) as f:
        chained: list = []

        def again(fut):
            chained.append(f._sup.queued("w"))
            chained.append(f.submit("w", fut.result() + 1))

        first = f.submit("w", 1)
        first.add_done_callback(again)
        eventually(lambda: len(chained) == 2, "the callback ran")
        assert chained[1].result(WAIT_S) == 2


def test_a_turn_that_left_nothing_and_heard_no_ring_waits_for_the_bell(fleet_name):
    """Everything that comes in rings the loop's bell, so a turn that left no command
    behind waits for it: a round trip (its submit, then its result) takes about one
    turn each, not a further empty turn after each (which read every ring while the
    woken caller waited for the GIL)."""
    with running(config(fleet_name, {"w": role("echo", slots=1)}, profile="serial")) as f:
        sup = f._sup
        f.submit("w", 0).result(WAIT_S)
        turns = []

        def counted(turn):
            def counting():
                turns.append(1)
                return turn()
            return counting

        sup.inspect(lambda s: setattr(s, "_turn", counted(s._turn)))
        n = 300
        for i in range(n):
            assert f.submit("w", i).result(WAIT_S) == i
        # two per round trip; a few more for the sampler's and the idle wait's timers
        assert len(turns) <= 2.5 * n, f"{len(turns)} turns for {n} round trips"


def test_the_loop_reads_the_zygote_socket_when_the_zygote_has_news_not_on_every_wake(fleet_name):
    """A read of the zygote's socket is a system call (and a raised BlockingIOError when
    empty): the loop makes it when the zygote's news count moved, and once a sample as a
    backstop, not on each of the wake-ups that carry results. Its events still arrive:
    a killed worker is replaced."""
    with running(config(fleet_name, {"w": role("whoami", slots=1)}, profile="serial")) as f:
        sup = f._sup
        _, first_pid = f.submit("w", 0).result(WAIT_S)
        in_turn, reads = [False], []

        def turning(turn):
            def counting():
                in_turn[0] = True
                try:
                    return turn()
                finally:
                    in_turn[0] = False
            return counting

        def counted(read):
            def counting(*args):
                reads.append(in_turn[0])
                return read(*args)
            return counting

        def spy(s):
            assert not s.seats.workers.has_news(s.seats.zygote_news.value)  # the zygote has nothing more to say
            s._turn = turning(s._turn)
            s.seats.workers.read = counted(s.seats.workers.read)

        sup.inspect(spy)
        for i in range(300):
            assert f.submit("w", i).result(WAIT_S)[0] == i
        # the zygote said nothing: no turn read it (the sample's and the quiet waits' reads remain)
        assert reads.count(True) == 0, f"{reads.count(True)} reads by the turn for 300 round trips"
        news = sup.seats.zygote_news.value
        os.kill(first_pid, signal.SIGKILL)  # the zygote reaps it and tells: a new worker runs
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                value, pid = f.submit("w", "after").result(WAIT_S)
            except UnitFailed:  # LaneDeath: sent before the death was heard
                continue
            if pid != first_pid:
                break
        assert value == "after" and pid != first_pid
        assert sup.seats.zygote_news.value - news >= 2  # told of the exit, then of the fork


# ----------------------------------------------------------------------------- backpressure
def test_a_plain_submit_loop_waits_for_room_and_every_unit_solves(fleet_name):
    cfg = config(fleet_name, {"w": role("square", slots=2, queue_bound=64)}, profile="serial")
    with running(cfg) as f:
        futures = [f.submit("w", i) for i in range(5000)]  # never QueueFull: submit waits
        assert [fut.result(WAIT_S) for fut in futures] == [i * i for i in range(5000)]
        assert f.ledger()["solved"] == 5000


def test_a_batch_submit_takes_room_in_runs_and_gives_each_payload_one_unit_in_order(fleet_name):
    # map's batches: 5,000 payloads through a queue bound of 64, each its own unit and outcome
    cfg = config(fleet_name, {"w": role("square", slots=2, queue_bound=64)}, profile="serial")
    with running(cfg) as f:
        futures = f._sup.submit_many("w", list(range(5000)))
        ids = [fut.unit_id for fut in futures]
        assert ids == sorted(ids) and len(set(ids)) == 5000
        assert [fut.result(WAIT_S) for fut in futures] == [i * i for i in range(5000)]
        chunks = f._sup.submit_many("w", [[1, 2], [3]], chunk=True)
        assert [fut.result(WAIT_S)[0] for fut in chunks] == [[1, 4], [9]]
        assert f.ledger()["solved"] == 5002


def test_a_batch_with_one_bad_payload_queues_none_of_it(fleet_name):
    cfg = config(fleet_name, {"w": role("square", slots=2)}, profile="serial")
    with running(cfg) as f:
        with pytest.raises(PayloadUnpicklable, match="role 'w'"):
            f._sup.submit_many("w", [1, 2, threading.Lock(), 4])
        with pytest.raises(BadUnit):
            f._sup.submit_many("w", [1], lane=7)
        assert f.ledger()["submitted"] == 0 and f._sup.queued("w") == 0


def test_block_false_refuses_a_full_queue_at_once(fleet_name):
    # lookahead 0: every unit but the running one waits in the queue
    cfg = config(fleet_name, {"w": role("hang", slots=1, queue_bound=2, lookahead=0)}, profile="serial")
    with running(cfg) as f:
        f.submit("w", 30)
        eventually(lambda: f._sup.queued("w") == 0, "the first unit is granted")
        f.submit("w", 30)
        f.submit("w", 30)
        with pytest.raises(QueueFull, match="queue is full"):
            f.submit("w", 30, block=False)
        with pytest.raises(QueueFull, match=r"stayed full \(2 units waiting\) for 0.2 s"):  # it waited, then gave up
            f.submit("w", 30, block_timeout=0.2)
        assert f.ledger()["submitted"] == 3  # the refused ones changed nothing
        f._sup.kill()  # rather than wait for the sleeping units


def test_a_waiting_submit_fails_fleet_closed_when_the_fleet_stops(fleet_name):
    cfg = config(fleet_name, {"w": role("hang", slots=1, queue_bound=1, lookahead=0)}, profile="serial")
    with running(cfg) as f:
        f.submit("w", 30)
        eventually(lambda: f._sup.queued("w") == 0, "the first unit is granted")
        f.submit("w", 30)
        errors = []

        def blocked():
            try:
                f.submit("w", 30)
            except FleetClosed as exc:
                errors.append(exc)
            else:
                errors.append(None)

        t = threading.Thread(target=blocked)
        t.start()
        time.sleep(0.2)
        assert t.is_alive()  # waiting for room
        f._sup.kill()
        t.join(WAIT_S)
        assert not t.is_alive()
        assert len(errors) == 1 and (errors[0] is None or isinstance(errors[0], FleetClosed))


# ----------------------------------------------------------------------------- a fake clock
def _kill_a_worker(f) -> int:
    pid = next(iter(worker_pids(f)))
    os.kill(pid, signal.SIGKILL)
    eventually(lambda: pid not in f._sup.pids().values() and len(f._sup.pids()) == 1, "the seat is re-forked")
    return pid


def test_restart_intensity_forgets_deaths_older_than_its_window(fleet_name):
    host = FakeClockHost()
    cfg = config(fleet_name, {"w": role("echo", slots=1)}, profile="serial",
                 restart={"max_restarts": 1, "within_seconds": 10})
    with running(cfg, host=host) as f:
        assert f.submit("w", 1).result(WAIT_S) == 1
        _kill_a_worker(f)
        host.advance(11)  # the first death leaves the window
        _kill_a_worker(f)  # one death in the window: restarted, not stopped
        assert f.submit("w", 2).result(WAIT_S) == 2
        assert f._sup.inspect(lambda s: set(s.role_stops.view)) == set()
        host.advance(9)  # still inside the second death's window
        os.kill(next(iter(worker_pids(f))), signal.SIGKILL)
        eventually(lambda: f._sup.inspect(lambda s: set(s.role_stops.view)) == {0}, "the role is stopped")


def test_a_deadline_kills_only_once_the_clock_passes_it(fleet_name):
    host = FakeClockHost()
    cfg = config(fleet_name, {"w": role("hang", slots=1)}, profile="serial")
    with running(cfg, host=host) as f:
        fut = f.submit("w", 30, timeout=5)
        eventually(lambda: f._sup.table.snapshot().slot(0)["state"] == "Running", "the unit runs")
        time.sleep(0.5)  # real time passes; the fake clock does not
        assert not fut.done() and host.kills == []
        host.advance(6)
        with pytest.raises(UnitFailed) as info:
            fut.result(WAIT_S)
        assert info.value.outcome.reason == "Timeout"
        assert len(host.kills) == 1


def test_stop_grace_holds_queued_units_until_the_clock_says_so(fleet_name):
    host = FakeClockHost()
    cfg = config(fleet_name, {"w": role("hang", slots=1, lookahead=0)}, profile="serial")
    with running(cfg, host=host) as f:
        # The one slot is held by a unit the fake clock times out: every other unit stays queued.
        blocker = f.submit("w", 30, timeout=5)
        eventually(lambda: f._sup.table.snapshot().slot(0)["state"] == "Running", "the blocker runs")
        futures = [f.submit("w", 0) for i in range(3)]
        f._sup.stop(grace_s=30, wait=False)
        time.sleep(0.5)
        assert not any(fut.done() for fut in futures + [blocker])
        host.advance(31)
        for fut in futures:
            with pytest.raises(UnitFailed) as info:
                fut.result(WAIT_S)
            assert info.value.outcome.reason == "Shutdown"
        with pytest.raises(UnitFailed) as info:
            blocker.result(WAIT_S)
        assert info.value.outcome.reason == "Timeout"
        assert f._sup.wait_stopped(WAIT_S)
        assert f.ledger()["failed"] == 4


def test_a_death_during_shutdown_fails_its_unit_and_the_queue_still_runs(fleet_name):
    cfg = config(fleet_name, {"w": role("hang", slots=1)}, profile="serial",
                 restart={"max_restarts": 100, "within_seconds": 10})
    with running(cfg) as f:
        running_unit = f.submit("w", 30)
        queued = f.submit("w", 0)  # sleeps 0 s: solves at once once it runs (sent ahead: it never starts)
        eventually(lambda: f._sup.table.snapshot().slot(0)["state"] == "Running", "the first unit runs")
        closer = threading.Thread(target=f.shutdown)
        closer.start()
        eventually(lambda: f._sup.door.closing, "shutdown began")
        os.kill(next(iter(worker_pids(f))), signal.SIGKILL)
        with pytest.raises(UnitFailed) as info:
            running_unit.result(WAIT_S)
        assert info.value.outcome.reason == "LaneDeath"
        assert queued.result(WAIT_S) == "woke"  # the seat was re-forked while closing
        closer.join(WAIT_S)
        assert not closer.is_alive()
        counts = f.ledger()
        assert counts["submitted"] == 2 and counts["solved"] == 1 and counts["failed"] == 1
