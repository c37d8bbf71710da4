"""Handlers that play a provider for the admission tests: each answers by the route it was given.

The payload is a script: ``{"<model@provider[/key]>" or "<provider>": [status, message, retry_after]}``
makes a unit on that route raise `fleet.Refused`; any other route answers cleanly with the
route it called (``str(unit.route)``), after reporting ``payload["cost"]`` if given.
``"while": PATH``: the refusals hold only while that file exists (a provider's state the
test changes: a storm passes, a key is topped up). ``"go": PATH``: answer only once that
file exists (a burst whose answers all come after its last submit). ``"sleep": SECONDS``:
each run takes that long before it answers (refused or not).
"""
from __future__ import annotations

import asyncio
import os
import time

import fleet


def _answer(unit):
    assert fleet.current_unit() is unit  # the handler's context is its own unit
    script = unit.payload or {}
    route = unit.route
    how = script.get(str(route)) or script.get(route.provider) if route is not None else None
    if script.get("while") and not os.path.exists(script["while"]):
        how = None
    if how:
        status, message, retry_after = how
        raise fleet.Refused(status, message, retry_after)
    if script.get("cost") is not None:
        fleet.report_cost(script["cost"])
    return None if route is None else str(route)


def call(unit):
    while (unit.payload or {}).get("go") and not os.path.exists(unit.payload["go"]):
        time.sleep(0.005)
    return _answer(unit)


async def call_async(unit):
    await asyncio.sleep((unit.payload or {}).get("sleep", 0))
    while (unit.payload or {}).get("go") and not os.path.exists(unit.payload["go"]):
        await asyncio.sleep(0.005)
    return _answer(unit)


def refuse_now(unit):
    """Refused 429 whose message is this process's monotonic instant just before it raises
    (and whose `at` is the payload's, if it gives one)."""
    raise fleet.Refused(429, repr(time.monotonic()), at=(unit.payload or {}).get("at"))


async def refuse_now_async(unit):
    refuse_now(unit)


def fail(unit):
    raise RuntimeError("the handler broke, not the provider")
