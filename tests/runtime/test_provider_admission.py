"""The provider admission wired into a real fleet (fleet.runtime.provider_gate): handlers raise fleet.Refused.

Real workers, real shared memory; only the admission's clock is fake (a ManualClock passed
to the Fleet), so a 5 s backoff or a 60 s probe interval is one `advance`, not a sleep.
"""
from __future__ import annotations

import time

import pytest

import fleet
from admission.pool import ManualClock
from admission.route import Route
from fleet.shm.table import bulkheads as table_bulkheads
from fleet.shm.table import snapshot

from ..admission_catalog import (
    DEEPSEEK_OR,
    GLM_AZ,
    GLM_OR,
    MIDNIGHT_AFTER,
    ONE_REFUSAL,
    T_1447,
    catalog,
)
from ..fleets import config, running, unique_name

DAILY = [403, "Key limit exceeded (daily limit)", None]


def _roles():
    return {
        "llm": {"kind": "pooled", "handler": "tests.provider_handlers:call_async", "slots": 8, "io_bound": True,
                "peak_cpus": 1, "queue_bound": 1000},
        "plain": {"kind": "pooled", "handler": "tests.provider_handlers:call", "slots": 2, "peak_cpus": 1,
                  "queue_bound": 1000},
        # no declared peak: the roles' declared peaks add up against the quota on every tier
        "broken": {"kind": "pooled", "handler": "tests.provider_handlers:fail", "slots": 1},
        "slow": {"kind": "pooled", "handler": "tests.handlers:hang", "slots": 1},
        "dies": {"kind": "pooled", "handler": "tests.handlers:die", "slots": 1},
    }


def _fleet(name, clock, **admission):
    cfg = config(name, _roles())
    cfg["admission"] = catalog(**{**ONE_REFUSAL, **admission})
    return running(cfg, admission_clock=clock)


def _clock():
    return ManualClock(wall=T_1447, mono=1000.0)


def _bulkhead(f, route):
    rows = [b for b in f.status()["admission"]["bulkheads"] if b["pool"] == str(route)]
    return rows[0] if rows else None


def _waiting(f):
    return {w["unit"]: w for w in f.status()["admission"]["waiting_units"]}


