"""Recording arrivals: the fleet's arrival log, and `fleet-burst record`, which turns it into a trace.

The design is a file, not a protocol. A fleet configured with ``[record] enabled = true``
appends one JSON line per accepted unit to its arrival log (``[record] path``, by default
``<runtime dir>/<name>.arrivals.jsonl``, next to its control socket; mode 0600):
``{"wall": <UTC epoch s>, "unit": <unit id>, "role": ..., "lane": ..., "key": ...}``,
plus the work shape when the fleet holds the payload itself (an embedded `Fleet`: a dict
payload's ``route``, ``cpu_ms``, ``latency_s``, ``severity``, ``parent``, ``after`` keys,
the names the replay's own handlers take). A unit submitted to fleetd by a client arrives
pickled and is never unpickled by the supervisor, so its shape is unknown: the trace
replays it as a zero-CPU unit of its role. Each line is one ``write`` to an ``O_APPEND``
file, so concurrent lines never interleave and a reader never sees half a line it
cannot tell from a whole one (an incomplete last line is left for the next read).

`fleet-burst record --name FLEET -o TRACE` checks that fleet runs (its control socket
answers), starts reading the log at its current end, and writes what arrives from then
on as a trace (header: the fleet's name, the first arrival's instant as ``start``, one
default pool per route seen) when it stops: after ``--duration``, ``--count``, when fleetd
stops, or on Ctrl-C.
"""
from __future__ import annotations

import json
import os
import threading
import time

from .trace import FORMAT, VERSION

SHAPE_KEYS = ("route", "cpu_ms", "latency_s", "severity", "parent", "after")
POLL_S = 0.05


class NoRecording(Exception):
    """No fleet of that name runs, or it does not write an arrival log."""


def default_path(name: str) -> str:
    """The arrival log of fleet `name` when ``[record] path`` is not given."""
    from fleet.control.paths import runtime_dir

    return str(runtime_dir() / f"{name}.arrivals.jsonl")


class ArrivalLog:
    """The fleet side: one JSON line per accepted unit, appended (thread-safe: one write per line)."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._lock = threading.Lock()

    def arrival(self, unit_id: int, role: str, payload, key, lane) -> None:
        line = {"wall": time.time(), "unit": unit_id, "role": role, "lane": lane,
                "key": None if key is None else str(key)}
        if isinstance(payload, dict):
            for name in SHAPE_KEYS:
                if name in payload:
                    line[name] = payload[name]
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


def _running(name: str) -> bool:
    import fleet

    try:
        client = fleet.connect(name)
    except fleet.FleetError:
        return False
    client.close()
    return True


def to_trace(name: str, lines: list[dict]) -> tuple[dict, list[dict]]:
    """A trace (header dict, arrival dicts) from arrival-log lines."""
    from datetime import datetime, timezone

    start = min((x["wall"] for x in lines), default=time.time())
    pools = {}
    arrivals = []
    for i, x in enumerate(lines):
        route = x.get("route")
        if isinstance(route, dict) and route.get("model") and route.get("provider"):
            pools.setdefault(f"{route['model']}@{route['provider']}",
                             {"model": route["model"], "provider": route["provider"], "k": 12})
        else:
            route = None
        cpu = x.get("cpu_ms")
        arrivals.append({"t": round(x["wall"] - start, 6), "id": f"u{x.get('unit', i)}", "role": x["role"],
                         "lane": x.get("lane"), "route": route, "severity": x.get("severity"),
                         "parent": None, "key": x.get("key"), "after": [],
                         "cpu_ms": float(cpu) if isinstance(cpu, (int, float)) and cpu >= 0 else 0.0,
                         "latency_s": x.get("latency_s"), "cycle": None})
    header = {"format": FORMAT, "version": VERSION, "name": f"recorded-{name}",
              "start": datetime.fromtimestamp(start, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
              "speed": 1, "modes": ["none", "cap"] if not pools else ["none", "cap", "admission"],
              "pools": list(pools.values())}
    return header, arrivals


def capture(name: str, output: str, *, source: str | None = None, duration: float | None = None,
            count: int | None = None, on_ready=None) -> int:
    """Tail fleet `name`'s arrival log from now until a stop condition; write the trace; returns arrivals.

    `on_ready` (optional) is called once reading has started at the log's end.
    """
    from fleet.names import InvalidFleetName, validate_fleet_name

    try:
        validate_fleet_name(name)
    except InvalidFleetName as exc:
        raise NoRecording(str(exc)) from None
    if not _running(name):
        raise NoRecording(f"no fleet named {name!r} is running (its control socket does not answer)")
    path = source or default_path(name)
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise NoRecording(f"fleet {name!r} writes no arrival log at {path} ({exc.strerror}); "
                          "start it with [record] enabled = true") from None
    lines: list[dict] = []
    deadline = None if duration is None else time.monotonic() + duration
    last_check = time.monotonic()
    with f:
        f.seek(0, os.SEEK_END)
        if on_ready is not None:
            on_ready(path)
        buf = b""
        try:
            while True:
                chunk = f.read()
                if chunk:
                    buf += chunk
                    *whole, buf = buf.split(b"\n")
                    for raw in whole:
                        try:
                            lines.append(json.loads(raw))
                        except ValueError:
                            continue
                if count is not None and len(lines) >= count:
                    lines = lines[:count]
                    break
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    break
                if now - last_check > 1.0:
                    last_check = now
                    if not _running(name):
                        break
                if not chunk:
                    time.sleep(POLL_S)
        except KeyboardInterrupt:
            pass
    header, arrivals = to_trace(name, lines)
    with open(output, "w", encoding="utf-8") as out:
        out.write(json.dumps(header, sort_keys=True) + "\n")
        for a in arrivals:
            out.write(json.dumps(a, sort_keys=True) + "\n")
    return len(arrivals)
