"""The live provider admission: admit units, take their outcome signals, answer coordinators.

Theory of operation. `AdmissionPool` owns one `AdmissionState` (admission.state) and
replaces it through the pure transitions; every decision is `admission.scheduler.decide`.
It adds what needs memory of units:

* **seats**: which unit runs on which route (a probe? delegated? moved?), so that
  `report(unit, signal)` lands on the pool the unit really ran on;
* **waits**: units told to wait keep their ask; `wake()` re-decides them lane by lane
  in urgency order and returns those that start now;
* **lanes**: running / waiting / delegated / moved / spent per lane x bulkhead, for
  the census (reference 000 §10);
* **closures on disk**: every change of the closures is saved through a
  `ClosureStore` (a JSON file written atomically by default; the host-group store can
  stand in later through the same two methods), and loaded at start — a restarted
  process must not re-spend a key it knows is spent.

Time comes from a clock object with ``wall()`` (UTC epoch seconds: closures, midnight)
and ``mono()`` (monotonic seconds: backoffs, probes, waits). `ManualClock` is stepped by
hand (tests, replays); `ScaledClock` runs a day in minutes for a replay. A clock tied to
the host's monotonic clock also has ``mono_of(t)``: its own reading at host instant `t`
(``time.monotonic()``, the same in every process of the host), so a refusal a worker
met at `t` backs its pool off from `t` (`signal_for`, `instant_on`), not from when the
outcome reached the pool. A clock without it (a ManualClock) places every refusal at
the moment it is reported.

Not thread-safe by design: one owner (the supervisor's loop) calls it; others post
to that loop (DESIGN §8).
"""
from __future__ import annotations

import collections
import json
import logging
import math
import os
import random
import time
from typing import NamedTuple, Protocol, Sequence

from admission import scheduler as S
from admission import state as T
from admission.errors import FleetError, Refused
from admission.policy import Policy, PolicyHolder
from admission.route import Route
from admission.vocab import BulkheadState

log = logging.getLogger("admission")
#: closures the census lists in its history, the last ones made, learned or loaded
CLOSURE_HISTORY = 256
_new = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)


# --- clocks ---------------------------------------------------------------------------------
class SystemClock:
    """The host's clocks: time.time for wall, time.monotonic for intervals."""

    wall = staticmethod(time.time)
    mono = staticmethod(time.monotonic)

    @staticmethod
    def mono_of(host_mono: float) -> float:
        """Its mono reading at host monotonic instant `host_mono`: the same number."""
        return host_mono


class ManualClock:
    """A clock that moves only when told (`advance`, `set_wall`); wall and mono move together."""

    def __init__(self, wall: float = 0.0, mono: float = 0.0):
        self._wall, self._mono = float(wall), float(mono)

    def wall(self) -> float:
        return self._wall

    def mono(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not run backwards")
        self._wall += seconds
        self._mono += seconds


class ScaledClock:
    """Real time sped up `scale` times from `start_wall` (a replay of a day in minutes)."""

    def __init__(self, scale: float, start_wall: float | None = None):
        if not scale > 0:
            raise ValueError(f"scale must be > 0, not {scale!r}")
        self.scale = float(scale)
        self._t0 = time.monotonic()
        self._w0 = time.time() if start_wall is None else float(start_wall)

    def mono(self) -> float:
        return (time.monotonic() - self._t0) * self.scale

    def mono_of(self, host_mono: float) -> float:
        """Its mono reading at host monotonic instant `host_mono`."""
        return (host_mono - self._t0) * self.scale

    def wall(self) -> float:
        return self._w0 + self.mono()


# --- closures on disk --------------------------------------------------------------------------
class ClosureStore(Protocol):
    """Where closures outlive the process. The host-group store implements the same two calls."""

    def load(self) -> list[T.Closure]: ...

    def save(self, closures: Sequence[T.Closure]) -> None: ...


class ClosureFileError(FleetError):
    """The closure state file cannot be read as one."""


class FileClosureStore:
    """Closures as a small JSON file, replaced atomically (temp file, fsync, rename, fsync dir)."""

    VERSION = 1

    def __init__(self, path: str):
        self.path = os.fspath(path)

    def load(self) -> list[T.Closure]:
        try:
            with open(self.path, "rb") as f:
                data = json.load(f)
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise ClosureFileError(f"closure file {self.path}: {exc}") from None
        try:
            if data["version"] != self.VERSION:
                raise ClosureFileError(f"closure file {self.path}: version {data['version']!r}, expected {self.VERSION}")
            closures = [T.Closure(str(c["provider"]), c["credential"], float(c["until"]), str(c["cause"]),
                                  bool(c["daily"]), float(c["since"]), str(c.get("message", "")))
                        for c in data["closures"]]
            for c in closures:
                if not math.isfinite(c.until):
                    raise ValueError(f"closure of {c.provider!r} has no finite end: {c.until!r}")
            return closures
        except (KeyError, TypeError, ValueError) as exc:
            raise ClosureFileError(f"closure file {self.path}: bad record ({exc!r})") from None

    def save(self, closures: Sequence[T.Closure]) -> None:
        blob = json.dumps({"version": self.VERSION, "closures": [c._asdict() for c in closures]},
                          sort_keys=True, indent=1).encode()
        folder = os.path.dirname(os.path.abspath(self.path))
        import tempfile  # here: a fleet's boot imports this module, and tempfile brings shutil's archivers

        fd, tmp = tempfile.mkstemp(prefix=".closures.", dir=folder)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, blob)
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(tmp, self.path)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        dfd = os.open(folder, os.O_DIRECTORY)
        try:
            os.fsync(dfd)  # the rename itself is durable
        finally:
            os.close(dfd)


