"""A refused round waits and runs (reference 000 §8), through a real fleet: its incident day.

2026-10-04 14:47Z: the OpenRouter key meets its daily limit. A review round refused there runs
on the same model at another provider; an EU-bound embeddings round whose only compliant route
is the spent key waits, with the refusal's reason and end, and runs when the topped-up key
passes its probe before midnight. Real workers, real shared memory; only the admission's clock
is fake (a ManualClock), so a 30-minute probe interval is one `advance`.
"""
from __future__ import annotations

import os
import tempfile
import time

import pytest

import fleet
from admission.pool import ManualClock
from fleet.runtime.provider_gate import BadBudget, BadPool
from admission.route import Route
from tests.daemons import to_toml

from ..admission_catalog import GLM_AZ, GLM_OR, GPT_AZ, MIDNIGHT_AFTER, T_1447, catalog
from ..fleets import config, running, unique_name
from ..runtime.test_provider_admission import DAILY, _bulkhead, _eventually, _one_outcome_each, _roles, _waiting

EMBED_EU = Route("embed-3", "openrouter-eu")
PROBE_EVERY = 1800


def _day_catalog(**overrides):
    data = catalog(daily_limit_probe_every=PROBE_EVERY, **overrides)
    data["providers"]["openrouter-eu"]["models"]["embed-3"] = {"residency": "eu", "retention": "zdr"}
    data["providers"]["openrouter-us"]["models"]["embed-3-us"] = {"residency": "us"}
    data["tiers"]["embed"] = ["embed-3"]
    data["lanes"]["embeddings"] = {"residency": "eu"}
    data["lanes"]["tight"] = {"max_refusals": 2, "pinned": True}
    data["lanes"]["patient"] = {"refusal_deadline": 60, "pinned": True}
    return data


def _fleet(name, clock, **overrides):
    cfg = config(name, _roles())
    cfg["admission"] = _day_catalog(**overrides)
    return running(cfg, admission_clock=clock)


def test_the_incident_day_a_refused_round_moves_or_waits_and_runs_when_the_key_is_topped_up(tmp_path):
    clock = ManualClock(wall=T_1447, mono=1000.0)
    spent, go = tmp_path / "spent", tmp_path / "go"
    spent.touch()
    # the key answers 403 while `spent` exists; both rounds are on the wire before either is answered
    key = {"openrouter-eu": DAILY, "while": str(spent), "go": str(go)}
    with _fleet(unique_name("refday"), clock) as f:
        review = f.submit("llm", key, route=GLM_OR, lane="review")
        embed = f.submit("llm", key, route=EMBED_EU, lane="embeddings")
        _eventually(lambda: all((_bulkhead(f, r) or {}).get("running") == 1 for r in (GLM_OR, EMBED_EU)))
        go.touch()
        # the review round meets the 403 and runs on the same model at another provider: not lost
        assert review.result(60) == str(GLM_AZ)
        # the EU-bound round meets it too: no compliant route, so it waits for the key
        _eventually(lambda: embed.unit_id in _waiting(f))
        wait = _waiting(f)[embed.unit_id]
        assert wait["refusals"] == 1 and wait["refused"] == "403 Key limit exceeded (daily limit)"
        assert wait["until"] == MIDNIGHT_AFTER and "daily-limit" in wait["why"]
        assert not embed.done() and f.ledger()["failed"] == 0
        assert _bulkhead(f, EMBED_EU)["refusals"] == _bulkhead(f, GLM_OR)["refusals"] == 1  # each fed its pool
        (closure,) = f.status()["admission"]["closures"]
        assert (closure["provider"], closure["until"]) == ("openrouter-eu", MIDNIGHT_AFTER)

        # the key is topped up before midnight: the waiting round is the probe, and runs
        spent.unlink()
        clock.advance(PROBE_EVERY)
        assert embed.result(60) == str(EMBED_EU)
        assert f.status()["admission"]["closures"] == []
        counts = f.ledger()
        assert (counts["submitted"], counts["solved"], counts["failed"]) == (2, 2, 0)
        _one_outcome_each(f)


