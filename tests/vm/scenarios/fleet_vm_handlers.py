"""Handlers of the VM scenarios (copied into the guest's venv, so fleetd imports them)."""
import time


def spin(unit):
    """Burn `unit.payload` seconds of CPU time (not wall time: under a quota it takes longer)."""
    end = time.process_time() + float(unit.payload)
    n = 0
    while time.process_time() < end:
        n += 1
    return n


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
