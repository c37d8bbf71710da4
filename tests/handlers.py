"""Handlers the fleet tests name in their configs (``tests.handlers:NAME``)."""
from __future__ import annotations

import os
import signal
import threading
import time

from fleet import Suppress

_WARM: dict = {}


def noop(unit):
    return None


def echo(unit):
    return unit.payload


def square(unit):
    return unit.payload * unit.payload


def interval(unit):
    """Sleep ``payload[1]`` ms, then append ``start end pid`` (CLOCK_MONOTONIC, shared by every
    process of the host) to the file ``payload[0]``: when this handler ran."""
    path, ms = unit.payload
    start = time.monotonic()
    time.sleep(ms / 1000)
    end = time.monotonic()
    with open(path, "a") as f:
        f.write(f"{start!r} {end!r} {os.getpid()}\n")
    return ms


def ticker(unit):
    """Append ``time.time()`` to the file ``payload[0]`` every 10 ms for ``payload[1]`` ms: the
    last line is the last moment the unit was seen running (the store's clock is time.time)."""
    path, ms = unit.payload
    end = time.monotonic() + ms / 1000
    with open(path, "a", buffering=1) as f:
        while time.monotonic() < end:
            f.write(f"{time.time()!r}\n")
            time.sleep(0.01)
    return ms


def whoami(unit):
    """(payload, pid): which worker process ran the unit."""
    return unit.payload, os.getpid()


def my_nice(unit):
    """The nice value the worker that ran the unit runs at."""
    return os.getpriority(os.PRIO_PROCESS, 0)


def keyed(unit):
    """Per-key warm state: how many units of this key this process has seen, and its pid."""
    _WARM[unit.key] = _WARM.get(unit.key, 0) + 1
    return unit.key, _WARM[unit.key], os.getpid()


def fail(unit):
    raise ValueError(f"bad payload {unit.payload!r}")


def suppress(unit):
    raise Suppress(f"nothing to do for {unit.payload!r}")


def sometimes(unit):
    """Solved, suppressed or failed by payload % 3: a corpus with every outcome."""
    if unit.payload % 3 == 1:
        raise Suppress("one")
    if unit.payload % 3 == 2:
        raise RuntimeError(f"two: {unit.payload}")
    return unit.payload * 2


def hang(unit):
    time.sleep(unit.payload if unit.payload is not None else 3600)
    return "woke"


def die(unit):
    os._exit(3)


def unpicklable(unit):
    return threading.Lock()


class _Unreadable:
    """A value that pickles, and cannot be unpickled: its loading raises (in the supervisor)."""

    def __reduce__(self):
        return (_refuse_to_load, ())


def _refuse_to_load():
    raise ValueError("this value cannot be loaded")


def unreadable(unit):
    return _Unreadable()


def spin(unit):
    """Burn about `payload` microseconds of CPU."""
    end = time.perf_counter() + (unit.payload or 50) / 1e6
    while time.perf_counter() < end:
        pass
    return None


class Unpicklable(Exception):
    def __init__(self, lock):
        super().__init__("carries a lock")
        self.lock = lock

    def __reduce__(self):
        raise TypeError("not picklable")


def raise_unpicklable(unit):
    raise Unpicklable(threading.Lock())


_RAN: list = []


def nap_in_order(unit):
    """payload (seconds, tag): sleep, then (tag, how many units this process has run)."""
    seconds, tag = unit.payload
    time.sleep(seconds)
    _RAN.append(tag)
    return tag, len(_RAN)


def lose_own_completion(unit):
    """payload: the fleet name. Put this unit's slot back to Idle behind the runtime's back,
    so its completion (RELEASE) is refused: a stand-in for a broken FSM rule."""
    from fleet.rules import fsm
    from fleet.shm.table import SlotTable
    from fleet.shm.table import layout as L
    from fleet.shm.table.kernels import SLOT_FIELDS

    table = SlotTable.attach(unit.payload)
    try:
        snap = table.snapshot()
        slot = next(i for i in range(snap.n_slots) if snap.slot(i)["unit"] == unit.id)
        table.slots[slot * SLOT_FIELDS + L.S_WORD] = L.pack_word(fsm.IDLE, 0, 0, 1)
    finally:
        table.close()
    return "ran"


def nap_whoami(unit):
    """Sleep `payload` seconds, then (pid): which worker ran a unit that took a while."""
    time.sleep(unit.payload)
    return os.getpid()


def wait_for_file(unit):
    """Payload (path, value): once `path` exists (None: at once), return value * value.
    Lets a test hold a unit running until it says so, without timing."""
    path, value = unit.payload
    deadline = time.monotonic() + 120
    while path is not None and not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)
    return value * value


_COUNTS: dict = {}


def keyed_count(unit):
    """(key, how many units of this key this process has run): the same on any binding as
    long as each key stays on one pin."""
    _COUNTS[unit.key] = _COUNTS.get(unit.key, 0) + 1
    return unit.key, _COUNTS[unit.key]


