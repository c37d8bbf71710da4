"""Work functions shared by fleet and its peers in the benchmarks (same code on both sides)."""
import time


def noop(x=None):
    return None


def spin50(x=None):
    """About 50 µs of CPU."""
    end = time.perf_counter() + 50e-6
    while time.perf_counter() < end:
        pass
    return None


# fleet handlers take a Unit
def unit_noop(unit):
    return None


def unit_spin50(unit):
    return spin50()
