"""The handler of `fleet.Executor`'s one role: a call, as ProcessPoolExecutor makes it.

A unit's payload is ``(fn, args, kwargs)``, pickled in the caller's process: `fn` by
reference (its module and name, as pickle does for any function), so the worker
imports it; a function of the program's ``__main__`` is found because the zygote
imported the main module first (`fleet.worker.prepare`).

A module-level function travels as its name: ``(module, name, args, kwargs)``
(`call_payload`). Pickle writes a function as that same reference, but finds the
module through the import system at every pickle, to check that the name still
gives the function, and again at every unpickle: about a microsecond each way, for
a no-op call a fifth of the caller's work. Here the caller checks that once per
function and then one dictionary look per call (the module's namespace still holds
that very function under its name: rebinding it makes the next call go the whole
way, as pickle), and the worker imports each name once (`call`). A name that no
longer resolves in the worker fails the unit as its unpickling would have. Anything
else (a builtin method, a partial, a nested function, a callable object) is pickled
as it is.

A chunk of `map` travels as one `Calls`: the function once and the items' arguments
as one list, so a chunk of 64 calls pickles one reference to `fn` rather than 64
``(fn, args, kwargs)`` tuples, and the worker runs it as the builtin ``map`` does,
in C, with no Python frame of fleet's per call (`run_chunk`). Its function travels
by name by the same rule (`Calls.wire`).
"""
from __future__ import annotations

import itertools
import sys

#: The kwargs of a single call made without any: one object, and `call` skips the unpack.
NO_KWARGS: dict = {}

# types' own definitions, without importing types (this module is on the Executor's import path)
FunctionType, BuiltinFunctionType = type(lambda: None), type(len)

#: The caller's: function -> (its module's name, its name, the module's namespace), for
#: the functions found at module level under their own name. A cache: such a function
#: lives as long as its module, but one replaced there (a reload) would stay, so past
#: `NAMES_KEPT` entries it starts afresh.
_NAMES: dict = {}
NAMES_KEPT = 4096
#: The worker's: (module, name) -> the function it names here, imported once.
_FOUND: dict = {}


def call_payload(fn, args: tuple, kwargs: dict) -> tuple:
    """The payload of the call ``fn(*args, **kwargs)``: ``(module, name, args, kwargs)``
    for a function, or a builtin of a module, that its module holds under its own name
    (what pickle checks before it writes a reference; looked at on each call), else
    ``(fn, args, kwargs)`` (see the module doc)."""
    kind = type(fn)
    if kind is FunctionType or kind is BuiltinFunctionType:
        named = _NAMES.get(fn) or _named(fn)
        if named is not None and named[2].get(named[1]) is fn:
            return (named[0], named[1], args, kwargs)
    return (fn, args, kwargs)


def payloads(fn, arguments) -> zip:
    """The payloads of ``fn(*args)`` for each ``args`` of `arguments` (a map's items, one
    call a unit), as `call_payload` makes each: how `fn` travels is looked at once, and
    the tuples are made by zip and repeat in C, with no Python frame per item."""
    first = call_payload(fn, (), NO_KWARGS)
    if len(first) == 3:
        return zip(itertools.repeat(fn), arguments, itertools.repeat(NO_KWARGS))
    return zip(itertools.repeat(first[0]), itertools.repeat(first[1]), arguments, itertools.repeat(NO_KWARGS))


def _named(fn):
    """(module name, name, module namespace) of `fn` when it is its module's attribute of
    its own name, remembered; else None."""
    name, module_name = getattr(fn, "__qualname__", None), getattr(fn, "__module__", None)
    if type(name) is not str or type(module_name) is not str:
        return None
    # a method (``[].append``, ``Class.f``: a dotted name), a nested function, a lambda: not
    # their module's attribute of that name
    space = getattr(sys.modules.get(module_name), "__dict__", None)
    if type(space) is not dict or space.get(name) is not fn:
        return None
    if len(_NAMES) >= NAMES_KEPT:
        _NAMES.clear()
    named = _NAMES[fn] = (module_name, name, space)
    return named


def call(unit):
    """Run the call a unit carries and return its value (its exception is the unit's)."""
    payload = unit.payload
    if len(payload) == 4:  # a function by name (`call_payload`)
        module_name, name, args, kwargs = payload
        fn = _FOUND.get((module_name, name)) or _found(module_name, name)
    else:
        fn, args, kwargs = payload
    return fn(*args, **kwargs) if kwargs else fn(*args)


def _found(module_name: str, name: str):
    """The function `module_name`.`name` in this process, imported as pickle would find
    it, and remembered. One that cannot be found fails the unit as its payload's
    unpickling would have (CodecError, worded as that one)."""
    try:
        __import__(module_name)
        fn = getattr(sys.modules[module_name], name)
    except Exception as exc:  # noqa: BLE001 - whatever the import raises is the payload's failure
        from fleet.worker import codec

        raise codec.CodecError(f"the payload cannot be unpickled in the worker: {codec.describe(exc)}") from None
    _FOUND[(module_name, name)] = fn
    return fn


#: The first item of a chunk's wire form by name (`Calls.wire`): what tells the worker a
#: tuple is a chunk of calls, not a chunk of items.
WIRE = "fleet.calls"


class Calls:
    """A chunk of `map`'s calls of one function: ``fn(item)`` for each item, or
    ``fn(*item)`` with ``star`` (a map over several iterables: each item is the tuple
    of one argument from each). Its length is its number of calls: what the ledger
    counts as the chunk's items.

    ``wire`` is what the chunk travels as: for a function that travels by name
    (`call_payload`'s rule), the plain tuple ``(WIRE, module, name, items, star)``,
    which pickle writes with no reference to look up (the chunk's class and its
    function would be two: each a walk of the import system, at each pickle and each
    unpickle); else the chunk itself. The worker makes the chunk again (`from_wire`)."""

    __slots__ = ("fn", "items", "star", "wire")

    def __init__(self, fn, items, star: bool = False):
        # map's feeder hands over the list it just built: kept, not copied again
        self.fn, self.items, self.star = fn, items if type(items) is list else list(items), bool(star)
        named = call_payload(fn, (), NO_KWARGS)
        self.wire = (WIRE, named[0], named[1], self.items, self.star) if len(named) == 4 else self

    @classmethod
    def from_wire(cls, wire: tuple) -> "Calls":
        """The chunk a `wire` tuple carries, its function imported here once (`call`'s
        rule: one that cannot be found fails the chunk as its unpickling would)."""
        _mark, module_name, name, items, star = wire
        calls = cls.__new__(cls)
        calls.fn = _FOUND.get((module_name, name)) or _found(module_name, name)
        calls.items, calls.star, calls.wire = items, bool(star), wire
        return calls

    @staticmethod
    def is_wire(payload) -> bool:
        """Whether a chunk's payload is a `wire` tuple (a list, or any other shape, is not)."""
        return (type(payload) is tuple and len(payload) == 5 and payload[0] == WIRE and type(payload[1]) is str
                and type(payload[2]) is str and type(payload[3]) is list)

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