def knows_itself(unit):
    """Its payload back, when `fleet.current_unit()` is the very Unit it was given and
    `fleet.report_cost` takes a cost (both raise outside a handler)."""
    import fleet

    fleet.report_cost(0.25)
    if fleet.current_unit() is not unit:
        raise AssertionError(f"current_unit() is {fleet.current_unit()!r}, not {unit!r}")
    return unit.payload


def note_run(directory: str, tag) -> None:
    """Say that unit `tag` ran: a line (this pid) in ``directory/<tag>``, one file per unit,
    so a unit that ran twice has two lines; and its tag on a line of ``directory/order``,
    so the order units ran in is known (appends of one short line each do not interleave).
    The order line comes first: a test that saw ``directory/<tag>`` (`runs`) and then kills
    the worker finds the tag in the order too, however late the thread was scheduled."""
    with open(os.path.join(directory, "order"), "a") as f:
        f.write(f"{tag}\n")
    with open(os.path.join(directory, str(tag)), "a") as f:
        f.write(f"{os.getpid()}\n")


def marked(unit):
    """payload (directory, tag, seconds): note the run (`note_run`), sleep, return the tag."""
    directory, tag, seconds = unit.payload
    note_run(directory, tag)
    time.sleep(seconds)
    return tag


def marked_echo(unit):
    """payload (directory, tag, data): note the run, return `data`."""
    directory, tag, data = unit.payload
    note_run(directory, tag)
    return data


def marked_or_die(unit):
    """payload (directory, tag, die, data): note the run; then, if `die`, SIGKILL this
    worker (so it dies inside a handler that ran, never between two units); else return
    `data`."""
    directory, tag, die, data = unit.payload
    note_run(directory, tag)
    if die:
        os.kill(os.getpid(), signal.SIGKILL)
    return data


_LEAKED: list = []  # what `leak` kept: it grows by LEAK_MIB per call for the worker's life
LEAK_MIB = 4


def rss_mib() -> float:
    """This process's resident MiB (/proc/self/statm, as fleet.worker.process reads it)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def leak(unit):
    """Keep LEAK_MIB more, written (resident); (pid, resident MiB after the call)."""
    _LEAKED.append(b"x" * (LEAK_MIB << 20))
    return os.getpid(), rss_mib()


def allocate(unit):
    """Write `unit.payload` MiB (resident, charged to the memory group) and let it go; the
    worker's pid. Past its group's limit the kernel's OOM killer takes the worker."""
    block = b"x" * (int(unit.payload) << 20)
    del block
    return os.getpid()


def digest(unit):
    """(length, sha256 hex) of a bytes payload: a large payload's arrival, checked whole."""
    import hashlib

    data = unit.payload
    return len(data), hashlib.sha256(data).hexdigest()


def make_bytes(unit):
    """A bytes result of `unit.payload` bytes (a pattern: each byte its offset mod 251)."""
    n = int(unit.payload)
    return (bytes(range(251)) * (n // 251 + 1))[:n]


def memory_owner(obj):
    """What finally holds an array's memory: its bases followed through views and buffers."""
    import pickle

    while True:
        if type(obj) in (memoryview, pickle.PickleBuffer):
            obj = memoryview(obj).obj
        elif getattr(obj, "base", None) is not None:
            obj = obj.base
        else:
            return obj


def payload_memory(unit):
    """(whether the payload's array ``a`` is writable, what holds its memory (a type name),
    its sum) of a ``{"a": array, "b": bytes}`` payload; ``b`` must have arrived as bytes."""
    array = unit.payload["a"]
    assert type(unit.payload["b"]) is bytes
    writable = bool(array.flags.writeable)
    array[0] += 0.0  # a write: the worker's own page (copy on write), never fleetd's or the client's
    return writable, type(memory_owner(array)).__name__, float(array.sum())


def mapping_of(array) -> tuple[str, int]:
    """(the path, the inode) of the mapping that holds `array`'s first byte, from /proc/self/maps."""
    address = array.__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return (fields[5].strip() if len(fields) > 5 else ""), int(fields[4])
    return "", 0


def payload_mapping(unit):
    """(whether the array payload is writable, the path and inode of the mapping holding it,
    its sum) of an array payload: where the worker's array lives."""
    array = unit.payload
    writable = bool(array.flags.writeable)
    array[0] += 0.0  # a write: the worker's own page (copy on write)
    path, inode = mapping_of(array)
    return writable, path, inode, float(array.sum())


def hold_then_map(unit):
    """Payload (pid file, gate file, array or None): writes this worker's pid to the pid file
    (when given), waits for the gate file (when given), then returns `payload_mapping`'s
    answer for the array (None without one). Lets a test hold a worker with a unit sent
    ahead to it, and kill it."""
    pid_file, gate, array = unit.payload
    if pid_file is not None:
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pid_file + ".tmp", pid_file)
    deadline = time.monotonic() + 120
    while gate is not None and not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} never appeared")
        time.sleep(0.005)
    if array is None:
        return None
    path, inode = mapping_of(array)
    return bool(array.flags.writeable), path, inode, float(array.sum())


def make_array(unit):
    """A float64 array result of `unit.payload` bytes, each element its index."""
    import numpy as np

    return np.arange(int(unit.payload) // 8, dtype=np.float64)
