"""Provider closures kept in the host-group store: the `ClosureStore` of `admission.pool` over it.

A fleet's provider admission saves its closures (a spent key, until when, why) so a
restart does not re-spend the key. Given a `StoreClosures`, every fleet of the host
group saves to, and loads from, the same store: the first 403 any of them met closes
the key for all. Build one from a store url with `admission.store.closure_store`.

Merge rule (the store's `put_closures`): a save never shortens a closure another
fleet wrote with a later `until`, and a closure missing from a save is not removed
(the saving fleet may simply not know it yet). Ending a closure early is an explicit
`reopen`, audited. So a caller that reopens a pool (an operator's reopen, a clean
probe) must also call `reopen` here.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Sequence

from admission import state as T

from admission.store.base import AdmissionStore, BadRequest, Closure, StoreUnreachable
from admission.vocab import REOPENED


class ClosureStoreUnreachable(StoreUnreachable, OSError):
    """The store could not take the closures; an OSError too, so the pool logs it and goes on."""


class ClosuresRefused(BadRequest, OSError):
    """The store refused some closures of a save (named); every other one of the save was written."""


class StoreClosures:
    """`admission.pool.ClosureStore` over a host-group `AdmissionStore` (it owns the store)."""

    def __init__(self, store: AdmissionStore):
        self.store = store

    def load(self) -> list[T.Closure]:
        """The closures in force now, from every fleet of the host group (StoreError if unreachable)."""
        return [T.Closure(c.provider, c.credential, c.until, c.cause, c.daily, c.since, c.message)
                for c in self.store.closures()]

    def save(self, closures: Sequence[T.Closure]) -> None:
        """Merge this fleet's closures into the store's (see the module docstring)."""
        items = [Closure(c.provider, c.credential, c.until, c.cause, c.daily, c.since, c.message) for c in closures]
        if not items:
            return
        try:
            self.store.put_closures(items)
        except StoreUnreachable as exc:
            raise ClosureStoreUnreachable(str(exc)) from exc
        except BadRequest:
            # One bad entry must not keep the others from the host group: each one alone.
            refused = []
            for item in items:
                try:
                    self.store.put_closures([item])
                except BadRequest as exc:
                    refused.append(f"{item.provider}{'/' + item.credential if item.credential else ''}: {exc}")
            if refused:
                raise ClosuresRefused("closures", "the store refused " + "; ".join(refused)) from None

    def reopen(self, provider: str, credential: str | None = None, reason: str = REOPENED) -> bool:
        """End the closure of a provider (credential None) or one key for the whole host group."""
        return self.store.reopen_closure(provider, credential, reason)

    def close(self) -> None:
        self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["StoreClosures", "ClosureStoreUnreachable", "ClosuresRefused"]


class SyncedClosures:
    """A `ClosureStore` for a pool whose owner must never wait on a database.

    The supervisor's loop owns the fleet's `AdmissionPool`; a store call from it could
    block every dispatch for as long as the database takes to answer (or to time
    out). So this object talks to the store from a thread of its own: `save` and
    `reopen` are posted and return at once (a failed one is retried with the next
    reading: a save always carries the whole list, a reopen waits its turn), and the
    thread reads the group's closures every `every_s`; `fresh()` hands the owner the
    newest reading once, and the owner merges it (`AdmissionPool.learn`). `load()`
    (the pool's boot) waits up to `boot_wait_s` for the first reading and raises
    `StoreUnreachable` past it: the pool then starts without, loudly, and learns later.

    Args:
        open_closures: opens the `StoreClosures` (called on the thread; retried while
            it fails, e.g. `lambda: closure_store(url, actor, clock)`).
        every_s: how often the thread reads what the other fleets closed.
    """

    def __init__(self, open_closures, *, every_s: float = 5.0, boot_wait_s: float = 5.0,
                 name: str = "fleet-closures"):
        self._open = open_closures
        self.every_s = every_s
        self.boot_wait_s = boot_wait_s
        self.error: str | None = None  # the last store error, None once it answers again
        self._posted: queue.SimpleQueue = queue.SimpleQueue()
        self._fresh: list[T.Closure] | None = None
        self._lock = threading.Lock()  # guards _fresh only: the hand-over between two threads
        self._first = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # --- the owner's side (never blocks but in load) ------------------------------------
    def load(self) -> list[T.Closure]:
        if not self._first.wait(self.boot_wait_s):
            raise StoreUnreachable(f"provider closures: no reading from the store within {self.boot_wait_s:g} s"
                                   + (f" ({self.error})" if self.error else ""))
        return self.fresh() or []

    def save(self, closures: Sequence[T.Closure]) -> None:
        self._posted.put(("save", list(closures)))

    def reopen(self, provider: str, credential: str | None = None) -> None:
        self._posted.put(("reopen", provider, credential))

    def fresh(self) -> list[T.Closure] | None:
        """The newest reading not handed out yet, or None."""
        with self._lock:
            got, self._fresh = self._fresh, None
        return got

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread after it wrote what was posted (bounded by `timeout`)."""
        self._stop.set()
        self._posted.put(("stop",))
        self._thread.join(timeout)

    # --- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        log = logging.getLogger("admission.store.closures")
        store = None
        pending_save = None  # the newest list not written yet
        refused = None  # why the store refused the last save: shown until a save goes through
        reopens: list[tuple] = []
        next_read = 0.0
        try:
            while True:
                try:  # a posted command, or the next reading (or retry) falls due
                    item = self._posted.get(timeout=max(0.0, next_read - time.monotonic()))
                except queue.Empty:
                    item = None
                while item is not None:
                    if item[0] == "save":
                        pending_save = item[1]
                    elif item[0] == "reopen":
                        reopens.append(item[1:])
                    try:
                        item = self._posted.get_nowait()
                    except queue.Empty:
                        item = None
                stopping = self._stop.is_set()
                try:
                    if store is None:
                        store = self._open()
                    while reopens:
                        store.reopen(*reopens[0])
                        reopens.pop(0)
                    if pending_save is not None:
                        store.save(pending_save)
                        pending_save = refused = None
                    if stopping:
                        return
                    if time.monotonic() >= next_read:
                        reading = store.load()
                        with self._lock:
                            self._fresh = reading
                        self._first.set()
                        next_read = time.monotonic() + self.every_s
                    if self.error is not None and refused is None:
                        log.warning("provider closures: the store answers again")
                    self.error = refused
                except Exception as exc:  # noqa: BLE001 - a store error must not end the thread
                    if str(exc) != self.error:
                        log.error("provider closures: %s", exc)
                    self.error = str(exc)
                    if stopping:
                        return
                    if not isinstance(exc, StoreUnreachable):
                        # refused, not unreachable (a bad closure, a newer schema): retrying
                        # the same writes would fail the same way for ever; the refusal stays
                        # in `error` (the fleet's status) until a save goes through
                        pending_save, reopens, refused = None, [], str(exc)
                    elif store is not None:
                        try:
                            store.close()
                        except Exception:  # noqa: BLE001
                            pass
                        store = None  # reopen it on the next round
                    next_read = time.monotonic() + min(self.every_s, 1.0)
        finally:
            if store is not None:
                try:
                    store.close()
                except Exception:  # noqa: BLE001
                    pass
