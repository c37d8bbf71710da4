"""Starting a fleet's zygote process: the first thing a boot does, and so the first
result's path (docs/executor.md, "What a boot costs").

`launch` starts ``python -P -m fleet.worker.zygote`` with its end of a socketpair; the
zygote then loads its interpreter, its modules and the kernels on the other core while
this process imports the runtime and makes its table. So this module imports only what
the launch itself needs, and none of the standard library's heavier modules: every
millisecond spent importing before the launch is a millisecond later for the first
result. The protocol's own modules (json, fleet's errors, the zygote's module) wait for
`fleet.runtime.zygote_link`, imported after the launch; `socket`'s import (enum and
the rest, ~2.5 ms here) is spared too: its C core, ``_socket``, makes the same pair,
which the link wraps as a `socket.socket` (the same descriptor) once the runtime is
imported. `subprocess` stays: its Popen closes every descriptor but the socket's in
the child (a listening socket fleetd was handed, a caller's inheritable pipe), which
``os.posix_spawn`` has no way to do here.

The protocol over the socket (`fleet.runtime.zygote_link`, `fleet.worker.zygote`) is
not this module's business: it starts the process and hands it over.
"""
from __future__ import annotations

import os
import site
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import _socket

from fleet._root import FLEET_ROOT
from fleet.host import open_files


def spawner_for(name: str) -> ThreadPoolExecutor:
    """The thread that starts a fleet's zygotes. The zygote's parent-death signal fires
    when the *thread* that started it exits: it lives exactly as long as the fleet."""
    return ThreadPoolExecutor(1, thread_name_prefix=f"fleet-{name}-spawner")


class Launched:
    """A zygote launched at the start of a boot (`launch`): its process, this process's end
    of their socket (a raw `_socket.socket`), and the thread that started it."""

    __slots__ = ("spawner", "proc", "sock")

    def __init__(self, spawner: ThreadPoolExecutor, proc: subprocess.Popen, sock):
        self.spawner, self.proc, self.sock = spawner, proc, sock

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """The boot failed: stop the zygote and its thread. Idempotent. One not yet booted
        holds nothing (no segment, no child): SIGKILL is all its teardown, and it does not
        wait for the zygote to finish its imports before it reads an exit."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.sock.close()
        # Its thread is idle (the launch waited for the spawn): joined, it is gone when the
        # boot's error goes up, not some moments later
        self.spawner.shutdown(wait=True)


def launch(name: str, place=None) -> Launched:
    """Start fleet `name`'s zygote now, to boot later (`fleet.runtime.workers.Workers.adopt`):
    it starts and loads the kernels while this process imports its runtime and makes its
    table. `place(pid)` puts it in its cgroup (`spawn`)."""
    spawner = spawner_for(name)
    try:
        proc, sock = spawn(spawner, place)
    except BaseException:
        spawner.shutdown(wait=False)
        raise
    return Launched(spawner, proc, sock)


def spawn(spawner: ThreadPoolExecutor, place=None) -> tuple[subprocess.Popen, object]:
    """Start a zygote process on `spawner`'s thread, not yet booted: ``(process, this
    process's end of its socket)``. It loads the transition kernels and the worker's
    modules while it waits for its boot message.

    `place(pid)`, when given, puts the new zygote in its cgroup (a delegated fleet's
    workers leaf) before anything is asked of it: every worker it forks is born there."""
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        proc = spawner.submit(
            subprocess.Popen,
            # -P: the working directory does not go first on the zygote's sys.path, the
            # root of this fleet (zygote_env) does; the boot message then gives the
            # zygote our whole sys.path, so handlers import as they do here.
            [sys.executable, "-P", "-m", "fleet.worker.zygote", "--fd", str(theirs.fileno()),
             "--parent", str(os.getpid()), *nofile_args()],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=zygote_env(os.environ),
        ).result()
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    if place is not None:
        try:
            place(proc.pid)
        except BaseException:  # not placed: it must not run (nor fork) outside its cgroup
            proc.kill()
            proc.wait()
            ours.close()
            raise
    return proc, ours


def nofile_args() -> list[str]:
    """The soft limit on open files the zygote and its workers run with: the one this
    process found, when it raised its own (fleetd: `fleet.host.open_files`)."""
    soft = open_files.found_soft()
    return [] if soft is None else ["--nofile", str(soft)]


def zygote_env(environ, root: str = FLEET_ROOT, site_dirs=None) -> dict:
    """The zygote's environment: `environ`, with `root` first on PYTHONPATH, unless it is
    one of the interpreter's own site directories: a zygote started with -P finds it
    there as this process did (and site-packages put ahead of the standard library
    could shadow a module of it with a stale backport of the same name)."""
    env = dict(environ)
    if site_dirs is None:
        site_dirs = [*site.getsitepackages(), site.getusersitepackages()]
    if os.path.realpath(root) in {os.path.realpath(d) for d in site_dirs}:
        return env
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = root + (os.pathsep + rest if rest else "")
    return env
