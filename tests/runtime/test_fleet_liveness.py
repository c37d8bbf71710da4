"""Liveness and exactly-one-outcome at the edges of cordon and worker death, on real fleets:
a lease lost under cordon goes home (T10), units sent behind a pin that cordon drained run
later instead of failing, every lane death holds a sticky cordon that an operator releases,
and a transition the slot FSM refuses is reported as FsmRefused (and counted), never as a
worker death."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from fleet.worker import codec
from fleet.rules import fsm
from fleet.shm import messages as M
from fleet.rules.posture import PostureCauseError
from fleet.shm.table import layout as L
from fleet.shm.table.kernels import SLOT_FIELDS
from fleet.rules.unit import UnitFailed
from tests.fleets import config, hold, role, running

EVENTUALLY_S = 60  # generous: these are "eventually" waits, never timing assertions
#: A short exit window, so a released cordon turns Nominal soon (the default is 10 s).
QUICK_EXIT = {"cordon_exit_clean_ms": 50}


def wait_for(predicate, what: str):
    deadline = time.monotonic() + EVENTUALLY_S
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.005)


def states(sup) -> list[str]:
    snap = sup.table.snapshot()
    return [snap.slot(i)["state"] for i in range(snap.n_slots)]


def release_everything(f):
    for cause in ("lane-death", "operator"):
        f.posture_release(cause)


# --- item: a lease lost under cordon ----------------------------------------------------------


def test_a_lease_lost_under_cordon_goes_back_to_idle_and_the_slot_serves_again(fleet_name):
    """One serial seat, two slots of a deferrable role: the first unit runs, the second is
    granted (Leased) behind it; cordon, then the worker dies. Both slots must reach Idle
    (the Leased one by T10: START is refused under cordon) and serve once released; the
    second unit never started, so it waits in its queue and runs then."""
    cfg = config(fleet_name, {"bg": role("hang", cordon_class="deferrable", slots=2)}, profile="serial",
                 posture=QUICK_EXIT)
    with running(cfg) as f:
        sup = f._sup
        first = f.submit("bg", 600)
        wait_for(lambda: states(sup) == ["Running", "Idle"], "the first unit runs")
        second = f.submit("bg", 0.01)
        wait_for(lambda: states(sup) == ["Running", "Leased"], "the second is granted behind it")
        hold(f)
        assert states(sup) == ["Draining", "Leased"]
        os.kill(sup.pids()[0], signal.SIGKILL)
        error = first.exception(EVENTUALLY_S)
        assert isinstance(error, UnitFailed) and error.reason == "LaneDeath"
        wait_for(lambda: states(sup) == ["Idle", "Idle"], "both slots reach Idle")
        assert f.ledger()["fsm_refused"] == 0
        assert sup.inspect(lambda s: s.dispatcher.queued(0)) == 1 and not second.done()  # back, held by cordon
        release_everything(f)
        again = [f.submit("bg", 0.01) for _ in range(4)]
        assert [fut.result(EVENTUALLY_S) for fut in [second] + again] == ["woke"] * 5
        assert f.ledger()["failed_by_reason"] == {"LaneDeath": 1}


# --- item: units sent behind a pin that cordon drains --------------------------------------------


def test_units_sent_behind_a_drained_pin_run_later_in_order(fleet_name):
    """A keyed deferrable role: a unit runs on the pin for key k, two more of k are sent
    behind it (RESUME). Cordon drains the pin (T7, T8 -> Idle); the two must not fail:
    they wait, and run in their order once the posture allows."""
    cfg = config(fleet_name, {"bins": role("nap_in_order", kind="pinned", cordon_class="deferrable", slots=1)},
                 profile="serial", posture=QUICK_EXIT)
    with running(cfg) as f:
        sup = f._sup
        head = f.submit("bins", (1.0, "head"), key="k")
        wait_for(lambda: states(sup) == ["Running"], "the head unit runs on its pin")
        behind = [f.submit("bins", (0.0, tag), key="k") for tag in ("second", "third")]
        wait_for(lambda: sup.inspect(lambda s: s.dispatcher.inflight_count()) == 3, "both are sent behind the pin")
        hold(f)
        assert head.result(EVENTUALLY_S)[0] == "head"  # in-flight work completes (drained)
        wait_for(lambda: sup.inspect(lambda s: s.dispatcher.queued(0)) == 2, "the two come back to the queue")
        assert not any(fut.done() for fut in behind)
        assert states(sup) == ["Idle"]
        f.posture_release("operator")
        (tag2, n2), (tag3, n3) = [fut.result(EVENTUALLY_S) for fut in behind]
        assert (tag2, tag3) == ("second", "third") and n2 < n3  # submit order kept
        ledger = f.ledger()
        assert (ledger["solved"], ledger["failed"], ledger["fsm_refused"]) == (3, 0, 0)


# --- item: every lane death cordons until an operator releases it --------------------------------


def test_every_lane_death_holds_a_sticky_cordon_until_released(fleet_name):
    cfg = config(fleet_name, {"work": role("hang", slots=1), "bg": role("echo", cordon_class="deferrable", slots=1)},
                 profile="serial")
    with running(cfg) as f:
        sup = f._sup
        unit = f.submit("work", 600)
        wait_for(lambda: "Running" in states(sup), "the unit runs")
        os.kill(sup.pids()[0], signal.SIGKILL)
        assert unit.exception(EVENTUALLY_S).reason == "LaneDeath"
        view = f.posture_show()
        assert (view["posture"], view["causes"]) == ("Cordoned", ["lane-death"])  # one death is enough
        assert f.status()["posture"]["cause"] == "lane-death"
        held = f.submit("bg", "later")  # deferrable: held while cordoned
        time.sleep(0.3)
        assert not held.done()
        with pytest.raises(PostureCauseError):
            f.posture_release("lane_death")  # not a cause: refused, nothing changes
        assert f.posture_show()["causes"] == ["lane-death"]
        assert f.posture_release("operator")["released"] is False  # not held: nothing changes
        f.posture_set(cordon_exit_clean_ms=50)
        reply = f.posture_release("lane-death")
        assert reply["released"] is True and reply["causes"] == []
        assert held.result(EVENTUALLY_S) == "later"
        wait_for(lambda: f.posture_show()["posture"] == "Nominal", "Nominal after a clean exit window")


def test_a_timeout_kill_is_not_a_lane_death(fleet_name):
    """The supervisor's own kill of a worker for a unit past its timeout does not cordon."""
    cfg = config(fleet_name, {"work": role("hang", slots=1)}, profile="serial")
    with running(cfg) as f:
        error = f.submit("work", 600, timeout=0.2).exception(EVENTUALLY_S)
        assert error.reason == "Timeout"
        wait_for(lambda: len(f._sup.pids()) == 1, "the seat is re-forked")
        assert f.posture_show()["causes"] == []


