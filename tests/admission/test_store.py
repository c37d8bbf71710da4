"""The host-group admission store, the same suite against SQLite and a real PostgreSQL."""
from __future__ import annotations

from admission.records import replace
import sqlite3

import pytest

from admission.store import (
    ADMITTED,
    CANCELLED,
    DENIED,
    PREEMPTED,
    QUEUED,
    RELEASED,
    TIMED_OUT,
    BadRequest,
    IdentityConflict,
    LeaseLost,
    NotOwner,
    Policy,
    Record,
    Request,
    SchemaTooNew,
    StoreUnreachable,
    Closure,
    UnknownRequest,
    closure_store,
    open_store,
)
from admission.store import rules
from admission.store._sql import SCHEMA_VERSION

from ..store_backends import FakeClock, backend, pg_dsn, pg_stores, quota_history_violations, clock, req, store, store_url, stores  # noqa: F401


def admitted_ids(store):
    return sorted(r.id for r in store.active() if r.state == ADMITTED)


# ----------------------------------------------------------------------------- admission and quotas


def test_host_tier_admits_one_lease_unless_configured(store):
    a = store.submit(req("a", tier="host"))
    b = store.submit(req("b", tier="host"))
    assert (a.state, b.state) == (ADMITTED, QUEUED)
    assert a.revision == 1 and a.lease_expires == a.submitted_at + a.request.lease_ttl
    store.set_policy(Policy.build(tiers={"host": 2}))
    assert store.get("b").state == ADMITTED


def test_release_hands_capacity_to_the_next_request(store):
    store.set_policy(Policy.build(global_limit=1))
    a = store.submit(req("a"))
    store.submit(req("b"))
    assert store.release("a", a.revision).state == RELEASED
    assert store.get("b").state == ADMITTED
    # a finished request stays finished: releasing again is a no-op
    assert store.release("a", a.revision).state == RELEASED
    assert admitted_ids(store) == ["b"]


def test_a_release_of_an_expired_or_stale_lease_frees_nothing_twice(store, clock):
    a = store.submit(req("a", lease_ttl=10))
    with pytest.raises(LeaseLost):
        store.release("a", a.revision + 1)  # a stale revision: the lease stays
    assert store.get("a").state == ADMITTED
    clock.advance(10)
    assert store.release("a", a.revision).state == TIMED_OUT  # expired before it was given back
    assert [e.kind for e in store.events("a")] == ["queued", "admitted", "timed-out"]


def test_an_unlimited_submit_follows_a_policy_another_orchestrator_changed(store_url, clock):
    with open_store(store_url, actor="orch-a", clock=clock) as a, open_store(store_url, actor="orch-b",
                                                                            clock=clock) as b:
        assert a.submit(req("x")).state == ADMITTED  # nothing limits it under the default policy
        b.set_policy(Policy.build(global_limit=1))
        assert a.submit(req("y")).state == QUEUED  # a judged by the policy it saw last would admit it
        assert admitted_ids(a) == ["x"]


def test_a_release_racing_a_decision_about_its_lease_yields_to_it(pg_stores, clock):
    """PostgreSQL: a lock-free release waits for a locked transaction that read its lease.

    Orchestrator b reconciles at a time when a's lease has expired and is held just after
    its read; a then releases the lease it still believes current. The release must not
    slip in between: a's lease ends timed-out, with no released row in its history.
    """
    import threading

    url = pg_stores.new_url()
    a = open_store(url, actor="orch-a", clock=clock)
    lease = a.submit(req("a", lease_ttl=10))
    clock.advance(5)
    read, go = threading.Event(), threading.Event()

    def b_clock():
        read.set()
        go.wait(60)
        return clock.now + 20  # a's lease expired for b

    b = open_store(url, actor="orch-b", clock=clock)
    b.clock = b_clock
    out = {}
    tb = threading.Thread(target=lambda: out.setdefault("b", b.reconcile()))
    tb.start()
    assert read.wait(60)
    ta = threading.Thread(target=lambda: out.setdefault("a", a.release("a", lease.revision)))
    ta.start()
    pid = a._conn.info.backend_pid
    while ta.is_alive() and not pg_stores.admin.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", (pid,)).fetchone():
        ta.join(0.01)  # until a's release waits on b (or, wrongly, finished without waiting)
    go.set()
    tb.join(60)
    ta.join(60)
    assert out["a"].state == TIMED_OUT
    assert [e.kind for e in a.events("a")] == ["queued", "admitted", "timed-out"]
    a.close()
    b.close()


