"""The provider gate's pure parts: what each outcome tells a pool, pool names, the closure
file's default place, and when the loop wakes waiting units (fake clocks)."""
from __future__ import annotations

import pytest

from admission import state as T
from admission.pool import ManualClock
from fleet.runtime.config import load_config
from fleet.rules.outcomes import Refused
from fleet.runtime.provider_gate import (
    BadPool,
    ProviderGate,
    default_closure_file,
    parse_pool,
    signal_of,
)
from fleet.rules.unit import Outcome
from fleet.worker import codec
from fleet.runtime.future import UnitFuture
from fleet.runtime.gates import GO, HELD
from fleet.runtime.submit import LoopUnit

from ..admission_catalog import GLM_OR, T_1447, catalog


@pytest.mark.parametrize("outcome, original, kind, refusal", [
    (Outcome("solved"), None, T.CLEAN, None),
    (Outcome("suppressed", None, "dup"), None, T.CLEAN, None),
    (Outcome("failed", "Refused", "429"), Refused(429, retry_after=3), T.REFUSED, T.RATE_LIMIT),
    (Outcome("failed", "Refused", "403"), Refused(403, "Key limit exceeded (daily limit)"), T.REFUSED, T.DAILY_LIMIT),
    (Outcome("failed", "Refused", "402"), Refused(402), T.REFUSED, T.CREDIT),
    (Outcome("failed", "HandlerError", "tb"), KeyError("k"), T.ERROR, None),
    (Outcome("failed", "Timeout"), None, T.STALL, None),
    (Outcome("failed", "LaneDeath"), None, T.STALL, None),
    (Outcome("failed", "Shutdown"), None, T.STALL, None),
    (Outcome("failed", "Cancelled"), None, T.STALL, None),
    (Outcome("failed", "LeaseExpired"), None, T.STALL, None),
    (Outcome("failed", "LeaseDenied"), None, T.STALL, None),
    (Outcome("failed", "LeasePreempted"), None, T.STALL, None),
])
def test_each_outcome_is_its_signal(outcome, original, kind, refusal):
    signal = signal_of(outcome, original, cost=0.5)
    assert (signal.kind, signal.refusal) == (kind, refusal)
    if kind == T.CLEAN:
        assert signal.cost == 0.5
    if refusal == T.RATE_LIMIT:
        assert signal.retry_after == 3.0


@pytest.mark.parametrize("text, scope", [("p", ("p", None)), ("p/key-a", ("p", "key-a"))])
def test_a_pool_is_a_provider_or_one_key(text, scope):
    assert parse_pool(text) == scope


@pytest.mark.parametrize("text", ["", " ", "m@p", "p/", "/k", "p/k/x", None])
def test_a_malformed_pool_is_refused(text):
    with pytest.raises(BadPool):
        parse_pool(text)


def test_the_closure_file_lives_in_the_state_directory():
    assert str(default_closure_file("demo", {"STATE_DIRECTORY": "/s/a:/s/b"}, euid=1000)) == "/s/a/demo.closures.json"
    assert str(default_closure_file("demo", {}, euid=0)) == "/var/lib/fleet/demo.closures.json"
    assert str(default_closure_file("demo", {"XDG_STATE_HOME": "/x"}, euid=1000)) == "/x/fleet/demo.closures.json"


class _Scaled(ManualClock):
    scale = 100.0


def _gate(clock):
    return ProviderGate(load_config({"admission": catalog(alternatives={"glm-5.3-review": []})}, env={}).admission,
                        clock=clock)


def _unit(unit_id: int, route, gate, payload=b"payload") -> LoopUnit:
    """A unit as the loop hands it to the gate: its route and ask as `submit` checked them."""
    ask = {"lane": None, "severity": None, "pinned": False, "parent": None, "tag": None, "age": 0.0}
    ask["checked"] = gate.check(route, **ask)
    return LoopUnit(unit_id, 0, None, 0, future=UnitFuture(), body=payload, flags=0, timeout=None, route=route,
                    ask=ask)


