"""The operator's façade on an embedded Fleet: the control ops fleetd serves run, as the
same classes, against `Fleet.operations`, each a command on the fleet's loop."""
from __future__ import annotations

import logging
import os
import tempfile
import time

import pytest

import fleet as fleet_mod

from fleet.service.control.ops import CANCEL_STATES, OPS, Operations
from tests.daemons import wait_until
from tests.fleets import config, role, running


def op(fleet, name: str, **args):
    """Run op ``name`` as fleetd's server would: validated, then executed against the façade."""
    spec = OPS.get(name)
    return spec.execute(fleet.operations, spec.validate(args))


@pytest.fixture
def fleet(fleet_name):
    # One slot, nothing sent ahead: a unit held running keeps the next one queued.
    with running(config(fleet_name, {"one": role("wait_for_file", slots=1, io_bound=True, peak_cpus=0,
                                                 lookahead=0)})) as f:
        yield f


def test_the_embedded_fleet_offers_every_operation_of_the_facade(fleet):
    assert isinstance(fleet.operations, Operations)
    facade = {name for name in dir(Operations) if not name.startswith("_")}
    assert facade <= {name for name in dir(type(fleet.operations)) if not name.startswith("_")}


def test_cancel_through_the_op_a_queued_a_running_an_ended_and_an_unknown_unit(fleet):
    gate = os.path.join(tempfile.mkdtemp(prefix="op-", dir="/tmp"), "go")
    try:
        first = fleet.submit("one", (gate, 2))
        wait_until(lambda: fleet._sup.queued("one") == 0 and fleet.status()["census"][0]["state"] == "Running",
                   "the first unit to run")
        second = fleet.submit("one", (None, 3))
        assert op(fleet, "cancel", unit=second.unit_id) == {"unit": second.unit_id, "cancelled": True,
                                                             "state": "cancelled", "children": 0}
        assert second.cancelled()
        assert op(fleet, "cancel", unit=first.unit_id)["state"] == "running"
        open(gate, "w").close()
        assert first.result(30) == 4
        assert op(fleet, "cancel", unit=first.unit_id)["state"] == "ended"
        assert op(fleet, "cancel", unit=first.unit_id + 1000)["state"] == "unknown"
        wait_until(lambda: fleet.ledger()["inflight"] == 0, "the cancelled unit to be counted")
        assert fleet.ledger()["failed_by_reason"] == {"Cancelled": 1}
    finally:
        if os.path.exists(gate):
            os.unlink(gate)
        os.rmdir(os.path.dirname(gate))
    assert set(CANCEL_STATES) == {"cancelled", "running", "ended", "unknown"}


def test_a_drain_refuses_new_submits_while_the_running_and_queued_units_finish(fleet, caplog, tmp_path):
    gate = str(tmp_path / "go")
    try:
        running_unit = fleet.submit("one", (gate, 2))
        wait_until(lambda: fleet.status()["census"][0]["state"] == "Running", "the first unit to run")
        queued = fleet.submit("one", (None, 3))
        with caplog.at_level(logging.INFO, logger="fleet.runtime.loop"):
            before = time.time()
            state = fleet.drain()  # the embedded face's method, made from the op
            after = time.time()
        assert state["draining"] is True and state["owed"] == 2
        assert before <= state["since"] <= after and state["since_utc"].endswith("Z")
        assert any("draining" in r.getMessage() for r in caplog.records)
        # the status document (what fleetctl status --json prints) shows it, read from the table
        assert fleet.status()["draining"] == {"since": pytest.approx(state["since"], abs=1e-6),
                                              "since_utc": state["since_utc"]}
        with pytest.raises(fleet_mod.Draining) as refused:
            fleet.submit("one", (None, 4))
        assert isinstance(refused.value, fleet_mod.SubmitRefused) and refused.value.retryable
        assert refused.value.since == state["since"] and "draining" in str(refused.value)
        with pytest.raises(fleet_mod.Draining):
            list(fleet.map("one", [(None, 5)]))
        assert fleet.drain()["since"] == state["since"]  # draining again keeps the first start
        assert fleet.ledger()["submitted"] == 2  # nothing of the refused submits was queued
        open(gate, "w").close()
        assert running_unit.result(30) == 4 and queued.result(30) == 9  # queued units still run
        wait_until(lambda: fleet.drain_state()["owed"] == 0, "nothing owed")
        with caplog.at_level(logging.INFO, logger="fleet.runtime.loop"):
            assert fleet.resume() == {"draining": False, "since": None, "since_utc": None, "owed": 0}
        assert any("resumed" in r.getMessage() for r in caplog.records)
        assert fleet.status()["draining"] is None
        assert fleet.submit("one", (None, 6)).result(30) == 36
    finally:
        open(gate, "a").close()  # a failed check never leaves the fleet's shutdown waiting on the held unit