@pytest.mark.parametrize("level", ["global", "environment", "provider", "tier"])
def test_every_quota_level_holds(store, level):
    limits = {"global": dict(global_limit=2), "environment": dict(environments={"prod": 2}),
              "provider": dict(providers={"openai": 2}), "tier": dict(tiers={"container": 2})}[level]
    store.set_policy(Policy.build(limits))
    for i in range(4):
        store.submit(req(f"same-{i}"))
    assert admitted_ids(store) == ["same-0", "same-1"]
    other = {"global": {}, "environment": dict(environment="dev"), "provider": dict(provider="anthropic"),
             "tier": dict(tier="vm")}[level]
    # a request that shares no limited key is admitted beside them; under the global limit it waits too
    assert store.submit(req("other", **other)).state == (QUEUED if level == "global" else ADMITTED)
    assert admitted_ids(store) == (["same-0", "same-1"] if level == "global" else ["other", "same-0", "same-1"])
    # the same limits as the quota rule written out in tests.quotas takes them (the host tier's default too)
    host = {"tier": {"host": 1}}
    written = {"global": {"global": 2, **host}, "environment": {"environment": {"prod": 2}, **host},
               "provider": {"provider": {"openai": 2}, **host}, "tier": {"tier": {"host": 1, "container": 2}}}[level]
    assert quota_history_violations(store, written) == []


def test_the_quota_rule_the_tests_judge_by_counts_each_level():
    from ..quotas import breaches

    three = [req("a"), req("b", environment="dev"), req("c", provider="anthropic", tier="vm")]
    assert breaches({}, three) == []
    assert breaches({"global": 2}, three) == [("global", "*", 3, 2)]
    assert breaches({"environment": {"prod": 1}, "provider": {"openai": 1}, "tier": {"container": 2, "vm": 1}},
                    three) == [("environment", "prod", 2, 1), ("provider", "openai", 2, 1)]


def test_all_levels_must_hold_at_once(store):
    store.set_policy(Policy.build(environments={"prod": 5}, providers={"openai": 1}))
    store.submit(req("a"))
    b = store.submit(req("b"))  # environment has room, provider does not
    assert b.state == QUEUED


def test_policy_denial_is_terminal(store):
    store.set_policy(Policy.build(environments={"blocked": 0}))
    d = store.submit(req("d", environment="blocked"))
    assert d.state == DENIED and "environment" in d.reason
    store.set_policy(Policy.build(environments={"blocked": 3}))
    assert store.get("d").state == DENIED
    # replay of a denied request returns the denial; it is not retried
    assert store.submit(req("d", environment="blocked")).state == DENIED
    assert [e.kind for e in store.events("d")] == ["queued", "denied"]


# ----------------------------------------------------------------------------- order, ties, aging


def test_queue_order_priority_then_time_then_id(store, clock):
    store.set_policy(Policy.build(global_limit=1, aging_interval=3600))
    hold = store.submit(req("hold"))
    store.submit(req("low", priority=0))
    clock.advance(1)
    store.submit(req("b-tie", priority=5))
    store.submit(req("a-tie", priority=5))  # same submission time as b-tie: id breaks the tie
    clock.advance(1)
    store.submit(req("later", priority=5))
    order = []
    current = hold
    for _ in range(4):
        store.release(current.id, current.revision)
        current = next(r for r in store.active() if r.state == ADMITTED)
        order.append(current.id)
    assert order == ["a-tie", "b-tie", "later", "low"]


def test_priority_aging_lets_an_old_request_overtake(store, clock):
    store.set_policy(Policy.build(global_limit=1, aging_interval=10))
    hold = store.submit(req("hold", lease_ttl=1000))
    store.submit(req("old", priority=0))
    clock.advance(35)  # old has aged 3 points: effective priority 3
    store.submit(req("new", priority=3))
    store.submit(req("newer", priority=4))
    queue = [r.id for r in store.active() if r.state == QUEUED]
    # newer (4) > old (3, submitted first) > new (3)
    assert queue == ["newer", "old", "new"]
    store.release("hold", hold.revision)
    assert admitted_ids(store) == ["newer"]


def test_effective_priority_counts_whole_intervals():
    r = rules  # the pure rule, checked on its own numbers
    rec = Record(req("x", priority=2), submitted_at=100.0, state=QUEUED)
    assert r.effective_priority(rec, 100.0, 10) == 2
    assert r.effective_priority(rec, 109.9, 10) == 2
    assert r.effective_priority(rec, 110.0, 10) == 3
    assert r.effective_priority(rec, 145.0, 10) == 6
    # aging lifts waiting requests only: an admitted lease counts its base priority
    running = replace(rec, state=ADMITTED, revision=1, lease_expires=1e9)
    assert r.effective_priority(running, 145.0, 10) == 2