# --- item: a refused grant or completion is FsmRefused, counted ----------------------------------


def test_a_refused_grant_fails_fsm_refused_and_is_counted(fleet_name):
    cfg = config(fleet_name, {"work": role("echo", slots=1)}, profile="serial")
    with running(cfg) as f:
        sup = f._sup
        assert f.submit("work", 1).result(EVENTUALLY_S) == 1
        word_at = 0 * SLOT_FIELDS + L.S_WORD
        sup.table.slots[word_at] = L.pack_word(fsm.RUNNING, 0, 0, 7)  # a word the dispatcher does not expect
        error = f.submit("work", 2).exception(EVENTUALLY_S)
        assert isinstance(error, UnitFailed) and error.reason == "FsmRefused"
        assert "LEASE" in str(error) and "illegal transition" in str(error)
        sup.table.slots[word_at] = L.pack_word(fsm.IDLE, 0, 0, 8)
        assert f.submit("work", 3).result(EVENTUALLY_S) == 3
        ledger = f.ledger()
        assert ledger["failed_by_reason"] == {"FsmRefused": 1} and ledger["fsm_refused"] == 1
        wait_for(lambda: f.status()["ledger"]["fsm_refused"] == 1, "status shows the count")
        assert f.status()["ledger"]["failed_by_reason"]["FsmRefused"] == 1
        assert f.posture_show()["causes"] == []  # not a lane death


def test_one_refused_grant_of_a_batch_fails_alone(fleet_name):
    """Grants of one pass go to the table in one kernel call: the refused one fails
    FsmRefused, the others of the same call run."""
    cfg = config(fleet_name, {"work": role("echo", slots=3)}, profile="serial")
    with running(cfg) as f:
        sup = f._sup
        assert list(f.map("work", [1, 2, 3])) == [1, 2, 3]
        wait_for(lambda: all(sup.table.state(s)[0] == fsm.IDLE for s in range(3)), "every slot Idle")
        sup.table.slots[1 * SLOT_FIELDS + L.S_WORD] = L.pack_word(fsm.RUNNING, 0, 0, 7)
        futures = sup.submit_many("work", [10, 20, 30])  # one run: one pass grants all three
        errors = [fu.exception(EVENTUALLY_S) for fu in futures]
        refused = [e for e in errors if e is not None]
        assert len(refused) == 1 and refused[0].reason == "FsmRefused" and "LEASE" in str(refused[0])
        assert sorted(fu.result() for fu, e in zip(futures, errors) if e is None) in ([10, 20], [10, 30], [20, 30])
        assert f.ledger()["fsm_refused"] == 1


