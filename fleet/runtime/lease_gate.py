"""The lease gate: units of gated roles dispatch only under a current host-group lease.

A fleet configured with a ``[store]`` acts as one orchestrator of its host group.
For each unit of a role listed under ``[store.roles]`` the gate submits a request to
the store; the unit is handed to the dispatcher only once the store admits it
(`on_admitted`). While the unit runs, the gate renews its lease every
``renew_every``; when the unit has its outcome, the gate releases the lease (or
cancels the request, if it was still queued). The gate heartbeats in the store as
often, so its peers know it is alive: once it has been silent for a whole
``lease_ttl``, its queued requests are cancelled rather than admitted to nobody.

Whatever ends a lease early calls `on_lost(unit_id, reason, detail)` and the
supervisor fails the unit with that reason: ``LeaseDenied`` (the policy refuses
the request), ``LeasePreempted`` (a higher-priority request displaced it) or
``LeaseExpired`` (it ran out unrenewed, timed out in the queue, or was cancelled
or released by someone else).

Retries. A request that times out before its unit ran - its queue timeout passed, or
its lease ran out before the grant reached this fleet - is worth asking again (the
store's `TimedOut` is retryable within the caller's budget): the gate submits the
store's retry of it (`admission.store.rules.retry_of`, id ``<id>~<n>``) and the unit
keeps waiting, up to ``[store.roles.<role>] retries`` times; then the unit fails
``LeaseExpired`` naming the budget it spent. A lease that runs out while its unit runs
is not retried: the unit was stopped mid-run, and running it again is the caller's call.

Fails closed, in time. Every store call has a deadline (``call_timeout``, below the
renewal interval), and a watchdog thread of its own stops a unit whose lease reaches
its stop time unrenewed, whatever the gate's thread is doing meanwhile (waiting on a
store that stalls, say). The stop time is the lease's expiry as this host's monotonic
clock sees it - measured from before the call that granted or renewed it, so never
late - less a margin (`expiry_margin`) that covers killing the worker and the clock
skew between hosts: the unit is stopped before the store can give its capacity to a
peer. When the store answers again the gate carries on where it was.

The gate's state belongs to its one thread: callers (the supervisor's loop) only post
commands to its queue, and the callbacks run without any gate state held. The watchdog
shares only its own table of stop times.

`HostGroupLease` is the loop's side: one of its gates (`fleet.runtime.gates`). It holds
a unit of a gated role until its lease is granted, and hands the loop what the gate's
threads said (a grant, a lease lost) at its tick; they only post it and ring the loop's
bell.
"""
from __future__ import annotations

import logging
import math
import os
import queue
import socket
import threading
import time
from typing import Callable

from admission.records import record
from fleet.rules.outcomes import FAILED
from fleet.rules.unit import Outcome
from fleet.rules.vocab import LEASE_LOST_REASONS, Reason
from fleet.rules.vocab import lease_states
from fleet.runtime.gates import GO, HELD, Ticked

log = logging.getLogger(__name__)

#: The failure reasons of a unit whose lease ended before its outcome (fleet.rules.vocab).
LEASE_DENIED = Reason.LEASE_DENIED
LEASE_PREEMPTED = Reason.LEASE_PREEMPTED
LEASE_EXPIRED = Reason.LEASE_EXPIRED
#: A held request the gate has not submitted yet (the gate's own state, before the store's).
NEW = "new"


def lost_reason(state: str) -> str:
    """The failure reason of a unit whose request ended in store state `state` before its outcome."""
    return LEASE_LOST_REASONS.get(state, LEASE_EXPIRED)


def expiry_margin(granted: float) -> float:
    """How long before its lease's expiry a unit is stopped, for a lease granted for `granted` seconds.

    A tenth of the lease, at least 0.1 s (a SIGKILL and its reaping on a busy host), at
    most a quarter of the lease (so that a short lease still runs most of its time).
    """
    return min(granted / 4, max(0.1, granted / 10))