def test_the_head_takes_what_frees_first_not_the_requests_behind_it(store, clock):
    # The head needs prod and openai; prod and openai are held by two different leases.
    # Ten lower-priority requests each need only one of them: none may take what the head
    # waits for, so the head is admitted as soon as both are free.
    store.set_policy(Policy.build(environments={"prod": 1}, providers={"openai": 1}, aging_interval=3600))
    a = store.submit(req("a", environment="prod", provider="anthropic"))
    b = store.submit(req("b", environment="dev", provider="openai"))
    assert (a.state, b.state) == (ADMITTED, ADMITTED)
    assert store.submit(req("head", environment="prod", provider="openai", priority=9)).state == QUEUED
    for i in range(10):
        env, prov = ("prod", "anthropic") if i % 2 == 0 else ("dev", "openai")
        store.submit(req(f"low{i}", environment=env, provider=prov, priority=0))
    store.release("a", a.revision)  # prod frees: the head still waits for openai, and keeps prod
    assert admitted_ids(store) == ["b"]
    store.release("b", b.revision)
    assert admitted_ids(store) == ["head"]


def test_requests_that_need_nothing_the_head_waits_for_still_run(store, clock):
    # backfill where it provably cannot delay the head: room beyond the places it keeps
    store.set_policy(Policy.build(global_limit=3, providers={"openai": 1}, aging_interval=3600))
    hold = store.submit(req("hold", provider="openai"))
    assert store.submit(req("head", provider="openai", priority=9)).state == QUEUED
    # global: 1 used + 1 kept for the head leaves one place
    assert store.submit(req("other", provider="anthropic")).state == ADMITTED
    assert store.submit(req("one-too-many", provider="anthropic")).state == QUEUED
    store.release("hold", hold.revision)  # openai frees: the head first, then the place it kept
    assert admitted_ids(store) == ["head", "one-too-many", "other"]


# ----------------------------------------------------------------------------- leases and time


def test_renew_extends_the_lease_and_bumps_the_revision(store, clock):
    a = store.submit(req("a", lease_ttl=10))
    clock.advance(9)
    lease = store.renew("a", a.revision)
    assert (lease.revision, lease.expires) == (2, clock.now + 10)
    with pytest.raises(LeaseLost) as stale:
        store.renew("a", a.revision)
    assert "stale" in str(stale.value) and stale.value.exit_code == 93
    clock.advance(9.5)
    assert store.get("a").state == ADMITTED  # renewed: still current past the first expiry


def test_expired_lease_times_out_and_admits_the_next(store, clock):
    a = store.submit(req("a", tier="host", lease_ttl=10))
    store.submit(req("b", tier="host"))
    clock.advance(10)
    with pytest.raises(LeaseLost) as lost:
        store.renew("a", a.revision)
    assert lost.value.state == TIMED_OUT
    # the timeout was committed even though renew raised
    assert store.get("a").state == TIMED_OUT and store.get("b").state == ADMITTED
    assert [e.kind for e in store.events("a")] == ["queued", "admitted", "timed-out"]


def test_queue_timeout(store, clock):
    store.submit(req("a", tier="host"))
    store.submit(req("b", tier="host", queue_timeout=5))
    clock.advance(4.9)
    assert store.get("b").state == QUEUED
    clock.advance(0.1)
    b = store.get("b")
    assert (b.state, b.reason) == (TIMED_OUT, "queue timeout")


def test_cancel_frees_capacity(store):
    store.submit(req("a", tier="host"))
    store.submit(req("b", tier="host"))
    assert store.cancel("a", "operator stopped it").state == CANCELLED
    assert store.get("b").state == ADMITTED
    assert store.cancel("a").state == CANCELLED  # cancelling a finished request changes nothing
    assert [e.kind for e in store.events("a")] == ["queued", "admitted", "cancelled"]


# ----------------------------------------------------------------------------- preemption


def test_preemption_is_off_unless_enabled(store):
    store.submit(req("low", tier="host", preemptible=True))
    assert store.submit(req("high", tier="host", priority=9)).state == QUEUED
    assert store.get("low").state == ADMITTED


def test_preemption_displaces_a_preemptible_lower_priority_lease(store):
    store.set_policy(Policy.build(preemption=True))
    low = store.submit(req("low", tier="host", preemptible=True))
    high = store.submit(req("high", tier="host", priority=1))
    assert high.state == ADMITTED
    victim = store.get("low")
    assert victim.state == PREEMPTED and "high" in victim.reason
    with pytest.raises(LeaseLost):
        store.renew("low", low.revision)
    assert store.release("low", low.revision).state == PREEMPTED  # terminal


def test_preemption_never_takes_a_non_preemptible_lease(store):
    store.set_policy(Policy.build(preemption=True))
    store.submit(req("prod", tier="host", preemptible=False))
    assert store.submit(req("high", tier="host", priority=100)).state == QUEUED
    assert store.get("prod").state == ADMITTED


