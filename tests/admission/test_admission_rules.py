"""One test per provider-admission rule (reference 000), each with its negative control, on a fake clock."""
import random

import pytest

from admission import scheduler as S
from admission import state as T
from admission.policy import Policy
from admission.pool import BadAsk, UnknownUnit, signal_for
from fleet.rules.outcomes import Refused
from admission.route import Route

from ..admission_catalog import (
    DEEPSEEK_OR, GLM_AZ, GLM_CODING_OR, GLM_OR, GLM_US, GPT_AZ, KIMI_OR, MIDNIGHT_AFTER, OPUS, SONNET, T_1447,
    catalog, make_pool, policy,
)

R429 = Refused(429, "rate limited")
DAILY = Refused(403, "Key limit exceeded (daily limit)")
CREDIT = Refused(402, "Insufficient credits")
REJECTED = Refused(401, "invalid key")

# Far above the ids tests name by hand (1, 2, ...), whichever test of a worker runs first.
_ids = iter(range(1_000_000, 10**9))


def run(pool, route, outcome=None, **kw):
    """Admit one unit on `route`, and end it at once with `outcome` (None: clean). Returns the decision."""
    unit = next(_ids)
    decision = pool.admit(unit, route, **kw)
    if decision.starts:
        pool.report(unit, signal_for(outcome))
    return decision


def bulkhead(pool, route):
    return T.bulkhead_of(pool.state, route, pool.now())


# --- 429: backoff, exponential, Retry-After, reset -------------------------------------------
def test_429_backs_off_that_one_pool_exponentially_and_a_clean_round_resets_it():
    pool, clock = make_pool()
    now = pool.now()
    run(pool, GLM_OR, R429)
    assert bulkhead(pool, GLM_OR).backoff_until == now.mono + 1.0
    assert bulkhead(pool, GLM_OR).held(pool.now())
    # control: another pool of the same provider is untouched (a 429 closes nothing)
    assert not bulkhead(pool, DEEPSEEK_OR).held(pool.now()) and not pool.state.closures
    clock.advance(1.0)
    run(pool, GLM_OR, R429)
    assert bulkhead(pool, GLM_OR).backoff_until == pool.now().mono + 2.0  # doubled
    clock.advance(2.0)
    run(pool, GLM_OR, R429)
    assert bulkhead(pool, GLM_OR).backoff_until == pool.now().mono + 4.0
    assert bulkhead(pool, GLM_OR).refusals == 3
    clock.advance(4.0)
    run(pool, GLM_OR)  # clean: the refusal count resets
    assert bulkhead(pool, GLM_OR).refusals == 0
    run(pool, GLM_OR, R429)
    assert bulkhead(pool, GLM_OR).backoff_until == pool.now().mono + 1.0  # back to the first step


def test_backoff_honours_retry_after_and_is_capped():
    pool, clock = make_pool(policy(backoff_max=8))
    run(pool, GLM_OR, Refused(429, retry_after=30))
    assert bulkhead(pool, GLM_OR).backoff_until == pool.now().mono + 30.0  # longer than the 1 s step
    clock.advance(30)
    for _ in range(6):
        run(pool, GLM_OR, R429)
        clock.advance(100)
    run(pool, GLM_OR, R429)
    assert bulkhead(pool, GLM_OR).backoff_until == pool.now().mono + 8.0  # 2**7 capped at 8


def test_a_stall_or_timeout_changes_no_bulkhead():
    pool, clock = make_pool()
    run(pool, GLM_OR, R429)
    before = bulkhead(pool, GLM_OR)
    clock.advance(5)
    run(pool, GLM_OR, TimeoutError())
    after = bulkhead(pool, GLM_OR)
    assert (after.refusals, after.backoff_until, after.failures, after.successes) == (
        before.refusals, before.backoff_until, before.failures, before.successes)
    assert after.running == 0
    # control: a handler error counts a failure (and still holds nothing back)
    run(pool, GLM_OR, ValueError("boom"))
    assert bulkhead(pool, GLM_OR).failures == before.failures + 1 and not bulkhead(pool, GLM_OR).held(pool.now())


# --- closures: daily limit vs credit ------------------------------------------------------------
def test_daily_limit_closes_until_the_next_utc_midnight_credit_for_35_minutes():
    pool, _ = make_pool(wall=T_1447)
    run(pool, GLM_OR, DAILY)
    b = bulkhead(pool, GLM_OR)
    assert b.closed_until == MIDNIGHT_AFTER and b.daily and b.cause == T.DAILY_LIMIT
    # control: a credit refusal closes for closed_for (35 min), not till midnight
    pool2, _ = make_pool(wall=T_1447)
    run(pool2, GLM_OR, CREDIT)
    b2 = bulkhead(pool2, GLM_OR)
    assert b2.closed_until == T_1447 + 35 * 60 and not b2.daily and b2.cause == T.CREDIT
    pool3, _ = make_pool(wall=T_1447)
    run(pool3, GLM_OR, REJECTED)
    assert bulkhead(pool3, GLM_OR).closed_until == T_1447 + 35 * 60
    assert bulkhead(pool3, GLM_OR).cause == T.REJECTED_KEY


