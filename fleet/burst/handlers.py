"""The replay fleet's handlers (run in fleet workers).

`chat` is an ``async def`` handler of an I/O-bound role: it calls the provider simulator
over real HTTP with one `httpx.AsyncClient` per worker loop, exactly as a user's handler
would call a provider. It calls the route the fleet's provider admission chose
(``unit.route``: the asked route or the alternative admission moved the round to); a
round submitted without a route (the ``none`` and ``cap`` modes) calls the route in its
payload. A 4xx refusal is raised as ``fleet.Refused(status, message, retry_after=..., at=...)``
(`at`: the reply's instant): the unit fails ``Refused`` and, for a routed unit, the
admission takes it as its pool's signal (429 backs off, 402/403 close, from that instant). `burn` spends a unit's ``cpu_ms`` of busy CPU on
its worker thread, then sleeps its ``wait_ms`` (a recorded handler's time off the CPU). Both return the host monotonic instants the work started and ended
(the same clock in every process), which the replay turns into waits and a timeline.
"""
from __future__ import annotations

import asyncio
import time

import httpx  # imported here so that the zygote has it loaded before it forks workers

import fleet

_clients: dict = {}  # event loop -> httpx.AsyncClient (one per worker loop)


def _client():
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=30.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=512))
    return client


def route_of(unit) -> tuple[str, str, str | None]:
    """(model, provider, credential) the round calls: the admission's choice, else the payload's."""
    if unit.route is not None:
        return unit.route.model, unit.route.provider, unit.route.credential
    p = unit.payload
    return p["model"], p["provider"], p.get("credential")


async def chat(unit) -> dict:
    """One chat-completions round. Payload: base (the simulator's URL), id, latency_s (optional),
    and model, provider, credential for a round without a route; ``{"warm": true}`` only makes
    the worker's client (the replay warms each role up before it measures)."""
    p = unit.payload
    if p.get("warm"):
        _client()
        return {"status": 0}
    model, provider, credential = route_of(unit)
    headers = {"X-Burst-Round": p["id"]}
    if credential:
        headers["Authorization"] = f"Bearer {credential}"
    if p.get("latency_s") is not None:
        headers["X-Burst-Latency"] = repr(float(p["latency_s"]))
    body = {"model": model, "messages": [{"role": "user", "content": f"round {p['id']}"}]}
    started = time.monotonic()
    response = await _client().post(f"{p['base']}/{provider}/v1/chat/completions", json=body, headers=headers)
    ended = time.monotonic()
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except Exception:
            message = response.text[:200]
        retry = response.headers.get("retry-after")
        # `at`: the reply's instant, from which the provider's Retry-After counts
        raise fleet.Refused(response.status_code, message, retry_after=float(retry) if retry else None, at=ended)
    return {"status": 200, "started": started, "ended": ended}


def burn(unit) -> dict:
    """Busy CPU for the payload's cpu_ms (this thread's CPU time), then a sleep of its wait_ms
    (optional), then return."""
    started = time.monotonic()
    goal = time.thread_time() + unit.payload["cpu_ms"] / 1000.0
    x = 0
    while time.thread_time() < goal:
        for _ in range(200):
            x += 1
    if unit.payload.get("wait_ms"):
        time.sleep(unit.payload["wait_ms"] / 1000.0)
    return {"status": 0, "started": started, "ended": time.monotonic()}