def test_preemption_never_by_equal_priority(store, clock):
    store.set_policy(Policy.build(preemption=True, aging_interval=3600))
    store.submit(req("low", tier="host", priority=1, preemptible=True))
    assert store.submit(req("eq", tier="host", priority=1)).state == QUEUED
    assert store.get("low").state == ADMITTED
    assert store.submit(req("higher", tier="host", priority=2)).state == ADMITTED
    assert store.get("low").state == PREEMPTED


def test_one_reconcile_is_the_fixed_point_of_its_instant(store, clock):
    """A request admitted in a pass holds capacity at its base priority for the rest of that
    pass: a waiting request of higher effective priority behind it preempts it in the same
    pass, as the next pass would. The live records a reconcile returns are final."""
    store.set_policy(Policy.build(tiers={"container": 1}, aging_interval=4.0, preemption=True))
    store.submit(req("r0", tier="container", lease_ttl=10.0))
    store.submit(req("r2", tier="container"))
    store.submit(req("r1", tier="container", preemptible=True))
    clock.advance(12.0)  # r0's lease ends; r1 and r2 have aged to 3, r1 is ahead by its id
    assert [r.id for r in store.reconcile()] == ["r2"]
    r1, r2 = store.get("r1"), store.get("r2")
    assert (r1.state, r1.revision, r2.state, r2.revision) == (PREEMPTED, 1, ADMITTED, 1)
    assert [r.id for r in store.reconcile()] == ["r2"]  # and the next pass changes nothing
    kinds = [(e.kind, e.request_id) for e in store.events() if e.kind in (ADMITTED, PREEMPTED)]
    assert kinds[-3:] == [(ADMITTED, "r1"), (ADMITTED, "r2"), (PREEMPTED, "r1")]


def test_a_running_lease_does_not_age_into_protection(store, clock):
    store.set_policy(Policy.build(preemption=True, aging_interval=10))
    low = store.submit(req("low", tier="host", priority=0, preemptible=True, lease_ttl=1000))
    clock.advance(100)  # ten intervals: a request queued that long would count priority 10
    store.renew("low", low.revision)
    assert store.submit(req("fresh", tier="host", priority=5)).state == ADMITTED
    assert store.get("low").state == PREEMPTED


def test_preemption_takes_the_fewest_victims_whose_release_admits_the_request(store):
    store.set_policy(Policy.build(preemption=True, global_limit=2, providers={"openai": 1}))
    store.submit(req("on-openai", provider="openai", priority=1, preemptible=True))
    store.submit(req("on-anthropic", provider="anthropic", priority=0, preemptible=True))
    # global and openai are full; the openai lease alone frees both, the lower-priority
    # anthropic lease frees only global
    assert store.submit(req("hi", provider="openai", priority=5)).state == ADMITTED
    assert store.get("on-openai").state == PREEMPTED
    assert store.get("on-anthropic").state == ADMITTED


def test_preemption_prefers_one_victim_to_two_of_lower_priority(store):
    store.set_policy(Policy.build(preemption=True, environments={"prod": 2}, providers={"openai": 2}))
    store.submit(req("both", environment="prod", provider="openai", priority=2, preemptible=True))
    store.submit(req("env-only", environment="prod", provider="anthropic", priority=0, preemptible=True))
    store.submit(req("prov-only", environment="dev", provider="openai", priority=0, preemptible=True))
    # prod and openai are full; "both" alone frees each, the two priority-0 leases free one each
    assert store.submit(req("hi", environment="prod", provider="openai", priority=5)).state == ADMITTED
    assert [store.get(r).state for r in ("both", "env-only", "prov-only")] == [PREEMPTED, ADMITTED, ADMITTED]


def test_preemption_takes_nothing_when_no_victims_would_admit_the_request(store):
    store.set_policy(Policy.build(preemption=True, global_limit=2, providers={"openai": 1}))
    store.submit(req("on-openai", provider="openai", priority=0, preemptible=False))
    store.submit(req("on-anthropic", provider="anthropic", priority=0, preemptible=True))
    assert store.submit(req("hi", provider="openai", priority=5)).state == QUEUED
    assert admitted_ids(store) == ["on-anthropic", "on-openai"]


def test_preemption_takes_the_lowest_priority_victim_and_only_if_it_helps(store):
    store.set_policy(Policy.build(preemption=True, global_limit=2))
    store.submit(req("p1", priority=1, preemptible=True))
    store.submit(req("p0", priority=0, preemptible=True))
    store.submit(req("hi", priority=5))
    assert store.get("p0").state == PREEMPTED and store.get("p1").state == ADMITTED
    # a request blocked by a quota no victim frees displaces nothing
    store.set_policy(Policy.build(preemption=True, global_limit=3, providers={"x": 1}))
    store.submit(req("x-holder", provider="x"))
    store.submit(req("x-high", provider="x", priority=50))
    assert store.get("x-high").state == QUEUED and store.get("p1").state == ADMITTED


