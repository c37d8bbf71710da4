"""An executor killed before its teardown leaves no segments behind for good: the next
executor of this uid reclaims them. Its fleet name (``executor-<pid>-<n>``) is never booted
again, so the reclaim-on-create every fleet does for its own name would never see them."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import fleet
from fleet.shm.segments import SHM_DIR

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Boots an executor, runs one call, prints its fleet name, then waits on stdin (a live
#: executor) or kills itself with `signal` before any teardown can run.
CHILD = textwrap.dedent("""
    import os, signal, sys
    import fleet
    ex = fleet.Executor(max_workers=1)
    assert ex.submit(pow, 2, 3).result(60) == 8
    print(ex.fleet.name, flush=True)
    if sys.argv[1] == "wait":
        sys.stdin.read()
    else:
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
""")


def segments_of(name: str) -> list[str]:
    return sorted(e for e in os.listdir(SHM_DIR) if e == f"fleet.{name}" or e.startswith(f"fleet.{name}."))


def child(how: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, how], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def test_the_next_executor_reclaims_a_killed_executors_segments_and_leaves_a_live_ones(tmp_path):
    live, live_name = child("wait")
    killed = []
    try:
        for how in ("SIGKILL", "SIGTERM"):
            proc, name = child(how)
            assert proc.wait(60) == -getattr(signal, how)
            killed.append(name)
            assert segments_of(name) == [f"fleet.{name}", f"fleet.{name}.data"]  # what it left
        # Not a fleet's segment, under an executor's name: judged Corrupt, so left alone.
        junk = os.path.join(SHM_DIR, "fleet.executor-0-0")
        with open(junk, "wb") as f:
            f.write(b"not a fleet" * 100)
        try:
            with fleet.Executor(max_workers=1) as ex:
                assert ex.submit(pow, 3, 2).result(60) == 9
                for name in killed:
                    assert segments_of(name) == []
                assert segments_of(live_name) == [f"fleet.{live_name}", f"fleet.{live_name}.data"]
                assert os.path.exists(junk)
        finally:
            os.unlink(junk)
    finally:
        live.stdin.close()
        live.wait(60)
        for name in killed:  # the test's own leftovers, should the sweep have failed
            for entry in segments_of(name):
                os.unlink(os.path.join(SHM_DIR, entry))
    assert segments_of(live_name) == []  # it tore down its own at exit
