"""The provider gate: units with a route start only when the provider admission lets them.

The supervisor's side of the provider admission (reference 000; the rules are in the
`admission` package), and the first of the loop's gates (`fleet.runtime.gates`: the
host-group lease is the other). A unit submitted with ``route=fleet.Route(model,
provider, credential)`` is checked on its face on the caller's thread (`check`, once:
the loop's `admit` checks it again only if a reload changed the catalog since), then
asks the gate's `admission.AdmissionPool` before it reaches the dispatcher:

* **admit** -> the unit goes on now (GO), on its own route or on the alternative
  admission moved it to; the chosen route travels with its task and the handler sees
  it as ``unit.route`` (the worker builds the `fleet.Unit` with it). It counts as
  running on its pool only once it runs (`started`: its slot granted), not while it
  still waits for a lease or a slot;
* **wait** -> the gate keeps the unit (HELD), with its reason and until-when
  (`waiting`); the loop calls `tick` each turn and the gate re-decides its waiting
  units when the pool may admit again (`due`: a backoff ends, a probe falls due, a
  closure ends — or at once when nothing holds them any more);
* at the unit's **outcome** (`ended`), the pool takes the signal it says: a clean
  round (with the cost the handler reported through ``fleet.report_cost``), a
  provider refusal (the handler raised ``fleet.Refused``: 429 backs the pool off,
  402/403 close the key or provider, each from the instant the worker met it,
  ``Refused.at``, read on the admission's clock), a handler error (a failure), or nothing at all
  for a stall, a timeout, a lane death, a shutdown or a cancel — none of those is the
  provider's answer;
* a **refused** unit is not lost (000 §8): within its lane's limit (``max_refusals``,
  ``refusal_deadline``) `ended` hands it back, decided again — it starts at once on
  an alternative that admits it, or waits here with the refusal's reason and end
  until its pool admits again. It fails ``Refused`` only past that limit (`spent`:
  a deadline that passes while it waits). The handler runs once per admission.

Bulkheads are published into the shared table (fleet.shm.table.bulkheads) after they
change, at most every `PUBLISH_EVERY_S`, and on every posture sample, so
`fleetctl status` reads them with no round trip.

One owner. The pool is not thread-safe: every method here is called on the supervisor's
loop thread, but `check`, which a caller's thread asks and which reads only the current
(immutable) policy. The cancel hook of a waiting unit's future only posts the unit id
to a queue the loop's tick drains.

The catalog is read again at each sample when its file changed (`refresh_catalog`:
the config file the fleet booted from; 000 §7 reads it every sweep): a file that does
not load costs nothing but a logged error, and the last good catalog runs on. The
provider's daily budget reading comes in through `report_budget` (`Fleet.report_budget`,
the ``admission_budget`` control op): shown per bulkhead; at the limit it closes the
provider until the next UTC midnight.

Closures outlive the process in a small JSON file (`admission.pool.FileClosureStore`):
``[admission] closure_file``, or for fleetd `default_closure_file` (its state
directory). A restarted fleet is born with the closures it knew. With a ``[store]``
(the host group's), closures live there instead, shared by every fleet of the group
(`admission.store.closures.SyncedClosures`: written and read on its own thread, so the
supervisor never waits on the database; readings are merged at each sample).
"""
from __future__ import annotations

import logging
import math
import os
import queue
import time
from collections.abc import Mapping
from pathlib import Path

from admission import scheduler as S
from admission import state as T
from admission.policy import Policy, PolicyHolder
from admission.pool import (
    AdmissionPool,
    BadAsk,
    FileClosureStore,
    SystemClock,
    bulkhead_row,
    signal_for,
)

from fleet.rules.errors import FleetError
from fleet.rules.outcomes import FAILED, SOLVED, SUPPRESSED
from fleet.rules.vocab import BulkheadState, Reason
from admission.route import Route
from fleet.rules.unit import BadUnit, Outcome
from fleet.worker import codec
from fleet.runtime.gates import GO, HELD, Ticked
from fleet.shm import messages as M