# ----------------------------------------------------------------------------- replay and identity


def test_exact_replay_returns_the_same_record(store):
    first = store.submit(req("a", priority=3, queue_timeout=60.0))
    events = len(store.events())
    assert store.submit(req("a", priority=3, queue_timeout=60.0)) == first
    assert len(store.events()) == events


@pytest.mark.parametrize("change", [dict(environment="dev"), dict(provider="other"), dict(tier="vm"),
                                    dict(priority=4), dict(preemptible=True), dict(queue_timeout=1.0)])
def test_reusing_an_id_with_another_identity_fails_closed(store, change):
    first = store.submit(req("a"))
    with pytest.raises(IdentityConflict) as err:
        store.submit(req("a", **change))
    assert err.value.fields == tuple(change) and err.value.exit_code == 92
    assert store.get("a") == first


def test_ids_are_global_across_orchestrators(store_url, clock):
    with open_store(store_url, actor="orch-a", clock=clock) as a, open_store(store_url, actor="orch-b",
                                                                            clock=clock) as b:
        a.submit(req("shared"))
        with pytest.raises(IdentityConflict) as err:
            b.submit(req("shared", orchestrator="orch-b"))
        assert err.value.fields == ("orchestrator",)
        with pytest.raises(NotOwner):
            b.release("shared", 1)
        with pytest.raises(NotOwner):
            b.cancel("shared")


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("field,value", [("id", ""), ("id", "a\x00b"), ("environment", ""), ("provider", 3), ("tier", "bare"),
                                         ("priority", 1.5), ("priority", True), ("queue_timeout", 0),
                                         ("queue_timeout", float("nan")), ("preemptible", "yes"),
                                         ("lease_ttl", -1)])
def test_a_bad_request_is_refused_by_name_and_stores_nothing(store, field, value):
    with pytest.raises(BadRequest) as err:
        store.submit(replace(req("r"), **{field: value}))
    assert err.value.field == field and err.value.exit_code == 94
    assert store.events() == [] and store.active() == []


def test_a_request_for_another_orchestrator_is_refused(store):
    with pytest.raises(BadRequest) as err:
        store.submit(req("r", orchestrator="someone-else"))
    assert err.value.field == "orchestrator"


def test_unknown_request(store):
    with pytest.raises(UnknownRequest):
        store.get("nope")


# ----------------------------------------------------------------------------- audit


def test_every_decision_is_an_audit_event(store, clock):
    store.set_policy(Policy.build(preemption=True, environments={"no": 0}))
    a = store.submit(req("a", tier="host", preemptible=True))
    clock.advance(1)
    store.renew("a", a.revision)
    store.submit(req("b", tier="host", priority=2))
    store.submit(req("c", tier="host", queue_timeout=1))
    store.submit(req("d", environment="no"))
    clock.advance(2)
    b = store.get("b")
    store.release("b", b.revision)
    store.submit(req("e"))
    store.cancel("e", "not needed")
    kinds = {(e.request_id, e.kind) for e in store.events()}
    assert {("a", "queued"), ("a", "admitted"), ("a", "renewed"), ("a", "preempted"), ("b", "admitted"),
            ("b", "released"), ("c", "timed-out"), ("d", "denied"), ("e", "cancelled"), ("", "policy")} <= kinds
    for e in store.events():
        assert e.actor == "orch-a" and e.at >= 1_000_000.0 and e.reason
    preempted = store.events("a")[-1]
    assert preempted.kind == "preempted" and "b" in preempted.reason
    assert [e.seq for e in store.events(since=3)] == [e.seq for e in store.events()][3:]


# ----------------------------------------------------------------------------- provider closures


def closure(provider="openai", credential="key-1", until=0.0, cause="daily-limit", daily=True, since=0.0,
            message="403 daily limit"):
    return Closure(provider, credential, until, cause, daily, since, message)


def test_provider_closures_are_shared_through_the_store(store_url, clock):
    with open_store(store_url, actor="orch-a", clock=clock) as a, open_store(store_url, actor="orch-b",
                                                                            clock=clock) as b:
        [written] = a.put_closures([closure(until=clock.now + 3600, since=clock.now)])
        assert (written.written_by, written.written_at) == ("orch-a", clock.now)
        seen = b.closures()
        assert [(c.provider, c.credential, c.until, c.cause, c.daily, c.since, c.message, c.written_by)
                for c in seen] == [("openai", "key-1", clock.now + 3600, "daily-limit", True, clock.now,
                                    "403 daily limit", "orch-a")]
        # a provider-wide closure (credential None) is its own scope
        b.put_closures([closure(credential=None, until=clock.now + 60, cause="credit", daily=False)])
        assert [(c.provider, c.credential) for c in a.closures()] == [("openai", None), ("openai", "key-1")]
        assert a.closures(now=clock.now + 60) == [seen[0]]  # in force only until `until`