def test_a_refused_round_fails_refused_only_past_its_lanes_limit():
    clock = ManualClock(wall=T_1447, mono=1000.0)
    with _fleet(unique_name("reflimit"), clock) as f:
        script = {"openrouter-eu": [429, "slow down", 5]}
        tight = f.submit("llm", script, route=GLM_OR, lane="tight")  # pinned, two refusals at most
        _eventually(lambda: tight.unit_id in _waiting(f))
        assert _waiting(f)[tight.unit_id]["refusals"] == 1 and "hard-pinned" in _waiting(f)[tight.unit_id]["why"]
        clock.advance(5)  # the backoff ends: it runs again, and meets its second refusal
        with pytest.raises(fleet.UnitFailed) as info:
            tight.result(60)
        assert info.value.reason == "Refused" and info.value.original.status == 429
        assert _bulkhead(f, GLM_OR)["failures"] == 2  # both refusals fed the bulkhead
        counts = f.ledger()
        assert (counts["submitted"], counts["failed"], counts["failed_by_reason"]["Refused"]) == (1, 1, 1)
        _one_outcome_each(f)


def test_a_refused_round_waiting_past_its_lanes_refusal_deadline_fails_refused():
    clock = ManualClock(wall=T_1447, mono=1000.0)
    with _fleet(unique_name("refdeadline"), clock) as f:
        # a backoff far longer than the lane's 60 s deadline; pinned, so nothing else admits it
        script = {"openrouter-eu": [429, "slow down", 300]}
        patient = f.submit("llm", script, route=GLM_OR, lane="patient")
        _eventually(lambda: patient.unit_id in _waiting(f))
        clock.advance(59)  # control: inside its deadline it still waits, and has its one refusal
        time.sleep(0.3)  # the loop looks at least every 0.1 s
        assert not patient.done() and _waiting(f)[patient.unit_id]["refusals"] == 1
        clock.advance(2)
        with pytest.raises(fleet.UnitFailed) as info:
            patient.result(60)
        assert info.value.reason == "Refused" and "deadline 60 s" in info.value.outcome.detail
        assert info.value.original.status == 429  # the last refusal it met
        assert patient.unit_id not in _waiting(f) and _bulkhead(f, GLM_OR)["failures"] == 1  # run once, not again
        counts = f.ledger()
        assert (counts["submitted"], counts["failed"], counts["failed_by_reason"]["Refused"]) == (1, 1, 1)
        _one_outcome_each(f)


def test_a_refused_round_run_again_has_its_whole_timeout_again(tmp_path):
    # README: `timeout=` limits each run. The first run's deadline passes while the second
    # runs; the second ends inside its own, so it is answered, not killed as Timeout.
    clock = ManualClock(wall=T_1447, mono=1000.0)
    spent = tmp_path / "spent"
    spent.touch()
    with _fleet(unique_name("reftimeout"), clock) as f:
        script = {"openrouter-eu": [429, "slow down", 5], "while": str(spent), "sleep": 1.2}
        again = f.submit("llm", script, route=GLM_OR, lane="tight", timeout=2.0)
        _eventually(lambda: again.unit_id in _waiting(f))  # its first run: 1.2 s, then the 429
        spent.unlink()
        clock.advance(5)  # the backoff ends: it runs again for 1.2 s
        assert again.result(60) == str(GLM_OR)  # 2.4 s after its first start: past the first deadline
        assert f.ledger()["failed"] == 0 and _bulkhead(f, GLM_OR)["successes"] == 1
        _one_outcome_each(f)


