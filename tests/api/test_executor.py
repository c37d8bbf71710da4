"""fleet.Executor: ProcessPoolExecutor's face on a fleet (real zygote, workers, rings).

CPython's own test_concurrent_futures runs against it in test_cpython_futures.py;
these are the cases issue 30 names beyond it: a script's __main__ functions, Manager
proxies and the initializer, interpreter exit, the exception rule, max_tasks_per_child
and the budget an embedded executor boots with.
"""
from __future__ import annotations

import functools
import gc
import itertools
import logging
import multiprocessing
import os
import subprocess
import sys
import textwrap
import weakref
from concurrent.futures.process import BrokenProcessPool

import pytest

import fleet
from fleet.api.executor import quota_cores
from fleet.rules import pace
from tests import executor_calls as C
from tests.fleets import descendants, executor_left_clean

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WAIT_S = 60


@pytest.fixture(scope="module")
def ex():
    """One executor for the cases that leave it as they found it; nothing of it stays."""
    yield from executor_left_clean()


def run_script(tmp_path, text: str, *args) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(text))
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=tmp_path)


# --- the drop-in ---------------------------------------------------------------------------
def test_a_scripts_own_function_maps_in_the_workers_and_the_guard_holds(tmp_path):
    out = run_script(tmp_path, """
        import os
        print("top level ran in", "parent" if os.environ.get("ROLE") == "parent" else "a worker", flush=True)

        def triple(x):
            return 3 * x

        if __name__ == "__main__":
            os.environ["ROLE"] = "parent"
            from fleet import Executor as ProcessPoolExecutor
            with ProcessPoolExecutor(max_workers=2) as ex:
                print(list(ex.map(triple, range(6), chunksize=2)), ex.submit(triple, 7).result())
    """)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "[0, 3, 6, 9, 12, 15] 21" in lines
    # The workers imported the script under __mp_main__: its top level ran there (once, in
    # the zygote they are forked from), its guarded block did not.
    assert lines.count("[0, 3, 6, 9, 12, 15] 21") == 1 and "top level ran in a worker" in lines


def test_a_script_whose_top_level_reads_its_arguments_imports_in_the_workers(tmp_path):
    """A spawned child takes on its parent's sys.argv before it imports the main module
    (multiprocessing.spawn's ``sys_argv``): a script that reads its arguments outside
    the guard imports in fleet's workers too, and sees the same ones."""
    out = run_script(tmp_path, """
        import sys
        FACTOR = int(sys.argv[1])  # at the top level: the workers import it too

        def scale(x):
            return (FACTOR * x, sys.argv[1:])

        if __name__ == "__main__":
            from fleet import Executor as ProcessPoolExecutor
            with ProcessPoolExecutor(max_workers=1) as ex:
                print(list(ex.map(scale, range(3))), flush=True)
    """, "5", "--flag")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str([(0, ["5", "--flag"]), (5, ["5", "--flag"]), (10, ["5", "--flag"])])]


def test_submit_and_map_take_the_stdlib_signatures(ex):
    assert ex.submit(C.add, 2, y=3).result(WAIT_S) == 5
    assert list(ex.map(C.add, range(5), range(5))) == [0, 2, 4, 6, 8]
    assert list(ex.map(C.add, range(50), range(40), chunksize=7)) == [2 * i for i in range(40)]
    assert sorted(ex.map_unordered(C.square, range(20), chunksize=3)) == [i * i for i in range(20)]
    with pytest.raises(ValueError):
        list(ex.map(C.square, range(3), chunksize=0))


def test_a_chunk_calls_fn_as_the_builtin_map_does_and_counts_each_call(ex):
    pairs = [(1, 2), (3, 4, 5), (), (6,), (7, 8)]
    before = ex.fleet.ledger()
    # one iterable: each item is fn's one argument, a tuple too, as the builtin map passes it
    assert list(ex.map(len, pairs, chunksize=3)) == [2, 3, 0, 1, 2]
    # several: fn takes one argument from each, the shortest iterable ends the map
    assert list(ex.map(C.add, range(9), range(10, 17), chunksize=4)) == [i + i + 10 for i in range(7)]
    after = ex.fleet.ledger()
    # 2 + 2 chunks, one unit each; the ledger's items are the calls they carried
    assert after["submitted"] - before["submitted"] == 4
    assert after["items"]["submitted"] - before["items"]["submitted"] == 12
    assert after["items"]["solved"] - before["items"]["solved"] == 12


