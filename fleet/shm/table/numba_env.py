"""Choose a writable numba cache directory before numba is imported.

numba caches compiled kernels in ``__pycache__`` beside the source. On a read-only
install (a system package, a hardened service with ProtectSystem=strict) it falls
back to ``$XDG_CACHE_HOME/numba``, and if that is not writable either the import of a
``cache=True`` function fails outright. A service must never fail for want of a
cache, so this picks, in order: an explicit ``NUMBA_CACHE_DIR``; the package's own
folder when writable; ``$XDG_CACHE_HOME/fleet/numba`` (or ``~/.cache/...``); a
per-user folder under the temp dir.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def _writable_dir(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


def choose_cache_dir(environ=os.environ, package_dir: Path = _PACKAGE_DIR) -> str | None:
    """The cache dir to use, or None to let numba cache beside the source."""
    if environ.get("NUMBA_CACHE_DIR"):
        return environ["NUMBA_CACHE_DIR"]
    if _writable_dir(package_dir / "__pycache__"):
        return None
    xdg = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    candidates = [Path(xdg) / "fleet" / "numba", Path(tempfile.gettempdir()) / f"fleet-numba-{os.getuid()}"]
    for candidate in candidates:
        if _writable_dir(candidate):
            return str(candidate)
    return None  # nothing writable: numba will say so when it compiles


def ensure_cache_dir(environ=os.environ) -> str | None:
    """Set NUMBA_CACHE_DIR (and numba's live config, if numba is loaded) as needed."""
    chosen = choose_cache_dir(environ)
    if chosen is not None and not environ.get("NUMBA_CACHE_DIR"):
        environ["NUMBA_CACHE_DIR"] = chosen
    numba_config = sys.modules.get("numba.core.config")
    if chosen is not None and numba_config is not None:
        # numba already read its environment; its cache locator reads this at decoration.
        numba_config.CACHE_DIR = chosen
    return chosen
