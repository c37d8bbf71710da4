"""CPython's own test_concurrent_futures, run against `fleet.Executor`.

The file is not in the repo: `tests.cpython_suite` obtains it for this interpreter's
minor version (from the stdlib or the distribution when installed there, otherwise
Debian's ``libpython3.X-testsuite`` downloaded and unpacked into a cache, never
installed) as the module ``cpython_test_concurrent_futures`` in a directory put on
``sys.path``, so that fleet's workers import the functions its tests submit by
reference, as ProcessPoolExecutor's children do. Where it cannot be had the module
skips with one line saying why; with ``FLEET_REQUIRE_CPYTHON_TESTS=1`` (CI sets it)
it fails instead. The test classes are built as the file builds its own
(``create_executor_tests``), with `fleet.Executor` as the executor type:

* the generic Executor tests (ExecutorTest, WaitTests, AsCompletedTests,
  ExecutorShutdownTest) and FutureTests: every one must pass;
* the ProcessPoolExecutor tests (ProcessPoolExecutorTest, ProcessPoolShutdownTest,
  ExecutorDeadlockTest, InitializerMixin, FailingInitializerMixin): each passes, or
  is listed in NOT_APPLICABLE with the reason, which docs/executor.md gives in full.

The adapter changes one thing in the file's scripts: three ExecutorShutdownTest tests
run a child interpreter whose script imports the executor type by name from
``concurrent.futures`` and a helper from ``test.test_concurrent_futures``;
`_assert_python_ok` rewrites those two import lines (to ``fleet`` and to the copied
module) and lets the child see this tree on PYTHONPATH. The scripts are otherwise run
as written, but for one line added after the import: they ask for up to 5 workers
and check that the child's stderr is empty (no error at interpreter exit), and fleet
says, with one WARNING at construction, that a ``max_workers`` beyond the quota is
capped; the line raises that logger's level above it, in the child only.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
import sys

import pytest

import fleet
from tests import cpython_suite
from tests.cpython_suite import MODULE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: ProcessPoolExecutor tests that do not apply to fleet.Executor, with the reason
#: (docs/executor.md, "CPython's tests"). Every test not named here must pass.
NOT_APPLICABLE = {
    # They read ProcessPoolExecutor's private `_processes` (a dict of its
    # multiprocessing.Process children) or `_executor_manager_thread`/`_call_queue`.
    "test_killed_child": "reads _processes; and fleet fails only the killed worker's unit, the executor goes on",
    "test_saturation": "reads _processes (fleet's workers are its zygote's forks, not Process objects)",
    "test_idle_process_reuse_one": "reads _processes",
    "test_idle_process_reuse_multiple": "reads _processes",
    "test_max_tasks_per_child": "reads _processes (the pid checks it makes pass: tests/api/test_executor.py)",
    "test_max_tasks_per_child_defaults_to_spawn_context": "reads _mp_context's start method: mp_context is moot",
    "test_processes_terminate": "reads _processes",
    "test_context_manager_shutdown": "tests concurrent.futures.ProcessPoolExecutor itself (it builds one), not the executor type",
    "test_del_shutdown": "tests concurrent.futures.ProcessPoolExecutor itself (it builds one), not the executor type",
    "test_shutdown_no_wait": "tests concurrent.futures.ProcessPoolExecutor itself (it builds one), not the executor type",
    "test_shutdown_deadlock_pickle": "reads _executor_manager_thread; an unpicklable call is refused at submit",
    # fleet decides these outcomes differently, and says how (docs/executor.md).
    "test_error_at_task_pickle": "an unpicklable call raises PayloadUnpicklable at submit, nothing queued",
    "test_exit_at_task_unpickle": "a call that cannot be unpickled in the worker fails alone (UnitFailed)",
    "test_error_at_task_unpickle": "a call that cannot be unpickled in the worker fails alone (UnitFailed)",
    "test_exit_during_result_pickle_on_worker": "a result that cannot be pickled fails its unit ResultError",
    "test_error_during_result_pickle_on_worker": "a result that cannot be pickled fails its unit ResultError",
    "test_error_during_result_unpickle_in_result_handler": "a result that cannot be unpickled fails ResultError",
    "test_exit_during_result_unpickle_in_result_handler": "a result that cannot be unpickled fails ResultError",
    "test_hang_gh83386": "with an mp_context its script calls multiprocessing.set_start_method without "
                         "importing multiprocessing (CPython skips it for ProcessPoolExecutor); it runs, "
                         "and passes, in FleetExecutorShutdownTest",
    "test_max_workers_too_large": "Windows only (its own skipUnless)",
}
#: ... and FailingInitializerMixin's one test (InitializerMixin's of the same name passes).
FAILING_INITIALIZER_NOT_APPLICABLE = {
    "test_initializer": "it passes its initializer a multiprocessing.Queue, which only multiprocessing "
                        "children inherit; fleet refuses it at construction (PayloadUnpicklable naming "
                        "manager.Queue()); the broken-executor case: tests/api/test_executor.py",
}
_CHILD_RUN = ("test_interpreter_shutdown", "test_submit_after_interpreter_shutdown", "test_hang_gh83386")


def _load():
    try:
        home = str(cpython_suite.obtain())
    except cpython_suite.Unavailable as exc:
        home, why = None, f"CPython's test_concurrent_futures for {cpython_suite.VERSION} cannot be had: {exc}"
    if home is None:
        if os.environ.get(cpython_suite.REQUIRE) == "1":
            pytest.fail(f"{why} ({cpython_suite.REQUIRE}=1)", pytrace=False)
        pytest.skip(why, allow_module_level=True)
    sys.path.insert(0, home)  # the workers get this process's sys.path: they import the module by name
    spec = importlib.util.spec_from_file_location(MODULE, os.path.join(home, MODULE + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    spec.loader.exec_module(module)
    module.assert_python_ok = functools.partial(_assert_python_ok, module.assert_python_ok, home)
    return module


#: The line added after the import in a child script (see the module docstring).
_QUIET_CAP = "import logging; logging.getLogger('fleet.api.executor').setLevel(logging.ERROR)"


def _assert_python_ok(original, home, *args, **env):
    """The file's child-interpreter runs, with the two import lines pointed at fleet and
    at the copied module (see the module docstring)."""
    args = list(args)
    script = args[-1]
    script = re.sub(r"^([ \t]*)from concurrent\.futures import Executor\b",
                    lambda m: f"{m[1]}from fleet import Executor\n{m[1]}{_QUIET_CAP}", script, flags=re.M)
    script = script.replace("from test.test_concurrent_futures import", f"from {MODULE} import")
    args[-1] = script
    path = os.pathsep.join([home, REPO, os.environ.get("PYTHONPATH", "")])
    return original(*args, PYTHONPATH=path, **env)


cf = _load()


class FleetExecutorMixin(cf.ExecutorMixin):
    """The file's ThreadPoolMixin, with fleet.Executor: built with ``max_workers`` only."""

    executor_type = fleet.Executor


