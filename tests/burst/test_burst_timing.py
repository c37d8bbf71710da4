"""What keeps fleet-burst's driver on time: no cyclic GC while a mode runs, and the driver thread in
the real-time class (root) with the spin margin that goes with it, restored afterwards, and never
passed on to a thread it starts. Pure process state: nothing here is timed."""
from __future__ import annotations

import gc
import os
import threading

from fleet.burst.replay import RT_SPIN_S, SPIN_S, quiet_gc, urgent_threads


def _policy(tid: int) -> int:
    return os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK


def test_quiet_gc_pauses_collection_and_restores_it():
    assert gc.isenabled()
    with quiet_gc():
        assert not gc.isenabled()
        assert gc.get_freeze_count() > 0  # what lived before is not scanned again
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_quiet_gc_restores_collection_when_the_mode_fails():
    try:
        with quiet_gc():
            raise RuntimeError("a mode failed")
    except RuntimeError:
        pass
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_driver_and_the_threads_sharing_its_gil_run_real_time_while_a_mode_runs():
    assert os.geteuid() == 0, "CI runs as root (see PLATFORM.md); the real-time class needs it"
    tid = threading.get_native_id()
    release = threading.Event()
    other = threading.Thread(target=release.wait, name="like-the-supervisor-loop")
    other.start()
    seen = {}

    def started_inside():
        seen["policy"] = _policy(threading.get_native_id())

    try:
        assert _policy(tid) == _policy(other.native_id) == os.SCHED_OTHER
        with urgent_threads() as spin:
            assert spin == RT_SPIN_S
            assert _policy(tid) == os.SCHED_FIFO
            assert _policy(other.native_id) == os.SCHED_FIFO  # it takes the GIL too
            t = threading.Thread(target=started_inside)
            t.start()
            t.join()
        assert seen["policy"] == os.SCHED_OTHER  # reset on fork: a thread started meanwhile is normal
        assert _policy(tid) == _policy(other.native_id) == os.SCHED_OTHER  # both restored
    finally:
        release.set()
        other.join()


def test_without_privilege_the_driver_stays_normal_and_spins():
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child drops to uid 65534 and tries
        code = 1
        try:
            os.close(read_end)
            os.setgid(65534)
            os.setuid(65534)
            with urgent_threads() as spin:
                policy = _policy(threading.get_native_id())
            os.write(write_end, f"{spin} {policy}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    spin, policy = out.split()
    assert float(spin) == SPIN_S and int(policy) == os.SCHED_OTHER


def test_no_realtime_keeps_every_thread_normal_even_as_root():
    assert os.geteuid() == 0, "CI runs as root (see PLATFORM.md); the control needs the privilege"
    tid = threading.get_native_id()
    with urgent_threads(False) as spin:
        assert spin == SPIN_S and _policy(tid) == os.SCHED_OTHER
    assert _policy(tid) == os.SCHED_OTHER


def test_the_cli_flag_reaches_the_driver(monkeypatch, tmp_path):
    from fleet.burst import cli

    seen = {}

    def fake_replay(trace, **kwargs):
        seen.update(kwargs)
        raise KeyboardInterrupt  # stop before anything runs

    monkeypatch.setattr("fleet.burst.runner.replay", fake_replay)
    trace = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "traces", "burst-35.jsonl")
    for argv, want in ((["replay", trace, "--no-progress"], True),
                       (["replay", trace, "--no-progress", "--no-realtime"], False)):
        cli.main(argv)
        assert seen.pop("realtime") is want
