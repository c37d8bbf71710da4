"""Choose numba's cache directory before numba is imported: never inside the package.

numba caches compiled kernels in ``__pycache__`` beside the source by default. Inside
an installed package that is wrong three ways: a read-only or root-owned
site-packages cannot take them (and a ``cache=True`` function then fails to
compile), ``pip`` does not know the files and leaves them behind on uninstall (the
leftover folder then shadows the next install as an empty namespace package), and
two installs of different versions could meet the same stale files.

So the cache lives in a per-user (or per-service) cache directory, in a folder keyed
by fleet's version, numba's version and the Python ABI, so two versions never share
a kernel. In order:

1. ``$NUMBA_CACHE_DIR``, when set: the operator's explicit choice, used as given;
2. ``$CACHE_DIRECTORY/numba/KEY`` under systemd (``CacheDirectory=fleet`` sets it);
3. ``$XDG_CACHE_HOME/fleet/numba/KEY``, default ``~/.cache/fleet/numba/KEY``.

When none of them is writable the kernels compile uncached (a slower first use, in
every process) and one warning says so: a service never fails for want of a cache.
"""
from __future__ import annotations

import logging
import os
import sys
from importlib import metadata
from pathlib import Path

log = logging.getLogger(__name__)


def cache_key(fleet_version: str, numba_version: str, python_tag: str = sys.implementation.cache_tag) -> str:
    """The folder name that keeps one build's kernels apart from another's."""
    return f"fleet-{fleet_version}-numba-{numba_version}-{python_tag}"


def installed_key() -> str:
    """`cache_key` for this process: this fleet, the numba it will import, this Python."""
    from fleet._version import __version__

    try:
        numba_version = metadata.version("numba")
    except metadata.PackageNotFoundError:  # numba without metadata (vendored): still one key per fleet
        numba_version = "unknown"
    return cache_key(__version__, numba_version)


def candidate_dirs(environ, key: str, home: str | None = None) -> list[Path]:
    """Where the cache may go, best first (see the module docstring); absolute paths only,
    so a missing ``$HOME`` never turns into a folder relative to the working directory."""
    found = []
    systemd = environ.get("CACHE_DIRECTORY", "").split(":")[0]  # several CacheDirectory= are ':'-joined
    if systemd:
        found.append(Path(systemd) / "numba" / key)
    xdg = environ.get("XDG_CACHE_HOME")
    home = os.path.expanduser("~") if home is None else home
    base = Path(xdg) if xdg else Path(home) / ".cache"
    found.append(base / "fleet" / "numba" / key)
    return [p for p in found if p.is_absolute()]


def _writable_dir(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


def choose_cache_dir(environ=os.environ, key: str | None = None) -> str | None:
    """The cache dir to use, or None when none is writable (kernels then compile uncached)."""
    given = environ.get("NUMBA_CACHE_DIR")
    # Used as given when this uid may write there; an inherited one it may not (a parent of
    # another uid exported its own) falls through to this uid's own choices.
    if given and _writable_dir(Path(given)):
        return given
    key = installed_key() if key is None else key
    for candidate in candidate_dirs(environ, key):
        if _writable_dir(candidate):
            return str(candidate)
    return None


def ensure_cache_dir(environ=os.environ) -> str | None:
    """Point numba at the chosen cache dir (its environment and, if already imported, its
    live config); return it, or None after one warning when kernels must run uncached."""
    chosen = choose_cache_dir(environ)
    if chosen is None:
        tried = ", ".join(str(p) for p in candidate_dirs(environ, installed_key())) or "no absolute candidate"
        log.warning("no writable cache directory for numba kernels (tried %s): compiling them uncached", tried)
        return None
    environ["NUMBA_CACHE_DIR"] = chosen
    numba_config = sys.modules.get("numba.core.config")
    if numba_config is not None:
        # numba already read its environment; its cache locator reads this at decoration.
        numba_config.CACHE_DIR = chosen
    return chosen
