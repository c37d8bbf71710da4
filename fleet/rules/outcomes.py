"""Unit outcomes and failure reasons: the ledger's, the table's and the tools' reading of them.

Every unit ends with exactly one outcome: solved, suppressed, or failed with one
reason. The words and their codes are `fleet.rules.vocab`'s (re-exported here); this
module adds the lookups by code and by name, and re-exports `Refused`, the exception a
handler raises to fail its unit Refused (its home is `admission.errors`: the provider
admission reads it too, and imports nothing of fleet).

It imports only the vocabulary and `Refused`: `fleetctl status` and the metrics exporter
read it without pulling in the runtime.
"""
from admission.errors import Refused  # noqa: F401 - re-exported: a handler's refusal
from fleet.rules.vocab import (  # noqa: F401 - the vocabulary's home is fleet.rules.vocab; re-exported here
    CANCELLED,
    FAILED,
    FAILURE_REASONS,
    FSM_REFUSED,
    HANDLER_ERROR,
    LANE_DEATH,
    LEASE_DENIED,
    LEASE_EXPIRED,
    LEASE_PREEMPTED,
    N_FAILURE_REASONS,
    OUTCOME_KINDS,
    REASON_CODES,
    REFUSED,
    RESULT_ERROR,
    ROLE_STOPPED,
    SHUTDOWN,
    SOLVED,
    SUPPRESSED,
    TIMEOUT,
    Reason,
)

KINDS = OUTCOME_KINDS
OUTCOMES = OUTCOME_KINDS


def reason_name(code: int) -> str:
    """The name of failure reason ``code``; ``"?<code>"`` for a code this version does not know."""
    return FAILURE_REASONS[code] if 0 <= code < N_FAILURE_REASONS else f"?{code}"


def reason_code(name: str) -> int:
    """The code of failure reason ``name``; ValueError listing the known names if none."""
    try:
        return REASON_CODES[name]
    except KeyError:
        raise ValueError(f"unknown failure reason {name!r}; reasons: {', '.join(FAILURE_REASONS)}") from None
