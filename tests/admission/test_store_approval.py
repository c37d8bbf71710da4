"""Approval waits, backpressure, runtime tiers and liveness by calls, on SQLite and a real PostgreSQL.

- A request may ask to be held for an approval: granted, it keeps its admission and its
  capacity only while its lease is renewed, until someone approves or rejects it.
- What keeps a request from dispatching reaches its caller as a typed, documented kind:
  queued capacity (retryable), policy (not), approval (retryable), preempted, timed out
  (retryable within a retry budget).
- Runtime tiers are named as callers name them (``VM``, ``docker``); the store counts
  them by tier and keeps the name as given.
- Every call of an orchestrator is its heartbeat: one that stops calling holds its queue
  one heartbeat window at most, not a lease time per request.
"""
from __future__ import annotations

import pytest

from admission.store import (
    ADMITTED,
    AWAITING_APPROVAL,
    CANCELLED,
    DENIED,
    PREEMPTED,
    QUEUED,
    RELEASED,
    TIMED_OUT,
    Backpressure,
    BadRequest,
    BlockedApproval,
    BlockedCapacity,
    BlockedPolicy,
    IdentityConflict,
    LeaseLost,
    NotAwaitingApproval,
    Policy,
    Preempted,
    QuotaConfigInvalid,
    Request,
    TimedOut,
    UnknownRequest,
    open_store,
    rules,
)

from ..store_backends import FakeClock, backend, pg_dsn, quota_history_violations, clock, req, store, store_url, stores  # noqa: F401


@pytest.fixture
def operator(store_url, clock):
    """An operator's handle (as fleetctl opens one): it approves, rejects and reads."""
    s = open_store(store_url, actor="fleetctl@host", clock=clock, create=False)
    yield s
    s.close()


# ----------------------------------------------------------------------------- approval waits


def test_a_request_held_for_approval_reserves_its_capacity_and_may_not_dispatch(store, operator):
    store.set_policy(Policy.build(global_limit=1))
    held = store.submit(req("held", approval=True, lease_ttl=10))
    behind = store.submit(req("behind"))
    assert (held.state, behind.state) == (AWAITING_APPROVAL, QUEUED)  # the reservation counts
    lease = held.lease
    assert (lease.state, lease.revision, lease.expires) == (AWAITING_APPROVAL, 1, held.submitted_at + 10)
    assert lease.current(store.clock()) and not lease.dispatchable(store.clock())
    with pytest.raises(BlockedApproval) as err:
        held.require_lease()
    assert (err.value.outcome, err.value.retryable, err.value.budgeted) == ("blocked/approval", True, False)
    # approved: admitted under the lease it holds (its owner renews it at its revision)
    got = operator.approve("held", "looked fine")
    assert (got.state, got.revision, got.lease_expires) == (ADMITTED, 1, held.lease_expires)
    assert got.require_lease().dispatchable(store.clock())
    assert store.renew("held", 1).state == ADMITTED
    assert store.get("behind").state == QUEUED  # the capacity stays its
    kinds = [(e.kind, e.actor) for e in store.events(request_id="held")]
    assert kinds == [("queued", "orch-a"), (AWAITING_APPROVAL, "orch-a"), ("approved", "fleetctl@host"),
                     ("renewed", "orch-a")]
    assert operator.approve("held").state == ADMITTED  # the same decision again: its record
    with pytest.raises(NotAwaitingApproval):
        operator.reject("held")  # decided the other way already: nothing changes
    assert store.get("held").state == ADMITTED


def test_a_rejected_request_is_denied_and_its_capacity_goes_on_at_once(store, operator):
    store.set_policy(Policy.build(global_limit=1))
    store.submit(req("held", approval=True))
    store.submit(req("behind"))
    got = operator.reject("held", "not this week")
    assert (got.state, got.reason) == (DENIED, "rejected by fleetctl@host: not this week")
    with pytest.raises(BlockedPolicy) as err:
        got.require_lease()
    assert (err.value.outcome, err.value.retryable) == ("blocked/policy", False)
    snapshot, _, _ = store.snapshot()  # handed on in the same call, before any other reconcile
    assert [(r.id, r.state) for r in snapshot] == [("behind", ADMITTED)]
    assert operator.reject("held").state == DENIED
    with pytest.raises(BlockedPolicy):  # a lease denied is lost as a policy refusal
        store.renew("held", 1)
    assert quota_history_violations(store, {"global": 1}) == []  # the reservation counted, never both at once