def call_timeout(lease_ttl: float, renew_every: float) -> float:
    """The deadline of one store call: a renewal that cannot get through gives way to the next try."""
    return max(0.05, min(renew_every, lease_ttl / 4))


@record(frozen=False)
class _Held:
    unit_id: int
    request_id: str
    role: str
    state: str = NEW  # NEW -> lease_states.QUEUED -> lease_states.ADMITTED; gone when done or lost
    revision: int = 0
    renew_at: float = 0.0  # monotonic: when to renew
    stop_at: float = 0.0  # monotonic: the unit is stopped here unless renewed
    attempt: int = 0  # 0: its first request; n: the store's n-th retry of it (id <id>~n)


def _lease_of(held: _Held) -> str:
    """Which request and lease revision a unit ran under: what its outcome records."""
    return f"request {held.request_id}" + (f" lease revision {held.revision}" if held.revision else "")


def gated_roles(store_config, roles) -> set[int]:
    """The codes of the roles whose units run only under a host-group lease."""
    if not store_config.url:
        return set()
    return {code for code, role in enumerate(roles) if store_config.role(role.name) is not None}


def orchestrator_id(config_orchestrator: str | None, fleet_name: str) -> str:
    """This fleet's id in the host group: the configured one, else ``<hostname>/<fleet name>``."""
    return config_orchestrator or f"{socket.gethostname()}/{fleet_name}"


class _Watchdog:
    """The stop times of the gate's units, and a thread that acts on them whatever else runs.

    Each unit the gate holds is tracked from `track` until exactly one party takes it
    with `claim`: the gate (done, or lost with a reason) or the watchdog (its stop time
    passed). Only the taker reports the unit, so every unit is reported at most once.
    """

    def __init__(self, on_expired: Callable[[int, str], None], monotonic: Callable[[], float]):
        self._on_expired, self._monotonic = on_expired, monotonic
        self._cond = threading.Condition()
        self._stop_at: dict[int, float] = {}
        self._lease: dict[int, str] = {}  # unit id -> which lease it runs under, for the report
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fleet-lease-expiry", daemon=True)
        self._thread.start()

    def track(self, unit_id: int) -> None:
        with self._cond:
            self._stop_at[unit_id] = math.inf

    def arm(self, unit_id: int, stop_at: float, lease: str) -> bool:
        """Set the unit's stop time under `lease`; False if it is no longer tracked (taken by someone)."""
        with self._cond:
            if unit_id not in self._stop_at:
                return False
            self._stop_at[unit_id] = stop_at
            self._lease[unit_id] = lease
            self._cond.notify()
            return True

    def tracks(self, unit_id: int) -> bool:
        """Whether nobody has taken the unit yet."""
        with self._cond:
            return unit_id in self._stop_at

    def claim(self, unit_id: int) -> bool:
        """Take the unit: True for the one caller that gets it."""
        with self._cond:
            self._lease.pop(unit_id, None)
            return self._stop_at.pop(unit_id, None) is not None

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                now = self._monotonic()
                due = [(u, self._lease.pop(u, "")) for u, at in self._stop_at.items() if at <= now]
                for u, _ in due:
                    del self._stop_at[u]
                if not due:
                    nearest = min(self._stop_at.values(), default=math.inf)
                    self._cond.wait(None if nearest == math.inf else max(0.0, nearest - now))
                    continue
            for u, lease in due:
                self._on_expired(u, lease)


