"""Unit outcomes and failure reasons: the ledger's, the table's and the tools' reading of them.

Every unit ends with exactly one outcome: solved, suppressed, or failed with one
reason. The words and their codes are `fleet.rules.vocab`'s (re-exported here); this
module adds the lookups by code and by name, and `Refused`, the exception a handler
raises to fail its unit Refused.

It imports only the vocabulary: `fleetctl status` and the metrics exporter read it
without pulling in the runtime.
"""
import math

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


class Refused(Exception):
    """Raised by a handler: the provider refused the call (HTTP `status`), so the unit fails Refused.

    The provider admission reads it as a signal about the unit's route (reference 000 §8):
    429 backs off that one pool (honouring `retry_after`, seconds); 402 (credit), 401/403
    (a rejected key) close the key for a while; a 403 whose `message` names a daily limit
    closes the key until the next UTC midnight. Other statuses are plain failures.

    `at`: the host's monotonic instant (``time.monotonic()``) the provider answered, when
    the handler knows it; left None, the worker takes the instant the handler raised.
    A backoff or closure runs from then (Retry-After counts from the provider's answer),
    not from when the outcome reached the supervisor.
    """

    def __init__(self, status: int, message: str = "", retry_after: float | None = None, at: float | None = None):
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ValueError(f"Refused: status must be an HTTP status code (100..599), not {status!r}")
        if retry_after is not None:
            if isinstance(retry_after, bool) or not isinstance(retry_after, (int, float)) or not retry_after >= 0:
                raise ValueError(f"Refused: retry_after must be seconds >= 0 or None, not {retry_after!r}")
            retry_after = float(retry_after)
        if not isinstance(message, str):
            raise ValueError(f"Refused: message must be a string, not {type(message).__name__}")
        if at is not None:
            if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
                raise ValueError(f"Refused: at must be a time.monotonic() instant or None, not {at!r}")
            at = float(at)
        self.status, self.message, self.retry_after, self.at = status, message, retry_after, at
        text = f"{status} {message}".strip()
        super().__init__(text if retry_after is None else f"{text} (retry after {retry_after:g} s)")

    def __reduce__(self):
        # Keyword fields do not survive Exception's default pickling (args only).
        return (Refused, (self.status, self.message, self.retry_after, self.at))
