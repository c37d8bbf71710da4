"""A local provider: a real HTTP server on 127.0.0.1 that refuses like a provider does.

`ProviderSimulator(header, clock)` serves an OpenAI-style chat-completions subset on an
ephemeral loopback port, from an asyncio loop in its own thread::

    POST /<provider>/v1/chat/completions          (each provider has its own base URL)
    Authorization: Bearer <credential>
    X-Burst-Round: <arrival id>                   (optional: makes the latency draw per round)
    {"model": "...", "messages": [{"role": "user", "content": "..."}]}

Per pool (model@provider) and per key (credential), from the trace header, checked in
this order: a key past a scheduled daily limit answers 403 ``key limit exceeded (daily
limit)`` until its reset (the next UTC midnight, or a number of seconds) or a scheduled
top-up; a key whose credit (clean requests since its last top-up) is spent answers 402;
a request that would put more than ``k`` rounds in flight on its pool answers 429 with
``Retry-After`` (trace seconds, as the provider would say it); otherwise it holds the
round for a lognormal latency times the pool's load factor at its in-flight count (trace
seconds, scaled by the shared clock) and answers 200 with a completion.

The default provider model (`DEFAULT_POOL`) is fitted to reference 000's three measured
points, 1, ~5 and ~20 rounds in flight on one pool. 000 names the points and what they
showed (one and five rounds run; a twenty-round burst is refused) but not their times, so
the fit is: a round at 1 in flight takes the median (6 s) — a review round's order of
size; at 5 in flight it is served 1.25x slower; the pool's K sits between the served and
the refused point, at 12, so a 20-round burst meets 8 refusals (40 %), and a load factor
of 2.0 at 20 keeps the curve rising past K for a pool whose K a trace sets higher. The
load factor is linear between the points and flat outside. A trace that knows better
declares its own ``k``, ``latency.median_s``, ``sigma`` and ``load`` per pool.

Draws come from `random.Random` seeded by (seed, round id, attempt): a round draws the same
latency whatever order the requests arrive in. The simulator keeps its own counts per pool
(`counts()`: requests, 200s, 429s, 402s, 403s, max concurrency) and a list of events
(`events()`) that the report compares and draws, and which pool each round's request
reached (`calls()`: where the admission's moves went, as the provider saw them).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import threading
from datetime import datetime, timezone

from admission.records import field, record
from fleet.burst.clock import ReplayClock
from fleet.burst.trace import Header, Key, Latency, Pool

DEFAULT_LATENCY = Latency(median_s=6.0, sigma=0.35, load=((1, 1.0), (5, 1.25), (20, 2.0)))
DEFAULT_K = 12
DEFAULT_POOL = dict(k=DEFAULT_K, retry_after_s=10.0, latency=DEFAULT_LATENCY)
DAILY_LIMIT_MESSAGE = "Key limit exceeded (daily limit)"
NO_CREDIT_MESSAGE = "Insufficient credits"
RATE_LIMIT_MESSAGE = "Rate limit exceeded: too many requests in flight"
_MAX_BODY = 1 << 20


def next_utc_midnight(wall: float) -> float:
    day = datetime.fromtimestamp(wall, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return day.timestamp() + 86400.0


def closed_intervals(key: Key, start_wall: float) -> list[tuple[float, float]]:
    """The trace-time spans [from, to) in which `key` answers its daily-limit 403."""
    out = []
    for at in key.daily_limit_at:
        if key.reset == "midnight":
            end = next_utc_midnight(start_wall + at) - start_wall
        else:
            end = at + float(key.reset)
        for top_up in key.top_ups:
            if at < top_up < end:
                end = top_up
        out.append((at, end))
    return out


def credit_epoch(key: Key, t: float) -> int:
    """How many top-ups of `key` happened by trace time `t` (credit refills at each)."""
    return sum(1 for top_up in key.top_ups if top_up <= t)


@record(frozen=False)
class PoolCounts:
    requests: int = 0
    ok: int = 0
    r429: int = 0
    r402: int = 0
    r403: int = 0
    max_concurrency: int = 0
    in_flight: int = 0

    def to_dict(self) -> dict:
        return {"requests": self.requests, "200": self.ok, "429": self.r429, "402": self.r402, "403": self.r403,
                "max_concurrency": self.max_concurrency}


@record(frozen=False)
class _KeyState:
    key: Key
    closed: list = field(default_factory=list)
    used: dict = field(default_factory=dict)  # credit epoch -> clean requests


class SimulatorError(Exception):
    """The simulator could not start (e.g. no loopback port)."""


class ProviderSimulator:
    """The local provider. `start()` binds 127.0.0.1:0 and serves from a thread; `stop()` ends it."""

    def __init__(self, header: Header, clock: ReplayClock, *, seed: int | None = None):
        self.header, self.clock = header, clock
        self.seed = header.seed if seed is None else seed
        self.pools = {p.name: p for p in header.pools}
        self._keys = {k.credential: _KeyState(k, closed_intervals(k, header.start)) for k in header.keys}
        self._counts = {name: PoolCounts() for name in self.pools}
        self._events: list[tuple] = []  # (trace t, pool, status, in-flight after)
        self._calls: dict[str, list] = {}  # round id (X-Burst-Round) -> [(pool, status)] of each request
        self._attempts: dict[str, int] = {}
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()  # counts are read from other threads
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server = None
        self._writers: set = set()
        self.port: int | None = None

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> "ProviderSimulator":
        ready = threading.Event()
        failure: list = []

        def run():
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=1024, reuse_address=True))
                self.port = self._server.sockets[0].getsockname()[1]
            except OSError as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                self._server.close()
                for w in list(self._writers):
                    w.close()
                loop.run_until_complete(self._server.wait_closed())
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for t in pending:
                    t.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.close()

        self._thread = threading.Thread(target=run, name="burst-provider", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure or self.port is None:
            raise SimulatorError(f"provider simulator could not listen on 127.0.0.1: {failure[0] if failure else 'timeout'}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        """Forget counts, events and key usage (the next mode replays against a fresh provider)."""
        with self._lock:
            self._counts = {name: PoolCounts() for name in self.pools}
            self._events = []
            self._calls = {}
            self._attempts = {}
            for ks in self._keys.values():
                ks.used = {}

    # --- reading ------------------------------------------------------------------------
    def counts(self) -> dict:
        """Per pool: requests, 200, 429, 402, 403, max_concurrency."""
        with self._lock:
            return {name: c.to_dict() for name, c in self._counts.items()}

    def events(self) -> list[tuple]:
        with self._lock:
            return list(self._events)

    def calls(self) -> dict[str, list]:
        """Round id -> [(pool ``model@provider``, status)] of each request it made, in order: where
        a round ran, as the provider saw it (the replay reads an admission's moves back from here),
        and the refusals a round met before it ran (a refused round the admission tried again)."""
        with self._lock:
            return {k: list(v) for k, v in self._calls.items()}

    def key_closures(self) -> dict[str, list[tuple[float, float]]]:
        return {cred: list(ks.closed) for cred, ks in self._keys.items()}

    # --- the rules -------------------------------------------------------------------------
    def decide(self, pool: Pool, credential: str | None, t: float) -> tuple[int, dict, str]:
        """The refusal a request on `pool` with `credential` meets at trace time `t`:
        (status, extra headers, message); status 200 means it may run (caller counts in-flight)."""
        ks = self._keys.get(credential) if credential is not None else None
        if ks is not None:
            for start, end in ks.closed:
                if start <= t < end:
                    return 403, {}, DAILY_LIMIT_MESSAGE
            limit = ks.key.credit_requests
            if limit is not None and ks.used.get(credit_epoch(ks.key, t), 0) >= limit:
                return 402, {}, NO_CREDIT_MESSAGE
        if self._counts[pool.name].in_flight >= pool.k:
            return 429, {"Retry-After": f"{pool.retry_after_s:g}"}, RATE_LIMIT_MESSAGE
        return 200, {}, ""

    def latency(self, pool: Pool, round_id: str | None, in_flight: int) -> float:
        """A round's latency in trace seconds at `in_flight` rounds on its pool."""
        lat = pool.latency
        if round_id is None:
            rng = self._rng
        else:
            attempt = self._attempts.get(round_id, 0)
            self._attempts[round_id] = attempt + 1
            digest = hashlib.blake2b(f"{self.seed}/{round_id}/{attempt}".encode(), digest_size=8).digest()
            rng = random.Random(int.from_bytes(digest, "big"))
        return lat.median_s * math.exp(lat.sigma * rng.gauss(0.0, 1.0)) * lat.factor(in_flight)

    async def _round(self, provider: str, body: dict, headers: dict) -> tuple[int, dict, dict]:
        model = body.get("model")
        if not isinstance(model, str) or not isinstance(body.get("messages"), list):
            return 400, {}, {"error": {"message": "model (string) and messages (list) are required"}}
        pool = self.pools.get(f"{model}@{provider}")
        if pool is None:
            return 404, {}, {"error": {"message": f"model {model!r} is not served by {provider!r}"}}
        auth = headers.get("authorization", "")
        credential = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        round_id = headers.get("x-burst-round")
        wanted = headers.get("x-burst-latency")
        t = self.clock.mono()
        with self._lock:
            counts = self._counts[pool.name]
            counts.requests += 1
            status, extra, message = self.decide(pool, credential, t)
            if round_id is not None:
                self._calls.setdefault(round_id, []).append((pool.name, status))
            if status == 200:
                counts.in_flight += 1
                counts.max_concurrency = max(counts.max_concurrency, counts.in_flight)
                in_flight = counts.in_flight
            else:
                setattr(counts, f"r{status}", getattr(counts, f"r{status}") + 1)
            self._events.append((t, pool.name, status, counts.in_flight))
        if status != 200:
            return status, extra, {"error": {"code": status, "message": message}}
        try:
            seconds = float(wanted) if wanted else self.latency(pool, round_id, in_flight)
            await asyncio.sleep(self.clock.real(seconds))
        finally:
            t_end = self.clock.mono()
            with self._lock:
                counts.in_flight -= 1
                counts.ok += 1
                self._events.append((t_end, pool.name, 0, counts.in_flight))  # 0: a round ended
                ks = self._keys.get(credential)
                if ks is not None:
                    epoch = credit_epoch(ks.key, t)
                    ks.used[epoch] = ks.used.get(epoch, 0) + 1
        return 200, {}, {"id": f"chatcmpl-{round_id or 'x'}", "object": "chat.completion", "model": model,
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": "ok"}}],
                         "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                         "x_latency_s": seconds}

    # --- HTTP/1.1 (keep-alive, Content-Length bodies) -----------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                try:
                    method, path, _version = lines[0].split(" ", 2)
                except ValueError:
                    await self._reply(writer, 400, {}, {"error": {"message": "bad request line"}}, close=True)
                    return
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                try:
                    length = int(headers.get("content-length", "0"))
                except ValueError:
                    length = -1
                if not 0 <= length <= _MAX_BODY:
                    await self._reply(writer, 400, {}, {"error": {"message": "bad Content-Length"}}, close=True)
                    return
                raw = await reader.readexactly(length) if length else b""
                close = headers.get("connection", "").lower() == "close"
                parts = path.split("/")
                if method != "POST" or len(parts) != 5 or parts[2:] != ["v1", "chat", "completions"]:
                    status, extra, body = 404, {}, {"error": {"message": f"no route {method} {path}"}}
                else:
                    try:
                        payload = json.loads(raw)
                        if not isinstance(payload, dict):
                            raise ValueError
                    except ValueError:
                        status, extra, body = 400, {}, {"error": {"message": "body must be a JSON object"}}
                    else:
                        status, extra, body = await self._round(parts[1], payload, headers)
                await self._reply(writer, status, extra, body, close=close)
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:  # the server stops with rounds in flight: they end with it
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    _REASONS = {200: "OK", 400: "Bad Request", 402: "Payment Required", 403: "Forbidden", 404: "Not Found",
                429: "Too Many Requests"}

    async def _reply(self, writer, status, extra, body, *, close) -> None:
        data = json.dumps(body).encode()
        head = [f"HTTP/1.1 {status} {self._REASONS.get(status, 'Error')}", "Content-Type: application/json",
                f"Content-Length: {len(data)}", f"Connection: {'close' if close else 'keep-alive'}"]
        head += [f"{k}: {v}" for k, v in extra.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        await writer.drain()


__all__ = ["DAILY_LIMIT_MESSAGE", "DEFAULT_POOL", "ProviderSimulator", "SimulatorError", "closed_intervals",
           "next_utc_midnight"]