class LeaseGate:
    """Holds units until the host-group store admits them; renews and releases their leases.

    Args:
        store_config: `fleet.runtime.config.StoreConfig` (url, orchestrator, lease timing, policy, roles).
        fleet_name: names the orchestrator when the config does not.
        on_admitted: ``f(unit_id)``, called once when a held unit may be dispatched.
        on_lost: ``f(unit_id, reason, detail)``, called once when a unit's request or lease
            ends early; `reason` is LeaseDenied, LeasePreempted or LeaseExpired.
        open_store: how to open the store (injected for tests); ``clock``/``monotonic`` likewise.
    """

    def __init__(self, store_config, fleet_name: str, *, on_admitted: Callable[[int], None],
                 on_lost: Callable[[int, str, str], None], open_store=None, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic):
        self.config = store_config
        self.orchestrator = orchestrator_id(store_config.orchestrator, fleet_name)
        self.renew_every = store_config.renew_every or store_config.lease_ttl / 3
        self.call_timeout = call_timeout(store_config.lease_ttl, self.renew_every)
        self._on_admitted, self._on_lost = on_admitted, on_lost
        self._open_store = open_store
        self._clock, self._monotonic = clock, monotonic
        # unit ids restart with every boot; the nonce keeps request ids unique in the group
        self._prefix = f"{self.orchestrator}/{os.urandom(6).hex()}/"
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._watchdog = _Watchdog(self._expired, monotonic)
        self._store = None
        self._held: dict[int, _Held] = {}
        self._releases: list[_Held] = []  # finished units whose lease is still to be given back
        self._next_beat = 0.0  # monotonic
        self._unreachable_since: float | None = None
        self._last_refusal = ""
        #: unit id -> where its queued request stands (`_stand`); the gate's thread replaces it whole
        self.standing: dict[int, dict] = {}

    # ------------------------------------------------------------------ callers' side

    def gates(self, role: str) -> bool:
        """Whether units of `role` need a lease."""
        return self.config.role(role) is not None

    def start(self) -> "LeaseGate":
        self._watchdog.start()
        self._thread = threading.Thread(target=self._run, name="fleet-leases", daemon=True)
        self._thread.start()
        return self

    def hold(self, unit_id: int, role: str) -> None:
        """Ask the store for a lease for `unit_id`; `on_admitted` or `on_lost` follows."""
        self._watchdog.track(unit_id)
        self._commands.put(("hold", unit_id, role))

    def done(self, unit_id: int) -> None:
        """`unit_id` has its outcome: give its lease back (or withdraw its request)."""
        self._watchdog.claim(unit_id)  # at once: no expiry is reported for a unit that ended
        self._commands.put(("done", unit_id, None))

    def stop(self, timeout: float = 10.0) -> None:
        """Release what is held, close the store and end the threads."""
        self._commands.put(("stop", None, None))
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._watchdog.stop()

    # ------------------------------------------------------------------ the watchdog's thread

    def _expired(self, unit_id: int, lease: str) -> None:
        # The lease reaches its end unrenewed: stop the unit now. Its held entry stays with
        # the gate's thread, which gives the lease back when the unit's outcome is in.
        log.warning("unit %d: lease not renewed in time (%s); stopping it", unit_id, lease)
        self._on_lost(unit_id, LEASE_EXPIRED, f"its lease ran out unrenewed (the store did not answer in time; {lease})")

    # ------------------------------------------------------------------ the gate's thread

    def _run(self) -> None:
        try:
            while True:
                try:
                    cmd = self._commands.get(timeout=self.config.poll_every)
                except queue.Empty:
                    cmd = None
                stop = False
                while cmd is not None:
                    stop = self._command(*cmd) or stop
                    try:
                        cmd = self._commands.get_nowait()
                    except queue.Empty:
                        cmd = None
                if stop:
                    break
                self._tick()
        except BaseException:  # noqa: BLE001 - never die silently: fail closed, loudly
            log.exception("lease gate crashed; every held unit is lost")
            for held in list(self._held.values()):
                self._lose(held, LEASE_EXPIRED, "the lease gate crashed")
        finally:
            self._shutdown()

    def _command(self, op: str, unit_id, role) -> bool:
        if op == "hold":
            self._held[unit_id] = _Held(unit_id, f"{self._prefix}{unit_id}", role)
        elif op == "done":
            held = self._held.pop(unit_id, None)
            if held is not None and held.state in lease_states.LIVE_STATES:
                self._releases.append(held)
        elif op == "stop":
            return True
        return False

    def _connect(self):
        if self._store is None:
            from admission.store import open_store

            opener = self._open_store or open_store
            self._store = opener(self.config.url, actor=self.orchestrator, clock=self._clock,
                                 call_timeout=self.call_timeout)
            if self.config.policy is not None:
                self._store.set_policy(self.config.policy)
            # A restarted orchestrator reconciles before it dispatches; the requests an earlier
            # run of it left queued have nobody to dispatch them.
            for rec in self._store.reconcile():
                if (rec.state == lease_states.QUEUED and rec.request.orchestrator == self.orchestrator
                        and not rec.id.startswith(self._prefix)):
                    self._store.cancel(rec.id, "its orchestrator restarted")
        return self._store

    def _tick(self) -> None:
        from admission.store import StoreError, StoreUnreachable

        try:
            store = self._connect()
            self._heartbeat(store)
            self._release_finished(store)
            self._submit_new(store)
            self._poll_queued(store)
            self._renew(store)
            if self._unreachable_since is not None:
                log.warning("host-group store %s answers again", self.config.url)
                self._unreachable_since = None
        except StoreUnreachable as exc:  # StoreTimeout too: the watchdog stops what runs out
            if self._unreachable_since is None:
                self._unreachable_since = self._monotonic()
                log.error("host-group store unreachable (failing closed): %s", exc)
        except StoreError as exc:  # e.g. SchemaTooNew: nothing can be decided; leases run out
            text = f"{type(exc).__name__}: {exc}"
            if text != self._last_refusal:  # once per distinct refusal, not at every poll
                log.error("host-group store refused: %s", text)
                self._last_refusal = text

    def _heartbeat(self, store) -> None:
        now = self._monotonic()
        if now >= self._next_beat:
            store.heartbeat(self.config.lease_ttl)
            self._next_beat = now + self.renew_every

    def _release_finished(self, store) -> None:
        while self._releases:
            held = self._releases[0]
            if held.state == lease_states.ADMITTED:
                store.release(held.request_id, held.revision, "unit finished")
            else:
                store.cancel(held.request_id, "unit ended before admission")
            self._releases.pop(0)

    def _request(self, held: _Held):
        from admission.store import Request

        spec = self.config.role(held.role)
        return Request(held.request_id, self.orchestrator, spec.environment, spec.provider, spec.tier,
                       spec.priority, spec.queue_timeout, spec.preemptible, self.config.lease_ttl)

    def _submit_new(self, store) -> None:
        for held in [h for h in self._held.values() if h.state == NEW]:
            sent = self._monotonic()
            self._apply(held, store.submit(self._request(held)), sent)

    def _poll_queued(self, store) -> None:
        waiting = [h for h in self._held.values() if h.state == lease_states.QUEUED]
        if not waiting:
            if self.standing:
                self.standing = {}
            return
        sent = self._monotonic()
        live = {r.id: r for r in store.reconcile()}
        for held in waiting:
            rec = live.get(held.request_id) or store.get(held.request_id)
            self._apply(held, rec, sent)
        self._stand(store)

    def _stand(self, store) -> None:
        """Where each request still queued stands in the store's queue (`rules.standing`),
        published whole for the loop's `fleetctl why` (one read, no write)."""
        from admission.store.rules import standing

        queued = [h for h in self._held.values() if h.state == lease_states.QUEUED]
        if not queued:
            self.standing = {}
            return
        records, policy, now = store.snapshot()
        out = {}
        for held in queued:
            found = standing(policy, records, now, held.request_id)
            if found is not None:
                out[held.unit_id] = {"request": held.request_id, **found}
        self.standing = out  # replaced whole: the loop's thread reads it

    def _granted(self, held: _Held, revision: int, sent: float, granted: float) -> bool:
        """Hold a lease granted for `granted` seconds by a call sent at `sent`; False if the unit
        was taken meanwhile (ended, or stopped by the watchdog)."""
        stop_at = sent + granted - expiry_margin(granted)
        held.state, held.revision = lease_states.ADMITTED, revision
        held.renew_at = sent + min(self.renew_every, (stop_at - sent) / 2)
        held.stop_at = stop_at
        if stop_at > self._monotonic() and self._watchdog.arm(held.unit_id, stop_at, _lease_of(held)):
            return True
        self._held.pop(held.unit_id, None)
        self._releases.append(held)  # nobody runs under it: give it back
        return False

    def _apply(self, held: _Held, rec, sent: float) -> None:
        if rec.state == lease_states.QUEUED:
            held.state = lease_states.QUEUED
        elif rec.state == lease_states.ADMITTED:
            # the store's own measure of the grant (its clock, one transaction): no skew in it
            if self._granted(held, rec.revision, sent, rec.lease_expires - rec.decided_at):
                self._on_admitted(held.unit_id)
            else:
                self._retry_or_lose(held, "its lease ran out before the grant reached this fleet")
        elif rec.state == lease_states.TIMED_OUT:
            self._retry_or_lose(held, f"request {rec.state} ({rec.reason})")
        else:
            self._lose(held, lost_reason(rec.state), f"request {rec.state} ({rec.reason})")

    def _retry_or_lose(self, held: _Held, detail: str) -> None:
        """`held`'s request timed out before its unit ran: ask the store again under the
        request's retry id while the role's budget lasts, else the unit fails LeaseExpired."""
        from admission.store.rules import retry_of

        budget = self.config.role(held.role).retries
        if held.attempt >= budget:
            if budget:
                detail = f"{detail}; retry budget of {budget} spent"
            self._lose(held, LEASE_EXPIRED, detail)
            return
        if not self._watchdog.tracks(held.unit_id):
            self._held.pop(held.unit_id, None)
            return  # taken meanwhile (it ended): nothing to ask for
        # The timed-out record is final; a lease granted too late is already on its way back
        # (`_granted`). The retry is a request of its own, the same identity under its retry id.
        again = _Held(held.unit_id, retry_of(self._request(held), held.attempt + 1).id, held.role,
                      attempt=held.attempt + 1)
        log.info("unit %d: %s; asking again as %s (retry %d of %d)", held.unit_id, detail, again.request_id,
                 again.attempt, budget)
        self._held[held.unit_id] = again  # submitted at this tick's next _submit_new, or the next tick

    def _renew(self, store) -> None:
        from admission.store import LeaseLost

        for held in [h for h in self._held.values() if h.state == lease_states.ADMITTED]:
            sent = self._monotonic()
            if sent < held.renew_at:
                continue
            try:
                lease = store.renew(held.request_id, held.revision)
            except LeaseLost as exc:
                self._lose(held, lost_reason(exc.state), f"{exc.state} ({exc.reason})")
                continue
            if not self._granted(held, lease.revision, sent, self.config.lease_ttl):
                self._lose(held, LEASE_EXPIRED, "its lease ran out before its renewal got through")

    def _lose(self, held: _Held, reason: str, detail: str) -> None:
        self._held.pop(held.unit_id, None)
        if held.state == lease_states.QUEUED:
            self._releases.append(held)  # withdraw the request when the store answers
        if not self._watchdog.claim(held.unit_id):
            return  # already reported (its stop time passed) or ended
        detail = f"{detail}; {_lease_of(held)}"
        log.warning("unit %d: %s: %s", held.unit_id, reason, detail)
        self._on_lost(held.unit_id, reason, detail)

    def _shutdown(self) -> None:
        for held in list(self._held.values()):
            if held.state in lease_states.LIVE_STATES:
                self._releases.append(held)
        self._held.clear()
        if self._store is not None:
            try:
                self._release_finished(self._store)
            except Exception as exc:  # noqa: BLE001 - the leases run out at their expiry anyway
                log.warning("could not give back every lease at stop: %s", exc)
            self._store.close()
            self._store = None


