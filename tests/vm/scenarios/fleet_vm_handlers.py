"""Handlers of the VM scenarios (copied into the guest's venv, so fleetd imports them)."""
import time


def spin(unit):
    """Burn `unit.payload` seconds of CPU time (not wall time: under a quota it takes longer)."""
    end = time.process_time() + float(unit.payload)
    n = 0
    while time.process_time() < end:
        n += 1
    return n
