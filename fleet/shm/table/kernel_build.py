"""The transition kernels built ahead, at install: numba's AOT compiler (numba.pycc) over
the very functions `kernels` compiles at run time, into the extension module
``fleet.shm.table._kernels``.

Loading numba costs a process ~0.5 s and ~145 MiB of its own (numba and llvmlite
+84 MiB, the kernels' compiled code +61 MiB); the supervisor and the fork server each
paid it at every boot. The module built here holds the same kernels as plain machine
code (~0.6 MB, no numba, no LLVM): the runtime loads it through `kernel_load`.

One source of truth: each kernel is exported from its njit dispatcher's ``py_func``,
so the ahead-built and the run-time kernels are one function compiled twice, with the
same embedded tables (`kernel_tables`). The build also exports `build_digest`, the
`kernel_tables.build_digest()` it was built from, which the loader compares before
trusting it.

Only setup.py imports this module (numba is a build requirement). The ahead-built
functions take exactly the argument types of `SIGNATURES` and do not check them (an
int64 array where uint64 is declared is reinterpreted, an array.array is undefined
behaviour): `fleet.shm.table.table.SlotTable` is their one caller, and passes nothing
else.
"""
from __future__ import annotations

import os
import tempfile

from fleet.shm.table import kernel_tables

#: The extension module's name (a sibling of this file).
MODULE = "_kernels"

_ARRAY = "uint64[::1]"  # a table region: a C-contiguous uint64 view of the segment
_TABLE = f"{_ARRAY}, {_ARRAY}, int64, {_ARRAY}"  # slots, roles, n_roles, posture

#: Every exported kernel and its one signature: the types SlotTable passes (numba's
#: run-time kernels are warmed up with the same, `kernels.warm_up`).
SIGNATURES = {
    "apply_transition": f"int64({_TABLE}, int64, int64, int64, int64, int64)",
    "apply_batch": f"int64({_TABLE}, int64[::1], int64[::1])",
    "start_unit": f"int64({_TABLE}, int64, int64, int64, int64, int64)",
    "finish_unit": f"int64({_TABLE}, int64, int64, int64)",
    "seq_write": f"boolean({_ARRAY}, int64, int64[::1], {_ARRAY})",
    "add_field": f"uint64({_ARRAY}, int64, uint64)",
    "store_field": f"boolean({_ARRAY}, int64, uint64)",
}


def build(output_path: str) -> str:
    """Compile every kernel of SIGNATURES, and `build_digest`, into the extension module
    at `output_path` (a full file name, e.g. build_ext's ``get_ext_fullpath``)."""
    with tempfile.TemporaryDirectory(prefix="fleet-kernels-") as scratch:
        # numba compiles the kernels a kernel calls through its run-time path first: their
        # cache goes to a folder of the build's own, never the building user's cache.
        before = os.environ.get("NUMBA_CACHE_DIR")
        os.environ["NUMBA_CACHE_DIR"] = scratch
        try:
            _compile(output_path)
        finally:
            if before is None:
                os.environ.pop("NUMBA_CACHE_DIR", None)
            else:
                os.environ["NUMBA_CACHE_DIR"] = before
    return output_path


def _compile(output_path: str) -> None:
    from numba.pycc import CC

    from fleet.shm.table import kernels

    cc = CC(MODULE, source_module=kernels)
    cc.output_dir, cc.output_file = os.path.split(os.path.abspath(output_path))
    cc.use_nrt = False  # as the run-time kernels (_nrt=False): no reference counting between them
    for name, signature in SIGNATURES.items():
        cc.export(name, signature)(getattr(kernels, name).py_func)
    digest = kernel_tables.build_digest()

    def build_digest():
        return digest

    cc.export("build_digest", "int64()")(build_digest)
    cc.compile()
