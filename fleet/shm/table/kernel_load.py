"""Which transition kernels a process runs: the ones built at install, or numba's.

Either way they are C entry points (`kernel_entry`), which `fleet._table` calls through
their addresses over a mapped table; this module chooses whose addresses.

The ahead-built module (``fleet.shm.table._kernels``, see `kernel_build`) costs an
import of ~60 KB of machine code: no numba, no LLVM, no numpy. It is taken only when it
was built from this very tree: its `build_digest` must equal
`kernel_tables.build_digest()` (the embedded tables and the kernels' sources), so an edit
of fsm.py in an editable install never runs the old rules. Otherwise — the module
missing (an install that could not build it), stale, or unloadable — the entry points
compile with numba at run time, from numba's on-disk cache when warm, and one WARNING
says why and what it costs.

``FLEET_KERNELS=jit`` in the environment asks for numba's kernels whatever is built
(to compare the two, or to rule the build out).
"""
from __future__ import annotations

import importlib
import logging
import os

from admission.records import record
from fleet.shm.table import kernel_tables

log = logging.getLogger(__name__)

BUILT = "fleet.shm.table._kernels"
#: numba's run-time build of the same entry points.
JIT = "fleet.shm.table.kernel_entry"
#: The entry points, in the order `fleet._table.Calls` takes their addresses.
NAMES = ("apply_transition", "apply_batch", "start_unit", "finish_unit", "seq_write", "add_field", "store_field")
_loaded = None


@record
class Kernels:
    """A build of the kernels: where it came from, and its entry points' addresses."""

    name: str  # BUILT or JIT
    addresses: tuple[int, ...]  # in NAMES order

    @property
    def built(self) -> bool:
        """Whether these are the kernels built at install."""
        return self.name == BUILT


def built_module():
    """The ahead-built kernels' module when it is current; else (None, why)."""
    try:
        module = importlib.import_module(BUILT)
    except Exception as exc:  # noqa: BLE001 - missing, or its machine code would not load: numba's then
        return None, f"{BUILT} cannot be imported ({type(exc).__name__}: {exc})"
    want = kernel_tables.build_digest()
    if module.build_digest() != want:
        return None, f"{BUILT} was built from other kernel sources or tables than these (a stale build)"
    return module, None


def built_kernels(module) -> Kernels:
    """The kernels of an imported ahead-built module (current or not: `built_module` checks)."""
    found = module.addresses()
    return Kernels(BUILT, tuple(found[name] for name in NAMES))


def jit_kernels() -> Kernels:
    """numba's build: compiles the entry points, or loads them from numba's cache (~0.5 s
    and ~145 MiB: numba, LLVM and numpy in this process)."""
    entry = importlib.import_module(JIT)
    return Kernels(JIT, entry.addresses())


def load() -> Kernels:
    """The kernels this process runs; chosen once."""
    global _loaded
    if _loaded is None:
        module, why = (None, "FLEET_KERNELS=jit") if os.environ.get("FLEET_KERNELS") == "jit" else built_module()
        if module is None:
            if why != "FLEET_KERNELS=jit":
                log.warning("transition kernels: %s; compiling them with numba at run time instead (~0.5 s "
                            "and ~145 MiB more in each fleet process; reinstall fleet to build them)", why)
            _loaded = jit_kernels()
        else:
            _loaded = built_kernels(module)
    return _loaded

