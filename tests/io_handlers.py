"""Handlers the I/O-bound role tests name in their configs (``tests.io_handlers:NAME``).

`together` / `together_async` count how many units of this worker process run at once
(a lock-guarded counter shared by the pool threads and the loop thread): each waits up
to `patience` seconds for `want` units to run at the same time, holds a moment, and
returns the highest count this process has seen. Run one after another they never see
more than 1; run `want` at a time they see `want`, and never more than the slots.
"""
from __future__ import annotations

import asyncio
import os
import threading
import time

from fleet import Suppress
from tests import handlers as plain

_lock = threading.Lock()
_active = 0
_peak = 0


def _enter() -> None:
    global _active, _peak
    with _lock:
        _active += 1
        _peak = max(_peak, _active)


def _leave() -> int:
    global _active
    with _lock:
        _active -= 1
        return _peak


def together(unit):
    """Plain: (peak concurrency seen, pid, start, end); payload {want, patience, hold}."""
    p = unit.payload
    start = time.monotonic()
    _enter()
    try:
        deadline = start + p["patience"]
        while _active < p["want"] and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(p["hold"])
    finally:
        peak = _leave()
    return peak, os.getpid(), start, time.monotonic()


async def together_async(unit):
    """The same as `together`, awaiting instead of sleeping."""
    p = unit.payload
    start = time.monotonic()
    _enter()
    try:
        deadline = start + p["patience"]
        while _active < p["want"] and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await asyncio.sleep(p["hold"])
    finally:
        peak = _leave()
    return peak, os.getpid(), start, time.monotonic()


async def sleep_async(unit):
    await asyncio.sleep(unit.payload if unit.payload is not None else 3600)
    return unit.payload


def sleep_plain(unit):
    time.sleep(unit.payload if unit.payload is not None else 3600)
    return unit.payload


async def keyed_async(unit):
    """(key, payload, start, end) after a short await: a key's units must not overlap."""
    start = time.monotonic()
    await asyncio.sleep(0.02)
    return unit.key, unit.payload, start, time.monotonic()


def keyed_plain(unit):
    start = time.monotonic()
    time.sleep(0.02)
    return unit.key, unit.payload, start, time.monotonic()


# --- the outcome corpus of tests.handlers, as async def -------------------------------
async def sometimes_async(unit):
    await asyncio.sleep(0)
    return plain.sometimes(unit)


async def fail_async(unit):
    await asyncio.sleep(0)
    raise ValueError(f"bad payload {unit.payload!r}")


async def suppress_async(unit):
    await asyncio.sleep(0)
    raise Suppress(f"nothing to do for {unit.payload!r}")


async def unpicklable_async(unit):
    await asyncio.sleep(0)
    return threading.Lock()


async def raise_unpicklable_async(unit):
    await asyncio.sleep(0)
    raise plain.Unpicklable(threading.Lock())


async def exit_async(unit):
    """SystemExit inside a coroutine: an outcome (HandlerError), not the loop's end."""
    await asyncio.sleep(0)
    raise SystemExit(4)


def exit_plain(unit):
    raise SystemExit(4)


async def knows_itself_async(unit):
    """`handlers.knows_itself`, awaited: the Unit stays current across an await."""
    import fleet

    await asyncio.sleep(0)
    return plain.knows_itself(unit)


async def loop_selector(unit):
    """The class name of the selector under the seat's event loop."""
    return type(asyncio.get_running_loop()._selector).__name__


async def marked_async(unit):
    """`handlers.marked`, awaited: note the run, sleep on the loop, return the tag."""
    directory, tag, seconds = unit.payload
    plain.note_run(directory, tag)
    await asyncio.sleep(seconds)
    return tag
