"""The replay fleet's handlers (run in fleet workers).

`chat` is an ``async def`` handler of an I/O-bound role: it calls the provider simulator
over real HTTP with one `httpx.AsyncClient` per worker loop, exactly as a user's handler
would call a provider, and raises `ProviderRefusal` for a 4xx refusal (the unit fails
with it; the replay reads status, message and Retry-After from the exception). `burn`
spends a unit's ``cpu_ms`` of busy CPU on its worker thread. Both return the host
monotonic instants the work started and ended (the same clock in every process), which
the replay turns into waits and a timeline.
"""
from __future__ import annotations

import asyncio
import time

import httpx  # imported here so that the zygote has it loaded before it forks workers

_clients: dict = {}  # event loop -> httpx.AsyncClient (one per worker loop)


class ProviderRefusal(Exception):
    """The provider refused a round: `status` (429, 402, 403), its message and Retry-After (s)."""

    def __init__(self, status: int, message: str = "", retry_after: float | None = None, started: float = 0.0,
                 ended: float = 0.0):
        super().__init__(status, message, retry_after, started, ended)
        self.status, self.message, self.retry_after = status, message, retry_after
        self.started, self.ended = started, ended

    def __str__(self):
        return f"HTTP {self.status}: {self.message}"


def _client():
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=30.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=512))
    return client


async def chat(unit) -> dict:
    """One chat-completions round. Payload: url, model, credential, id, latency_s (optional);
    ``{"warm": true}`` only makes the worker's client (the replay warms each role up before it measures)."""
    p = unit.payload
    if p.get("warm"):
        _client()
        return {"status": 0}
    headers = {"X-Burst-Round": p["id"]}
    if p.get("credential"):
        headers["Authorization"] = f"Bearer {p['credential']}"
    if p.get("latency_s") is not None:
        headers["X-Burst-Latency"] = repr(float(p["latency_s"]))
    body = {"model": p["model"], "messages": [{"role": "user", "content": f"round {p['id']}"}]}
    started = time.monotonic()
    response = await _client().post(p["url"], json=body, headers=headers)
    ended = time.monotonic()
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except Exception:
            message = response.text[:200]
        retry = response.headers.get("retry-after")
        raise ProviderRefusal(response.status_code, message, float(retry) if retry else None, started, ended)
    return {"status": 200, "started": started, "ended": ended}


def burn(unit) -> dict:
    """Busy CPU for the payload's cpu_ms (this thread's CPU time), then return."""
    started = time.monotonic()
    goal = time.thread_time() + unit.payload["cpu_ms"] / 1000.0
    x = 0
    while time.thread_time() < goal:
        for _ in range(200):
            x += 1
    return {"status": 0, "started": started, "ended": time.monotonic()}
