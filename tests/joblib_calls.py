"""Functions the joblib backend's tests run in a fleet's workers (importable there, by reference)."""
from __future__ import annotations

import os

import joblib

#: How long a call waits for its test to open the gate: a bound on a broken test, never reached by a passing one.
GATE_S = 60


def square(x):
    return x * x


def pid(_=None):
    return os.getpid()


def identity(x):
    return x


class Refusal(Exception):
    """An exception of the caller's own, with arguments of its own."""

    def __init__(self, code, text):
        super().__init__(code, text)
        self.code = code


def refuse(code):
    raise Refusal(code, "refused in the worker")


def fail_at(i, bad):
    if i == bad:
        raise ZeroDivisionError(f"call {i} divided by zero")
    return i


def die_at(i, bad):
    if i == bad:
        os._exit(3)
    return i


def record(i, ran, gate, free=(), fail=None):
    """Count this call in `ran` (a manager's list), then hold until `gate` (a manager's
    Event) is set, unless `i` is one of `free`. With `fail` (another Event), call 0 holds
    until that is set instead, and then raises."""
    ran.append(i)
    if i in free:
        return i
    if fail is not None and i == 0:
        fail.wait(GATE_S)
        raise ZeroDivisionError("the first call fails")
    gate.wait(GATE_S)
    return i


def nested_backends(_=None):
    """The backend a Parallel call inside this call runs on, and one level further down."""
    backend, _n = joblib.parallel.get_active_backend()
    deeper = joblib.Parallel(n_jobs=2)(joblib.delayed(active_backend)() for _ in range(2))
    return (type(backend).__name__, backend.nesting_level), deeper


def active_backend():
    backend, _n = joblib.parallel.get_active_backend()
    return type(backend).__name__, backend.nesting_level


def fleet_inside(_=None):
    """A Parallel call asking for the fleet backend from inside a worker: the backend it
    ran on, and where its calls ran, beside this worker's pid."""
    with joblib.parallel_config(backend="fleet", n_jobs=2):
        parallel = joblib.Parallel()
        pids = parallel(joblib.delayed(pid)() for _ in range(4))
    return type(parallel._backend).__name__, sorted(set(pids)), os.getpid()


def fleet_inside_spread(_=None):
    """`fleet_inside`, with how many CPUs this worker may run on now."""
    return (*fleet_inside(), len(os.sched_getaffinity(0)))


def thread_pools(_=None):
    """This worker's cores, the thread variables it sees, and its loaded pools' threads by library."""
    import numpy  # noqa: F401  (its BLAS, loaded)
    import threadpoolctl

    variables = {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    pools = sorted({(p["internal_api"], p["num_threads"]) for p in threadpoolctl.threadpool_info()})
    return len(os.sched_getaffinity(0)), variables, pools


def total(array):
    return float(array.sum())