#: What the gate's threads tell the loop (`HostGroupLease`'s news).
_GRANTED, _LOST = "granted", "lost"


class HostGroupLease:
    """The host-group lease as a gate of the loop (`fleet.runtime.gates`).

    A unit of a gated role is held (`admit`: HELD) and asked a lease for; the grant lets
    it go to the dispatcher at the next tick. A lease that ends early ends a held unit
    with its reason, and stops one that is queued or runs (the loop kills its worker).
    A unit keeps its lease until its end (`ended` gives it back): one that comes to the
    gate again (a provider refusal runs it again) goes on at once. One owner: the loop
    thread; the `LeaseGate`'s threads only post news here and ring the loop's bell.
    """

    #: Its units wait in line for the host group's capacity, as in the dispatcher's queue.
    queue_like = True
    waits_for = "its host-group lease"

    def __init__(self, store_config, fleet_name: str, roles, wake, **gate_args):
        self._gated = gated_roles(store_config, roles)
        self._names = [role.name for role in roles]
        self._wake = wake
        self._news: queue.SimpleQueue = queue.SimpleQueue()
        self._held: dict[int, object] = {}  # unit id -> the loop's unit, waiting for its lease
        self._leased: set[int] = set()  # units asked a lease for, until their end
        self._gate = LeaseGate(store_config, fleet_name, on_admitted=lambda unit_id: self._tell(_GRANTED, unit_id),
                               on_lost=lambda unit_id, reason, why: self._tell(_LOST, unit_id, reason, why),
                               **gate_args)

    def _tell(self, *news) -> None:
        # The gate's threads: post, then ring (the loop that finds the bell moved ticks again).
        self._news.put(news)
        self._wake()

    def start(self) -> "HostGroupLease":
        self._gate.start()
        return self

    def lets_through(self, role: int) -> bool:
        return role not in self._gated

    def standing(self, unit_id: int) -> dict | None:
        """Where a unit waiting for its lease stands (`fleet.rules.why`): its request's place
        in the host group's queue and the quotas that hold it, as the gate's thread last read
        them; None for a unit not waiting here."""
        if unit_id not in self._held:
            return None
        found = self._gate.standing.get(unit_id)
        return {"kind": "lease", "state": lease_states.QUEUED if found is not None else "asking", **(found or {})}

    def admit(self, unit) -> str:
        unit_id = unit.unit_id
        if unit.role not in self._gated or unit_id in self._leased:
            return GO
        # queued for dispatch only once the host-group store grants it a lease
        self._held[unit_id] = unit
        self._leased.add(unit_id)
        self._gate.hold(unit_id, self._names[unit.role])
        return HELD

    def started(self, unit) -> None:
        pass  # it runs under the lease it was granted; the gate renews it meanwhile

    def tick(self) -> Ticked | None:
        if self._news.empty():
            return None
        go, end, stop = [], [], []
        while True:
            try:
                what, unit_id, *lost = self._news.get_nowait()
            except queue.Empty:
                break
            if unit_id not in self._leased:
                continue  # it ended meanwhile
            if what == _GRANTED:
                unit = self._held.pop(unit_id, None)
                if unit is not None:
                    go.append(unit)
            elif self._held.pop(unit_id, None) is not None:
                end.append((unit_id, Outcome(FAILED, *lost), None))  # its request ended before a grant
            else:
                stop.append((unit_id, *lost))  # queued: skipped at its grant; running: killed
        return Ticked(go=tuple(go), end=tuple(end), stop=tuple(stop))

    def ended(self, unit, outcome, original=None, cost: float | None = None) -> None:
        unit_id = unit.unit_id
        if unit_id in self._leased:
            self._leased.discard(unit_id)
            self._held.pop(unit_id, None)
            self._gate.done(unit_id)  # give its lease back (or withdraw its request)
        return None

    def drop(self, detail: str) -> list[tuple[int, str]]:
        """Let go of every unit still waiting for its lease; their requests are withdrawn
        at their end."""
        held, self._held = self._held, {}
        detail = detail.replace("before it ran", "before the host-group store granted its lease")
        return [(unit_id, detail) for unit_id in held]

    def wake_in(self, cap: float) -> float:
        return cap  # its news rings the bell

    def stop(self) -> None:
        self._gate.stop()  # gives back the leases still held
