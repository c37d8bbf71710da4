"""Handlers for the `fleetctl why` tests: each holds its unit running until a file exists."""
from __future__ import annotations

import os
import time


def held_pid(unit):
    """Payload (path, value): once `path` exists (None: at once), return (value, this worker's
    pid): which process ran the unit, to check what `why` said of it."""
    path, value = unit.payload
    deadline = time.monotonic() + 120
    while path is not None and not os.path.exists(path):
        if not os.path.isdir(os.path.dirname(path)):
            break  # the test is over (its directory is gone): end now, whatever it asserted
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)
    return value, os.getpid()


def broken(unit):
    raise ValueError(f"broken on purpose: {unit.payload}")