@pytest.mark.parametrize("chunksize", [1, 4, None])
def test_map_lets_go_of_each_result_it_hands_out(ex, chunksize, monkeypatch):
    monkeypatch.setattr(pace, "BATCH_S", 3600.0)  # None: batches from the second refill on
    # CPython's test_free_reference, also for chunks: a result the caller dropped is freed
    # at once, not held by the map until the next item or the end of its chunk
    for obj in ex.map(C.box, range(10), chunksize=chunksize):
        ref = weakref.ref(obj)
        del obj
        gc.collect()
        assert ref() is None


def test_a_chunk_with_failed_calls_hands_out_the_values_before_the_first(ex):
    it = ex.map(C.divide, [4, 6, 1, 8], [2, 3, 0, 4], chunksize=4)
    assert (next(it), next(it)) == (2.0, 2.0)
    with pytest.raises(ZeroDivisionError) as info:
        next(it)
    assert "in divide" in info.value.__cause__.tb
    got = []
    with pytest.raises(TypeError, match="can't multiply sequence"):
        for value in ex.map_unordered(C.square, [1, "x", 3], chunksize=3):
            got.append(value)
    assert got == [1]


def test_a_function_the_workers_cannot_find_by_name_fails_as_its_unpickling_would(ex, monkeypatch):
    """A module-level function travels by name (fleet.worker.calls): one the caller's module
    holds but the workers' does not (made after they started) fails its call with the
    outcome pickle's way gives, and submit and map with it as well."""

    def late(x):
        return x

    late.__qualname__, late.__name__, late.__module__ = "late", "late", C.__name__
    monkeypatch.setattr(C, "late", late, raising=False)
    assert fleet.worker.calls.call_payload(late, (1,), {})[:2] == (C.__name__, "late")
    failures = []
    for fn in (late, functools.partial(late)):  # by name; as pickle writes it
        with pytest.raises(fleet.UnitFailed) as raised:
            ex.submit(fn, 1).result(60)
        failures.append(raised.value)
    for exc in failures:
        assert exc.reason == "HandlerError" and exc.original is None
        assert "the payload cannot be unpickled in the worker: AttributeError: " in exc.outcome.detail
    with pytest.raises(fleet.UnitFailed, match="cannot be unpickled in the worker: AttributeError"):
        list(ex.map(late, [1, 2], timeout=60))
    with pytest.raises(fleet.UnitFailed, match="cannot be unpickled in the worker: AttributeError"):
        list(ex.map(late, [1, 2, 3], chunksize=2, timeout=60))  # a chunk, by name (`Calls.wire`)
    assert ex.submit(C.square, 7).result(60) == 49  # and the executor goes on


def test_a_manager_proxy_passed_as_an_argument_reaches_its_manager(ex):
    with multiprocessing.Manager() as manager:
        shared = manager.list()
        assert [ex.submit(C.put, shared, i).result(WAIT_S) for i in range(3)] == [1, 2, 3]
        assert list(shared) == [0, 1, 2]


def test_a_multiprocessing_queue_is_refused_at_submit_naming_what_works(ex):
    queue = multiprocessing.get_context("fork").Queue()  # ("spawn" would start a resource tracker process)
    with pytest.raises(fleet.PayloadUnpicklable, match=r"Manager\(\) proxy"):
        ex.submit(C.put, queue, 1)
    assert ex.submit(C.square, 3).result(WAIT_S) == 9  # nothing was queued, nothing broke


def test_the_initializer_runs_in_every_worker_before_its_first_call():
    with fleet.Executor(max_workers=2, initializer=C.init, initargs=("ready",)) as ex:
        assert set(ex.map(C.state, range(8))) == {"ready"}


