"""The live admission pool: a scripted provider day on a fake clock, the census, closures across restarts."""
import calendar
import json
import os
import random

import pytest

from admission import scheduler as S
from admission import state as T
from admission.policy import Policy
from admission.pool import AdmissionPool, ClosureFileError, FileClosureStore, ManualClock, signal_for
from fleet.rules.outcomes import Refused
from admission.route import Route

from ..admission_catalog import (
    DEEPSEEK_OR, GLM_AZ, GLM_OR, KIMI_OR, MIDNIGHT_AFTER, T_1447, catalog, make_pool, policy,
)

EMBED_EU = Route("embed-3", "openrouter-eu")
EMBED_US = Route("embed-3-us", "openrouter-us")


def day_catalog():
    data = catalog()
    data["providers"]["openrouter-eu"]["models"]["embed-3"] = {"residency": "eu", "retention": "zdr"}
    data["providers"]["openrouter-us"]["models"]["embed-3-us"] = {"residency": "us"}
    data["tiers"]["embed"] = ["embed-3"]
    data["lanes"]["embeddings"] = {"residency": "eu"}
    return data


class Provider:
    """A scripted provider: per route, what the next call answers (by time)."""

    def __init__(self, clock):
        self.clock = clock
        self.storm_until = 0.0  # mono: GLM_OR answers 429 until then
        self.spent_at = None  # wall: openrouter-eu's key is spent from then until midnight
        self.calls = []

    def call(self, route: Route):
        self.calls.append(route)
        if route == GLM_OR and self.clock.mono() < self.storm_until:
            return Refused(429, "rate limited", retry_after=2)
        if route.provider == "openrouter-eu" and self.spent_at is not None and self.clock.wall() < MIDNIGHT_AFTER:
            return Refused(403, "Key limit exceeded (daily limit)")
        return None


def at(hh, mm):
    return calendar.timegm((2026, 10, 4, hh, mm, 0))


