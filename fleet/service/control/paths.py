"""Where a daemon's control socket lives: its path in the runtime directory
(`fleet.host.rundir`), the places a client looks for it, and the one safety rule
for the directories on the way to a socket, which the daemon checks before it binds
and a client before it believes a socket it finds.

The rule. A socket is only as trustworthy as whoever could have put it there. So
every directory from ``/`` down to the socket's must be a real directory owned by
a trusted uid (the daemon: its own or root; a client: `fleet.host.trust`), and the
socket's own directory must not be writable by group or others -- not even with
the sticky bit: in a sticky ``/tmp`` another user cannot replace our socket, but
can add one under a name we have not used yet. Above it, a sticky directory is
fine (nobody else can rename what a trusted uid owns inside it: ``/tmp/fleet-5``).
"""
from __future__ import annotations

import os
import stat
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from fleet.rules.errors import NotRunning
from fleet.rules.names import validate_fleet_name
from fleet.host.rundir import SYSTEM_RUNTIME_DIR, runtime_dir
from fleet.host.trust import UntrustedPeer, trusted_uids
from fleet.service.control.errors import ControlError


def socket_path(name: str, env: Mapping[str, str] | None = None, **kwargs: Any) -> Path:
    """``<runtime_dir>/<name>.sock``, the daemon's socket path (see `runtime_dir`)."""
    return runtime_dir(env, **kwargs) / f"{validate_fleet_name(name)}.sock"


def socket_candidates(
    name: str, env: Mapping[str, str] | None = None, *, euid: int | None = None
) -> list[Path]:
    """Every place a daemon named ``name`` may have its socket, in lookup order.

    A client cannot use `runtime_dir` alone: an operator who is not root sees
    ``/run/fleet`` as not writable, yet that is where the systemd service lives.
    """
    env = os.environ if env is None else env
    euid = os.geteuid() if euid is None else euid
    validate_fleet_name(name)
    dirs = []
    if env.get("RUNTIME_DIRECTORY"):
        dirs.append(Path(env["RUNTIME_DIRECTORY"].split(":")[0]))
    dirs.append(SYSTEM_RUNTIME_DIR)
    if env.get("XDG_RUNTIME_DIR"):
        dirs.append(Path(env["XDG_RUNTIME_DIR"]) / "fleet")
    dirs.append(Path("/tmp") / f"fleet-{euid}")
    return list(dict.fromkeys(d / f"{name}.sock" for d in dirs))


def find_socket(
    name: str, env: Mapping[str, str] | None = None, *, euid: int | None = None,
    trust: Collection[int] | None = None,
) -> Path:
    """The first existing socket among `socket_candidates` whose directories are safe
    (the module's rule, owners in ``trust``; default ours and root), by its real path.

    Raises UntrustedPeer naming the first refused directory when only unsafe ones
    hold a socket of that name (``/tmp/fleet-0`` made by another user), else
    NotRunning naming every place tried.
    """
    trust = trusted_uids(euid=euid) if trust is None else trust
    candidates = socket_candidates(name, env, euid=euid)
    refused: UntrustedPeer | None = None
    for path in candidates:
        if not path.exists():
            continue
        real_dir = Path(os.path.realpath(path.parent))  # the directories connect() will walk
        try:
            refusal = socket_dir_refusal(real_dir, trust)
        except FileNotFoundError:
            continue  # removed while we looked: no socket there
        if refusal is None:
            return real_dir / path.name
        uid, where, why = refusal
        refused = refused or UntrustedPeer(f"the socket {path} (directory {where})", uid, why)
    if refused is not None:
        raise refused
    tried = ", ".join(str(p) for p in candidates)
    raise NotRunning(f"fleet {name!r} is not running: no control socket at {tried}")


def socket_dir_refusal(path: Path, trust: Collection[int]) -> tuple[int, Path, str] | None:
    """Why a socket in directory ``path`` is not to be trusted, as (owner uid, the
    directory at fault, reason); None when every directory down to it keeps the
    module's rule. A component that is a symlink is refused: pass a real path."""
    path = Path(path)
    chain = [*reversed(path.parents), path]
    for directory in chain:
        st = os.lstat(directory)
        why = directory_refusal(st, trust, holds_socket=directory == path)
        if why is not None:
            return st.st_uid, directory, why
    return None


def directory_refusal(st: os.stat_result, trust: Collection[int], *, holds_socket: bool) -> str | None:
    """The module's rule for one directory, given its lstat: why it is unsafe, or None."""
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory (or a symlink)"
    if st.st_uid not in trust:
        return f"owned by uid {st.st_uid}, not by a trusted uid ({', '.join(map(str, sorted(trust)))})"
    others_may_add = st.st_mode & 0o022
    if others_may_add and (holds_socket or not st.st_mode & stat.S_ISVTX):
        return f"writable by group or others (mode {st.st_mode & 0o7777:o}): another user could put a socket there"
    return None


def prepare_runtime_dir(path: str | os.PathLike, *, euid: int | None = None) -> Path:
    """Create ``path`` (mode 0755) if needed and check that it is safe to bind in.

    Refuses (ControlError) what the module's rule refuses, with ``euid`` and root
    trusted: a symlink, a non-directory, a directory owned by someone else, one that
    group or others can write (sticky or not: clients would refuse a socket there),
    or a way to it that others could change. Under /tmp another user could have
    made it first to catch our clients.
    """
    path = Path(path)
    euid = os.geteuid() if euid is None else euid
    path.mkdir(mode=0o755, parents=True, exist_ok=True)
    # The way to it resolved (/var/run -> /run is common); the directory itself must not be a link.
    real = Path(os.path.realpath(path.parent)) / path.name
    refusal = socket_dir_refusal(real, {euid, 0})
    if refusal is not None:
        _uid, where, why = refusal
        raise ControlError(f"runtime dir {path}: {'it' if where == real else where} is {why}")
    return path
