"""The burst trace format (JSON lines, version 1) and its strict parser.

Line 1 is the header; every later non-blank line is one arrival. Times are trace
seconds: offsets from the header's ``start`` (a UTC instant, so that closures "until
the next UTC midnight" land where they did). A replay scales trace time by ``--speed``;
CPU work (``cpu_ms``) is never scaled.

Header::

    {"format": "fleet-burst-trace", "version": 1, "name": "burst-35",
     "start": "2026-10-04T14:00:00Z", "seed": 35, "horizon_s": 900,
     "modes": ["none", "cap", "admission"], "cap": 8, "profiles": ["auto"],
     "pools": [{"model": "glm-5.3-review", "provider": "openrouter-eu",
                "k": 12, "retry_after_s": 10,
                "latency": {"median_s": 6.0, "sigma": 0.35,
                            "load": [[1, 1.0], [5, 1.25], [20, 2.0]]},
                "alternatives": [{"model": "glm-5.3-review", "provider": "azure-eu"}],
                "residency": "eu-zdr"}],
     "keys": [{"credential": "k-control", "daily_limit_at": [2820.0],
               "reset": "midnight", "top_ups": [], "credit_requests": null}],
     "lanes": {"review": {"pinned": false}}}

``pools`` is the provider model per (model, provider) pool: ``k`` its concurrency (a
request that would make more than ``k`` in flight gets 429 with ``Retry-After:
retry_after_s``), ``latency`` a lognormal round time (median, sigma) times a load
factor interpolated over in-flight counts, ``alternatives`` the declared equivalents
(used only by the admission mode), ``residency`` a mark an alternative must share.
``keys`` is per credential: at each ``daily_limit_at`` offset the key starts answering
403 ``key limit exceeded (daily limit)`` until ``reset`` (``"midnight"``: the next UTC
midnight, or a number of seconds) or the next ``top_ups`` offset; after
``credit_requests`` clean requests it answers 402. Optional: ``seed`` (default 0),
``horizon_s`` (how long a replay waits for the last rounds; default last arrival + 600),
``speed`` (the replay speed the trace is meant for; ``--speed`` wins), ``modes``, ``cap`` (the cap mode's per-pool limit; default each pool's k), ``profiles``
(fleet profiles to run, default ``["auto"]``), ``lanes`` (per lane: ``pinned``, ``residency``,
``retention``, ``exclude``, as the admission policy's lanes), ``admission`` (the admission
policy's timings: ``probe_every``, ``closed_for``, ``backoff_base``, ...).

Arrival::

    {"t": 12.5, "id": "pr7-r2", "role": "review", "lane": "review",
     "route": {"model": "glm-5.3-review", "provider": "openrouter-eu", "credential": "k-control"},
     "severity": null, "parent": "pr7-r1", "key": null, "after": ["pr7-r1"],
     "cpu_ms": 0.0, "latency_s": null, "cycle": null}

``route`` (or null): a provider round, run by an I/O-bound role that calls the
simulator; without a route the arrival is CPU work (``cpu_ms`` of busy CPU, then
``wait_ms``, optional, of sleep: the part of a recorded handler's run spent off the CPU)
on a role of that name, pinned by ``key`` when one is given. Neither is scaled by the speed. ``parent``: the delegating round
(reference 000 §9, counted on its lane); ``after``: ids that must have ended before this
arrival is released (a solve cycle's merge after its sims). ``latency_s`` overrides the
pool's drawn latency. ``cycle``: a cycle number (solve-cycle traces: the report gives the
cycle tail, first arrival to last end).

`parse` reads every line and raises `TraceError` listing every bad line with its number;
nothing is replayed from a trace with a bad line. `load`, what a replay reads, also refuses a
trace with a header and no arrival: nothing to replay is a data error too.
Every number is bounded (trace offsets and durations by `MAX_TRACE_S`, counts by `MAX_COUNT`,
the speed by `SPEEDS`, an arrival's work on a worker -- ``cpu_ms``, ``wait_ms`` and the two
together, its wall time -- by `MAX_UNIT_MS`), a line nested
deeper than the JSON reader goes or an integer longer than Python reads is a bad line like
any other, and `load` reads only a regular file of at most `MAX_TRACE_BYTES` (a FIFO or a
device is refused, not waited on).
"""
from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timezone

