"""The joblib backend "fleet" (fleet.api.joblib_backend): joblib's Parallel on a real fleet.

Registered on import; n_jobs within the quota; a batch's exception as itself; joblib's
early abort (a failing call, a generator left early) cancels what has not started, counted
by the calls themselves in a manager's list, never by time; nesting as under joblib's
other process backends; GridSearchCV(n_jobs=2) under it.
"""
from __future__ import annotations

import functools
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures.process import BrokenProcessPool, _RemoteTraceback

import joblib
import numpy as np
import pytest

import fleet
import fleet.api.joblib_backend as fb
from fleet.api.executor import Executor, quota_cores
from fleet.host import affinity
from tests import joblib_calls as C
from tests import require
from tests.fleets import descendants

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUOTA = quota_cores()
#: Calls in a Parallel call whose abort is counted: far more than can be out of reach.
N = 60


@pytest.fixture(scope="module", autouse=True)
def nothing_left():
    """The backend's shared fleet is shut down after these tests, and nothing of it stays."""
    before = descendants()
    yield
    fb.shutdown(wait=True)
    assert not (descendants() - before)


@pytest.fixture(scope="module")
def manager():
    with multiprocessing.Manager() as m:
        yield m


def on_fleet(n_jobs=2, **kwargs):
    return joblib.parallel_config(backend="fleet", n_jobs=n_jobs, **kwargs)


def run_script(tmp_path, text: str, env=None) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(text))
    env = dict(os.environ if env is None else env, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=180,
                          cwd=tmp_path)


