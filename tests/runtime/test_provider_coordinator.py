"""The provider admission's coordinator API on a real fleet: `Fleet.admission_allowance`,
`Fleet.admission_plan`, `Fleet.admission_starving` (and `Client`'s, through fleetd's control
ops). Questions only: they read the admission on the supervisor's loop and seat nothing.
Only the admission's clock is fake."""
from __future__ import annotations

import os

import pytest

import fleet
from admission.pool import ManualClock
from fleet.runtime.provider_gate import BadPlan
from admission.route import Route
from tests.daemons import BOUND_S, Fleetd, to_toml
from tests.uids import as_nobody

from ..admission_catalog import GLM_AZ, GLM_OR, ONE_REFUSAL, T_1447, catalog
from ..fleets import config, running, unique_name
from ..runtime.test_provider_admission import DAILY, _bulkhead, _eventually, _one_outcome_each, _refusal, _roles, _waiting


def _fleet(name, clock, **admission):
    cfg = config(name, _roles())
    cfg["admission"] = catalog(**{**ONE_REFUSAL, **admission})
    return running(cfg, admission_clock=clock)


def test_plan_counts_what_would_start_honouring_backoff_alternatives_and_pins_and_seats_nothing():
    clock = ManualClock(wall=T_1447, mono=1000.0)
    with _fleet(unique_name("coordplan"), clock) as f:
        assert f.admission_plan("review", GLM_OR, 5) == 5  # nothing holds the pool back
        assert f.status()["admission"]["bulkheads"] == []  # a question seats nothing
        _refusal(f.submit("llm", {"openrouter-eu": [429, "slow down", 5]}, route=GLM_OR))
        assert f.admission_plan("review", GLM_OR, 5) == 5  # they would move to the same model elsewhere
        assert f.admission_plan("review", GLM_OR, 5, pinned=True) == 0  # a hard pin waits out the backoff
        assert f.admission_plan("coordinator", GLM_OR, 5) == 0  # so does a pinned lane
        assert f.admission_plan("review", GLM_AZ, 5, pinned=True) == 5  # control: the other pool is open
        assert f.admission_plan("review", GLM_OR, 0) == 0
        row = _bulkhead(f, GLM_OR)
        assert (row["running"], row["waiting"]) == (0, 0)
        clock.advance(5)
        assert f.admission_plan("review", GLM_OR, 5, pinned=True) == 5  # the backoff ended
        _one_outcome_each(f)


def test_allowance_is_zero_only_while_every_route_of_the_lanes_work_is_held_back():
    clock = ManualClock(wall=T_1447, mono=1000.0)
    with _fleet(unique_name("coordallow"), clock) as f:
        assert f.admission_allowance("coordinator") is None  # no work: nothing to hold
        _refusal(f.submit("llm", {"openrouter-eu": [429, "slow down", 5]}, route=GLM_OR))
        waiting = f.submit("llm", {}, route=GLM_OR, lane="coordinator")  # the lane is pinned: it waits
        _eventually(lambda: waiting.unit_id in _waiting(f))
        assert f.admission_allowance("coordinator") == 0
        assert f.admission_allowance("review") is None  # control: another lane asks for nothing held
        clock.advance(5)
        assert waiting.result(60) == str(GLM_OR)
        assert f.admission_allowance("coordinator") is None
        _one_outcome_each(f)


def test_starving_lists_a_closed_provider_with_work_waiting_then_pinned_waits_past_starved_after():
    clock = ManualClock(wall=T_1447, mono=1000.0)
    with _fleet(unique_name("coordstarve"), clock, starved_after=900, daily_limit_probe_every=3600) as f:
        assert f.admission_starving() == []
        _refusal(f.submit("llm", {"openrouter-eu": DAILY}, route=GLM_OR))
        assert f.admission_starving() == []  # closed, but nothing waits for it
        pinned = f.submit("llm", {}, route=GLM_OR, pinned=True)
        _eventually(lambda: pinned.unit_id in _waiting(f))
        (closed,) = f.admission_starving()
        assert (closed["kind"], closed["provider"], closed["daily"], closed["waiting"]) == (
            "provider-closed", "openrouter-eu", True, 1)
        clock.advance(901)
        kinds = [s["kind"] for s in f.admission_starving()]
        assert kinds == ["provider-closed", "pinned"]
        assert f.admission_starving()[1]["unit"] == pinned.unit_id
        f.admission_reopen("openrouter-eu")
        assert pinned.result(60) == str(GLM_OR)
        assert f.admission_starving() == []


