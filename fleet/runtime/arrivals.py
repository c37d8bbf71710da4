"""The arrival log: what a fleet configured with ``[record] enabled = true`` writes, and
`fleet-burst record` turns into a trace (`fleet.burst.record`).

The design is a file, not a protocol. The fleet appends one JSON line per accepted unit to
its arrival log (``[record] path``, by default ``<runtime dir>/<name>.arrivals.jsonl``, next
to its control socket; mode 0600)::

    {"wall": <UTC epoch s>, "unit": <unit id>, "role": ..., "lane": ..., "key": ..., "io": <bool>}

plus the work shape the payload declares when the fleet holds the payload itself (an
embedded `Fleet`: a dict payload's ``route``, ``cpu_ms``, ``latency_s``, ``severity``,
``parent``, ``after`` keys, the names the replay's own handlers take). A unit submitted to
fleetd by a client arrives pickled and is never unpickled by the supervisor, so for the
shape the log has a second kind of line, written when a worker reports the unit's end::

    {"done": <unit id>, "wall": <UTC epoch s>, "run_s": <handler seconds>, "cpu_s": <its CPU seconds>,
     "outcome": "solved" | ...}

``run_s`` is the handler's run time as its worker measured it, ``cpu_s`` the CPU time of
the thread that ran it meanwhile (absent for an ``async def`` handler, whose thread runs
other units between its awaits; threads the handler starts are not counted). Each line is
one ``write`` to an ``O_APPEND`` file, so concurrent lines never interleave and a reader
never sees half a line it cannot tell from a whole one.
"""
from __future__ import annotations

import json
import os
import threading
import time

from fleet.host.rundir import runtime_dir

SHAPE_KEYS = ("route", "cpu_ms", "wait_ms", "latency_s", "severity", "parent", "after")


def default_path(name: str) -> str:
    """The arrival log of fleet `name` when ``[record] path`` is not given."""
    return str(runtime_dir() / f"{name}.arrivals.jsonl")


class ArrivalLog:
    """The fleet side: one JSON line per accepted unit and one per unit a worker ended, appended
    (thread-safe: one write per line). `io_roles`: the names of the fleet's I/O-bound roles."""

    def __init__(self, path: str, io_roles=()):
        self.path = path
        self.io_roles = frozenset(io_roles)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._lock = threading.Lock()

    @classmethod
    def for_config(cls, config) -> "ArrivalLog | None":
        """The log a fleet's ``[record]`` section asks for, or None when recording is off."""
        if not config.record.enabled:
            return None
        return cls(config.record.path or default_path(config.name),
                   io_roles=(r.name for r in config.roles if r.io_bound))

    def arrival(self, unit_id: int, role: str, payload, key, lane) -> None:
        line = {"wall": time.time(), "unit": unit_id, "role": role, "lane": lane,
                "key": None if key is None else str(key), "io": role in self.io_roles}
        if isinstance(payload, dict):
            for name in SHAPE_KEYS:
                if name in payload:
                    line[name] = payload[name]
        self._write(line)

    def completion(self, unit_id: int, run_s: float, outcome: str, cpu_s: float | None = None) -> None:
        """A worker reported unit `unit_id`'s end: its handler ran `run_s` seconds, `cpu_s` of them
        on a CPU (None or NaN: not measured)."""
        line = {"done": unit_id, "wall": time.time(), "run_s": float(run_s), "outcome": outcome}
        if cpu_s is not None and cpu_s == cpu_s:
            line["cpu_s"] = float(cpu_s)
        self._write(line)

    def _write(self, line: dict) -> None:
        try:
            data = (json.dumps(line, default=str) + "\n").encode()
        except (TypeError, ValueError):
            return
        with self._lock:
            if self._fd >= 0:
                os.write(self._fd, data)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
