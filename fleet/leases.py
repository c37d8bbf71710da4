"""The lease gate: units of gated roles dispatch only under a current host-group lease.

A fleet configured with a ``[store]`` acts as one orchestrator of its host group.
For each unit of a role listed under ``[store.roles]`` the gate submits a request to
the store; the unit is handed to the dispatcher only once the store admits it
(`on_admitted`). While the unit runs, the gate renews its lease every
``renew_every``; when the unit has its outcome, the gate releases the lease (or
cancels the request, if it was still queued). Whatever ends a lease early — the
store denied or timed out the request, another orchestrator preempted it, a
renewal came too late — calls `on_lost(unit_id, detail)`, and the supervisor fails
the unit with a named reason.

Fails closed. When the store cannot be reached, nothing new is admitted, and a
lease that could not be renewed counts as lost once its ttl has passed since its
last grant or renewal (by this host's monotonic clock, which only errs early).
When the store answers again the gate carries on where it was.

The gate's state belongs to its one thread: callers (the supervisor, under its
lock) only post commands to its queue, and the callbacks run on the gate's thread
without any gate state held.
"""
from __future__ import annotations

import logging
import queue
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("fleet.leases")

#: Outcome detail prefixes for the supervisor (the failure reason is ``LeaseLost``).
LEASE_LOST = "LeaseLost"
LEASE_DENIED = "LeaseDenied"


@dataclass
class _Held:
    unit_id: int
    request_id: str
    role: str
    state: str = "new"  # new -> queued -> admitted; gone when done or lost
    revision: int = 0
    valid_until: float = 0.0  # monotonic: the lease is surely current before this


def orchestrator_id(config_orchestrator: str | None, fleet_name: str) -> str:
    """This fleet's id in the host group: the configured one, else ``<hostname>/<fleet name>``."""
    return config_orchestrator or f"{socket.gethostname()}/{fleet_name}"


