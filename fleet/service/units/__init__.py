"""The systemd units fleet ships, and rendering them for this install (`fleetd --print-unit`).

The unit files here are the shipped ones (the repository's ``systemd/`` links to them):
their ``ExecStart`` names ``/usr/local/bin/fleetd``, where ``pip install`` puts the
script for the system Python. Installed anywhere else (a venv, ``pip install --user``)
that path is wrong, so `render` writes the unit with the command that started this
fleetd instead.
"""
from __future__ import annotations

import os
import shutil
import sys
from importlib import resources

#: The units, by file name; fleetd@.service (one instance per fleet) is the default.
UNIT_NAMES = ("fleetd@.service", "fleetd.service")
#: The fleetd the shipped units name in ExecStart.
SHIPPED_FLEETD = "/usr/local/bin/fleetd"


class UnitNotShipped(ValueError):
    """A unit name that is not one of `UNIT_NAMES`."""


def shipped(name: str) -> str:
    """The text of shipped unit ``name``."""
    if name not in UNIT_NAMES:
        raise UnitNotShipped(f"no unit {name!r}; fleet ships {', '.join(UNIT_NAMES)}")
    return resources.files(__package__).joinpath(name).read_text()


def this_fleetd(argv0: str | None = None, executable: str | None = None) -> list[str]:
    """The command that runs this install's fleetd: the ``fleetd`` script that is running
    (absolute), else this interpreter with ``-m fleet.cli.fleetd``."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    executable = sys.executable if executable is None else executable
    if os.path.basename(argv0) == "fleetd":
        found = argv0 if os.sep in argv0 else shutil.which(argv0)
        if found and os.path.isfile(found):
            return [os.path.abspath(found)]
    return [os.path.abspath(executable), "-m", "fleet.cli.fleetd"]


def exec_word(word: str) -> str:
    """One ExecStart word as systemd reads it: ``%`` doubled (a specifier otherwise),
    quoted when it holds whitespace, a quote or a backslash."""
    word = word.replace("%", "%%")
    if any(c.isspace() or c in "\"'\\" for c in word):
        word = '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return word


#: The first line of the shipped units' header paragraph on where ExecStart points; `render`
#: replaces the paragraph (up to the next bare ``#`` line) with one about the command it wrote.
SHIPPED_NOTE = "# ExecStart names " + SHIPPED_FLEETD


def render(text: str, command: list[str]) -> str:
    """Unit ``text`` with each ExecStart's shipped fleetd replaced by ``command``, and the
    header's note on the shipped path replaced by one naming ``command``."""
    prefix = "ExecStart=" + SHIPPED_FLEETD + " "
    written = " ".join(exec_word(w) for w in command)
    lines = text.splitlines(keepends=True)
    if not any(line.startswith(prefix) for line in lines):
        raise ValueError(f"the unit has no ExecStart naming {SHIPPED_FLEETD}")
    out, in_note = [], False
    for line in lines:
        if line.startswith(SHIPPED_NOTE):
            in_note = True
            out.append(f"# Written by `fleetd --print-unit` for the install it ran from: ExecStart names\n"
                       f"# {written}\n")
        elif in_note and line.rstrip("\n") != "#":
            continue  # the rest of the shipped note
        else:
            in_note = False
            out.append("ExecStart=" + written + " " + line[len(prefix):] if line.startswith(prefix) else line)
    return "".join(out)
