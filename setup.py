"""Build glue: setuptools needs a setup() call to run cffi's out-of-line builder.

All metadata lives in pyproject.toml; this only registers the compiled modules, so they
are built at install time: fleet._native (cffi, described by native/build_native.py:
atomics, futex, rings), fleet._rings (a CPython extension: the rings' non-blocking calls
with the GIL held, over the same ring code), fleet._chunk (a CPython extension: a chunk's
items run through their handler in one C loop), fleet._codec (a CPython extension: the look
for large `bytes` a payload gets before it is pickled), fleet._table (a CPython extension: the
transition kernels' calls over a mapped table, with the GIL held) and
fleet.shm.table._kernels (the slot table's transition kernels, compiled ahead by numba:
fleet/shm/table/kernel_build.py, linked with native/fleet_kernels.c).
"""
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_C = ["-O2", "-std=gnu11"]
KERNELS = "fleet.shm.table._kernels"


class BuildExt(build_ext):
    """setuptools' build_ext, with the kernels' object code compiled by numba first (numba
    is a build requirement) and linked into their module like any other object."""

    def build_extension(self, ext):
        if ext.name != KERNELS:
            return super().build_extension(ext)
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, here)  # the tree's fleet, whose kernels these are
        try:
            from fleet.shm.table import kernel_build

            os.makedirs(self.build_temp, exist_ok=True)
            obj = os.path.join(self.build_temp, "fleet_kernels_numba.o")
            digest = kernel_build.build_object(obj)
        finally:
            sys.path.remove(here)
        ext.extra_objects = [obj]
        ext.define_macros = [("FLEET_KERNELS_DIGEST", f"{digest}LL")]
        return super().build_extension(ext)


setup(
    cffi_modules=["native/build_native.py:ffibuilder"],
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension("fleet._chunk", ["native/fleet_chunk.c"], extra_compile_args=_C),
        Extension("fleet._codec", ["native/fleet_codec.c"], extra_compile_args=_C),
        # Hidden visibility: the ring functions it carries stay private to it (only its
        # PyInit is exported), whatever else the process loads.
        Extension("fleet._rings", ["native/fleet_rings.c", "native/fleet_native.c"], include_dirs=["native"],
                  extra_compile_args=[*_C, "-fvisibility=hidden"], libraries=["pthread"]),
        Extension("fleet._table", ["native/fleet_table.c"], extra_compile_args=_C),
        # With the object code BuildExt has numba compile from fleet/shm/table/kernel_entry.py.
        Extension(KERNELS, ["native/fleet_kernels.c"], extra_compile_args=_C),
    ],
)
