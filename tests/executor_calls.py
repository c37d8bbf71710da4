"""Functions `fleet.Executor` tests submit (importable by the workers, by reference)."""
from __future__ import annotations

import os
import threading

STATE = "uninitialized"


def square(x):
    return x * x


def first(values):
    return float(values[0])


def ones(n):
    import numpy as np

    return np.ones(n)


def nap(seconds):
    import time

    time.sleep(seconds)
    return seconds


def lock_at(x, at):
    """x, or at x == at a value that cannot be pickled (a lock)."""
    return threading.Lock() if x == at else x


def add(x, y=0):
    return x + y


def divide(x, y):
    return x / y


def init(value):
    global STATE
    STATE = value


def state(_=None):
    return STATE


def init_fails():
    raise ValueError("error in the initializer")


def pid(_=None):
    return os.getpid()


def die():
    os._exit(3)


def put(proxy, value):
    """Append `value` to a Manager list proxy (the proxy connects back with the parent's authkey)."""
    proxy.append(value)
    return len(proxy)


class CarriesALock(Exception):
    """An exception that cannot be pickled in the worker (it holds a lock)."""

    def __init__(self):
        super().__init__("carries a lock")
        self.lock = threading.Lock()


def raise_unpicklable():
    raise CarriesALock()


class NotHere(Exception):
    """An exception whose class the parent cannot import (made up in the worker)."""


def raise_unimportable():
    cls = type("Ghost", (Exception,), {"__module__": "no_such_module_anywhere"})
    raise cls("boo")


class Box:
    """A result the parent can hold a weak reference to (as CPython's map tests do)."""

    def __init__(self, value):
        self.value = value


def box(x):
    return Box(x)


def same(x):
    return x


def leak(_=None):
    """tests.handlers.leak for an executor: (pid, resident MiB after the call)."""
    from tests.handlers import leak as leak_
    return leak_(None)