def test_a_failing_initializer_breaks_the_executor():
    with fleet.Executor(max_workers=1, initializer=C.init_fails) as ex:
        # Its worker starts with the executor, so the executor may learn it is broken before
        # this first submit (which then raises, as ProcessPoolExecutor's submit does once
        # broken) or after it (the call fails): BrokenProcessPool either way.
        with pytest.raises(BrokenProcessPool):
            ex.submit(C.square, 2).result(WAIT_S)
        assert ex._broken
        with pytest.raises(BrokenProcessPool, match="initializer failed"):
            ex.submit(C.square, 2)


def test_max_tasks_per_child_replaces_the_worker_after_that_many_calls(monkeypatch):
    monkeypatch.setattr(pace, "BATCH_S", 3600.0)  # a batching map would batch at once
    with fleet.Executor(max_workers=1, max_tasks_per_child=3) as ex:
        pids = [ex.submit(C.pid).result(WAIT_S) for _ in range(7)]
        assert pids[0] == pids[1] == pids[2] != pids[3] == pids[4] == pids[5] != pids[6]
        assert ex.fleet.ledger()["failed"] == 0  # a retirement is no death
        assert list(ex.map(C.square, range(10))) == [i * i for i in range(10)]  # sent-ahead calls rerouted, unrun
        # a map's calls are counted one by one too: its default does not batch them here
        pids = list(ex.map(C.pid, range(30)))
        runs = [len(list(run)) for _pid, run in itertools.groupby(pids)]
        assert max(runs) <= 3 and len(runs) >= 10, pids


def test_lone_calls_stay_on_the_worker_still_awake_and_take_turns_under_max_tasks_per_child():
    # One call at a time goes to the worker that ran out of work last (it may still be
    # looking for its next task); with max_tasks_per_child that worker may be the one
    # leaving, so the workers take turns (fleet.rules.dispatch, `warm_seats`).
    with fleet.Executor(max_workers=2, oversubscribe=True) as ex:  # two workers on any host
        pids = [ex.submit(C.pid).result(WAIT_S) for _ in range(6)]
        assert len(set(pids)) == 1, pids
    with fleet.Executor(max_workers=2, oversubscribe=True, max_tasks_per_child=10) as ex:
        pids = [ex.submit(C.pid).result(WAIT_S) for _ in range(6)]
        assert pids[0] != pids[1] and pids[0::2] == [pids[0]] * 3 and pids[1::2] == [pids[1]] * 3, pids


# --- map's batches -------------------------------------------------------------------------------
def _units_and_items(ex) -> tuple[int, int]:
    ledger = ex.fleet.ledger()
    return ledger["submitted"], ledger["items"]["submitted"]


def test_a_map_without_chunksize_batches_short_calls_and_keeps_their_order(ex, monkeypatch):
    monkeypatch.setattr(pace, "BATCH_S", 3600.0)  # every measure calls for batches: as large as growth allows
    units, items = _units_and_items(ex)
    assert list(ex.map(C.square, range(3000))) == [i * i for i in range(3000)]
    assert sorted(ex.map_unordered(C.add, range(500), range(500))) == [2 * i for i in range(500)]
    after_units, after_items = _units_and_items(ex)
    assert after_items - items == 3500
    assert after_units - units < 3500 / 4  # batched: a unit carried many calls


