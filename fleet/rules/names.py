"""The fleet-name rule: the one place that says what a fleet may be called.

A fleet's name becomes a file name (its control socket ``<name>.sock``), a systemd
instance name (``fleetd@<name>``) and part of its shared-memory segment names. The
rule: 1 to 63 characters of ASCII letters, digits, ``_`` and ``-``, starting with a
letter or digit. The whole string must match (``fullmatch``: a trailing newline is
not "the end of the name").

No ``.``: that is what keeps one fleet's segments apart from another's. Every
segment of fleet ``N`` is named ``/fleet.N`` (the table) or ``/fleet.N.<kind>``
(``fleet/shm/segments.py``), so the fleet name is everything between the first dot and the
next one. If names could hold a dot, a fleet named ``qa6.data`` would have the table
segment ``/fleet.qa6.data`` -- the data segment of the live fleet ``qa6``.

Everything that takes a fleet name checks it here: the config (``[fleet] name``),
the shared-memory segments (table and data plane), and the control socket paths
(``fleet.service.control`` re-exports `validate_fleet_name` and `InvalidFleetName`).

Pure: no I/O, nothing but ``re``.
"""
from __future__ import annotations

import re

from fleet.rules.errors import EXIT_USAGE, FleetError

#: Longest fleet name. A segment name is ``/fleet.<name>.<kind>``, and
#: ``fleetd@<name>.service`` and ``<runtime dir>/<name>.sock`` stay well inside
#: the limits of systemd unit names and of AF_UNIX paths (107 bytes).
MAX_LENGTH = 63
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,%d}" % (MAX_LENGTH - 1))
#: The rule in words, for error messages and help text.
RULE = f"1-{MAX_LENGTH} ASCII letters, digits, '_' or '-', starting with a letter or digit (no '.')"


class InvalidFleetName(FleetError, ValueError):
    """A fleet name that breaks the rule (see `RULE`); the message says how."""

    exit_code = EXIT_USAGE


def validate_fleet_name(name: object) -> str:
    """Return ``name`` if it is a valid fleet name, else raise InvalidFleetName saying why."""
    if not isinstance(name, str):
        raise InvalidFleetName(f"fleet name must be a string, got {type(name).__name__}")
    if _NAME.fullmatch(name) is None:
        raise InvalidFleetName(f"fleet name {name!r} is not valid: use {RULE}")
    return name
