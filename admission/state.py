"""Bulkhead state and its pure transitions (reference 000 §1, §8, §9).

Theory of operation. One `Bulkhead` per pool a unit runs on, keyed by its `Route`
(model, provider, credential or None). A bulkhead is an immutable record; every
transition here takes (bulkhead or state, event, now) and returns a new one, so the
same rules run under a fake clock in tests and in the live pool.

Time comes as `Now(wall, mono)`: closures end at wall-clock times (the next UTC
midnight, or `closed_for` after the refusal) and survive a restart; backoffs, probe
pacing and waits use the monotonic clock, so a wall-clock step cannot shorten them.

Signals (what an outcome says about its pool):

* a clean round resets the consecutive-refusal count, counts a success and updates
  the mean seconds and cost; a clean *probe* on a closed pool reopens its closure;
* 429 (`RATE_LIMIT`) backs off that one pool: ``backoff_base * 2**(n-1)`` seconds for
  the n-th backoff in a row, capped at ``backoff_max``, never shorter than the
  provider's Retry-After; it closes nothing. The backoff runs from the instant the
  provider refused (`Signal.at`), not from when the refusal is heard: Retry-After
  counts from the provider's answer, and the result's way home (the worker, its
  ring, the loop) is no reason to keep the pool shut longer. A 429 the provider
  gave while the pool already backs off, for a round seated before the pool heard
  of that backoff, is the same burst's news (its refusals arrive together, some
  late): it neither lengthens the backoff nor counts as the next one in a row. A
  round seated after the pool heard of it (a delegated one) and refused starts the
  next one;
* a key's daily limit (a 403 that says so) closes until the next UTC midnight; no
  credit (402) or a rejected key (401/403) closes for ``closed_for``; the fleet's own
  daily budget (`BUDGET`) closes until midnight too, each from the refusal's instant.
  With the credential known only that credential's pools close; otherwise every pool
  of the provider;
* a stall or timeout changes no bulkhead (the unit only stops counting as running);
  any other error counts a failure.

A `Closure` is kept in the state beside the bulkheads, so that a pool first seen
after its provider (or key) closed is born closed (`bulkhead_of`), and so that the
closures can be saved and loaded across restarts (see `admission.pool`).

The estimate K̂ (``estimate``) is shown only, never consulted to admit: it grows by
one per clean round that ran at a load at or above it, and halves at a refusal;
``carrying`` is the load at which the pool last refused.
"""
from __future__ import annotations

import math
import re
from typing import NamedTuple

from admission.route import Route
from admission.vocab import ClosureCause

# --- refusal kinds and closure causes (the words: admission.vocab) ----------------------
RATE_LIMIT = ClosureCause.RATE_LIMIT
DAILY_LIMIT = ClosureCause.DAILY_LIMIT
CREDIT = ClosureCause.CREDIT
REJECTED_KEY = ClosureCause.REJECTED_KEY
BUDGET = ClosureCause.BUDGET
OPERATOR = ClosureCause.OPERATOR
CLOSING = (DAILY_LIMIT, CREDIT, REJECTED_KEY, BUDGET, OPERATOR)
#: causes whose closure ends at the next UTC midnight and probes at its own interval
DAILY_CAUSES = (DAILY_LIMIT, BUDGET)

# outcome signals
CLEAN = "clean"
REFUSED = "refused"
ERROR = "error"
STALL = "stall"  # a stall, a timeout or a round cap: changes no bulkhead

_DAILY_RE = re.compile(r"daily|per[ -]day|key limit", re.IGNORECASE)
DAY = 86_400.0


class Now(NamedTuple):
    """One reading of the admission clock: wall seconds (UTC epoch) and monotonic seconds."""

    wall: float
    mono: float


def next_utc_midnight(wall: float) -> float:
    """The first UTC midnight strictly after `wall` (epoch seconds)."""
    return (math.floor(wall / DAY) + 1) * DAY


def classify(status: int, message: str = "") -> str | None:
    """The refusal kind of an HTTP status (000 §8), or None when it is no refusal."""
    if status == 429:
        return RATE_LIMIT
    if status == 402:
        return CREDIT
    if status == 403:
        return DAILY_LIMIT if _DAILY_RE.search(message or "") else REJECTED_KEY
    if status == 401:
        return REJECTED_KEY
    return None


