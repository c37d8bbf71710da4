"""Work functions shared by fleet and its peers in the benchmarks (same code on both sides)."""
import asyncio
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


def echo_unit(unit):
    """The unit's payload back (the chaos storm checks every solved value)."""
    return unit.payload


async def unit_sleep_async(unit):
    """An I/O-bound unit: waits `payload` seconds and uses no CPU meanwhile."""
    await asyncio.sleep(unit.payload)