# --- registration ------------------------------------------------------------------------------
def test_importing_the_module_registers_the_backend_and_its_calls_run_in_the_fleets_workers(tmp_path):
    out = run_script(tmp_path, """
        import os, joblib
        from tests import joblib_calls as C
        if __name__ == "__main__":
            try:
                joblib.parallel_config(backend="fleet")
                print("known before the import")
            except ValueError:
                print("unknown before the import")
            import fleet.api.joblib_backend as fb
            print(joblib.parallel.BACKENDS["fleet"] is fb.FleetBackend)
            with joblib.parallel_config(backend="fleet", n_jobs=2):
                out = joblib.Parallel()(joblib.delayed(C.square)(i) for i in range(100))
                pids = set(joblib.Parallel()(joblib.delayed(C.pid)(i) for i in range(100)))
            print(out == [i * i for i in range(100)], os.getpid() in pids, len(pids) <= 2)
            fb.shutdown()
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["unknown before the import", "True", "True False True"]


def test_the_backend_takes_no_parameters_and_names_the_one_given():
    with pytest.raises(TypeError, match="colour"):
        joblib.parallel_config(backend="fleet", colour="blue")


# --- n_jobs ------------------------------------------------------------------------------------
def test_n_jobs_counts_within_the_quota():
    backend = fb.FleetBackend()
    assert backend.effective_n_jobs(-1) == QUOTA
    assert backend.effective_n_jobs(-2) == max(1, QUOTA - 1)
    assert backend.effective_n_jobs(-(QUOTA + 5)) == 1
    assert backend.effective_n_jobs(1) == 1
    assert backend.effective_n_jobs(QUOTA) == QUOTA
    with pytest.raises(ValueError, match="n_jobs == 0"):
        backend.effective_n_jobs(0)


def test_n_jobs_above_the_quota_is_capped_to_it_and_said_once():
    many = QUOTA + 37
    with pytest.warns(UserWarning, match=f"n_jobs={many} is more than the {QUOTA} whole cores") as said:
        with on_fleet(many), joblib.Parallel() as parallel:
            pids = set(parallel(joblib.delayed(C.pid)(i) for i in range(200)))
            parallel(joblib.delayed(C.pid)(i) for i in range(10))
            width = parallel._backend._window.width
        with on_fleet(many):
            joblib.Parallel()(joblib.delayed(C.pid)(i) for i in range(10))
    assert len([w for w in said if f"n_jobs={many}" in str(w.message)]) == 1
    assert width == QUOTA
    assert len(pids) <= QUOTA and os.getpid() not in pids


def test_n_jobs_unset_is_the_whole_budget_and_1_runs_in_this_process():
    with joblib.parallel_config(backend="fleet"), joblib.Parallel() as parallel:
        assert parallel(joblib.delayed(C.square)(i) for i in range(4)) == [0, 1, 4, 9]
        assert type(parallel._backend) is fb.FleetBackend and parallel._backend._window.width == QUOTA
    with on_fleet(1):
        assert set(joblib.Parallel()(joblib.delayed(C.pid)(i) for i in range(4))) == {os.getpid()}


def test_a_call_keeps_no_more_than_n_jobs_batches_on_a_bigger_fleet(manager):
    """On a fleet of 3 workers, a window of 2: two batches run, the others wait for them."""
    ran, gate, ended = manager.list(), manager.Event(), []
    with Executor(max_workers=3, oversubscribe=True) as ex:
        window = fb.Window(ex, 2)
        try:
            futures = [window.submit(functools.partial(C.record, i, ran, gate), ended.append) for i in range(6)]
            deadline = time.monotonic() + C.GATE_S
            while len(ran) < 2:
                assert time.monotonic() < deadline, "the first two batches never started"
                time.sleep(0.01)
            assert (len(window._running), len(window._waiting)) == (2, 4)
        finally:
            gate.set()
        assert [f.result(timeout=C.GATE_S) for f in futures] == list(range(6))
    assert sorted(ran) == list(range(6)) and len(ended) == 6


@pytest.mark.parametrize("return_as", ["list", "generator", "generator_unordered"])
def test_every_return_as_gives_every_result(return_as):
    with on_fleet():
        out = list(joblib.Parallel(return_as=return_as)(joblib.delayed(C.square)(i) for i in range(500)))
    expected = [i * i for i in range(500)]
    assert (sorted(out) if return_as == "generator_unordered" else out) == expected


# --- exceptions --------------------------------------------------------------------------------
def test_a_calls_exception_is_raised_as_itself_with_the_workers_traceback():
    with on_fleet():
        with pytest.raises(ZeroDivisionError, match="call 7 divided by zero") as info:
            joblib.Parallel(batch_size=4)(joblib.delayed(C.fail_at)(i, 7) for i in range(40))
        assert isinstance(info.value.__cause__, _RemoteTraceback)
        assert "fail_at" in str(info.value.__cause__)
        with pytest.raises(C.Refusal) as info:
            list(joblib.Parallel(return_as="generator")(joblib.delayed(C.refuse)(429) for _ in range(3)))
        assert info.value.code == 429 and info.value.args == (429, "refused in the worker")


def test_a_parallel_kept_open_runs_again_after_an_abort():
    # the last call fails, once all are dispatched: a call that fails sooner can leave batches
    # in joblib's own queue of the Parallel object, and its next call runs them first (with any backend)
    with on_fleet(), joblib.Parallel(batch_size=1, pre_dispatch="all") as parallel:
        with pytest.raises(ZeroDivisionError):
            parallel(joblib.delayed(C.fail_at)(i, 9) for i in range(10))
        assert parallel(joblib.delayed(C.square)(i) for i in range(10)) == [i * i for i in range(10)]


def test_a_worker_death_fails_its_call_as_a_broken_pool_and_the_fleet_goes_on():
    with on_fleet():
        with pytest.raises(BrokenProcessPool):
            joblib.Parallel(batch_size=1)(joblib.delayed(C.die_at)(i, 3) for i in range(8))
        assert joblib.Parallel()(joblib.delayed(C.square)(i) for i in range(10)) == [i * i for i in range(10)]


def test_what_no_pickler_can_carry_is_refused_by_name_and_the_next_call_runs():
    # the sixth call is handed to the fleet once earlier ones end, on the fleet's loop thread:
    # its refusal is still its outcome (joblib's timeout bounds a call that lost it)
    items = [0, 1, 2, 3, 4, threading.Lock(), 6, 7]
    with on_fleet():
        with pytest.raises(fleet.PayloadUnpicklable, match="lock"):
            joblib.Parallel(batch_size=1, timeout=C.GATE_S)(joblib.delayed(C.identity)(x) for x in items)
        assert joblib.Parallel()(joblib.delayed(C.identity)(i) for i in range(3)) == [0, 1, 2]


def test_what_plain_pickle_refuses_travels_by_value(tmp_path):
    # a script: its workers import its __main__, so its batches go by reference until plain pickle refuses one
    out = run_script(tmp_path, """
        import joblib
        import fleet.api.joblib_backend as fb
        from tests import joblib_calls as C

        def made_inside(offset):
            def add(x):
                return x + offset
            return add

        if __name__ == "__main__":
            offset = 10
            with joblib.parallel_config(backend="fleet", n_jobs=2):
                print(joblib.Parallel()(joblib.delayed(lambda x: x + offset)(i) for i in range(3)))
                print(joblib.Parallel()(joblib.delayed(made_inside(20))(i) for i in range(3)))
                print(joblib.Parallel()(joblib.delayed(C.square)(i) for i in range(3)))
            fb.shutdown()
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[10, 11, 12]", "[20, 21, 22]", "[0, 1, 4]"]


def test_an_interactive_sessions_own_functions_run_in_the_workers(tmp_path):
    # python -c has no __main__ file for the workers to import: the batches go by value
    code = textwrap.dedent("""
        import os, joblib
        import fleet.api.joblib_backend as fb
        def cube(x):
            return x ** 3, os.getpid()
        with joblib.parallel_config(backend="fleet", n_jobs=2):
            out = joblib.Parallel()(joblib.delayed(cube)(i) for i in range(20))
        print([c for c, _ in out] == [i ** 3 for i in range(20)], os.getpid() in {p for _, p in out})
        fb.shutdown()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]


def test_an_array_argument_arrives_whole_whatever_its_size():
    """An array argument arrives whole, a small one in the ring and a 32 MB one beside it
    (fleet.shm.parcels), and the fleet goes on."""
    small, big = np.arange(1000.0), np.arange(4_000_000, dtype=np.float64)  # 8 KB, 32 MB
    with on_fleet():
        assert joblib.Parallel()(joblib.delayed(C.total)(small) for _ in range(2)) == [float(small.sum())] * 2
        assert joblib.Parallel()(joblib.delayed(C.total)(big) for _ in range(2)) == [float(big.sum())] * 2
        assert joblib.Parallel()(joblib.delayed(C.square)(i) for i in range(3)) == [0, 1, 4]


# --- early abort ---------------------------------------------------------------------------------
def settled(window: fb.Window) -> None:
    """Wait until none of the call's batches is on the fleet or waiting to go: every call
    that was going to run has run (a call holds until its test opens the gate)."""
    deadline = time.monotonic() + C.GATE_S
    while window._running or window._waiting:
        assert time.monotonic() < deadline, "the call's batches never settled"
        time.sleep(0.01)


def test_a_failing_call_cancels_the_calls_that_have_not_started(manager):
    """All N calls handed to the backend at once (a generator's Parallel call dispatches
    them before it returns), then call 0 fails while the others hold: only the calls the
    window had on the fleet ever run (n_jobs of them, and one that took the failed call's
    place)."""
    ran, gate, fail = manager.list(), manager.Event(), manager.Event()
    with on_fleet(2), joblib.Parallel(return_as="generator", pre_dispatch="all", batch_size=1) as parallel:
        window = parallel._backend._window
        try:
            results = parallel(joblib.delayed(C.record)(i, ran, gate, (), fail) for i in range(N))
            assert len(window._waiting) == N - 2  # every call reached the backend; the window holds them
            fail.set()
            with pytest.raises(ZeroDivisionError, match="first call fails"):
                list(results)
        finally:
            fail.set()
            gate.set()
        settled(window)
    assert {0, 1} <= set(ran) <= {0, 1, 2}


@pytest.mark.filterwarnings(r"ignore:\d+ tasks:UserWarning")  # joblib says what the early exit left
def test_a_generator_left_early_cancels_the_calls_that_have_not_started(manager):
    ran, gate = manager.list(), manager.Event()
    with on_fleet(2), joblib.Parallel(return_as="generator", pre_dispatch="all", batch_size=1) as parallel:
        window = parallel._backend._window
        try:
            results = parallel(joblib.delayed(C.record)(i, ran, gate, (0, 1)) for i in range(N))
            assert [next(results), next(results)] == [0, 1]
            results.close()
        finally:
            gate.set()
        settled(window)
    assert {0, 1} <= set(ran) <= {0, 1, 2, 3}


# --- nesting -----------------------------------------------------------------------------------
def test_a_nested_call_runs_on_threads_then_sequentially_as_under_joblibs_process_backends():
    with on_fleet():
        out = joblib.Parallel()(joblib.delayed(C.nested_backends)() for _ in range(2))
    assert out == [(("ThreadingBackend", 1), [("SequentialBackend", 2)] * 2)] * 2


def test_the_fleet_backend_asked_for_inside_a_worker_runs_there_within_its_one_core():
    with on_fleet():
        out = joblib.Parallel()(joblib.delayed(C.fleet_inside)() for _ in range(2))
    for backend, pids, worker in out:
        assert (backend, pids) == ("SequentialBackend", [worker])


def test_a_worker_spread_wider_for_a_while_still_counts_its_seats_one_core():
    """A contended seat's worker is spread over its role's CPUs for a while
    (fleet.rules.contention): nested code in it still counts the core its seat was given."""
    if len(os.sched_getaffinity(0)) < 2:
        require.lacking("needs 2 CPUs to spread a worker over")
    with on_fleet():
        workers = set(joblib.Parallel()(joblib.delayed(C.pid)() for _ in range(8)))
        for worker in workers:
            affinity.pin_process(worker, os.sched_getaffinity(0))  # as the contention watch spreads one
        out = joblib.Parallel()(joblib.delayed(C.fleet_inside_spread)() for _ in range(2))
    for backend, pids, worker, spread in out:
        assert spread > 1  # it ran spread wider ...
        assert (backend, pids) == ("SequentialBackend", [worker])  # ... and counted its one core


THREAD_SCRIPT = """
    import json, joblib
    import fleet.api.joblib_backend as fb
    from tests import joblib_calls as C
    if __name__ == "__main__":
        with joblib.parallel_config(backend="fleet", n_jobs=2):
            print(json.dumps(joblib.Parallel()(joblib.delayed(C.thread_pools)(i) for i in range(2))))
        fb.shutdown()
"""


def _without_thread_variables() -> dict:
    return {k: v for k, v in os.environ.items() if k not in fb.THREAD_VARS}


def test_a_workers_thread_pools_get_the_cores_it_is_pinned_to(tmp_path):
    out = run_script(tmp_path, THREAD_SCRIPT, env=_without_thread_variables())
    assert out.returncode == 0, out.stderr
    for cores, variables, pools in json.loads(out.stdout):
        assert variables == dict.fromkeys(variables, str(cores))
        assert pools and all(threads == cores for _library, threads in pools)


def test_thread_variables_the_user_set_are_left_as_chosen(tmp_path):
    out = run_script(tmp_path, THREAD_SCRIPT, env={**_without_thread_variables(), "OPENBLAS_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr
    for _cores, variables, pools in json.loads(out.stdout):
        assert variables == {"OMP_NUM_THREADS": None, "OPENBLAS_NUM_THREADS": "2", "MKL_NUM_THREADS": None}
        assert ["openblas", 2] in pools


# --- scikit-learn --------------------------------------------------------------------------------
def test_grid_search_with_n_jobs_2_runs_on_the_fleet_and_finds_what_sequential_finds():
    from sklearn.datasets import load_iris
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    X, y = load_iris(return_X_y=True)
    grid = {"C": [0.1, 1.0, 10.0], "gamma": ["scale", 0.1]}
    with joblib.parallel_config(backend="sequential"):
        alone = GridSearchCV(SVC(), grid, cv=3, n_jobs=2).fit(X, y)
    before = fb.SHARED.executor().fleet.ledger()["solved"]
    with joblib.parallel_config(backend="fleet"):
        search = GridSearchCV(SVC(), grid, cv=3, n_jobs=2).fit(X, y)
    assert fb.SHARED.executor().fleet.ledger()["solved"] > before
    assert search.best_params_ == alone.best_params_
    assert np.array_equal(search.cv_results_["mean_test_score"], alone.cv_results_["mean_test_score"])


# --- the shared fleet --------------------------------------------------------------------------
def test_calls_share_one_fleet_and_a_shut_down_one_is_booted_again():
    first = fb.SHARED.executor()
    with on_fleet():
        joblib.Parallel()(joblib.delayed(C.square)(i) for i in range(4))
        joblib.Parallel()(joblib.delayed(C.square)(i) for i in range(4))
    assert fb.SHARED.executor() is first
    fb.shutdown(wait=True)
    with on_fleet():
        assert joblib.Parallel()(joblib.delayed(C.square)(i) for i in range(4)) == [0, 1, 4, 9]
    assert fb.SHARED.executor() is not first


def test_a_forked_child_boots_a_fleet_of_its_own(tmp_path):
    out = run_script(tmp_path, """
        import os, signal, joblib
        import fleet.api.joblib_backend as fb
        from tests import joblib_calls as C
        if __name__ == "__main__":
            with joblib.parallel_config(backend="fleet", n_jobs=2):
                parent = set(joblib.Parallel()(joblib.delayed(C.pid)(i) for i in range(20)))
                child = os.fork()
                if child == 0:
                    signal.alarm(C.GATE_S)  # a child that hangs ends by itself
                    ok = False
                    try:
                        pids = set(joblib.Parallel()(joblib.delayed(C.pid)(i) for i in range(20)))
                        ok = not (pids & parent) and os.getpid() not in pids
                        fb.shutdown()
                    finally:
                        os._exit(0 if ok else 1)
                _, status = os.waitpid(child, 0)
            print(os.waitstatus_to_exitcode(status))
            fb.shutdown()
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0"]
