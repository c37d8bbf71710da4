"""The handler of `fleet.Executor`'s one role: a call, as ProcessPoolExecutor makes it.

A unit's payload is ``(fn, args, kwargs)``, pickled in the caller's process: `fn` by
reference (its module and name, as pickle does for any function), so the worker
imports it; a function of the program's ``__main__`` is found because the zygote
imported the main module first (`fleet.runtime.worker_setup`).
"""
from __future__ import annotations

#: The kwargs of a call made by `map`: one object, so a chunk pickles it once.
NO_KWARGS: dict = {}


def call(unit):
    """Run the call a unit carries and return its value (its exception is the unit's)."""
    fn, args, kwargs = unit.payload
    return fn(*args, **kwargs) if kwargs else fn(*args)  # map's calls have none