class Signal(NamedTuple):
    """What an outcome says about its pool: kind (CLEAN, REFUSED, ERROR, STALL) and details."""

    kind: str
    refusal: str | None = None  # a refusal kind when kind is REFUSED
    retry_after: float | None = None
    message: str = ""
    seconds: float | None = None  # how long the round ran (clean rounds)
    cost: float | None = None  # what it cost, in USD (clean rounds)
    #: the admission clock's mono instant the provider answered (refusals); None: when reported
    at: float | None = None

    @classmethod
    def clean(cls, seconds: float | None = None, cost: float | None = None) -> "Signal":
        return cls(CLEAN, seconds=seconds, cost=cost)

    @classmethod
    def refused(cls, status: int, message: str = "", retry_after: float | None = None,
                at: float | None = None) -> "Signal":
        """A provider refusal by HTTP status, given at mono instant `at` (None: now, when it is
        reported); a status that is no refusal is a plain ERROR."""
        kind = classify(status, message)
        if kind is None:
            return cls(ERROR, message=f"{status} {message}".strip())
        return cls(REFUSED, kind, retry_after, message or str(status), at=at)


class Closure(NamedTuple):
    """A closed provider (credential None) or key: until when (wall), why, daily limit or not."""

    provider: str
    credential: str | None
    until: float
    cause: str
    daily: bool
    since: float
    message: str = ""

    def covers(self, route: Route) -> bool:
        return route.provider == self.provider and (self.credential is None or route.credential == self.credential)

    @property
    def scope(self) -> tuple[str, str | None]:
        return (self.provider, self.credential)


class Bulkhead(NamedTuple):
    """The measured state of one pool. Immutable: transitions return a new one."""

    route: Route
    running: int = 0
    waiting: int = 0
    delegated: int = 0  # delegated units running now
    delegated_total: int = 0
    successes: int = 0
    failures: int = 0
    refusals: int = 0  # consecutive; a clean round resets it
    backoff_until: float = 0.0  # mono
    closed_until: float = 0.0  # wall
    cause: str | None = None  # of the closure
    daily: bool = False  # the closure is a daily limit (probed at its own interval)
    closed_at: float = 0.0  # wall
    probe_at: float = -math.inf  # mono time the last probe was let through
    probes: int = 0
    carrying: int = 0  # the load at which it last refused (0: never)
    refused_at: float = 0.0  # wall time of the last refusal
    why: str | None = None  # the last refusal's kind and message
    estimate: int = 1  # K̂, shown only
    mean_seconds: float = 0.0
    mean_cost: float = 0.0
    costed: int = 0  # clean rounds that reported a cost
    moved_in: int = 0  # units moved here from another pool
    strikes: int = 0  # backoffs in a row (a clean round resets): the backoff's exponent
    # mono time the pool heard of its current backoff: a round seated before then could not know of it
    backoff_at: float = -math.inf

    def closed(self, now: Now) -> bool:
        return self.closed_until > now.wall

    def held(self, now: Now) -> bool:
        """Held back by a live refusal: closed, or backing off."""
        return self.closed_until > now.wall or self.backoff_until > now.mono

    def probe_due(self, now: Now, interval: float) -> bool:
        """A closed pool lets one probe through every `interval` while nothing runs on it."""
        return self.running == 0 and now.mono >= self.probe_at + interval


class AdmissionState(NamedTuple):
    """Every bulkhead and every live closure. Immutable; see the transition functions."""

    bulkheads: dict  # Route -> Bulkhead
    closures: dict  # (provider, credential|None) -> Closure

    @classmethod
    def empty(cls) -> "AdmissionState":
        return cls({}, {})


# --- pure transitions ----------------------------------------------------------------------
def closure_of(state: AdmissionState, route: Route, now: Now) -> Closure | None:
    """The live closure that covers `route` and ends last, or None."""
    best = None
    for closure in state.closures.values():
        if closure.until > now.wall and closure.covers(route) and (best is None or closure.until > best.until):
            best = closure
    return best


