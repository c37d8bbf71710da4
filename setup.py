"""Build glue: setuptools needs a setup() call to run cffi's out-of-line builder.

All metadata lives in pyproject.toml; this only registers the C extensions, so they
are compiled at install time: fleet._native (cffi, described by
native/build_native.py: atomics, futex, rings), fleet._rings (a CPython extension: the
rings' non-blocking calls with the GIL held, over the same ring code) and fleet._chunk
(a CPython extension: a chunk's items run through their handler in one C loop).
"""
from setuptools import Extension, setup

_C = ["-O2", "-std=gnu11"]

setup(
    cffi_modules=["native/build_native.py:ffibuilder"],
    ext_modules=[
        Extension("fleet._chunk", ["native/fleet_chunk.c"], extra_compile_args=_C),
        # Hidden visibility: the ring functions it carries stay private to it (only its
        # PyInit is exported), whatever else the process loads.
        Extension("fleet._rings", ["native/fleet_rings.c", "native/fleet_native.c"], include_dirs=["native"],
                  extra_compile_args=[*_C, "-fvisibility=hidden"], libraries=["pthread"]),
    ],
)
