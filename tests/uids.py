"""Running test code as another user: a forked child drops to uid/gid 65534 (nobody),
with exactly the supplementary groups a test gives it, and reports back as JSON."""
from __future__ import annotations

import functools
import grp
import json
import os
import sys
import sysconfig

NOBODY = 65534
NOGROUP = 65534


def unused_gid(start: int = 64000) -> int:
    """A gid no group in /etc/group has (and not nobody's): membership only where a test grants it."""
    gid = start
    while True:
        try:
            grp.getgrgid(gid)
        except KeyError:
            if gid != NOGROUP:
                return gid
        gid += 1


def as_nobody(fn, *, groups=()):
    """Run ``fn()`` in a forked child as uid 65534, gid 65534 and supplementary ``groups``;
    returns what it returned (JSON-able), or {"child_error": repr} if it raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(r)
            os.setgroups(list(groups))
            os.setresgid(NOGROUP, NOGROUP, NOGROUP)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            out = fn()
            os.write(w, json.dumps(out).encode())
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the test
            os.write(w, json.dumps({"child_error": repr(exc)}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    try:
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    return json.loads(b"".join(chunks))


def try_open(path: str, flags: int) -> str:
    """"ok" if ``path`` opens with ``flags``, else the error's name (e.g. PermissionError)."""
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        return type(exc).__name__
    os.close(fd)
    return "ok"


@functools.cache
def _nobody_reaches_python() -> bool:
    """Can uid 65534 run this interpreter and import its packages (not so when it lives under
    a home only root may enter, as pyenv's under /root does)?"""
    where = (sys.executable, sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"])
    return as_nobody(lambda: all(os.access(p, os.R_OK | os.X_OK) for p in where))


def as_nobody_argv(argv: list[str], *, groups=()) -> list[str]:
    """``argv`` run as uid 65534, gid 65534 and supplementary ``groups`` (none by default),
    through setpriv.

    Where that uid cannot reach the interpreter, the process keeps CAP_DAC_READ_SEARCH
    (ambient, so its children keep it too): it may then read files it could not, but
    its uid -- what SO_PEERCRED reports and what owns what it creates -- is 65534.
    """
    caps = [] if _nobody_reaches_python() else ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    grouping = [f"--groups={','.join(str(g) for g in groups)}"] if groups else ["--clear-groups"]
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOGROUP}", *grouping, *caps, "--", *argv]
