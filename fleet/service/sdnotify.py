"""sd_notify: tell the service manager about readiness, status, liveness and shutdown.

The protocol (sd_notify(3)) is one AF_UNIX SOCK_DGRAM datagram per message, sent to
the address in ``$NOTIFY_SOCKET``, carrying newline-separated ``KEY=VALUE`` lines
such as ``READY=1``. A leading ``@`` in the address names the Linux abstract
namespace. When ``$NOTIFY_SOCKET`` is unset the process is not supervised by a
notify-aware manager and every call here is a no-op returning False.

The watchdog: systemd sets ``WATCHDOG_USEC`` (and ``WATCHDOG_PID``, the pid it is
meant for) when the unit has ``WatchdogSec=``. The service pings ``WATCHDOG=1`` at
half that period; `WatchdogSchedule` is the pure bookkeeping for that, with the
clock passed in so the daemon's loop (and tests) own time.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from fleet.rules.errors import FleetError

__all__ = [
    "NotifyError",
    "Notifier",
    "WatchdogSchedule",
    "extend_timeout",
    "notify",
    "ready",
    "reloading",
    "status",
    "stopping",
    "watchdog",
    "watchdog_interval",
]


class NotifyError(FleetError):
    """``$NOTIFY_SOCKET`` or ``$WATCHDOG_USEC`` is malformed, or a datagram could not be sent."""


def _address(raw: str) -> str:
    """Turn a ``$NOTIFY_SOCKET`` value into an address for ``socket.sendto``."""
    if raw.startswith("@"):
        # Abstract namespace: the kernel name starts with a NUL byte instead of '@'.
        return "\0" + raw[1:]
    if raw.startswith("/"):
        return raw
    raise NotifyError(
        f"NOTIFY_SOCKET={raw!r}: expected an absolute path or an '@abstract' name"
    )


def _one_line(text: str) -> str:
    # A newline would end the STATUS= field and let the text inject other fields
    # (e.g. a unit name containing "\nREADY=1"), so fold line breaks to spaces.
    return " ".join(text.splitlines())


class Notifier:
    """Sends notification datagrams to one address.

    Construct with `Notifier.from_env()`; it returns None when no manager listens.
    A fresh socket per message keeps the notifier fork-safe and free of state.
    """

    def __init__(self, address: str):
        """``address`` is a ``$NOTIFY_SOCKET`` value (``/path`` or ``@name``)."""
        self.raw = address
        self._address = _address(address)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Notifier | None:
        """The notifier for ``env["NOTIFY_SOCKET"]`` (default os.environ), or None if unset.

        Raises NotifyError when the variable is set but not a usable address.
        """
        env = os.environ if env is None else env
        raw = env.get("NOTIFY_SOCKET", "")
        return cls(raw) if raw else None

    def send(self, *fields: str) -> None:
        """Send ``fields`` (``KEY=VALUE`` strings) as one datagram.

        Raises NotifyError naming the socket when the datagram cannot be delivered.
        """
        payload = "\n".join(fields).encode("utf-8")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            try:
                sock.sendto(payload, self._address)
            except OSError as exc:
                raise NotifyError(f"NOTIFY_SOCKET={self.raw!r}: send failed: {exc}") from exc


def notify(*fields: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``fields`` to ``$NOTIFY_SOCKET``; returns False (and does nothing) when unset."""
    notifier = Notifier.from_env(env)
    if notifier is None:
        return False
    notifier.send(*fields)
    return True


def ready(status_text: str | None = None, *, env: Mapping[str, str] | None = None) -> bool:
    """``READY=1``: startup is complete (workers are up); optionally with a STATUS line."""
    fields = ["READY=1"]
    if status_text is not None:
        fields.append(f"STATUS={_one_line(status_text)}")
    return notify(*fields, env=env)


def status(text: str, *, env: Mapping[str, str] | None = None) -> bool:
    """``STATUS=text``: a one-line summary shown by ``systemctl status``."""
    return notify(f"STATUS={_one_line(text)}", env=env)


def watchdog(*, env: Mapping[str, str] | None = None) -> bool:
    """``WATCHDOG=1``: the main loop is alive."""
    return notify("WATCHDOG=1", env=env)


def stopping(*, env: Mapping[str, str] | None = None) -> bool:
    """``STOPPING=1``: shutdown has begun."""
    return notify("STOPPING=1", env=env)


def reloading(*, env: Mapping[str, str] | None = None) -> bool:
    """``RELOADING=1``: a configuration reload (SIGHUP) began; send `ready` when done."""
    return notify("RELOADING=1", env=env)


def extend_timeout(seconds: float, *, env: Mapping[str, str] | None = None) -> bool:
    """``EXTEND_TIMEOUT_USEC``: ask for more time in a slow start or stop phase."""
    if not seconds > 0:
        raise NotifyError(f"extend_timeout: seconds must be > 0, got {seconds!r}")
    return notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}", env=env)


def watchdog_interval(
    env: Mapping[str, str] | None = None, *, pid: int | None = None
) -> float | None:
    """Seconds between watchdog pings: half of ``$WATCHDOG_USEC``, or None when not asked.

    None when ``WATCHDOG_USEC`` is unset, or when ``WATCHDOG_PID`` is set and names
    another process (the variable was inherited, the watchdog is not ours). ``pid``
    defaults to ``os.getpid()``.

    Raises NotifyError when either variable is set but not a positive integer.
    """
    env = os.environ if env is None else env
    raw_usec = env.get("WATCHDOG_USEC")
    if raw_usec is None:
        return None
    raw_pid = env.get("WATCHDOG_PID")
    if raw_pid is not None:
        if _positive_int("WATCHDOG_PID", raw_pid) != (os.getpid() if pid is None else pid):
            return None
    # Half the period: one late ping still lands inside the manager's deadline.
    return _positive_int("WATCHDOG_USEC", raw_usec) / 2_000_000


def _positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw, 10)
    except ValueError:
        raise NotifyError(f"{name}={raw!r}: expected a positive integer") from None
    if value <= 0:
        raise NotifyError(f"{name}={raw!r}: expected a positive integer")
    return value


class WatchdogSchedule:
    """When the next watchdog ping is due. Pure: every method takes ``now``.

    ``now`` is any monotonic clock reading in seconds (the daemon passes
    ``time.monotonic()``). The first ping is due at once, so a freshly started
    service confirms liveness immediately after READY.
    """

    def __init__(self, interval: float, now: float):
        """``interval`` is the ping period in seconds (see `watchdog_interval`)."""
        if not interval > 0:
            raise NotifyError(f"watchdog interval must be > 0 seconds, got {interval!r}")
        self.interval = float(interval)
        self.next_due = float(now)

    def due(self, now: float) -> bool:
        """True when a ping should be sent at ``now``."""
        return now >= self.next_due

    def remaining(self, now: float) -> float:
        """Seconds until the next ping is due (0.0 when overdue): a wait timeout for the loop."""
        return max(0.0, self.next_due - now)

    def pinged(self, now: float) -> None:
        """Record a ping sent at ``now``; the next one is due one interval later."""
        # Count from the actual ping, not from the old deadline: after a stall the
        # loop pings once and resumes the period, rather than bursting to catch up.
        self.next_due = now + self.interval