def _eventually(predicate, timeout=30.0):
    """Until the supervisor's loop has acted (it looks at the admission at least every 0.1 s)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the fleet never got there"
        time.sleep(0.01)


def _refusal(future) -> fleet.Refused:
    with pytest.raises(fleet.UnitFailed) as info:
        future.result(60)
    assert info.value.reason == "Refused"
    assert isinstance(info.value.original, fleet.Refused)
    return info.value.original


def _one_outcome_each(f):
    counts = f.ledger()
    assert counts["submitted"] == counts["solved"] + counts["suppressed"] + counts["failed"]
    assert counts["inflight"] == 0


def test_a_429_backs_off_its_pool_moves_the_next_unit_and_a_pinned_one_waits_out_the_backoff():
    clock = _clock()
    with _fleet(unique_name("adm429"), clock) as f:
        refusal = _refusal(f.submit("llm", {"openrouter-eu": [429, "slow down", 5]}, route=GLM_OR))
        assert (refusal.status, refusal.retry_after, refusal.message) == (429, 5.0, "slow down")
        row = _bulkhead(f, GLM_OR)
        assert (row["state"], row["refusals"], row["failures"], row["running"]) == ("backoff", 1, 1, 0)
        assert f.status()["admission"]["closures"] == []  # a 429 closes nothing

        # the next unit runs on the same model at another provider: unit.route says so
        assert f.submit("llm", {}, route=GLM_OR).result(60) == str(GLM_AZ)
        assert _bulkhead(f, GLM_AZ)["moved_in"] == 1

        pinned = f.submit("llm", {}, route=GLM_OR, pinned=True)
        _eventually(lambda: pinned.unit_id in _waiting(f))
        wait = _waiting(f)[pinned.unit_id]
        assert "hard-pinned" in wait["why"] and wait["until"] == pytest.approx(T_1447 + 5)
        assert not pinned.done()
        clock.advance(5)
        assert pinned.result(60) == str(GLM_OR)
        row = _bulkhead(f, GLM_OR)
        assert (row["state"], row["refusals"], row["successes"]) == ("open", 0, 1)  # a clean round resets
        _one_outcome_each(f)


def test_a_refusal_reaches_the_supervisor_with_the_instant_the_handler_raised_it():
    roles = {"plain": {"kind": "pooled", "handler": "tests.provider_handlers:refuse_now", "slots": 1, "peak_cpus": 1},
             "llm": {"kind": "pooled", "handler": "tests.provider_handlers:refuse_now_async", "slots": 2,
                     "io_bound": True, "peak_cpus": 1}}
    with running(config(unique_name("admat"), roles)) as f:
        for role in roles:
            refusal = _refusal(f.submit(role, {}))
            # the worker stamps it when the handler raised (its pool backs off from then), not later
            assert float(refusal.message) <= refusal.at <= time.monotonic()
        # control: an instant the handler gives (the provider's reply) is kept as it is
        assert _refusal(f.submit("plain", {"at": 12.5})).at == 12.5


def test_a_daily_limit_closes_the_provider_until_utc_midnight_and_a_probe_reopens_it():
    clock = _clock()
    with _fleet(unique_name("admday"), clock, daily_limit_probe_every=60) as f:
        _refusal(f.submit("llm", {"openrouter-eu": DAILY}, route=GLM_OR))
        (closure,) = f.status()["admission"]["closures"]
        assert (closure["provider"], closure["credential"], closure["until"], closure["daily"]) == (
            "openrouter-eu", None, MIDNIGHT_AFTER, True)
        assert _bulkhead(f, GLM_OR)["closed_by_daily_limit"]

        # another model of the closed key moves off it, keeping its EU marks
        moved = f.submit("llm", {}, route=DEEPSEEK_OR, lane="eu-only").result(60)
        assert moved.endswith("@azure-eu")

        spent = f.submit("llm", {"openrouter-eu": DAILY}, route=GLM_OR, pinned=True)
        _eventually(lambda: spent.unit_id in _waiting(f))
        starving = f.status()["admission"]["starving"]
        assert starving[0]["kind"] == "provider-closed" and starving[0]["provider"] == "openrouter-eu"
        clock.advance(60)  # the daily limit's own probe interval: one probe, still refused
        _refusal(spent)
        assert _bulkhead(f, GLM_OR)["state"] == "closed" and _bulkhead(f, GLM_OR)["probes"] == 1

        topped_up = f.submit("llm", {}, route=GLM_OR, pinned=True)
        _eventually(lambda: topped_up.unit_id in _waiting(f))
        clock.advance(60)
        assert topped_up.result(60) == str(GLM_OR)  # a clean probe reopens the key before midnight
        assert f.status()["admission"]["closures"] == []
        assert _bulkhead(f, GLM_OR)["state"] == "open"
        _one_outcome_each(f)


def test_a_402_closes_only_the_known_key_for_closed_for():
    clock = _clock()
    key_a, key_b = Route(*GLM_OR[:2], "key-a"), Route(*GLM_OR[:2], "key-b")
    with _fleet(unique_name("adm402"), clock, closed_for=600) as f:
        _refusal(f.submit("plain", {str(key_a): [402, "no credit", None]}, route=key_a))
        (closure,) = f.status()["admission"]["closures"]
        assert (closure["credential"], closure["until"], closure["daily"]) == ("key-a", T_1447 + 600, False)
        assert f.submit("plain", {}, route=key_b).result(60) == str(key_b)  # control: the other key runs
        assert f.submit("plain", {}, route=key_a).result(60) == str(GLM_AZ)  # the spent key's unit moves
        _one_outcome_each(f)


def test_a_stall_a_timeout_and_a_lane_death_change_no_bulkhead_but_a_handler_error_counts():
    clock = _clock()
    with _fleet(unique_name("admstall"), clock) as f:
        with pytest.raises(fleet.UnitFailed) as info:
            f.submit("slow", 3600, route=GLM_OR, timeout=0.3).result(60)
        assert info.value.reason == "Timeout"
        with pytest.raises(fleet.UnitFailed) as info:
            f.submit("dies", None, route=GLM_OR).result(60)
        assert info.value.reason == "LaneDeath"
        row = _bulkhead(f, GLM_OR)
        assert (row["state"], row["failures"], row["refusals"], row["running"]) == ("open", 0, 0, 0)
        with pytest.raises(RuntimeError, match="the handler broke"):  # its own exception, as itself
            f.submit("broken", None, route=GLM_OR).result(60)
        row = _bulkhead(f, GLM_OR)
        assert (row["state"], row["failures"], row["refusals"]) == ("open", 1, 0)  # control: it is reported
        _one_outcome_each(f)


def test_a_reported_cost_reaches_the_bulkhead_and_the_table():
    clock = _clock()
    with _fleet(unique_name("admcost"), clock) as f:
        assert f.submit("llm", {"cost": 0.25}, route=GLM_AZ).result(60) == str(GLM_AZ)
        assert f.submit("plain", {"cost": 0.75}, route=GLM_AZ).result(60) == str(GLM_AZ)
        assert _bulkhead(f, GLM_AZ)["mean_cost"] == pytest.approx(0.5)

        def published():
            snap, _alive = snapshot.read(f.name)
            return {r["pool"]: r for r in table_bulkheads.read(snap)}.get(str(GLM_AZ))

        _eventually(lambda: published() is not None and published()["successes"] == 2)
        assert published()["mean_cost"] == pytest.approx(0.5)


def test_bad_admission_arguments_are_refused_typed_and_queue_nothing():
    clock = _clock()
    with _fleet(unique_name("admbad"), clock) as f:
        for kwargs, match in [
            ({"route": ("glm", "x")}, "fleet.Route"),
            ({"route": Route("nope", "openrouter-eu")}, "not in the declared catalog"),
            ({"route": GLM_OR, "severity": "urgent"}, "unknown severity"),
            ({"route": Route("glm-5.3-review", "openrouter-us"), "lane": "eu-only"}, "required marks"),
            ({"severity": "B"}, "give route="),
            ({"route": GLM_OR, "parent": "one"}, "parent"),
        ]:
            with pytest.raises(fleet.BadUnit, match=match):
                f.submit("llm", {}, **kwargs)
        assert f.ledger()["submitted"] == 0
        assert f.status()["admission"]["bulkheads"] == []


def test_waiting_units_end_once_when_cancelled_or_when_the_fleet_closes():
    clock = _clock()
    with _fleet(unique_name("admclose"), clock) as f:
        _refusal(f.submit("llm", {"openrouter-eu": DAILY}, route=GLM_OR))
        cancelled = f.submit("llm", {}, route=GLM_OR, pinned=True)
        left = f.submit("llm", {}, route=GLM_OR, pinned=True)
        _eventually(lambda: {cancelled.unit_id, left.unit_id} <= set(_waiting(f)))
        assert cancelled.cancel()
        _eventually(lambda: f.ledger()["failed_by_reason"].get("Cancelled") == 1)
        assert _bulkhead(f, GLM_OR)["waiting"] == 1
        f.shutdown(wait=False)  # shutdown waits for queued units, not for a closed key's midnight
        with pytest.raises(fleet.UnitFailed) as info:
            left.result(60)
        assert info.value.reason == "Shutdown" and "closed (daily-limit" in info.value.outcome.detail
        counts = f.ledger()
        assert counts["submitted"] == 3 and counts["failed"] == 3


def test_a_restarted_fleet_is_born_with_the_closures_it_knew(tmp_path):
    path = tmp_path / "state" / "closures.json"
    cfg = config(unique_name("admkeep"), _roles())
    cfg["admission"] = catalog(closure_file=str(path), **ONE_REFUSAL)
    with running(cfg, admission_clock=_clock()) as f:
        _refusal(f.submit("llm", {"openrouter-eu": DAILY}, route=GLM_OR))
        assert f.status()["admission"]["closure_file"] == str(path)
    assert path.exists()
    with running(cfg, admission_clock=_clock()) as f:
        (closure,) = f.status()["admission"]["closures"]
        assert (closure["provider"], closure["until"], closure["daily"]) == ("openrouter-eu", MIDNIGHT_AFTER, True)
        # the spent key is not spent again: its unit moves at once, with no refusal first
        assert f.submit("llm", {"openrouter-eu": DAILY}, route=GLM_OR).result(60) == str(GLM_AZ)
        assert f.ledger()["failed"] == 0
    cfg["admission"] = catalog(closure_file=str(tmp_path / "elsewhere.json"))
    with running(cfg, admission_clock=_clock()) as f:  # control: a fleet without that file knows nothing
        assert f.status()["admission"]["closures"] == []


def test_reload_swaps_the_catalog_and_a_bad_one_keeps_the_last_good_one():
    clock = _clock()
    cfg = config(unique_name("admreload"), _roles())
    cfg["admission"] = catalog(**ONE_REFUSAL)
    with running(cfg, admission_clock=clock) as f:
        new = dict(cfg, admission=catalog(alternatives={"glm-5.3-review": ["gpt-6-sol@azure-eu"]}, **ONE_REFUSAL))
        assert "admission" in f.reload(new, env={})["applied"]
        _refusal(f.submit("llm", {"openrouter-eu": [429, "", 30]}, route=GLM_OR))
        # the explicit entry replaced the tier defaults: no longer the same model elsewhere
        assert f.submit("llm", {}, route=GLM_OR).result(60) == "gpt-6-sol@azure-eu"

        bad = dict(cfg, admission=catalog(alternatives={"glm-5.3-review": ["no-such-model"]}, **ONE_REFUSAL))
        with pytest.raises(fleet.ConfigError) as info:
            f.reload(bad, env={})
        assert info.value.path == "admission.alternatives.glm-5.3-review[0]"
        assert "no-such-model" in f.status()["admission"]["policy_error"]
        assert f.submit("llm", {}, route=GLM_OR).result(60) == "gpt-6-sol@azure-eu"  # the last good one
        assert "admission" not in f.reload(new, env={})["applied"]  # the same catalog: nothing to apply
        assert f.status()["admission"]["policy_error"] is None
