"""Which transition kernels a process runs: the ones built at install, or numba's.

The ahead-built module (``fleet.shm.table._kernels``, see `kernel_build`) costs an
import of ~0.6 MB of machine code: no numba, no LLVM. It is taken only when it was
built from this very tree: its `build_digest` must equal `kernel_tables.build_digest()`
(the embedded tables and the kernels' sources), so an edit of fsm.py in an editable
install never runs the old rules. Otherwise — the module missing (an install that
could not build it), stale, or unloadable (built against another numpy) — the kernels
compile with numba at run time, from numba's on-disk cache when warm (`kernels`), and
one WARNING says why and what it costs.

``FLEET_KERNELS=jit`` in the environment asks for numba's kernels whatever is built
(to compare the two, or to rule the build out).
"""
from __future__ import annotations

import importlib
import logging
import os

from fleet.shm.table import kernel_tables

log = logging.getLogger(__name__)

BUILT = "fleet.shm.table._kernels"
_loaded = None


def built_module():
    """The ahead-built kernels when they are current; else (None, why)."""
    try:
        module = importlib.import_module(BUILT)
    except Exception as exc:  # noqa: BLE001 - missing, or its init failed (numpy's C API refused it): numba's then
        return None, f"{BUILT} cannot be imported ({type(exc).__name__}: {exc})"
    want = kernel_tables.build_digest()
    if module.build_digest() != want:
        return None, f"{BUILT} was built from other kernel sources or tables than these (a stale build)"
    return module, None


def load():
    """The kernels this process runs (a module with apply_transition, apply_batch,
    start_unit, finish_unit, seq_write, add_field and store_field); chosen once."""
    global _loaded
    if _loaded is None:
        module, why = (None, "FLEET_KERNELS=jit") if os.environ.get("FLEET_KERNELS") == "jit" else built_module()
        if module is None:
            from fleet.shm.table import kernels as module

            if why != "FLEET_KERNELS=jit":
                log.warning("transition kernels: %s; compiling them with numba at run time instead (~0.5 s "
                            "and ~145 MiB more in each fleet process; reinstall fleet to build them)", why)
        _loaded = module
    return _loaded


def is_built(module) -> bool:
    """Whether `module` (from `load`) is the ahead-built one."""
    return module.__name__ == BUILT