def test_a_scripted_provider_day():
    clock = ManualClock(wall=at(9, 0), mono=0.0)
    pool = AdmissionPool(Policy.from_dict(day_catalog()), clock=clock, rng=random.Random(3))
    provider = Provider(clock)
    ids = iter(range(1, 10**6))

    def start(route, lane, **kw):
        unit = next(ids)
        return unit, pool.admit(unit, route, lane=lane, **kw)

    def finish(unit, decision):
        pool.report(unit, signal_for(provider.call(decision.route), cost=0.01))

    # --- 09:00 a 429 storm on the review model's OpenRouter pool ---------------------------------
    provider.storm_until = clock.mono() + 30
    burst = [start(GLM_OR, "review") for _ in range(20)]
    assert all(d.action == S.ADMIT for _u, d in burst)  # no cap: all twenty start at once
    for unit, d in burst[:5]:
        finish(unit, d)  # the first answers refuse, with Retry-After 2 s
    row = _row(pool, GLM_OR)
    assert row["state"] == "backoff" and row["carrying_capacity"] == 16 and row["refusals"] == 5
    assert not _head(pool, DEEPSEEK_OR).held(pool.now()) and not pool.census()["closures"]  # one pool only
    moved = [start(GLM_OR, "review") for _ in range(4)]
    assert {d.route for _u, d in moved} == {GLM_AZ}  # the same model on another provider
    for unit, d in burst[5:] + moved:
        finish(unit, d)
    clock.advance(300)  # the storm is over, and the backoff (20 refusals in a row: capped at 300 s) too
    unit, d = start(GLM_OR, "review")
    assert d.action == S.ADMIT
    finish(unit, d)
    assert _row(pool, GLM_OR)["refusals"] == 0 and _row(pool, GLM_OR)["state"] == "open"
    assert _row(pool, GLM_AZ)["moved_in"] == 4

    # --- 14:47 the OpenRouter key hits its daily limit --------------------------------------------
    clock.advance(at(14, 47) - clock.wall())
    provider.spent_at = clock.wall()
    unit, d = start(GLM_OR, "review")
    finish(unit, d)
    closures = pool.census()["closures"]
    assert [(c["provider"], c["cause"], c["daily"], c["until"]) for c in closures] == [
        ("openrouter-eu", T.DAILY_LIMIT, True, MIDNIGHT_AFTER)]
    assert _row(pool, GLM_OR)["closed_by_daily_limit"] and _head(pool, DEEPSEEK_OR).closed(pool.now())
    # reviews move to the declared alternative provider and keep running
    review = [start(GLM_OR, "review") for _ in range(3)]
    assert {d.route for _u, d in review} == {GLM_AZ}
    for unit, d in review:
        finish(unit, d)
    # the embeddings lane is EU-bound: its only compliant route is the spent key, so it waits
    waits = [start(EMBED_EU, "embeddings") for _ in range(5)]
    assert all(d.action == S.WAIT and "daily-limit" in d.reason for _u, d in waits)
    assert all(d.until == MIDNIGHT_AFTER for _u, d in waits)
    assert EMBED_US not in pool.state.bulkheads  # never a weaker route
    embed = _row(pool, EMBED_EU)
    assert embed["state"] == "closed" and embed["waiting"] == 5  # born closed
    starving = pool.starving()
    assert starving[0] == {"kind": "provider-closed", "provider": "openrouter-eu", "credential": None,
                           "cause": T.DAILY_LIMIT, "daily": True, "until": MIDNIGHT_AFTER, "waiting": 5}
    assert pool.allowance("embeddings") == 0 and pool.allowance("review") is None

    # probes: one every 10 s while nothing runs; each meets the 403 (its unit ends Refused) and the
    # key stays closed
    probes = 0
    for _ in range(6):
        clock.advance(5)
        for unit, d in pool.wake():
            assert d.probe and d.route == EMBED_EU
            probes += 1
            finish(unit, d)
    assert probes == 3 and _row(pool, EMBED_EU)["probes"] == 3 and _row(pool, EMBED_EU)["waiting"] == 2

    # a hard-pinned coordinator unit on the spent key waits, and starves after 15 min
    pinned, d = start(KIMI_OR, "coordinator")
    assert d.action == S.WAIT and d.reason.startswith("hard-pinned to kimi-k2.7-code@openrouter-eu")
    clock.advance(15 * 60 + 1)
    kinds = [s["kind"] for s in pool.starving()]
    assert kinds == ["provider-closed", "pinned"]

    # lanes x bulkheads: the census rows the reference names
    lanes = {(r["lane"], r["pool"]): r for r in pool.census()["lanes"]}
    assert lanes[("review", str(GLM_AZ))]["moved_in"] == 7
    assert lanes[("embeddings", str(EMBED_EU))]["waiting"] >= 1
    assert lanes[("embeddings", str(EMBED_EU))]["oldest_waiting_s"] > 15 * 60
    assert lanes[("review", str(GLM_AZ))]["spent_today"] == pytest.approx(0.01 * 7)  # its clean rounds' cost
    assert lanes[("review", str(GLM_OR))]["refused"] == 21

    # --- midnight: the key is fresh again; waiting work starts without any operator --------------
    clock.advance(MIDNIGHT_AFTER - clock.wall())
    started = dict(pool.wake())
    assert pinned in started and len(started) == 1 + _row(pool, EMBED_EU)["running"]
    assert pool.starving() == [] and pool.census()["closures"] == []
    lanes = {(r["lane"], r["pool"]): r for r in pool.census()["lanes"]}
    assert lanes[("review", str(GLM_AZ))]["spent_today"] == 0.0  # a new UTC day


def _head(pool, route):
    return T.bulkhead_of(pool.state, route, pool.now())


def _row(pool, route):
    rows = {r["pool"]: r for r in pool.census()["bulkheads"]}
    return rows[str(route)]


# --- closures across a restart ------------------------------------------------------------------------
def test_a_closure_survives_a_restart(tmp_path):
    path = tmp_path / "closures.json"
    pool, clock = make_pool(store=FileClosureStore(path))
    unit = 1
    pool.admit(unit, Route("glm-5.3-review", "openrouter-eu", "k1"))
    pool.report(unit, signal_for(Refused(403, "daily limit")))
    assert path.exists() and oct(path.stat().st_mode & 0o777) == "0o600"
    # a new process: same clock time, fresh pool, same file
    again = AdmissionPool(policy(), clock=clock, store=FileClosureStore(path))
    d = again.admit(2, Route("deepseek-v4-flash", "openrouter-eu", "k1"), pinned=True)
    assert d.action == S.WAIT and d.until == MIDNIGHT_AFTER
    # control: another key of the provider, and a pool with no store, are open
    assert again.admit(3, Route("deepseek-v4-flash", "openrouter-eu", "k2")).action == S.ADMIT
    fresh = AdmissionPool(policy(), clock=clock)
    assert fresh.admit(2, Route("deepseek-v4-flash", "openrouter-eu", "k1"), pinned=True).action == S.ADMIT