def test_parent_must_be_a_running_unit_and_delegation_passes_a_backoff_only(tmp_path):
    clock = ManualClock(wall=T_1447, mono=1000.0)
    go = tmp_path / "go"
    with _fleet(unique_name("refparent"), clock, max_refusals=1) as f:
        for bad in (424242, "424242", None.__class__):  # refused at submit: no future to fail later
            with pytest.raises(fleet.BadUnit, match="is no unit running"):
                f.submit("llm", {}, route=GLM_OR, parent=bad)
        assert f.ledger()["submitted"] == 0  # nothing counted
        parent = f.submit("plain", {"go": str(go)}, route=GPT_AZ)  # runs until `go` exists
        _eventually(lambda: _bulkhead(f, GPT_AZ) is not None and _bulkhead(f, GPT_AZ)["running"] == 1)
        with pytest.raises(fleet.UnitFailed):
            f.submit("llm", {"openrouter-eu": [429, "", 30]}, route=GLM_OR).result(60)
        child = f.submit("llm", {}, route=GLM_OR, parent=parent.unit_id)
        assert child.result(60) == str(GLM_OR)  # through the backoff on its own route, at once
        assert _bulkhead(f, GLM_OR)["delegated_total"] == 1
        held = f.submit("llm", {}, route=GLM_OR, pinned=True)  # control: no parent, pinned, it waits
        pinned_child = f.submit("llm", {}, route=GLM_OR, parent=parent.unit_id, pinned=True)  # a pin is never passed
        _eventually(lambda: {held.unit_id, pinned_child.unit_id} <= set(_waiting(f)))
        go.touch()
        assert parent.result(60) == str(GPT_AZ)
        with pytest.raises(fleet.BadUnit, match=f"parent {parent.unit_id} is no unit running"):
            f.submit("llm", {}, route=GLM_OR, parent=parent.unit_id)  # it ended: it delegates nothing
        clock.advance(30)
        assert held.result(60) == str(GLM_OR) == pinned_child.result(60)
        assert _bulkhead(f, GLM_OR)["delegated_total"] == 2  # it ran as a delegated round, after the backoff
        _one_outcome_each(f)


def test_age_at_submit_is_a_typed_number_of_seconds():
    clock = ManualClock(wall=T_1447, mono=1000.0)
    with _fleet(unique_name("refage"), clock) as f:
        for bad in (-1, float("inf"), "old", True):
            with pytest.raises(fleet.BadUnit, match="age"):
                f.submit("llm", {}, route=GLM_OR, age=bad)
        with pytest.raises(fleet.BadUnit, match="give route="):
            f.submit("llm", {}, age=5)
        assert f.submit("llm", {}, route=GLM_OR, age=8 * 86400).result(60) == str(GLM_OR)


def test_the_budget_reading_is_fed_shown_and_closes_the_provider_at_its_limit():
    clock = ManualClock(wall=T_1447, mono=1000.0)
    with _fleet(unique_name("refbudget"), clock) as f:
        assert f.submit("llm", {}, route=GLM_OR).result(60) == str(GLM_OR)
        for args, match in [(("nowhere", 1.0, 10.0), "unknown provider"), (("openrouter-eu", -1.0, 10.0), "spent"),
                            (("openrouter-eu", 1.0, float("nan")), "limit")]:
            with pytest.raises(BadBudget, match=match):
                f.report_budget(*args)
        assert f.status()["admission"]["closures"] == []
        f.report_budget("openrouter-eu", 4.0, 10.0)
        row = _bulkhead(f, GLM_OR)
        assert (row["budget_spent"], row["budget_limit"], row["state"]) == (4.0, 10.0, "open")
        f.report_budget("openrouter-eu", 10.0, 10.0)  # reached: closed until midnight
        (closure,) = f.status()["admission"]["closures"]
        assert (closure["cause"], closure["until"]) == ("budget", MIDNIGHT_AFTER)
        assert f.submit("llm", {}, route=GLM_OR).result(60) == str(GLM_AZ)


