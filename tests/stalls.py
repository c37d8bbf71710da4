"""Units that misbehave towards the processes around them (tests.runtime.test_child_stalls):
they stop their worker's parent (the fork server), stop their own worker, or make their
worker deaf to SIGTERM and to its parent's death. Module-level functions, so the
Executor's workers import them by name as the Fleet's handlers are."""
from __future__ import annotations

import ctypes
import os
import signal
import time

PR_SET_PDEATHSIG = 1


def state(pid: int) -> str:
    """The process state /proc shows for `pid` ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def wait_state(pid: int, states: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while state(pid) not in states and time.monotonic() < deadline:
        time.sleep(0.002)


def stop_fork_server_then_die(_unit=None):
    """SIGSTOP this worker's parent (the fork server), then die: nobody reaps us now."""
    parent = os.getppid()
    os.kill(parent, signal.SIGSTOP)
    wait_state(parent, "Tt")
    os.kill(os.getpid(), signal.SIGKILL)


def stop_myself(_unit=None):
    """SIGSTOP this worker from inside its unit: it holds the unit until resumed."""
    os.kill(os.getpid(), signal.SIGSTOP)
    return "resumed"


def deaf_worker(_unit=None) -> int:
    """Make this worker ignore SIGTERM and drop its parent-death signal; its pid."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG, 0)")
    return os.getpid()


def echo(unit):
    return unit


def parent_of_me(_unit=None) -> tuple[int, int]:
    """(this worker's pid, its parent's: the fork server that forked it)."""
    return os.getpid(), os.getppid()


ACTS = {"stop_parent_die": stop_fork_server_then_die, "stop_myself": stop_myself, "deaf": deaf_worker,
        "me": parent_of_me}


def act(unit):
    """A Fleet handler: payload ``(name, *args)`` runs `ACTS[name]`; ``("echo", x)`` returns x."""
    name, *args = unit.payload
    if name == "echo":
        return args[0]
    return ACTS[name]()
