"""Unit outcomes and failure reasons: the vocabulary the ledger, the table and the tools share.

Every unit ends with exactly one outcome: solved, suppressed, or failed with one
reason. A reason's code is its index in `FAILURE_REASONS`; the table's ledger
record keeps one counter per code (``failed_by_reason``), so the order here is the
wire order and must only ever be appended to.

This module imports nothing: `fleetctl status` and the metrics exporter read it
without pulling in the runtime.
"""

# --- outcomes -------------------------------------------------------------------
SOLVED = "solved"
SUPPRESSED = "suppressed"
FAILED = "failed"
KINDS = (SOLVED, SUPPRESSED, FAILED)
OUTCOMES = KINDS

# --- failure reasons, by code ------------------------------------------------------
HANDLER_ERROR = 0  # the handler raised, or the worker could not unpickle its payload (the traceback travels)
TIMEOUT = 1  # the unit ran past its timeout
LANE_DEATH = 2  # the worker serving the unit died mid-unit
SHUTDOWN = 3  # the fleet stopped before the unit ran (queued past the drain grace)
REFUSED = 4  # an admission refused it (a full queue, a closed provider: 429/402/403)
ROLE_STOPPED = 5  # its role was stopped (restart intensity exceeded)
RESULT_ERROR = 6  # the result could not be returned (not picklable, too large, not unpicklable here)
CANCELLED = 7  # the caller cancelled it before it ran
FSM_REFUSED = 8  # a slot refused its grant, start or completion: a broken FSM rule, never a death
# Its host-group lease ended before its outcome (fleet.runtime.lease_gate): ran out unrenewed, timed out
# in the queue, or was cancelled or released by another. Code 9 was named LeaseLost and
# covered the two below as well; readers older than them show 10 and 11 as ?10 and ?11.
LEASE_EXPIRED = 9
LEASE_DENIED = 10  # the host group's policy refuses its request (not retryable)
LEASE_PREEMPTED = 11  # a higher-priority request displaced its preemptible lease

FAILURE_REASONS = (
    "HandlerError",
    "Timeout",
    "LaneDeath",
    "Shutdown",
    "Refused",
    "RoleStopped",
    "ResultError",
    "Cancelled",
    "FsmRefused",
    "LeaseExpired",
    "LeaseDenied",
    "LeasePreempted",
)
N_FAILURE_REASONS = len(FAILURE_REASONS)
REASON_CODES = {name: code for code, name in enumerate(FAILURE_REASONS)}


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
    """

    def __init__(self, status: int, message: str = "", retry_after: float | None = None):
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ValueError(f"Refused: status must be an HTTP status code (100..599), not {status!r}")
        if retry_after is not None:
            if isinstance(retry_after, bool) or not isinstance(retry_after, (int, float)) or not retry_after >= 0:
                raise ValueError(f"Refused: retry_after must be seconds >= 0 or None, not {retry_after!r}")
            retry_after = float(retry_after)
        if not isinstance(message, str):
            raise ValueError(f"Refused: message must be a string, not {type(message).__name__}")
        self.status, self.message, self.retry_after = status, message, retry_after
        text = f"{status} {message}".strip()
        super().__init__(text if retry_after is None else f"{text} (retry after {retry_after:g} s)")

    def __reduce__(self):
        # Keyword fields do not survive Exception's default pickling (args only).
        return (Refused, (self.status, self.message, self.retry_after))