def test_classification_of_statuses():
    assert T.classify(429) == T.RATE_LIMIT
    assert T.classify(402) == T.CREDIT
    assert T.classify(403, "Key limit exceeded (daily limit)") == T.DAILY_LIMIT
    assert T.classify(403, "Forbidden") == T.REJECTED_KEY
    assert T.classify(500) is None and T.Signal.refused(500).kind == T.ERROR


def test_closure_ends_on_its_own():
    pool, clock = make_pool()
    run(pool, GLM_OR, CREDIT)
    clock.advance(35 * 60 - 1)
    assert bulkhead(pool, GLM_OR).closed(pool.now())
    clock.advance(1)
    assert not bulkhead(pool, GLM_OR).closed(pool.now())
    assert run(pool, GLM_OR).action == S.ADMIT and not pool.census()["closures"]


# --- probes -------------------------------------------------------------------------------------------
def test_a_closed_pool_lets_one_probe_through_every_probe_every_while_nothing_runs():
    pool, clock = make_pool(policy(alternatives={"glm-5.3-review": []}))  # nowhere to move: the unit waits
    run(pool, GLM_OR, CREDIT)
    clock.advance(9.9)
    assert pool.admit(101, GLM_OR).action == S.WAIT  # not yet
    clock.advance(0.1)
    # the probe is due, but unit 101 waited for it: a fresh arrival does not take it
    assert pool.admit(102, GLM_OR).action == S.WAIT
    (first,) = pool.wake()
    assert first[0] == 101 and first[1].probe
    assert pool.admit(103, GLM_OR).action == S.WAIT  # one probe: one runs, the next waits
    clock.advance(60)
    assert pool.admit(104, GLM_OR).action == S.WAIT  # still running: no second probe
    assert not pool.wake()
    pool.report(101, signal_for(CREDIT))  # refused probe: stays closed, probe clock restarts
    assert bulkhead(pool, GLM_OR).closed(pool.now())
    clock.advance(9)
    assert not pool.wake()
    clock.advance(1)
    started = pool.wake()
    assert [(d.probe) for _u, d in started] == [True] and len(started) == 1
    unit = started[0][0]
    pool.report(unit, signal_for(None))  # clean probe: reopens (a topped-up key does not wait)
    assert not bulkhead(pool, GLM_OR).closed(pool.now()) and not pool.state.closures
    assert {u for u, _d in pool.wake()} == {102, 103, 104} - {unit}


def test_daily_limit_probe_interval_setting_with_credit_as_control():
    pol = policy(daily_limit_probe_every=3600, alternatives={"glm-5.3-review": []})
    pool, clock = make_pool(pol)
    run(pool, GLM_OR, DAILY)
    clock.advance(10)
    assert pool.admit(201, GLM_OR).action == S.WAIT  # held: the daily setting, not probe_every
    clock.advance(3590)
    (woken,) = pool.wake()
    assert woken[0] == 201 and woken[1].probe
    # control: a credit closure under the same policy still probes after 10 s
    pool2, clock2 = make_pool(pol)
    run(pool2, GLM_OR, CREDIT)
    clock2.advance(10)
    assert pool2.admit(203, GLM_OR).probe


# --- scope of a closure: the key, or the provider ------------------------------------------------
def test_a_known_credential_closes_only_that_key():
    pool, _ = make_pool()
    k1, k2 = Route("glm-5.3-review", "openrouter-eu", "k1"), Route("glm-5.3-review", "openrouter-eu", "k2")
    k1_other = Route("deepseek-v4-flash", "openrouter-eu", "k1")
    run(pool, k2)
    run(pool, k1, CREDIT)
    now = pool.now()
    assert bulkhead(pool, k1).closed(now) and bulkhead(pool, k1_other).closed(now)  # the key's every pool
    assert not bulkhead(pool, k2).closed(now)  # another key goes on
    assert run(pool, k2).action == S.ADMIT


def test_an_unknown_credential_closes_every_pool_of_the_provider():
    pool, _ = make_pool()
    k2 = Route("glm-5.3-review", "openrouter-eu", "k2")
    run(pool, k2)
    run(pool, DEEPSEEK_OR)
    run(pool, GLM_OR, CREDIT)
    now = pool.now()
    assert all(bulkhead(pool, r).closed(now) for r in (GLM_OR, k2, DEEPSEEK_OR))
    assert not bulkhead(pool, GLM_AZ).closed(now)  # control: another provider


def test_a_pool_first_seen_after_its_provider_closed_is_born_closed():
    pool, _ = make_pool(policy(alternatives={"glm-5.3-coding": []}))
    run(pool, GLM_OR, DAILY)
    assert GLM_CODING_OR not in pool.state.bulkheads
    d = pool.admit(301, GLM_CODING_OR)
    assert d.action == S.WAIT and "daily-limit" in d.reason
    assert bulkhead(pool, GLM_CODING_OR).closed_until == MIDNIGHT_AFTER
    # control: a pool of another provider, first seen now, is open
    assert pool.admit(302, GLM_AZ).action == S.ADMIT


# --- alternatives --------------------------------------------------------------------------------
def _hold(pool, *routes):
    for route in routes:
        run(pool, route, R429)