def bulkhead_of(state: AdmissionState, route: Route, now: Now) -> Bulkhead:
    """The route's bulkhead; a pool first seen while its provider or key is closed is born closed."""
    b = state.bulkheads.get(route)
    if b is not None:
        return b
    closure = closure_of(state, route, now)
    if closure is None:
        return Bulkhead(route)
    # Its probe clock starts at birth: the key just refused, a probe now would only meet it again.
    return Bulkhead(route, closed_until=closure.until, cause=closure.cause, daily=closure.daily,
                    closed_at=closure.since, probe_at=now.mono)


def _put(state: AdmissionState, b: Bulkhead) -> AdmissionState:
    bulkheads = dict(state.bulkheads)
    bulkheads[b.route] = b
    return AdmissionState(bulkheads, state.closures)


# Field positions, for the hot transitions: one tuple built per event instead of a
# _replace per field (the live pool's admit + report round trip is a few µs).
_F = {name: i for i, name in enumerate(Bulkhead._fields)}
_RUNNING, _WAITING, _DELEGATED, _DELEGATED_TOTAL = _F["running"], _F["waiting"], _F["delegated"], _F["delegated_total"]
_SUCCESSES, _FAILURES, _REFUSALS, _PROBE_AT, _PROBES = (
    _F["successes"], _F["failures"], _F["refusals"], _F["probe_at"], _F["probes"])
_ESTIMATE, _MEAN_SECONDS, _MEAN_COST, _COSTED, _MOVED_IN, _STRIKES = (
    _F["estimate"], _F["mean_seconds"], _F["mean_cost"], _F["costed"], _F["moved_in"], _F["strikes"])
_new = tuple.__new__


def seated(b: Bulkhead, now: Now, probe: bool = False, delegated: bool = False, moved: bool = False) -> Bulkhead:
    """`b` after a unit is admitted to it and starts at once (`reserved`, then `running`)."""
    return running(reserved(b, now, probe, moved), delegated)


def reserved(b: Bulkhead, now: Now, probe: bool = False, moved: bool = False) -> Bulkhead:
    """`b` after a unit is admitted to it (a probe starts its pacing; a move from another
    pool is counted), before the unit runs."""
    if not (probe or moved):
        return b
    f = list(b)
    if probe:
        f[_PROBE_AT] = now.mono
        f[_PROBES] += 1
    if moved:
        f[_MOVED_IN] += 1
    return _new(Bulkhead, f)


def running(b: Bulkhead, delegated: bool = False) -> Bulkhead:
    """`b` once an admitted unit runs on it (a delegated one counts apart too)."""
    f = list(b)
    f[_RUNNING] += 1
    if delegated:
        f[_DELEGATED] += 1
        f[_DELEGATED_TOTAL] += 1
    return _new(Bulkhead, f)


def waited(b: Bulkhead, delta: int = 1) -> Bulkhead:
    """`b` with one more unit waiting for it (delta -1: one stopped waiting)."""
    f = list(b)
    f[_WAITING] = max(0, f[_WAITING] + delta)
    return _new(Bulkhead, f)


