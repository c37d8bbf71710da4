"""Refused.from_response and Refused.from_exception read the answers of the real clients
(httpx, httpx2, requests, and the openai and anthropic SDKs' errors): status, the provider's
message, and the wait the headers ask for (Retry-After, retry-after-ms, the reset headers);
a spent account answered with another status is a 402; what is no refusal gives None."""
from __future__ import annotations

import email.utils
import json
import subprocess
import sys

import httpx
import pytest
import requests

from admission.errors import REFUSAL_STATUSES, Refused, wait_from_headers
from admission.state import classify

DATE = "Sun, 04 Oct 2026 14:47:00 GMT"
AT_DATE = email.utils.mktime_tz(email.utils.parsedate_tz(DATE))


def error_body(message, code=None, kind=None):
    return {"error": {"message": message, "code": code, "type": kind}}


def httpx_response(status, headers=None, body=None, module=httpx):
    return module.Response(status, headers=headers or {}, json=body,
                           request=module.Request("POST", "http://127.0.0.1/v1/chat/completions"))


def requests_response(status, headers=None, body=None):
    r = requests.Response()
    r.status_code, r.reason = status, "Too Many Requests"
    r.headers.update(headers or {})
    r._content = json.dumps(body).encode() if body is not None else b""
    r.url = "http://127.0.0.1/v1/chat/completions"
    return r


def test_the_refusal_statuses_are_the_ones_the_admission_classifies():
    assert {s for s in range(100, 600) if classify(s, "") is not None} == REFUSAL_STATUSES


@pytest.mark.parametrize("make", [httpx_response, requests_response], ids=["httpx", "requests"])
def test_a_429_with_retry_after_is_a_refusal_with_its_wait(make):
    refusal = Refused.from_response(make(429, {"Retry-After": "7"}, error_body("Rate limit reached", "rate_limit")))
    assert (refusal.status, refusal.message, refusal.retry_after) == (429, "Rate limit reached", 7.0)


def test_retry_after_ms_wins_and_an_http_date_counts_from_the_responses_date():
    assert Refused.from_response(httpx_response(429, {"retry-after-ms": "1500", "retry-after": "9"})).retry_after == 1.5
    later = email.utils.formatdate(AT_DATE + 30, usegmt=True)
    assert Refused.from_response(httpx_response(429, {"date": DATE, "retry-after": later})).retry_after == 30.0


def test_openai_reset_headers_the_exhausted_limit_decides():
    headers = {"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-reset-tokens": "1.5s",
               "x-ratelimit-remaining-requests": "0", "x-ratelimit-remaining-tokens": "9000"}
    assert Refused.from_response(httpx_response(429, headers)).retry_after == 360.0
    headers.update({"x-ratelimit-remaining-requests": "3", "x-ratelimit-remaining-tokens": "0"})
    assert Refused.from_response(httpx_response(429, headers)).retry_after == 1.5
    # nothing says which limit was met: the earliest reset (the backoff covers the rest)
    assert wait_from_headers(httpx.Headers({"x-ratelimit-reset-requests": "1m2.5s",
                                            "x-ratelimit-reset-tokens": "20ms"})) == 0.02


def test_anthropic_reset_headers_are_instants_read_against_the_responses_date():
    headers = {"date": DATE, "anthropic-ratelimit-requests-reset": "2026-10-04T14:47:40Z",
               "anthropic-ratelimit-requests-remaining": "0",
               "anthropic-ratelimit-tokens-reset": "2026-10-04T14:47:05+00:00",
               "anthropic-ratelimit-tokens-remaining": "12000"}
    assert Refused.from_response(httpx_response(429, headers)).retry_after == 40.0


def test_headers_that_cannot_be_read_are_passed_over_and_a_wait_is_never_negative():
    assert wait_from_headers(httpx.Headers({"retry-after": "soon", "x-ratelimit-reset-requests": "6 minutes"})) is None
    assert wait_from_headers(httpx.Headers({"date": DATE, "anthropic-ratelimit-requests-reset": "2026-10-04T14:00:00Z"})) == 0
    assert wait_from_headers(httpx.Headers({"retry-after": "-3"})) == 0


