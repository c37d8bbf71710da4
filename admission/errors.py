"""The errors fleet and the provider admission share: the error base, the configuration
error, and `Refused`, the exception a handler raises when its provider refused the call.

They live here, below fleet, so that `admission` stands alone (it imports nothing of
fleet); fleet re-exports them (`fleet.FleetError`, `fleet.ConfigError`, `fleet.Refused`
are these classes) and `fleet.rules.errors` holds the rest of the exit-code table.
This module imports only the standard library: `Refused.from_exception` and
`Refused.from_response` recognise the HTTP clients' classes (openai, anthropic, httpx,
httpx2, requests) only when their modules are already imported, never importing one.
"""
from __future__ import annotations

import math
import re
import sys
import time

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

    @classmethod
    def from_response(cls, response, *, at: float | None = None) -> "Refused | None":
        """The refusal an HTTP response of httpx, httpx2 or requests carries, or None when
        its status is no refusal (a success, a 5xx, a 404 ...).

        `status` is the response's (but a spent account that a provider answers with
        another status is a 402: OpenAI's 429 ``insufficient_quota``, Anthropic's 400 "credit
        balance is too low"), `message` the body's ``error.message`` (else its first 200
        characters), `retry_after` the wait the headers ask for (see `wait_from_headers`).
        Raises TypeError for an object that is no such response.
        """
        if not _is_instance(response, _RESPONSES):
            raise TypeError("Refused.from_response takes a response of httpx, httpx2 or requests, "
                            f"not {type(response).__module__}.{type(response).__qualname__}")
        status, headers = int(response.status_code), response.headers
        message, code = _error_of(_text_of(response))
        if any(status == was and (code in codes or _SPENT_RE.search(message)) for was, codes in _SPENT):
            status = 402
        if status not in REFUSAL_STATUSES:
            return None
        return cls(status, message or str(getattr(response, "reason_phrase", None) or getattr(response, "reason", "")),
                   retry_after=wait_from_headers(headers), at=at)

    @classmethod
    def from_exception(cls, exc: BaseException, *, at: float | None = None) -> "Refused | None":
        """The refusal an HTTP client's error carries: openai's and anthropic's
        ``APIStatusError`` (raised by their SDKs), httpx's and httpx2's ``HTTPStatusError`` and
        requests' ``HTTPError`` (raised by ``raise_for_status()``), read from its response as
        `from_response` reads one. None for any other exception (a timeout, a refused
        connection, a handler's own error) and for a status that is no refusal, so a handler
        re-raises those as they are::

            except Exception as exc:
                raise fleet.Refused.from_exception(exc) or exc
        """
        if isinstance(exc, Refused):
            return exc
        if not _is_instance(exc, _ERRORS):
            return None
        response = getattr(exc, "response", None)
        return None if response is None or not _is_instance(response, _RESPONSES) else \
            cls.from_response(response, at=at)


#: The HTTP statuses the provider admission reads as a refusal (admission.state.classify):
#: 429 backs the pool off; 402 and 401/403 close the key. Any other status is no refusal.
REFUSAL_STATUSES = frozenset({401, 402, 403, 429})

#: Answers that say the account is spent, given with another status than 402:
#: (status, the body's error codes or types that say so); `_SPENT_RE` matches the message.
_SPENT = ((429, {"insufficient_quota"}), (400, set()))
_SPENT_RE = re.compile(r"credit balance is too low|insufficient[_ ]quota", re.IGNORECASE)

#: (module, class) of what the clients answer with, and of the errors that carry an answer.
_RESPONSES = (("httpx", "Response"), ("httpx2", "Response"), ("requests", "Response"))
_ERRORS = (("openai", "APIStatusError"), ("anthropic", "APIStatusError"), ("httpx", "HTTPStatusError"),
           ("httpx2", "HTTPStatusError"), ("requests", "HTTPError"))


def _is_instance(obj, classes) -> bool:
    """Is `obj` an instance of one of `classes`, among the modules already imported (an
    object of a module's class cannot exist before that module is imported)?"""
    for module, name in classes:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(obj, cls):
            return True
    return False


