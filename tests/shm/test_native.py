"""The C half (fleet._native, built by cffi at install): atomics, futex wake-ups across
processes, the robust mutex surviving a SIGKILLed holder, and the parent-death signal."""
from __future__ import annotations

import mmap
import os
import signal
import time

import pytest

from fleet._native import ffi, lib


@pytest.fixture
def shared():
    """An anonymous shared mapping, inherited across fork like a segment."""
    # Anonymous: nothing outlives the test; the mapping goes with its last reference.
    mm = mmap.mmap(-1, 4096, mmap.MAP_SHARED)
    return ffi.from_buffer(mm)


def _fork(fn):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = fn() or 0
        finally:
            os._exit(code)
    return pid


def _exit_code(pid):
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_atomics(shared):
    p = ffi.cast("uint64_t *", shared)
    assert lib.fleet_cas_u64(p, 0, 5) == 1
    assert lib.fleet_cas_u64(p, 0, 6) == 0
    assert lib.fleet_fetch_add_u64(p, 2) == 5
    assert lib.fleet_load_acquire_u64(p) == 7
    lib.fleet_store_release_u64(p, 1)
    assert lib.fleet_load_acquire_u64(p) == 1


def test_futex_wait_times_out_when_nobody_wakes(shared):
    word = ffi.cast("uint32_t *", shared)
    assert lib.fleet_futex_wait(word, 0, 1_000_000) == 1  # 1 ms, then timeout
    assert lib.fleet_futex_wait(word, 9, -1) == 0  # value differs: returns at once


def test_futex_wakes_a_waiter_in_another_process(shared, reaper):
    word = ffi.cast("uint32_t *", shared)
    flag = ffi.cast("uint32_t *", shared) + 16

    def waiter():
        lib.fleet_fetch_add_u32(flag, 1)  # "I am about to wait"
        while lib.fleet_load_acquire_u32(word) == 0:
            lib.fleet_futex_wait(word, 0, 5_000_000_000)
        return 0 if lib.fleet_load_acquire_u32(word) == 1 else 3

    pid = _fork(waiter)
    reaper.append(pid)
    while lib.fleet_load_acquire_u32(flag) == 0:
        time.sleep(0.001)
    lib.fleet_fetch_add_u32(word, 1)
    lib.fleet_futex_wake(word, 1)
    assert _exit_code(pid) == 0


def test_robust_mutex_recovers_from_a_killed_holder(shared, reaper):
    lock = shared
    assert lib.fleet_mutex_size() <= 64
    assert lib.fleet_mutex_init(lock) == 0
    counter = ffi.cast("uint64_t *", shared) + 16

    def holder():
        assert lib.fleet_mutex_lock(lock) == 0
        lib.fleet_store_release_u64(counter, 1)
        time.sleep(600)  # killed while holding the lock

    pid = _fork(holder)
    reaper.append(pid)
    while lib.fleet_load_acquire_u64(counter) == 0:
        time.sleep(0.001)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert lib.fleet_mutex_lock(lock) == 1  # owner died: we hold it, made consistent
    assert lib.fleet_mutex_unlock(lock) == 0
    assert lib.fleet_mutex_lock(lock) == 0  # and it is an ordinary lock again
    assert lib.fleet_mutex_unlock(lock) == 0
    assert lib.fleet_mutex_destroy(lock) == 0


def test_pdeathsig_kills_the_child_when_its_parent_dies(shared, reaper):
    grandchild_pid = ffi.cast("uint64_t *", shared)

    def middle():
        def leaf():
            lib.fleet_set_pdeathsig(signal.SIGKILL)
            if os.getppid() == 1:
                return 0
            time.sleep(600)
            return 0

        lib.fleet_store_release_u64(grandchild_pid, _fork(leaf))
        time.sleep(600)

    pid = _fork(middle)
    reaper.append(pid)
    while lib.fleet_load_acquire_u64(grandchild_pid) == 0:
        time.sleep(0.001)
    leaf_pid = int(lib.fleet_load_acquire_u64(grandchild_pid))
    reaper.append(leaf_pid)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{leaf_pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    break  # dead, waiting for its (new) parent to reap it
        except FileNotFoundError:
            break
        time.sleep(0.01)
    else:
        pytest.fail("the grandchild outlived its parent")