def test_a_reopened_or_expired_closure_is_not_loaded_again(tmp_path):
    path = tmp_path / "closures.json"
    pool, clock = make_pool(store=FileClosureStore(path))
    pool.close("openrouter-eu", until=clock.wall() + 600, message="taken out by hand")
    assert [c.provider for c in FileClosureStore(path).load()] == ["openrouter-eu"]
    assert pool.reopen("openrouter-eu") is True
    assert FileClosureStore(path).load() == []
    pool.close("azure-eu", until=clock.wall() + 60)
    clock.advance(61)
    again = AdmissionPool(policy(), clock=clock, store=FileClosureStore(path))
    assert again.state.closures == {}


def test_a_corrupt_closure_file_is_named_and_the_pool_still_starts(tmp_path):
    path = tmp_path / "closures.json"
    path.write_text("{not json")
    with pytest.raises(ClosureFileError, match="closures.json"):
        FileClosureStore(path).load()
    pool = AdmissionPool(policy(), clock=ManualClock(T_1447, 0), store=FileClosureStore(path))
    assert "closures.json" in pool.census()["closure_store_error"]
    path.write_text(json.dumps({"version": 9, "closures": []}))
    with pytest.raises(ClosureFileError, match="version 9"):
        FileClosureStore(path).load()


def test_the_closure_file_is_replaced_atomically(tmp_path):
    path = tmp_path / "closures.json"
    store = FileClosureStore(path)
    c = T.Closure("p", None, T_1447 + 60, T.CREDIT, False, T_1447, "no credit")
    store.save([c])
    inode = os.stat(path).st_ino
    store.save([c, c._replace(provider="q")])
    assert os.stat(path).st_ino != inode  # a new file renamed over the old one, never rewritten in place
    assert [x.provider for x in store.load()] == ["p", "q"]
    assert [p.name for p in tmp_path.iterdir()] == ["closures.json"]  # no temp file left


def test_operator_close_validates_and_reopen_says_whether_there_was_one():
    pool, clock = make_pool()
    with pytest.raises(ValueError, match="not in the future"):
        pool.close("openrouter-eu", until=clock.wall() - 1)
    with pytest.raises(ValueError, match="cause"):
        pool.close("openrouter-eu", until=clock.wall() + 60, cause="whim")
    assert pool.state.closures == {}
    assert pool.reopen("openrouter-eu") is False
    pool.close("openrouter-eu", "k1", until=clock.wall() + 60)
    assert pool.admit(1, Route("glm-5.3-review", "openrouter-eu", "k1"), pinned=True).action == S.WAIT
    assert pool.admit(2, Route("glm-5.3-review", "openrouter-eu", "k2")).action == S.ADMIT


def test_batch_decisions_agree_with_single_ones():
    pol = policy()
    pool, clock = make_pool(pol)
    pool.state = T.report(pool.state, GLM_OR, T.Signal.refused(429, retry_after=60), pool.now(), pol)
    pool.state = T.report(pool.state, DEEPSEEK_OR, T.Signal.refused(402), pool.now(), pol)
    clock.advance(10)
    routes = [GLM_OR, DEEPSEEK_OR, GLM_AZ, KIMI_OR, Route("glm-5.3-coding", "openrouter-eu")]
    asks = [S.Ask(i, routes[i % len(routes)], "review" if i % 2 else "coordinator", parent=7 if i % 7 == 0 else None)
            for i in range(50)]
    batch = S.decide_batch(asks, pool.state, pol, pool.now(), random.Random(4))
    probed = set()
    single = [S.decide(a, pool.state, pol, pool.now(), random.Random(4), probed=probed) for a in asks]
    assert [(d.action, d.probe, d.delegated) for d in batch] == [(d.action, d.probe, d.delegated) for d in single]
    probes = [a.route for a, d in zip(asks, batch) if d.probe]
    assert probes and len(probes) == len(set(probes))  # one probe per pool per batch


