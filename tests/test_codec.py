"""The task/result codec (fleet.codec): every result status decodes to its outcome;
a task body is refused, typed, when it cannot be pickled or is too large."""
from __future__ import annotations

import pickle
import threading

import pytest

from fleet import codec
from fleet import messages as M
from fleet.unit import PayloadTooLarge, PayloadUnpicklable


def _dumps(v) -> bytes:
    return pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)


@pytest.mark.parametrize(
    "status, body, kind, reason, value",
    [
        (M.ST_SOLVED, _dumps({"a": 1}), "solved", None, {"a": 1}),
        (M.ST_SOLVED, b"not a pickle", "failed", "ResultError", None),
        (M.ST_SUPPRESSED, b"duplicate", "suppressed", None, None),
        (M.ST_RESULT_ERROR, b"too big", "failed", "ResultError", None),
        (M.ST_START_REFUSED, b"refused", "failed", "FsmRefused", None),
        (M.ST_COMPLETION_REFUSED, b"refused", "failed", "FsmRefused", None),
        (M.ST_HELD_AT_CLOSE, b"closing", "failed", "Shutdown", None),
        (250, b"who knows", "failed", "LaneDeath", None),
        (M.ST_CHUNK, _dumps(([1, 2], {})), "solved", None, ([1, 2], {})),
        (M.ST_CHUNK, _dumps(([1, None], {1: (M.ST_SUPPRESSED, "dup")})), "suppressed", None,
         ([1, None], {1: (M.ST_SUPPRESSED, "dup")})),
        (M.ST_CHUNK, _dumps(([None, 2], {0: (M.ST_HANDLER_ERROR, ("tb", None))})), "failed", "HandlerError",
         ([None, 2], {0: (M.ST_HANDLER_ERROR, ("tb", None))})),
    ],
)
def test_each_result_status_decodes_to_its_outcome(status, body, kind, reason, value):
    outcome, got, original = codec.result_outcome(status, memoryview(body))
    assert (outcome.kind, outcome.reason, got, original) == (kind, reason, value, None)


def test_a_handler_error_keeps_its_traceback_and_original_exception():
    outcome, value, original = codec.result_outcome(M.ST_HANDLER_ERROR, _dumps(("Traceback...", KeyError("k"))))
    assert (outcome.kind, outcome.reason, outcome.detail, value) == ("failed", "HandlerError", "Traceback...", None)
    assert isinstance(original, KeyError) and original.args == ("k",)


def test_a_task_body_round_trips_and_a_client_pickled_payload_stays_pickled():
    body = codec.task_body("r", [1, 2], "k", "lane", "req", pickled_payload=None, limit=1 << 20)
    assert pickle.loads(body) == ([1, 2], "k", "lane", "req")
    body = codec.task_body("r", None, None, None, None, pickled_payload=_dumps("remote"), limit=1 << 20)
    payload, *_ = pickle.loads(body)
    assert type(payload).__name__ == "_Pickled" and payload.load() == "remote"


def test_a_task_body_is_refused_typed():
    with pytest.raises(PayloadUnpicklable, match="role 'r'.*lock"):
        codec.task_body("r", threading.Lock(), None, None, None, pickled_payload=None, limit=1 << 20)
    with pytest.raises(PayloadTooLarge, match="limits.max_payload_bytes is 100"):
        codec.task_body("r", b"x" * 200, None, None, None, pickled_payload=None, limit=100)


def test_a_relayed_value_stays_pickled_for_the_client():
    body = _dumps({"a": 1})
    outcome, value, _ = codec.result_outcome(M.ST_SOLVED, memoryview(body), relay=True)
    assert outcome.kind == "solved" and type(value).__name__ == "_Pickled" and value.data == body
    assert value.load() == {"a": 1}