from admission.records import field, record
from fleet.host.files import read_regular

FORMAT = "fleet-burst-trace"
VERSION = 1
MODES = ("none", "cap", "admission")
PROFILES = ("auto", "serial", "pinned")
DEFAULT_HORIZON_TAIL_S = 600.0
MAX_TRACE_S = 366 * 86400.0  # a trace spans at most a year of trace time (offsets, durations, horizon)
MAX_COUNT = 10**9  # k, cap, credit_requests, cycle
MAX_SEED = 2**63 - 1
MAX_SIGMA = 3.0  # a lognormal sigma of 3 already spreads round times over e^+-6 of the median
SPEEDS = (1e-3, 1e6)  # trace seconds per real second: the replay's waits stay within what a timer takes
MAX_TRACE_BYTES = 512 << 20
#: Most milliseconds one arrival may keep a worker (cpu_ms, wait_ms, and both together): the
#: replay's own default tail past the last arrival. Neither is scaled by the speed, so a larger
#: one would hold its worker past the end of any replay with the default horizon.
MAX_UNIT_MS = DEFAULT_HORIZON_TAIL_S * 1000.0
_SHOWN = 60  # characters of a bad value quoted in a message

_ROLE_RE = re.compile(r"^[a-z][a-z0-9_]{0,30}$")  # fleet.rules.roles' role-name rule, checked at parse time
_SEVERITIES = (None, "red-main", "B", "H", "M", "L")
_HEADER_KEYS = {"format", "version", "name", "start", "seed", "horizon_s", "modes", "cap", "profiles", "pools",
                "keys", "lanes", "admission", "speed"}
_POOL_KEYS = {"model", "provider", "k", "retry_after_s", "latency", "alternatives", "residency"}
_KEY_KEYS = {"credential", "provider", "daily_limit_at", "reset", "top_ups", "credit_requests"}
_ARRIVAL_KEYS = {"t", "id", "role", "lane", "route", "severity", "parent", "key", "after", "cpu_ms", "wait_ms",
                 "latency_s", "cycle"}


class TraceError(Exception):
    """A trace that cannot be replayed. `problems` is a list of (line number, message), every bad
    line (0: the file itself); the text is one ``PATH:LINE: message`` line per problem."""

    def __init__(self, path: str, problems: list[tuple[int, str]]):
        self.path, self.problems = path, problems
        super().__init__("\n".join(f"{path}:{n}: {msg}" if n else f"{path}: {msg}" for n, msg in problems))


class _Bad(Exception):
    pass


@record
class Latency:
    """Lognormal round time in trace seconds, times a load factor over in-flight counts."""

    median_s: float = 6.0
    sigma: float = 0.35
    load: tuple[tuple[float, float], ...] = ((1, 1.0), (5, 1.25), (20, 2.0))

    def factor(self, in_flight: int) -> float:
        """The load factor at `in_flight` rounds: piecewise linear between points, flat outside."""
        pts = self.load
        if in_flight <= pts[0][0]:
            return pts[0][1]
        for (n0, f0), (n1, f1) in zip(pts, pts[1:]):
            if in_flight <= n1:
                return f0 + (f1 - f0) * (in_flight - n0) / (n1 - n0)
        return pts[-1][1]


@record
class Pool:
    model: str
    provider: str
    k: int
    retry_after_s: float = 10.0
    latency: Latency = Latency()
    alternatives: tuple[tuple[str, str], ...] = ()
    residency: str | None = None

    @property
    def name(self) -> str:
        return f"{self.model}@{self.provider}"


