"""The host-group admission rules, as pure functions both backends call.

Theory. A store transaction reads the live records (queued and admitted), the
policy, the orchestrators' heartbeats and the clock, and asks `plan` what must
change; it then writes exactly that. `plan` works in this order, so that freed
capacity is reused at once:

1. a request holding capacity (admitted, or awaiting approval) whose lease expired is
   timed out; a queued request past its
   queue deadline is timed out; a queued request of an orchestrator whose heartbeat
   lapsed is cancelled (nobody is there to dispatch it); a queued request the policy
   forbids (a limit of 0 at some level) is denied;
2. the remaining queued requests are taken in queue order - effective priority
   (base + 1 per aging interval waited) descending, then submission time, then id -
   and each is admitted if the global limit and its environment, provider and tier
   quotas all have room. Order is strict: a request that does not fit holds one
   place at each limited quota it needs, and no request behind it may take such a
   place. A later request is admitted only where room is left beyond those held
   places, so it can never delay an earlier one (it takes nothing the earlier one
   waits for); where there is no such room, nothing behind the head moves;
3. with preemption enabled, a request that does not fit may displace admitted
   requests that are preemptible and of strictly lower priority: the fewest such
   leases whose release makes it fit (then the lowest total priority, then the
   newest), and none at all when no set of them would.

A request that asks for an approval is granted like any other, but into
``awaiting-approval``: it holds its capacity (and its place against every quota) under
a renewable lease, and may not dispatch until someone approves it. It is "admitted" for
every rule here - counted, timed out when its lease lapses, preemptible when it says so.

Aging lifts waiting requests only: an admitted lease keeps its base priority, so a
lease that has run long is no harder to displace than a fresh one.

An admission is granted until its ttl has passed, or until its orchestrator's
heartbeat lapses, whichever comes first: a request admitted to an orchestrator that
has died holds its capacity no longer than one heartbeat window after its last beat.
The one making the call is not judged by its heartbeat (it is alive: the store passes
only the others'). Every call of an orchestrator beats (admission.store.base), so every
orchestrator with a request in the store has a heartbeat to be judged by.

No I/O and no clock here: `now` is an argument.
"""
from __future__ import annotations

from admission.records import field, replace
import math
from collections import Counter
from typing import Iterable, Mapping

from admission.records import record
from admission.store.base import (
    ADMITTED,
    AWAITING_APPROVAL,
    HOLDING_STATES,
    IDENTITY_FIELDS,
    MAX_LEASE_TTL_S,
    MAX_QUEUE_TIMEOUT_S,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUED,
    BadRequest,
    Policy,
    Record,
    Request,
    UnknownTier,
    seconds_problem,
    shown,
    tier_of,
    whole_problem,
)

#: Quota levels, in the order the reference lists them. The global level has one key.
LEVELS = ("global", "environment", "provider", "tier")
_GLOBAL_KEY = "*"
_MAX_TEXT = 200


def validate_request(request: Request) -> None:
    """Raise BadRequest naming the first invalid field of `request` (and the range it must fall in)."""
    for name in ("id", "orchestrator", "environment", "provider"):
        _text(name, getattr(request, name))
    if request.runtime != "":
        _text("runtime", request.runtime)
    try:
        tier_of(request.tier)
    except UnknownTier as exc:
        raise BadRequest("tier", str(exc)) from None
    problem = whole_problem(request.priority, PRIORITY_MIN, PRIORITY_MAX)
    if problem:
        raise BadRequest("priority", problem)
    if request.queue_timeout is not None:
        problem = seconds_problem(request.queue_timeout, MAX_QUEUE_TIMEOUT_S)
        if problem:
            raise BadRequest("queue_timeout", f"{problem} (or None: no timeout)")
    if not isinstance(request.preemptible, bool):
        raise BadRequest("preemptible", f"must be true or false, got {shown(request.preemptible)}")
    problem = seconds_problem(request.lease_ttl, MAX_LEASE_TTL_S)
    if problem:
        raise BadRequest("lease_ttl", problem)
    if not isinstance(request.approval, bool):
        raise BadRequest("approval", f"must be true or false, got {shown(request.approval)}")


