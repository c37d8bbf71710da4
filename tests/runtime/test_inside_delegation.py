"""Provider children submitted from inside a running unit are delegated (000 §9, issue 47):
``parent=`` is the running unit, so they pass their pool's backoff at once on their own
route, and never a closure or a hard pin (fleet.runtime.provider_gate, DESIGN.md §6
"Delegated"), while their parent, itself a provider round, holds its seat. Real fleets,
the admission's clock a ManualClock.
"""
from __future__ import annotations

import time

import fleet
from admission.pool import ManualClock
from admission.route import Route
from tests.admission_catalog import GLM_OR, GPT_AZ, T_1447, catalog
from tests.fleets import config, running, unique_name
from tests.runtime.test_provider_admission import _bulkhead, _eventually, _one_outcome_each, _waiting

WAIT_S = 60
KEY_A = Route(*GLM_OR[:2], "key-a")


def _fleet(clock, **admission):
    roles = {
        "deleg": {"kind": "pooled", "handler": "tests.inside_handlers:delegate", "slots": 1, "queue_bound": 100},
        "call": {"kind": "pooled", "handler": "tests.provider_handlers:call", "slots": 2, "queue_bound": 100},
    }
    cfg = config(unique_name("inside"), roles)
    cfg["admission"] = catalog(max_refusals=1, **admission)
    return running(cfg, admission_clock=clock)


def _refuse(f, route, how) -> None:
    try:
        f.submit("call", {str(route): how}, route=route).result(WAIT_S)
    except fleet.UnitFailed as exc:
        assert exc.reason == "Refused"
    else:
        raise AssertionError("the provider was to refuse it")


def test_children_from_inside_pass_a_backoff_at_once_but_never_a_hard_pin(tmp_path):
    clock = ManualClock(wall=T_1447, mono=1000.0)
    with _fleet(clock) as f:
        _refuse(f, GLM_OR, [429, "slow down", 30])  # the pool backs off for 30 s
        assert _bulkhead(f, GLM_OR)["state"] == "backoff"
        d = tmp_path / "free"
        d.mkdir()
        assert f.submit("deleg", (2, tuple(GLM_OR), False, str(d)), route=GPT_AZ).result(WAIT_S) == [str(GLM_OR)] * 2
        assert _bulkhead(f, GLM_OR)["delegated_total"] == 2  # through the backoff, delegated, at once
        d = tmp_path / "pinned"
        d.mkdir()
        pinned = f.submit("deleg", (1, tuple(GLM_OR), True, str(d)), route=GPT_AZ)  # a pinned child waits out the backoff
        _eventually(lambda: len(_waiting(f)) == 1)
        assert not pinned.done()
        clock.advance(30)
        assert pinned.result(WAIT_S) == [str(GLM_OR)]
        _one_outcome_each(f)


def test_children_from_inside_are_held_by_a_closure_until_it_ends(tmp_path):
    clock = ManualClock(wall=T_1447, mono=1000.0)
    with _fleet(clock, closed_for=600) as f:
        _refuse(f, KEY_A, [402, "no credit", None])  # the key is closed for 600 s
        (closure,) = f.status()["admission"]["closures"]
        assert closure["credential"] == "key-a"
        parent = f.submit("deleg", (2, tuple(KEY_A), True, str(tmp_path)), route=GPT_AZ)
        _eventually(lambda: len(_waiting(f)) == 2)  # both children held, their parent waiting on them
        time.sleep(0.3)  # the loop looks at its gates at least every 0.1 s: still held
        assert len(_waiting(f)) == 2 and not parent.done()
        clock.advance(600)
        assert parent.result(WAIT_S) == [str(KEY_A)] * 2
        _one_outcome_each(f)
