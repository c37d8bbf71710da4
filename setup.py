"""Build glue: setuptools needs a setup() call to run cffi's out-of-line builder.

All metadata lives in pyproject.toml; this only registers the C extension that
native/build_native.py describes, so it is compiled at install time.
"""
from setuptools import setup

setup(cffi_modules=["native/build_native.py:ffibuilder"])