log = logging.getLogger(__name__)

#: Bulkheads that changed are written to the table at most this often (and at each sample).
PUBLISH_EVERY_S = 0.05
#: How often the host group's store is read for closures other fleets met.
CLOSURES_EVERY_S = 2.0
#: Outcomes that say nothing about the provider: no bulkhead changes (000 §8: a stall,
#: a timeout or a cap holds nothing back; a lane death is not a refusal).
SILENT_REASONS = frozenset({Reason.TIMEOUT, Reason.LANE_DEATH, Reason.SHUTDOWN, Reason.CANCELLED, Reason.FSM_REFUSED,
                            Reason.LEASE_EXPIRED, Reason.LEASE_DENIED, Reason.LEASE_PREEMPTED, Reason.ROLE_STOPPED,
                            Reason.RESULT_ERROR})


def default_closure_file(name: str, env: Mapping[str, str] | None = None, *, euid: int | None = None) -> Path:
    """Where fleetd keeps fleet `name`'s closures when the config names no file.

    ``$STATE_DIRECTORY`` (systemd's ``StateDirectory=fleet``: /var/lib/fleet), else
    /var/lib/fleet for root, else ``$XDG_STATE_HOME/fleet`` (~/.local/state/fleet);
    the file is ``<name>.closures.json``.
    """
    env = os.environ if env is None else env
    euid = os.geteuid() if euid is None else euid
    systemd_dir = env.get("STATE_DIRECTORY", "").split(":")[0]
    if systemd_dir:
        folder = Path(systemd_dir)
    elif euid == 0:
        folder = Path("/var/lib/fleet")
    else:
        folder = Path(env.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "fleet"
    return folder / f"{name}.closures.json"


class ProviderGate:
    """Owns the fleet's `AdmissionPool` on the supervisor's side; a gate of its loop
    (`fleet.runtime.gates`). See the module doc.

    Args:
        config: `fleet.runtime.config.AdmissionConfig` (the declared policy).
        clock: the admission clock (``wall()``, ``mono()``; admission.pool's System/
            Manual/Scaled clocks). Tests and replays pass a fake or scaled one.
        rng: a ``random.Random`` for Thompson sampling (seeded: reproducible).
        closure_file: where closures are kept across restarts (None: nowhere).
        table: the fleet's `SlotTable`, whose bulkhead records the gate writes.
        holds_slot: ``f(unit_id)``: whether that unit holds a slot now (a delegating parent must).
    """

    #: Its waits may outlast the fleet (a closure until midnight): a closing fleet drops them.
    queue_like = False
    waits_for = "provider admission"

    def __init__(self, config, *, clock=None, rng=None, closure_file: str | os.PathLike | None = None, table=None,
                 shared_store: tuple[str, str] | None = None, catalog_file: str | None = None,
                 holds_slot=lambda unit_id: True):
        clock = clock if clock is not None else SystemClock()
        store = None
        self._shared = None
        if shared_store is not None:
            # The host group's store replaces the file: every fleet of the group learns a
            # spent key from the first 403 any of them met (read every CLOSURES_EVERY_S).
            from admission.store import closure_store
            from admission.store.closures import SyncedClosures

            url, actor = shared_store
            store = self._shared = SyncedClosures(lambda: closure_store(url, actor, clock=clock.wall),
                                                  every_s=CLOSURES_EVERY_S)
            closure_file = None
        elif closure_file is not None:
            Path(closure_file).parent.mkdir(parents=True, exist_ok=True)
            store = FileClosureStore(os.fspath(closure_file))
        self.holder = PolicyHolder(config.policy if config.policy is not None else Policy())
        self.section = config.section
        self.pool = AdmissionPool(self.holder, clock=clock, rng=rng, store=store, starts_on_admit=False)
        self.clock = self.pool.clock
        self.closure_file = None if closure_file is None else os.fspath(closure_file)
        self.closure_store = "host-group store" if shared_store is not None else self.closure_file
        self._writer = None
        if table is not None:
            from fleet.shm.table.bulkheads import BulkheadWriter

            self._writer = BulkheadWriter(table)
        self._holds_slot = holds_slot
        self._waiting: dict[int, object] = {}  # unit id -> the loop's unit, waiting here
        self._admitted: set[int] = set()  # admitted, not running yet (waiting for a lease or a slot)
        self._running: set[int] = set()  # units the pool counts as running, until their outcome
        self._refused: dict[int, object] = {}  # refused unit waiting again -> the last fleet.Refused it met
        self._cancelled: queue.SimpleQueue = queue.SimpleQueue()
        self._dirty = True
        self._published_at = -math.inf
        self.moved = 0  # units that started on an alternative
        # the config file it booted from (a fleet built from a dict has none to watch)
        self.catalog_file = catalog_file if catalog_file and os.path.isfile(catalog_file) else None
        self._catalog_seen = _file_stamp(catalog_file)  # what the boot read

    # ------------------------------------------------------------------ the caller's thread
    def check(self, route, *, lane=None, severity=None, pinned=False, parent=None, tag=None, age=0.0):
        """Raise BadUnit for a submit `admit` would refuse on its face; changes nothing.

        It reads only the current (immutable) policy, so a caller's thread may ask it
        before the unit is posted to the loop. Returns that policy: the unit carries it
        as ``ask["checked"]``, and `admit` checks it again only if a reload changed it."""
        _check_types(route, pinned, parent, tag, age)
        try:
            return self.pool.check(route, lane=lane, severity=severity)
        except BadAsk as exc:
            raise BadUnit(str(exc)) from None

    # ------------------------------------------------------------------ the gate (the loop)
    def lets_through(self, role: int) -> bool:
        return True  # only a unit with a route asks: a role's units without one pass at once

    def admit(self, unit) -> str:
        """Decide a new unit (its ``route`` and ``ask``, as `submit` checked them): GO, on
        its route or an alternative; HELD, waiting here until `tick` lets it go.

        Raises BadUnit (nothing kept) when a reload since the caller's check took the
        route out of the catalog (or the lane's required marks now exclude it).
        """
        route = unit.route
        if route is None:
            return GO
        ask, unit.ask = unit.ask, None
        unit_id, parent = unit.unit_id, ask["parent"]
        if parent is not None and not (self._holds_slot(parent) and self.pool.holds(parent)):
            # 000 §9 licenses a delegated unit only for a parent holding a seat here (a slot,
            # and a seat of the admission). The caller's check found it owed; one still
            # queued, ended since, or calling no provider delegates nothing: its child is
            # admitted as any unit is (never an orphan future).
            parent = None
        try:
            decision = self.pool.admit(unit_id, route, lane=ask["lane"], severity=ask["severity"],
                                       pinned=ask["pinned"], parent=parent, tag=ask["tag"], age=float(ask["age"]),
                                       checked=ask["checked"])
        except BadAsk as exc:
            raise BadUnit(str(exc).replace(f"unit {unit_id}: ", "", 1)) from None
        self._dirty = True
        if decision.starts:
            self._admit(unit, decision)
            return GO
        self._waiting[unit_id] = unit
        cancelled = self._cancelled  # hear of its cancel (from any thread: it only posts the id)
        unit.future.add_done_callback(lambda f: cancelled.put(unit_id) if f.cancelled() else None)
        return HELD

    def _admit(self, unit, decision: S.Decision) -> None:
        """`unit` goes on, admitted on the decision's route: the route travels with its task."""
        unit_id = unit.unit_id
        self._admitted.add(unit_id)
        body = codec.split_route(unit.body)[1] if unit.flags & M.F_ROUTED else unit.body  # a refused unit's last route
        unit.body = codec.with_route(body, decision.route)
        unit.flags |= M.F_ROUTED
        if decision.action == S.MOVE:
            self.moved += 1
            log.info("unit %d %s", unit_id, decision.reason.replace("moved from", f"moved to {decision.route} from", 1))

    def started(self, unit) -> None:
        """`unit` runs now: from here its pool counts it as running."""
        unit_id = unit.unit_id
        if unit_id in self._admitted:
            self._admitted.discard(unit_id)
            self._running.add(unit_id)
            self.pool.start(unit_id)
            self._dirty = True

    def tick(self) -> Ticked | None:
        """Units held here: cancelled ones are forgotten, spent ones end Refused, due ones
        go on; bulkheads published."""
        if not self.has_work():
            return None
        forget = self._take_cancelled()
        end = tuple((unit_id, Outcome(FAILED, Reason.REFUSED, why), refusal) for unit_id, why, refusal in self._spent())
        go = tuple(self.wake()) if self.due() else ()
        self.publish()
        return Ticked(go=go, end=end, forget=forget) if go or end or forget else None

    def wake_in(self, cap: float) -> float:
        return self.seconds_to_wake(cap) if self.has_work() else cap

    def stop(self) -> None:
        """At teardown: the shared closure store's thread writes what was posted, and ends."""
        self.close_store()

    # ------------------------------------------------------------------ the loop
    def has_work(self) -> bool:
        """Whether `tick` has anything to do."""
        return bool(self._waiting) or self._dirty or not self._cancelled.empty()

    def due(self) -> bool:
        """Whether waiting units may start now (a hold ended, or nothing holds them any more)."""
        if not self._waiting:
            return False
        at = self.pool.next_wake()
        return at is None or self.clock.mono() >= at

    def seconds_to_wake(self, cap: float) -> float:
        """Real seconds until `due` may turn true, at most `cap` (a scaled clock runs faster)."""
        if not self._waiting:
            return cap
        at = self.pool.next_wake()
        if at is None:
            return 0.0
        scale = getattr(self.clock, "scale", 1.0)
        return max(0.0, min(cap, (at - self.clock.mono()) / scale))

    def wake(self) -> list:
        """Re-decide the waiting units; the units that go on now, each stamped with its route."""
        started = []
        for unit_id, decision in self.pool.wake():
            unit = self._waiting.pop(unit_id)
            self._refused.pop(unit_id, None)
            self._admit(unit, decision)
            started.append(unit)
        if started:
            self._dirty = True
        return started

    def _take_cancelled(self) -> tuple:
        """Waiting units whose future was cancelled: forgotten here; the loop records them."""
        out = []
        while True:
            try:
                unit_id = self._cancelled.get_nowait()
            except queue.Empty:
                return tuple(out)
            if self._waiting.pop(unit_id, None) is not None:
                self.pool.cancel(unit_id)
                self._dirty = True
                out.append(unit_id)

    def drop(self, detail: str) -> list[tuple[int, str]]:
        """Let go of every waiting unit (the fleet closes): (unit id, its detail: `detail`
        and why it waited), for the loop to end."""
        out = []
        for unit_id in list(self._waiting):
            decision = self.pool.waiting(unit_id)
            why = decision.reason if decision is not None else ""
            out.append((unit_id, f"{detail}: {why}" if why else detail))
            del self._waiting[unit_id]
            self._refused.pop(unit_id, None)
            self.pool.cancel(unit_id)
        if out:
            self._dirty = True
        return out

    # ------------------------------------------------------------------ outcomes
    def ended(self, unit, outcome, original=None, cost: float | None = None) -> str | None:
        """A unit's outcome: the pool takes its signal (see the module doc). Any unit may be
        passed: one the gate never saw is ignored, and one admitted that never ran is
        withdrawn with no signal (its pool never saw it).

        A refused unit within its limit is taken back: GO (it starts again now on the
        new decision's route) or HELD (it waits here); its outcome is not the unit's.
        None: the outcome stands."""
        unit_id = unit.unit_id
        self._refused.pop(unit_id, None)
        if unit_id in self._running:
            self._running.discard(unit_id)
            self._dirty = True
            signal = signal_of(outcome, original, cost, self.clock)
            decision = self.pool.report(unit_id, signal, again=signal.kind == T.REFUSED)
            if decision is None:
                return None
            log.info("unit %d refused (%s); %s", unit_id, signal.message,
                     f"again on {decision.route}" if decision.starts else decision.reason)
            if decision.starts:
                self._admit(unit, decision)
                return GO
            self._waiting[unit_id] = unit
            self._refused[unit_id] = original
            return HELD
        if unit_id in self._admitted:
            self._admitted.discard(unit_id)
            self.pool.withdraw(unit_id)
            self._dirty = True
        elif self._waiting.pop(unit_id, None) is not None:
            self.pool.cancel(unit_id)
            self._dirty = True
        return None

    def _spent(self) -> list[tuple[int, str, object]]:
        """Refused units whose refusal deadline passed while they waited, forgotten here:
        (unit id, why, the last fleet.Refused it met), for the loop to fail Refused."""
        out = []
        for unit_id, why in self.pool.spent():
            del self._waiting[unit_id]
            out.append((unit_id, why, self._refused.pop(unit_id, None)))
        if out:
            self._dirty = True
        return out

    # ------------------------------------------------------------------ table
    def publish(self, force: bool = False) -> None:
        """Write the bulkheads into the table if they changed (and `PUBLISH_EVERY_S` has passed),
        or whenever `force` (a sample: backoffs and closures end with time)."""
        if force:
            self.learn_shared()
        if self._writer is None or not (force or self._dirty):
            return
        now = time.monotonic()
        if not force and now - self._published_at < PUBLISH_EVERY_S:
            return
        self._published_at = now
        self._dirty = False
        self._writer.publish(self.bulkhead_rows())

    def learn_shared(self) -> int:
        """Merge what the host group's store last said about closures (no store call here:
        the reading comes from the store's own thread); how many closures were new."""
        if self._shared is None:
            return 0
        reading = self._shared.fresh()
        learned = 0 if reading is None else self.pool.learn(reading)
        if learned:
            self._dirty = True
        return learned

    def close_store(self) -> None:
        """Stop the shared closure store's thread (after it wrote what was posted)."""
        if self._shared is not None:
            self._shared.close()
            self._shared = None

    def bulkhead_rows(self) -> list[dict]:
        pool = self.pool
        t = pool.now()
        return [bulkhead_row(b, t, pool._budget.get(b.route.provider)) for b in pool.state.bulkheads.values()]

    # ------------------------------------------------------------------ views and operator
    def waiting(self, unit_id: int) -> dict | None:
        """Why a waiting unit waits and until when (UTC epoch seconds), or None."""
        decision = self.pool.waiting(unit_id)
        if decision is None:
            return None
        refused = self._refused.get(unit_id)
        return {"unit": unit_id, "route": str(decision.route), "why": decision.reason, "until": decision.until or None,
                "refusals": self.pool.refusals(unit_id),
                "refused": None if refused is None else f"{refused.status} {refused.message}".strip()}

    def standing(self, unit_id: int) -> dict | None:
        """`waiting`, with the gate's kind (`fleet.rules.why`), for a unit kept here; None otherwise."""
        if unit_id not in self._waiting:
            return None
        found = self.waiting(unit_id)
        if found is None:
            return None
        decision, hold, cause = self.pool.waiting(unit_id), "waiting", None
        b = self.pool.state.bulkheads.get(decision.route)
        if b is not None:
            t = self.pool.now()
            if b.closed_until > t.wall:
                hold, cause = BulkheadState.CLOSED, b.cause
            elif b.backoff_until > t.mono:
                hold = BulkheadState.BACKOFF
        return {"kind": "provider", "hold": hold, "cause": cause, **found}

    def census(self) -> dict:
        """Bulkheads, lane x bulkhead rows, closures, starving (000 §10), plus the waiting units."""
        doc = self.pool.census()
        doc["waiting_units"] = [w for w in (self.waiting(u) for u in self._waiting) if w is not None]
        doc["moved"] = self.moved
        doc["closure_file"] = self.closure_file
        doc["closure_store"] = self.closure_store
        if self._shared is not None and self._shared.error:
            doc["closure_store_error"] = self._shared.error
        return doc

    def reload(self, config) -> tuple[bool, str | None]:
        """Swap in a new declared policy; a policy that fails keeps the last good one (and says why)."""
        if config.section == self.section:
            self.holder.last_error = None  # the file loads again, and says what runs already
            return False, None
        ok, why = self.holder.reload(config.section)
        if ok:
            self.section = config.section
            self._dirty = True
        else:
            log.warning("admission: the new catalog did not load; keeping the last good one: %s", why)
        return ok, why

    def refresh_catalog(self) -> bool:
        """Read the catalog again if its file changed since the last look (000 §7: every sweep);
        True if a new one runs. A file that does not load is logged and kept as the policy's
        error; the last good catalog stays."""
        if self.catalog_file is None:
            return False
        stamp = _file_stamp(self.catalog_file)
        if stamp == self._catalog_seen:
            return False
        self._catalog_seen = stamp
        from fleet.runtime.config import load_config

        try:
            config = load_config(self.catalog_file, env=os.environ)
        except (FleetError, OSError, ValueError) as exc:
            log.warning("admission: the catalog in %s did not load; keeping the last good one: %s", self.catalog_file, exc)
            self.holder.last_error = f"{self.catalog_file}: {exc}"
            return False
        ok, _why = self.reload(config.admission)
        if ok:
            log.warning("admission: the catalog in %s changed; the new one runs", self.catalog_file)
        return ok

    def report_budget(self, provider: str, spent: float, limit: float | None) -> dict:
        """The provider's daily budget reading (spent today, daily limit or None): shown per
        bulkhead of that provider; at the limit it closes the provider until the next UTC
        midnight. BadBudget (nothing changed) for an unknown provider or a bad amount."""
        if not isinstance(provider, str) or provider not in self._providers_known():
            raise BadBudget(f"unknown provider {provider!r}: providers are "
                            f"{', '.join(sorted(self._providers_known())) or 'none yet'}")
        for name, value in (("spent", spent), ("limit", limit)):
            if value is None and name == "limit":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise BadBudget(f"{name} must be a finite amount >= 0, got {value!r}")
        self.pool.report_budget(provider, spent, limit)
        self._dirty = True
        return {"provider": provider, "spent": float(spent), "limit": None if limit is None else float(limit)}

    def _providers_known(self) -> set:
        known = set(self.pool.policy.providers) | {r.provider for r in self.pool.state.bulkheads}
        return known | {c.provider for c in self.pool.state.closures.values()}

    def refused_reload(self, why: str) -> None:
        """A reload refused before it reached the gate (the [admission] section was invalid): say so."""
        self.holder.last_error = why

    def close(self, pool: str, until: float, message: str = "") -> dict:
        """Operator: close a provider (``provider`` or ``provider/credential``) until `until` (UTC epoch s)."""
        provider, credential = self._known(pool)
        try:
            self.pool.close(provider, credential, until=until, cause=T.OPERATOR, message=message or "closed by operator")
        except ValueError as exc:
            raise BadPool(str(exc)) from None
        self._dirty = True
        return {"pool": pool, "closed_until": until}

    def reopen(self, pool: str) -> dict:
        """Operator: lift the closure of a provider or key (a topped-up key); whether there was one."""
        provider, credential = self._known(pool)
        had = self.pool.reopen(provider, credential)
        self._dirty = True
        return {"pool": pool, "reopened": had}


    # ------------------------------------------------------------------ coordinator API (000 §9)
    # Questions a coordinator asks before it fans work out: they read the pool and seat nothing.
    def allowance(self, lane: str | None) -> int | None:
        """None (start everything) unless every route `lane`'s work asks for is held back by a
        live refusal with no admitting alternative: then 0."""
        return self.pool.allowance(_lane(lane))

    def plan(self, lane: str | None, route, wanted: int, pinned: bool = False) -> int:
        """How many of `wanted` new units on `route` in `lane` would start now (pins and
        alternatives honoured). BadPlan for a route outside the catalog or bad arguments."""
        lane = _lane(lane)
        if type(route) is not Route:
            raise BadPlan(f"route must be a fleet.Route(model, provider, credential=None), not {type(route).__name__}")
        if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 0:
            raise BadPlan(f"wanted must be a whole number >= 0, got {wanted!r}")
        if not isinstance(pinned, bool):
            raise BadPlan(f"pinned must be true or false, got {pinned!r}")
        policy = self.pool.policy
        if policy.nodes and (route.model, route.provider) not in policy.nodes:
            raise BadPlan(f"route {route} is not in the declared catalog")
        return self.pool.plan(lane, route, wanted, pinned=pinned)

    def starving(self) -> list[dict]:
        """Closed providers (or keys) with work waiting first, then hard-pinned waits past starved_after."""
        return self.pool.starving()

    def _known(self, pool: str) -> tuple[str, str | None]:
        provider, credential = parse_pool(pool)
        known = self._providers_known()
        if provider not in known:
            raise BadPool(f"unknown pool {pool!r}: providers are {', '.join(sorted(known)) or 'none yet'}")
        return provider, credential


class BadPool(FleetError, ValueError):
    """An operator named a pool the admission does not know, or a time that is no future time."""


class BadBudget(FleetError, ValueError):
    """A budget reading for an unknown provider, or an amount that is none: nothing changed."""


def _file_stamp(path: str | None):
    """What tells a file changed (inode, size, mtime), or None when it cannot be read."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class BadPlan(FleetError, ValueError):
    """A coordinator question (allowance, plan) with bad arguments: nothing was read or changed."""


def _check_types(route, pinned, parent, tag, age=0.0) -> None:
    if type(route) is not Route:
        raise BadUnit(f"route must be a fleet.Route(model, provider, credential=None), "
                      f"not {type(route).__name__}")
    if not isinstance(pinned, bool):
        raise BadUnit(f"pinned must be true or false, got {pinned!r}")
    if parent is not None and (isinstance(parent, bool) or not isinstance(parent, int)):
        raise BadUnit(f"parent must be the id of the unit that delegated this one (an int), got {parent!r}")
    if tag is not None and not isinstance(tag, str):
        raise BadUnit(f"tag must be a str, got {type(tag).__name__}")
    if isinstance(age, bool) or not isinstance(age, (int, float)) or not math.isfinite(age) or age < 0:
        raise BadUnit(f"age must be the seconds the unit has waited already (a finite number >= 0), got {age!r}")


def _lane(lane):
    if lane is not None and not isinstance(lane, str):
        raise BadPlan(f"lane must be a str or None, got {type(lane).__name__}")
    return lane


def parse_pool(text: str) -> tuple[str, str | None]:
    """``provider`` or ``provider/credential`` -> (provider, credential or None); BadPool if malformed."""
    if not isinstance(text, str) or not text.strip() or "@" in text or text.count("/") > 1:
        raise BadPool(f"pool {text!r}: expected 'provider' or 'provider/credential'")
    provider, _, credential = text.partition("/")
    if not provider or ("/" in text and not credential):
        raise BadPool(f"pool {text!r}: expected 'provider' or 'provider/credential'")
    return provider, credential or None


def signal_of(outcome, original=None, cost: float | None = None, clock=None) -> T.Signal:
    """What a unit's outcome tells its pool (see the module doc); a refusal is placed at the
    instant the worker met it, read on the admission's `clock`."""
    if outcome.kind in (SOLVED, SUPPRESSED):
        return T.Signal.clean(None, cost)
    if outcome.kind == FAILED and outcome.reason == Reason.REFUSED and original is not None:
        return signal_for(original, clock=clock)
    if outcome.reason in SILENT_REASONS:
        return T.Signal(T.STALL)
    return T.Signal(T.ERROR, message=outcome.reason or "")
