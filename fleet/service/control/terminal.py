"""What the ops' fleetctl halves share (pure): an operator's words parsed into an op's
arguments, and a reply rendered as text.

Parsing never judges a value the daemon judges (a posture threshold, a pool): it only
turns words into the JSON the op's schema takes, so the daemon names what is wrong.
"""
from __future__ import annotations

import calendar
import json
import math
import re
import time

from fleet.rules.errors import EXIT_USAGE, FleetError


class PostureArgumentError(FleetError, ValueError):
    """A ``KEY=VALUE`` argument that is not one (no ``=``, empty key, key given twice)."""

    exit_code = EXIT_USAGE


class AdmissionArgumentError(FleetError, ValueError):
    """A time that is none of the accepted forms."""

    exit_code = EXIT_USAGE


def parse_value(text: str):
    """``"3"`` -> 3, ``"2.5"`` -> 2.5, ``"null"``/``"none"`` -> None; anything else stays a string.

    A string is sent as is so that the daemon, the one validator, names what is
    wrong with it; parsing here never judges a value.
    """
    stripped = text.strip()
    if stripped.lower() in ("null", "none"):
        return None
    try:
        return int(stripped)
    except ValueError:
        pass
    try:
        value = float(stripped)
    except ValueError:
        return text
    # nan/inf are not JSON; leave them as text for the daemon to refuse by name
    return value if value == value and value not in (float("inf"), float("-inf")) else text


def parse_patch(assignments) -> dict:
    """``["cordon_enter_events=3", ...]`` -> ``{"cordon_enter_events": 3, ...}``.

    Raises PostureArgumentError for an item without ``=``, with an empty key, or a
    key given twice. Unknown keys pass through: the op's check names them.
    """
    patch = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise PostureArgumentError(f"{item!r} is not KEY=VALUE (e.g. cordon_duty_percent=5)")
        if key in patch:
            raise PostureArgumentError(f"{key} is given twice")
        patch[key] = parse_value(value)
    return patch


def posture_text(result, changed=()) -> str:
    """The daemon's posture reply as text; keys in ``changed`` are marked ``*``."""
    if not isinstance(result, dict) or "policy" not in result:
        return json.dumps(result, indent=2) + "\n"
    lines = [f"posture   {result.get('posture', '?')}"]
    causes = result.get("causes")
    if causes:
        lines.append(f"held by   {', '.join(causes)}")
    counters = (
        ("entered", "enter_count", ""),
        ("exited", "exit_count", ""),
        ("cordoned", "cordoned_dwell_ms", " ms"),
        ("window", "window_events", " events"),
        ("duty", "window_duty_percent", "%"),
    )
    shown = [f"{label} {result[key]}{unit}" for label, key, unit in counters if key in result]
    if shown:
        lines.append("          " + "; ".join(shown))
    lines.append("policy")
    policy = result["policy"]
    width = max(map(len, policy), default=0)
    for key, value in policy.items():
        mark = "*" if key in changed else " "
        lines.append(f" {mark}{key:<{width}}  {'null' if value is None else value}")
    return "\n".join(lines) + "\n"


_DURATION = re.compile(r"\+(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_FORMATS = ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%MZ", "%Y-%m-%d %H:%M",
            "%Y-%m-%d")
#: The forms `parse_until` takes, for help texts and its refusal.
UNTIL_FORMS = "UTC time (2026-10-05T00:00:00Z), epoch seconds, or +DURATION (+35m, +2h)"


def parse_until(text: str, now: float) -> float:
    """A closing time as UTC epoch seconds: a UTC time, epoch seconds, or ``+DURATION``
    from ``now``; AdmissionArgumentError if it is none of them."""
    text = text.strip()
    m = _DURATION.fullmatch(text)
    if m:
        return now + float(m.group(1)) * _UNITS[m.group(2)]
    try:
        epoch = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(epoch):
            return epoch
        raise AdmissionArgumentError(f"--until {text!r}: a closure ends at a finite time")
    for fmt in _FORMATS:
        try:
            return float(calendar.timegm(time.strptime(text, fmt)))
        except ValueError:
            continue
    raise AdmissionArgumentError(f"--until {text!r}: expected a {UNTIL_FORMS}")


def fields_text(result) -> str:
    """Any reply as ``key: <json>`` lines (an object) or one JSON line."""
    if isinstance(result, dict):
        return "".join(f"{k}: {json.dumps(v)}\n" for k, v in result.items())
    return json.dumps(result) + "\n"