def test_same_model_elsewhere_wins_over_a_different_model():
    pool, _ = make_pool(rng=random.Random(1))
    _hold(pool, GLM_OR)
    picks = {run(pool, GLM_OR).route for _ in range(200)}
    assert picks == {GLM_AZ}
    # control: with the same model elsewhere held too, a different model of the tier is chosen
    _hold(pool, GLM_AZ)
    picks = {run(pool, GLM_OR).route for _ in range(200)}
    assert picks == {DEEPSEEK_OR, GPT_AZ}


def test_same_provider_variants_come_last():
    pool, _ = make_pool(rng=random.Random(2))
    _hold(pool, GLM_OR, GLM_AZ)
    picks = {run(pool, GLM_OR).route for _ in range(200)}
    assert GLM_CODING_OR not in picks
    # control: once every other model of the tier is held, the variant is taken
    _hold(pool, DEEPSEEK_OR, GPT_AZ)
    d = run(pool, GLM_OR)
    assert d.action == S.MOVE and d.route == GLM_CODING_OR


def test_a_lane_never_falls_back_to_a_model_it_excludes_even_when_named_explicitly():
    pol = policy(alternatives={"glm-5.3-review": ["kimi-k2.7-code"]})
    pool, _ = make_pool(pol)
    _hold(pool, GLM_OR)
    d = run(pool, GLM_OR, lane="review")
    assert d.action == S.WAIT and KIMI_OR not in pool.state.bulkheads
    # control: another lane falls back to it
    assert run(pool, GLM_OR, lane="triage").route == KIMI_OR


def test_a_residency_bound_unit_waits_when_its_only_compliant_route_is_closed():
    pool, _ = make_pool()
    eu_only = Route("deepseek-v4-flash", "openrouter-eu")
    # the US deepseek node is open, but it would weaken the EU/ZDR marks; every EU route is on the spent key
    assert pool.holder.reload(catalog(alternatives={"deepseek-v4-flash": ["deepseek-v4-flash@openrouter-us"]}))[0]
    run(pool, eu_only, DAILY)
    d = pool.admit(401, eu_only)
    assert d.action == S.WAIT and "no admitting alternative" in d.reason
    # control: a unit on the US node (no EU promise) is free to run there
    assert pool.admit(402, Route("deepseek-v4-flash", "openrouter-us")).action == S.ADMIT
    # and the same EU unit moves once a compliant provider is declared and open
    assert pool.holder.reload(catalog(alternatives={"deepseek-v4-flash": ["gpt-6-sol@azure-eu"]}))[0]
    assert pool.admit(403, eu_only).route == GPT_AZ


# --- Thompson sampling ----------------------------------------------------------------------------
NOW = T.Now(T_1447, 1000.0)


def test_thompson_keeps_exploring_an_unexplored_route():
    state = T.AdmissionState({DEEPSEEK_OR: T.Bulkhead(DEEPSEEK_OR, successes=30, failures=30)}, {})
    rng = random.Random(7)
    picks = [S.thompson([DEEPSEEK_OR, GPT_AZ], state, NOW, rng) for _ in range(4000)]
    share = picks.count(GPT_AZ) / len(picks)
    # P(U(0,1) > Beta(31,31)) = 0.5: the unexplored route keeps being tried
    assert 0.45 < share < 0.55
    # control: against a route that has proved itself, the unexplored one is tried far less, but still
    strong = T.AdmissionState({DEEPSEEK_OR: T.Bulkhead(DEEPSEEK_OR, successes=95, failures=5)}, {})
    share = [S.thompson([DEEPSEEK_OR, GPT_AZ], strong, NOW, rng) for _ in range(4000)].count(GPT_AZ) / 4000
    assert 0.02 < share < 0.12


def test_thompson_discounts_by_mean_cost():
    rng = random.Random(11)
    same = dict(successes=90, failures=10, costed=10)
    equal = T.AdmissionState({DEEPSEEK_OR: T.Bulkhead(DEEPSEEK_OR, mean_cost=0.01, **same),
                              GPT_AZ: T.Bulkhead(GPT_AZ, mean_cost=0.01, **same)}, {})
    share_equal = [S.thompson([DEEPSEEK_OR, GPT_AZ], equal, NOW, rng) for _ in range(4000)].count(GPT_AZ) / 4000
    assert 0.45 < share_equal < 0.55  # control: same rate, same cost -> a coin
    dearer = T.AdmissionState({DEEPSEEK_OR: T.Bulkhead(DEEPSEEK_OR, mean_cost=0.01, **same),
                               GPT_AZ: T.Bulkhead(GPT_AZ, mean_cost=0.02, **same)}, {})
    share_dear = [S.thompson([DEEPSEEK_OR, GPT_AZ], dearer, NOW, rng) for _ in range(4000)].count(GPT_AZ) / 4000
    assert share_dear < 0.01  # twice the price halves the score: it almost never wins


def test_thompson_is_reproducible_with_a_seeded_rng():
    state = T.AdmissionState.empty()
    a = [S.thompson([DEEPSEEK_OR, GPT_AZ, SONNET], state, NOW, random.Random(5)) for _ in range(3)]
    b = [S.thompson([DEEPSEEK_OR, GPT_AZ, SONNET], state, NOW, random.Random(5)) for _ in range(3)]
    assert a == b


