"""Hostile objects, and handlers that return or raise them (``tests.hostile:NAME``).

Each object misbehaves at one end of a process boundary: when it is pickled (in the
process that made it) or when it is unpickled (in the process that receives it). A
handler's payload is a recipe, ``(how, kind, size)``: ``how`` is ``"return"`` or
``"raise"``, ``kind`` one of `KINDS`, ``size`` the depth or byte count the kind takes.
The recipe is plain data, so the payload itself always travels; a hostile payload is
submitted as the object (`make`) instead.
"""
from __future__ import annotations

import os
import sys


def _raise_value_error():
    raise ValueError("refuses to be rebuilt")


def _recurse():
    return _recurse()


def _raise(exc_type, *args):
    raise exc_type(*args)


class RaisesOnDump:
    def __reduce__(self):
        raise ValueError("refuses to be pickled")


class ExitsOnDump:
    def __reduce__(self):
        sys.exit(5)


class InterruptsOnDump:
    def __reduce__(self):
        raise KeyboardInterrupt


class RaisesOnLoad:
    def __reduce__(self):
        return (_raise_value_error, ())


class ExitsOnLoad:
    def __reduce__(self):
        return (sys.exit, (7,))


class InterruptsOnLoad:
    def __reduce__(self):
        return (_raise, (KeyboardInterrupt,))


class RunsOutOfMemoryOnLoad:
    def __reduce__(self):
        return (_raise, (MemoryError, "pretend"))


class RecursesOnLoad:
    def __reduce__(self):
        return (_recurse, ())


class Unrebuildable(Exception):
    """Pickles (its args are one string) but cannot be rebuilt: __init__ takes two."""

    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")


class ExitsOnDumpError(Exception):
    def __reduce__(self):
        sys.exit(6)


class ExitsOnLoadError(Exception):
    def __reduce__(self):
        return (sys.exit, (8,))


class UnprintableError(Exception):
    """Its text cannot be read: str() raises SystemExit."""

    def __str__(self):
        sys.exit(9)


def _rebuilt_outside_fleetd(cls, *args):
    if os.path.basename(sys.argv[0]) == "fleetd.py":  # python -m fleet.cli.fleetd
        raise RuntimeError(f"a {cls.__name__} was rebuilt inside fleetd")
    return cls(*args)


class OutsideFleetd:
    """A value fleetd cannot rebuild (its client can): fleetd must relay it unread."""

    def __init__(self, n):
        self.n = n

    def __reduce__(self):
        return (_rebuilt_outside_fleetd, (OutsideFleetd, self.n))

    def __eq__(self, other):
        return isinstance(other, OutsideFleetd) and other.n == self.n


class OutsideFleetdError(Exception):
    """An exception fleetd cannot rebuild (its client can)."""

    def __reduce__(self):
        return (_rebuilt_outside_fleetd, (OutsideFleetdError, *self.args))


def nested(depth: int):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


#: kind -> a maker of an object (from the recipe's size) that is hostile as a value
VALUES = {
    "raises_on_dump": lambda n: RaisesOnDump(),
    "exits_on_dump": lambda n: ExitsOnDump(),
    "interrupts_on_dump": lambda n: InterruptsOnDump(),
    "raises_on_load": lambda n: RaisesOnLoad(),
    "exits_on_load": lambda n: ExitsOnLoad(),
    "interrupts_on_load": lambda n: InterruptsOnLoad(),
    "memory_on_load": lambda n: RunsOutOfMemoryOnLoad(),
    "recurses_on_load": lambda n: RecursesOnLoad(),
    "nested": nested,
    "huge": lambda n: b"x" * n,
    "plain": lambda n: n,
    "outside_fleetd": OutsideFleetd,
}
#: kind -> a maker of a hostile exception, for a handler to raise
ERRORS = {
    "unrebuildable": lambda n: Unrebuildable("one", "two"),
    "exits_on_dump": lambda n: ExitsOnDumpError("exits when pickled"),
    "exits_on_load": lambda n: ExitsOnLoadError("exits when unpickled"),
    "unprintable": lambda n: UnprintableError(),
    "carries_hostile": lambda n: ValueError(RaisesOnLoad()),
    "nested": lambda n: ValueError(nested(n)),
    "huge": lambda n: ValueError(b"x" * n),
    "system_exit": lambda n: SystemExit(n),
    "keyboard_interrupt": lambda n: KeyboardInterrupt(),
    "outside_fleetd": OutsideFleetdError,
}
KINDS = {"return": VALUES, "raise": ERRORS}


def make(how: str, kind: str, size: int = 0):
    """The object a recipe names (a value, or an exception to raise)."""
    return KINDS[how][kind](size)


def hostile(unit):
    """Returns or raises what the recipe in the payload names."""
    how, kind, size = unit.payload
    obj = make(how, kind, size)
    if how == "raise":
        raise obj
    return obj


async def hostile_async(unit):
    return hostile(unit)


def echo(unit):
    return unit.payload
