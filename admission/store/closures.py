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

from typing import Sequence

from admission import state as T

from .base import AdmissionStore, Closure, StoreUnreachable


class ClosureStoreUnreachable(StoreUnreachable, OSError):
    """The store could not take the closures; an OSError too, so the pool logs it and goes on."""


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

    def reopen(self, provider: str, credential: str | None = None, reason: str = "reopened") -> bool:
        """End the closure of a provider (credential None) or one key for the whole host group."""
        return self.store.reopen_closure(provider, credential, reason)

    def close(self) -> None:
        self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["StoreClosures", "ClosureStoreUnreachable"]