def test_a_lapsed_renewal_releases_the_reservation(store, operator, clock):
    store.set_policy(Policy.build(global_limit=1))
    held = store.submit(req("held", approval=True, lease_ttl=10))
    store.submit(req("behind"))
    clock.advance(8)
    lease = store.renew("held", held.revision)  # control: renewed in time, it holds on
    assert (lease.revision, lease.state) == (2, AWAITING_APPROVAL)
    clock.advance(8)
    assert store.get("behind").state == QUEUED
    clock.advance(2)  # ten seconds since the renewal and none since: the reservation lapses
    assert store.get("held").state == TIMED_OUT and store.get("behind").state == ADMITTED
    with pytest.raises(TimedOut) as err:
        store.renew("held", 2)
    assert (err.value.retryable, err.value.budgeted) == (True, True) and isinstance(err.value, LeaseLost)
    with pytest.raises(NotAwaitingApproval) as err:
        operator.approve("held")  # too late: nothing is approved, nothing changes
    assert err.value.state == TIMED_OUT
    assert store.get("held").reason == "lease expired while awaiting approval"
    assert quota_history_violations(store, {"global": 1}) == []


def test_approval_of_what_awaits_none_is_refused_and_changes_nothing(store, operator):
    store.set_policy(Policy.build(global_limit=1))
    plain = store.submit(req("plain"))
    queued = store.submit(req("queued", approval=True))
    with pytest.raises(UnknownRequest):
        operator.approve("nobody")
    for rid, state in (("plain", ADMITTED), ("queued", QUEUED)):
        for decide in (operator.approve, operator.reject):
            with pytest.raises(NotAwaitingApproval) as err:
                decide(rid)
            assert err.value.state == state and err.value.exit_code == 94
    assert [(r.id, r.state) for r in store.active()] == [("plain", ADMITTED), ("queued", QUEUED)]
    assert plain.revision == store.get("plain").revision and queued.revision == 0
    for bad in ("", "a\x00b", 7):
        with pytest.raises(BadRequest):
            operator.approve(bad)


def test_a_reservation_may_be_released_cancelled_or_preempted(store, clock):
    store.set_policy(Policy.build(global_limit=1, preemption=True))
    a = store.submit(req("a", approval=True))
    assert store.release("a", a.revision).state == RELEASED
    b = store.submit(req("b", approval=True))
    assert store.cancel("b").state == CANCELLED
    c = store.submit(req("c", approval=True, preemptible=True))
    assert c.state == AWAITING_APPROVAL
    urgent = store.submit(req("urgent", priority=5))
    assert (store.get("c").state, urgent.state) == (PREEMPTED, ADMITTED)
    with pytest.raises(Preempted) as err:
        store.renew("c", c.revision)
    assert (err.value.outcome, err.value.retryable) == ("preempted", False) and b.revision == 1


def test_an_approval_request_is_its_own_identity(store):
    store.submit(req("x", approval=True))
    with pytest.raises(IdentityConflict) as err:
        store.submit(req("x"))
    assert err.value.fields == ("approval",)


# ----------------------------------------------------------------------------- backpressure


def test_each_kind_of_backpressure_reaches_the_caller_typed(store, clock):
    store.set_policy(Policy.build(global_limit=1, environments={"never": 0}))
    running = store.submit(req("running", lease_ttl=5))
    queued = store.submit(req("queued"))
    denied = store.submit(req("denied", environment="never"))
    assert running.backpressure is None and running.require_lease().dispatchable(clock())
    cases = {queued.id: (BlockedCapacity, "blocked/capacity", True), denied.id: (BlockedPolicy, "blocked/policy", False)}
    for rid, (kind, outcome, retryable) in cases.items():
        bp = store.get(rid).backpressure
        assert type(bp) is kind and isinstance(bp, Backpressure)
        assert (bp.outcome, bp.retryable, bp.request_id) == (outcome, retryable, rid)
    clock.advance(6)  # the lease runs out unrenewed
    store.cancel("queued")  # (its capacity is free for the retry below)
    expired = store.get("running")
    assert type(expired.backpressure) is TimedOut and expired.backpressure.budgeted
    with pytest.raises(TimedOut):
        store.renew("running", 1)
    # a retry is a request of its own, named after the original, and a replay of it is the same
    retry = rules.retry_of(expired.request, 1)
    assert retry.id == "running~1" and rules.retry_of(retry, 2).id == "running~2"
    assert store.submit(retry).state == ADMITTED == store.submit(retry).state
    # released by its owner: no backpressure, and a renewal of it is a plain lost lease
    store.release("running~1", 1)
    assert store.get("running~1").backpressure is None
    with pytest.raises(LeaseLost) as err:
        store.renew("running~1", 1)
    assert not isinstance(err.value, Backpressure) and err.value.state == RELEASED
    with pytest.raises(LeaseLost):
        store.get("running~1").require_lease()


# ----------------------------------------------------------------------------- runtime tiers


@pytest.mark.parametrize("given,tier", [("VM", "vm"), ("docker", "container"), ("Podman", "container"),
                                        ("OCI", "container"), ("Firecracker", "microvm"),
                                        ("cloud-hypervisor", "microvm"), ("KVM", "vm"), ("qemu", "vm"),
                                        ("Host", "host"), ("custom:wasmtime", "custom"), (" microvm ", "microvm")])
