"""Handlers of the VM scenarios (copied into the guest's venv, so fleetd imports them)."""
import time


def spin(unit):
    """Burn `unit.payload` seconds of CPU time (not wall time: under a quota it takes longer)."""
    end = time.process_time() + float(unit.payload)
    n = 0
    while time.process_time() < end:
        n += 1
    return n


_KEPT: list = []  # what `memory` keeps for the worker's life (a leak)


def _rss_mib() -> float:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * 4096 / (1 << 20)


def memory(unit):
    """``("alloc", MiB)``: write MiB of memory and let it go (past the group's MemoryMax= the
    kernel's OOM killer takes this worker); ``("leak", MiB)``: keep MiB written for the
    worker's life. Returns (pid, resident MiB after)."""
    import os

    what, mib = unit.payload
    block = b"x" * (int(mib) << 20)  # written: resident, charged to the group
    if what == "leak":
        _KEPT.append(block)
    del block
    return os.getpid(), _rss_mib()


def duty(unit):
    """payload (seconds, busy): for `seconds` of wall time, busy that fraction of every 20 ms
    and asleep the rest: a steady load of `busy` of one CPU in one unit."""
    seconds, busy = unit.payload
    end = time.monotonic() + float(seconds)
    periods = 0
    while time.monotonic() < end:
        start = time.monotonic()
        while time.monotonic() < start + 0.02 * busy:
            pass
        time.sleep(0.02 * (1 - busy))
        periods += 1
    return periods


def spin_or_duty(unit):
    """`duty` for a (seconds, busy) payload, else `spin` (one role runs both loads)."""
    return duty(unit) if isinstance(unit.payload, (tuple, list)) else spin(unit)