def _text(name: str, value) -> None:
    if not isinstance(value, str) or not value or len(value) > _MAX_TEXT or "\x00" in value:
        raise BadRequest(name, f"must be a non-empty string of at most {_MAX_TEXT} characters (no NUL), "
                               f"got {shown(value)}")


def normalized(request: Request) -> Request:
    """`request` (valid) as the store keeps it: its tier normalized, the name as given in `runtime`."""
    tier = tier_of(request.tier)
    if tier == request.tier and request.runtime:
        return request
    return replace(request, tier=tier, runtime=request.runtime or request.tier)


def granted_state(request: Request) -> str:
    """The state a grant puts `request` in: admitted, or awaiting approval when it asks for one."""
    return AWAITING_APPROVAL if request.approval else ADMITTED


def retry_of(request: Request, attempt: int) -> Request:
    """The request to submit for the `attempt`-th retry (1, 2, ...) of `request` after it timed out.

    A retry is a request of its own (the timed-out one is final): the same identity under
    the id ``<id>~<attempt>``, made from the original id, so that a replayed retry is the
    same request and a retry budget counts attempts by their id.
    """
    problem = whole_problem(attempt, 1, PRIORITY_MAX)
    if problem:
        raise BadRequest("attempt", problem)
    base = request.id.rsplit("~", 1)[0] if request.id.rsplit("~", 1)[-1].isdigit() else request.id
    return replace(request, id=f"{base}~{attempt}")


def identity_mismatch(stored: Request, replay: Request) -> tuple[str, ...]:
    """The identity fields on which a replayed request differs from the stored one."""
    return tuple(f for f in IDENTITY_FIELDS if getattr(stored, f) != getattr(replay, f))


def effective_priority(record: Record, now: float, aging_interval: float) -> int:
    """Base priority plus one point per whole aging interval the request has waited.

    Only a queued request is waiting: one that holds capacity counts its base priority.
    """
    if record.state != QUEUED:
        return record.request.priority
    waited = max(0.0, now - record.submitted_at)
    return record.request.priority + int(waited // aging_interval)


def queue_key(record: Record, now: float, aging_interval: float):
    """Sort key of the queue: effective priority desc, then submission time, then id."""
    return (-effective_priority(record, now, aging_interval), record.submitted_at, record.id)


def quota_slots(request: Request) -> tuple[tuple[str, str], ...]:
    """The (level, key) pairs one admitted `request` occupies."""
    return (("global", _GLOBAL_KEY), ("environment", request.environment),
            ("provider", request.provider), ("tier", request.tier))


def limit_of(policy: Policy, level: str, key: str) -> int | None:
    """The policy's limit at one (level, key); None = unlimited."""
    if level == "global":
        return policy.global_limit
    if level == "environment":
        return policy.environments.get(key)
    if level == "provider":
        return policy.providers.get(key)
    return policy.tier_limit(key)


def denial_reason(policy: Policy, request: Request) -> str | None:
    """Why the policy can never admit `request` (a limit of 0 on its way), or None."""
    for level, key in quota_slots(request):
        if limit_of(policy, level, key) == 0:
            return f"{level} quota of {key!r} is 0" if level != "global" else "global limit is 0"
    return None


def unconstrained(policy: Policy, request: Request) -> bool:
    """No level of `policy` limits `request`: it is admitted at once whatever else is live.

    Such a request competes with nothing, so no queue order applies to it and its
    admission needs no store lock (only a policy that stays put while it is written).
    """
    return all(limit_of(policy, level, key) is None for level, key in quota_slots(request))


def usage_of(records: Iterable[Record]) -> Counter:
    """Admitted leases per (level, key)."""
    usage: Counter = Counter()
    for r in records:
        usage.update(quota_slots(r.request))
    return usage


def blocking(policy: Policy, usage: Counter, request: Request) -> list[tuple[str, str]]:
    """The (level, key) pairs that have no room for one more `request`."""
    out = []
    for slot in quota_slots(request):
        limit = limit_of(policy, *slot)
        if limit is not None and usage[slot] + 1 > limit:
            out.append(slot)
    return out


def limited_slots(policy: Policy, request: Request) -> list[tuple[str, str]]:
    """The (level, key) pairs of `request` that the policy limits."""
    return [slot for slot in quota_slots(request) if limit_of(policy, *slot) is not None]


def lapsed(heartbeats: Mapping[str, float], now: float) -> frozenset:
    """The orchestrators whose heartbeat (orchestrator -> when it lapses) has lapsed at `now`."""
    return frozenset(o for o, lapses_at in heartbeats.items() if lapses_at <= now)


def lease_end(request: Request, now: float, heartbeats: Mapping[str, float]) -> float:
    """When a lease granted to `request` at `now` ends: its ttl, cut at its orchestrator's heartbeat lapse."""
    return min(now + request.lease_ttl, heartbeats.get(request.orchestrator, math.inf))


@record(frozen=False)
class Plan:
    """What one transaction must write. Every list holds (record, reason) pairs."""

    lease_timeouts: list = field(default_factory=list)
    queue_timeouts: list = field(default_factory=list)
    denials: list = field(default_factory=list)
    cancellations: list = field(default_factory=list)
    preemptions: list = field(default_factory=list)
    admissions: list = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.lease_timeouts or self.queue_timeouts or self.denials or self.cancellations
                    or self.preemptions or self.admissions)


