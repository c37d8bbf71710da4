"""The errors fleet and the provider admission share: the error base, the configuration
error, and `Refused`, the exception a handler raises when its provider refused the call.

They live here, below fleet, so that `admission` stands alone (it imports nothing of
fleet); fleet re-exports them (`fleet.FleetError`, `fleet.ConfigError`, `fleet.Refused`
are these classes) and `fleet.rules.errors` holds the rest of the exit-code table.
This module imports only the standard library.
"""
from __future__ import annotations

import math

# The exit codes these errors carry (sysexits.h where one fits); the binaries exit with them.
EXIT_FAILURE = 1
EXIT_CONFIG = 78  # EX_CONFIG: the configuration is invalid


class FleetError(Exception):
    """Base of every error fleet raises on purpose."""

    exit_code: int = EXIT_FAILURE


class ConfigError(FleetError, ValueError):
    """Configuration (file, dict or environment) is invalid.

    `path` is the dotted path of the offending key, e.g. ``roles.solver.kind``.
    """

    exit_code = EXIT_CONFIG

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


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
