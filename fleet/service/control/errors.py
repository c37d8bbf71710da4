"""The control protocol's error types: the exceptions either side raises, and the
error type names (``E_*``) that error replies carry on the wire."""
from __future__ import annotations

from typing import Any

from fleet.rules.errors import EXIT_BUSY, EXIT_CONFIG, EXIT_DATA, EXIT_FAILURE, EXIT_NO_PERMISSION, EXIT_NOT_RUNNING, EXIT_USAGE, FleetError, NotRunning


# Error types carried in error replies. Handler errors that are FleetErrors travel
# under their class name (e.g. "ConfigError") so clients can tell them apart.
E_MALFORMED = "MalformedRequest"  # not UTF-8, not JSON
E_TOO_LARGE = "FrameTooLarge"
E_INVALID = "InvalidRequest"  # JSON, but not a request envelope
E_UNKNOWN_OP = "UnknownOp"
E_INVALID_ARGS = "InvalidArgs"
E_PERMISSION = "PermissionDenied"
E_TIMEOUT = "Timeout"  # the daemon's loop did not take the call in time: it never runs
E_OUTCOME_UNKNOWN = "OutcomeUnknown"  # the call was still running at its deadline: it may have done its work
E_SHUTTING_DOWN = "ShuttingDown"
E_BUSY = "Busy"
E_INTERNAL = "InternalError"
E_INVALID_REPLY = "InvalidReply"


class ControlError(FleetError):
    """Base of the control protocol's errors."""


class ProtocolError(ControlError):
    """A frame, request or reply broke the protocol.

    ``code`` is the error type sent on the wire (e.g. ``InvalidArgs``); ``message``
    names what was wrong; ``request_id`` is the request's id once it is known.
    """

    exit_code = EXIT_USAGE

    def __init__(self, code: str, message: str, request_id: Any = None):
        self.code = code
        self.message = message
        self.request_id = request_id
        super().__init__(f"{code}: {message}")


class RemoteError(ControlError):
    """The daemon answered a request with an error reply: ``type`` and ``message``."""

    #: Exit codes for error types the caller caused; any other type exits 1.
    EXIT_CODES = {
        **dict.fromkeys((E_MALFORMED, E_TOO_LARGE, E_INVALID, E_UNKNOWN_OP, E_INVALID_ARGS), EXIT_USAGE),
        # the daemon refused a value (e.g. a posture threshold): what fleet.rules.posture raises
        "ConfigError": EXIT_CONFIG,
        "PostureRetuneError": EXIT_CONFIG,
        E_PERMISSION: EXIT_NO_PERMISSION,
        "UnknownUnit": EXIT_DATA,  # fleetctl why of an id the fleet never handed out
    }

    def __init__(self, type: str, message: str):
        self.type = type
        self.message = message
        super().__init__(f"{type}: {message}")
        self.exit_code = self.EXIT_CODES.get(type, EXIT_FAILURE)


class PermissionDenied(RemoteError):
    """The peer may not run that op (mutating op from another uid), or may not connect."""

    def __init__(self, message: str):
        super().__init__(E_PERMISSION, message)


class ControlBusy(RemoteError):
    """The daemon refused the connection: every control connection it allows is busy
    (its own limits, see `ControlServer`). Try again shortly; nothing was run."""

    def __init__(self, message: str):
        super().__init__(E_BUSY, message)
        self.exit_code = EXIT_BUSY


class ControlTimeout(ControlError):
    """The daemon did not reply within the client's timeout. ``sent``: the whole request
    had gone out (the daemon may have run it); False: it had not (nothing ran)."""

    def __init__(self, message: str, *, sent: bool = True):
        super().__init__(message)
        self.sent = sent


class ReplyLost(NotRunning):
    """The daemon closed the connection after the request went out, before replying:
    it may have run the request."""


class SubmitUncertain(ControlError):
    """A service-mode submit whose reply never came (none in time, or the connection
    broke after the request went out): fleetd may have admitted the unit, and then it
    runs. ``request_id`` is the caller's, if it gave one: submitting again with the same
    request_id and the same arguments is safe, fleetd admits one unit per request_id
    (`fleet.service.replays`), and the new future gets that unit's outcome. Without one, a
    retry may run the unit twice."""

    exit_code = EXIT_NOT_RUNNING

    def __init__(self, message: str, *, role: str, request_id: str | None):
        super().__init__(message)
        self.role, self.request_id = role, request_id


class ShuttingDown(ControlError):
    """The daemon is stopping and takes no more control requests."""


class FleetConnectionLost(ControlError):
    """A service-mode client lost its daemon (it died, or the socket broke) before an
    outcome arrived: every future still pending fails with this, none is left hanging."""

    exit_code = EXIT_NOT_RUNNING


class OutcomesDropped(FleetConnectionLost):
    """The daemon dropped outcomes held for a client token that was not collected in time
    or held more than its bound (see `CollectOp`): the client's pending futures fail."""
