"""Issue 11's Done-when: a scripted provider day through a real fleet (reference 000 §6–§10).

09:00 a 429 storm on the review model's OpenRouter pool; 14:47 UTC the OpenRouter key hits its
daily limit, with the same review model declared at a second provider (Azure); an EU-bound
embeddings lane whose only compliant route is that key; a hard-pinned coordinator; midnight.
Real workers run every unit (their handlers raise fleet.Refused as the provider would); the
admission's clock is a ManualClock passed to the Fleet, so the day takes seconds.
`Fleet.status()` shows the bulkheads, closures, probes, moves and the starving list.
"""
from __future__ import annotations

import calendar
import random
import time

import pytest

import fleet
from admission.pool import ManualClock
from admission.route import Route

from ..admission_catalog import GLM_AZ, GLM_OR, KIMI_OR, MIDNIGHT_AFTER, ONE_REFUSAL, catalog
from ..fleets import config, running

EMBED_EU = Route("embed-3", "openrouter-eu")
EMBED_US = Route("embed-3-us", "openrouter-us")
DAILY = [403, "Key limit exceeded (daily limit)", None]


def at(hh, mm):
    return calendar.timegm((2026, 10, 4, hh, mm, 0))


def day_catalog():
    # a spent day is probed every 30 min (a setting); a refused round fails at once here: this day
    # reads what each refusal does to the pools (test_provider_refused: the rounds that wait and run)
    data = catalog(daily_limit_probe_every=1800, **ONE_REFUSAL)
    data["providers"]["openrouter-eu"]["models"]["embed-3"] = {"residency": "eu", "retention": "zdr"}
    data["providers"]["openrouter-us"]["models"]["embed-3-us"] = {"residency": "us"}
    data["tiers"]["embed"] = ["embed-3"]
    data["lanes"]["embeddings"] = {"residency": "eu"}
    return data


