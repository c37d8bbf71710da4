"""The admission's vocabularies: the host-group lease store's request states and audit
event kinds, and the provider admission's bulkhead states and closure causes.

A request's state and an audit row's kind are written to the store's tables and read
back by every orchestrator of the host group, by ``fleetctl leases`` and by the SQL
itself; a bulkhead's state and its closure's cause are published in the shared table
(by code: their order is the wire order) and shown by ``fleetctl status``. So the
words are a wire format: never rename one. This module imports nothing;
`admission.store`, `admission.state` and `fleet.rules.vocab` re-export it.
"""

# --- request states --------------------------------------------------------------
QUEUED = "queued"
ADMITTED = "admitted"
DENIED = "denied"
CANCELLED = "cancelled"
TIMED_OUT = "timed-out"
PREEMPTED = "preempted"
#: An admitted request whose orchestrator gave the lease back when its work ended. The
#: reference names no state for that; it is terminal like the others.
RELEASED = "released"
#: Admitted, but held for an approval before it may dispatch: it keeps its admission and
#: its capacity while its lease is renewed, until someone approves (-> admitted) or
#: rejects (-> denied) it.
AWAITING_APPROVAL = "awaiting-approval"

STATES = (QUEUED, ADMITTED, DENIED, CANCELLED, TIMED_OUT, PREEMPTED, RELEASED, AWAITING_APPROVAL)
LIVE_STATES = (QUEUED, ADMITTED, AWAITING_APPROVAL)
TERMINAL_STATES = (DENIED, CANCELLED, TIMED_OUT, PREEMPTED, RELEASED)
#: The states that hold capacity under a renewable lease (count against every quota).
HOLDING_STATES = (ADMITTED, AWAITING_APPROVAL)

# --- audit event kinds: one row per decision ----------------------------------------
# A request's state change is logged under the name of the state it enters; the others:
RENEWED = "renewed"  # an admitted lease's expiry moved on (its revision bumped)
POLICY = "policy"  # the quota policy was replaced
CLOSURE = "closure"  # a provider closure was filed
REOPENED = "reopened"  # a provider closure was lifted early
APPROVED = "approved"  # a request awaiting approval was approved: it is admitted now
REJECTED = "rejected"  # a request awaiting approval was rejected: it is denied now

EVENT_KINDS = (QUEUED, ADMITTED, RENEWED, RELEASED, CANCELLED, TIMED_OUT, DENIED, PREEMPTED, POLICY, CLOSURE,
               REOPENED, AWAITING_APPROVAL, APPROVED, REJECTED)

# --- backpressure: what a request that may not dispatch tells its caller (reference 001) ----
BLOCKED_CAPACITY = "blocked/capacity"  # queued for capacity: ask again later
BLOCKED_POLICY = "blocked/policy"  # denied by policy (or rejected): asking again cannot help
BLOCKED_APPROVAL = "blocked/approval"  # held for an approval: keep renewing, ask again later
BACKPRESSURE = (BLOCKED_CAPACITY, BLOCKED_POLICY, BLOCKED_APPROVAL, PREEMPTED, TIMED_OUT)


# --- the provider admission: a bulkhead's state, and why a pool closed -----------------
class BulkheadState:
    """The state of a pool's bulkhead, as its census row and `fleetctl status` say it."""

    OPEN = "open"  # admitting
    BACKOFF = "backoff"  # a 429 holds it back for a while
    CLOSED = "closed"  # closed until a time (a daily limit, no credit, a rejected key, a budget, an operator)


#: A bulkhead record's state code is its index here (0: the record is unused).
BULKHEAD_STATES = (None, BulkheadState.OPEN, BulkheadState.BACKOFF, BulkheadState.CLOSED)


class ClosureCause:
    """Why a pool refused, and so why it backs off or closes (`admission.state`)."""

    RATE_LIMIT = "rate-limit"  # 429: backs off the one pool, never closes it
    DAILY_LIMIT = "daily-limit"
    CREDIT = "credit"
    REJECTED_KEY = "rejected-key"
    BUDGET = "budget"  # the provider's daily budget reading reached its limit
    OPERATOR = "operator"  # an operator closed it


#: A bulkhead record's cause code is its index here (0: none).
CLOSURE_CAUSES = (None, ClosureCause.RATE_LIMIT, ClosureCause.DAILY_LIMIT, ClosureCause.CREDIT,
                  ClosureCause.REJECTED_KEY, ClosureCause.BUDGET, ClosureCause.OPERATOR)


def sql_list(states) -> str:
    """``'queued', 'admitted'``: `states` as an SQL list of literals, for an ``IN (...)``."""
    return ", ".join(f"'{s}'" for s in states)
