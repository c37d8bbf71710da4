"""Shutdown of a pinned role whose one pin is another key's (no `elastic_repin`).

A key without a pin waits for an epoch boundary to re-key one (002 §3.4, T9); a closing
fleet reaches none. So shutdown must not wait for such a unit: `cancel_futures` cancels
it (it was never granted), and without it the unit fails Shutdown, naming its key and why,
while the units that hold a pin still run. Real workers and shared memory; a unit is held
running by a file the test creates (`tests.why_handlers`), so nothing depends on timing.
"""
from __future__ import annotations

import threading

import pytest

from fleet.rules import why as rule
from fleet.rules.unit import UnitFailed

from ..daemons import BOUND_S, wait_until
from ..fleets import config, running, unique_name
from .test_why import gate_file


def _one_pin() -> dict:
    return {"kind": "pinned", "handler": "tests.why_handlers:held_pid", "slots": 1, "peak_cpus": 1,
            "queue_bound": 100}


def _shutdown_returns(f, **how) -> None:
    """`f.shutdown(wait=True, **how)` returns within the bound; if not, the fleet is killed
    (so the test cleans up) and the test fails."""
    t = threading.Thread(target=f.shutdown, kwargs={"wait": True, **how}, daemon=True)
    t.start()
    t.join(BOUND_S)
    if t.is_alive():
        f._sup.kill(wait=True)
        pytest.fail(f"shutdown({how}) waited for ever on a unit no pin can come to")


def _waits_for_a_pin(f, unit) -> None:
    wait_until(lambda: f.why(unit.unit_id)["state"] == rule.KEY, "the second key to wait for a pin")
    assert "waits for a pin for key 'k2'" in f.why(unit.unit_id)["text"]


def test_cancel_futures_cancels_a_unit_whose_key_waits_for_a_pin_another_key_holds_idle():
    with running(config(unique_name("pinc"), {"solver": _one_pin()})) as f:
        assert f.submit("solver", (None, 1), key="k1").result(BOUND_S)[0] == 1  # k1's pin, idle now
        other_key = f.submit("solver", (None, 2), key="k2")
        _waits_for_a_pin(f, other_key)
        _shutdown_returns(f, cancel_futures=True)
        assert other_key.cancelled()


def test_shutdown_runs_the_pinned_keys_units_and_fails_a_key_no_pin_can_come_to_naming_why():
    with running(config(unique_name("pinw"), {"solver": _one_pin()})) as f, gate_file() as (path, release):
        first = f.submit("solver", (path, 1), key="k1")
        wait_until(lambda: f.why(first.unit_id)["state"] == rule.RUNNING, "k1's first unit to run")
        same_key = f.submit("solver", (None, 2), key="k1")
        other_key = f.submit("solver", (None, 3), key="k2")
        _waits_for_a_pin(f, other_key)
        # Shutdown (no cancel) fails k2's unit at once: no epoch boundary comes to a closing fleet.
        with pytest.raises(UnitFailed) as failed:
            threading.Thread(target=f.shutdown, kwargs={"wait": False}, daemon=True).start()
            other_key.result(BOUND_S)
        assert failed.value.reason == "Shutdown"
        detail = failed.value.outcome.detail
        assert "pin for key 'k2'" in detail and "epoch boundary" in detail and "never ran" in detail
        assert not first.done() and not same_key.done()  # k1 still holds its pin: its units run
        release()
        _shutdown_returns(f)
        assert first.result(0)[0] == 1 and same_key.result(0)[0] == 2