class LeaseGate:
    """Holds units until the host-group store admits them; renews and releases their leases.

    Args:
        store_config: `fleet.config.StoreConfig` (url, orchestrator, lease timing, policy, roles).
        fleet_name: names the orchestrator when the config does not.
        on_admitted: ``f(unit_id)``, called once when a held unit may be dispatched.
        on_lost: ``f(unit_id, detail)``, called once when a unit's request or lease ends early.
        open_store: how to open the store (injected for tests); ``clock``/``monotonic`` likewise.
    """

    def __init__(self, store_config, fleet_name: str, *, on_admitted: Callable[[int], None],
                 on_lost: Callable[[int, str], None], open_store=None, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic):
        self.config = store_config
        self.orchestrator = orchestrator_id(store_config.orchestrator, fleet_name)
        self.renew_every = store_config.renew_every or store_config.lease_ttl / 3
        self._on_admitted, self._on_lost = on_admitted, on_lost
        self._open_store = open_store
        self._clock, self._monotonic = clock, monotonic
        # unit ids restart with every boot; the nonce keeps request ids unique in the group
        self._prefix = f"{self.orchestrator}/{uuid.uuid4().hex[:12]}/"
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._store = None
        self._held: dict[int, _Held] = {}
        self._releases: list[_Held] = []  # finished units whose lease is still to be given back
        self._unreachable_since: float | None = None
        self._last_refusal = ""

    # ------------------------------------------------------------------ callers' side

    def gates(self, role: str) -> bool:
        """Whether units of `role` need a lease."""
        return self.config.role(role) is not None

    def start(self) -> "LeaseGate":
        self._thread = threading.Thread(target=self._run, name="fleet-leases", daemon=True)
        self._thread.start()
        return self

    def hold(self, unit_id: int, role: str) -> None:
        """Ask the store for a lease for `unit_id`; `on_admitted` or `on_lost` follows."""
        self._commands.put(("hold", unit_id, role))

    def done(self, unit_id: int) -> None:
        """`unit_id` has its outcome: give its lease back (or withdraw its request)."""
        self._commands.put(("done", unit_id, None))

    def stop(self, timeout: float = 10.0) -> None:
        """Release what is held, close the store and end the thread."""
        self._commands.put(("stop", None, None))
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

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
                self._lose(held, f"{LEASE_LOST}: the lease gate crashed")
        finally:
            self._shutdown()

    def _command(self, op: str, unit_id, role) -> bool:
        if op == "hold":
            self._held[unit_id] = _Held(unit_id, f"{self._prefix}{unit_id}", role)
        elif op == "done":
            held = self._held.pop(unit_id, None)
            if held is not None and held.state in ("queued", "admitted"):
                self._releases.append(held)
        elif op == "stop":
            return True
        return False

    def _connect(self):
        if self._store is None:
            from admission.store import open_store

            opener = self._open_store or open_store
            self._store = opener(self.config.url, actor=self.orchestrator, clock=self._clock)
            if self.config.policy is not None:
                self._store.set_policy(self.config.policy)
            # a restarted orchestrator reconciles before it dispatches
            self._store.reconcile()
        return self._store

    def _tick(self) -> None:
        from admission.store import StoreError, StoreUnreachable

        try:
            store = self._connect()
            self._release_finished(store)
            self._submit_new(store)
            self._poll_queued(store)
            self._renew(store)
            if self._unreachable_since is not None:
                log.warning("host-group store %s answers again", self.config.url)
                self._unreachable_since = None
        except StoreUnreachable as exc:
            if self._unreachable_since is None:
                self._unreachable_since = self._monotonic()
                log.error("host-group store unreachable (failing closed): %s", exc)
            self._expire_unrenewed()
        except StoreError as exc:  # e.g. SchemaTooNew: nothing can be decided; leases run out
            text = f"{type(exc).__name__}: {exc}"
            if text != self._last_refusal:  # once per distinct refusal, not at every poll
                log.error("host-group store refused: %s", text)
                self._last_refusal = text
            self._expire_unrenewed()

    def _release_finished(self, store) -> None:
        while self._releases:
            held = self._releases[0]
            if held.state == "admitted":
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
        for held in [h for h in self._held.values() if h.state == "new"]:
            sent = self._monotonic()
            self._apply(held, store.submit(self._request(held)), sent)

    def _poll_queued(self, store) -> None:
        waiting = [h for h in self._held.values() if h.state == "queued"]
        if not waiting:
            return
        sent = self._monotonic()
        live = {r.id: r for r in store.reconcile()}
        for held in waiting:
            rec = live.get(held.request_id) or store.get(held.request_id)
            self._apply(held, rec, sent)

    def _apply(self, held: _Held, rec, sent: float) -> None:
        if rec.state == "queued":
            held.state = "queued"
        elif rec.state == "admitted":
            held.state, held.revision = "admitted", rec.revision
            held.valid_until = sent + rec.request.lease_ttl
            self._on_admitted(held.unit_id)
        else:
            kind = LEASE_DENIED if rec.state == "denied" else LEASE_LOST
            self._lose(held, f"{kind}: request {rec.state} ({rec.reason})")

    def _renew(self, store) -> None:
        from admission.store import LeaseLost

        now = self._monotonic()
        for held in [h for h in self._held.values() if h.state == "admitted"]:
            if held.valid_until - now > self.config.lease_ttl - self.renew_every:
                continue
            if now >= held.valid_until:
                self._lose(held, f"{LEASE_LOST}: not renewed within its ttl")
                continue
            try:
                lease = store.renew(held.request_id, held.revision)
            except LeaseLost as exc:
                self._lose(held, f"{LEASE_LOST}: {exc.state} ({exc.reason})")
                continue
            held.revision, held.valid_until = lease.revision, now + self.config.lease_ttl

    def _expire_unrenewed(self) -> None:
        now = self._monotonic()
        for held in [h for h in self._held.values() if h.state == "admitted" and now >= h.valid_until]:
            self._lose(held, f"{LEASE_LOST}: the store was unreachable past the lease's expiry")

    def _lose(self, held: _Held, detail: str) -> None:
        if self._held.pop(held.unit_id, None) is None:
            return
        if held.state == "queued":
            self._releases.append(held)  # withdraw the request when the store answers
        log.warning("unit %d: %s", held.unit_id, detail)
        self._on_lost(held.unit_id, detail)

    def _shutdown(self) -> None:
        for held in list(self._held.values()):
            if held.state in ("queued", "admitted"):
                self._releases.append(held)
        self._held.clear()
        if self._store is not None:
            try:
                self._release_finished(self._store)
            except Exception as exc:  # noqa: BLE001 - the leases run out at their expiry anyway
                log.warning("could not give back every lease at stop: %s", exc)
            self._store.close()
            self._store = None
