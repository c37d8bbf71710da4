"""The host-group admission rules, as pure functions both backends call.

Theory. A store transaction reads the live records (queued and admitted), the
policy and the clock, and asks `plan` what must change; it then writes exactly
that. `plan` works in this order, so that freed capacity is reused at once:

1. an admitted request whose lease expired is timed out; a queued request past its
   queue deadline is timed out; a queued request the policy forbids (a limit of 0
   at some level) is denied;
2. the remaining queued requests are taken in queue order — effective priority
   (base + 1 per aging interval waited) descending, then submission time, then
   id — and each is admitted if the global limit and its environment, provider and
   tier quotas all have room. One that does not fit stays queued and the next is
   tried (capacity waits are retryable; the head never blocks work it does not
   compete with);
3. with preemption enabled, a request that does not fit may displace admitted
   requests that are preemptible and of strictly lower effective priority, lowest
   first (newest first among equals), and only if displacing them makes it fit;
   otherwise nothing is displaced.

No I/O and no clock here: `now` is an argument.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from .base import (
    ADMITTED,
    IDENTITY_FIELDS,
    QUEUED,
    TIERS,
    BadRequest,
    Policy,
    Record,
    Request,
)

#: Quota levels, in the order the reference lists them. The global level has one key.
LEVELS = ("global", "environment", "provider", "tier")
_GLOBAL_KEY = "*"
_MAX_TEXT = 200


def validate_request(request: Request) -> None:
    """Raise BadRequest naming the first invalid field of `request`."""
    for name in ("id", "orchestrator", "environment", "provider"):
        value = getattr(request, name)
        if not isinstance(value, str) or not value or len(value) > _MAX_TEXT or "\x00" in value:
            raise BadRequest(name, f"must be a non-empty string of at most {_MAX_TEXT} characters (no NUL), "
                                   f"got {value!r}")
    if request.tier not in TIERS:
        raise BadRequest("tier", f"unknown runtime tier {request.tier!r}; tiers: {', '.join(TIERS)}")
    if isinstance(request.priority, bool) or not isinstance(request.priority, int) or abs(request.priority) > 2**31:
        raise BadRequest("priority", f"must be a whole number, got {request.priority!r}")
    if request.queue_timeout is not None and not _positive(request.queue_timeout):
        raise BadRequest("queue_timeout", f"must be seconds > 0 or None, got {request.queue_timeout!r}")
    if not isinstance(request.preemptible, bool):
        raise BadRequest("preemptible", f"must be true or false, got {request.preemptible!r}")
    if not _positive(request.lease_ttl):
        raise BadRequest("lease_ttl", f"must be seconds > 0, got {request.lease_ttl!r}")


def _positive(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def identity_mismatch(stored: Request, replay: Request) -> tuple[str, ...]:
    """The identity fields on which a replayed request differs from the stored one."""
    return tuple(f for f in IDENTITY_FIELDS if getattr(stored, f) != getattr(replay, f))


def effective_priority(record: Record, now: float, aging_interval: float) -> int:
    """Base priority plus one point per whole aging interval the request has waited."""
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


def over_quota(policy: Policy, admitted: Iterable[Record]) -> list[tuple[str, str, int, int]]:
    """(level, key, used, limit) for every quota the admitted set exceeds; [] when all hold."""
    return [(level, key, used, limit) for (level, key), used in usage_of(admitted).items()
            if (limit := limit_of(policy, level, key)) is not None and used > limit]


@dataclass
class Plan:
    """What one transaction must write. Every list holds (record, reason) pairs."""

    lease_timeouts: list = field(default_factory=list)
    queue_timeouts: list = field(default_factory=list)
    denials: list = field(default_factory=list)
    preemptions: list = field(default_factory=list)
    admissions: list = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.lease_timeouts or self.queue_timeouts or self.denials or self.preemptions
                    or self.admissions)


def plan(policy: Policy, live: Iterable[Record], now: float) -> Plan:
    """Decide expiries, denials, preemptions and admissions for the live records at `now`."""
    out = Plan()
    admitted: list[Record] = []
    queued: list[Record] = []
    for r in live:
        if r.state == ADMITTED:
            if r.lease_expires is None or r.lease_expires <= now:
                out.lease_timeouts.append((r, "lease expired"))
            else:
                admitted.append(r)
        elif r.state == QUEUED:
            deadline = None if r.request.queue_timeout is None else r.submitted_at + r.request.queue_timeout
            reason = denial_reason(policy, r.request)
            if deadline is not None and now >= deadline:
                out.queue_timeouts.append((r, "queue timeout"))
            elif reason is not None:
                out.denials.append((r, reason))
            else:
                queued.append(r)
    usage = usage_of(admitted)
    for cand in sorted(queued, key=lambda r: queue_key(r, now, policy.aging_interval)):
        if not blocking(policy, usage, cand.request):
            usage.update(quota_slots(cand.request))
            admitted.append(cand)
            out.admissions.append((cand, "capacity"))
            continue
        if policy.preemption:
            victims = choose_victims(policy, usage, admitted, cand, now)
            if victims:
                prio = effective_priority(cand, now, policy.aging_interval)
                for v in victims:
                    usage.subtract(quota_slots(v.request))
                    admitted.remove(v)
                    out.preemptions.append((v, f"preempted by {cand.id} (effective priority {prio})"))
                usage.update(quota_slots(cand.request))
                admitted.append(cand)
                out.admissions.append((cand, "preemption"))
    return out


def preemptible_by(victim: Record, cand: Record, now: float, aging_interval: float) -> bool:
    """Only a preemptible admitted request, and only by strictly higher effective priority."""
    return (victim.state == ADMITTED and victim.request.preemptible
            and effective_priority(victim, now, aging_interval) < effective_priority(cand, now, aging_interval))


def choose_victims(policy: Policy, usage: Counter, admitted: list[Record], cand: Record, now: float):
    """The fewest-first, lowest-priority admitted requests whose removal lets `cand` fit, or None."""
    eligible = [v for v in admitted if preemptible_by(v, cand, now, policy.aging_interval)]
    # lowest effective priority first; among equals the newest goes first (it has run least)
    eligible.sort(key=lambda v: (effective_priority(v, now, policy.aging_interval), -v.submitted_at, v.id))
    trial = Counter(usage)
    chosen: list[Record] = []
    while blocked := blocking(policy, trial, cand.request):
        helpful = next((v for v in eligible if v not in chosen and set(quota_slots(v.request)) & set(blocked)), None)
        if helpful is None:
            return None
        chosen.append(helpful)
        trial.subtract(quota_slots(helpful.request))
    return chosen