def test_batch_thompson_draws_keep_the_cost_discount_and_exploration():
    """The batch draws its Thompson samples at once (numpy): the same rule, checked statistically."""
    pol = policy()
    now = T.Now(T_1447, 1000.0)
    held = T.Bulkhead(GLM_OR, backoff_until=now.mono + 60)
    held_az = T.Bulkhead(GLM_AZ, backoff_until=now.mono + 60)
    asks = [S.Ask(i, GLM_OR, "triage") for i in range(4000)]
    gpt = Route("gpt-6-sol", "azure-eu")

    def share(**gpt_fields):
        state = T.AdmissionState({
            GLM_OR: held, GLM_AZ: held_az,
            DEEPSEEK_OR: T.Bulkhead(DEEPSEEK_OR, successes=90, failures=10, costed=10, mean_cost=0.01),
            gpt: T.Bulkhead(gpt, **gpt_fields)}, {})
        picks = [d.route for d in S.decide_batch(asks, state, pol, now, random.Random(9))]
        assert set(picks) <= {DEEPSEEK_OR, gpt}
        return picks.count(gpt) / len(picks)

    assert 0.45 < share(successes=90, failures=10, costed=10, mean_cost=0.01) < 0.55  # equal: a coin
    assert share(successes=90, failures=10, costed=10, mean_cost=0.02) < 0.01  # twice the price
    assert 0.02 < share() < 0.15  # unexplored, against a proven route: still tried
    # a seeded batch repeats itself
    state = T.AdmissionState({GLM_OR: held, GLM_AZ: held_az}, {})
    assert S.decide_batch(asks[:50], state, pol, now, random.Random(1)) == S.decide_batch(
        asks[:50], state, pol, now, random.Random(1))


def test_a_scaled_clock_runs_a_day_in_minutes(monkeypatch):
    import types

    from admission import pool as pool_mod
    from admission.pool import ScaledClock

    real = [500.0]  # the host's monotonic clock, faked
    monkeypatch.setattr(pool_mod, "time", types.SimpleNamespace(monotonic=lambda: real[0], time=lambda: 0.0))
    clock = ScaledClock(1440, start_wall=T_1447)  # a day in a minute
    assert clock.mono() == 0.0 and clock.wall() == T_1447
    real[0] += 0.05
    assert clock.mono() == pytest.approx(72.0)  # 50 ms of the host's time: 72 s of the day
    real[0] += 59.95
    assert clock.mono() == pytest.approx(86_400.0) and clock.wall() == pytest.approx(T_1447 + 86_400.0)
    # a host instant read on it (a refusal a worker met): where its own reading stood then
    assert clock.mono_of(500.0 + 30.0) == pytest.approx(30.0 * 1440)
    with pytest.raises(ValueError):
        ScaledClock(0)
    with pytest.raises(ValueError):
        ManualClock().advance(-1)


def test_the_daily_budget_is_shown_and_closes_the_provider_at_its_limit():
    pool, clock = make_pool(policy(alternatives={"glm-5.3-review": []}))
    pool.admit(1, GLM_OR)
    pool.report_budget("openrouter-eu", 4.0, 10.0)
    row = {r["pool"]: r for r in pool.census()["bulkheads"]}[str(GLM_OR)]
    assert (row["budget_spent"], row["budget_limit"], row["state"]) == (4.0, 10.0, "open")  # shown only
    assert pool.admit(2, GLM_OR).action == S.ADMIT
    pool.report_budget("openrouter-eu", 10.0, 10.0)  # reached: closed till midnight, probed as a daily limit
    d = pool.admit(3, GLM_OR)
    assert d.action == S.WAIT and d.until == MIDNIGHT_AFTER and "budget" in d.reason
    assert pool.census()["closures"][0]["daily"] is True
    assert pool.admit(4, GLM_AZ).action == S.ADMIT  # control: another provider


def test_next_wake_says_when_a_waiting_unit_may_start():
    pool, clock = make_pool(policy(alternatives={"glm-5.3-review": []}))
    assert pool.next_wake() is None
    pool.state = T.report(pool.state, GLM_OR, T.Signal.refused(429, retry_after=30), pool.now(), pool.policy)
    pool.admit(1, GLM_OR)
    assert pool.next_wake() == pytest.approx(pool.now().mono + 30)
    clock.advance(30)
    assert [u for u, _d in pool.wake()] == [1]
    pool.report(1, signal_for(Refused(402)))
    pool.admit(2, GLM_OR)
    assert pool.next_wake() == pytest.approx(pool.now().mono + 10)  # the next probe


