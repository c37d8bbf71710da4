"""`fleetctl why` and the client's `why` against a real fleetd: a running unit names its
worker's real pid, a queued one its position and what holds it, an ended one its outcome;
an unknown id is a typed error (exit 65); `fleetctl status` lists the oldest waiting units
with the same text."""
from __future__ import annotations

import json
import os
import tempfile

import pytest

from fleet.rules import why as rule
from tests.daemons import BOUND_S, served_fleetd, wait_until
from tests.fleets import role

EXIT_UNKNOWN_UNIT = 65


@pytest.fixture(scope="module")
def served():
    roles = {"one": {**role("noop", slots=1, io_bound=True, peak_cpus=0, lookahead=0),
                     "handler": "tests.why_handlers:held_pid"}}
    with served_fleetd("y", roles) as d:
        yield d


@pytest.fixture
def held(served):
    """(client, the unit held running, three queued behind it, release)."""
    directory = tempfile.mkdtemp(prefix="wy-", dir="/tmp")
    gate = os.path.join(directory, "go")
    with served.connect() as client:
        first = client.submit("one", (gate, 1))
        wait_until(lambda: client.why(first.unit_id)["state"] == rule.RUNNING, "the first unit to run")
        queued = [client.submit("one", (None, n)) for n in (2, 3, 4)]
        try:
            yield client, first, queued, lambda: open(gate, "w").close()
        finally:
            if os.path.exists(gate):
                os.unlink(gate)
            os.rmdir(directory)  # a unit still held ends now
            first.result(BOUND_S)
            for u in queued:
                u.result(BOUND_S)


def test_fleetctl_why_names_the_running_worker_and_the_queue_and_the_outcome(served, held):
    client, first, queued, release = held
    out = served.ctl("why", str(first.unit_id), "--json")
    assert out.returncode == 0, out.stderr
    running = json.loads(out.stdout)
    assert set(running) == set(rule.KEYS) and running["state"] == rule.RUNNING
    pid = running["granted"]["pid"]

    out = served.ctl("why", str(queued[2].unit_id))
    assert out.returncode == 0, out.stderr
    ids = [u.unit_id for u in queued]
    assert out.stdout == (f"unit {ids[2]} is queued in role one at position 3: 2 unit(s) ahead of it "
                          f"({ids[0]}, {ids[1]}); the head of the queue waits for a slot: role one holds 1 of its "
                          f"1 slots (running: unit {first.unit_id})\n")
    assert client.why(ids[2])["text"] + "\n" == out.stdout  # the client's answer is the same

    # status lists the oldest waiting units, with the same reason text, oldest first
    status = served.ctl_json("status")
    assert [w["unit"] for w in status["waiting"]["units"]] == ids
    assert [w["text"] for w in status["waiting"]["units"]] == [client.why(u)["text"] for u in ids]
    text = served.ctl("status").stdout
    assert "waiting   the oldest 3" in text and f"  {client.why(ids[0])['text']}" in text

    release()
    assert first.result(BOUND_S) == (1, pid)  # the pid it named is the worker that ran it
    wait_until(lambda: client.why(ids[2])["state"] == rule.ENDED, "the last unit to end")
    out = served.ctl("why", str(ids[2]))
    assert out.stdout == f"unit {ids[2]} has ended: solved\n"


def test_an_unknown_id_exits_65_naming_it_and_the_client_raises_unknown_unit(served):
    with served.connect() as client:
        done = client.submit("one", (None, 5))
        done.result(BOUND_S)
        never = done.unit_id + 1_000_000
        out = served.ctl("why", str(never))
        assert out.returncode == EXIT_UNKNOWN_UNIT and out.stdout == ""
        assert f"UnknownUnit: unit {never}: no unit of fleet" in out.stderr
        with pytest.raises(rule.UnknownUnit) as info:
            client.why(never)
        assert info.value.unit_id == never and str(never) in str(info.value)


@pytest.mark.parametrize("word", ["0", "-4", "seven"])
def test_a_malformed_unit_id_exits_2_before_anything_is_sent(served, word):
    out = served.ctl("why", word)
    assert out.returncode == 2 and out.stdout == "", out.stderr
