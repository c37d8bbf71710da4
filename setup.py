"""Build glue: setuptools needs a setup() call to run cffi's out-of-line builder.

All metadata lives in pyproject.toml; this only registers the compiled modules, so they
are built at install time: fleet._native (cffi, described by native/build_native.py:
atomics, futex, rings), fleet._rings (a CPython extension: the rings' non-blocking calls
with the GIL held, over the same ring code), fleet._chunk (a CPython extension: a chunk's
items run through their handler in one C loop) and fleet.shm.table._kernels (the slot
table's transition kernels, compiled ahead by numba: fleet/shm/table/kernel_build.py).
"""
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_C = ["-O2", "-std=gnu11"]
KERNELS = "fleet.shm.table._kernels"


class BuildExt(build_ext):
    """setuptools' build_ext, with the kernels' module built by numba's AOT compiler
    (numba is a build requirement) into wherever build_ext puts a module: the build
    folder for a wheel, the tree for an editable install."""

    def build_extension(self, ext):
        if ext.name != KERNELS:
            return super().build_extension(ext)
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, here)  # the tree's fleet, whose kernels these are
        try:
            from fleet.shm.table import kernel_build

            target = self.get_ext_fullpath(ext.name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            kernel_build.build(target)
        finally:
            sys.path.remove(here)


setup(
    cffi_modules=["native/build_native.py:ffibuilder"],
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension("fleet._chunk", ["native/fleet_chunk.c"], extra_compile_args=_C),
        # Hidden visibility: the ring functions it carries stay private to it (only its
        # PyInit is exported), whatever else the process loads.
        Extension("fleet._rings", ["native/fleet_rings.c", "native/fleet_native.c"], include_dirs=["native"],
                  extra_compile_args=[*_C, "-fvisibility=hidden"], libraries=["pthread"]),
        # Sources: fleet/shm/table/kernels.py, compiled by BuildExt (none for the C compiler).
        Extension(KERNELS, sources=[]),
    ],
)