def test_next_wake_hears_a_backoff_end_while_another_pool_still_backs_off():
    # The burst's shape: GLM_OR backs off 10 s, its alternative GLM_AZ then 30 s. The unit
    # waits for GLM_OR; once GLM_OR's backoff has ended it may start at once, not at GLM_AZ's end.
    pool, clock = make_pool(policy(alternatives={"glm-5.3-review": ["glm-5.3-review@azure-eu"]}))
    pool.state = T.report(pool.state, GLM_OR, T.Signal.refused(429, retry_after=10), pool.now(), pool.policy)
    pool.state = T.report(pool.state, GLM_AZ, T.Signal.refused(429, retry_after=30), pool.now(), pool.policy)
    assert pool.admit(1, GLM_OR).action == S.WAIT
    assert pool.next_wake() == pytest.approx(pool.now().mono + 10)
    clock.advance(10.5)  # the loop looks a little after the instant it was told
    assert pool.next_wake() == pytest.approx(pool.now().mono)
    assert [(u, d.route) for u, d in pool.wake()] == [(1, GLM_OR)]


def test_next_wake_after_a_wake_waits_for_the_next_change_not_now():
    # control of the above: news heard once is not news again (no wake on every turn of the loop)
    pool, clock = make_pool(policy(alternatives={"glm-5.3-review": []}, pinned_tags=["fixer"]))
    pool.state = T.report(pool.state, GLM_OR, T.Signal.refused(429, retry_after=10), pool.now(), pool.policy)
    pool.state = T.report(pool.state, GLM_AZ, T.Signal.refused(429, retry_after=30), pool.now(), pool.policy)
    assert pool.admit(1, GLM_AZ, tag="fixer").action == S.WAIT  # pinned to the pool that holds longer
    clock.advance(10.5)
    assert pool.next_wake() == pytest.approx(pool.now().mono)  # GLM_OR's end: news, though not for unit 1
    assert pool.wake() == []
    assert pool.next_wake() == pytest.approx(pool.now().mono + 19.5)  # GLM_AZ's end


def _waiting_on_a_closed_key_while_azure_backs_off():
    """Unit 1 waits for GLM_OR, whose key is closed for an hour, while GLM_AZ backs off 30 s."""
    pool, clock = make_pool(policy(alternatives={"glm-5.3-review": []}))
    pool.close("openrouter-eu", until=pool.now().wall + 3600)
    pool.state = T.report(pool.state, GLM_AZ, T.Signal.refused(429, retry_after=30), pool.now(), pool.policy)
    assert pool.admit(1, GLM_OR).action == S.WAIT
    return pool, clock


def test_next_wake_is_now_after_an_operator_lifts_a_closure_while_another_pool_backs_off():
    pool, clock = _waiting_on_a_closed_key_while_azure_backs_off()
    clock.advance(1)
    assert pool.next_wake() == pytest.approx(pool.now().mono + 9)  # its probe
    pool.reopen("openrouter-eu")
    assert pool.next_wake() == pytest.approx(pool.now().mono)
    assert [u for u, _d in pool.wake()] == [1]


def test_next_wake_is_now_after_a_clean_probe_reopens_a_key_while_another_pool_backs_off():
    pool, clock = _waiting_on_a_closed_key_while_azure_backs_off()
    clock.advance(10)
    assert [(u, d.probe) for u, d in pool.wake()] == [(1, True)]
    assert pool.admit(2, GLM_OR).action == S.WAIT
    pool.report(1, T.Signal.clean())  # the key works again
    assert pool.next_wake() == pytest.approx(pool.now().mono)
    assert [u for u, _d in pool.wake()] == [2]


def test_next_wake_is_now_after_a_reload_gives_a_waiting_unit_an_alternative():
    pool, clock = make_pool(policy(alternatives={"glm-5.3-review": []}))
    pool.state = T.report(pool.state, GLM_OR, T.Signal.refused(429, retry_after=30), pool.now(), pool.policy)
    assert pool.admit(1, GLM_OR).action == S.WAIT
    assert pool.next_wake() == pytest.approx(pool.now().mono + 30)
    assert pool.holder.reload(catalog(alternatives={"glm-5.3-review": ["glm-5.3-review@azure-eu"]}))[0]
    assert pool.next_wake() == pytest.approx(pool.now().mono)
    assert [(u, d.route) for u, d in pool.wake()] == [(1, GLM_AZ)]


