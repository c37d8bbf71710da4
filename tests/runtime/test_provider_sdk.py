"""The real openai SDK through a real fleet's provider admission, against a local server on
loopback that answers as a provider does: a 429 with its headers, a daily-limit 403, then the
completion. With the SDK's own retries off (docs/admission.md) every refusal reaches the
admission, which backs the pool off, closes the key, probes it and runs the round again; with
the SDK's default the SDK retries the 429s itself and the admission never hears of them.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import fleet
from admission.pool import ManualClock
from admission.route import Route

from ..admission_catalog import MIDNIGHT_AFTER, T_1447, catalog
from ..fleets import config, running, unique_name
from .test_provider_admission import _bulkhead, _eventually, _one_outcome_each, _waiting

ROUTE = Route("glm-5.3-review", "openrouter-eu", "k-review")
PROBE_EVERY = 60
RATE_LIMITED = (429, {"retry-after-ms": "5000", "x-ratelimit-limit-requests": "60",
                      "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6s"},
                {"error": {"message": "Rate limit reached for requests", "type": "requests",
                           "code": "rate_limit_exceeded"}})
DAILY_LIMIT = (403, {}, {"error": {"message": "Key limit exceeded (daily limit)", "code": 403}})


def completion(model: str, text: str) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1_791_125_220, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


class Provider:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 (``/<provider>/v1/chat/completions``):
    each request takes the next scripted answer (status, headers, body); past the script it
    answers with a completion. Every request is recorded (path, key, the SDK's retry count)."""

    def __init__(self, script):
        self.script, self.requests, self.lock = list(script), [], threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with provider.lock:
                    provider.requests.append({"path": self.path, "key": self.headers.get("Authorization"),
                                              "retry": self.headers.get("x-stainless-retry-count")})
                    status, headers, answer = (provider.script.pop(0) if provider.script
                                               else (200, {}, completion(body["model"], "LGTM")))
                raw = json.dumps(answer).encode()
                self.send_response(status)
                for name, value in {**headers, "Content-Type": "application/json",
                                    "Content-Length": str(len(raw))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def seen(self) -> int:
        with self.lock:
            return len(self.requests)


@pytest.fixture
def sdk_fleet():
    clock = ManualClock(wall=T_1447, mono=1000.0)
    cfg = config(unique_name("sdk"), {"chat": {"kind": "pooled", "handler": "tests.sdk_handlers:chat", "slots": 4,
                                               "io_bound": True, "peak_cpus": 1, "queue_bound": 100}})
    cfg["admission"] = catalog(daily_limit_probe_every=PROBE_EVERY)
    with running(cfg, admission_clock=clock) as f:
        yield f, clock


def test_with_its_retries_off_the_sdks_refusals_are_the_admissions(sdk_fleet):
    f, clock = sdk_fleet
    with Provider([RATE_LIMITED, DAILY_LIMIT]) as provider:
        # pinned ("coordinator"): it waits for its own route, never moves to the alternative
        unit = f.submit("chat", {"base": provider.url, "prompt": "review PR 7", "max_retries": 0},
                        route=ROUTE, lane="coordinator")
        # the 429: one request (the SDK did not retry), the pool backed off for the header's 5 s
        _eventually(lambda: unit.unit_id in _waiting(f))
        wait = _waiting(f)[unit.unit_id]
        assert wait["refusals"] == 1 and wait["refused"] == "429 Rate limit reached for requests"
        assert wait["until"] == pytest.approx(T_1447 + 5, abs=1.0)
        assert provider.seen() == 1 and _bulkhead(f, ROUTE)["refusals"] == 1 and not unit.done()
        clock.advance(5)  # the backoff ends: the admission runs it again, and the key is spent for the day
        _eventually(lambda: _waiting(f).get(unit.unit_id, {}).get("refusals") == 2)
        wait = _waiting(f)[unit.unit_id]
        assert wait["refused"] == "403 Key limit exceeded (daily limit)" and "daily-limit" in wait["why"]
        assert wait["until"] == MIDNIGHT_AFTER and provider.seen() == 2
        (closure,) = f.status()["admission"]["closures"]
        assert (closure["provider"], closure["credential"], closure["until"]) == ("openrouter-eu", "k-review",
                                                                                MIDNIGHT_AFTER)
        clock.advance(PROBE_EVERY)  # the key was topped up: the waiting round is the probe, and runs
        assert unit.result(60) == "LGTM"
        assert provider.seen() == 3 and f.status()["admission"]["closures"] == []
        assert [r["path"] for r in provider.requests] == ["/openrouter-eu/v1/chat/completions"] * 3
        assert {r["key"] for r in provider.requests} == {"Bearer k-review"}
        assert {r["retry"] for r in provider.requests} == {"0"}  # each request the SDK's first
    counts = f.ledger()
    assert (counts["submitted"], counts["solved"], counts["failed"]) == (1, 1, 0)
    _one_outcome_each(f)


def test_with_the_sdks_default_retries_the_admission_never_sees_the_429s(sdk_fleet):
    f, _clock = sdk_fleet
    quick = (429, {"retry-after-ms": "10"}, RATE_LIMITED[2])
    with Provider([quick, quick]) as provider:
        unit = f.submit("chat", {"base": provider.url, "prompt": "review PR 8"}, route=ROUTE, lane="coordinator")
        assert unit.result(60) == "LGTM"
        # three requests, two of them the SDK's own retries: the pool never backed off
        assert [r["retry"] for r in provider.requests] == ["0", "1", "2"]
    assert _bulkhead(f, ROUTE)["refusals"] == 0
    _one_outcome_each(f)