def test_a_closure_never_shortens_a_later_one_of_another_fleet(store_url, clock):
    with open_store(store_url, actor="orch-a", clock=clock) as a, open_store(store_url, actor="orch-b",
                                                                            clock=clock) as b:
        a.put_closures([closure(until=clock.now + 3600)])
        [kept] = b.put_closures([closure(until=clock.now + 60, cause="rejected", message="403 again")])
        assert (kept.until, kept.cause, kept.written_by) == (clock.now + 3600, "daily-limit", "orch-a")
        [longer] = b.put_closures([closure(until=clock.now + 7200, cause="credit", daily=False)])
        assert (longer.until, longer.cause, longer.written_by) == (clock.now + 7200, "credit", "orch-b")
        assert [c.until for c in a.closures()] == [clock.now + 7200]
        # one audit row per closure written, none for the one that changed nothing
        assert [(e.kind, e.request_id, e.actor) for e in a.events() if e.kind == "closure"] == [
            ("closure", "openai/key-1", "orch-a"), ("closure", "openai/key-1", "orch-b")]


def test_reopen_ends_a_closure_early_for_every_fleet_and_is_audited(store_url, clock):
    with open_store(store_url, actor="orch-a", clock=clock) as a, open_store(store_url, actor="orch-b",
                                                                            clock=clock) as b:
        a.put_closures([closure(until=clock.now + 3600), closure(credential=None, until=clock.now + 3600)])
        assert b.reopen_closure("openai", "key-1", "operator reopened") is True
        assert [(c.provider, c.credential) for c in a.closures()] == [("openai", None)]
        assert b.reopen_closure("openai", "key-1") is False  # nothing left to reopen
        [event] = [e for e in a.events() if e.kind == "reopened"][:1]
        assert (event.request_id, event.actor, event.reason) == ("openai/key-1", "orch-b", "operator reopened")
        # after a reopen a shorter closure is taken again
        [c] = a.put_closures([closure(until=clock.now + 60)])
        assert c.until == clock.now + 60


@pytest.mark.parametrize("field,value", [("provider", ""), ("credential", ""), ("until", float("inf")),
                                         ("until", "soon"), ("cause", ""), ("daily", 1), ("since", None),
                                         ("message", None), ("provider", "a\x00b")])
def test_a_bad_closure_is_refused_by_name_and_writes_nothing(store, clock, field, value):
    good = closure(until=clock.now + 60)
    bad = replace(closure(provider="other", until=clock.now + 60), **{field: value})
    with pytest.raises(BadRequest) as err:
        store.put_closures([good, bad])
    assert err.value.field == field
    assert store.closures() == [] and [e for e in store.events() if e.kind == "closure"] == []


def test_the_pool_closure_store_shares_a_spent_key_across_fleets(store_url, clock):
    """Two fleets' provider admission pools on one store: a key one closes is closed for the other."""
    from admission import state as T
    from admission.policy import Policy as ProviderPolicy
    from admission.pool import AdmissionPool, ManualClock

    from ..admission_catalog import CATALOG

    a_closures = closure_store(store_url, actor="fleet-a", clock=clock)
    b_closures = closure_store(store_url, actor="fleet-b", clock=clock)
    try:
        pool_a = AdmissionPool(ProviderPolicy.from_dict(CATALOG), clock=ManualClock(wall=clock.now), store=a_closures)
        pool_a.close("openrouter-eu", "key-1", until=clock.now + 3600, cause=T.DAILY_LIMIT, message="403")
        pool_b = AdmissionPool(ProviderPolicy.from_dict(CATALOG), clock=ManualClock(wall=clock.now), store=b_closures)
        assert [(c.provider, c.credential, c.until, c.cause, c.daily) for c in pool_b.state.closures.values()] == [
            ("openrouter-eu", "key-1", clock.now + 3600, T.DAILY_LIMIT, True)]
        pool_b.close("anthropic", until=clock.now + 60, cause=T.CREDIT)
        # a fleet saving only what it knows (here without a's closure) removes nothing
        b_closures.save([c for c in pool_b.state.closures.values() if c.provider == "anthropic"])
        assert {(c.provider, c.credential) for c in a_closures.load()} == {("openrouter-eu", "key-1"),
                                                                           ("anthropic", None)}
        assert b_closures.reopen("openrouter-eu", "key-1") is True
        assert [(c.provider, c.credential) for c in a_closures.load()] == [("anthropic", None)]
    finally:
        a_closures.close()
        b_closures.close()