def test_next_wake_is_now_while_units_wait_and_nothing_holds_them():
    pool, clock = make_pool(policy(alternatives={"glm-5.3-review": []}))
    pool.state = T.report(pool.state, GLM_OR, T.Signal.refused(429, retry_after=30), pool.now(), pool.policy)
    pool.admit(1, GLM_OR)
    clock.advance(31)  # the backoff ended: nothing holds the waiting unit any more
    assert pool.next_wake() == pytest.approx(pool.now().mono)
    assert [u for u, _d in pool.wake()] == [1]
    assert pool.next_wake() is None  # control: no unit waits


def test_the_census_keeps_every_closure_renewed_as_one_and_ended_where_it_was_lifted():
    pool, clock = make_pool(policy(alternatives={"glm-5.3-review": []}, daily_limit_probe_every=10))
    daily = signal_for(Refused(403, "Key limit exceeded (daily limit)"))
    assert pool.admit(1, GLM_OR).action == S.ADMIT
    pool.report(1, daily)  # closes the key until midnight
    since = pool.now().wall
    for unit in (2, 3):  # a refused probe renews the closure: the same one goes on
        clock.advance(10)
        assert pool.admit(unit, GLM_OR).probe
        pool.report(unit, daily)
    clock.advance(10)
    assert pool.admit(4, GLM_OR).probe
    pool.report(4, T.Signal.clean())  # the topped-up key passes: lifted
    census = pool.census()
    assert census["closures"] == []  # control: nothing live any more
    (entry,) = census["closure_history"]
    assert (entry["provider"], entry["cause"], entry["since"]) == ("openrouter-eu", "daily-limit", since)
    assert entry["until"] == pool.now().wall and entry["lifted"] is True
    pool.close("azure-eu", until=pool.now().wall + 60)  # one that ends by itself keeps its end
    clock.advance(61)
    assert [(e["provider"], e["until"] - e["since"], e["lifted"]) for e in pool.census()["closure_history"]] == [
        ("openrouter-eu", 30.0, True), ("azure-eu", 60.0, False)]


def test_the_read_model_carries_the_coordinators_columns():
    # 000 §10: per bulkhead slow start and free (shown only); per lane x bulkhead the oldest
    # wait as a time, and guaranteed 0, borrowed 0, bound None (no share: the columns stay)
    pool, clock = make_pool(policy(lanes={"coordinator": {"pinned": True}}))
    fresh = pool.admit(1, GLM_AZ, lane="review")
    assert fresh.starts
    started_wall = clock.wall()
    pool.admit(2, GLM_OR, lane="coordinator")  # runs: GLM_OR has one running
    pool.report(2, signal_for(Refused(429, "slow down", retry_after=600)))  # GLM_OR refused at a load of 1
    waiting = pool.admit(3, GLM_OR, lane="coordinator")  # hard-pinned: it waits out the backoff
    assert waiting.action == S.WAIT
    clock.advance(100)
    model = pool.read_model()
    assert model == pool.census()  # one read model, whichever name a reader calls
    rows = {r["pool"]: r for r in model["bulkheads"]}
    az, glm = rows[str(GLM_AZ)], rows[str(GLM_OR)]
    assert (az["slow_start"], az["estimate"], az["running"], az["free"]) == (True, 1, 1, 0)
    assert (glm["slow_start"], glm["carrying_capacity"], glm["estimate"], glm["free"]) == (False, 1, 1, 1)
    lanes = {(r["lane"], r["pool"]): r for r in model["lanes"]}
    wait = lanes[("coordinator", str(GLM_OR))]
    assert wait["waiting"] == 1 and wait["oldest_waiting_since"] == started_wall  # a time, not an age ...
    assert wait["oldest_waiting_s"] == 100  # ... the age is there too
    assert lanes[("review", str(GLM_AZ))]["oldest_waiting_since"] is None  # nothing waits there
    for row in model["lanes"]:
        assert (row["guaranteed"], row["borrowed"], row["bound"]) == (0, 0, None)
    json.dumps(model)  # what `fleetctl admission show --json` prints
