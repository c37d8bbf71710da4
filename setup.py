"""Build glue: setuptools needs a setup() call to run cffi's out-of-line builder.

All metadata lives in pyproject.toml; this only registers the two C extensions, so
they are compiled at install time: fleet._native (cffi, described by
native/build_native.py: atomics, futex, rings) and fleet._chunk (a CPython extension:
a chunk's items run through their handler in one C loop).
"""
from setuptools import Extension, setup

setup(
    cffi_modules=["native/build_native.py:ffibuilder"],
    ext_modules=[Extension("fleet._chunk", ["native/fleet_chunk.c"], extra_compile_args=["-O2", "-std=gnu11"])],
)