def plan(policy: Policy, live: Iterable[Record], now: float, heartbeats: Mapping[str, float] | None = None) -> Plan:
    """Decide expiries, cancellations, denials, preemptions and admissions for the live records at `now`.

    `heartbeats`: orchestrator -> when its heartbeat lapses, for the orchestrators that beat.
    An admission grants `granted_state` of its request.
    """
    out = Plan()
    gone = lapsed(heartbeats or {}, now)
    admitted: list[Record] = []
    queued: list[Record] = []
    for r in live:
        if r.state in HOLDING_STATES:
            if r.lease_expires is None or r.lease_expires <= now:
                out.lease_timeouts.append((r, "lease expired" if r.state == ADMITTED
                                           else "lease expired while awaiting approval"))
            else:
                admitted.append(r)
        elif r.state == QUEUED:
            deadline = None if r.request.queue_timeout is None else r.submitted_at + r.request.queue_timeout
            reason = denial_reason(policy, r.request)
            if deadline is not None and now >= deadline:
                out.queue_timeouts.append((r, "queue timeout"))
            elif r.request.orchestrator in gone:
                out.cancellations.append((r, f"orchestrator {r.request.orchestrator!r} stopped heartbeating "
                                             f"(lapsed at {heartbeats[r.request.orchestrator]:.3f})"))
            elif reason is not None:
                out.denials.append((r, reason))
            else:
                queued.append(r)
    usage = usage_of(admitted)
    held: Counter = Counter()  # places kept at each limited quota for requests ahead that did not fit
    for cand in sorted(queued, key=lambda r: queue_key(r, now, policy.aging_interval)):
        taken = usage + held
        if not blocking(policy, taken, cand.request):
            usage.update(quota_slots(cand.request))
            admitted.append(_holding(cand))
            out.admissions.append((cand, "capacity"))
            continue
        victims = choose_victims(policy, taken, admitted, cand, now) if policy.preemption else None
        if victims:
            prio = effective_priority(cand, now, policy.aging_interval)
            for v in victims:
                usage.subtract(quota_slots(v.request))
                admitted.remove(v)
                out.preemptions.append((v, f"preempted by {cand.id} (effective priority {prio})"))
            usage.update(quota_slots(cand.request))
            admitted.append(_holding(cand))
            out.admissions.append((cand, "preemption"))
            continue
        held.update(limited_slots(policy, cand.request))
    return out