# --- the pool -----------------------------------------------------------------------------------
class UnknownUnit(FleetError, KeyError):
    """A report or cancel for a unit the admission does not hold."""


class BadAsk(FleetError, ValueError):
    """An admit whose arguments cannot be decided (not a Route, an unknown severity, a reused id)."""


class _Seat(NamedTuple):
    route: Route
    ask: S.Ask  # what was asked (a refused unit is decided again from it)
    probe: bool
    delegated: bool
    started: float | None  # mono; None: admitted, not running yet (a pool whose caller says when it starts)


class _LaneRow:
    __slots__ = ("running", "delegated", "delegated_total", "moved_in", "spent", "spent_day", "started", "refused")

    def __init__(self):
        self.running = self.delegated = self.delegated_total = self.moved_in = self.started = self.refused = 0
        self.spent = 0.0  # USD spent today (UTC) by the lane's clean rounds on this pool
        self.spent_day = 0

    def spend(self, cost: float, wall: float) -> None:
        day = int(wall // T.DAY)
        if day != self.spent_day:
            self.spent, self.spent_day = 0.0, day
        self.spent += cost


class AdmissionPool:
    """The live admission of one process. See the module docstring."""

    def __init__(self, policy: Policy | PolicyHolder | None = None, *, clock=None, rng=None,
                 store: ClosureStore | None = None, starts_on_admit: bool = True):
        """`starts_on_admit`: a unit runs as soon as it is admitted. False for a caller whose
        admitted units may still wait (for a slot, a lease): it says when each one runs
        (`start`), and a unit counts as running on its pool only from then."""
        self.starts_on_admit = starts_on_admit
        self.holder = policy if isinstance(policy, PolicyHolder) else PolicyHolder(policy)
        self.clock = clock if clock is not None else SystemClock()
        self.rng = rng if rng is not None else random.Random()
        self.store = store
        self.state = T.AdmissionState.empty()
        self._seats: dict[int, _Seat] = {}
        self._waits: dict[int, S.Ask] = {}  # unit id -> ask (insertion order = arrival)
        self._why: dict[int, S.Decision] = {}  # unit id -> its last WAIT decision
        self._lanes: dict[tuple, _LaneRow] = {}  # (lane, route) -> counters
        self._budget: dict[str, tuple] = {}  # provider -> (spent, limit, wall time of the reading)
        self.load_error: str | None = None
        # When `wake` last decided the waiting units, under which policy, and whether a
        # change no clock tells of (a closure lifted) has come since: what `next_wake` reads.
        self._woke_at = -math.inf
        self._woke_under = self.holder.current
        self._lifted = False
        # every closure made, learned or loaded, oldest first, its end moved to a lift (the census)
        self._history: collections.deque = collections.deque(maxlen=CLOSURE_HISTORY)
        self._history_of: dict[tuple, dict] = {}  # scope -> the history entry of its live closure
        if store is not None:
            self._load()

    # --- time and policy --------------------------------------------------------------------
    def now(self) -> T.Now:
        return _new(T.Now, (self.clock.wall(), self.clock.mono()))

    @property
    def policy(self) -> Policy:
        return self.holder.current

    # --- admission ---------------------------------------------------------------------------
    def admit(self, unit: int, route: Route, *, lane: str | None = None, severity: str | None = None,
              pinned: bool = False, parent: int | None = None, tag: str | None = None,
              age: float = 0.0, checked: Policy | None = None) -> S.Decision:
        """Decide unit `unit` for `route`: it starts now (ADMIT / MOVE, seated) or waits (kept for `wake`).

        A delegated unit (`parent` given) counts on its parent's lane. The parent must be a
        unit this admission holds a seat for (`holds`): any other is BadAsk, and nothing
        is kept or counted.
        `age`: seconds the unit has waited already (elsewhere, or before a restart): its
        urgency and starvation count from then. `checked`: the policy `check` returned for
        this very ask; while it is still the current one (no reload since) and the lane
        stands, the ask is not checked again.
        """
        seats = self._seats
        if unit in seats or unit in self._waits:
            raise BadAsk(f"unit {unit} is already admitted or waiting")
        own_lane = lane
        if parent is not None:
            seat = seats.get(parent) if type(parent) is int else None
            if seat is None:
                raise BadAsk(f"unit {unit}: parent {parent!r} holds no seat in this admission: "
                             "only an admitted unit delegates")
            lane = seat.ask.lane
        policy = self.holder.current
        if checked is not policy or lane != own_lane:
            try:
                check_ask(policy, route, lane, severity)
            except BadAsk as exc:
                raise BadAsk(f"unit {unit}: {exc}") from None
        now = self.now()
        ask = _new(S.Ask, (unit, route, lane, severity, bool(pinned), parent, tag, now.mono - age, now.mono, 0))
        return self._decide(ask, now)

    def _decide(self, ask: S.Ask, now: T.Now) -> S.Decision:
        """Decide `ask` (new or refused): seat it, or keep it waiting."""
        policy = self.holder.current
        decision = S.decide(ask, self.state, policy, now, self.rng)
        if decision.probe and self._waits:
            # Units that waited for this key come first: the next wake gives one of them the probe.
            scope = T.probe_scope(self.state, decision.route, now)
            if any(T.probe_scope(self.state, a.route, now) == scope for a in self._waits.values()):
                decision = S.decide(ask, self.state, policy, now, self.rng, probed={scope})
        if decision.action != S.WAIT:
            self._seat(ask, decision, now)
        else:
            if not self._waits:  # every waiting unit has been decided since now
                self._woke_at, self._woke_under, self._lifted = now.mono, policy, False
            self._waits[ask.id] = ask
            self._why[ask.id] = decision
            self._put(T.waited(T.bulkhead_of(self.state, ask.route, now), 1))
        return decision

    def holds(self, unit: int) -> bool:
        """Whether `unit` holds a seat here (admitted, running or about to): a parent that may delegate."""
        return unit in self._seats

    def check(self, route: Route, *, lane: str | None = None, severity: str | None = None) -> Policy:
        """Raise BadAsk for what `admit` would refuse in this ask on its face (route type,
        catalog, the lane's required marks, severity), against the current policy;
        it changes nothing. Returns that policy: `admit(..., checked=it)` checks the ask
        again only if the policy changed since. A delegated unit's lane is its parent's:
        `admit` checks that one."""
        policy = self.holder.current
        check_ask(policy, route, lane, severity)
        return policy

    def _put(self, b: T.Bulkhead) -> None:
        # The pool owns its state's dicts: the pure transitions made `b`, the pool files it in place.
        self.state.bulkheads[b.route] = b

    def _seat(self, ask: S.Ask, decision: S.Decision, now: T.Now) -> None:
        route = decision.route
        moved = decision.action == S.MOVE
        b = self.state.bulkheads.get(route) or T.bulkhead_of(self.state, route, now)
        self._put(T.reserved(b, now, decision.probe, moved))
        if decision.probe:
            self.state = T.probed(self.state, route, now)
        self._seats[ask.id] = _new(_Seat, (route, ask, decision.probe, decision.delegated, None))
        row = self._lanes.get((ask.lane, route)) or self._lane(ask.lane, route)
        if moved:
            row.moved_in += 1
        if self.starts_on_admit:
            self._run(ask.id, now)

    def start(self, unit: int) -> None:
        """Admitted unit `unit` runs now: from here it counts as running on its pool (and its
        round's time counts from now). A unit already running is left as it is."""
        seat = self._seats.get(unit)
        if seat is None:
            raise UnknownUnit(f"unit {unit} is not admitted")
        if seat.started is None:
            self._run(unit, self.now())

    def _run(self, unit: int, now: T.Now) -> None:
        route, ask, probe, delegated, _started = self._seats[unit]
        self._seats[unit] = _new(_Seat, (route, ask, probe, delegated, now.mono))
        b = self.state.bulkheads.get(route) or T.bulkhead_of(self.state, route, now)
        self._put(T.running(b, delegated))
        row = self._lanes[(ask.lane, route)]
        row.running += 1
        row.started += 1
        if delegated:
            row.delegated += 1
            row.delegated_total += 1

    def withdraw(self, unit: int) -> None:
        """Forget an admitted unit that never ran (cancelled, stopped before its slot): no
        signal, as its pool never saw it."""
        seat = self._seats.get(unit)
        if seat is None or seat.started is not None:
            raise UnknownUnit(f"unit {unit} is not admitted and waiting to run")
        del self._seats[unit]

    def _lane(self, lane, route) -> _LaneRow:
        row = self._lanes.get((lane, route))
        if row is None:
            row = self._lanes[(lane, route)] = _LaneRow()
        return row

    def report(self, unit: int, signal: T.Signal, *, again: bool = False) -> S.Decision | None:
        """Unit `unit` ended with `signal` (see `signal_for`); its bulkhead takes the signal.

        `again`: a refusal does not end the unit. Within its lane's limit (`scheduler.spent`)
        it is decided again from what it asked, as a unit that waited since its submit:
        the decision is returned (seated, or kept waiting for `wake`); past the limit, or
        for any other signal, None (the unit ends here)."""
        seat = self._seats.get(unit)
        if seat is None or seat.started is None:
            raise UnknownUnit(f"unit {unit} is not running under the admission")
        del self._seats[unit]
        route, ask, probe, delegated, started = seat
        lane = ask.lane
        now = self.now()
        if signal.kind == T.CLEAN and signal.seconds is None:
            signal = _new(T.Signal, (T.CLEAN, None, None, "", now.mono - started, signal.cost, None))
        b = self.state.bulkheads.get(route) or T.bulkhead_of(self.state, route, now)
        b, closure, reopens = T.ended(b, signal, now, self.holder.current, probe, delegated, started)
        self._put(b)
        row = self._lanes[(lane, route)]
        row.running -= 1
        if delegated:
            row.delegated -= 1
        if signal.kind == T.REFUSED:
            row.refused += 1
        if signal.cost:
            row.spend(signal.cost, now.wall)
        if closure is not None:
            self._close(closure, now)
        lifted = self._reopen(now, route) if reopens else ()
        if closure is not None or reopens:
            self._save(lifted)
        if again and signal.kind == T.REFUSED:
            ask = ask._replace(refused=ask.refused + 1)
            if S.spent(ask, self.holder.current, now) is None:
                return self._decide(ask, now)
        return None

    def spent(self) -> list[tuple[int, str]]:
        """Refused units waiting past their refusal deadline, forgotten here: (unit, why), for
        the caller to fail (a unit never refused waits as long as its pool holds it)."""
        now = self.now()
        policy = self.holder.current
        out = []
        for ask in [a for a in self._waits.values() if a.refused]:
            why = S.spent(ask, policy, now)
            if why is not None:
                self.cancel(ask.id)
                out.append((ask.id, why))
        return out

    def cancel(self, unit: int) -> None:
        """Forget a waiting unit (cancelled, or its fleet shut down) without starting it."""
        ask = self._waits.pop(unit, None)
        if ask is None:
            raise UnknownUnit(f"unit {unit} is not waiting under the admission")
        self._why.pop(unit, None)
        self._put(T.waited(T.bulkhead_of(self.state, ask.route, self.now()), -1))

    def wake(self) -> list[tuple[int, S.Decision]]:
        """Re-decide every waiting unit, lane by lane, most urgent first; seat and return those that start."""
        if not self._waits:
            return []
        now = self.now()
        self._prune(now)
        policy = self.policy
        self._woke_at, self._woke_under, self._lifted = now.mono, policy, False
        lanes: dict = {}
        for ask in self._waits.values():
            lanes.setdefault(ask.lane, []).append(ask)
        started = []
        probed: set = set()
        memo: dict = {}  # seating changes no pool's hold, so one memo serves the whole wake
        for asks in lanes.values():
            for ask in S.order(asks, policy, now):
                decision = S.decide(ask, self.state, policy, now, self.rng, probed=probed, memo=memo)
                if decision.starts:
                    del self._waits[ask.id]
                    self._why.pop(ask.id, None)
                    self._put(T.waited(T.bulkhead_of(self.state, ask.route, now), -1))
                    self._seat(ask, decision, now)
                    started.append((ask.id, decision))
                else:
                    self._why[ask.id] = decision
        return started

    def waiting(self, unit: int) -> S.Decision | None:
        """The last WAIT decision of a waiting unit (its reason and until-when), else None."""
        return self._why.get(unit)

    def refusals(self, unit: int) -> int:
        """How many refusals a waiting or seated unit has met so far (0 for an unknown one)."""
        ask = self._waits.get(unit)
        if ask is None:
            seat = self._seats.get(unit)
            ask = None if seat is None else seat.ask
        return 0 if ask is None else ask.refused

    # --- coordinator API ------------------------------------------------------------------------
    def plan(self, lane: str | None, route: Route, wanted: int, *, pinned: bool = False) -> int:
        """How many of `wanted` new units on `route` in `lane` would start now. Seats nothing.

        All of them unless a live refusal holds the pool: then all if an alternative
        admits (and the lane is not pinned), one if a probe is due, else none.
        """
        if wanted <= 0:
            return 0
        now = self.now()
        ask = S.Ask(-1, route, lane, None, pinned, None, None, now.mono)
        first = S.decide(ask, self.state, self.policy, now, random.Random(0))
        if not first.starts:
            return 0
        if not first.probe:
            return wanted
        # a probe is one unit: the rest decide as if it were seated
        rest = S.decide(ask, T.seat(self.state, route, now, probe=True), self.policy, now, random.Random(0))
        return 1 + (wanted - 1 if rest.starts else 0)

    def lane_routes(self, lane: str | None) -> set[Route]:
        """The routes the lane's work asks for (its waiting units' and its seats')."""
        routes = {a.route for a in self._waits.values() if a.lane == lane}
        routes |= {s.route for s in self._seats.values() if s.ask.lane == lane}
        return routes

    def allowance(self, lane: str | None) -> int | None:
        """None (start everything) unless every route the lane's work asks for is held back
        by a live refusal with no admitting alternative: then 0."""
        routes = self.lane_routes(lane)
        if not routes:
            return None
        return 0 if all(self.plan(lane, r, 1) == 0 for r in routes) else None

    def starving(self) -> list[dict]:
        """Closed providers (or keys) with work waiting first, then pinned waits past starved_after."""
        now = self.now()
        out = []
        for closure in sorted(self.state.closures.values(), key=lambda c: (c.provider, c.credential or "")):
            if closure.until <= now.wall:
                continue
            n = sum(1 for a in self._waits.values() if closure.covers(a.route))
            if n:
                out.append({"kind": "provider-closed", "provider": closure.provider, "credential": closure.credential,
                            "cause": closure.cause, "daily": closure.daily, "until": closure.until, "waiting": n})
        policy = self.policy
        pinned = [a for a in self._waits.values()
                  if policy.is_pinned(a.lane, a.tag, a.pinned) and now.mono - a.since > policy.starved_after]
        for a in sorted(pinned, key=lambda a: a.since):
            out.append({"kind": "pinned", "unit": a.id, "route": str(a.route), "lane": a.lane,
                        "waiting_s": now.mono - a.since, "why": self._why[a.id].reason})
        return out

    def next_wake(self) -> float | None:
        """When `wake` may start something (a monotonic time of the clock), None if no unit waits.

        A hold that ended since the last wake (a backoff's end while another pool still
        backs off), a closure lifted, or a new policy make it now: the waiting units have
        not been decided since. Units that wait while nothing holds any pool back any more
        may start now too: then it is the clock's now, never None.
        """
        if not self._waits:
            return None
        now = self.now()
        if self._lifted or self._woke_under is not self.holder.current:
            return now.mono
        at = T.next_change(self.state, now, self.holder.current, since=self._woke_at)
        deadlines = [d for d in (self._deadline(a) for a in self._waits.values() if a.refused) if d is not None]
        if deadlines:
            at = min(deadlines) if at is None else min(at, *deadlines)
        return now.mono if at is None else max(at, now.mono)

    def _deadline(self, ask: S.Ask) -> float | None:
        """When a refused unit's refusal deadline passes (mono), or None without one."""
        deadline = self.holder.current.refusal_limit(ask.lane)[1]
        return None if deadline is None else ask.submitted + deadline

    def report_budget(self, provider: str, spent: float, limit: float | None) -> None:
        """The budget gate's reading for `provider` today (shown per bulkhead); at the limit it closes
        the provider until the next UTC midnight."""
        now = self.now()
        self._budget[provider] = (float(spent), None if limit is None else float(limit), now.wall)
        closure = T.budget_closure(provider, spent, limit, now)
        if closure is not None and not any(c.cause == T.BUDGET and c.until >= closure.until
                                           for c in self.state.closures.values() if c.scope == closure.scope):
            self._close(closure, now)
            self._save()

    # --- operator ------------------------------------------------------------------------------
    def close(self, provider: str, credential: str | None = None, *, until: float, cause: str = T.OPERATOR,
              message: str = "") -> None:
        """Close a provider (or one key) until `until` (wall seconds): an operator, or the budget gate."""
        now = self.now()
        if isinstance(until, bool) or not isinstance(until, (int, float)) or not math.isfinite(until):
            # a closure without an end would never reopen, and the host-group store refuses it
            raise ValueError(f"close: until must be a finite UTC time in epoch seconds, not {until!r}")
        if not until > now.wall:
            raise ValueError(f"close: until {until!r} is not in the future")
        if cause not in T.CLOSING:
            raise ValueError(f"close: cause must be one of {', '.join(T.CLOSING)}, not {cause!r}")
        closure = T.Closure(provider, credential, float(until), cause, cause in T.DAILY_CAUSES, now.wall, message)
        self._close(closure, now)
        self._save()

    def reopen(self, provider: str, credential: str | None = None) -> bool:
        """Lift the closure of a provider (credential None) or one key; True if there was one."""
        scope = (provider, credential)
        had = scope in self.state.closures
        self._save(self._reopen(self.now(), scope=scope) or [scope])
        return had

    def learn(self, closures: Sequence[T.Closure]) -> int:
        """Take closures another process met (the host-group store's reading); how many were new.

        A closure counts when it is still in force and no known closure of its scope
        lasts as long: a reading never shortens what this pool knows, and one that
        says nothing new changes nothing (not even the bulkheads' published rows)."""
        now = self.now()
        learned = 0
        for closure in closures:
            known = self.state.closures.get(closure.scope)
            if closure.until <= now.wall or (known is not None and known.until >= closure.until):
                continue
            self._close(closure, now)
            learned += 1
        return learned

    # --- read model ------------------------------------------------------------------------------
    def read_model(self) -> dict:
        """What a coordinator reads (reference 000 §10): rows per bulkhead and per lane x bulkhead,
        the closures and the starving list.

        Per bulkhead (`bulkhead_row`): state, estimate and carrying capacity, `slow_start`
        and `free` (shown only, never consulted to admit), exhausted and why, running,
        waiting, delegated, successes, failures, means, closure and budget. Per lane x
        bulkhead: running, waiting, delegated, moved in, refused, spent today, the oldest
        waiting unit's wait (`oldest_waiting_since`, UTC epoch seconds, and its age
        `oldest_waiting_s`), and `guaranteed` 0, `borrowed` 0 and `bound` None: there is no
        share, the columns stay so that a reader written for a share model still reads.
        """
        return self.census()

    def census(self) -> dict:
        """The read model (`read_model`): rows per bulkhead and per lane x bulkhead, the
        closures and the starving list (000 §10)."""
        now = self.now()
        oldest: dict = {}
        waiting_by_lane: dict = {}
        for a in self._waits.values():
            key = (a.lane, a.route)
            waiting_by_lane[key] = waiting_by_lane.get(key, 0) + 1
            oldest[key] = min(oldest.get(key, a.since), a.since)
        bulkheads = [bulkhead_row(b, now, self._budget.get(b.route.provider)) for b in self.state.bulkheads.values()]
        pinned = self._pinned_waits(now)
        for row in bulkheads:
            row["pinned_wait"] = pinned.get(row["pool"])
        lanes = []
        for key in sorted(set(self._lanes) | set(waiting_by_lane), key=lambda k: (k[0] or "", str(k[1]))):
            lane, route = key
            row = self._lanes.get(key) or _LaneRow()
            since = oldest.get(key)
            lanes.append({
                "lane": lane, "pool": str(route), "running": row.running, "waiting": waiting_by_lane.get(key, 0),
                "delegated": row.delegated, "delegated_total": row.delegated_total, "moved_in": row.moved_in,
                "started": row.started, "refused": row.refused,
                "spent_today": row.spent if row.spent_day == int(now.wall // T.DAY) else 0.0,
                "oldest_waiting_s": None if since is None else now.mono - since,
                "oldest_waiting_since": None if since is None else now.wall - (now.mono - since),
                # no share: nothing is guaranteed, lent or bounded (the columns stay for readers)
                "guaranteed": 0, "borrowed": 0, "bound": None,
            })
        return {
            "bulkheads": bulkheads, "lanes": lanes,
            "closures": [c._asdict() for c in self.state.closures.values() if c.until > now.wall],
            "closure_history": [dict(c) for c in self._history],
            "starving": self.starving(), "policy_error": self.holder.last_error,
            "closure_store_error": self.load_error,
        }

    def _pinned_waits(self, now: T.Now) -> dict[str, str]:
        """Per pool, what its hard-pinned waiting units wait for (000 §6: "hard-pinned to …" on its row)."""
        policy = self.holder.current
        waits: dict = {}
        for a in self._waits.values():
            if policy.is_pinned(a.lane, a.tag, a.pinned):
                waits.setdefault(a.route, []).append(now.mono - a.since)
        out = {}
        for route, ages in waits.items():
            why = self._why_held(route, now)
            out[str(route)] = (f"hard-pinned to {route}: {len(ages)} unit(s) waiting, the longest {max(ages):.0f} s"
                               + (f"; {why}" if why else ""))
        return out

    def _why_held(self, route: Route, now: T.Now) -> str:
        return S.hold_of(T.bulkhead_of(self.state, route, now), now)[0]

    # --- persistence ------------------------------------------------------------------------------
    def _load(self) -> None:
        try:
            closures = self.store.load()
        except FleetError as exc:
            # Start without them, loudly: refusing to start would stop every lane for a file.
            self.load_error = str(exc)
            log.error("admission: %s; starting with no known closures", exc)
            return
        now = self.now()
        for closure in closures:
            if closure.until > now.wall:
                self._close(closure, now)

    def _close(self, closure: T.Closure, now: T.Now) -> None:
        """Apply `closure` and keep it in the history; one that renews a live closure of its
        scope (a refused probe) goes on as that one's entry."""
        before = self.state.closures.get(closure.scope)
        self.state = T.close(self.state, closure, now)
        kept = self.state.closures[closure.scope]
        entry = self._history_of.get(kept.scope)
        if entry is not None and before is not None and before.until > now.wall:
            entry.update(until=kept.until, cause=kept.cause, daily=kept.daily, message=kept.message)
            return
        entry = self._history_of[kept.scope] = {**kept._asdict(), "lifted": False}
        self._history.append(entry)

    def _reopen(self, now: T.Now, route: Route | None = None, *, scope: tuple | None = None) -> list[tuple]:
        """Lift the closures covering `route` (or the one of `scope`); the scopes lifted early,
        whose history entries now end here."""
        before = self.state.closures
        self.state = T.reopen(self.state, route, scope=scope, now=now)
        self._lifted = True
        lifted = [k for k, c in before.items() if c.until > now.wall and k not in self.state.closures]
        for k in lifted:
            entry = self._history_of.pop(k, None)
            if entry is not None:
                entry.update(until=now.wall, lifted=True)
        return lifted

    def _prune(self, now: T.Now) -> None:
        pruned = T.prune(self.state, now)
        if pruned is not self.state:
            self.state = pruned
            self._save()

    def _save(self, lifted: Sequence[tuple] = ()) -> None:
        """Save the closures; `lifted`: scopes reopened early (an operator, a clean probe),
        which a shared store must hear of explicitly (it never drops a closure a save omits)."""
        if self.store is None:
            return
        try:
            reopen = getattr(self.store, "reopen", None)
            if reopen is not None:
                for provider, credential in lifted:
                    reopen(provider, credential)
            self.store.save(list(self.state.closures.values()))
        except OSError as exc:
            log.error("admission: cannot save closures: %s", exc)


def bulkhead_row(b: T.Bulkhead, now: T.Now, budget: tuple | None = None) -> dict:
    """One bulkhead as a census row (what `fleetctl status` and `Fleet.status()` show).

    `budget`: the provider's last budget reading (spent, limit, wall time), shown only.
    """
    spent, limit, budget_at = budget or (None, None, None)
    closed = b.closed_until > now.wall
    backoff = b.backoff_until > now.mono
    return {
        "pool": str(b.route), "model": b.route.model, "provider": b.route.provider, "credential": b.route.credential,
        "state": BulkheadState.CLOSED if closed else BulkheadState.BACKOFF if backoff else BulkheadState.OPEN,
        "estimate": b.estimate, "carrying_capacity": b.carrying, "exhausted": closed or backoff,
        # shown only, never consulted to admit: still growing from its seed (it never refused),
        # and the estimate's room left over what runs now
        "slow_start": b.carrying == 0, "free": max(0, b.estimate - b.running),
        "exhausted_at": b.refused_at or None, "why": b.why,
        "running": b.running, "waiting": b.waiting, "delegated": b.delegated, "delegated_total": b.delegated_total,
        "successes": b.successes, "failures": b.failures, "refusals": b.refusals,
        "backoff_until": (now.wall + b.backoff_until - now.mono) if backoff else None,
        "closed_until": b.closed_until if closed else None, "cause": b.cause if closed else None,
        "closed_by_daily_limit": b.daily and closed, "probes": b.probes, "moved_in": b.moved_in,
        "mean_seconds": b.mean_seconds, "mean_cost": b.mean_cost,
        "budget_spent": spent, "budget_limit": limit, "budget_at": budget_at,
    }


def signal_for(error: BaseException | None = None, *, cost: float | None = None,
               seconds: float | None = None, clock=None) -> T.Signal:
    """The signal of a unit's end: None -> clean; fleet.Refused -> its refusal; a timeout -> stall; else error.

    `clock`: the admission's clock, which places a refusal at the host instant it was met
    (``Refused.at``, see `instant_on`); without it the refusal counts from its report."""
    if error is None:
        return T.Signal.clean(seconds, cost)
    if isinstance(error, Refused):
        return T.Signal.refused(error.status, error.message, error.retry_after, instant_on(clock, error.at))
    if isinstance(error, TimeoutError):
        return T.Signal(T.STALL)
    return T.Signal(T.ERROR, message=type(error).__name__)


def instant_on(clock, host_mono: float | None) -> float | None:
    """Host monotonic instant `host_mono` read on the admission `clock` (its ``mono_of``), or None
    when there is no instant or the clock is not tied to the host's (a ManualClock)."""
    if host_mono is None:
        return None
    mono_of = getattr(clock, "mono_of", None)
    return None if mono_of is None else mono_of(host_mono)


__all__ = [
    "AdmissionPool", "BadAsk", "ClosureFileError", "ClosureStore", "FileClosureStore", "ManualClock",
    "ScaledClock", "SystemClock", "UnknownUnit", "bulkhead_row", "instant_on", "signal_for",
]


def check_ask(policy: Policy, route, lane: str | None, severity: str | None) -> None:
    """The refusals of an ask on its face, against `policy` (the one rule `admit` and `check` share)."""
    if type(route) is not Route:
        raise BadAsk(f"route must be a fleet.Route, not {type(route).__name__}")
    if policy.nodes and (route.model, route.provider) not in policy.nodes:
        raise BadAsk(f"route {route} is not in the declared catalog")
    if lane in policy.lanes:
        broken = policy.breaks_lane(route, lane)
        if broken is not None:
            raise BadAsk(broken)
    if severity is not None and severity not in policy.severity:
        raise BadAsk(f"unknown severity {severity!r}; known: {', '.join(policy.severity)}")
