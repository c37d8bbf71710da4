"""Demo handlers for trying a fleet out (``examples/fleet.toml`` names them).

Each takes a `fleet.Unit` and returns a picklable value, as every handler does.
"""
from __future__ import annotations

import time

from fleet.rules.unit import Suppress


def square(unit):
    """``payload * payload``."""
    return unit.payload * unit.payload


def slow_square(unit):
    """``payload * payload`` after sleeping ``payload / 1000`` seconds (at most 60 s):
    work that stays in flight long enough to watch in `fleetctl status`."""
    time.sleep(min(60.0, max(0.0, unit.payload / 1000)))
    return unit.payload * unit.payload


def word_count(unit):
    """``{word: count}`` for a text payload; an empty text is suppressed (nothing to do)."""
    words = str(unit.payload).split()
    if not words:
        raise Suppress("empty text")
    counts: dict[str, int] = {}
    for word in words:
        counts[word] = counts.get(word, 0) + 1
    return counts


def blob(unit):
    """``payload`` bytes: a result as large as asked, for trying large outcomes."""
    return bytes(int(unit.payload))


def fail(unit):
    """Always raises ValueError: what a failed unit looks like (outcome HandlerError)."""
    raise ValueError(f"cannot handle {unit.payload!r}")