def test_a_batching_maps_batches_of_large_arguments_hold_their_bytes_bound(ex, monkeypatch):
    # Calls that run in no time on arguments of a known size (their buffers'): the batches
    # are bounded by BATCH_BYTES of arguments, not by time alone.
    import numpy as np

    monkeypatch.setattr(pace, "BATCH_S", 3600.0)  # time alone would make batches as large as growth allows
    monkeypatch.setattr(pace, "BATCH_BYTES", 64 << 10)  # four of these 16 KiB arguments
    arrays = [np.full((16 << 10) // 8, float(i)) for i in range(400)]
    units, items = _units_and_items(ex)
    assert list(ex.map(C.first, arrays)) == [float(i) for i in range(400)]
    after_units, after_items = _units_and_items(ex)
    assert after_items - items == 400
    # at most four a unit (by time alone: about 40 units, the later ones of up to 256 calls)
    assert after_units - units >= 400 // 4
    assert after_units - units < 400  # and batched all the same


def test_a_batching_maps_batches_of_large_results_hold_their_bytes_bound(ex, monkeypatch):
    # Calls on arguments of no known size (numbers) that return 16 KiB arrays: the results'
    # size, read from each chunk that comes back, bounds the next batches.
    monkeypatch.setattr(pace, "BATCH_S", 3600.0)
    monkeypatch.setattr(pace, "BATCH_BYTES", 64 << 10)
    units, items = _units_and_items(ex)
    assert sum(len(a) for a in ex.map(C.ones, [2048] * 400)) == 2048 * 400
    after_units, after_items = _units_and_items(ex)
    assert after_items - items == 400
    # four a unit once the first have come back (by time alone: about 40 units in all)
    assert after_units - units >= 400 // 4
    assert after_units - units < 400


def test_batches_of_medium_bytes_travel_through_staging_buffers_intact(ex, monkeypatch):
    # 64 KiB `bytes` stay in their batch's pickle (below OOB_MIN): batches of 8 MiB go and
    # come back beside the rings, their pickles made in the staging buffers of this process
    # and of the workers (fleet.worker.codec._Staging), each written again batch after batch.
    from fleet.worker import codec

    monkeypatch.setattr(pace, "BATCH_S", 3600.0)
    items = [bytes([i % 251, i // 251]) * (32 << 10) for i in range(600)]
    assert list(ex.map(C.same, items)) == items
    assert list(ex.map(C.same, items[::-1])) == items[::-1]
    assert getattr(codec._stages, "staging", None) is not None  # this thread's, kept for the next
    assert 0 < codec.staged_bytes() <= codec.STAGE_KEEP


def test_a_batching_maps_failed_call_raises_at_its_place(ex, monkeypatch):
    monkeypatch.setattr(pace, "BATCH_S", 3600.0)
    divisors = [1] * 2000
    divisors[1500] = 0
    got = []
    with pytest.raises(ZeroDivisionError):
        for value in ex.map(C.divide, range(2000), divisors):
            got.append(value)
    assert got == [float(i) for i in range(1500)]  # every value before it, in order, and none after


def test_a_batching_maps_unpicklable_result_fails_its_own_call_only(ex, monkeypatch):
    monkeypatch.setattr(pace, "BATCH_S", 3600.0)
    units, items = _units_and_items(ex)
    got = []
    with pytest.raises(fleet.UnitFailed, match="cannot be pickled") as info:
        for value in ex.map(C.lock_at, range(1000), [700] * 1000):
            got.append(value)
    assert got == list(range(700)) and info.value.outcome.reason == "ResultError"
    assert _units_and_items(ex)[0] - units < 700 / 4  # it was in a batch


def test_a_map_without_chunksize_sends_calls_one_by_one_when_batches_are_off(ex, monkeypatch):
    monkeypatch.setattr(pace, "BATCH_S", 0.0)  # no call is short enough to share a unit
    units, items = _units_and_items(ex)
    assert list(ex.map(C.square, range(300))) == [i * i for i in range(300)]
    after_units, after_items = _units_and_items(ex)
    assert after_units - units == after_items - items == 300


def test_calls_longer_than_a_batch_travel_one_by_one(ex):
    # measured as they run: each call is longer than BATCH_S, so none shares a unit (cancel
    # and Ctrl-C reach every call but the running ones, as without batches)
    units, items = _units_and_items(ex)
    assert list(ex.map(C.nap, [0.02] * 24)) == [0.02] * 24
    after_units, after_items = _units_and_items(ex)
    assert after_units - units == after_items - items == 24


def test_map_refuses_a_chunksize_below_one(ex):
    with pytest.raises(ValueError, match="chunksize"):
        ex.map(C.square, range(3), chunksize=0)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"max_workers": 0}, ValueError, "max_workers must be greater than 0"),
    ({"max_workers": -1}, ValueError, "max_workers must be greater than 0"),
    ({"initializer": 3}, TypeError, "initializer must be a callable"),
    ({"max_tasks_per_child": 0}, ValueError, "max_tasks_per_child must be >= 1"),
    ({"max_tasks_per_child": "3"}, TypeError, "max_tasks_per_child must be an integer"),
    ({"mp_context": "spawn"}, TypeError, "mp_context must be a multiprocessing context"),
])
def test_bad_arguments_raise_as_process_pool_executor_does_and_start_nothing(kwargs, error, message):
    before = descendants()
    with pytest.raises(error, match=message):
        fleet.Executor(**kwargs)
    assert descendants() == before


def test_max_workers_beyond_the_quota_is_capped_with_one_warning_naming_the_quota(caplog):
    from fleet.host.system import Host
    from fleet.rules.quota import detected_from

    limit = Host().effective_cpus()
    cores = quota_cores(limit)
    with caplog.at_level(logging.INFO, logger="fleet.api.executor"):
        with fleet.Executor(max_workers=cores + 3) as ex:
            assert ex._max_workers == cores and len(ex.fleet.layout.seats) == cores
    said = [r for r in caplog.records if r.name == "fleet.api.executor"]
    assert len(said) == 1 and said[0].levelno == logging.WARNING, said
    text = said[0].getMessage()
    for needle in (f"max_workers={cores + 3}", f"CPU quota runs: {limit.cpus:g} CPUs, from the {detected_from(limit)};",
                   f"running {cores} worker process", f"(pass oversubscribe=True to run {cores + 3})"):
        assert needle in text, (needle, text)


def test_oversubscribe_runs_every_worker_asked_for_and_warns_of_nothing(caplog):
    cores = quota_cores()
    with caplog.at_level(logging.INFO, logger="fleet.api.executor"):
        with fleet.Executor(max_workers=cores + 1, oversubscribe=True) as ex:
            assert ex._max_workers == cores + 1 and len(ex.fleet.layout.seats) == cores + 1
            assert ex.submit(pow, 2, 3).result(60) == 8
    assert not [r for r in caplog.records if r.name == "fleet.api.executor" and r.levelno >= logging.WARNING]


def test_an_embedded_executor_gives_every_core_of_the_quota_to_workers():
    with fleet.Executor() as ex:
        budget = {s.name: s.cores for s in ex.fleet.plan.budget.consumers}
        assert budget["reserve"] == 0 and budget["ambient_io"] == 0 and budget["call"] == quota_cores()
        assert len(ex.fleet.layout.seats) == quota_cores()


def test_shutdown_cancels_every_call_but_the_running_ones():
    """Calls far longer than a round trip are never sent ahead (fleet.rules.pace): when
    shutdown(cancel_futures=True) returns, what it could not cancel is the running calls,
    fewer than ProcessPoolExecutor's running calls and call queue (up to 2 x max_workers + 1)."""
    import time

    with fleet.Executor(max_workers=2) as ex:
        fs = [ex.submit(time.sleep, 0.05) for _ in range(60)]
        deadline = time.monotonic() + WAIT_S
        while sum(f.done() for f in fs) < 4:  # their run time is measured by now
            assert time.monotonic() < deadline
            time.sleep(0.005)
        ex.shutdown(wait=False, cancel_futures=True)
        # Applied on the loop, which had resolved every call that ended before it: the
        # calls neither done nor cancelled now are those the workers held.
        held = [f for f in fs if not f.done()]
        assert 1 <= len(held) <= 2
        ex.shutdown(wait=True)
    ran = [f for f in fs if not f.cancelled()]
    assert all(f.done() and f.exception() is None for f in ran)
    assert sum(f.cancelled() for f in fs) == len(fs) - len(ran) >= 60 - 20


# --- Ctrl-C ------------------------------------------------------------------------------------
CTRL_C_SCRIPT = """
    import os, signal, sys, time

    def half_second(n):
        with open(sys.argv[2], "a") as f:
            f.write(f"{n}\\n")
        time.sleep(0.5)
        return n

    if __name__ == "__main__":
        if sys.argv[1] == "fleet":
            from fleet import Executor as ProcessPoolExecutor
        else:
            from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=2) as ex:
            for _ in ex.map(half_second, range(40)):
                pass
"""


def _sigint_default() -> None:
    """A script's SIGINT as a terminal's Ctrl-C finds it (Python's KeyboardInterrupt), also when
    the suite runs as a background job, whose children a shell starts with SIGINT ignored."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _calls_started_after_ctrl_c(tmp_path, face: str) -> int:
    """Run CTRL_C_SCRIPT with `face`; SIGINT once two calls have started; the calls that
    started in all, as the calls themselves counted them."""
    import signal
    import time

    script, started = tmp_path / f"ctrl_c_{face}.py", tmp_path / f"{face}.started"
    script.write_text(textwrap.dedent(CTRL_C_SCRIPT))
    proc = subprocess.Popen([sys.executable, str(script), face, str(started)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=REPO), cwd=tmp_path,
                            preexec_fn=_sigint_default)
    try:
        deadline = time.monotonic() + WAIT_S
        while not started.exists() or len(started.read_text().split()) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr and proc.stderr.read()
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)  # to the script only: its workers never see it
        _out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err
    return len(started.read_text().split())


def test_ctrl_c_in_a_map_starts_no_more_calls_than_process_pool_executor(tmp_path):
    """0.5 s calls on 2 workers: after Ctrl-C, ProcessPoolExecutor runs its running calls and its
    call queue (max_workers + 1); fleet its running calls only (nothing is sent ahead before the
    calls' run time is known, nor after for calls this long). Counted by the calls, not timed."""
    before = descendants()
    ppe = _calls_started_after_ctrl_c(tmp_path, "ppe")
    ours = _calls_started_after_ctrl_c(tmp_path, "fleet")
    assert 2 <= ours <= ppe < 40, (ours, ppe)
    assert not (descendants() - before)


def test_a_second_ctrl_c_stops_at_once_every_future_resolved_nothing_left(tmp_path):
    """The first Ctrl-C's shutdown waits for the running calls (30 s each here); a second one
    kills the workers, fails every call still owed and tears the fleet down before the
    interrupt goes on."""
    import signal
    import time

    script, marks = tmp_path / "twice.py", tmp_path / "marks"
    script.write_text(textwrap.dedent("""
        import sys, threading, time
        from fleet import Executor

        def say_when_the_shutdown_waits(main):
            # the second Ctrl-C is for the shutdown's wait: say so once the main thread is in it
            while True:
                frame, names = sys._current_frames()[main], []
                while frame is not None:
                    names.append(frame.f_code.co_name)
                    frame = frame.f_back
                if "_stop_with" in names and names[0] == "wait":
                    print("waiting", flush=True)
                    return
                time.sleep(0.01)

        def long_call(path):
            with open(path, "a") as f:
                f.write("start\\n")
            time.sleep(30)
            with open(path, "a") as f:
                f.write("end\\n")

        if __name__ == "__main__":
            ex = Executor(max_workers=2)
            print(ex.fleet.name, flush=True)
            futures = [ex.submit(long_call, sys.argv[1]) for _ in range(10)]
            print("submitted", flush=True)  # the Ctrl-C is for the wait below, not for the submits
            try:
                futures[0].result()
            except KeyboardInterrupt:
                threading.Thread(target=say_when_the_shutdown_waits, args=(threading.get_ident(),),
                                 daemon=True).start()
                try:
                    ex.shutdown(wait=True)
                except KeyboardInterrupt:
                    print("second", all(f.done() for f in futures), sum(f.cancelled() for f in futures),
                          flush=True)
    """))
    before = descendants()
    proc = subprocess.Popen([sys.executable, str(script), str(marks)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=REPO), cwd=tmp_path, preexec_fn=_sigint_default)
    try:
        name = proc.stdout.readline().strip()
        # (on a loaded host two calls may start before the tenth submit: a Ctrl-C then would
        # interrupt the submits, outside the script's try)
        assert proc.stdout.readline() == "submitted\n", proc.poll() is not None and proc.stderr.read()
        deadline = time.monotonic() + WAIT_S
        while not marks.exists() or marks.read_text().count("start") < 2:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline() == "waiting\n", proc.poll() is not None and proc.stderr.read()
        proc.send_signal(signal.SIGINT)  # the shutdown waits for 30 s calls: stop now
        second = proc.stdout.readline().split()
        proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # every future resolved, none cancelled: shutdown(wait=True) let them all run, the second
    # Ctrl-C failed them; no call ran to its end; nothing of the fleet stays
    assert second == ["second", "True", "0"], second
    assert "end" not in marks.read_text()
    assert not (descendants() - before)
    assert not [n for n in os.listdir("/dev/shm") if name in n]


# --- the exception rule ----------------------------------------------------------------------
def test_a_calls_exception_is_raised_as_itself_with_the_workers_traceback(ex):
    with pytest.raises(ZeroDivisionError) as info:
        ex.submit(C.divide, 1, 0).result(WAIT_S)
    assert info.value.args == ("division by zero",)
    assert "in divide" in info.value.__cause__.tb and "return x / y" in info.value.__cause__.tb
    it = ex.map(C.divide, [1, 1, 1], [1, 0, 1], chunksize=2)
    assert next(it) == 1.0
    with pytest.raises(ZeroDivisionError):
        next(it)


def test_an_exception_that_cannot_come_back_is_a_unit_failed_naming_it(ex):
    with pytest.raises(fleet.UnitFailed) as info:
        ex.submit(C.raise_unpicklable).result(WAIT_S)
    assert info.value.reason == "HandlerError" and "CarriesALock" in info.value.outcome.detail
    with pytest.raises(fleet.UnitFailed) as info:
        ex.submit(C.raise_unimportable).result(WAIT_S)
    assert "no_such_module_anywhere" in info.value.outcome.detail


def test_a_worker_death_is_a_broken_process_pool_for_its_call_only(ex):
    with pytest.raises(BrokenProcessPool) as info:
        ex.submit(C.die).result(WAIT_S)
    assert isinstance(info.value, fleet.UnitFailed) and info.value.reason == "LaneDeath"
    assert ex.submit(C.square, 5).result(WAIT_S) == 25  # the executor goes on


def test_submit_after_shutdown_raises_the_stdlibs_runtime_error():
    ex = fleet.Executor(max_workers=1)
    ex.shutdown()
    with pytest.raises(RuntimeError, match="^cannot schedule new futures after shutdown$"):
        ex.submit(C.square, 1)
    with pytest.raises(RuntimeError, match="cannot schedule new futures"):
        ex.map(C.square, [1])


# --- interpreter exit --------------------------------------------------------------------------
@pytest.mark.parametrize("ending", ["", "ex.shutdown(wait=False)"])
def test_work_submitted_finishes_at_interpreter_exit(tmp_path, ending):
    out = run_script(tmp_path, f"""
        import sys, time
        from fleet import Executor

        def slow_write(path, n):
            time.sleep(0.2)
            with open(path, "a") as f:
                f.write(f"{{n}}\\n")

        if __name__ == "__main__":
            ex = Executor(max_workers=2)
            for n in range(6):
                ex.submit(slow_write, sys.argv[1], n)
            {ending}
    """, str(tmp_path / "done.txt"))
    assert out.returncode == 0 and not out.stderr, out.stderr
    assert sorted((tmp_path / "done.txt").read_text().split()) == [str(n) for n in range(6)]


def test_cancel_futures_at_shutdown_is_honoured_at_exit(tmp_path):
    out = run_script(tmp_path, """
        import time
        from fleet import Executor
        if __name__ == "__main__":
            ex = Executor(max_workers=1)
            futures = [ex.submit(time.sleep, 0.05) for _ in range(60)]
            ex.shutdown(wait=False, cancel_futures=True)
            print(sum(f.cancelled() for f in futures))
    """)
    assert out.returncode == 0, out.stderr
    # the queued ones stayed cancelled; exit ran only the one the worker held: nothing is
    # sent ahead before the calls' run time is known
    assert int(out.stdout) >= 60 - 1


# --- progress ---------------------------------------------------------------------------------
def test_map_progress_draws_a_bar_on_stderr(ex, capsys):
    assert list(ex.map(C.square, range(40), chunksize=8, progress=True)) == [i * i for i in range(40)]
    assert "40/40" in capsys.readouterr().err
    assert list(ex.map(C.square, range(5))) == [0, 1, 4, 9, 16]
    assert "5/5" not in capsys.readouterr().err  # off by default


def test_a_forked_child_of_the_program_exits_without_waiting_for_the_fleet(ex):
    # A multiprocessing child runs the interpreter's exit hooks as it ends; the fleet's
    # belongs to the parent (the child has no loop to wait for).
    child = multiprocessing.get_context("fork").Process(target=C.square, args=(3,))
    child.start()
    child.join(WAIT_S)
    assert child.exitcode == 0
    assert ex.submit(C.square, 4).result(WAIT_S) == 16