@record
class Key:
    credential: str
    provider: str | None = None
    daily_limit_at: tuple[float, ...] = ()
    reset: str | float = "midnight"
    top_ups: tuple[float, ...] = ()
    credit_requests: int | None = None


@record
class Route:
    model: str
    provider: str
    credential: str | None = None

    @property
    def pool(self) -> str:
        return f"{self.model}@{self.provider}"


@record
class Arrival:
    t: float
    id: str
    role: str
    lane: str | None = None
    route: Route | None = None
    severity: str | None = None
    parent: str | None = None
    key: str | None = None
    after: tuple[str, ...] = ()
    cpu_ms: float = 0.0
    latency_s: float | None = None
    cycle: int | None = None
    wait_ms: float = 0.0

    def to_json(self) -> dict:
        out = {"t": self.t, "id": self.id, "role": self.role, "lane": self.lane,
                "route": None if self.route is None else {"model": self.route.model, "provider": self.route.provider,
                                                          "credential": self.route.credential},
                "severity": self.severity, "parent": self.parent, "key": self.key, "after": list(self.after),
                "cpu_ms": self.cpu_ms, "latency_s": self.latency_s, "cycle": self.cycle}
        if self.wait_ms:  # written only when there is one (the traces written before it stay as they are)
            out["wait_ms"] = self.wait_ms
        return out


@record
class Header:
    name: str
    start: float  # UTC epoch seconds
    seed: int = 0
    horizon_s: float | None = None
    modes: tuple[str, ...] = MODES
    cap: int | None = None
    profiles: tuple[str, ...] = ("auto",)
    pools: tuple[Pool, ...] = ()
    keys: tuple[Key, ...] = ()
    lanes: dict = field(default_factory=dict)
    speed: float | None = None
    raw: dict = field(default_factory=dict, compare=False)

    def pool(self, name: str) -> Pool | None:
        return next((p for p in self.pools if p.name == name), None)


@record
class Trace:
    header: Header
    arrivals: tuple[Arrival, ...]
    path: str = "<trace>"

    @property
    def horizon_s(self) -> float:
        """Trace seconds after which rounds still waiting are cut."""
        last = max((a.t for a in self.arrivals), default=0.0)
        return self.header.horizon_s if self.header.horizon_s is not None else last + DEFAULT_HORIZON_TAIL_S


