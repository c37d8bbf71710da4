"""The host-group lease store's vocabulary: request states and audit event kinds.

A request's state and an audit row's kind are written to the store's tables and read
back by every orchestrator of the host group, by ``fleetctl leases`` and by the SQL
itself, so the words are a wire format: never rename one. This module imports
nothing; `admission.store` and `fleet.rules.vocab` re-export it.
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

STATES = (QUEUED, ADMITTED, DENIED, CANCELLED, TIMED_OUT, PREEMPTED, RELEASED)
LIVE_STATES = (QUEUED, ADMITTED)
TERMINAL_STATES = (DENIED, CANCELLED, TIMED_OUT, PREEMPTED, RELEASED)

# --- audit event kinds: one row per decision ----------------------------------------
# A request's state change is logged under the name of the state it enters; the others:
RENEWED = "renewed"  # an admitted lease's expiry moved on (its revision bumped)
POLICY = "policy"  # the quota policy was replaced
CLOSURE = "closure"  # a provider closure was filed
REOPENED = "reopened"  # a provider closure was lifted early

EVENT_KINDS = (QUEUED, ADMITTED, RENEWED, RELEASED, CANCELLED, TIMED_OUT, DENIED, PREEMPTED, POLICY, CLOSURE,
               REOPENED)


def sql_list(states) -> str:
    """``'queued', 'admitted'``: `states` as an SQL list of literals, for an ``IN (...)``."""
    return ", ".join(f"'{s}'" for s in states)
