"""cffi out-of-line (API mode) builder for the extension module fleet._native.

setuptools runs it at install time through `cffi_modules` in setup.py; nothing is
compiled at import time.
"""
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

ffibuilder = FFI()
# The header is the single declaration of the C surface: cffi parses it for the
# Python binding and the C compiler includes it, so the two cannot drift.
ffibuilder.cdef((HERE / "fleet_native.h").read_text())
ffibuilder.set_source(
    "fleet._native",
    "#include <stddef.h>\n#include <stdint.h>\n#include \"fleet_native.h\"\n",
    sources=["native/fleet_native.c"],
    include_dirs=["native"],
    extra_compile_args=["-O2", "-std=gnu11"],
    libraries=["pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