def test_a_runtime_alias_is_counted_by_its_tier_and_kept_as_given(store, given, tier):
    rec = store.submit(req("r", tier=given))
    assert (rec.request.tier, rec.request.runtime) == (tier, given)
    assert (store.get("r").request.tier, store.get("r").request.runtime) == (tier, given)


def test_tier_quotas_hold_across_aliases(store):
    policy = store.set_policy(Policy.build(tiers={"VM": 1, "Docker": 2}))
    assert dict(policy.tiers) == {"vm": 1, "container": 2}
    assert store.submit(req("a", tier="kvm")).state == ADMITTED
    assert store.submit(req("b", tier="QEMU")).state == QUEUED  # the same tier: its quota of 1 is taken
    assert store.submit(req("c", tier="podman")).state == ADMITTED
    assert store.submit(req("d", tier="docker")).state == ADMITTED
    assert store.submit(req("e", tier="container")).state == QUEUED
    # a replay naming the same tier otherwise is the same request; another tier is a conflict
    assert store.submit(req("a", tier="VM")).request.runtime == "kvm"
    with pytest.raises(IdentityConflict):
        store.submit(req("a", tier="docker"))


@pytest.mark.parametrize("name", ["contianer", "wasm", "custom:", "", "custom"])
def test_an_unknown_runtime_is_refused_not_guessed(store, name):
    if name == "custom":  # the tier itself is fine
        assert store.submit(req("r", tier=name)).request.tier == "custom"
        return
    with pytest.raises(BadRequest) as err:
        store.submit(req("r", tier=name))
    assert err.value.field == "tier" and "custom:<name>" in str(err.value)
    assert store.active() == []


def test_a_tier_named_twice_in_a_policy_is_refused(store):
    with pytest.raises(QuotaConfigInvalid) as err:
        store.set_policy(Policy.build(tiers={"docker": 1, "podman": 2}))
    assert err.value.path == "tiers.podman" and "'docker'" in str(err.value)
    with pytest.raises(QuotaConfigInvalid) as err:
        store.set_policy(Policy.build(tiers={"bare": 1}))
    assert err.value.path == "tiers.bare"


# ----------------------------------------------------------------------------- liveness by calls


def test_an_orchestrator_that_stops_calling_holds_its_queue_one_window_not_a_lease_each(store_url, clock):
    # orch-b never heartbeats on purpose: its calls are its heartbeat. It queues three
    # requests with long leases, then dies. Within one window its queue is gone, and no
    # request of it was admitted to nobody for a lease time.
    with open_store(store_url, actor="orch-a", clock=clock) as a, \
            open_store(store_url, actor="orch-b", clock=clock, heartbeat_window=20) as b:
        a.set_policy(Policy.build(global_limit=1))
        first = a.submit(Request("a-1", "orch-a", "prod", "openai", "container", lease_ttl=10))
        for i in range(3):
            assert b.submit(Request(f"b-{i}", "orch-b", "prod", "openai", "container", lease_ttl=600)).state == QUEUED
        # orch-b is gone from here on. orch-a finishes: b-0 is admitted, but only until orch-b lapses
        clock.advance(5)
        a.release("a-1", first.revision)
        granted = a.get("b-0")
        assert granted.state == ADMITTED and granted.lease_expires == clock() - 5 + 20  # its last call + window
        clock.advance(14)
        assert [r.state for r in map(a.get, ("b-0", "b-1", "b-2"))] == [ADMITTED, QUEUED, QUEUED]  # control
        clock.advance(1)  # one window after orch-b's last call
        assert [r.state for r in map(a.get, ("b-0", "b-1", "b-2"))] == [TIMED_OUT, CANCELLED, CANCELLED]
        assert a.submit(Request("a-2", "orch-a", "prod", "openai", "container")).state == ADMITTED
        assert [(o.id, o.lapses_at) for o in a.orchestrators() if o.id == "orch-b"] == [("orch-b", clock() - 20 + 20)]


def test_an_orchestrator_that_keeps_calling_keeps_its_queue(store_url, clock):
    with open_store(store_url, actor="orch-a", clock=clock) as a, \
            open_store(store_url, actor="orch-b", clock=clock, heartbeat_window=20) as b:
        a.set_policy(Policy.build(global_limit=1))
        a.submit(Request("a-1", "orch-a", "prod", "openai", "container", lease_ttl=600))
        b.submit(Request("b-0", "orch-b", "prod", "openai", "container"))
        for _ in range(10):  # it polls its request every 9 s (under half its window): never lapses
            clock.advance(9)
            assert b.get("b-0").state == QUEUED
        assert a.get("b-0").state == QUEUED


def test_an_operator_handle_beats_for_nobody(store_url, clock, store, operator):
    store.submit(req("a", approval=True))
    operator.approve("a")
    operator.policy()
    operator.set_policy(Policy.build(global_limit=5))
    assert [o.id for o in operator.orchestrators()] == ["orch-a"]
