"""Units that fork (tests/worker/test_forked_units.py): a child that ends its code in
each way a unit's code can end, and a parent that reports what became of it.

A child that came back into fleet's worker instead of ending would run the worker's
loop; a parent waiting for it would wait for ever. So the parent waits a bounded time
and reports None for a child still running (the bug), after killing it.
"""
from __future__ import annotations

import asyncio
import os
import sys
import time

#: The ways a forked child's code ends: return, raise, sys.exit(7), return after a while.
HOWS = ("return", "raise", "exit", "sleep")
#: The exit status each way gives the child (a Python process's own).
STATUS = {"return": 0, "raise": 1, "exit": 7}
#: How long the child of "sleep" sleeps before it returns (its parent does not wait for it).
NAP_S = 0.3
#: Longest a parent waits for its child to end.
CHILD_BOUND_S = 60.0


def _child(how: str):
    if how == "raise":
        raise ValueError("raised in the forked child")
    if how == "exit":
        sys.exit(7)
    if how == "sleep":
        time.sleep(NAP_S)
    return "child"


def _ended(pid: int) -> int | None:
    """The child's exit status once it ended; None if it is still running after the bound."""
    deadline = time.monotonic() + CHILD_BOUND_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def fork_then(how: str):
    """Fork; the child ends as `how` says. The parent returns ("parent", the child's exit
    status), or ("parent", the child's pid) for "sleep", whose child outlives the unit."""
    pid = os.fork()
    if pid == 0:
        return _child(how)
    return ("parent", pid if how == "sleep" else _ended(pid))


def fork_unit(unit):
    """A role's handler: `fork_then(unit.payload)`."""
    return fork_then(unit.payload)


async def fork_unit_async(unit):
    """An I/O role's coroutine handler: forks in the coroutine."""
    how = unit.payload
    pid = os.fork()
    if pid == 0:
        if how == "sleep":
            await asyncio.sleep(NAP_S)
            return "child"
        return _child(how)
    if how == "sleep":
        return ("parent", pid)
    return ("parent", await asyncio.to_thread(_ended, pid))


def record_then_fork(path: str, i: int):
    """A map item: note (item, pid) in `path`; item 1 forks, and its child returns. The
    parent returns (i, the child's status); the others return (i, None)."""
    with open(path, "a") as f:
        f.write(f"{i} {os.getpid()}\n")
    if i != 1:
        return (i, None)
    pid = os.fork()
    if pid == 0:
        return (i, "child")
    return (i, _ended(pid))


def record_then_fork_unit(unit):
    """`record_then_fork` as a role's handler: the payload is (path, i)."""
    return record_then_fork(*unit.payload)


def scribble(unit):
    """A unit that writes to its worker's result ring behind the worker's back, from a
    child it forks (the child then ends without coming back): a result for a unit that
    is not owed (`unit.payload`: an id that ended or was never submitted), one for this
    unit on a slot it was not sent to, and bytes that are no result. Then it returns
    "parent" (its own result, the one that counts)."""
    import math

    from fleet.rules import fsm
    from fleet.shm import messages as M
    from fleet.worker import inside
    from fleet.worker.codec import dumps

    # The running Worker, through its children's book (it sends with the worker's own push):
    # the collector does not see it (the zygote made it before its boot's gc.freeze)
    worker = inside._CHILDREN._send.__self__
    slot = next(s for s in range(worker.table.n_slots) if worker.table.unit(s) == unit.id)
    other_slot = (slot + 1) % worker.table.n_slots
    body = dumps("child", "the result")

    def result(unit_id: int, at: int) -> bytes:
        return M.RESULT_HEAD.pack(unit_id, at, M.ST_SOLVED, fsm.IDLE, 0.0, math.nan, math.nan)

    pid = os.fork()
    if pid == 0:
        for head in (result(unit.payload, slot), result(unit.id, other_slot)):
            worker.results.push2(M.RESULT, head, body)
        worker.results.push(M.RESULT, b"no result")
        worker.results.push(99, result(unit.id, slot))
        worker.bell.ring()
        os._exit(0)
    return ("parent", _ended(pid))


def fork_and_wait(unit):
    """Fork a child that makes the file `unit.payload` + ".ready" (it runs: past fork and
    its at-fork hooks), then waits until the file `unit.payload` exists (at most the
    bound) and returns; the parent returns the child's pid at once."""
    pid = os.fork()
    if pid == 0:
        open(unit.payload + ".ready", "w").close()
        deadline = time.monotonic() + CHILD_BOUND_S
        while not os.path.exists(unit.payload) and time.monotonic() < deadline:
            time.sleep(0.01)
        return "child"
    return pid


def live_children(pids) -> list[int]:
    """Children of `pids` that still run (a child that ended and was not waited for is a
    zombie: it runs nothing; one reaped between the listing and its status is gone)."""
    import psutil

    out = []
    for pid in pids:
        for child in psutil.Process(pid).children():
            try:
                status = child.status()
            except psutil.NoSuchProcess:
                continue  # reaped since the listing: not a live child
            if status != psutil.STATUS_ZOMBIE:
                out.append(child.pid)
    return out