def test_an_operator_closure_without_a_finite_end_is_refused():
    clock = ManualClock(wall=T_1447, mono=1000.0)
    with _fleet(unique_name("refinf"), clock) as f:
        for until in (float("inf"), float("nan")):
            with pytest.raises(BadPool, match="finite"):
                f.admission_close("openrouter-eu", until)
        assert f.status()["admission"]["closures"] == []


def test_the_catalog_is_read_again_when_its_file_changes_and_a_bad_one_keeps_the_last_good():
    clock = ManualClock(wall=T_1447, mono=1000.0)
    folder = tempfile.mkdtemp(prefix="refcat-")
    path = os.path.join(folder, "fleet.toml")
    m1_p1, m1_p2, m2_p2 = Route("m1", "p1"), Route("m1", "p2"), Route("m2", "p2")
    name = unique_name("refcat")
    head = to_toml(config(name, _roles())) + (
        '[admission]\nmax_refusals = 1\n[admission.providers.p1]\nmodels = ["m1"]\n'
        '[admission.providers.p2]\nmodels = ["m1", "m2"]\n')

    def write(text):
        with open(path + ".tmp", "w") as fh:
            fh.write(text)
        os.replace(path + ".tmp", path)

    write(head + '[admission.alternatives]\nm1 = ["m1@p2"]\n')
    f = fleet.Fleet.from_config(path, env={}, admission_clock=clock)
    try:
        with pytest.raises(fleet.UnitFailed):
            f.submit("llm", {"p1": [429, "", 300]}, route=m1_p1).result(60)
        assert f.submit("llm", {}, route=m1_p1).result(60) == str(m1_p2)
        write(head + '[admission.alternatives]\nm1 = ["m2@p2"]\n')  # no reload asked for
        _eventually(lambda: f.submit("llm", {}, route=m1_p1).result(60) == str(m2_p2))
        write(head + '[admission.alternatives]\nm1 = ["m9@p2"]\n')  # a model no provider serves
        _eventually(lambda: (f.status()["admission"]["policy_error"] or "").startswith(path))
        assert f.submit("llm", {}, route=m1_p1).result(60) == str(m2_p2)  # the last good catalog runs
    finally:
        f.shutdown(wait=True, cancel_futures=True)
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)
    assert not [p for p in os.listdir("/dev/shm") if p.startswith(f"fleet.{name}")]


def test_a_refused_round_taken_back_at_once_runs_before_the_units_queued_after_it(tmp_path):
    """A round its provider refused, moved at once to an alternative, was granted before the
    units queued behind it: it goes back to the head of its role's queue, not behind them
    (it has waited longest; reference 000's aging). One slot, so the runs are one at a time."""
    clock = ManualClock(wall=T_1447, mono=1000.0)
    go = tmp_path / "go"
    one = {"kind": "pooled", "handler": "tests.provider_handlers:call_async", "slots": 1, "io_bound": True,
           "peak_cpus": 1, "queue_bound": 100}
    cfg = config(unique_name("reffront"), {"one": one})
    cfg["admission"] = _day_catalog()
    with running(cfg, admission_clock=clock) as f:
        ended = []
        refused = f.submit("one", {"openrouter-eu": DAILY, "go": str(go)}, route=GLM_OR, lane="review")
        refused.add_done_callback(lambda _: ended.append("refused"))
        _eventually(lambda: (_bulkhead(f, GLM_OR) or {}).get("running") == 1)
        queued = [f.submit("one", {"go": str(go)}) for _ in range(3)]
        for i, fut in enumerate(queued):
            fut.add_done_callback(lambda _, i=i: ended.append(i))
        go.touch()
        assert refused.result(60) == str(GLM_AZ)  # moved to the same model at another provider
        assert [fut.result(60) for fut in queued] == [None, None, None]
        # unit 0 was already on the seat's ring behind it (sent ahead); 1 and 2 were queued
        assert ended == [0, "refused", 1, 2]
        _one_outcome_each(f)