# --- hard pins and starvation -------------------------------------------------------------------------
def test_a_hard_pin_waits_and_starves_after_15_minutes():
    pool, clock = make_pool()
    _hold(pool, GLM_OR)
    pool.state = T.report(pool.state, GLM_OR, T.Signal.refused(429, retry_after=3600), pool.now(), pool.policy)
    d = pool.admit(501, GLM_OR, pinned=True)
    assert d.action == S.WAIT and d.reason.startswith("hard-pinned to glm-5.3-review@openrouter-eu")
    assert d.until == pytest.approx(T_1447 + 3600, abs=2)
    lane_pin = pool.admit(502, GLM_OR, lane="coordinator")
    tag_pin = pool.admit(503, GLM_OR, tag="fixer")
    assert lane_pin.action == tag_pin.action == S.WAIT
    assert run(pool, GLM_OR).action == S.MOVE  # control: unpinned, it moves
    clock.advance(15 * 60)
    assert pool.starving() == []  # not past starved_after yet
    clock.advance(1)
    starving = pool.starving()
    assert [s["unit"] for s in starving] == [501, 502, 503] and all(s["kind"] == "pinned" for s in starving)


def test_a_closed_provider_with_work_waiting_heads_the_starving_list():
    pool, clock = make_pool()
    run(pool, GLM_OR, DAILY)
    pool.admit(601, GLM_OR, pinned=True)
    clock.advance(16 * 60)
    starving = pool.starving()
    assert starving[0]["kind"] == "provider-closed" and starving[0]["provider"] == "openrouter-eu"
    assert starving[1]["kind"] == "pinned" and starving[1]["unit"] == 601
    # control: a closed provider with nothing waiting is not starving
    pool.cancel(601)
    assert pool.starving() == []


# --- delegated units ----------------------------------------------------------------------------------
def test_a_delegated_unit_is_admitted_at_once_while_its_pool_backs_off_and_counted_on_the_parents_lane():
    pool, _ = make_pool()
    parent = pool.admit(701, SONNET, lane="review")
    assert parent.action == S.ADMIT
    pool.state = T.report(pool.state, GLM_OR, T.Signal.refused(429, retry_after=600), pool.now(), pool.policy)
    child = pool.admit(702, GLM_OR, lane="triage", parent=701)
    assert child.action == S.ADMIT and child.delegated and child.route == GLM_OR  # through the backoff, not moved
    rows = {(r["lane"], r["pool"]): r for r in pool.census()["lanes"]}
    assert rows[("review", str(GLM_OR))]["delegated"] == 1 and rows[("review", str(GLM_OR))]["running"] == 1
    assert bulkhead(pool, GLM_OR).delegated == 1
    # control: the same unit without a parent moves off the backing-off pool
    assert pool.admit(703, GLM_OR, lane="triage").action == S.MOVE
    pool.report(702, signal_for(None))
    assert bulkhead(pool, GLM_OR).delegated == 0 and bulkhead(pool, GLM_OR).delegated_total == 1


@pytest.mark.parametrize("pin", ["asked", "lane", "tag"])
def test_delegation_never_passes_a_hard_pin(pin):
    # 000: a hard pin waits for its route; delegation passes a backoff only. Pinned by the
    # ask, by the parent's lane (the child's lane is its parent's), or by the unit's tag.
    pool, clock = make_pool()
    parent_lane = "coordinator" if pin == "lane" else "review"
    pool.admit(711, SONNET, lane=parent_lane)
    pool.state = T.report(pool.state, GLM_OR, T.Signal.refused(429, retry_after=60), pool.now(), pool.policy)
    kw = {"asked": {"pinned": True}, "lane": {}, "tag": {"tag": "fixer"}}[pin]
    child = pool.admit(712, GLM_OR, parent=711, **kw)
    assert child.action == S.WAIT and child.reason.startswith("hard-pinned to") and not child.delegated
    assert bulkhead(pool, GLM_OR).delegated_total == 0
    # control: unpinned (a parent of an unpinned lane, no pin, no pinned tag), a child passes the backoff
    pool.admit(714, SONNET, lane="review")
    assert pool.admit(713, GLM_OR, parent=714).delegated
    clock.advance(60)  # the backoff ends: the pinned child starts on its own route
    assert [(unit, d.route) for unit, d in pool.wake()] == [(712, GLM_OR)]


@pytest.mark.parametrize("parent", [424242, 720, 721, True, "720", 7.0])
def test_a_parent_the_admission_holds_no_seat_for_is_refused_and_nothing_is_counted(parent):
    pool, _ = make_pool()
    seated = pool.admit(1, SONNET, lane="review")  # unit 1 holds a seat: True == 1 must not pass for it
    assert seated.starts
    pool.admit(720, GPT_AZ)
    pool.report(720, signal_for(None))  # 720 ran and ended: it delegates nothing now
    pool.close("anthropic", until=pool.now().wall + 600)
    assert pool.admit(721, OPUS, pinned=True).action == S.WAIT  # 721 waits: it holds no seat
    before = (pool.census()["lanes"], dict(pool.state.bulkheads))
    with pytest.raises(BadAsk, match=f"parent {parent!r} holds no seat"):
        pool.admit(722, GLM_OR, parent=parent)
    assert (pool.census()["lanes"], dict(pool.state.bulkheads)) == before and not pool.holds(722)
    assert pool.admit(722, GLM_OR, parent=1).delegated  # control: a seated parent delegates
    assert pool.holds(1) and not pool.holds(720) and not pool.holds(721)