# ----------------------------------------------------------------------------- schema and reachability


def _exec(url: str, statements) -> None:
    if url.startswith("sqlite://"):
        with sqlite3.connect(url[len("sqlite://"):]) as c:
            for statement in statements:
                c.execute(statement)
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as c:
            for statement in statements:
                c.execute(statement)


def _set_version(url: str, version: int) -> None:
    _exec(url, [f"UPDATE schema_version SET version = {int(version)}"])


def test_a_schema_newer_than_the_code_is_refused(store_url, clock):
    live = open_store(store_url, actor="orch-a", clock=clock)
    live.submit(req("a"))
    _set_version(store_url, SCHEMA_VERSION + 1)
    with pytest.raises(SchemaTooNew) as err:
        open_store(store_url, actor="orch-a", clock=clock)
    assert err.value.exit_code == 91 and err.value.found == SCHEMA_VERSION + 1
    with pytest.raises(SchemaTooNew):  # an open store refuses to write too
        live.submit(req("b"))
    _set_version(store_url, SCHEMA_VERSION)
    assert [r.id for r in live.active()] == ["a"]
    live.close()


def test_schema_is_created_once_and_reopened(store_url, clock):
    with open_store(store_url, actor="orch-a", clock=clock) as s:
        s.submit(req("a"))
        health = s.check()
        assert (health.schema_version, health.supported_version) == (SCHEMA_VERSION, SCHEMA_VERSION)
        assert abs(health.skew) < 5  # same machine: the clocks agree
    with open_store(store_url, actor="orch-a", clock=clock) as s:
        assert s.get("a").state == ADMITTED


def test_unreachable_store_is_named(tmp_path, backend):
    url = (f"sqlite://{tmp_path}/missing-dir/store.db" if backend == "sqlite"
           else "postgresql://postgres@127.0.0.1:1/none?connect_timeout=2")
    with pytest.raises(StoreUnreachable) as err:
        open_store(url)
    assert err.value.exit_code == 90


def test_a_lost_connection_fails_closed_and_recovers(pg_stores, clock):
    """PostgreSQL only: a SQLite file has no connection to lose."""
    stores = pg_stores
    url = stores.new_url()
    s = open_store(url, actor="orch-a", clock=clock)
    a = s.submit(req("a"))
    stores.admin.execute("SELECT pg_terminate_backend(%s)", (s._conn.info.backend_pid,))
    with pytest.raises(StoreUnreachable):
        s.renew("a", a.revision)
    # the next call reconnects; nothing was decided while it was down
    lease = s.renew("a", a.revision)
    assert lease.revision == a.revision + 1
    s.close()


# ----------------------------------------------------------------------------- orchestrator liveness


def test_a_lapsed_orchestrators_queued_requests_are_cancelled_not_admitted(store_url, clock):
    with open_store(store_url, actor="orch-a", clock=clock) as a, \
            open_store(store_url, actor="orch-b", clock=clock) as b:
        a.set_policy(Policy.build(global_limit=1))
        hold = a.submit(req("hold"))
        a.heartbeat(10.0)
        b.heartbeat(10.0)
        b.submit(req("b-waits", orchestrator="orch-b", priority=5))
        a.submit(req("a-waits"))
        clock.advance(6)
        a.heartbeat(10.0)  # orch-a beats on; orch-b has died
        clock.advance(5)  # orch-b's beat lapsed 1 s ago
        a.release("hold", hold.revision)
        assert admitted_ids(a) == ["a-waits"]
        gone = a.get("b-waits")
        assert gone.state == CANCELLED and "orch-b" in gone.reason
        assert [(e.kind, e.actor) for e in a.events("b-waits")][-1] == ("cancelled", "orch-a")
        lapsed = {o.id: o.live(clock.now) for o in a.orchestrators()}
        assert lapsed == {"orch-a": True, "orch-b": False}


def test_an_admission_to_an_orchestrator_ends_when_its_heartbeat_lapses(store_url, clock):
    with open_store(store_url, actor="orch-a", clock=clock) as a, \
            open_store(store_url, actor="orch-b", clock=clock) as b:
        a.set_policy(Policy.build(global_limit=1))
        hold = a.submit(req("hold"))
        beat = b.heartbeat(10.0)
        b.submit(req("b-waits", orchestrator="orch-b", lease_ttl=30.0))
        clock.advance(4)
        a.release("hold", hold.revision)
        got = a.get("b-waits")
        # granted for its ttl (30 s) but cut where orch-b stops being known alive
        assert (got.state, got.lease_expires) == (ADMITTED, beat.lapses_at)
        clock.advance(6)
        assert a.get("b-waits").state == TIMED_OUT