def test_drain_and_resume_through_the_ops(fleet):
    drained = op(fleet, "drain")
    assert drained["draining"] is True and drained["owed"] == 0
    assert op(fleet, "drain_state") == drained
    with pytest.raises(fleet_mod.Draining):
        fleet.submit("one", (None, 6))
    assert op(fleet, "resume")["draining"] is False
    assert fleet.submit("one", (None, 6)).result(30) == 36
    assert op(fleet, "ledger")["solved"] == 1 == fleet.ledger()["solved"]


def test_an_executors_fleet_drain_refuses_its_submits_too():
    """fleet.Executor has no drain of its own; its fleet's drain refuses submit and map with
    Draining (a SubmitRefused, not the RuntimeError of a shut executor: it is retryable)."""
    with fleet_mod.Executor(max_workers=1) as ex:
        ex.fleet.drain()
        with pytest.raises(fleet_mod.Draining):
            ex.submit(abs, -1)
        with pytest.raises(fleet_mod.Draining):
            list(ex.map(abs, [-1]))
        ex.fleet.resume()
        assert ex.submit(abs, -1).result(30) == 1


def test_posture_ops_are_the_fleets_own(fleet):
    shown = op(fleet, "posture_show")
    assert shown == fleet.posture_show()
    changed = op(fleet, "posture_set", patch={"cordon_enter_events": 5})
    assert changed["policy"]["cordon_enter_events"] == 5 == fleet.posture_show()["policy"]["cordon_enter_events"]
    assert op(fleet, "posture_release", cause="operator")["released"] is False


def test_a_submit_has_one_signature_that_every_face_takes():
    """The unit's arguments are written once (`UNIT_ARGS`, with their defaults): the runtime's
    submit takes them by name, and the embedded fleet's, the client's and the wire's submit
    are made of them."""
    import inspect

    from fleet import Client, Fleet
    from fleet.runtime.submit import UNIT_ARGS, WAIT_ARGS, Submitter

    runtime = inspect.signature(Submitter.submit).parameters
    assert {name: runtime[name].default for name in UNIT_ARGS} == UNIT_ARGS
    assert {name: runtime[name].default for name in WAIT_ARGS} == WAIT_ARGS
    assert all(runtime[name].kind is inspect.Parameter.KEYWORD_ONLY for name in [*UNIT_ARGS, *WAIT_ARGS])
    embedded = inspect.signature(Fleet.submit).parameters
    assert list(embedded) == ["self", "role", "payload", *UNIT_ARGS, *WAIT_ARGS]
    assert {name: embedded[name].default for name in UNIT_ARGS} == UNIT_ARGS
    assert list(inspect.signature(Client.submit).parameters) == ["self", "role", "payload", *UNIT_ARGS]
    schema = OPS.get("submit").schema
    assert {name: schema[name].default for name in UNIT_ARGS} == UNIT_ARGS


@pytest.mark.parametrize("face", ["Fleet", "Client"])
def test_a_face_refuses_a_keyword_its_submit_does_not_take(face):
    import fleet

    # `chunk` is the runtime's own (map's chunks), never a caller's: refused before anything is touched.
    with pytest.raises(TypeError, match="'chunk'"):
        getattr(fleet, face).submit(object(), "role", 1, chunk=True)
    if face == "Client":
        with pytest.raises(TypeError, match="'block'"):  # a served submit never waits for room
            fleet.Client.submit(object(), "role", 1, block=False)
