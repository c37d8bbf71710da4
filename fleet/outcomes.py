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
HANDLER_ERROR = 0  # the handler raised (the traceback travels with the outcome)
TIMEOUT = 1  # the unit ran past its timeout
LANE_DEATH = 2  # the worker serving the unit died mid-unit
SHUTDOWN = 3  # the fleet stopped before the unit ran (queued past the drain grace)
REFUSED = 4  # an admission refused it (a full queue, a closed provider: 429/402/403)
ROLE_STOPPED = 5  # its role was stopped (restart intensity exceeded)
RESULT_ERROR = 6  # the result could not be returned (not picklable, too large)
CANCELLED = 7  # the caller cancelled it before it ran
FSM_REFUSED = 8  # a slot refused its grant, start or completion: a broken FSM rule, never a death

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