# --- urgency inside a lane ------------------------------------------------------------------------------
def test_an_eight_day_old_low_unit_starts_before_a_fresh_blocking_one():
    pol = policy()
    now = T.Now(T_1447, 100 * 86_400.0)
    old_low = S.Ask(1, GLM_OR, "dispatch", "L", since=now.mono - 8 * 86_400)
    fresh_b = S.Ask(2, GLM_OR, "dispatch", "B", since=now.mono)
    assert [a.id for a in S.order([fresh_b, old_low], pol, now)] == [1, 2]
    # control: four days old, the L unit (3 x 5 = 15) still comes after a fresh B (17)
    young_low = old_low._replace(since=now.mono - 4 * 86_400)
    assert [a.id for a in S.order([young_low, fresh_b], pol, now)] == [2, 1]
    assert S.urgency(32, 0, 86_400) == 33 and S.urgency(2, 8 * 86_400, 86_400) == 27


def test_wake_starts_waiting_units_in_urgency_order():
    pool, clock = make_pool()
    pool.state = T.report(pool.state, GLM_OR, T.Signal.refused(429, retry_after=5 * 86_400), pool.now(),
                          pool.policy)
    pool.admit(801, GLM_OR, lane="dispatch", severity="L", pinned=True)
    clock.advance(8 * 86_400)  # (backoff over; the L unit is eight days old)
    pool.state = T.report(pool.state, GLM_OR, T.Signal.refused(429, retry_after=10), pool.now(), pool.policy)
    pool.admit(802, GLM_OR, lane="dispatch", severity="B", pinned=True)
    clock.advance(10)
    assert [u for u, _d in pool.wake()] == [801, 802]


# --- coordinator API ----------------------------------------------------------------------------------------
def test_allowance_is_none_unless_every_pool_of_the_lanes_work_is_held():
    pool, _ = make_pool()
    assert pool.allowance("coordinator") is None  # no work: start everything
    pool.admit(901, GLM_OR, lane="coordinator")
    pool.admit(902, OPUS, lane="coordinator")
    assert pool.allowance("coordinator") is None
    pool.state = T.report(pool.state, GLM_OR, T.Signal.refused(429, retry_after=60), pool.now(), pool.policy)
    assert pool.allowance("coordinator") is None  # control: OPUS still admits
    pool.state = T.report(pool.state, OPUS, T.Signal.refused(429, retry_after=60), pool.now(), pool.policy)
    assert pool.allowance("coordinator") == 0  # pinned lane, every pool held
    # an unpinned lane on the same pools moves to alternatives: nothing holds it
    pool.admit(903, GLM_OR, lane="triage")
    assert pool.allowance("triage") is None


def test_plan_counts_what_would_start_and_seats_nothing():
    pool, clock = make_pool()
    assert pool.plan("triage", GLM_OR, 7) == 7
    pool.state = T.report(pool.state, GLM_OR, T.Signal.refused(429, retry_after=60), pool.now(), pool.policy)
    assert pool.plan("triage", GLM_OR, 7) == 7  # alternatives honoured
    assert pool.plan("coordinator", GLM_OR, 7) == 0  # pinned lane waits
    assert pool.plan("triage", GLM_OR, 7, pinned=True) == 0
    pool2, clock2 = make_pool(policy(alternatives={"glm-5.3-review": []}))
    run(pool2, GLM_OR, CREDIT)
    assert pool2.plan("triage", GLM_OR, 5) == 0
    clock2.advance(10)
    assert pool2.plan("triage", GLM_OR, 5) == 1  # one probe
    assert pool2.plan("triage", GLM_OR, 5) == 1 and bulkhead(pool2, GLM_OR).running == 0  # nothing seated


# --- the pool's input ----------------------------------------------------------------------------------------
def test_bad_asks_are_typed_errors_and_change_nothing():
    pool, _ = make_pool()
    with pytest.raises(BadAsk):
        pool.admit(1, ("glm", "or"))
    with pytest.raises(BadAsk, match="unknown severity"):
        pool.admit(1, GLM_OR, severity="X")
    with pytest.raises(BadAsk, match="not in the declared catalog"):
        pool.admit(1, Route("glm-5.3-review", "nowhere"))
    with pytest.raises(BadAsk, match="does not carry lane 'eu-only'"):
        pool.admit(1, OPUS, lane="eu-only")
    pool.admit(1, GLM_OR)
    with pytest.raises(BadAsk, match="already"):
        pool.admit(1, GLM_OR)
    with pytest.raises(UnknownUnit):
        pool.report(99, signal_for(None))
    assert bulkhead(pool, GLM_OR).running == 1 and OPUS not in pool.state.bulkheads
    assert pool.admit(2, OPUS, lane="triage").action == S.ADMIT  # control: a lane with no requirement


def test_a_move_is_counted_and_reports_land_on_the_route_it_ran_on():
    pool, _ = make_pool()
    _hold(pool, GLM_OR)
    d = pool.admit(1001, GLM_OR)
    assert d.action == S.MOVE and d.route == GLM_AZ
    pool.report(1001, signal_for(R429))
    assert bulkhead(pool, GLM_AZ).refusals == 1 and bulkhead(pool, GLM_AZ).moved_in == 1
    assert bulkhead(pool, GLM_OR).refusals == 1
    assert GLM_US not in pool.state.bulkheads  # never a weaker node


