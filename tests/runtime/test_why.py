"""`Fleet.why` on real embedded fleets: each waiting state checked against the state it names.

Real workers and shared memory; a unit is held running by a file the test creates
(`tests.why_handlers`), so nothing depends on timing. Each answer is checked against the
fleet's own state (the futures' ids, the worker's real pid, the outcome the future
raised, the posture the test set, the closure it made), not against the answer's own words.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import time

import pytest

import fleet
from admission.pool import ManualClock
from fleet.rules import why as rule
from fleet.rules.when import utc

from ..admission_catalog import GLM_OR, T_1447, catalog
from ..daemons import BOUND_S, wait_until
from ..fleets import config, hold, role, running, unique_name


def held_role(**fields) -> dict:
    """One slot, nothing sent ahead to it: a unit held running keeps the next ones queued."""
    spec = role("held_pid", slots=1, io_bound=True, peak_cpus=0, lookahead=0)
    spec["handler"] = "tests.why_handlers:held_pid"
    spec.update(fields)
    return spec


@contextlib.contextmanager
def gate_file():
    """(path, release): units given `path` run until `release()` creates it."""
    directory = tempfile.mkdtemp(prefix="why-", dir="/tmp")
    path = os.path.join(directory, "go")
    try:
        yield path, lambda: open(path, "w").close()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.rmdir(directory)  # a unit still held ends now (tests.why_handlers)


def state_of(f, unit_id):
    return f.why(unit_id)["state"]


def test_a_queued_unit_names_its_position_and_the_units_ahead_and_the_head_waits_for_a_slot():
    with running(config(unique_name("whyq"), {"one": held_role()})) as f, gate_file() as (path, release):
        before = time.time()
        first = f.submit("one", (path, 1))
        wait_until(lambda: state_of(f, first.unit_id) == rule.RUNNING, "the first unit to run")
        queued = [f.submit("one", (None, n)) for n in range(2, 6)]
        ids = [u.unit_id for u in queued]

        head = f.why(ids[0])
        assert (head["state"], head["held_by"], head["position"]) == (rule.SLOT, rule.SLOT, 1)
        assert head["queued"]["ahead"] == []
        assert head["queued"]["room"]["held"] == head["queued"]["room"]["count"] == 1
        assert f"holds 1 of its 1 slots (running: unit {first.unit_id})" in head["text"]

        last = f.why(ids[-1])  # behind the other three queued units
        assert (last["state"], last["position"], last["held_by"]) == (rule.QUEUED, 4, rule.SLOT)
        assert last["queued"]["ahead"] == ids[:3]
        assert f"position 4: 3 unit(s) ahead of it ({ids[0]}, {ids[1]}, {ids[2]})" in last["text"]
        assert set(last) == set(rule.KEYS)  # the stable shape, whatever the state

        running_now = f.why(first.unit_id)
        granted = running_now["granted"]
        assert running_now["state"] == rule.RUNNING and granted["inflight"] == [first.unit_id]
        assert before <= granted["since"] <= time.time()
        assert f"worker pid {granted['pid']}" in running_now["text"] and utc(granted["since"]) in running_now["text"]

        # the oldest waiting units, oldest first, each with the same answer as alone
        listed = f.why()
        assert [w["unit"] for w in listed["waiting"]] == ids
        assert [w["text"] for w in listed["waiting"]] == [f.why(u)["text"] for u in ids]
        assert listed["owed"] == 5
        release()
        assert first.result(BOUND_S)[1] == granted["pid"]  # the pid it named is the worker that ran it
        for u in queued:
            u.result(BOUND_S)


def test_an_ended_unit_names_its_outcome_solved_failed_or_cancelled():
    roles = {"one": held_role(), "bad": {**role("noop", slots=1), "handler": "tests.why_handlers:broken"}}
    with running(config(unique_name("whye"), roles)) as f, gate_file() as (path, release):
        solved = f.submit("one", (None, 3))
        assert solved.result(BOUND_S)[0] == 3
        assert f.why(solved.unit_id)["ended"] == {"kind": "solved", "reason": None, "detail": None}

        failed = f.submit("bad", "x")
        with pytest.raises(ValueError):
            failed.result(BOUND_S)
        wait_until(lambda: state_of(f, failed.unit_id) == rule.ENDED, "the failed unit to end")
        ended = f.why(failed.unit_id)["ended"]
        assert ended["kind"] == "failed"
        assert f.ledger()["failed_by_reason"] == {ended["reason"]: 1}  # the reason the ledger counted
        assert "broken on purpose: x" in ended["detail"]

        holder = f.submit("one", (path, 1))
        wait_until(lambda: state_of(f, holder.unit_id) == rule.RUNNING, "the holder to run")
        cancelled = f.submit("one", (None, 2))
        assert f.why(cancelled.unit_id)["state"] == rule.SLOT
        assert cancelled.cancel()
        answer = f.why(cancelled.unit_id)  # still in the queue, but its outcome is decided
        assert answer["state"] == rule.ENDED and answer["ended"]["reason"] == "Cancelled"
        release()
        holder.result(BOUND_S)
        wait_until(lambda: f.ledger()["failed_by_reason"].get("Cancelled") == 1, "the cancel to be recorded")
        answer = f.why(cancelled.unit_id)  # off the books now: the outcome the books kept
        assert answer["ended"] == {"kind": "failed", "reason": "Cancelled", "detail": None}
        assert answer["text"] == f"unit {cancelled.unit_id} has ended: failed Cancelled"


def test_an_unknown_id_is_a_typed_error_naming_it_and_a_bad_one_is_refused():
    with running(config(unique_name("whyu"), {"one": held_role()})) as f:
        last = f.submit("one", (None, 1))
        last.result(BOUND_S)
        never = last.unit_id + 1_000
        with pytest.raises(rule.UnknownUnit) as info:
            f.why(never)
        assert info.value.unit_id == never and str(never) in str(info.value) and info.value.exit_code == 65
        for bad in (0, -3, "7", True):
            with pytest.raises(rule.BadWhy):
                f.why(bad)
        with pytest.raises(rule.BadWhy):
            f.why(oldest=0)


def test_a_keyed_unit_names_its_key_and_the_unit_its_pin_runs_and_a_key_without_a_pin_the_pins_taken():
    # one pin; elastic: a key without one takes the pin of a key with nothing in flight
    keyed = {"kind": "pinned", "handler": "tests.why_handlers:held_pid", "slots": 1, "peak_cpus": 1,
             "queue_bound": 100, "elastic_repin": True}
    with running(config(unique_name("whyk"), {"solver": keyed})) as f, gate_file() as (path, release):
        first = f.submit("solver", (path, 1), key="k1")
        wait_until(lambda: state_of(f, first.unit_id) == rule.RUNNING, "k1's first unit to run")
        same_key = f.submit("solver", (None, 2), key="k1")
        wait_until(lambda: f.why(same_key.unit_id)["granted"] is not None, "k1's second unit to go to its pin")
        answer = f.why(same_key.unit_id)
        assert (answer["state"], answer["behind"]) == (rule.KEY, [first.unit_id])
        assert answer["granted"]["slot"] == f.why(first.unit_id)["granted"]["slot"]
        assert "waits for key 'k1'" in answer["text"] and f"runs unit {first.unit_id} first" in answer["text"]

        other_key = f.submit("solver", (None, 3), key="k2")
        answer = f.why(other_key.unit_id)
        assert (answer["state"], answer["held_by"]) == (rule.KEY, rule.KEY)
        slot = f.why(first.unit_id)["granted"]["slot"]
        assert answer["queued"]["pins"] == {"k1": (slot, first.unit_id)}
        assert "waits for a pin for key 'k2'" in answer["text"]
        assert f"'k1' on slot {slot} (unit {first.unit_id} runs)" in answer["text"]
        release()
        for u in (first, same_key, other_key):
            u.result(BOUND_S)


def test_a_unit_of_a_deferrable_role_names_the_cordon_its_posture_and_cause():
    roles = {"bg": held_role(cordon_class="deferrable", slots=2), "other": held_role()}
    with running(config(unique_name("whyc"), roles)) as f:
        hold(f, "operator")
        held = f.submit("bg", (None, 1))
        answer = f.why(held.unit_id)
        assert (answer["state"], answer["held_by"]) == (rule.CORDON, rule.CORDON)
        assert answer["queued"]["causes"] == ["operator"] and answer["queued"]["room"]["held"] == 0
        assert "posture Cordoned (causes: operator)" in answer["text"] and "deferrable" in answer["text"]
        f.posture_release("operator")
        assert held.result(BOUND_S)[0] == 1
        assert state_of(f, held.unit_id) == rule.ENDED


def test_a_drain_holds_no_queued_unit_so_why_names_its_real_wait():
    """A drain refuses new submits only: a unit queued before it still waits for what holds
    it (here its role's one slot) and runs without a resume."""
    with running(config(unique_name("whyd"), {"one": held_role()})) as f, gate_file() as (path, release):
        first = f.submit("one", (path, 1))
        wait_until(lambda: state_of(f, first.unit_id) == rule.RUNNING, "the first unit to run")
        queued = f.submit("one", (None, 2))
        f.operations.drain()
        answer = f.why(queued.unit_id)
        assert answer["state"] == rule.SLOT and "drain" not in answer["text"]
        release()
        assert queued.result(BOUND_S)[0] == 2  # no resume: the drain held nothing queued
        f.operations.resume()


def _admission_fleet(clock):
    roles = {"llm": {"kind": "pooled", "handler": "tests.provider_handlers:call", "slots": 2, "io_bound": True,
                     "peak_cpus": 1, "queue_bound": 100}}
    cfg = config(unique_name("whyp"), roles)
    cfg["admission"] = catalog()
    return running(cfg, admission_clock=clock)


def test_a_unit_on_a_closed_provider_names_the_closure_and_its_end_and_one_refused_names_the_refusal():
    clock = ManualClock(wall=T_1447, mono=1000.0)
    with _admission_fleet(clock) as f:
        until = T_1447 + 3600
        f.admission_close("openrouter-eu", until, "maintenance window")
        closed = f.submit("llm", {}, route=GLM_OR, pinned=True)
        wait_until(lambda: f.why(closed.unit_id)["gate"] is not None, "the pinned unit to wait at its provider")
        answer = f.why(closed.unit_id)
        gate = answer["gate"]
        assert (answer["state"], gate["hold"], gate["until"], gate["route"]) == (rule.PROVIDER, "closed", until,
                                                                                 str(GLM_OR))
        assert f"its provider pool is closed until {utc(until)}" in answer["text"]
        assert (gate["refusals"], gate["refused"]) == (0, None)
        f.admission_reopen("openrouter-eu")
        assert closed.result(BOUND_S) == str(GLM_OR)

        # a 429 on a hard-pinned unit: it waits on its pool's backoff, with the refusal it met
        refused = f.submit("llm", {"openrouter-eu": [429, "slow down", 30]}, route=GLM_OR, pinned=True)
        wait_until(lambda: (f.why(refused.unit_id)["gate"] or {}).get("refusals") == 1, "the refused unit to wait")
        answer = f.why(refused.unit_id)
        gate = answer["gate"]
        assert (answer["state"], gate["hold"], gate["until"]) == (rule.PROVIDER, "backoff", pytest.approx(T_1447 + 30))
        assert gate["refused"] == "429 slow down"
        assert "backs off until" in answer["text"] and "refused 1 time(s), last: 429 slow down" in answer["text"]
        refused.cancel()