def test_a_refused_completion_fails_fsm_refused_and_is_counted(fleet_name):
    cfg = config(fleet_name, {"work": role("lose_own_completion", slots=1)}, profile="serial")
    with running(cfg) as f:
        error = f.submit("work", fleet_name).exception(EVENTUALLY_S)
        assert isinstance(error, UnitFailed) and error.reason == "FsmRefused"
        assert "RELEASE" in str(error) and "illegal transition" in str(error)
        ledger = f.ledger()
        assert ledger["failed_by_reason"] == {"FsmRefused": 1} and ledger["fsm_refused"] == 1


@pytest.mark.parametrize("status", [M.ST_START_REFUSED, M.ST_COMPLETION_REFUSED])
def test_a_refusal_from_a_worker_is_not_a_lane_death(status):
    outcome, value, original = codec.result_outcome(status, b"slot 3 refused START: wrong role")
    assert (outcome.kind, outcome.reason, outcome.detail) == ("failed", "FsmRefused", "slot 3 refused START: wrong role")


# --- shutdown while a sticky cause holds the cordon -------------------------------------------------


def test_shutdown_under_a_sticky_cordon_fails_deferred_work_instead_of_waiting(fleet_name):
    """Cordon holds deferrable intake, and a sticky cause never clears on its own: shutdown
    must not wait for it. Deferrable units not yet started (one held by its worker on a
    Leased slot, one still queued) fail Shutdown; started work completes; shutdown returns."""
    cfg = config(fleet_name, {"work": role("hang", slots=1), "bg": role("echo", cordon_class="deferrable", slots=1)},
                 profile="serial")
    with running(cfg) as f:
        sup = f._sup
        busy = f.submit("work", 0.5)
        wait_for(lambda: states(sup) == ["Running", "Idle"], "the busy unit runs")
        leased = f.submit("bg", "leased")  # granted behind it on the one serial seat
        wait_for(lambda: states(sup) == ["Running", "Leased"], "the deferrable unit is granted")
        hold(f)
        queued = f.submit("bg", "queued")
        closer = threading.Thread(target=f.shutdown, daemon=True)
        closer.start()
        closer.join(EVENTUALLY_S)
        if closer.is_alive():
            sup.kill()
            pytest.fail("shutdown waited for a sticky cordon")
        assert busy.result(0) == "woke"
        for fut in (leased, queued):
            error = fut.exception(0)
            assert isinstance(error, UnitFailed) and error.reason == "Shutdown", error
        ledger = f.ledger()
        assert (ledger["submitted"], ledger["solved"], ledger["inflight"]) == (3, 1, 0)
        assert ledger["failed_by_reason"] == {"Shutdown": 2} and ledger["fsm_refused"] == 0


# --- a zygote that dies with requests unread ---------------------------------------------------


def test_a_zygote_killed_with_requests_unread_is_replaced(fleet_name, caplog):
    """A fork server killed with bytes unread in its socket resets the connection rather
    than closing it (ECONNRESET, not EOF). That is its death all the same: a new one
    starts and the fleet serves; the loop must not crash (failing everything, for good)."""
    cfg = config(fleet_name, {"work": role("whoami", slots=1)}, profile="serial")
    with running(cfg) as f:
        sup = f._sup
        old_pid = f.submit("work", 1).result(EVENTUALLY_S)[1]
        zygote = sup.seats.workers.zygote.pid
        os.kill(zygote, signal.SIGSTOP)  # so it cannot read what comes next
        sup.inspect(lambda sup: sup.seats.workers.zygote._send({"op": "noop"}))
        os.kill(zygote, signal.SIGKILL)
        wait_for(lambda: sup.seats.workers.zygote is not None and sup.seats.workers.zygote.pid != zygote and sup.pids(), "a new zygote serves")
        value, pid = f.submit("work", 2).result(EVENTUALLY_S)
        assert value == 2 and pid != old_pid
        assert "supervisor loop crashed" not in caplog.text
