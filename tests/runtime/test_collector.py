"""The collector held off while a fleet boots (fleet.runtime.collector): off inside the
pause, back as it was after it (also when the boot fails), nested pauses end with the
last; a boot makes no collection of its own but the full ones it asks for, and the
workers run with the collector on."""
from __future__ import annotations

import gc

import pytest

import fleet
from fleet.runtime import collector
from tests.api.test_executor_start import run
from tests.fleets import config, role, unique_name


@pytest.fixture
def collector_on():
    """The collector on at the start, and on again at the end whatever the test did."""
    gc.enable()
    yield
    gc.enable()


def test_the_collector_is_off_inside_the_pause_and_on_again_after(collector_on):
    with collector.paused():
        assert gc.isenabled() is False
    assert gc.isenabled() is True


def test_a_pause_whose_block_raises_puts_the_collector_back(collector_on):
    with pytest.raises(KeyError):
        with collector.paused():
            raise KeyError("boot failed")
    assert gc.isenabled() is True


def test_a_program_that_runs_with_the_collector_off_keeps_it_off(collector_on):
    gc.disable()
    with collector.paused():
        assert gc.isenabled() is False
    assert gc.isenabled() is False


def test_overlapping_pauses_turn_it_on_when_the_last_ends(collector_on):
    first, second = collector.paused(), collector.paused()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # a boot of another thread ended first
    assert gc.isenabled() is False
    second.__exit__(None, None, None)
    assert gc.isenabled() is True


#: A boot in a fresh interpreter (it imports the runtime, as a program's first boot does),
#: with the generations of the collections that start meanwhile (gc.callbacks).
WATCHED = """
    import gc, json, sys
    sys.path.insert(0, {repo})
    import fleet
    from tests.fleets import config, role, unique_name

    seen = []

    def watch(phase, info):
        if phase == "start":
            seen.append(info["generation"])

    if __name__ == "__main__":
        boot = %s  # the face imported before: the boot is watched, not this import
        gc.callbacks.append(watch)
        made = boot(%s)
        gc.callbacks.remove(watch)
        try:
            print(json.dumps({"boot": seen, "on": gc.isenabled(), "worker": %s}))
        finally:
            made.shutdown()
"""


def test_an_executor_boots_without_collections_of_its_own_and_its_workers_collect(tmp_path):
    """The boot makes no collection: none of those that 700 allocations start, and none
    before its `gc.freeze` (only the loop, once running, may collect its young objects).
    Then this process collects, and so do its workers: the fork server turned the
    collector on before its forks."""
    got = run(WATCHED % ("fleet.Executor", "max_workers=1", "made.submit(gc.isenabled).result(timeout=60)"),
              tmp_path)
    assert not {1, 2} & set(got["boot"]), got
    assert got["on"] is True and got["worker"] is True


def test_a_fleet_boots_without_collections_of_its_own(tmp_path):
    got = run(WATCHED % ("fleet.Fleet.from_config", "config(unique_name('gcb'), {'w': role('echo', slots=1)}), env={}",
                         "made.submit('w', 7).result(timeout=60)"), tmp_path)
    assert not {1, 2} & set(got["boot"]), got
    assert got["on"] is True and got["worker"] == 7


def test_a_fleet_whose_boot_fails_puts_the_collector_back(collector_on):
    name = unique_name("gcp")
    with pytest.raises(fleet.ConfigError):
        fleet.Fleet.from_config(config(name, {"w": role("no_such_handler")}), env={})
    assert gc.isenabled() is True


STOPPED = """
import gc, json, sys, weakref
sys.path.insert(0, {repo})
from fleet import Executor

def f(x):
    return x

def mapped():
    return sorted(line.split()[-2].rsplit("/", 1)[-1] for line in open("/proc/self/maps") if "/dev/shm/fleet." in line)

def stopped(ex):
    ex.shutdown()
    ref = weakref.ref(ex._sup)
    return ref

if __name__ == "__main__":
    out = {}
    if "{case}" == "program_froze":
        gc.freeze()  # the program's own frozen objects: a fleet's stop must not thaw them
    a = Executor(max_workers=1)
    a.submit(f, 1).result()
    if "{case}" == "two_at_once":
        b = Executor(max_workers=1)
        b.submit(f, 2).result()
        ra = stopped(a); del a; gc.collect()
        out["first_alive_while_second_runs"] = ra() is not None  # frozen by the second's boot too
        rb = stopped(b); del b; gc.collect()
        refs = [ra, rb]
    else:
        refs = [stopped(a)]
        del a
        gc.collect()
    out["alive"] = sum(r() is not None for r in refs)
    out["mapped"] = mapped()
    print(json.dumps(out))
"""


@pytest.mark.parametrize("case", ["one", "two_at_once"])
def test_a_stopped_fleet_is_collected_and_its_shared_memory_unmapped(tmp_path, case):
    # Frozen at boot, a supervisor is a cycle only the collector frees: it and the mapping of
    # its deleted data segment stayed until the process exited. The last fleet's stop thaws.
    got = run(STOPPED.replace("{case}", case), tmp_path)
    assert got["alive"] == 0 and got["mapped"] == [], got
    if case == "two_at_once":
        assert got["first_alive_while_second_runs"] is True  # thawed only when the last one stops


def test_a_program_that_froze_objects_itself_keeps_them_frozen(tmp_path):
    got = run(STOPPED.replace("{case}", "program_froze"), tmp_path)
    assert got["alive"] == 1  # gc.unfreeze cannot tell its objects from the fleet's: nothing is thawed