class FleetProcessPoolMixin(FleetExecutorMixin):
    """The file's ProcessPool*Mixin, with fleet.Executor: built with an mp_context too,
    which fleet takes and ignores (its workers are its zygote's forks). `ctx` is also
    what the tests make their own primitives with (a Manager, a Semaphore)."""

    ctx = "spawn"


class StdlibLogging:
    """The logging set-up of a plain interpreter for a test that reads what
    concurrent.futures logs on stderr (a done callback's exception): pytest's logging
    plugin holds handlers on the root logger during each test, so Python's last-resort
    handler, which writes such records to stderr, would never run."""

    def setUp(self):
        self._root_handlers = logging.root.handlers[:]
        logging.root.handlers.clear()
        super().setUp()

    def tearDown(self):
        super().tearDown()
        logging.root.handlers[:] = self._root_handlers


def _build(mixin, *, base=FleetExecutorMixin, not_applicable=()) -> type:
    name = "Fleet" + mixin.__name__.removesuffix("Mixin").removesuffix("Tests").removesuffix("Test") + "Test"
    # A test that does not apply is left out of the class (None is no test to collect),
    # not skipped: the list says why, and nothing is skipped in CI.
    namespace = {test: None for test in not_applicable if hasattr(mixin, test)}
    return type(name, (mixin, base, cf.BaseTestCase), namespace)


# The generic tests: every one must pass.
FleetExecutorTest = _build(cf.ExecutorTest)
FleetWaitTest = _build(cf.WaitTests)
FleetAsCompletedTest = _build(cf.AsCompletedTests)
FleetExecutorShutdownTest = _build(cf.ExecutorShutdownTest)
FutureTests = type("FutureTests", (StdlibLogging, cf.FutureTests), {})

# The ProcessPoolExecutor tests: pass, or not applicable for the reason given.
_POOL = {"base": FleetProcessPoolMixin, "not_applicable": NOT_APPLICABLE}
FleetProcessPoolExecutorTest = _build(cf.ProcessPoolExecutorTest, **_POOL)
FleetProcessPoolShutdownTest = _build(cf.ProcessPoolShutdownTest, **_POOL)
FleetExecutorDeadlockTest = _build(cf.ExecutorDeadlockTest, **_POOL)
FleetInitializerTest = _build(cf.InitializerMixin, **_POOL)
FleetFailingInitializerTest = _build(cf.FailingInitializerMixin, base=FleetProcessPoolMixin,
                                     not_applicable=FAILING_INITIALIZER_NOT_APPLICABLE)


def test_not_applicable_names_real_tests():
    """Every name in NOT_APPLICABLE is a test the file has (a typo would pass silently)."""
    pool_tests = (cf.ProcessPoolExecutorTest, cf.ProcessPoolShutdownTest, cf.ExecutorDeadlockTest)
    missing = [name for name in NOT_APPLICABLE if not any(hasattr(cls, name) for cls in pool_tests)]
    missing += [name for name in FAILING_INITIALIZER_NOT_APPLICABLE if not hasattr(cf.FailingInitializerMixin, name)]
    assert missing == []
