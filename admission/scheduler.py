"""Pure admission decisions: admit now, move to an alternative, or wait (reference 000 §4–§9).

Theory of operation. There is no cap, share or floor: a unit is admitted at once on
its route unless a live refusal holds that pool back (a 429 backoff, or a closure).
Then, in this order:

1. a *hard-pinned* unit waits for its route — or, on a closed pool, is its probe when
   one is due. A pin is never passed, not even by delegation: a hard pin waits;
2. a *delegated* unit (its parent is a unit running in this fleet) is admitted at once
   through a backoff on its own route: refusing it could only stall its parent, which
   holds a seat (a nested-resource deadlock). It is counted, and marked delegated.
   Delegation passes a backoff only: on a closed pool, or pinned, it is decided as any
   other unit;
3. otherwise the unit moves to an alternative that admits it now. The policy gives the
   alternatives in groups (same model on another provider; the tier's other models;
   same-provider variants), already filtered for marks and lane exclusions. The first
   group with any admitting route wins; inside it, Thompson sampling picks: each
   route's success rate is drawn from Beta(successes + 1, failures + 1) and scaled by
   (cheapest mean cost in the group / its mean cost); a route with no cost yet is not
   discounted, and an unexplored one draws from Beta(1, 1), so the choice keeps exploring;
4. with no admitting alternative, a closed pool lets one *probe* through every
   ``probe_every`` (a daily-limit closure: ``daily_limit_probe_every``) per closed key
   (the provider, when the key is unknown) while nothing runs on that pool: a round an
   alternative could run is never spent on a probe;
5. else it waits, with the reason and until when (wall clock, UTC epoch seconds) its
   own pool holds it back.

Within a lane, waiting units start by urgency ``(1 + weight(severity)) * (1 + age / aging_unit)``:
an eight-day-old L unit (3 x 9 = 27) comes before a fresh B one (17 x 1). A unit's age
counts from ``since``, which a caller may set in the past (a unit that already waited).

A refused unit is decided again (`spent`: unless it has met its lane's limit of
refusals, or its refusal deadline has passed).

`decide` is one decision; `decide_batch` many at once against one state (a probe is
granted once per closed key per batch, as seating it would do). Randomness comes from
the `rng` argument (a ``random.Random``), so a seeded run is reproducible.
"""
from __future__ import annotations

import time
from typing import NamedTuple, Sequence

from admission.policy import Policy
from admission.route import Route
from admission.state import AdmissionState, Now, bulkhead_of, probe_scope

_new = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)

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
    since: float = 0.0  # mono time its age counts from (urgency, starvation): its submit, or earlier
    submitted: float = 0.0  # mono time it was submitted here (its refusal deadline counts from it)
    refused: int = 0  # refusals it has met so far


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
    scores = [rng.betavariate(a, b) * discount for a, b, discount in _thompson_params(routes, state, now)]
    return routes[max(range(len(scores)), key=scores.__getitem__)]


def _thompson_params(routes: Sequence[Route], state: AdmissionState, now: Now) -> list[tuple[int, int, float]]:
    """Per route (alpha, beta, discount): Beta(successes + 1, failures + 1), scaled by
    cheapest mean cost / its mean cost (1 when it has no cost yet: unexplored is not penalised)."""
    heads = [state.bulkheads.get(r) or bulkhead_of(state, r, now) for r in routes]
    costs = [b.mean_cost for b in heads if b.costed and b.mean_cost > 0]
    cheapest = min(costs) if costs else 0.0
    return [(b.successes + 1, b.failures + 1,
             cheapest / b.mean_cost if cheapest and b.costed and b.mean_cost > 0 else 1.0) for b in heads]


def hold_of(b, now: Now) -> tuple[str, float]:
    """Why `b` holds units back and until when (wall), or ("", 0) when it admits."""
    if b.closed_until > now.wall:
        return f"closed ({b.cause}{', daily limit' if b.daily else ''}) until {_utc(b.closed_until)}", b.closed_until
    if b.backoff_until > now.mono:
        until = now.wall + (b.backoff_until - now.mono)
        return f"backing off (429 x{b.refusals}) until {_utc(until)}", until
    return "", 0.0


