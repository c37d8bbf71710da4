"""Replay a trace against a real fleet and the local provider, once per mode.

For each profile the trace asks for, one named, embedded `fleet.Fleet` boots (so
`fleetctl status --name NAME` reads its table during the replay) with:

* one I/O-bound role per role of the trace's provider rounds, whose ``async def``
  handler (`fleet.burst.handlers.chat`) calls the simulator over HTTP;
* one role per role of its CPU arrivals (`fleet.burst.handlers.burn`), pinned by key
  when the arrivals carry keys.

Then, for each mode, against a fresh simulator state, `Driver.run` releases every
arrival at its scaled offset (after the arrivals it names in ``after`` have ended) and:

* ``none``: submits it at once; a refusal is a failed round;
* ``cap``: submits it when its pool has fewer than ``cap`` rounds of this replay in
  flight (the usual client-side semaphore), else queues it in arrival order;
* ``admission``: submits it through the fleet's own provider admission
  (``fleet.submit(..., route=fleet.Route(...), lane=, severity=, parent=)``): the fleet
  starts it now on its own route or a declared alternative (the handler calls
  ``unit.route``), or holds it until its pool may admit again. The fleet's admission
  runs on the replay clock (``admission_clock``), so its backoffs, 35-minute closures,
  10 s probes and UTC midnight scale with ``--speed``. Waits, moves and probes are the
  fleet's: the driver reads them back from the simulator (which pool each round
  reached) and from ``Fleet.status()["admission"]`` (probes, moves, and every closure
  it made, from its ``closure_history``: those lifted before the end too).

In the ``none`` and ``cap`` modes a round that meets a refusal ends there (it is the refusal
the modes are compared on); in the ``admission`` mode the fleet's admission holds a refused
round and admits it again (000 §8), so it ends refused only past its lane's limit, and the
refusals it met are the simulator's counts. A round's ``age`` (what it waited since its
arrival for the rounds it comes ``after``) goes with it.
Rounds still waiting at the trace's horizon are *cut*. Every round ends in exactly one
of: ok, 429, 402, 403, failed (another outcome) or cut; the fleet's ledger is checked
against the units submitted (`ModeResult.ledger_check`).

One thread does the scheduling: it sleeps on the completion queue until the next
arrival's instant (spinning the last stretch, see `urgent_threads`), so completions and
arrivals never race. Every deadline is an
absolute instant of the replay clock, so a late wake-up never shifts the arrivals after
it. Each arrival's lag goes into the report: the real milliseconds from when it was due
to when the driver handed it to its mode (called ``fleet.submit`` for it, or queued it
behind the cap); arrivals due at the same instant are handed over in
one pass, in trace order.

While a mode runs the cyclic garbage collector is off (`quiet_gc`): with the fleet,
numba and the trace in one heap, a full collection took 150–200 ms on this host, which
stopped the driver mid-burst (measured with ``gc.callbacks``). Young garbage is still
collected when the driver has a gap of `GC_GAP_S` before its next deadline, and a full
collection runs once the mode ends. The driver thread, and the fleet's threads that share
its GIL, run in the real-time scheduling class when the host allows it (`urgent_threads`),
and the provider simulator in a process of its own (`simulator_process`), so neither the
fleet's workers nor the simulator's request handling delay an arrival.
"""
from __future__ import annotations

import collections
import contextlib
import gc
import os
import queue
import threading
import time

from admission.records import field, record
import fleet

from fleet.burst.clock import ReplayClock
from fleet.burst.trace import Arrival, Header, Route, Trace

SPIN_S = 0.0015  # the last stretch before an arrival is polled, not slept (timer slack)
START_LEAD_S = 0.05  # trace time 0 is this far ahead of the start, so setting up costs no arrival lag
IDLE_BLOCK_S = 1.0  # past the horizon: how long one wait for a completion blocks
RT_PRIORITY = 1  # the lowest real-time priority: above every normal thread, below the kernel's own
RT_SPIN_S = 0.0001
GC_GAP_S = 0.02  # a young-generation collection (~1 ms) only runs when the next deadline is this far
IO_SLOTS_MAX = 1024
ROLE_QUEUE_BOUND = 1 << 20

OK, CUT, FAILED = "ok", "cut", "failed"


class FleetFailed(Exception):
    """The fleet could not boot or lost units during the replay."""


