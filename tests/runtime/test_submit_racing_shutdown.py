"""A submit that races shutdown (embedded `fleet.Fleet`, and `map`'s batch submit): it
raises FleetClosed, or it returns a future whose unit is in the ledger with its own
outcome (solved, or failed Shutdown with its reason). Never a future the ledger does
not know of.

Two moments of the race are pinned down by holding one caller between its check that
the fleet is open and its post to the loop: the loop applies the shutdown meanwhile, or
has stopped altogether. A third test hammers submits from threads against a shutdown.
"""
from __future__ import annotations

import threading

import pytest

from fleet import FleetClosed, UnitFailed
from fleet.runtime import submit as submit_room

from ..fleets import config, role, running

WAIT_S = 30.0


def hold_submits_until(monkeypatch, sup, released: threading.Event, moment) -> None:
    """Every later submit of `sup` waits, past its open check and before its post to the
    loop, until `moment()` is true; `released` is set as each one goes on."""
    real = submit_room.Submitter._new_unit

    def new_unit(of, *args):
        if of is sup._submitter:
            for _ in range(int(WAIT_S / 0.01)):
                if moment():
                    break
                threading.Event().wait(0.01)
            released.set()
        return real(of, *args)

    monkeypatch.setattr(submit_room.Submitter, "_new_unit", new_unit)  # for this test only; other fleets pass through


def submit_in_thread(submit) -> dict:
    got: dict = {}

    def run():
        try:
            got["future"] = submit()
        except FleetClosed as exc:
            got["raised"] = exc

    t = threading.Thread(target=run)
    t.start()
    got["thread"] = t
    return got


def assert_failed_shutdown(future) -> None:
    with pytest.raises(UnitFailed) as err:
        future.result(WAIT_S)
    assert err.value.reason == "Shutdown" and err.value.unit_id == future.unit_id


@pytest.mark.parametrize("batch", [False, True], ids=["submit", "submit_many"])
def test_a_submit_the_loop_takes_after_shutdown_is_ledgered_and_fails_shutdown(fleet_name, batch, monkeypatch):
    cfg = config(fleet_name, {"w": role("hang", slots=1, lookahead=0)}, profile="serial")
    with running(cfg) as f:
        sup = f._sup
        busy = f.submit("w", 3600)  # keeps the loop from stopping: shutdown waits for it
        released = threading.Event()
        hold_submits_until(monkeypatch, sup, released, lambda: sup.door.closing)
        late = submit_in_thread(lambda: sup.submit_many("w", [1, 2])[0] if batch else f.submit("w", 1))
        try:
            f.shutdown(wait=False)  # returns once the loop has applied it
            late["thread"].join(WAIT_S)
            assert released.is_set() and "raised" not in late
            assert_failed_shutdown(late["future"])
        finally:
            sup.kill()  # rather than wait for the sleeping unit
        assert_failed_shutdown(busy)
        ledger = f.ledger()
        late_units = 2 if batch else 1
        assert ledger["submitted"] == 1 + late_units
        assert ledger["failed_by_reason"] == {"Shutdown": 1 + late_units} and ledger["inflight"] == 0


@pytest.mark.parametrize("batch", [False, True], ids=["submit", "submit_many"])
def test_a_submit_posted_after_the_loop_stopped_is_ledgered_and_fails_shutdown(fleet_name, batch, monkeypatch):
    cfg = config(fleet_name, {"w": role("echo", slots=1)}, profile="serial")
    with running(cfg) as f:
        sup = f._sup
        released = threading.Event()
        hold_submits_until(monkeypatch, sup, released, sup.door.stopped.is_set)
        late = submit_in_thread(lambda: sup.submit_many("w", [1, 2])[-1] if batch else f.submit("w", 1))
        f.shutdown(wait=True)  # nothing owed: the loop stops and closes its intake
        late["thread"].join(WAIT_S)
        assert released.is_set() and "raised" not in late
        assert_failed_shutdown(late["future"])
        ledger = f.ledger()
        assert ledger["submitted"] == ledger["failed"] == (2 if batch else 1)
        assert ledger["failed_by_reason"] == {"Shutdown": ledger["failed"]}


def test_hammered_submits_against_shutdown_each_raise_or_end_in_the_ledger(fleet_name):
    cfg = config(fleet_name, {"w": role("echo", slots=2)}, profile="serial")
    with running(cfg) as f:
        futures: list = []
        raised = []
        go = threading.Event()

        def hammer(batch: bool):
            go.wait()
            while True:
                try:
                    if batch:
                        futures.extend(f._sup.submit_many("w", list(range(4))))
                    else:
                        futures.append(f.submit("w", 1))
                except FleetClosed as exc:
                    raised.append(exc)
                    return

        threads = [threading.Thread(target=hammer, args=(i % 2 == 1,)) for i in range(4)]
        for t in threads:
            t.start()
        go.set()
        while len(futures) < 2000:
            threading.Event().wait(0.001)
        f.shutdown(wait=True)
        for t in threads:
            t.join(WAIT_S)
        assert len(raised) == len(threads)  # every thread met the closed fleet in the end
        shut = 0
        for fut in futures:
            try:
                fut.result(WAIT_S)
            except UnitFailed as exc:
                assert exc.reason == "Shutdown", exc
                shut += 1
        ledger = f.ledger()
        # every returned future's unit is counted, once, with the outcome its future shows
        assert ledger["submitted"] == len(futures) == ledger["solved"] + ledger["failed"]
        assert ledger["failed_by_reason"] == ({"Shutdown": shut} if shut else {})
        assert len({fut.unit_id for fut in futures}) == len(futures)
