"""Where a daemon's control socket lives: the runtime directory, the socket path,
the places a client looks for it, and the safety check of the directory it binds in."""
from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import NotRunning
from ..names import validate_fleet_name
from .errors import ControlError


_SYSTEM_RUNTIME_DIR = Path("/run/fleet")


def runtime_dir(
    env: Mapping[str, str] | None = None,
    *,
    euid: int | None = None,
    access: Callable[[str, int], bool] = os.access,
) -> Path:
    """The directory a daemon puts its control socket in.

    In order: ``$RUNTIME_DIRECTORY`` (set by systemd's ``RuntimeDirectory=``; the
    first entry when several), ``/run/fleet`` when root or when it is writable,
    ``$XDG_RUNTIME_DIR/fleet``, else ``/tmp/fleet-<euid>``.
    """
    env = os.environ if env is None else env
    systemd_dir = env.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if systemd_dir:
        return Path(systemd_dir)
    euid = os.geteuid() if euid is None else euid
    if euid == 0 or access(str(_SYSTEM_RUNTIME_DIR), os.W_OK | os.X_OK):
        return _SYSTEM_RUNTIME_DIR
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "fleet"
    return Path("/tmp") / f"fleet-{euid}"


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
    dirs.append(_SYSTEM_RUNTIME_DIR)
    if env.get("XDG_RUNTIME_DIR"):
        dirs.append(Path(env["XDG_RUNTIME_DIR"]) / "fleet")
    dirs.append(Path("/tmp") / f"fleet-{euid}")
    return list(dict.fromkeys(d / f"{name}.sock" for d in dirs))


def find_socket(name: str, env: Mapping[str, str] | None = None, **kwargs: Any) -> Path:
    """The first existing socket among `socket_candidates`; NotRunning naming them if none."""
    candidates = socket_candidates(name, env, **kwargs)
    for path in candidates:
        if path.exists():
            return path
    tried = ", ".join(str(p) for p in candidates)
    raise NotRunning(f"fleet {name!r} is not running: no control socket at {tried}")


def prepare_runtime_dir(path: str | os.PathLike, *, euid: int | None = None) -> Path:
    """Create ``path`` (mode 0755) if needed and check that it is safe to bind in.

    Refuses (ControlError) a symlink, a non-directory, a directory owned by someone
    other than ``euid`` or root, or one others can write without the sticky bit:
    under /tmp another user could have made it first to catch our socket.
    """
    path = Path(path)
    euid = os.geteuid() if euid is None else euid
    path.mkdir(mode=0o755, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ControlError(f"runtime dir {path}: not a directory (or a symlink)")
    if st.st_uid not in (euid, 0):
        raise ControlError(f"runtime dir {path}: owned by uid {st.st_uid}, expected {euid}")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise ControlError(
            f"runtime dir {path}: writable by group or others (mode {st.st_mode & 0o7777:o})"
        )
    return path