@record(frozen=False)
class Round:
    """One arrival's life in one mode (trace seconds)."""

    index: int
    arrival: Arrival
    released: float | None = None
    ready: float | None = None  # released and every arrival it comes `after` has ended
    submitted: float | None = None
    started: float | None = None
    ended: float | None = None
    route: Route | None = None  # the route it ran on (an alternative when moved)
    status: str | None = None  # ok | 429 | 402 | 403 | failed | cut
    reason: str | None = None
    moved: bool = False
    probe: bool = False
    tries: list = field(default_factory=list)  # [(pool, status)] of each request the provider saw from it
    outcomes: int = 0  # futures resolved for it: exactly one if submitted
    future: object = None  # the fleet's future while it is submitted (the admission mode cuts waiting ones)
    unit_id: int | None = None  # the fleet's unit id (its delegated rounds name it as their parent)

    @property
    def pool(self) -> str | None:
        return None if self.route is None else self.route.pool

    def to_json(self) -> dict:
        a = self.arrival
        return {"id": a.id, "lane": a.lane, "role": a.role, "t": a.t, "cycle": a.cycle, "pool": self.pool,
                "released": self.released, "ready": self.ready, "submitted": self.submitted, "started": self.started,
                "ended": self.ended, "status": self.status, "reason": self.reason, "moved": self.moved,
                "probe": self.probe, "tries": [list(t) for t in self.tries]}


@record(frozen=False)
class ModeResult:
    mode: str
    profile: str
    rounds: list[Round]
    lag_ms: list[float]
    wall_s: float
    ledger_before: dict
    ledger_after: dict
    simulator: dict
    events: list
    key_closures: dict
    admission_closures: list = field(default_factory=list)
    submitted: int = 0
    driver_class: str = "normal"
    probes: int | None = None  # the admission mode: probes the fleet's admission let through (its bulkheads)
    admission_moved: int | None = None  # the admission mode: units the fleet's admission moved (its own count)
    delegated: int | None = None  # the admission mode: units its admission started as delegated (named a parent)

    def ledger_check(self) -> dict:
        """Exactly one outcome per submitted unit, from the fleet's own ledger and the futures."""
        d = {k: self.ledger_after[k] - self.ledger_before[k] for k in ("submitted", "solved", "suppressed", "failed")}
        ended = d["solved"] + d["suppressed"] + d["failed"]
        multi = [r.arrival.id for r in self.rounds if r.outcomes > 1]
        missing = [r.arrival.id for r in self.rounds if r.submitted is not None and r.outcomes != 1]
        unended = [r.arrival.id for r in self.rounds if r.status is None]
        exact = (d["submitted"] == self.submitted and ended == self.submitted and not multi and not missing
                 and not unended and self.ledger_after["inflight"] == self.ledger_before["inflight"])
        return {"exact": exact, "submitted_by_replay": self.submitted, "ledger": d, "duplicates": multi,
                "missing": missing, "unended": unended}


def fleet_config(trace: Trace, name: str, profile: str) -> dict:
    """The embedded fleet a trace runs on (see the module docstring)."""
    roles: dict = {}
    io_roles = collections.Counter(a.role for a in trace.arrivals if a.route is not None)
    cpu = [a for a in trace.arrivals if a.route is None]
    keys: dict = collections.defaultdict(set)
    for a in cpu:
        if a.key is not None:
            keys[a.role].add(a.key)
    for role, n in io_roles.items():
        roles[role] = {"kind": "pooled", "handler": "fleet.burst.handlers:chat", "io_bound": True,
                       "slots": max(1, min(IO_SLOTS_MAX, n)), "peak_cpus": 0, "queue_bound": ROLE_QUEUE_BOUND}
    for role in dict.fromkeys(a.role for a in cpu):
        if role in roles:
            raise FleetFailed(f"role {role!r} has both provider rounds and CPU arrivals; give them different roles")
        if keys.get(role):
            roles[role] = {"kind": "pinned", "handler": "fleet.burst.handlers:burn", "slots": len(keys[role]),
                           "queue_bound": ROLE_QUEUE_BOUND, "peak_cpus": 1}
        else:
            roles[role] = {"kind": "pooled", "handler": "fleet.burst.handlers:burn", "slots": 2,
                           "queue_bound": ROLE_QUEUE_BOUND, "peak_cpus": 1}
    # One declared core per CPU role is the tool's own choice, not the trace's: a host
    # with fewer runs them as a small host does (serial), not refused.
    config = {"fleet": {"name": name, "profile": profile}, "roles": roles, "budget": {"oversubscribe": True}}
    if io_roles:
        config["admission"] = policy_dict(trace.header)
    return config