def test_refused_is_a_typed_picklable_signal():
    import pickle

    r = pickle.loads(pickle.dumps(Refused(429, "slow down", retry_after=2.5)))
    assert (r.status, r.message, r.retry_after) == (429, "slow down", 2.5)
    assert signal_for(r) == T.Signal(T.REFUSED, T.RATE_LIMIT, 2.5, "slow down")
    for bad in (dict(status=42), dict(status="429"), dict(status=True), dict(status=429, retry_after=-1),
                dict(status=429, message=3)):
        with pytest.raises(ValueError):
            Refused(**bad)
    import fleet

    assert fleet.Refused is Refused and fleet.Route is Route


def test_route_text_form():
    r = Route("anthropic/claude-opus-5", "openrouter-eu", "k1")
    assert str(r) == "anthropic/claude-opus-5@openrouter-eu/k1" and Route.parse(str(r)) == r
    assert Route.parse("m@p") == Route("m", "p")
    for bad in ("m", "@p", "m@", "m@p/"):
        with pytest.raises(ValueError):
            Route.parse(bad)


def test_delegation_passes_a_backoff_only_never_a_closure():
    pool, clock = make_pool(policy(alternatives={"glm-5.3-review": []}))
    pool.admit(1, SONNET)
    run(pool, GLM_OR, R429)
    child = pool.admit(2, GLM_OR, parent=1)
    assert child.action == S.ADMIT and child.delegated  # through the backoff: the parent is not stalled
    assert pool.admit(3, GLM_OR).action == S.WAIT  # control: an undelegated unit waits out the backoff
    clock.advance(2)
    pool.report(2, signal_for(None))
    run(pool, GLM_OR, CREDIT)  # now the key is spent
    assert pool.admit(4, GLM_OR, parent=1).action == S.WAIT  # a delegated unit is never sent onto a closed key
    assert pool.admit(5, DEEPSEEK_OR, parent=1).action == S.MOVE  # control: an admitting alternative takes it


def test_a_shorter_closure_never_cuts_a_longer_one_of_the_same_key_short():
    pool, clock = make_pool()
    run(pool, GLM_OR, DAILY)
    clock.advance(10)
    d = pool.admit(1, GLM_OR, pinned=True)
    assert d.probe
    pool.report(1, signal_for(CREDIT))  # the probe meets a credit refusal: 35 min, shorter than midnight
    assert bulkhead(pool, GLM_OR).closed_until == MIDNIGHT_AFTER
    assert pool.census()["closures"][0]["until"] == MIDNIGHT_AFTER


# --- a refused round waits and runs (000 §8) -------------------------------------------------------------
def test_a_refused_unit_is_decided_again_under_its_marks_and_lane_exclusions():
    explicit = ["kimi-k2.7-code@openrouter-eu", "glm-5.3-review@openrouter-us", "glm-5.3-review@azure-eu"]
    pool, clock = make_pool(policy(alternatives={"glm-5.3-review": explicit}))
    assert pool.admit(901, GLM_OR, lane="review").action == S.ADMIT
    again = pool.report(901, signal_for(R429), again=True)
    # the same model on another provider, EU like its own node (never the US one); never Kimi (the
    # review lane excludes it)
    assert again.action == S.MOVE and again.route == GLM_AZ
    assert pool.refusals(901) == 1
    again = pool.report(901, signal_for(R429), again=True)  # the alternative refuses too: it waits
    assert again.action == S.WAIT and pool.waiting(901) is again and again.until > clock.wall()
    assert bulkhead(pool, GLM_OR).refusals == bulkhead(pool, GLM_AZ).refusals == 1  # every refusal is counted
    clock.advance(1.0)
    (woken,) = pool.wake()  # its pool's backoff ended: admitted again on its own route
    assert woken == (901, woken[1]) and woken[1].route == GLM_OR
    # control: a report that may not hand the unit back ends it
    assert pool.admit(902, GPT_AZ).starts and pool.report(902, signal_for(R429)) is None


def test_a_refused_unit_fails_only_past_its_lanes_refusal_limit_or_deadline():
    pol = policy(lanes={"review": {"max_refusals": 2, "pinned": True}})
    pool, clock = make_pool(pol)
    pool.admit(911, GPT_AZ, lane="review")
    assert pool.report(911, signal_for(R429), again=True) is not None  # the first refusal: it waits
    clock.advance(2)
    (_woken,) = pool.wake()
    assert pool.report(911, signal_for(R429), again=True) is None  # the second: its lane's limit
    assert pol.refusal_limit(None) == (10, None)  # control: the default limit
    pool, clock = make_pool(policy(lanes={"slow": {"refusal_deadline": 60, "pinned": True}}, probe_every=3600))
    pool.admit(912, SONNET, lane="slow")
    assert pool.report(912, signal_for(CREDIT), again=True).action == S.WAIT  # closed 35 min
    assert pool.next_wake() == pytest.approx(pool.now().mono + 60)  # its deadline comes first
    clock.advance(59)
    assert pool.spent() == []
    clock.advance(1)
    ((unit, why),) = pool.spent()
    assert unit == 912 and "deadline" in why and pool.waiting(912) is None


