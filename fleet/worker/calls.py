"""The handler of `fleet.Executor`'s one role: a call, as ProcessPoolExecutor makes it.

A unit's payload is ``(fn, args, kwargs)``, pickled in the caller's process: `fn` by
reference (its module and name, as pickle does for any function), so the worker
imports it; a function of the program's ``__main__`` is found because the zygote
imported the main module first (`fleet.worker.prepare`).

A chunk of `map` travels as one `Calls`: the function once and the items' arguments
as one list, so a chunk of 64 calls pickles one reference to `fn` rather than 64
``(fn, args, kwargs)`` tuples, and the worker runs it as the builtin ``map`` does,
in C, with no Python frame of fleet's per call (`run_chunk`).
"""
from __future__ import annotations

import itertools

#: The kwargs of a single call made without any: one object, and `call` skips the unpack.
NO_KWARGS: dict = {}


def call(unit):
    """Run the call a unit carries and return its value (its exception is the unit's)."""
    fn, args, kwargs = unit.payload
    return fn(*args, **kwargs) if kwargs else fn(*args)


class Calls:
    """A chunk of `map`'s calls of one function: ``fn(item)`` for each item, or
    ``fn(*item)`` with ``star`` (a map over several iterables: each item is the tuple
    of one argument from each). Its length is its number of calls: what the ledger
    counts as the chunk's items."""

    __slots__ = ("fn", "items", "star")

    def __init__(self, fn, items, star: bool = False):
        # map's feeder hands over the list it just built: kept, not copied again
        self.fn, self.items, self.star = fn, items if type(items) is list else list(items), bool(star)

    def __len__(self) -> int:
        return len(self.items)

    def __reduce__(self):
        return Calls, (self.fn, self.items, self.star)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", None) or repr(self.fn)
        return f"<Calls of {name}: {len(self.items)} call(s){' (star)' if self.star else ''}>"


def run_chunk(calls: Calls, values: list, start: int = 0):
    """Run the calls of a chunk from index `start`, appending each value to `values`
    (``values`` holds one entry per call before `start`). None once every call ran;
    ``(index, exception)`` at the first call that raised, whose value is not appended:
    the caller records it and resumes at ``index + 1``. ``list.extend`` drives the
    builtin ``map`` in C and keeps what it appended before the raise."""
    rest = calls.items if start == 0 else itertools.islice(calls.items, start, None)
    runs = itertools.starmap(calls.fn, rest) if calls.star else map(calls.fn, rest)
    try:
        values.extend(runs)
    except BaseException as exc:  # noqa: BLE001 - a call's exception is that item's outcome, as a unit's
        return len(values), exc
    return None