def policy_dict(header: Header) -> dict:
    """The replay fleet's ``[admission]`` section a trace header declares: the catalog of its pools
    with their residency marks, their alternatives, its lanes and its admission timings."""
    providers: dict = {}
    alternatives: dict = {}
    for pool in header.pools:
        marks = {"residency": pool.residency} if pool.residency else {}
        providers.setdefault(pool.provider, {"models": {}})["models"][pool.model] = marks
        if pool.alternatives:
            alternatives.setdefault(pool.model, [])
            for model, provider in pool.alternatives:
                entry = f"{model}@{provider}"
                if entry not in alternatives[pool.model]:
                    alternatives[pool.model].append(entry)
    out = dict(header.raw.get("admission", {}))
    out.update({"providers": providers, "alternatives": alternatives, "lanes": dict(header.lanes)})
    return out


class Driver:
    """Runs one mode of one trace on a running fleet and simulator. Not reusable: one `run`."""

    def __init__(self, trace: Trace, fleet, simulator, clock: ReplayClock, mode: str, *, cap: int | None = None,
                 progress=None, realtime: bool = True):
        self.trace, self.fleet, self.sim, self.clock, self.mode = trace, fleet, simulator, clock, mode
        self.cap = cap
        self.realtime = realtime  # try the real-time class for this process's threads while it runs
        self.admission = mode == "admission"  # rounds go through the fleet's provider admission
        self.progress = progress
        self.rounds = [Round(i, a) for i, a in enumerate(trace.arrivals)]
        self.by_id = {r.arrival.id: r for r in self.rounds}
        self.children = collections.defaultdict(list)  # id -> rounds whose `after` names it
        self.blockers = {}
        for r in self.rounds:
            need = {x for x in r.arrival.after}
            self.blockers[r.index] = need
            for x in need:
                self.children[x].append(r)
        self.done_q: queue.SimpleQueue = queue.SimpleQueue()
        self.in_flight = collections.Counter()  # pool -> rounds of this replay in flight (cap mode)
        self.cap_waits: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self.open = len(self.rounds)
        self.submitted = 0
        self.lag_ms: list[float] = []
        self._cutting = False
        self._wall = 0.0
        self._spin = SPIN_S
        self.driver_class = "normal"  # the scheduling class the driver thread ran in (urgent_threads)

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> ModeResult:
        ledger_before = self.fleet.ledger()
        with quiet_gc(), urgent_threads(self.realtime) as self._spin:
            self.driver_class = "realtime" if self._spin == RT_SPIN_S else "normal"
            self.clock.start(time.monotonic() + START_LEAD_S)
            self.sim.reset()  # after the clock: a simulator process takes the clock's new origin
            self._loop()
        wall = self._wall
        # every resolved future has arrived; the ledger settles right after its futures
        deadline = time.monotonic() + 30
        ledger_after = self.fleet.ledger()
        while ledger_after["inflight"] != ledger_before["inflight"] and time.monotonic() < deadline:
            time.sleep(0.01)
            ledger_after = self.fleet.ledger()
        result = ModeResult(self.mode, "", self.rounds, self.lag_ms, wall, ledger_before, ledger_after,
                            self.sim.counts(), self.sim.events(), self.sim.key_closures(), [], self.submitted,
                            self.driver_class)
        for round_id, tries in self.sim.calls().items():
            if round_id in self.by_id:
                self.by_id[round_id].tries = tries
        if self.admission:
            self._read_admission(result)
        return result

    def _read_admission(self, result: ModeResult) -> None:
        """What the fleet's admission did, read back: the pool each round reached (the simulator's
        own record: a move shows as another pool), probes and moves (the admission's bulkheads and
        count), every closure it made (its census keeps them, lifted and ended ones too)."""
        header = self.trace.header
        for r in self.rounds:
            asked = r.arrival.route
            reached = r.tries[-1][0] if r.tries else None
            if asked is None or reached is None:
                continue
            if reached != asked.pool:
                pool = header.pool(reached)
                r.route, r.moved = Route(pool.model, pool.provider, None), True
        census = self.fleet.status()["admission"]
        result.probes = sum(b["probes"] for b in census["bulkheads"])
        result.admission_moved = census["moved"]
        result.delegated = sum(b["delegated_total"] for b in census["bulkheads"])
        result.admission_closures = list(census["closure_history"])

    def _loop(self) -> None:
        clock = self.clock
        t_wall0 = clock.t0
        pending = collections.deque(self.rounds)
        horizon = self.trace.horizon_s
        cut = False
        while self.open:
            now_real = time.monotonic()
            while pending and clock.real_at(pending[0].arrival.t) <= now_real:
                r = pending.popleft()
                self.lag_ms.append((time.monotonic() - clock.real_at(r.arrival.t)) * 1000.0)
                r.released = clock.mono()
                if not self.blockers[r.index]:
                    self._arrive(r)
                now_real = time.monotonic()
            self._drain()
            if not self.open:
                break
            if not cut and clock.mono() >= horizon:
                cut = True
                self._cut(pending)
                continue
            # past the horizon only completions are left: nothing to be on time for
            deadline = None if cut else clock.real_at(horizon)
            if pending:
                deadline = clock.real_at(pending[0].arrival.t) if deadline is None else min(
                    deadline, clock.real_at(pending[0].arrival.t))
            if deadline is None:
                self._block(IDLE_BLOCK_S)
                continue
            wait = deadline - time.monotonic()
            if wait > GC_GAP_S and gc.get_count()[0] >= gc.get_threshold()[0]:
                gc.collect(1)
                wait = deadline - time.monotonic()
            if wait > self._spin:
                self._block(wait - self._spin)
            elif wait > 0 and not pending:
                self._block(wait)
            # else: spin (loop again) through the last stretch before an arrival
        self._wall = time.monotonic() - t_wall0

    def _block(self, seconds: float) -> None:
        try:  # at most IDLE_BLOCK_S: the loop looks again (a slow trace's gaps outlast what a timer takes)
            item = self.done_q.get(timeout=min(seconds, IDLE_BLOCK_S))
        except queue.Empty:
            return
        self._complete(*item)

    def _drain(self) -> None:
        while True:
            try:
                item = self.done_q.get_nowait()
            except queue.Empty:
                return
            self._complete(*item)

    # --- arrivals ----------------------------------------------------------------------------
    def _arrive(self, r: Round) -> None:
        a = r.arrival
        r.ready = self.clock.mono()
        if a.route is None:
            self._submit(r, None)
        elif self.mode == "none":
            self._submit(r, a.route)
        elif self.mode == "cap":
            pool = a.route.pool
            if self.in_flight[pool] < self._cap_of(pool):
                self.in_flight[pool] += 1
                self._submit(r, a.route)
            else:
                self.cap_waits[pool].append(r)
        else:
            self._submit(r, a.route)

    def _cap_of(self, pool: str) -> int:
        return self.cap if self.cap is not None else self.trace.header.pool(pool).k

    def _submit(self, r: Round, route: Route | None) -> None:
        a = r.arrival
        r.route = route
        submitted = self.clock.mono()
        admission = {}
        if route is None:
            payload = {"id": a.id, "cpu_ms": a.cpu_ms, "wait_ms": a.wait_ms}
        else:
            payload = {"id": a.id, "base": self.sim.base_url, "latency_s": a.latency_s}
            if self.admission:  # the fleet's admission chooses; the handler calls unit.route
                # A delegated round names its parent's unit only while that one is in the fleet: a
                # parent must be running (a round that comes `after` its parent is no delegation).
                up = self.by_id[a.parent] if a.parent is not None else None
                parent = up.unit_id if up is not None and up.submitted is not None and up.status is None else None
                # its age: what it waited since its arrival (for the rounds it comes `after`), on the
                # admission's own clock, so the lane's aging sees it as the trace does
                admission = {"route": fleet.Route(route.model, route.provider, route.credential),
                             "severity": a.severity, "parent": parent, "age": max(0.0, submitted - r.released)}
            else:
                payload.update(model=route.model, provider=route.provider, credential=route.credential)
        try:
            future = self.fleet.submit(a.role, payload, key=a.key, lane=a.lane, **admission)
        except Exception as exc:  # refused at submit: nothing queued, the round ends here
            self._end(r, FAILED, f"submit refused: {type(exc).__name__}: {exc}")
            return
        r.submitted = submitted
        r.future, r.unit_id = future, future.unit_id
        self.submitted += 1
        future.add_done_callback(lambda f, r=r: self.done_q.put((r, f)))

    # --- completions -------------------------------------------------------------------------
    def _complete(self, r: Round, future) -> None:
        r.outcomes += 1
        if r.outcomes > 1:
            return  # counted by the ledger check
        clock = self.clock
        exc = None if future.cancelled() else future.exception()
        if future.cancelled():  # cut at the horizon while the fleet's admission held it
            r.ended = clock.mono()
            status, reason = CUT, "waiting at the horizon"
        elif exc is None:
            value = future.result()
            r.started, r.ended = clock.trace_of(value["started"]), clock.trace_of(value["ended"])
            status = OK
            reason = None
        else:
            original = getattr(exc, "original", None)
            r.ended = clock.mono()
            if isinstance(original, fleet.Refused):
                # a refusal comes back at once: its start is its end, to within one HTTP round trip
                r.started = r.ended
                status, reason = str(original.status), original.message
            else:
                status = FAILED
                outcome = getattr(exc, "outcome", None)
                reason = outcome.reason if outcome is not None else type(exc).__name__
        r.future = None
        if r.route is not None and self.mode == "cap":
            pool = r.route.pool
            self.in_flight[pool] -= 1
            waits = self.cap_waits[pool]
            if waits:
                nxt = waits.popleft()
                self.in_flight[pool] += 1
                self._submit(nxt, nxt.arrival.route)
        self._end(r, status, reason)

    def _end(self, r: Round, status: str, reason: str | None) -> None:
        r.status, r.reason = status, reason
        if r.ended is None:
            r.ended = self.clock.mono()
        self.open -= 1
        if self.progress is not None:
            self.progress.update(1)
        for child in self.children.get(r.arrival.id, ()):
            need = self.blockers[child.index]
            need.discard(r.arrival.id)
            if not need and child.released is not None and child.status is None and not self._cutting:
                self._arrive(child)

    def _cut(self, pending) -> None:
        """The horizon: rounds not yet submitted end as cut (those in flight still finish); in the
        admission mode, rounds the fleet still holds are cancelled and end cut when their future says so."""
        self._cutting = True
        for r in self.rounds:
            if r.status is None and r.submitted is None:
                self._end(r, CUT, "waiting at the horizon")
            elif self.admission and r.status is None and r.future is not None:
                r.future.cancel()  # False once it started: it finishes
        pending.clear()
        for waits in self.cap_waits.values():
            waits.clear()