def test_orchestrators_that_never_beat_are_not_judged_by_heartbeat(store, clock):
    store.set_policy(Policy.build(global_limit=1))
    hold = store.submit(req("hold"))
    store.submit(req("waits", lease_ttl=30.0))
    clock.advance(1000)
    store.release("hold", hold.revision)
    got = store.get("waits")
    assert (got.state, got.lease_expires) == (ADMITTED, clock.now + 30.0)


def test_a_beat_after_a_lapse_starts_a_new_life(store, clock):
    first = store.heartbeat(5.0)
    clock.advance(3)
    assert store.heartbeat(5.0).started_at == first.started_at  # still the same life
    clock.advance(10)
    again = store.heartbeat(5.0)
    assert (again.started_at, again.beat_at, again.lapses_at) == (clock.now, clock.now, clock.now + 5.0)


# ----------------------------------------------------------------------------- bad input, both backends alike


@pytest.mark.parametrize("call, field", [
    (lambda s: s.get("a\x00b"), "request_id"),
    (lambda s: s.get(7), "request_id"),
    (lambda s: s.renew("a\x00", 1), "request_id"),
    (lambda s: s.renew("a", "1"), "revision"),
    (lambda s: s.release("a", 1, "done\x00"), "reason"),
    (lambda s: s.release("a\x00", 1), "request_id"),
    (lambda s: s.cancel("a", "x\x00"), "reason"),
    (lambda s: s.cancel(None), "request_id"),
    (lambda s: s.events(limit=-1), "limit"),
    (lambda s: s.events(since="x"), "since"),
    (lambda s: s.events(since=-1), "since"),
    (lambda s: s.events(request_id="a\x00"), "request_id"),
    (lambda s: s.put_closures(None), "closures"),
    (lambda s: s.heartbeat(0), "window"),
    (lambda s: s.heartbeat(float("nan")), "window"),
    (lambda s: s.submit(req("a\x00b")), "id"),
])
def test_bad_input_is_a_typed_error_that_changes_nothing(store, call, field):
    rec = store.submit(req("a"))
    before = store.events()
    with pytest.raises(BadRequest) as err:
        call(store)
    assert err.value.field == field and err.value.exit_code == 94
    assert store.events() == before and store.get("a") == rec


def test_a_file_that_is_not_a_database_is_named_not_a_traceback(tmp_path):
    path = tmp_path / "store.db"
    path.write_bytes(b"this is not an sqlite database, just text" * 100)
    with pytest.raises(StoreUnreachable) as err:
        open_store(f"sqlite://{path}")
    assert err.value.exit_code == 90 and str(path) in str(err.value)


def test_a_schema_named_in_the_url_is_created_when_missing(pg_stores, clock):
    import uuid

    from ..store_backends import with_schema

    pg_stores.new_url()  # connects the admin session
    schema = f"t_{uuid.uuid4().hex[:16]}"
    pg_stores.schemas.append(schema)  # dropped afterwards
    url = with_schema(pg_stores.dsn, schema)
    with open_store(url, actor="orch-a", clock=clock) as s:
        assert s.submit(req("a")).state == ADMITTED
    row = pg_stores.admin.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
                                  (schema,)).fetchone()
    assert row[0] >= 5


def test_a_missing_schema_this_user_may_not_create_says_what_to_run(pg_stores, clock):
    import uuid

    from admission.store import SchemaMissing
    from ..store_backends import with_schema

    pg_stores.new_url()
    role = f"r_{uuid.uuid4().hex[:12]}"
    schema = f"t_{uuid.uuid4().hex[:16]}"
    pg_stores.admin.execute(f"CREATE ROLE {role} LOGIN")
    try:
        base = pg_stores.dsn.replace("postgres@", f"{role}@", 1)
        with pytest.raises(SchemaMissing) as err:
            open_store(with_schema(base, schema), actor="orch-a", clock=clock)
        assert err.value.exit_code == 90 and f'CREATE SCHEMA "{schema}" AUTHORIZATION "{role}"' in str(err.value)
    finally:
        pg_stores.admin.execute(f"DROP ROLE {role}")


def test_the_calling_orchestrator_is_alive_whatever_its_last_beat(store, clock):
    store.set_policy(Policy.build(global_limit=1))
    hold = store.submit(req("hold"))
    store.heartbeat(5.0)
    store.submit(req("waits", lease_ttl=30.0))
    clock.advance(10)  # its beat lapsed, but it is the one calling now
    store.release("hold", hold.revision)
    got = store.get("waits")
    assert (got.state, got.lease_expires) == (ADMITTED, clock.now + 30.0)