def test_bad_questions_are_refused_typed_and_change_nothing():
    clock = ManualClock(wall=T_1447, mono=1000.0)
    with _fleet(unique_name("coordbad"), clock) as f:
        for args, match in [
            (("review", ("glm", "x"), 1), "fleet.Route"),
            (("review", Route("nope", "openrouter-eu"), 1), "not in the declared catalog"),
            (("review", GLM_OR, -1), "wanted"),
            (("review", GLM_OR, True), "wanted"),
            (("review", GLM_OR, 1.5), "wanted"),
            ((7, GLM_OR, 1), "lane"),
        ]:
            with pytest.raises(BadPlan, match=match):
                f.admission_plan(*args)
        with pytest.raises(BadPlan, match="pinned"):
            f.admission_plan("review", GLM_OR, 1, pinned="yes")
        with pytest.raises(BadPlan, match="lane"):
            f.admission_allowance(["review"])
        assert isinstance(BadPlan("x"), fleet.FleetError)
        assert f.status()["admission"]["bulkheads"] == [] and f.ledger()["submitted"] == 0


NOBODY = 65534
P1, P2 = fleet.Route("m1", "p1"), fleet.Route("m1", "p2")


def _daemon(name: str) -> Fleetd:
    roles = {"llm": {"kind": "pooled", "handler": "tests.provider_handlers:call", "slots": 2, "peak_cpus": 1}}
    d = Fleetd(name, {}, args=("--socket-group", str(NOBODY)))
    d.write_config({}, text=to_toml({"fleet": {"name": name}, "roles": roles}) + (
        '[admission]\nprobe_every = 3600\nmax_refusals = 1\n'
        '[admission.alternatives]\nm1 = ["m1@p2"]\n'
        '[admission.providers.p1]\nmodels = ["m1"]\n'
        '[admission.providers.p2]\nmodels = ["m1"]\n'
        '[admission.lanes.stay]\npinned = true\n'))
    return d


def test_the_coordinator_api_over_fleetd_answers_any_reader(fleet_name):
    """Questions over the socket: the owner and a peer of the socket group get the same answers
    (they read, they seat nothing); a bad route is refused typed."""
    with _daemon(fleet_name) as d:
        with d.connect() as client:
            with pytest.raises(fleet.UnitFailed):
                client.submit("llm", {"p1": [403, "Key limit exceeded (daily limit)", None]}, route=P1).result(BOUND_S)
            pinned = client.submit("llm", {}, route=P1, lane="stay")
            try:
                _ask(d, client)
            finally:  # the pinned unit must end, or closing the client waits for it
                d.ctl("admission", "reopen", "p1")
            assert pinned.result(BOUND_S) == str(P1)


def _ask(d, client):
    from fleet.service.control import ProtocolError, RemoteError

    assert client.admission_plan("stay", P1, 3) == 0
    assert client.admission_plan(None, P1, 3) == 3  # it would move to p2
    assert client.admission_allowance("stay") == 0 and client.admission_allowance(None) is None
    (closed,) = client.admission_starving()
    assert (closed["kind"], closed["provider"], closed["waiting"]) == ("provider-closed", "p1", 1)
    with pytest.raises(RemoteError) as info:
        client.admission_plan(None, fleet.Route("m9", "p1"), 1)
    assert info.value.type == "BadPlan"
    with pytest.raises(ProtocolError):
        client.admission_plan(None, P1, -1)
    with pytest.raises(BadPlan):
        client.admission_plan(None, ("m1", "p1"), 1)

    def reader():
        c = d.connect()
        try:
            return [c.admission_plan("stay", P1, 3), c.admission_allowance("stay"), [s["kind"] for s in c.admission_starving()]]
        finally:
            c.close()

    os.environ["RUNTIME_DIRECTORY"] = d.runtime_dir
    try:
        assert as_nobody(reader, groups=(NOBODY,)) == [0, 0, ["provider-closed"]]
    finally:
        del os.environ["RUNTIME_DIRECTORY"]