def _eventually(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the fleet never got there"
        time.sleep(0.01)


def _failed_refused(future):
    with pytest.raises(fleet.UnitFailed) as info:
        future.result(60)
    assert info.value.reason == "Refused"
    return info.value.original


def test_a_scripted_provider_day_through_a_real_fleet(tmp_path):
    clock = ManualClock(wall=at(9, 0), mono=0.0)
    storm, spent, go = tmp_path / "storm", tmp_path / "spent", tmp_path / "go"
    cfg = config("admdayfull", {"llm": {"kind": "pooled", "handler": "tests.provider_handlers:call_async",
                                        "slots": 32, "io_bound": True, "peak_cpus": 1, "queue_bound": 1000}})
    cfg["admission"] = day_catalog()
    with running(cfg, admission_clock=clock, admission_rng=random.Random(3)) as f:
        def adm():
            return f.status()["admission"]

        def bulkhead(route):
            return {b["pool"]: b for b in adm()["bulkheads"]}.get(str(route))

        # --- 09:00 a 429 storm on GLM at OpenRouter: no cap, all twenty start, all refused ----------
        storm.touch()
        script = {str(GLM_OR): [429, "rate limited", 2], "while": str(storm), "go": str(go)}
        burst = [f.submit("llm", script, route=GLM_OR, lane="review") for _ in range(20)]
        assert bulkhead(GLM_OR)["running"] == 20  # admitted at once: there is no cap
        go.touch()
        for fut in burst:
            assert _failed_refused(fut).retry_after == 2.0
        row = bulkhead(GLM_OR)
        assert (row["state"], row["refusals"], row["failures"]) == ("backoff", 20, 20)
        assert adm()["closures"] == []  # a 429 closes nothing
        # while it backs off, reviews run on the same model at the other provider
        assert [f.submit("llm", script, route=GLM_OR, lane="review").result(60) for _ in range(4)] == [str(GLM_AZ)] * 4
        storm.unlink()
        clock.advance(300)  # the storm is over, and the backoff (capped at 300 s) too
        assert f.submit("llm", {}, route=GLM_OR, lane="review").result(60) == str(GLM_OR)
        row = bulkhead(GLM_OR)
        assert (row["state"], row["refusals"], row["successes"]) == ("open", 0, 1)  # a clean round resets

        # --- 14:47 the OpenRouter key hits its daily limit ----------------------------------------
        clock.advance(at(14, 47) - clock.wall())
        spent.touch()
        key = {"openrouter-eu": DAILY, "while": str(spent), "cost": 0.01}
        _failed_refused(f.submit("llm", key, route=GLM_OR, lane="review"))
        assert [(c["provider"], c["credential"], c["cause"], c["daily"], c["until"]) for c in adm()["closures"]] == [
            ("openrouter-eu", None, "daily-limit", True, MIDNIGHT_AFTER)]
        assert bulkhead(GLM_OR)["closed_by_daily_limit"]
        # reviews move to the declared alternative provider and keep running
        assert [f.submit("llm", key, route=GLM_OR, lane="review").result(60) for _ in range(3)] == [str(GLM_AZ)] * 3
        assert bulkhead(GLM_AZ)["moved_in"] == 7

        # the embeddings lane is EU-bound: its only compliant route is the spent key, so it waits
        embeds = [f.submit("llm", key, route=EMBED_EU, lane="embeddings") for _ in range(5)]
        waits = adm()["waiting_units"]
        assert len(waits) == 5 and all("daily-limit" in w["why"] and w["until"] == MIDNIGHT_AFTER for w in waits)
        assert bulkhead(EMBED_US) is None  # never a weaker route
        row = bulkhead(EMBED_EU)
        assert (row["state"], row["waiting"], row["closed_by_daily_limit"]) == ("closed", 5, True)  # born closed
        assert adm()["starving"][0] == {"kind": "provider-closed", "provider": "openrouter-eu", "credential": None,
                                        "cause": "daily-limit", "daily": True, "until": MIDNIGHT_AFTER, "waiting": 5}

        # a spent day is probed at its own interval: one unit goes through, meets the 403, ends Refused
        clock.advance(1800)
        _eventually(lambda: f.ledger()["failed"] == 22)
        assert _failed_refused(embeds[0]).status == 403  # the oldest of the lane went first
        row = bulkhead(EMBED_EU)
        assert (row["state"], row["probes"], row["waiting"]) == ("closed", 1, 4)

        # a hard-pinned coordinator unit on the spent key waits, and starves after 15 min
        pinned = f.submit("llm", key, route=KIMI_OR, lane="coordinator")
        _eventually(lambda: any(w["unit"] == pinned.unit_id for w in adm()["waiting_units"]))
        assert next(w for w in adm()["waiting_units"] if w["unit"] == pinned.unit_id)["why"].startswith(
            "hard-pinned to kimi-k2.7-code@openrouter-eu")
        clock.advance(15 * 60 + 1)
        _eventually(lambda: [s["kind"] for s in adm()["starving"]] == ["provider-closed", "pinned"])
        assert adm()["starving"][0]["waiting"] == 5  # four embeddings and the coordinator

        # lanes x bulkheads: the census rows the reference names
        lanes = {(r["lane"], r["pool"]): r for r in adm()["lanes"]}
        assert lanes[("review", str(GLM_AZ))]["moved_in"] == 7
        assert lanes[("review", str(GLM_AZ))]["spent_today"] == pytest.approx(0.03)  # the reported costs
        assert lanes[("review", str(GLM_OR))]["refused"] == 21
        assert lanes[("embeddings", str(EMBED_EU))]["waiting"] == 4
        assert lanes[("embeddings", str(EMBED_EU))]["oldest_waiting_s"] > 15 * 60

        # --- midnight: the key is fresh; waiting work starts without any operator ------------------
        spent.unlink()
        clock.advance(MIDNIGHT_AFTER - clock.wall())
        assert [fut.result(60) for fut in embeds[1:]] == [str(EMBED_EU)] * 4
        assert pinned.result(60) == str(KIMI_OR)
        assert adm()["starving"] == [] and adm()["closures"] == []
        counts = f.ledger()
        assert (counts["submitted"], counts["solved"], counts["failed"], counts["inflight"]) == (35, 13, 22, 0)