def decide(ask: Ask, state: AdmissionState, policy: Policy, now: Now, rng, *, probed: set | None = None,
           memo: dict | None = None) -> Decision:
    """Admit `ask` now, move it to an alternative, or tell it to wait (see the module doc).

    `probed`: closed keys (`state.probe_scope`) whose probe the caller has given away
    already (a batch, or units that waited before this one). `memo`: a dict the caller
    keeps for one (state, now) — a batch — to reuse what does not depend on the unit
    (why a pool holds, which alternatives admit).
    """
    route = ask.route
    delegated = ask.parent is not None
    b = state.bulkheads.get(route) or bulkhead_of(state, route, now)
    closed = b.closed_until > now.wall
    if not closed:
        if b.backoff_until <= now.mono:
            return _new(Decision, (ADMIT, route, "", 0.0, False, delegated))
        if delegated and not policy.is_pinned(ask.lane, ask.tag, ask.pinned):
            return _new(Decision, (ADMIT, route, "delegated", 0.0, False, True))
    if memo is None:
        memo = {}
    held = memo.get(route)
    if held is None:
        held = memo[route] = hold_of(b, now)
    why, until = held
    if policy.is_pinned(ask.lane, ask.tag, ask.pinned):
        if closed and _probe(route, b, state, policy, now, probed):
            return _new(Decision, (ADMIT, route, "probe", 0.0, True, delegated))
        return _new(Decision, (WAIT, route, f"hard-pinned to {route}: {why}", until, False, False))
    key = (route, ask.lane)
    admitting = memo.get(key)
    if admitting is None:
        admitting = memo[key] = _admitting(route, ask.lane, state, policy, now)
    if admitting:
        # rng None: the caller draws the Thompson sample itself (decide_batch, vectorised)
        chosen = thompson(admitting, state, now, rng) if rng is not None else admitting[0]
        return _new(Decision, (MOVE, chosen, f"moved from {route}: {why}", 0.0, False, delegated))
    if closed and _probe(route, b, state, policy, now, probed):
        return _new(Decision, (ADMIT, route, "probe", 0.0, True, delegated))
    return _new(Decision, (WAIT, route, f"{route} {why}; no admitting alternative", until, False, False))


def _probe(route: Route, b, state: AdmissionState, policy: Policy, now: Now, probed: set | None) -> bool:
    """Whether this unit may be the probe of `route`'s closed key now; marks it given in `probed`."""
    if not b.probe_due(now, policy.probe_interval(b.daily)):
        return False
    if probed is None:
        return True
    scope = probe_scope(state, route, now)
    if scope in probed:
        return False
    probed.add(scope)
    return True


def spent(ask: Ask, policy: Policy, now: Now) -> str | None:
    """Why a refused unit is tried no more (its lane's limit of refusals, or its deadline), or None."""
    most, deadline = policy.refusal_limit(ask.lane)
    if ask.refused >= most:
        return f"refused {ask.refused} time(s), the limit of lane {ask.lane!r}"
    if deadline is not None and now.mono - ask.submitted >= deadline:
        return f"still refused {now.mono - ask.submitted:.0f} s after its submit (lane {ask.lane!r}'s deadline {deadline:g} s)"
    return None


def _admitting(route: Route, lane, state: AdmissionState, policy: Policy, now: Now) -> tuple[Route, ...]:
    """The first group of the route's alternatives with a route that admits now; only those routes."""
    for group in policy.alternatives(route, lane):
        admitting = tuple(r for r in group if not bulkhead_of(state, r, now).held(now))
        if admitting:
            return admitting
    return ()


def decide_batch(asks: Sequence[Ask], state: AdmissionState, policy: Policy, now: Now, rng) -> list[Decision]:
    """Decide many units against one state, for throughput; the same rules as `decide`.

    Admission changes no other unit's admissibility (there is no cap), except that a
    probe is one unit per closed key: so one state serves the whole batch. What does not
    depend on the unit is worked out once per batch (`memo`), a plain admission on an
    open pool is shared by every later unit of that route, and the Thompson draws of
    every move are made at once with numpy (seeded from `rng`, so a seeded run repeats).
    """
    out = []
    append = out.append
    probed: set = set()
    memo: dict = {}
    open_admit: dict = {}  # route -> the Decision every undelegated unit of that open pool gets
    moves = []  # (index in out, admitting routes) of moves with a choice to draw
    for ask in asks:
        if ask.parent is None:
            hit = open_admit.get(ask.route)
            if hit is not None:
                append(hit)
                continue
        d = decide(ask, state, policy, now, None, probed=probed, memo=memo)
        if d.action == ADMIT:
            if not d.reason and not d.delegated:
                open_admit[ask.route] = d
        elif d.action == MOVE:
            admitting = memo[(ask.route, ask.lane)]
            if len(admitting) > 1:
                moves.append((len(out), admitting))
        append(d)
    if moves:
        _draw_moves(out, moves, state, now, rng)
    return out


def _draw_moves(out: list, moves: list, state: AdmissionState, now: Now, rng) -> None:
    import numpy as np

    params: dict = {}
    alpha, beta, discount = [], [], []
    for _i, admitting in moves:
        p = params.get(admitting)
        if p is None:
            p = params[admitting] = _thompson_params(admitting, state, now)
        for a, b, d in p:
            alpha.append(a)
            beta.append(b)
            discount.append(d)
    gen = np.random.default_rng(rng.getrandbits(64))
    scores = (gen.beta(alpha, beta) * np.asarray(discount)).tolist()
    at = 0
    for i, admitting in moves:
        n = len(admitting)
        best = max(range(at, at + n), key=scores.__getitem__)
        out[i] = out[i]._replace(route=admitting[best - at])
        at += n
