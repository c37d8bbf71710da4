"""A segment's header: named fixed-size fields at fixed offsets, read and written in place.

A header is declared as ((name, struct code), ...), little-endian and packed, with
padding named ``_...``. `HeaderLayout` turns that into offsets once; its `view(buf)` reads
``h["n_slots"]`` as an int (bytes for an ``Ns`` field) and writes ``h["flags"] = 1``
through to the mapping. No numpy: a status reader and a worker need none to read one.
"""
from __future__ import annotations

import struct


class HeaderLayout:
    """The fields of one kind of header, with their offsets (padding skipped)."""

    def __init__(self, fields: tuple[tuple[str, str], ...], size: int):
        self.at: dict[str, tuple[int, struct.Struct]] = {}
        off = 0
        for name, code in fields:
            st = struct.Struct("<" + code)
            if not name.startswith("_"):
                self.at[name] = (off, st)
            off += st.size
        if off > size:
            raise ValueError(f"header fields take {off} bytes, more than the header's {size}")

    def offset(self, name: str) -> int:
        return self.at[name][0]

    def size(self, name: str) -> int:
        return self.at[name][1].size

    def view(self, buf) -> "HeaderView":
        return HeaderView(buf, self.at)


class HeaderView:
    """A header's fields, in place in `buf` (a mapping)."""

    __slots__ = ("_buf", "_at")

    def __init__(self, buf, at: dict):
        self._buf, self._at = buf, at

    def __getitem__(self, name):
        off, st = self._at[name]
        return st.unpack_from(self._buf, off)[0]

    def __setitem__(self, name, value):
        off, st = self._at[name]
        st.pack_into(self._buf, off, value)

    def fields(self) -> tuple[str, ...]:
        return tuple(self._at)
