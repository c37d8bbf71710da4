"""Building real fleets for tests: configs, and a context that proves nothing is left behind."""
from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid

import psutil

import fleet


def unique_name(prefix: str) -> str:
    """A fleet name no other test, and no other test run on this host, uses: ``prefix``, this
    process's pid and a random suffix. A fleet's name names its shared memory
    (/dev/shm/fleet.<name>) and its socket, so two runs that shared one would collide."""
    return f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:10]}"


def role(handler: str, **fields) -> dict:
    spec = {"kind": "pooled", "handler": f"tests.handlers:{handler}", "slots": 4, "peak_cpus": 1,
            "queue_bound": 100_000}
    spec.update(fields)
    return spec


def config(name: str, roles: dict, *, profile: str = "auto", restart=None, limits=None, posture=None) -> dict:
    cfg = {"fleet": {"name": name, "profile": profile}, "roles": roles}
    if restart:
        cfg["restart"] = restart
    if limits:
        cfg["limits"] = limits
    if posture:
        cfg["posture"] = posture
    return cfg


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def executor_left_clean(max_workers: int = 2):
    """A module's shared `fleet.Executor`, for the cases that leave it as they found it:
    yielded, then shut down, and no process of it may stay (a fixture's body)."""
    before = descendants()
    executor = fleet.Executor(max_workers=max_workers)
    yield executor
    executor.shutdown(wait=True)
    assert not (descendants() - before)


@contextlib.contextmanager
def running(cfg: dict, **kwargs):
    """A booted Fleet; on exit it is shut down and nothing of it may remain: no worker,
    no zygote, no /dev/shm segment (checked even when the test body failed)."""
    before = descendants()
    f = fleet.Fleet.from_config(cfg, env={}, **kwargs)
    ours = descendants() - before
    try:
        yield f
    finally:
        f.shutdown(wait=True, cancel_futures=True)
        name = cfg["fleet"]["name"]
        deadline = time.monotonic() + 10
        while (ours & _alive()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not (ours & _alive()), f"processes left behind: {ours & _alive()}"
        left = [p for p in os.listdir("/dev/shm") if p.startswith(f"fleet.{name}")]
        assert not left, f"segments left behind: {left}"


def _alive() -> set[int]:
    out = set()
    for p in psutil.process_iter(["pid", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE:
            out.add(p.info["pid"])
    return out


def worker_pids(f, timeout: float = 30.0) -> set[int]:
    """The pids of the fleet's workers, once every seat its quota runs has one (restarts
    take a moment)."""
    deadline = time.monotonic() + timeout
    while len(f._sup.pids()) < len(f._sup.follow.live) and time.monotonic() < deadline:
        time.sleep(0.005)
    return set(f._sup.pids().values())


def hold(f, cause: str = "operator") -> None:
    """Hold `f`'s posture Cordoned for `cause` (an operator cordon, on the fleet's loop)."""
    f._sup.call(f._sup.posture.hold, cause)


def hold_loop(f, wait_s: float = 60.0) -> threading.Event:
    """Hold fleet `f`'s loop on a command until the returned event is set: what is posted
    meanwhile waits in its intake (the first post rings), and the loop drains it as one
    run."""
    go, holding = threading.Event(), threading.Event()

    def hold():
        holding.set()
        go.wait(wait_s)

    f._sup.door.intake.post(hold)
    assert holding.wait(wait_s)
    return go