def test_a_bursts_429s_are_one_backoff_not_many_in_a_row():
    pool, clock = make_pool(policy(backoff_max=300))
    for unit in range(921, 941):
        assert pool.admit(unit, GPT_AZ).starts  # no cap: all twenty start
    began = pool.now().mono
    for unit in range(921, 931):
        pool.report(unit, signal_for(R429))
    clock.advance(0.5)
    for unit in range(931, 941):  # the same burst's refusals, heard late: they change nothing
        pool.report(unit, signal_for(R429))
    b = bulkhead(pool, GPT_AZ)
    assert b.refusals == 20 and b.strikes == 1
    assert b.backoff_until == began + 1.0  # one backoff's first step, not 2**19 s, and not stretched
    clock.advance(0.5)
    run(pool, GPT_AZ, R429)  # refused after the backoff ended: the next one in a row
    assert bulkhead(pool, GPT_AZ).backoff_until == pool.now().mono + 2.0


def _refused_at(at, retry_after=10.0):
    """A 429 the provider gave at mono instant `at` of the pool's clock (its outcome is reported later)."""
    return T.Signal.refused(429, "rate limited", retry_after, at=at)


def test_a_backoff_runs_from_the_refusals_instant_not_from_when_it_is_reported():
    pool, clock = make_pool()
    assert pool.admit(951, GPT_AZ, pinned=True).starts
    clock.advance(1.0)
    refused = pool.now()  # the provider answers 429, Retry-After 10 s ...
    clock.advance(2.0)  # ... and the outcome reaches the pool 2 s later
    again = pool.report(951, _refused_at(refused.mono), again=True)
    b = bulkhead(pool, GPT_AZ)
    assert b.backoff_until == refused.mono + 10.0  # Retry-After counts from the provider's answer
    assert b.refused_at == refused.wall and b.backoff_at == pool.now().mono  # heard now, refused then
    assert again.action == S.WAIT and again.until == refused.wall + 10.0
    assert pool.next_wake() == refused.mono + 10.0
    clock.advance(8.0)  # 10 s after the refusal, 8 s after its report: re-admitted
    assert [unit for unit, _ in pool.wake()] == [951]
    # control: a refusal that does not say when it was given counts from its report
    pool.admit(952, SONNET, pinned=True)
    pool.report(952, T.Signal.refused(429, "rate limited", 10.0))
    assert bulkhead(pool, SONNET).backoff_until == pool.now().mono + 10.0


def test_a_refusals_instant_is_kept_between_its_start_and_its_report():
    pool, clock = make_pool()
    pool.admit(953, GPT_AZ, pinned=True)
    started = pool.now().mono
    clock.advance(3.0)
    pool.report(953, _refused_at(pool.now().mono + 60))  # from the future: taken as now
    assert bulkhead(pool, GPT_AZ).backoff_until == pool.now().mono + 10.0
    clock.advance(20.0)
    pool.admit(954, SONNET, pinned=True)
    start = pool.now().mono
    clock.advance(3.0)
    pool.report(954, _refused_at(started))  # before the unit started (a stale Refused): its start
    assert bulkhead(pool, SONNET).backoff_until == start + 10.0


def test_a_round_seated_before_the_pool_heard_of_a_backoff_is_the_same_burst():
    pool, clock = make_pool(policy(backoff_max=300))
    pool.admit(955, GPT_AZ, pinned=True)
    clock.advance(1.0)
    first = pool.now().mono  # 955 is refused here ...
    clock.advance(0.25)
    assert pool.admit(956, GPT_AZ, pinned=True).starts  # ... 956 is seated: the pool has not heard yet
    clock.advance(0.25)
    pool.report(955, _refused_at(first, retry_after=None))  # heard: backs off from `first`
    assert bulkhead(pool, GPT_AZ).backoff_until == first + 1.0
    clock.advance(0.25)
    pool.report(956, _refused_at(pool.now().mono, retry_after=None))  # the same burst's news
    b = bulkhead(pool, GPT_AZ)
    assert (b.strikes, b.backoff_until) == (1, first + 1.0)
    # control: a round seated after the backoff and refused starts the next one in a row
    assert pool.admit(957, GPT_AZ, pinned=True).action == S.WAIT
    clock.advance(0.25)
    (_woken,) = pool.wake()
    pool.report(957, _refused_at(pool.now().mono, retry_after=None))
    b = bulkhead(pool, GPT_AZ)
    assert (b.strikes, b.backoff_until) == (2, pool.now().mono + 2.0)


def test_a_closure_runs_from_the_refusals_instant():
    pool, clock = make_pool(wall=T_1447)
    pool.admit(958, SONNET, pinned=True)
    refused = pool.now()
    clock.advance(4.0)
    pool.report(958, T.Signal.refused(402, "Insufficient credits", at=refused.mono))
    (closure,) = pool.state.closures.values()
    assert (closure.since, closure.until) == (refused.wall, refused.wall + 35 * 60)


def test_no_round_is_spent_as_a_probe_while_an_alternative_admits():
    pool, clock = make_pool()
    run(pool, GLM_OR, CREDIT)  # the provider's key (unknown) is spent
    clock.advance(10)  # a probe is due
    d = pool.admit(931, GLM_OR)
    assert d.action == S.MOVE and d.route == GLM_AZ and not d.probe
    assert bulkhead(pool, GLM_OR).probes == 0
    # control: with no admitting alternative the same round is the probe
    assert pool.admit(932, GLM_OR, pinned=True).probe


