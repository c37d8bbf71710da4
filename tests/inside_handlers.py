"""Handlers that submit units from inside (fleet.current_fleet()), named in the configs of
tests/api/test_inside_roles.py and tests/runtime/test_inside_deaths.py."""
from __future__ import annotations

import os
import time

import fleet

#: Longest a handler here waits for a file the test writes (the test ends far sooner).
RELEASE_S = 120.0


def square(unit):
    return unit.payload * unit.payload


def walk(unit):
    """Fan out `payload` sims and join them: their squares, summed."""
    here = fleet.current_fleet()
    futures = [here.submit("sim", i) for i in range(unit.payload)]
    return sum(f.result(timeout=RELEASE_S) for f in futures)


def walk_map(unit):
    n, chunksize = unit.payload
    return list(fleet.current_fleet().map("sim", range(n), chunksize=chunksize, timeout=RELEASE_S))


def keyed_walk(unit):
    """A keyed bin: its process before and after it waits on its sims, and what it kept warm."""
    warm = _WARM.setdefault(unit.key, [])
    warm.append(unit.id)
    before = os.getpid()
    here = fleet.current_fleet()
    total = sum(f.result(timeout=RELEASE_S) for f in [here.submit("sim", i) for i in range(unit.payload)])
    return before, os.getpid(), total, list(warm)


_WARM: dict = {}


def tree(unit):
    """`payload` = (levels, width): a tree of `tree` units; the count of its leaves."""
    levels, width = unit.payload
    if levels == 0:
        return 1
    here = fleet.current_fleet()
    return sum(f.result(timeout=RELEASE_S) for f in [here.submit("tree", (levels - 1, width)) for _ in range(width)])


def note(directory: str, name: str, what: str) -> None:
    with open(os.path.join(directory, name), "a") as f:
        f.write(f"{what} {os.getpid()}\n")


def held_child(unit):
    """A child that notes it started, then waits for the file ``release`` in its directory."""
    directory, tag = unit.payload
    note(directory, f"child-{tag}", "start")
    release = os.path.join(directory, "release")
    deadline = time.monotonic() + RELEASE_S
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.01)
    note(directory, f"child-{tag}", "end")
    return tag


def held_parent(unit):
    """Submit `n` held children of role `child`, note it, then wait on them all."""
    directory, n, child = unit.payload
    here = fleet.current_fleet()
    futures = [here.submit(child, (directory, i)) for i in range(n)]
    note(directory, "parent", "waiting")
    return [f.result(timeout=RELEASE_S) for f in futures]


def held_parent_outcomes(unit):
    """As `held_parent`, but it solves with what became of each child: its value, or its
    error's reason (a cancelled child: ``Cancelled``)."""
    directory, n, child = unit.payload
    here = fleet.current_fleet()
    futures = [here.submit(child, (directory, i)) for i in range(n)]
    note(directory, "parent", "waiting")
    out = []
    for f in futures:
        exc = f.exception(timeout=RELEASE_S)
        out.append(f.result() if exc is None else getattr(exc, "reason", type(exc).__name__))
    return out


def watch_child(unit):
    """Submit one held child and wait: what its future raised (the test kills its worker)."""
    directory = unit.payload
    future = fleet.current_fleet().submit("sim", (directory, 0))
    note(directory, "parent", "waiting")
    exc = future.exception(timeout=RELEASE_S)
    return type(exc).__name__, getattr(exc, "reason", None), isinstance(exc, fleet.UnitFailed)


def delegate(unit):
    """`payload` = (n, route fields, pinned): submit n provider calls on that route, delegated
    by this unit (their parent), note their unit ids, and wait: each one's answer."""
    n, pool, pinned, directory = unit.payload
    here = fleet.current_fleet()
    futures = [here.submit("call", {}, route=fleet.Route(*pool), pinned=pinned) for _ in range(n)]
    note(directory, "parent", "waiting")
    out = []
    for f in futures:
        exc = f.exception(timeout=RELEASE_S)
        out.append(f.result() if exc is None else f"{type(exc).__name__}:{getattr(exc, 'reason', '')}")
    return out


def boom(unit):
    raise ValueError(f"boom {unit.payload}")


def child_fails(unit):
    """A child that raises: what its future gives back in the parent."""
    exc = fleet.current_fleet().submit("boom", unit.payload).exception(timeout=RELEASE_S)
    return type(exc).__name__, str(exc), type(exc.__cause__).__name__


def length(unit):
    return len(unit.payload)


def send_bytes(unit):
    """A child of role `length` with a payload of `payload` bytes: its length, or what refused it."""
    future = fleet.current_fleet().submit("length", b"x" * unit.payload)
    exc = future.exception(timeout=RELEASE_S)
    return future.result() if exc is None else type(exc).__name__
