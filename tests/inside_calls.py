"""Executor tasks and role handlers that submit units from inside (fleet.current_fleet()),
for tests/api/test_inside.py and tests/runtime/test_inside_deaths.py: module-level, so
the workers import them."""
from __future__ import annotations

import concurrent.futures as cf
import os

import fleet


def square(x):
    return x * x


def boom(x):
    raise ValueError(f"boom {x}")


def fan_out(n):
    """Submit n children, join them: their squares, summed."""
    here = fleet.current_fleet()
    futures = [here.submit(square, i) for i in range(n)]
    return sum(f.result(timeout=60) for f in futures)


def fan_map(n, chunksize=1):
    return list(fleet.current_fleet().map(square, range(n), chunksize=chunksize, timeout=60))


def futures_api(n):
    """as_completed, wait, callbacks and exception() on children's futures, in the worker."""
    here = fleet.current_fleet()
    called = []
    futures = [here.submit(square, i) for i in range(n)]
    futures[0].add_done_callback(lambda f: called.append(f.result()))
    done = sorted(f.result() for f in cf.as_completed(futures, timeout=60))
    finished, pending = cf.wait(futures, timeout=60)
    failing = here.submit(boom, 7)
    exc = failing.exception(timeout=60)
    return done, len(finished), len(pending), called, type(exc).__name__, str(exc), type(failing).__module__


def depth(level, width):
    """A tree: `level` levels of `width` children each; the count of its leaves."""
    if level == 0:
        return 1
    here = fleet.current_fleet()
    return sum(f.result(timeout=120) for f in [here.submit(depth, level - 1, width) for _ in range(width)])


def outside():
    """current_fleet() in a thread the task starts: NotInsideUnit."""
    import threading

    out = []

    def look():
        try:
            fleet.current_fleet()
        except fleet.NotInsideUnit as exc:
            out.append(type(exc).__name__)

    t = threading.Thread(target=look)
    t.start()
    t.join(30)
    return out


def pid_around_wait(n):
    before = os.getpid()
    fan_out(n)
    return before, os.getpid()


def make_bytes(n):
    return b"x" * n


def length(data):
    return len(data)


def big(n):
    """A child's payload and a child's value larger than a ring message: they travel beside it."""
    here = fleet.current_fleet()
    made = here.submit(make_bytes, n).result(timeout=60)
    return len(made), here.submit(length, made).result(timeout=60)


def from_thread(n):
    """The handle passed to a thread the task starts, which submits while the task waits on it."""
    import threading

    here = fleet.current_fleet()
    out = []
    thread = threading.Thread(target=lambda: out.append(sum(f.result(timeout=60)
                                                            for f in [here.submit(square, i) for i in range(n)])))
    thread.start()
    thread.join(90)
    return out
