"""The host-group admission store: durable leases shared by every orchestrator of a host group.

`open_store(url)` opens ``sqlite:///path`` (one host, many processes) or
``postgresql://...`` (a host group across machines). The contract, records and
errors are in `admission.store.base`; the decision rules in `admission.store.rules`;
runtime tiers and their aliases in `admission.store.tiers`.

What keeps a request from dispatching reaches its caller typed (`Backpressure`:
BlockedCapacity, BlockedApproval, BlockedPolicy, Preempted, TimedOut; see
`backpressure_of`). A request may wait for an approval (``approval=True``;
`AdmissionStore.approve` / `reject`). Every call of an orchestrator about its own
requests is its heartbeat (``heartbeat_window``).

Provider closures are shared through the same store: ``closure_store(url, actor)``
builds the `ClosureStore` that `admission.pool.AdmissionPool(store=...)` takes
(``load()``/``save(closures)``, plus ``reopen(provider, credential)`` to end one
early for the whole host group). Saves merge: a later `until` wins, and nothing is
removed except by ``reopen``. See `admission.store.closures`.
"""
from __future__ import annotations

import time
from typing import Callable

from admission.store.base import (
    ADMITTED,
    AWAITING_APPROVAL,
    CANCELLED,
    DEFAULT_HEARTBEAT_WINDOW,
    DENIED,
    HOLDING_STATES,
    LIVE_STATES,
    MAX_HEARTBEAT_S,
    PREEMPTED,
    QUEUED,
    RELEASED,
    STATES,
    TERMINAL_STATES,
    TIERS,
    TIMED_OUT,
    AdmissionStore,
    Backpressure,
    BadRequest,
    BlockedApproval,
    BlockedCapacity,
    BlockedPolicy,
    Closure,
    Event,
    Health,
    IdentityConflict,
    Lease,
    LeaseLost,
    NotAwaitingApproval,
    NotOwner,
    Orchestrator,
    Policy,
    Preempted,
    QuotaConfigInvalid,
    Record,
    Request,
    SchemaMissing,
    SchemaTooNew,
    StoreError,
    StoreTimeout,
    StoreUnreachable,
    TimedOut,
    UnknownRequest,
    UnknownTier,
    backpressure_of,
    seconds_problem,
    tier_of,
)
from admission.store.closures import ClosureStoreUnreachable, StoreClosures


def open_store(url: str, actor: str = "fleet", clock: Callable[[], float] = time.time,
               create: bool = True, call_timeout: float = 30.0,
               heartbeat_window: float = DEFAULT_HEARTBEAT_WINDOW) -> AdmissionStore:
    """Open (creating or migrating its schema) the store at `url`.

    `actor` names this orchestrator in requests and audit rows; `clock` gives the
    store's notion of now. With `create` false a missing store is StoreUnreachable
    instead of being created (for operator commands). `call_timeout` (seconds) bounds how
    long any one call may wait on the database (a lock another session holds, a statement
    that does not end): past it the call raises StoreTimeout and decides nothing.
    `heartbeat_window` (seconds, at most a day): how long `actor` counts as alive after
    one of its calls (each call about its own requests beats; see `AdmissionStore`).
    Raises BadRequest for an unknown url scheme or a bad `call_timeout` or window,
    StoreUnreachable when the database cannot be reached, SchemaTooNew when newer
    code owns the store, StoreTimeout when the open itself (creating or migrating the
    schema) passes `call_timeout`: it waited on another session, or this client was
    kept from going on inside the open's transaction.
    """
    if not isinstance(url, str):
        raise BadRequest("url", f"must be a string, got {url!r}")
    if isinstance(call_timeout, bool) or not isinstance(call_timeout, (int, float)) or not 0 < call_timeout < 86400:
        raise BadRequest("call_timeout", f"must be seconds > 0 (less than a day), got {call_timeout!r}")
    problem = seconds_problem(heartbeat_window, MAX_HEARTBEAT_S)
    if problem:
        raise BadRequest("heartbeat_window", problem)
    if url.startswith("sqlite://"):
        from admission.store.sqlite import SqliteStore, path_of

        try:
            path_of(url)
        except ValueError as exc:
            raise BadRequest("url", str(exc)) from None
        return SqliteStore(url, actor, clock, busy_timeout=call_timeout, create=create,
                           heartbeat_window=heartbeat_window)
    if url.startswith(("postgresql://", "postgres://")):
        from admission.store.postgres import PostgresStore

        return PostgresStore(url, actor, clock, call_timeout=call_timeout, create=create,
                             heartbeat_window=heartbeat_window)
    raise BadRequest("url", f"unknown store url {url!r}: want sqlite:///path or postgresql://...")


def closure_store(url: str, actor: str = "fleet", clock: Callable[[], float] = time.time) -> "StoreClosures":
    """The provider-closure store of the host group at `url`, for `admission.pool.AdmissionPool`.

    Opens (creating or migrating) the admission store like `open_store`, with the same
    errors; `actor` names this fleet in the closures it writes and in the audit rows.
    The returned object owns the store: close it when done.
    """
    return StoreClosures(open_store(url, actor=actor, clock=clock))


__all__ = [
    "closure_store", "StoreClosures", "ClosureStoreUnreachable",
    "open_store", "AdmissionStore", "Request", "Record", "Lease", "Event", "Closure", "Health", "Policy", "Orchestrator",
    "StoreError", "StoreUnreachable", "StoreTimeout", "SchemaTooNew", "SchemaMissing", "QuotaConfigInvalid", "BadRequest", "UnknownRequest",
    "NotOwner", "IdentityConflict", "LeaseLost", "NotAwaitingApproval", "STATES", "TERMINAL_STATES", "LIVE_STATES",
    "HOLDING_STATES", "TIERS", "UnknownTier", "tier_of", "DEFAULT_HEARTBEAT_WINDOW",
    "Backpressure", "BlockedCapacity", "BlockedApproval", "BlockedPolicy", "Preempted", "TimedOut", "backpressure_of",
    "QUEUED", "ADMITTED", "AWAITING_APPROVAL", "DENIED", "CANCELLED", "TIMED_OUT", "PREEMPTED", "RELEASED",
]
