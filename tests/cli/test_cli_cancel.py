"""fleetctl cancel UNIT against a real fleetd: a queued unit is cancelled (it never runs,
its client sees Cancelled, the ledger counts it), a running or ended one is left alone,
an unknown id says so, each with its exit code; another uid is refused and changes nothing."""
from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile

import pytest

import fleet
from fleet.cli import fleetctl
from fleet.rules.errors import EXIT_NO_PERMISSION
from tests.daemons import BOUND_S, outcome_of, running_slot, served_fleetd, wait_until
from tests.fleets import role
from tests.uids import NOBODY, as_nobody

#: The exit codes `fleetctl cancel` documents (sysexits: 65 is EX_DATAERR).
EXIT_CANCELLED, EXIT_NOT_CANCELLED, EXIT_UNKNOWN_UNIT = 0, 1, 65


@pytest.fixture(scope="module")
def served():
    # One slot, nothing sent ahead to it: a unit held running keeps the next one queued
    # behind it. The socket group lets uid 65534 reach the socket (and be refused the op,
    # not the connection).
    roles = {"one": role("wait_for_file", slots=1, io_bound=True, peak_cpus=0, lookahead=0)}
    with served_fleetd("x", roles, args=("--socket-group", str(NOBODY))) as d:
        yield d


@pytest.fixture
def held(served):
    """(client, running future, queued future, release): a unit held running until
    ``release()``, and one queued behind it."""
    directory = tempfile.mkdtemp(prefix="cx-", dir="/tmp")
    gate = os.path.join(directory, "go")
    with served.connect() as client:
        running = client.submit("one", (gate, 2))
        wait_until(lambda: running_slot(client), "the first unit to run")
        queued = client.submit("one", (None, 3))

        def release():
            open(gate, "w").close()

        try:
            yield client, running, queued, release
        finally:
            release()
            running.result(BOUND_S)
            os.unlink(gate)
            os.rmdir(directory)


def test_cancel_a_queued_unit_then_a_running_one_then_an_ended_one(served, held):
    client, running, queued, release = held
    cancelled_before = client.ledger()["failed_by_reason"].get("Cancelled", 0)

    out = served.ctl("cancel", str(queued.unit_id))
    assert (out.returncode, out.stdout) == (EXIT_CANCELLED, f"unit {queued.unit_id}: cancelled: it will not run; "
                                                            "its outcome is failed Cancelled\n"), out.stderr
    assert outcome_of(queued) == ("failed", "Cancelled")

    out = served.ctl("cancel", str(running.unit_id), "--json")
    assert out.returncode == EXIT_NOT_CANCELLED, out.stderr
    assert json.loads(out.stdout) == {"unit": running.unit_id, "cancelled": False, "state": "running",
                                      "children": 0}
    release()
    assert running.result(BOUND_S) == 4  # left alone: it ran to its own outcome
    # the loop records the cancelled unit as it comes up for the slot: once, never run
    wait_until(lambda: client.ledger()["inflight"] == 0, "the cancelled unit to be counted")
    assert client.ledger()["failed_by_reason"]["Cancelled"] == cancelled_before + 1

    out = served.ctl("cancel", str(running.unit_id))
    assert (out.returncode, out.stdout) == (EXIT_NOT_CANCELLED,
                                            f"unit {running.unit_id}: not cancelled: it has ended already\n")
    # the queued unit was cancelled once: asking again says it ended (with Cancelled)
    again = served.ctl("cancel", str(queued.unit_id), "--json")
    assert again.returncode == EXIT_NOT_CANCELLED and json.loads(again.stdout)["state"] == "ended"


def test_an_unknown_unit_id_says_so_and_exits_65(served):
    with served.connect() as client:
        solved = client.submit("one", (None, 5))
        assert solved.result(BOUND_S) == 25
        never = solved.unit_id + 1_000_000  # ids are handed out in order: this one is not yet
    out = served.ctl("cancel", str(never))
    assert (out.returncode, out.stdout) == (EXIT_UNKNOWN_UNIT, f"unit {never}: unknown: no unit of this fleet "
                                                               "has that id\n"), out.stderr
    as_json = served.ctl("cancel", str(never), "--json")
    assert as_json.returncode == EXIT_UNKNOWN_UNIT
    assert json.loads(as_json.stdout) == {"unit": never, "cancelled": False, "state": "unknown", "children": 0}


@pytest.mark.parametrize("word", ["0", "-4", "seven", "1.5", str(1 << 63)])
def test_a_malformed_unit_id_exits_2_before_anything_is_sent(served, word):
    out = served.ctl("cancel", word)
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert "unit" in out.stderr.lower()


def test_another_uid_is_refused_77_and_the_unit_stays_queued(served, held):
    client, running, queued, release = held
    unit_id = queued.unit_id  # here: the forked child has no thread of this client to wait for it

    def child():
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as out:
            code = fleetctl.main(["cancel", str(unit_id), "--name", served.name])
        return [code, out.getvalue(), err.getvalue()]

    os.environ["RUNTIME_DIRECTORY"] = served.runtime_dir  # for the forked child's fleetctl
    try:
        code, out, err = as_nobody(child)
    finally:
        del os.environ["RUNTIME_DIRECTORY"]
    assert code == EXIT_NO_PERMISSION and out == "", err
    assert "PermissionDenied" in err and "uid 65534" in err and "cancel" in err
    assert not queued.done()  # nothing changed: it still runs once the first one ends
    release()
    assert queued.result(BOUND_S) == 9


def test_a_client_future_cancel_is_the_same_op(served, held):
    client, running, queued, release = held
    assert queued.cancel() is True and queued.cancelled()
    assert client.cancel(running.unit_id) == {"unit": running.unit_id, "cancelled": False, "state": "running",
                                      "children": 0}
    assert isinstance(client, fleet.Client)