def _text_of(response) -> str:
    try:
        return response.text or ""
    except Exception:  # a streamed body not read, a body that does not decode
        return ""


def _error_of(text: str) -> tuple[str, str | None]:
    """(message, code) of an error body: ``{"error": {"message", "code" or "type"}}`` as OpenAI,
    Anthropic and OpenRouter write it; the text itself (200 characters) when it is not JSON."""
    import json  # here: as email below, json's package weighs on every process's start

    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:200], None
    error = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return text.strip()[:200], None
    message = error.get("message")
    code = error.get("code") or error.get("type")
    return (message if isinstance(message, str) else text.strip()[:200]), (code if isinstance(code, str) else None)


#: The headers that say when a limit resets, and how many calls or tokens it has left:
#: OpenAI's ``x-ratelimit-reset-{requests,tokens}`` (a duration: ``1s``, ``6m0s``, ``20ms``)
#: and Anthropic's ``anthropic-ratelimit-*-reset`` (an RFC 3339 instant).
_OPENAI_LIMITS = ("requests", "tokens")
_ANTHROPIC_LIMITS = ("requests", "tokens", "input-tokens", "output-tokens")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def wait_from_headers(headers, now: float | None = None) -> float | None:
    """Seconds a refusal's headers ask the caller to wait, or None when they say nothing.

    In order: ``retry-after-ms``; ``Retry-After`` (seconds, or an HTTP date); then the limits'
    reset headers: the latest reset among the limits whose remaining count is 0, or, when
    none says so, the earliest reset. Instants count from the response's ``Date`` (so the
    provider's clock is compared with itself), else from `now` (default: this host's clock).
    A value that cannot be read is passed over; a wait is never negative.
    """
    now = _date_of(headers, now)
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = _seconds(headers.get(name))
        if value is not None:
            return max(0.0, value * scale)
    when = _http_date(headers.get("retry-after"))
    if when is not None:
        return max(0.0, when - now)
    resets, spent = {}, set()
    for limit in _OPENAI_LIMITS:
        resets[f"x-{limit}"] = _duration(headers.get(f"x-ratelimit-reset-{limit}"))
        if _seconds(headers.get(f"x-ratelimit-remaining-{limit}")) == 0:
            spent.add(f"x-{limit}")
    for limit in _ANTHROPIC_LIMITS:
        instant = _rfc3339(headers.get(f"anthropic-ratelimit-{limit}-reset"))
        resets[f"a-{limit}"] = None if instant is None else instant - now
        if _seconds(headers.get(f"anthropic-ratelimit-{limit}-remaining")) == 0:
            spent.add(f"a-{limit}")
    known = {k: v for k, v in resets.items() if v is not None}
    if not known:
        return None
    exhausted = [v for k, v in known.items() if k in spent]
    return max(0.0, max(exhausted) if exhausted else min(known.values()))


def _seconds(value) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _duration(value) -> float | None:
    """``6m0s``, ``1.5s``, ``20ms``, ``1h2m3s`` in seconds (a bare number: seconds)."""
    if value is None:
        return None
    text = str(value).strip()
    if _seconds(text) is not None:
        return _seconds(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _http_date(value) -> float | None:
    # imported here: this module loads with `import fleet` (in every process of a fleet,
    # the fork server's too), and email's package costs ~9 ms of each one's start
    import email.utils

    try:
        parsed = email.utils.parsedate_tz(value) if value else None
        return None if parsed is None else float(email.utils.mktime_tz(parsed))
    except (TypeError, ValueError, OverflowError):
        return None


def _rfc3339(value) -> float | None:
    import calendar  # here, as email above
    from datetime import datetime

    try:
        when = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00")) if value else None
    except ValueError:
        return None
    if when is None or when.tzinfo is None:
        return None
    return calendar.timegm(when.utctimetuple()) + when.microsecond / 1e6


def _date_of(headers, now: float | None) -> float:
    date = _http_date(headers.get("date"))
    if date is not None:
        return date
    return time.time() if now is None else now
