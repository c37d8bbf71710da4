"""What a child of the fleet does never hangs it: the supervisor learns of each worker's
death from a pidfd of its own, a fork server that stops answering is replaced, and
shutdown (and the interpreter's exit) returns within its bound whatever a child does
(docs/internals.md, "Deaths"; docs/executor.md, "Shutdown").

Real processes: a unit SIGSTOPs its worker's parent (the fork server) and then its
worker dies; a unit stops its own worker and shutdown begins; a unit makes its worker
ignore SIGTERM and drop its parent-death signal. On the Fleet, and on the Executor in a
program of its own (shut down, and left to the interpreter's exit).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from fleet.rules.unit import UnitFailed
from tests import stalls
from tests.daemons import BOUND_S, REPO, wait_until
from tests.fleets import config, running, unique_name

#: generous: what the documented bound (fork_server_timeout_s + 5 s past the units) must beat by far
SHUTDOWN_BOUND_S = 60.0
ANSWER_S = 1.0  # the fleets' fork_server_timeout_s here


def _cfg() -> dict:
    roles = {"t": {"kind": "pooled", "handler": "tests.stalls:act", "slots": 1, "peak_cpus": 1}}
    return config(unique_name("cs"), roles,
                  restart={"max_restarts": 100, "within_seconds": 10, "fork_server_timeout_s": ANSWER_S})


def _gone(pid: int) -> bool:
    return stalls.state(pid) in ("", "Z")


def _shut_within(f, bound: float = SHUTDOWN_BOUND_S) -> bool:
    """Shut `f` down on a thread: True if it returned within `bound`."""
    closer = threading.Thread(target=f.shutdown, daemon=True)
    closer.start()
    closer.join(bound)
    return not closer.is_alive()


def _unstop(*pids: int) -> None:
    """So that a failing test still cleans up: resume what a unit stopped."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_a_worker_dying_behind_a_stopped_fork_server_is_a_lane_death_and_the_server_is_replaced():
    with running(_cfg()) as f:
        worker0, zygote0 = f.submit("t", ("me",)).result(BOUND_S)
        try:
            exc = f.submit("t", ("stop_parent_die",)).exception(BOUND_S)
            assert isinstance(exc, UnitFailed) and exc.reason == "LaneDeath", exc
            # later units solve, on a worker of a new fork server; the stopped one was killed
            worker1, zygote1 = f.submit("t", ("me",)).result(BOUND_S)
            assert zygote1 != zygote0 and worker1 != worker0
            assert _gone(zygote0)
            assert [f.submit("t", ("echo", i)).result(BOUND_S) for i in range(5)] == list(range(5))
            assert _shut_within(f), "shutdown did not return"
        finally:
            _unstop(zygote0)
        ledger = f.ledger()
        assert (ledger["submitted"], ledger["solved"], ledger["failed"]) == (8, 7, 1), ledger
        assert ledger["failed_by_reason"] == {"LaneDeath": 1}


def test_a_worker_stopped_while_shutdown_waits_is_killed_and_the_units_behind_it_run():
    with running(_cfg()) as f:
        worker, _ = f.submit("t", ("me",)).result(BOUND_S)
        held = f.submit("t", ("stop_myself",))
        try:
            wait_until(lambda: stalls.state(worker) in "Tt", "the worker stopped itself")
            behind = [f.submit("t", ("echo", i)) for i in range(3)]
            assert _shut_within(f), "shutdown did not return"
            exc = held.exception(0)
            assert isinstance(exc, UnitFailed) and exc.reason == "LaneDeath", exc
            assert [b.result(0) for b in behind] == [0, 1, 2]
            assert _gone(worker)
        finally:
            _unstop(worker)
        assert f.ledger()["failed_by_reason"] == {"LaneDeath": 1}


def test_a_worker_deaf_to_sigterm_and_its_parents_death_is_gone_after_shutdown():
    with running(_cfg()) as f:
        deaf = f.submit("t", ("deaf",)).result(BOUND_S)
        assert f.submit("t", ("echo", 1)).result(BOUND_S) == 1  # it serves on
        try:
            assert _shut_within(f), "shutdown did not return"
            assert _gone(deaf), "the worker outlived its fleet"
        finally:
            if not _gone(deaf):
                os.kill(deaf, signal.SIGKILL)


# --- the Executor, in a program of its own ------------------------------------------------
SCRIPT = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {repo!r})
    import fleet
    from tests import stalls

    def say(**what):
        print(json.dumps(what), flush=True)

    def outcome(fut):
        exc = fut.exception()
        return ["solved", fut.result()] if exc is None else [type(exc).__name__, getattr(exc, "reason", None)]

    if __name__ == "__main__":
        ex = fleet.Executor(max_workers=1)
        worker0, zygote0 = ex.submit(stalls.parent_of_me).result(60)
        say(name=ex._sup.name, zygote0=zygote0)
        died = ex.submit(stalls.stop_fork_server_then_die)
        say(died=outcome(died))
        say(after=ex.submit(stalls.parent_of_me).result(60))
        say(deaf=ex.submit(stalls.deaf_worker).result(60))
        held = ex.submit(stalls.stop_myself)
        held.add_done_callback(lambda fut: say(held=outcome(fut)))
        behind = ex.submit(pow, 2, 5)
        behind.add_done_callback(lambda fut: say(behind=outcome(fut)))
        stalls.wait_state(ex._sup.pids()[0], "Tt")
        if sys.argv[1] == "shutdown":
            ex.shutdown()
            say(shut=True)
        # else: the interpreter's exit shuts it down
""")


@pytest.mark.parametrize("how", ["shutdown", "exit"])
def test_an_executor_outlives_a_stopped_fork_server_a_stopped_worker_and_a_deaf_one(tmp_path, how):
    script = tmp_path / "stalls.py"
    script.write_text(SCRIPT.format(repo=REPO))
    proc = subprocess.Popen([sys.executable, str(script), how], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    try:
        out, err = proc.communicate(timeout=SHUTDOWN_BOUND_S * 2)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the program did not exit\n{out}\n{err[-3000:]}")
    finally:
        said = {}
        for line in out.splitlines() if proc.returncode is not None else ():
            if line.startswith("{"):
                said.update(json.loads(line))
        for pid in (said.get("zygote0"), said.get("deaf")):
            if pid and not _gone(pid):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{err[-3000:]}"
    assert said["died"] == ["UnitBroken", "LaneDeath"], said  # the Executor's BrokenProcessPool
    assert said["after"][1] != said["zygote0"]  # a new fork server forked it
    assert said["held"] == ["UnitBroken", "LaneDeath"], said
    assert said["behind"] == ["solved", 32], said
    assert said.get("shut") is (True if how == "shutdown" else None)
    assert _gone(said["zygote0"]) and _gone(said["deaf"])
    assert not [p for p in os.listdir("/dev/shm") if p.startswith(f"fleet.{said['name']}")]