def _holding(cand: Record) -> Record:
    """A request admitted in this pass, as later candidates of the same pass see it: holding
    capacity at its base priority, so one of higher effective priority may preempt it at
    once, as the next pass would (a plan is the fixed point of its instant)."""
    return replace(cand, state=granted_state(cand.request))


def preemptible_by(victim: Record, cand: Record, now: float, aging_interval: float) -> bool:
    """Only a preemptible request holding capacity, and only by strictly higher effective
    priority (the victim's is its base priority: it no longer waits)."""
    return (victim.state in HOLDING_STATES and victim.request.preemptible
            and effective_priority(victim, now, aging_interval) < effective_priority(cand, now, aging_interval))


def victim_key(record: Record):
    """Which of two equally useful victims goes first: the lower priority, then the newer (it has run least)."""
    return (record.request.priority, -record.submitted_at, record.id)


def choose_victims(policy: Policy, usage: Counter, admitted: list[Record], cand: Record, now: float):
    """The fewest preemptible admitted requests whose release lets `cand` fit at `usage`, or None.

    Among sets of that size: the lowest total priority, then the set whose victims,
    sorted by `victim_key`, come first. Victims that share the same blocked quotas
    are interchangeable but for their key, so the search runs over how many to take
    from each such class (its lowest keys first), not over every subset.
    """
    blocked = blocking(policy, usage, cand.request)
    short = tuple(usage[slot] + 1 - limit_of(policy, *slot) for slot in blocked)
    classes: dict[tuple, list[Record]] = {}
    for v in admitted:
        if preemptible_by(v, cand, now, policy.aging_interval):
            mine = set(quota_slots(v.request))
            cover = tuple(slot in mine for slot in blocked)
            if any(cover):
                classes.setdefault(cover, []).append(v)
    # best[remaining shortfall per blocked quota] = (count, total priority, sorted victim keys, victims)
    best: dict[tuple, tuple] = {short: (0, 0, (), ())}
    for cover, members in classes.items():
        members.sort(key=victim_key)
        nxt = dict(best)
        for left, (n, total, keys, chosen) in best.items():
            for k in range(1, min(len(members), max(left)) + 1):
                took = members[:k]
                state = tuple(max(0, need - k) if c else need for need, c in zip(left, cover))
                cost = (n + k, total + sum(v.request.priority for v in took),
                        tuple(sorted(keys + tuple(victim_key(v) for v in took))), chosen + tuple(took))
                if state not in nxt or cost[:3] < nxt[state][:3]:
                    nxt[state] = cost
        best = nxt
    done = best.get(tuple(0 for _ in blocked))
    return list(done[3]) if done and done[3] else None


def standing(policy: Policy, live: Iterable[Record], now: float, request_id: str) -> dict | None:
    """Where a queued request stands, by the order `plan` admits in: its place in the queue
    (1: next), the ids of the requests ahead of it, and the limited quotas that have no room
    for it (``level``, ``key``, ``limit``, ``used``: admitted leases, and ``held``: places
    kept by requests ahead that do not fit either). None when it is not queued.

    The same walk as `plan` (so what it says holds the request is what holds it there), read
    only: `fleetctl why` asks it of a unit waiting for its lease."""
    live = list(live)
    queued = sorted((r for r in live if r.state == QUEUED), key=lambda r: queue_key(r, now, policy.aging_interval))
    usage = usage_of(r for r in live if r.state in HOLDING_STATES)
    held: Counter = Counter()
    for place, rec in enumerate(queued):
        if rec.id == request_id:
            taken = usage + held
            quotas = [{"level": level, "key": key, "limit": limit_of(policy, level, key), "used": usage[(level, key)],
                       "held": held[(level, key)]} for level, key in blocking(policy, taken, rec.request)]
            return {"position": place + 1, "ahead": [r.id for r in queued[:place]], "quotas": quotas}
        if blocking(policy, usage + held, rec.request):
            held.update(limited_slots(policy, rec.request))
        else:
            usage.update(quota_slots(rec.request))
    return None