@contextlib.contextmanager
def quiet_gc():
    """No automatic collection while a mode runs (see the module docstring); a full one after."""
    was = gc.isenabled()
    gc.collect()
    gc.freeze()  # what lives now (fleet, trace, rounds) is never scanned again during the run
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was:
            gc.enable()
        gc.collect()


@contextlib.contextmanager
def urgent_threads(enabled: bool = True):
    """Every thread of this process in the real-time class while a mode runs, when the host
    allows it (root); the driver is the thread that calls this.

    Yields the margin to spin before a deadline: `RT_SPIN_S` in the real-time class (it wakes
    on time), else `SPIN_S`. On a host whose cores the fleet's own workers (and whatever else
    runs there) keep busy, a normal thread waits for a core for milliseconds at a time, and a
    lower nice value does not help across the kernel's autogroups; a real-time thread that
    sleeps until each deadline gets a core when it wakes and costs no CPU while it waits.
    The other threads (the embedded fleet's supervisor loop above all) go real-time too:
    they take the GIL, and one that holds it while it waits for a core stalls the driver
    just the same (measured: lag p99 0.2-2.4 ms with the driver alone real-time, 0.002-0.015
    ms with every thread). Threads started meanwhile are normal (reset-on-fork)."""
    if not enabled:  # the operator asked for the normal class (fleet-burst replay --no-realtime)
        yield SPIN_S
        return
    me = threading.get_native_id()
    others = [t.native_id for t in threading.enumerate() if t.native_id not in (None, me) and t.is_alive()]
    changed = []
    try:
        for tid in [me] + others:
            try:
                before = os.sched_getscheduler(tid), os.sched_getparam(tid)
                # reset-on-fork: a thread or process started from here (a progress bar's monitor) is normal
                os.sched_setscheduler(tid, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(RT_PRIORITY))
            except (OSError, AttributeError):
                if tid == me:  # not permitted: normal class, spin the last stretch
                    break
                continue  # a thread that just ended
            changed.append((tid, before))
        yield RT_SPIN_S if changed and changed[0][0] == me else SPIN_S
    finally:
        for tid, (policy, param) in changed:
            try:
                os.sched_setscheduler(tid, policy, param)
            except OSError:
                pass  # it ended meanwhile


def replay_name() -> str:
    """A fleet name for this replay, unique per process."""
    return f"burst-{os.getpid()}"
