"""Outcome vocabulary: every unit ends solved, suppressed, or failed for one reason.

Pure names and codes, shared by the ledger, the table (failure counters by code),
the metrics and `fleetctl status`. A reason's code is its index here; the table has
room for 8, so append new reasons, never reorder.
"""

SOLVED = "solved"
SUPPRESSED = "suppressed"
FAILED = "failed"
KINDS = (SOLVED, SUPPRESSED, FAILED)

FAILURE_REASONS = (
    "HandlerError",  # the handler raised; the detail carries its traceback
    "Timeout",  # ran past its per-unit or per-role timeout; the worker was killed and replaced
    "LaneDeath",  # the worker serving it died; every unit it owed fails at once
    "Shutdown",  # still queued or running when the fleet shut down
    "Refused",  # a provider refused it (429/402/403), for the provider admission
    "RoleStopped",  # its role exceeded the restart intensity and takes no more work
    "ResultError",  # the handler's result could not be sent back (unpicklable, too large)
    "Cancelled",  # cancelled before it ran
)
REASON_CODES = {name: code for code, name in enumerate(FAILURE_REASONS)}
