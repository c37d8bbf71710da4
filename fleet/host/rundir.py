"""The runtime directory: where a fleet's daemon puts its control socket, and a fleet its
arrival log by default.

One rule for both (the daemon binds there, `fleet.runtime.arrivals` writes there, and
`fleet.service.control.paths` builds the socket's path and the places a client looks on
it). Which directories are safe to trust is `fleet.service.control.paths`'s rule.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

SYSTEM_RUNTIME_DIR = Path("/run/fleet")


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
    if euid == 0 or access(str(SYSTEM_RUNTIME_DIR), os.W_OK | os.X_OK):
        return SYSTEM_RUNTIME_DIR
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "fleet"
    return Path("/tmp") / f"fleet-{euid}"
