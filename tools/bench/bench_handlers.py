"""Work functions shared by fleet and its peers in the benchmarks (same code on both sides)."""
import asyncio
import os
import time


def noop(x=None):
    return None


def spin50(x=None):
    """About 50 µs of CPU."""
    end = time.perf_counter() + 50e-6
    while time.perf_counter() < end:
        pass
    return None


def work(x=None):
    """The benchmarks' one handler: a no-op, or ~50 µs of CPU when x == "spin"."""
    if x == "spin":
        return spin50()
    return None


# fleet handlers take a Unit
def unit_work(unit):
    return work(unit.payload)


_RUN_LOGS: dict = {}  # path -> this process's fd on it (opened once: one write per unit)


def noted_unit_work(unit):
    """payload (path, n): append the line ``n`` to the file `path` (the chaos run counts how
    many times each unit's handler ran), then `work()`."""
    path, n = unit.payload
    fd = _RUN_LOGS.get(path)
    if fd is None:
        fd = _RUN_LOGS[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, b"%d\n" % n)  # one short O_APPEND write: lines of several workers never interleave
    return work()


def echo_unit(unit):
    """The unit's payload back (the chaos storm checks every solved value)."""
    return unit.payload


async def unit_sleep_async(unit):
    """An I/O-bound unit: waits `payload` seconds and uses no CPU meanwhile."""
    await asyncio.sleep(unit.payload)


# data_bench.py: what crosses is the measure (a distinct object in, a fresh one out)
def nbytes(x):
    """The size of what arrived (bytes or an array): a reply of a few bytes."""
    return x.nbytes if hasattr(x, "nbytes") else len(x)


def make_bytes(n):
    return b"\1" * n


def make_array(n):
    import numpy as np

    return np.full(n // 8, 1.0)


# cycle_bench.py: the solve cycle's parts, as plain functions (ProcessPoolExecutor) and as
# handlers (fleet roles). Each burns CPU time, not wall time: a part preempted by its
# neighbours still costs what the plan says, so the offered load is the plan's.
def burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _note(path, line: str) -> None:
    """Append `line` to the file `path` (one short O_APPEND write: lines of several
    workers never interleave), so a run can count how many times each sim ran."""
    if path is None:
        return
    fd = _RUN_LOGS.get(path)
    if fd is None:
        fd = _RUN_LOGS[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, line.encode() + b"\n")


def cycle_sim(payload):
    """One sim: payload (sim id, CPU seconds, note path or None); returns its id."""
    sim_id, seconds, note = payload
    burn(seconds)
    _note(note, sim_id)
    return sim_id


def cycle_burn(seconds):
    """A walk segment, a resolve or a merge: `seconds` of CPU."""
    burn(seconds)
    return None


def cycle_sim_unit(unit):
    return cycle_sim(unit.payload)


def cycle_burn_unit(unit):
    return cycle_burn(unit.payload)


def cycle_bin_unit(unit):
    """A whole bin from inside the fleet: payload (walk seconds per segment, [sims of the
    first gap, sims of the second]: each a sim's payload); three walk segments, and
    between them the gap's sims submitted to this fleet and joined. Returns the sim ids."""
    import fleet

    walk_s, gaps = unit.payload
    here = fleet.current_fleet()
    done = []
    for sims in gaps:
        burn(walk_s)
        futures = [here.submit("sim", sim) for sim in sims]
        done += [f.result() for f in futures]
    burn(walk_s)
    return done


def unit_nbytes(unit):
    """`nbytes` as a fleet role's handler (service mode): the size of the unit's payload."""
    return nbytes(unit.payload)


def make(spec):
    """``(kind, n)``: a result of n bytes, ``bytes`` (`make_bytes`) or a float64 array (`make_array`)."""
    kind, n = spec
    return make_bytes(n) if kind == "bytes" else make_array(n)


def unit_make(unit):
    """`make` as a fleet role's handler."""
    return make(unit.payload)