def test_the_loop_wakes_when_a_hold_ends_in_real_seconds_of_a_scaled_clock():
    clock = _Scaled(wall=T_1447, mono=0.0)
    gate = _gate(clock)
    assert gate.seconds_to_wake(0.1) == 0.1 and not gate.due()  # nothing waits: the idle tick
    first, second = _unit(1, GLM_OR, gate), _unit(2, GLM_OR, gate)
    assert gate.admit(first) == GO
    gate.started(first)
    assert gate.ended(first, Outcome("failed", "Refused"), Refused(429, retry_after=20)) == HELD  # waits again
    assert gate.admit(second) == HELD
    assert gate.seconds_to_wake(1.0) == pytest.approx(0.2)  # 20 s of a clock 100 x faster
    assert not gate.due()
    clock.advance(20)
    assert gate.due() and gate.seconds_to_wake(1.0) == 0.0
    woken = gate.wake()
    assert {u.unit_id for u in woken} == {1, 2} and not gate.due()
    assert codec.split_route(second.body) == (GLM_OR, b"payload")  # the route travels with its task


def test_a_unit_counts_as_running_on_its_pool_only_once_it_starts():
    gate = _gate(ManualClock(wall=T_1447, mono=0.0))
    unit = _unit(1, GLM_OR, gate)

    def running():
        return sum(row["running"] for row in gate.census()["bulkheads"])

    assert gate.admit(unit) == GO  # admitted: it may still wait for its lease or a slot
    assert running() == 0
    gate.started(unit)
    assert running() == 1
    assert gate.ended(unit, Outcome("solved")) is None
    assert running() == 0
    never = _unit(2, GLM_OR, gate)
    assert gate.admit(never) == GO
    assert gate.ended(never, Outcome("failed", "Shutdown")) is None  # it never ran: withdrawn, no signal
    assert running() == 0 and gate.census()["bulkheads"][0]["successes"] == 1


class _HostTied(ManualClock):
    """A fake clock that, like the host's, can place a host monotonic instant: host instant
    `HOST_0` is its mono 0."""

    HOST_0 = 50_000.0

    def mono_of(self, host_mono):
        return host_mono - self.HOST_0


def test_a_refused_unit_waits_out_the_backoff_from_the_instant_the_worker_met_the_429():
    clock = _HostTied(wall=T_1447, mono=0.0)
    gate = _gate(clock)
    first = _unit(1, GLM_OR, gate)
    gate.admit(first)
    gate.started(first)
    clock.advance(8)  # the 429 came at mono 5 (host instant HOST_0 + 5); its outcome is heard at 8
    assert gate.ended(first, Outcome("failed", "Refused"), Refused(429, retry_after=20, at=_HostTied.HOST_0 + 5)) == HELD
    assert gate.waiting(1)["until"] == T_1447 + 25
    assert gate.seconds_to_wake(100.0) == 17.0
    clock.advance(17)
    assert gate.due() and gate.wake() == [first]
    # control: a clock that cannot place host instants counts the backoff from the report
    clock = ManualClock(wall=T_1447, mono=0.0)
    gate = _gate(clock)
    first = _unit(1, GLM_OR, gate)
    gate.admit(first)
    gate.started(first)
    clock.advance(8)
    gate.ended(first, Outcome("failed", "Refused"), Refused(429, retry_after=20, at=_HostTied.HOST_0 + 5))
    assert gate.waiting(1)["until"] == T_1447 + 28


def test_an_operator_close_and_reopen_name_known_pools_only():
    clock = ManualClock(wall=T_1447, mono=0.0)
    gate = _gate(clock)
    with pytest.raises(BadPool, match="unknown pool 'nope'"):
        gate.close("nope", T_1447 + 60)
    with pytest.raises(BadPool, match="not in the future"):
        gate.close("openrouter-eu", T_1447 - 1)
    assert gate.census()["closures"] == []
    gate.close("openrouter-eu/key-a", T_1447 + 60)
    (closure,) = gate.census()["closures"]
    assert (closure["credential"], closure["cause"]) == ("key-a", "operator")
    assert gate.reopen("openrouter-eu/key-a") == {"pool": "openrouter-eu/key-a", "reopened": True}
    assert gate.reopen("openrouter-eu/key-a")["reopened"] is False