def test_a_daily_limit_403_keeps_the_providers_message_for_the_admission():
    refusal = Refused.from_response(httpx_response(403, {}, error_body("Key limit exceeded (daily limit)", 403)))
    assert (refusal.status, refusal.message, refusal.retry_after) == (403, "Key limit exceeded (daily limit)", None)
    assert classify(refusal.status, refusal.message) == "daily-limit"


def test_a_spent_account_answered_otherwise_is_a_402():
    quota = error_body("You exceeded your current quota, please check your plan and billing details.",
                       "insufficient_quota", "insufficient_quota")
    assert Refused.from_response(httpx_response(429, {}, quota)).status == 402
    credit = {"type": "error", "error": {"type": "invalid_request_error",
                                         "message": "Your credit balance is too low to access the Anthropic API."}}
    assert Refused.from_response(httpx_response(400, {}, credit)).status == 402
    assert Refused.from_response(httpx_response(400, {}, error_body("messages: field required"))) is None


@pytest.mark.parametrize("status", [200, 404, 500, 503, 529])
def test_what_is_no_refusal_gives_none(status):
    assert Refused.from_response(httpx_response(status, {"retry-after": "5"}, error_body("x"))) is None


def test_a_body_that_is_not_json_is_the_message():
    r = httpx.Response(429, text="slow down\n", request=httpx.Request("GET", "http://127.0.0.1/"))
    assert Refused.from_response(r).message == "slow down"


def test_from_response_refuses_what_is_no_response():
    with pytest.raises(TypeError, match="httpx, httpx2 or requests"):
        Refused.from_response({"status_code": 429})


def test_from_exception_reads_raise_for_status_errors_and_passes_others():
    r = httpx_response(429, {"retry-after": "2"}, error_body("busy"))
    with pytest.raises(httpx.HTTPStatusError) as caught:
        r.raise_for_status()
    assert Refused.from_exception(caught.value).retry_after == 2.0
    rr = requests_response(403, {}, error_body("Key limit exceeded (daily limit)"))
    with pytest.raises(requests.HTTPError) as caught:
        rr.raise_for_status()
    assert Refused.from_exception(caught.value).status == 403
    assert Refused.from_exception(httpx.ConnectTimeout("timed out")) is None
    assert Refused.from_exception(ValueError("the handler's own")) is None
    same = Refused(429, "already one")
    assert Refused.from_exception(same) is same


def test_from_exception_reads_the_sdks_status_errors():
    import anthropic
    import httpx2
    import openai

    def sdk_error(module, status, headers, body):
        response = httpx_response(status, headers, body, module=httpx2)
        return module.APIStatusError(f"Error code: {status}", response=response,
                                     body=body.get("error", body) if module is openai else body)

    refusal = Refused.from_exception(sdk_error(openai, 429, {"retry-after-ms": "250"}, error_body("Rate limit", "x")))
    assert (refusal.status, refusal.retry_after, refusal.message) == (429, 0.25, "Rate limit")
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert Refused.from_exception(sdk_error(anthropic, 529, {}, overloaded)) is None
    limited = {"type": "error", "error": {"type": "rate_limit_error", "message": "Number of requests exceeded"}}
    headers = {"retry-after": "11", "anthropic-ratelimit-requests-remaining": "0"}
    assert Refused.from_exception(sdk_error(anthropic, 429, headers, limited)).retry_after == 11.0


def test_no_client_is_imported_to_recognise_one():
    code = ("import sys, admission.errors as e\n"
            "assert e.Refused.from_exception(ValueError('x')) is None\n"
            "try:\n    e.Refused.from_response(object())\nexcept TypeError:\n    pass\n"
            "print(sorted(m for m in ('openai', 'anthropic', 'httpx', 'httpx2', 'requests') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["[]"], out.stderr


def test_at_passes_through_and_a_refusal_pickles_whole():
    import pickle

    refusal = Refused.from_response(httpx_response(429, {"retry-after": "3"}), at=123.5)
    again = pickle.loads(pickle.dumps(refusal))
    assert (again.status, again.retry_after, again.at) == (429, 3.0, 123.5)
