"""The transition kernels built ahead, at install: numba compiles their C entry points
(`kernel_entry`) to machine code, linked into the extension module
``fleet.shm.table._kernels`` with native/fleet_kernels.c, which gives their addresses.

Loading numba costs a process ~0.5 s and ~145 MiB of its own (numba and llvmlite
+84 MiB, the kernels' compiled code +61 MiB), and numpy (which numba's own ahead-of-time
modules need, and the kernels' array arguments) ~0.1 s more: the supervisor and the fork
server each paid both at every boot. The module built here holds the same kernels as
plain machine code, called through C pointers: a process that runs them loads neither.

One source of truth: the object code is numba's own compilation of the very entry points
a process compiles at run time when this build is missing or stale (`kernel_entry`), with
the same embedded tables (`kernel_tables`). The build also records
`kernel_tables.build_digest()`, which the loader compares before trusting it.

The machine code is numba's for this host's CPU, as at run time: the module is built
where it is installed (setup.py's build_ext), like any C extension built from source.

Only setup.py imports this module (numba is a build requirement).
"""
from __future__ import annotations

import os
import tempfile

from fleet.shm.table import kernel_tables

#: The extension module's name (a sibling of this file).
MODULE = "_kernels"
#: The C name of each entry point in the object code (native/fleet_kernels.c declares them).
SYMBOL = "fleet_kernel_{}"
#: What the object code may leave to the process: the Python C API, and the few helpers of
#: numba's that the entry points' error path names (native/fleet_kernels.c defines them).
_HELPERS = {"NRT_Free", "NRT_MemInfo_call_dtor", "numba_do_raise", "numba_gil_ensure", "numba_gil_release",
            "numba_runtime_build_excinfo_struct", "numba_unpickle"}


def build_object(output_path: str) -> int:
    """Compile every entry point of `kernel_entry` into one object file at `output_path`
    (its functions named by `SYMBOL`); returns the `kernel_tables.build_digest()` built from."""
    with tempfile.TemporaryDirectory(prefix="fleet-kernels-") as scratch:
        # numba compiles through its run-time path: its cache goes to a folder of the
        # build's own, never the building user's cache (and no cached code is reused).
        before = os.environ.get("NUMBA_CACHE_DIR")
        os.environ["NUMBA_CACHE_DIR"] = scratch
        try:
            return _compile(output_path)
        finally:
            if before is None:
                os.environ.pop("NUMBA_CACHE_DIR", None)
            else:
                os.environ["NUMBA_CACHE_DIR"] = before


def _compile(output_path: str) -> int:
    import llvmlite.binding as llvm

    from fleet.shm.table import kernel_entry

    linked = None
    for name in kernel_entry.NAMES:
        entry = kernel_entry.ENTRY_POINTS[name]
        # A copy of the entry point's whole module (the kernels it calls inlined), its C
        # wrapper renamed to a C identifier (numba names it "cfunc.<mangled>").
        module = llvm.parse_assembly(str(entry._library._final_module))
        module.get_function(entry.native_name).name = SYMBOL.format(name)
        if linked is None:
            linked = module
        else:
            linked.link_in(module)
    linked.verify()
    target = llvm.Target.from_default_triple()
    machine = target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                           opt=3, reloc="pic", codemodel="default")
    with open(output_path, "wb") as out:
        out.write(machine.emit_object(linked))
    undefined = {fn.name for fn in linked.functions if fn.is_declaration and not fn.name.startswith("llvm.")}
    unknown = sorted(n for n in undefined - _HELPERS if not n.startswith(("Py", "_Py")))
    if unknown:
        raise RuntimeError(f"the kernels' object code needs {', '.join(unknown)}, which native/fleet_kernels.c "
                           "does not define: numba's code generation changed; the kernels will compile at run time")
    return kernel_tables.build_digest()