def ended(b: Bulkhead, signal: Signal, now: Now, policy, probe: bool = False,
          delegated: bool = False, started: float | None = None) -> tuple[Bulkhead, Closure | None, bool]:
    """A unit that ran on `b` ended with `signal`: (new bulkhead, closure it makes or None, reopen?).

    `started`: the mono time the unit started (None: unknown, taken as after any backoff).
    A refusal takes effect from its own instant (`refusal_instant`): its backoff, or its
    closure, runs from when the provider answered.

    `reopen` is True when a clean probe proved a closed pool's key works again; the
    closure (or reopening) is for the caller to apply to every pool it covers
    (`close`, `reopen`). `policy` supplies closed_for and the backoff.
    """
    load = b.running
    f = list(b)
    f[_RUNNING] = max(0, load - 1)
    if delegated:
        f[_DELEGATED] = max(0, f[_DELEGATED] - 1)
    kind = signal.kind
    if kind == CLEAN:
        n = f[_SUCCESSES] = f[_SUCCESSES] + 1
        f[_REFUSALS] = f[_STRIKES] = 0
        if load >= f[_ESTIMATE]:
            f[_ESTIMATE] += 1
        if signal.seconds is not None:
            f[_MEAN_SECONDS] += (signal.seconds - f[_MEAN_SECONDS]) / n
        if signal.cost is not None:
            c = f[_COSTED] = f[_COSTED] + 1
            f[_MEAN_COST] += (signal.cost - f[_MEAN_COST]) / c
        b = _new(Bulkhead, f)
        # a topped-up key does not wait for midnight
        return b, None, probe and b.closed_until > now.wall
    if kind == ERROR:
        f[_FAILURES] += 1
        return _new(Bulkhead, f), None, False
    if kind != REFUSED:
        return _new(Bulkhead, f), None, False  # a stall or a timeout holds nothing back
    at = refusal_instant(signal, now, started)
    refusals = b.refusals + 1
    b = _new(Bulkhead, f)._replace(
        failures=b.failures + 1, refusals=refusals, carrying=load, refused_at=at.wall,
        why=f"{signal.refusal}: {signal.message}".rstrip(": "), estimate=max(1, load // 2))
    if signal.refusal == RATE_LIMIT:
        if b.backoff_until > at.mono and started is not None and started <= b.backoff_at:
            return b, None, False  # the same burst: its backoff stands as it is
        strikes = b.strikes + 1
        delay = backoff_seconds(strikes, signal.retry_after, policy.backoff_base, policy.backoff_max)
        return b._replace(backoff_until=max(b.backoff_until, at.mono + delay), strikes=strikes,
                          backoff_at=now.mono), None, False
    return b, closure_for(b.route, signal.refusal, at, policy.closed_for, signal.message), False


def refusal_instant(signal: Signal, now: Now, started: float | None = None) -> Now:
    """When the provider gave `signal`'s refusal, as a clock reading: its `at`, kept between the
    unit's start and `now` (an answer comes neither before its request nor from the future);
    `now` when the signal does not say."""
    at = signal.at
    if at is None or at >= now.mono:
        return now
    if started is not None and at < started:
        at = started
    return _new(Now, (now.wall - (now.mono - at), at))


def seat(state: AdmissionState, route: Route, now: Now, *, probe: bool = False, delegated: bool = False,
         moved: bool = False) -> AdmissionState:
    """A unit starts on `route`; returns the new state (a probe starts its key's probe clock)."""
    state = _put(state, seated(bulkhead_of(state, route, now), now, probe, delegated, moved))
    return probed(state, route, now) if probe else state


def probe_scope(state: AdmissionState, route: Route, now: Now) -> tuple:
    """What one probe speaks for: the closed key (or provider) that holds `route`, else the route."""
    closure = closure_of(state, route, now)
    return route if closure is None else closure.scope


def probed(state: AdmissionState, route: Route, now: Now) -> AdmissionState:
    """A probe went out on `route`: every pool of the same closed key waits a full interval
    for its next one (one probe speaks for the key, not for one pool)."""
    closure = closure_of(state, route, now)
    if closure is None:
        return state
    bulkheads = dict(state.bulkheads)
    for r, b in bulkheads.items():
        if r != route and closure.covers(r) and b.probe_at < now.mono:
            bulkheads[r] = b._replace(probe_at=now.mono)
    return AdmissionState(bulkheads, state.closures)


def wait(state: AdmissionState, route: Route, now: Now, delta: int = 1) -> AdmissionState:
    """Count a unit waiting for `route` (delta -1: it stopped waiting without starting)."""
    return _put(state, waited(bulkhead_of(state, route, now), delta))


def backoff_seconds(strikes: int, retry_after: float | None, base: float, cap: float) -> float:
    """Exponential in the backoffs in a row, capped; never shorter than Retry-After."""
    delay = min(cap, base * 2.0 ** max(0, strikes - 1))
    return max(delay, retry_after or 0.0)


def closure_for(route: Route, refusal: str, now: Now, closed_for: float, message: str = "") -> Closure:
    """The closure a closing refusal on `route` makes: the key if known, else the provider."""
    daily = refusal in DAILY_CAUSES
    until = next_utc_midnight(now.wall) if daily else now.wall + closed_for
    return Closure(route.provider, route.credential, until, refusal, daily, now.wall, message)


def budget_closure(provider: str, spent: float, limit: float | None, now: Now) -> Closure | None:
    """The fleet's own daily budget for `provider`: read and shown, never reserved; reached, it
    closes the provider until the next UTC midnight (a daily closure). None while below it."""
    if limit is None or spent < limit:
        return None
    return Closure(provider, None, next_utc_midnight(now.wall), BUDGET, True, now.wall,
                   f"daily budget reached: {spent:g} of {limit:g}")


def next_change(state: AdmissionState, now: Now, policy, since: float = -math.inf) -> float | None:
    """The earliest monotonic time after `since` at which some pool may admit again (a backoff
    ends, a probe falls due, a closure ends), or None when there is none.

    `since`: when the caller last decided its waiting units. A hold that ended after that
    but at or before `now` is news they have not heard: its end (in the past) is returned,
    so one pool reopening while another still holds is not missed until the other's end.
    """
    times = []
    for b in state.bulkheads.values():
        if b.backoff_until > since:
            times.append(b.backoff_until)
        if b.closed_until > 0.0:
            ends = now.mono + (b.closed_until - now.wall)
            if ends > since:
                times.append(ends)
            if b.closed_until > now.wall and b.running == 0:
                times.append(max(now.mono, b.probe_at + policy.probe_interval(b.daily)))
    return min(times) if times else None


def close(state: AdmissionState, closure: Closure, now: Now) -> AdmissionState:
    """Record `closure` and close every known pool it covers (later pools are born closed).

    The first probe of each comes `probe_every` after the closure, not at once.
    """
    closures = dict(state.closures)
    held = closures.get(closure.scope)
    if held is not None and held.until > closure.until:
        closure = held  # a shorter closure never cuts a longer one of the same key short
    closures[closure.scope] = closure
    bulkheads = dict(state.bulkheads)
    for route, b in bulkheads.items():
        if closure.covers(route) and closure.until >= b.closed_until:
            bulkheads[route] = b._replace(closed_until=closure.until, cause=closure.cause, daily=closure.daily,
                                          closed_at=closure.since, probe_at=max(b.probe_at, now.mono))
    return AdmissionState(bulkheads, closures)


def reopen(state: AdmissionState, route: Route | None = None, *, scope: tuple | None = None,
           now: Now) -> AdmissionState:
    """Lift the closures that cover `route` (or the one of `scope`); pools keep any other live one."""
    closures = {k: c for k, c in state.closures.items()
                if c.until > now.wall and not (c.scope == scope if route is None else c.covers(route))}
    bulkheads = dict(state.bulkheads)
    for r, b in bulkheads.items():
        if b.closed_until > 0:
            rest = [c for c in closures.values() if c.covers(r)]
            if rest:
                last = max(rest, key=lambda c: c.until)
                bulkheads[r] = b._replace(closed_until=last.until, cause=last.cause, daily=last.daily,
                                          closed_at=last.since)
            else:
                bulkheads[r] = b._replace(closed_until=0.0, cause=None, daily=False, closed_at=0.0)
    return AdmissionState(bulkheads, closures)


def report(state: AdmissionState, route: Route, signal: Signal, now: Now, policy, *, probe: bool = False,
           delegated: bool = False) -> AdmissionState:
    """A unit that ran on `route` ended with `signal`; returns the new state (see `ended`)."""
    b, closure, reopens = ended(bulkhead_of(state, route, now), signal, now, policy, probe, delegated)
    state = _put(state, b)
    if closure is not None:
        state = close(state, closure, now)
    if reopens:
        state = reopen(state, route, now=now)
    return state


def prune(state: AdmissionState, now: Now) -> AdmissionState:
    """Drop closures that have ended (bulkheads read their own end time and need nothing)."""
    if all(c.until > now.wall for c in state.closures.values()):
        return state
    return AdmissionState(state.bulkheads, {k: c for k, c in state.closures.items() if c.until > now.wall})
