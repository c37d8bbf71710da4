"""What the data tests run in the workers (importable by reference): calls for
`fleet.Executor` and handlers for a `fleet.Fleet` role, moving real data in and out."""
from __future__ import annotations

import hashlib
import os
import signal
import time

import numpy as np

from fleet.shm import parcels


def digest(data) -> tuple[int, str]:
    """(bytes, sha1) of a bytes-like object or an array: what arrived, checked at the caller."""
    view = memoryview(np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data).cast("B")
    return view.nbytes, hashlib.sha1(view).hexdigest()


def make_bytes(n: int) -> bytes:
    """`n` bytes the caller can rebuild (`pattern`) to compare."""
    return pattern(n)


def pattern(n: int) -> bytes:
    block = bytes(range(256))
    return (block * (n // 256 + 1))[:n]


def make_pieces(n: int) -> list[bytes]:
    """`n` pieces of 1 KiB (`pieces`): a result pickled whole, nothing of it out of band."""
    return pieces(n)


def pieces(n: int) -> list[bytes]:
    return [bytes([i % 251]) * 1024 for i in range(n)]


def make_array(n: int, value: float = 1.0) -> np.ndarray:
    """An array of `n` bytes of float64 `value`."""
    return np.full(n // 8, value)


def poke(a: np.ndarray) -> tuple[bool, float]:
    """(whether the array arrived writable, its sum), after writing into it."""
    writable = bool(a.flags.writeable)
    a[0] += 1.0
    return writable, float(a.sum())


#: Arrays a worker kept past their units (`keep`): a handler may hold what it was given.
KEPT: list = []


def keep(a: np.ndarray) -> tuple[float, float]:
    """Keep the array in this worker (a module global) and write into it: (its first two values)."""
    KEPT.append(a)
    a[1] = -1.0
    return float(a[0]), float(a[1])


def kept(_=None) -> list[tuple[float, float, float]]:
    """(first, second, sum) of each array this worker kept."""
    return [(float(a[0]), float(a[1]), float(a.sum())) for a in KEPT]


def wait_for(path: str, payload=None) -> int:
    """Once `path` exists, the size of `payload` (holds a unit running without timing)."""
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)
    return 0 if payload is None else len(payload)


def fail_with(payload) -> None:
    raise ValueError(f"refused {len(payload)} bytes")


def parcel_then_die(fleet: str, n: int) -> None:
    """The state of a worker killed mid-transfer: its result's parcel written, the message
    that names it never sent."""
    parcels.write(fleet, [b"\0" * n])
    os.kill(os.getpid(), signal.SIGKILL)


# --- the same as handlers of a fleet.Fleet role ------------------------------------------------
def h_call(unit):
    """Payload (name of a call above, its argument): the call's value."""
    call, arg = unit.payload
    return globals()[call](arg)


def h_wait_for(unit):
    path, payload = unit.payload
    return wait_for(path, payload)


def h_hang(unit):
    time.sleep(600)


def h_fail(unit):
    fail_with(unit.payload)


def h_parcel_then_die(unit):
    parcel_then_die(*unit.payload)


def h_wait_for(unit):
    """Payload (path, data): once `path` exists, len(data)."""
    path, data = unit.payload
    return wait_for(path, data)


def h_fail(unit):
    fail_with(unit.payload)


def h_hang(unit):
    time.sleep(600)


def h_parcel_then_die(unit):
    """Payload (fleet name, bytes): a worker killed between writing its result's parcel and sending it."""
    parcel_then_die(*unit.payload)


def h_parcel_then_wait(unit):
    """Payload (fleet name, bytes, path, ballast...): a result's parcel written, then the unit
    holds until `path` exists."""
    fleet, n, path, *_ballast = unit.payload
    parcels.write(fleet, [b"\0" * n])
    return wait_for(path)


def h_mark_then_wait(unit):
    """Payload (marker path, gate path, data): `marker` made once the handler runs (the
    payload unpickled), then len(data) once `gate` exists."""
    marker, gate, data = unit.payload
    open(marker, "w").close()
    return wait_for(gate, data)
