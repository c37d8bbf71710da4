"""Pure admission decisions: admit now, move to an alternative, or wait (reference 000 §4–§9).

Theory of operation. There is no cap, share or floor: a unit is admitted at once on
its route unless a live refusal holds that pool back (a 429 backoff, or a closure).
Then, in this order:

1. a closed pool lets one *probe* through every ``probe_every`` (a daily-limit closure:
   ``daily_limit_probe_every``) while nothing runs on it;
2. a *delegated* unit (one with a parent) is admitted at once on its route even while
   the pool backs off: refusing it could only stall its parent, which holds a seat
   (a nested-resource deadlock). It is counted, and marked delegated;
3. a *hard-pinned* unit waits for its route;
4. otherwise the unit moves to an alternative that admits it now. The policy gives the
   alternatives in groups (same model on another provider; the tier's other models;
   same-provider variants), already filtered for marks and lane exclusions. The first
   group with any admitting route wins; inside it, Thompson sampling picks: each
   route's success rate is drawn from Beta(successes + 1, failures + 1) and scaled by
   (cheapest mean cost in the group / its mean cost); a route with no cost yet is not
   discounted, and an unexplored one draws from Beta(1, 1), so the choice keeps exploring;
5. with no admitting alternative it waits, with the reason and until when (wall clock,
   UTC epoch seconds) its own pool holds it back.

Within a lane, waiting units start by urgency ``(1 + weight(severity)) * (1 + age / aging_unit)``:
an eight-day-old L unit (3 x 9 = 27) comes before a fresh B one (17 x 1).

`decide` is one decision; `decide_batch` many at once against one state (a probe is
granted once per pool per batch, as seating it would do). Randomness comes from the
`rng` argument (a ``random.Random``), so a seeded run is reproducible.
"""
from __future__ import annotations

import time
from typing import NamedTuple, Sequence

from fleet.route import Route

from .policy import Policy
from .state import AdmissionState, Now, bulkhead_of

ADMIT = "admit"
MOVE = "move"
WAIT = "wait"


class Ask(NamedTuple):
    """What a decision needs of a unit."""

    id: int
    route: Route
    lane: str | None = None
    severity: str | None = None
    pinned: bool = False
    parent: int | None = None  # the unit that delegated this one
    tag: str | None = None  # the agent or unit tag (pins may name it)
    since: float = 0.0  # mono time it was submitted (its age, for urgency and starvation)


class Decision(NamedTuple):
    """ADMIT (on `route`), MOVE (to `route`) or WAIT (`reason`, until `until`, wall seconds)."""

    action: str
    route: Route
    reason: str = ""
    until: float = 0.0
    probe: bool = False
    delegated: bool = False

    @property
    def starts(self) -> bool:
        return self.action != WAIT


def _utc(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def urgency(weight: int, age: float, aging_unit: float) -> float:
    """(1 + severity weight) x (1 + age / aging unit): aging lets nothing wait for ever."""
    return (1 + weight) * (1 + max(0.0, age) / aging_unit)


def order(asks: Sequence[Ask], policy: Policy, now: Now) -> list[Ask]:
    """Waiting units of a lane, most urgent first (older first on a tie, then by id)."""
    unit = policy.aging_unit
    return sorted(asks, key=lambda a: (-urgency(policy.weight(a.severity), now.mono - a.since, unit), a.since, a.id))


def thompson(routes: Sequence[Route], state: AdmissionState, now: Now, rng) -> Route:
    """Pick one route: Beta(s+1, f+1) draws, discounted by mean cost relative to the cheapest."""
    if len(routes) == 1:
        return routes[0]
    heads = [bulkhead_of(state, r, now) for r in routes]
    costs = [b.mean_cost for b in heads if b.costed and b.mean_cost > 0]
    cheapest = min(costs) if costs else 0.0
    best, best_score = routes[0], -1.0
    for route, b in zip(routes, heads):
        score = rng.betavariate(b.successes + 1, b.failures + 1)
        if cheapest and b.costed and b.mean_cost > 0:
            score *= cheapest / b.mean_cost
        if score > best_score:
            best, best_score = route, score
    return best


def _held(b, now: Now) -> tuple[str, float]:
    """Why `b` holds units back and until when (wall), or ("", 0) when it admits."""
    if b.closed_until > now.wall:
        return f"closed ({b.cause}{', daily limit' if b.daily else ''}) until {_utc(b.closed_until)}", b.closed_until
    if b.backoff_until > now.mono:
        until = now.wall + (b.backoff_until - now.mono)
        return f"backing off (429 x{b.refusals}) until {_utc(until)}", until
    return "", 0.0


def decide(ask: Ask, state: AdmissionState, policy: Policy, now: Now, rng, *, probed: set | None = None) -> Decision:
    """Admit `ask` now, move it to an alternative, or tell it to wait (see the module doc).

    `probed`: routes already granted a probe by the caller's batch (a probe is one unit).
    """
    route = ask.route
    b = bulkhead_of(state, route, now)
    if b.closed_until > now.wall:
        if (probed is None or route not in probed) and b.probe_due(now, policy.probe_interval(b.daily)):
            if probed is not None:
                probed.add(route)
            return Decision(ADMIT, route, "probe", probe=True, delegated=ask.parent is not None)
    elif b.backoff_until > now.mono:
        if ask.parent is not None:
            return Decision(ADMIT, route, "delegated", delegated=True)
    else:
        return Decision(ADMIT, route, delegated=ask.parent is not None)
    why, until = _held(b, now)
    if policy.is_pinned(ask.lane, ask.tag, ask.pinned):
        return Decision(WAIT, route, f"hard-pinned to {route}: {why}", until)
    for group in policy.alternatives(route, ask.lane):
        admitting = [r for r in group if not bulkhead_of(state, r, now).held(now)]
        if admitting:
            return Decision(MOVE, thompson(admitting, state, now, rng), f"moved from {route}: {why}",
                            delegated=ask.parent is not None)
    if ask.parent is not None:
        # Never make a delegated unit wait (its parent holds a seat): the provider answers it.
        return Decision(ADMIT, route, f"delegated: {why}", delegated=True)
    return Decision(WAIT, route, f"{route} {why}; no admitting alternative", until)


def decide_batch(asks: Sequence[Ask], state: AdmissionState, policy: Policy, now: Now, rng) -> list[Decision]:
    """Decide many units against one state, for throughput; same rules as `decide`.

    The common case — the route's pool admits — is answered from a per-batch table of
    open pools without building a bulkhead; everything else goes through `decide`.
    """
    out = []
    append = out.append
    probed: set = set()
    open_admit: dict = {}  # route -> the Decision for an open pool (shared, immutable)
    bulkheads = state.bulkheads
    closures = state.closures
    wall, mono = now
    for ask in asks:
        route = ask.route
        hit = open_admit.get(route)
        if hit is not None and ask.parent is None:
            append(hit)
            continue
        b = bulkheads.get(route)
        if hit is None and ((b is not None and b.closed_until <= wall and b.backoff_until <= mono)
                            or (b is None and not closures)):
            hit = open_admit[route] = Decision(ADMIT, route)
            if ask.parent is None:
                append(hit)
                continue
        append(decide(ask, state, policy, now, rng, probed=probed))
    return out
