"""`fleet-burst record`: a fleet's arrival log (`fleet.runtime.arrivals`, which describes its
lines) turned into a trace.

`fleet-burst record` joins a unit's arrival line and its ``done`` line by unit id: a unit of
a CPU role replays with ``cpu_ms`` = its measured CPU time and ``wait_ms`` = the rest of its
run time (sleeping, blocked, waiting for a core), so a handler that sleeps 200 ms is not
replayed as 200 ms of CPU; without a ``cpu_s`` its whole run time is its ``cpu_ms``. A
provider round of an I/O role (``io``: true) replays with ``latency_s`` = its measured run
time. A shape the payload declared wins over the measured one. A unit that never ran on a
worker (cancelled, refused, its lease denied) has no ``done`` line and replays as a zero-CPU
unit of its role. An incomplete last line of the log is left for the next read.

`fleet-burst record --name FLEET -o TRACE` checks that fleet runs (its control socket
answers), starts reading the log at its current end, and writes what arrives from then
on as a trace (header: the fleet's name, the first arrival's instant as ``start``, one
default pool per route seen) when it stops: after ``--duration``, ``--count``, when fleetd
stops, or on Ctrl-C. Having stopped taking arrivals it still reads up to `SETTLE_S` for
the ``done`` lines of the arrivals it took (not after Ctrl-C).
"""
from __future__ import annotations

import json
import os
import time

from fleet.burst.trace import FORMAT, VERSION
from fleet.runtime.arrivals import default_path

POLL_S = 0.05
SETTLE_S = 10.0  # after the last arrival taken: how long `capture` waits for their done lines


class NoRecording(Exception):
    """No fleet of that name runs, or it does not write an arrival log."""


def _running(name: str) -> bool:
    import fleet

    try:
        client = fleet.connect(name)
    except fleet.FleetError:
        return False
    client.close()
    return True


def _number(value) -> float | None:
    """A non-negative number from a log line, else None (a line is never trusted to be well formed)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 and value != float("inf"):
        return float(value)
    return None


def split(lines: list[dict]) -> tuple[list[dict], dict]:
    """(arrival lines in log order, {unit id: (measured run seconds, CPU seconds or None)}) from
    arrival-log lines."""
    arrivals, run_s = [], {}
    for x in lines:
        if "done" in x:
            seconds = _number(x.get("run_s"))
            if seconds is not None:
                run_s[x["done"]] = (seconds, _number(x.get("cpu_s")))
        elif isinstance(x.get("role"), str) and _number(x.get("wall")) is not None:
            arrivals.append(x)
    return arrivals, run_s


def to_trace(name: str, lines: list[dict]) -> tuple[dict, list[dict]]:
    """A trace (header dict, arrival dicts) from arrival-log lines, arrivals joined with their
    done lines: the declared shape first, else the measured one (see the module docstring)."""
    from datetime import datetime, timezone

    lines, run_s = split(lines)
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
        measured, measured_cpu = run_s.get(x.get("unit"), (None, None))
        cpu = _number(x.get("cpu_ms"))
        wait = _number(x.get("wait_ms"))
        latency = _number(x.get("latency_s"))
        if measured is not None and x.get("io"):
            latency = latency if latency is not None else measured
        elif measured is not None and cpu is None:
            on_cpu = measured if measured_cpu is None else min(measured_cpu, measured)
            cpu = round(on_cpu * 1000.0, 3)
            wait = wait if wait is not None else round((measured - on_cpu) * 1000.0, 3)
        arrival = {"t": round(x["wall"] - start, 6), "id": f"u{x.get('unit', i)}", "role": x["role"],
                   "lane": x.get("lane"), "route": route, "severity": x.get("severity"),
                   "parent": None, "key": x.get("key"), "after": [], "cpu_ms": cpu or 0.0,
                   "latency_s": latency if route is not None else None, "cycle": None}
        if wait:
            arrival["wait_ms"] = wait
        arrivals.append(arrival)
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
    from fleet.rules.names import InvalidFleetName, validate_fleet_name

    try:
        validate_fleet_name(name)
    except InvalidFleetName as exc:
        raise NoRecording(str(exc)) from None
    if not _running(name):
        raise NoRecording(f"no fleet named {name!r} is running (its control socket does not answer)")
    path = source or default_path(name)
    try:
        os.close(os.open(path, os.O_RDONLY))
    except OSError as exc:
        raise NoRecording(f"fleet {name!r} writes no arrival log at {path} ({exc.strerror}); "
                          "start it with [record] enabled = true") from None
    with open(path, "rb") as f:
        tail = _Tail(f)
        if on_ready is not None:
            on_ready(path)
        arrivals, done, interrupted = _take(tail, name, duration, count)
        if not interrupted:
            _settle(tail, name, arrivals, done)
    lines = arrivals + done
    header, arrivals = to_trace(name, lines)
    with open(output, "w", encoding="utf-8") as out:
        out.write(json.dumps(header, sort_keys=True) + "\n")
        for a in arrivals:
            out.write(json.dumps(a, sort_keys=True) + "\n")
    return len(arrivals)


class _Tail:
    """The whole JSON lines appended to an open log file since it was opened."""

    def __init__(self, f):
        self.f = f
        f.seek(0, os.SEEK_END)
        self._buf = b""

    def read(self) -> list[dict] | None:
        """The new lines; None when nothing was appended since the last read."""
        chunk = self.f.read()
        if not chunk:
            return None
        self._buf += chunk
        *whole, self._buf = self._buf.split(b"\n")
        out = []
        for raw in whole:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict):
                out.append(line)
        return out


def _take(tail: _Tail, name: str, duration: float | None, count: int | None):
    """Arrival and done lines until the stop condition: (arrivals, dones, interrupted by Ctrl-C)."""
    arrivals: list[dict] = []
    done: list[dict] = []
    deadline = None if duration is None else time.monotonic() + duration
    last_check = time.monotonic()
    try:
        while True:
            new = tail.read()
            for line in new or ():
                if "done" in line:
                    done.append(line)
                elif count is None or len(arrivals) < count:
                    arrivals.append(line)
            if count is not None and len(arrivals) >= count:
                return arrivals, done, False
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return arrivals, done, False
            if now - last_check > 1.0:
                last_check = now
                if not _running(name):
                    return arrivals, done, False
            if new is None:
                time.sleep(POLL_S)
    except KeyboardInterrupt:
        return arrivals, done, True


def _settle(tail: _Tail, name: str, arrivals: list[dict], done: list[dict]) -> None:
    """Read on (adding to `done`) until every arrival taken has its done line, for at most `SETTLE_S`."""
    waiting = {x.get("unit") for x in arrivals} - {x["done"] for x in done}
    deadline = time.monotonic() + SETTLE_S
    last_check = time.monotonic()
    try:
        while waiting and time.monotonic() < deadline:
            new = tail.read()
            for line in new or ():
                if "done" in line and line["done"] in waiting:
                    done.append(line)
                    waiting.discard(line["done"])
            if new is None:
                if time.monotonic() - last_check > 1.0:
                    last_check = time.monotonic()
                    if not _running(name):
                        return
                time.sleep(POLL_S)
    except KeyboardInterrupt:
        return
