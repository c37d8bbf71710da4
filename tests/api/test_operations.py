"""The operator's façade on an embedded Fleet: the control ops fleetd serves run, as the
same classes, against `Fleet.operations`, each a command on the fleet's loop."""
from __future__ import annotations

import os
import tempfile

import pytest

from fleet.runtime.facade import CANCEL_STATES, Operations
from fleet.service.control.ops import OPS
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
                                                             "state": "cancelled"}
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


def test_drain_and_resume_through_the_ops(fleet):
    assert op(fleet, "drain") == {"draining": True}
    held = fleet.submit("one", (None, 6))
    wait_until(lambda: fleet._sup.queued("one") == 1, "the unit to wait in the drained queue")
    assert not held.done()
    assert op(fleet, "resume") == {"draining": False}
    assert held.result(30) == 36
    assert op(fleet, "ledger")["solved"] == 1 == fleet.ledger()["solved"]


def test_posture_ops_are_the_fleets_own(fleet):
    shown = op(fleet, "posture_show")
    assert shown == fleet.posture_show()
    changed = op(fleet, "posture_set", patch={"cordon_enter_events": 5})
    assert changed["policy"]["cordon_enter_events"] == 5 == fleet.posture_show()["policy"]["cordon_enter_events"]
    assert op(fleet, "posture_release", cause="operator")["released"] is False