# --- field checks -----------------------------------------------------------------------------
def shown(v) -> str:
    """`v` as a message quotes it: its repr, cut to `_SHOWN` characters (a bad value may be huge)."""
    return _cut(repr(v) if not isinstance(v, int) or abs(v) < 10**_SHOWN else f"a {len(str(abs(v)))}-digit number")


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def bounded(v, name: str, minimum: float, maximum: float) -> float:
    """A JSON number within [minimum, maximum] as a float; _Bad naming `name` otherwise (NaN,
    infinities, a bool, an int too large for a float included)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or isinstance(v, int) and abs(v) > 2**1023 \
            or not minimum <= v <= maximum:
        raise _Bad(f"{name} must be a number from {minimum:g} to {maximum:g}, got {shown(v)}")
    return float(v)


def _num(obj, name, *, minimum=0.0, maximum=MAX_TRACE_S, optional=False, integer=False):
    v = obj.get(name)
    if v is None and optional:
        return None
    value = bounded(v, name, minimum, maximum)
    if integer and isinstance(v, float) and not v.is_integer():
        raise _Bad(f"{name} must be a whole number, got {shown(v)}")
    return int(v) if integer else value


def _str(obj, name, *, optional=False):
    v = obj.get(name)
    if v is None and optional:
        return None
    if not isinstance(v, str) or not v:
        raise _Bad(f"{name} must be a non-empty string, got {shown(v)}")
    return v


def _unknown(obj, known, where):
    extra = sorted(set(obj) - known)
    if extra:
        raise _Bad(f"{where}: unknown field(s) {_cut(', '.join(extra))}")


def _utc(text) -> float:
    if not isinstance(text, str):
        raise _Bad(f"start must be an ISO-8601 UTC time like 2026-10-04T00:00:00Z, got {shown(text)}")
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise _Bad(f"start is not an ISO-8601 time: {shown(text)}") from None
    if when.tzinfo is None:
        raise _Bad(f"start must name its zone (Z for UTC): {shown(text)}")
    return when.astimezone(timezone.utc).timestamp()


def _latency(obj) -> Latency:
    if obj is None:
        return Latency()
    if not isinstance(obj, dict):
        raise _Bad(f"latency must be an object, got {shown(obj)}")
    _unknown(obj, {"median_s", "sigma", "load"}, "latency")
    median = _num(obj, "median_s", minimum=0.0) if "median_s" in obj else Latency.median_s
    sigma = _num(obj, "sigma", minimum=0.0, maximum=MAX_SIGMA) if "sigma" in obj else Latency.sigma
    load = obj.get("load", Latency.load)
    if not isinstance(load, (list, tuple)) or not all(isinstance(x, (list, tuple)) and len(x) == 2 for x in load):
        raise _Bad(f"latency.load must be [[in_flight, factor], ...], got {shown(load)}")
    pts = tuple((bounded(n, "latency.load in_flight", 0, MAX_COUNT), bounded(f, "latency.load factor", 0, MAX_COUNT))
                for n, f in load)
    if not pts or any(b[0] <= a[0] for a, b in zip(pts, pts[1:])) or any(f <= 0 for _, f in pts):
        raise _Bad("latency.load needs points with rising in-flight counts and factors > 0")
    return Latency(median, sigma, pts)


def _pool(obj) -> Pool:
    if not isinstance(obj, dict):
        raise _Bad(f"a pool must be an object, got {shown(obj)}")
    _unknown(obj, _POOL_KEYS, "pool")
    alts = obj.get("alternatives") or []
    if not isinstance(alts, list) or not all(isinstance(a, dict) for a in alts):
        raise _Bad("pool alternatives must be a list of {model, provider}")
    return Pool(_str(obj, "model"), _str(obj, "provider"), _num(obj, "k", minimum=1, maximum=MAX_COUNT, integer=True),
                _num(obj, "retry_after_s", minimum=0.0) if "retry_after_s" in obj else Pool.retry_after_s,
                _latency(obj.get("latency")), tuple((_str(a, "model"), _str(a, "provider")) for a in alts),
                _str(obj, "residency", optional=True))


def _times(obj, name) -> tuple[float, ...]:
    v = obj.get(name) or []
    if not isinstance(v, list):
        raise _Bad(f"{name} must be a list of trace offsets, got {shown(v)}")
    return tuple(sorted(bounded(x, f"{name} entry", 0.0, MAX_TRACE_S) for x in v))


def _key(obj) -> Key:
    if not isinstance(obj, dict):
        raise _Bad(f"a key must be an object, got {shown(obj)}")
    _unknown(obj, _KEY_KEYS, "key")
    reset = obj.get("reset", "midnight")
    if reset != "midnight" and (bounded(reset, "reset", 0.0, MAX_TRACE_S) == 0):
        raise _Bad(f"reset must be \"midnight\" or seconds > 0, got {shown(reset)}")
    return Key(_str(obj, "credential"), _str(obj, "provider", optional=True), _times(obj, "daily_limit_at"), reset,
               _times(obj, "top_ups"), _num(obj, "credit_requests", minimum=0, maximum=MAX_COUNT, optional=True,
                                                         integer=True))


def _choices(obj, name, allowed, default):
    v = obj.get(name, list(default))
    if not isinstance(v, list) or not v or any(x not in allowed for x in v):
        raise _Bad(f"{name} must be a non-empty list of {', '.join(allowed)}, got {shown(v)}")
    return tuple(v)


def parse_header(obj) -> Header:
    if not isinstance(obj, dict):
        raise _Bad("the header must be a JSON object")
    if obj.get("format") != FORMAT:
        raise _Bad(f"format must be {FORMAT!r}, got {shown(obj.get('format'))}")
    if obj.get("version") != VERSION:
        raise _Bad(f"version {shown(obj.get('version'))} is not supported (this reader knows version {VERSION})")
    _unknown(obj, _HEADER_KEYS, "header")
    pools = obj.get("pools") or []
    keys = obj.get("keys") or []
    lanes = obj.get("lanes") or {}
    if not isinstance(pools, list) or not isinstance(keys, list) or not isinstance(lanes, dict) \
            or not isinstance(obj.get("admission", {}), dict):
        raise _Bad("pools and keys must be lists, lanes and admission objects")
    for lane, body in lanes.items():
        if not isinstance(body, dict) or set(body) - {"pinned", "residency", "retention", "exclude"}:
            raise _Bad(f"lanes.{_cut(lane)} must be an object of pinned, residency, retention, exclude")
    parsed = tuple(_pool(p) for p in pools)
    names = [p.name for p in parsed]
    if len(set(names)) != len(names):
        raise _Bad("two pools with the same model@provider")
    for p in parsed:
        for alt in p.alternatives:
            if f"{alt[0]}@{alt[1]}" not in names:
                raise _Bad(f"pool {p.name}: alternative {alt[0]}@{alt[1]} is not a declared pool")
    return Header(_str(obj, "name"), _utc(obj.get("start")), _num(obj, "seed", maximum=MAX_SEED, integer=True) if "seed" in obj else 0,
                  _num(obj, "horizon_s", optional=True), _choices(obj, "modes", MODES, MODES),
                  _num(obj, "cap", minimum=1, maximum=MAX_COUNT, optional=True, integer=True),
                  _choices(obj, "profiles", PROFILES, ("auto",)), parsed, tuple(_key(k) for k in keys),
                  dict(lanes), _num(obj, "speed", minimum=SPEEDS[0], maximum=SPEEDS[1], optional=True), obj)


def parse_arrival(obj, header: Header) -> Arrival:
    if not isinstance(obj, dict):
        raise _Bad("an arrival must be a JSON object")
    _unknown(obj, _ARRIVAL_KEYS, "arrival")
    role = _str(obj, "role")
    if not _ROLE_RE.match(role):
        raise _Bad(f"role {shown(role)} is not a role name ([a-z][a-z0-9_]{{0,30}})")
    route = obj.get("route")
    if route is not None:
        if not isinstance(route, dict):
            raise _Bad(f"route must be an object or null, got {shown(route)}")
        _unknown(route, {"model", "provider", "credential"}, "route")
        route = Route(_str(route, "model"), _str(route, "provider"), _str(route, "credential", optional=True))
        if header.pool(route.pool) is None:
            raise _Bad(f"route {route.pool} is not a pool the header declares")
    severity = obj.get("severity")
    if severity not in _SEVERITIES:
        raise _Bad(f"severity must be one of red-main, B, H, M, L or null, got {shown(severity)}")
    key = obj.get("key")
    if key is not None and not isinstance(key, str):
        raise _Bad(f"key must be a string or null, got {shown(key)}")
    after = obj.get("after") or []
    if not isinstance(after, list) or not all(isinstance(x, str) for x in after):
        raise _Bad(f"after must be a list of arrival ids, got {shown(after)}")
    cpu_ms = _num(obj, "cpu_ms", maximum=MAX_UNIT_MS) if obj.get("cpu_ms") is not None else 0.0
    if route is None and key is None and cpu_ms == 0 and "cpu_ms" not in obj:
        raise _Bad("an arrival needs a route (a provider round) or cpu_ms (CPU work)")
    wait_ms = _num(obj, "wait_ms", maximum=MAX_UNIT_MS) if obj.get("wait_ms") is not None else 0.0
    if cpu_ms + wait_ms > MAX_UNIT_MS:
        raise _Bad(f"cpu_ms + wait_ms (the arrival's wall time on a worker) must be at most {MAX_UNIT_MS:g} ms, "
                   f"got {cpu_ms + wait_ms:g}")
    return Arrival(_num(obj, "t"), _str(obj, "id"), role, _str(obj, "lane", optional=True), route, severity,
                   _str(obj, "parent", optional=True), key, tuple(after), cpu_ms,
                   _num(obj, "latency_s", optional=True), _num(obj, "cycle", maximum=MAX_COUNT, optional=True, integer=True),
                   wait_ms)


def parse_lines(lines, path: str = "<trace>") -> Trace:
    """Parse an iterable of text lines; raises TraceError listing every bad line."""
    problems: list[tuple[int, str]] = []
    header = None
    arrivals: list[Arrival] = []
    seen: dict[str, int] = {}
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            obj = _json(text)
        except _Bad as exc:
            problems.append((number, str(exc)))
            if header is None and number == 1:
                break  # no header: the arrivals cannot be checked against anything
            continue
        try:
            if header is None:
                header = parse_header(obj)
                continue
            arrival = parse_arrival(obj, header)
            if arrival.id in seen:
                raise _Bad(f"id {shown(arrival.id)} was already used on line {seen[arrival.id]}")
            if arrivals and arrival.t < arrivals[-1].t:
                raise _Bad(f"t {arrival.t:g} is earlier than the line before ({arrivals[-1].t:g}); arrivals are in time order")
            seen[arrival.id] = number
            arrivals.append(arrival)
        except _Bad as exc:
            problems.append((number, str(exc)))
            if header is None:
                break
    if header is None and not problems:
        problems.append((1, "empty trace: no header line"))
    ids = set(seen)
    for arrival in arrivals:
        for ref in ((arrival.parent,) if arrival.parent else ()) + arrival.after:
            if ref not in ids:
                problems.append((seen[arrival.id], f"{_cut(arrival.id)}: refers to unknown arrival {shown(ref)}"))
            elif seen[ref] >= seen[arrival.id]:
                problems.append((seen[arrival.id], f"{_cut(arrival.id)}: refers to {shown(ref)}, which comes later"))
    if header is not None and not problems:
        try:  # the simulator and the report turn trace time into UTC dates
            datetime.fromtimestamp(header.start + Trace(header, tuple(arrivals)).horizon_s, timezone.utc)
        except (OverflowError, OSError, ValueError):
            problems.append((1, "start plus the horizon is past the last date a clock can show"))
    if problems:
        raise TraceError(path, sorted(problems))
    return Trace(header, tuple(arrivals), path)


def _json(text: str):
    """One line's JSON value; _Bad for what the reader refuses, depth and integer length included."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Bad(f"not JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise _Bad("nested too deeply to read") from None
    except ValueError:  # int() refuses a literal past sys.get_int_max_str_digits()
        raise _Bad(f"a number longer than {sys.get_int_max_str_digits()} digits") from None


def load(path) -> Trace:
    """Read and parse the trace at `path` (TraceError if it cannot be read or has bad lines)."""
    try:
        data = read_regular(path, MAX_TRACE_BYTES)
    except (OSError, ValueError) as exc:
        raise TraceError(str(path), [(0, f"cannot read: {getattr(exc, 'strerror', None) or exc}")]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(str(path), [(0, f"not UTF-8 text: {exc.reason}")]) from None
    trace = parse_lines(text.splitlines(), str(path))
    if not trace.arrivals:  # a header alone parses (its pools serve a simulator), but replays nothing
        raise TraceError(str(path), [(0, "no arrivals: the trace has a header and nothing to replay")])
    return trace


def dump(header: dict, arrivals, path) -> None:
    """Write a trace: `header` (a header dict) then one line per Arrival."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(header, sort_keys=True) + "\n")
        for a in arrivals:
            f.write(json.dumps(a.to_json(), sort_keys=True) + "\n")