def test_one_probe_per_closed_key_per_interval_not_one_per_pool():
    pool, clock = make_pool(policy(alternatives={"glm-5.3-review": [], "deepseek-v4-flash": []}))
    run(pool, GLM_OR, CREDIT)
    assert pool.admit(941, GLM_OR).action == S.WAIT
    assert pool.admit(942, DEEPSEEK_OR).action == S.WAIT  # another pool of the same spent key
    clock.advance(10)
    started = pool.wake()
    assert len(started) == 1 and started[0][1].probe  # one probe speaks for the key
    clock.advance(5)
    assert pool.wake() == []  # the other pool runs nothing, but its key was probed 5 s ago
    # a batch decides against one state: still one probe for the key
    fresh, clock3 = make_pool(policy(alternatives={"glm-5.3-review": [], "deepseek-v4-flash": []}))
    run(fresh, GLM_OR, CREDIT)
    run(fresh, DEEPSEEK_OR)  # born closed, nothing running
    clock3.advance(10)
    asks = [S.Ask(945, GLM_OR), S.Ask(946, DEEPSEEK_OR)]
    batch = S.decide_batch(asks, fresh.state, fresh.policy, fresh.now(), random.Random(1))
    assert [d.probe for d in batch] == [True, False]
    # control: two keys, two probes
    pool2, clock2 = make_pool(policy(alternatives={"glm-5.3-review": []}))
    k1, k2 = Route("glm-5.3-review", "openrouter-eu", "k1"), Route("glm-5.3-review", "openrouter-eu", "k2")
    run(pool2, k1, CREDIT)
    run(pool2, k2, CREDIT)
    pool2.admit(943, k1)
    pool2.admit(944, k2)
    clock2.advance(10)
    assert sorted(u for u, d in pool2.wake() if d.probe) == [943, 944]


def test_a_model_in_no_tier_has_no_default_alternatives_but_an_explicit_entry_applies():
    data = catalog()
    data["providers"]["azure-eu"]["models"]["kimi-k2.7-code"] = {"residency": "eu", "retention": "zdr"}
    pol = Policy.from_dict(data)
    assert pol.node("kimi-k2.7-code", "openrouter-eu").tier is None
    assert pol.alternatives(KIMI_OR, None) == ((), (), ())  # not even the same model elsewhere
    data["alternatives"] = {"kimi-k2.7-code": ["kimi-k2.7-code@azure-eu"]}
    assert Policy.from_dict(data).alternatives(KIMI_OR, None)[0] == (Route("kimi-k2.7-code", "azure-eu"),)
    # control: a tier model still has the same model elsewhere by default
    assert pol.alternatives(GLM_OR, None)[0][0] == GLM_AZ


def test_an_age_given_at_admit_counts_for_urgency_an_old_low_unit_first():
    pool, clock = make_pool(policy(alternatives={"glm-5.3-review": []}))
    run(pool, GLM_OR, R429)  # backing off 1 s: both wait
    pool.admit(951, GLM_OR, lane="dispatch", severity="B")
    pool.admit(952, GLM_OR, lane="dispatch", severity="L", age=8 * 86_400)  # a replayed round, eight days old
    clock.advance(1)
    assert [u for u, _d in pool.wake()] == [952, 951]
    # control: without its age the fresh B unit comes first
    pool2, clock2 = make_pool(policy(alternatives={"glm-5.3-review": []}))
    run(pool2, GLM_OR, R429)
    pool2.admit(953, GLM_OR, lane="dispatch", severity="B")
    pool2.admit(954, GLM_OR, lane="dispatch", severity="L")
    clock2.advance(1)
    assert [u for u, _d in pool2.wake()] == [953, 954]


def test_a_closure_has_a_finite_end_everywhere(tmp_path):
    import json
    import math

    from admission.pool import ClosureFileError, FileClosureStore

    pool, clock = make_pool()
    for until in (math.inf, math.nan, "tomorrow", True):
        with pytest.raises(ValueError, match="finite"):
            pool.close("openrouter-eu", until=until)
    assert pool.state.closures == {}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"version": 1, "closures": [
        {"provider": "p", "credential": None, "until": "Infinity", "cause": "credit", "daily": False, "since": 0}]}))
    with pytest.raises(ClosureFileError, match="finite"):
        FileClosureStore(str(path)).load()
    pool.close("openrouter-eu", until=clock.wall() + 60)  # control: a finite future end
    assert pool.state.closures


def test_the_census_row_of_a_pool_says_what_its_hard_pinned_units_wait_for():
    pool, clock = make_pool()
    run(pool, GLM_OR, CREDIT)
    pool.admit(961, GLM_OR, lane="coordinator")  # a pinned lane
    pool.admit(962, GLM_OR)  # not pinned: it moves
    clock.advance(5)
    rows = {r["pool"]: r for r in pool.census()["bulkheads"]}
    text = rows[str(GLM_OR)]["pinned_wait"]
    assert text.startswith(f"hard-pinned to {GLM_OR}: 1 unit(s) waiting, the longest 5 s") and "closed (credit" in text
    assert rows[str(GLM_AZ)]["pinned_wait"] is None  # control
