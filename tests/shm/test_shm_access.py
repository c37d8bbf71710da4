"""Who may open a fleet's shared memory, tried as another user (uid 65534).

The data segment carries unit payloads and results: nobody but its owner (and root)
may open it, not even the readers' group. The table is owner-only unless a readers'
group is given (fleetd's ``--socket-group``); members of that group may read it --
``fleetctl status`` -- and never write it.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import uuid

import pytest

from fleet.shm import segments as shm
from fleet.shm import status
from fleet.cli import fleetctl
from fleet.shm.dataplane import KIND as DATA
from fleet.shm.dataplane import DataSegment
from fleet.rules.errors import EXIT_NO_PERMISSION, EXIT_OK, FleetError
from fleet.rules.roles import REFERENCE_ROLES
from fleet.shm.table import SlotTable, snapshot
from fleet.shm.table.segment import KIND as TABLE
from tests.daemons import BOUND_S, Fleetd, wait_until
from tests.fleets import role
from tests.uids import as_nobody, try_open, unused_gid


def _outcome(call) -> str | int:
    """What a call gave: its int result, "ok", or the name of the error it raised."""
    try:
        result = call()
    except (FleetError, OSError) as exc:
        return type(exc).__name__
    return result if isinstance(result, int) else "ok"


def _probe(name: str) -> dict:
    """Everything a local user might try on fleet `name`'s segments (runs in the child)."""
    table, data = shm.path(name, TABLE), shm.path(name, DATA)

    def attach_table_rw():
        SlotTable.attach(name, writable=True).close()

    def attach_data():
        DataSegment.attach(name).close()

    return {
        "table O_RDONLY": try_open(table, os.O_RDONLY),
        "table O_RDWR": try_open(table, os.O_RDWR),
        "data O_RDONLY": try_open(data, os.O_RDONLY),
        "data O_RDWR": try_open(data, os.O_RDWR),
        "snapshot": _outcome(lambda: snapshot.read(name)[0].n_slots),
        "attach table read-write": _outcome(attach_table_rw),
        "attach data": _outcome(attach_data),
    }


NOTHING = {
    "table O_RDONLY": "PermissionError",
    "table O_RDWR": "PermissionError",
    "data O_RDONLY": "PermissionError",
    "data O_RDWR": "PermissionError",
    "snapshot": "TableAccessDenied",
    "attach table read-write": "TableAccessDenied",
    "attach data": "DataSegmentAccessDenied",
}
READ_THE_TABLE = {**NOTHING, "table O_RDONLY": "ok", "snapshot": 4}


@contextlib.contextmanager
def _segments(name, readers_group=None):
    table = SlotTable.create(name, REFERENCE_ROLES, 4, readers_group=readers_group)
    data = DataSegment.create(name, 1, 4096, 4096)
    try:
        data.tasks(0).push(1, b"a payload only the owner may read")
        yield
    finally:
        data.close()
        table.close()


def test_without_a_readers_group_another_uid_opens_nothing(fleet_name):
    gid = unused_gid()
    with _segments(fleet_name):
        assert _probe(fleet_name)["snapshot"] == 4  # the owner reads it all
        assert as_nobody(lambda: _probe(fleet_name)) == NOTHING
        assert as_nobody(lambda: _probe(fleet_name), groups=[gid]) == NOTHING


def test_the_readers_group_reads_the_table_and_nothing_else(fleet_name):
    gid = unused_gid()
    with _segments(fleet_name, readers_group=gid):
        assert as_nobody(lambda: _probe(fleet_name), groups=[gid]) == READ_THE_TABLE
        assert as_nobody(lambda: _probe(fleet_name)) == NOTHING  # outside the group


def test_the_permission_error_says_who_may_read(fleet_name):
    with _segments(fleet_name):
        def child():
            try:
                snapshot.read(fleet_name)
            except FleetError as exc:
                return [type(exc).__name__, exc.exit_code, str(exc)]
            return "read"

        name, code, message = as_nobody(child)
    assert (name, code) == ("TableAccessDenied", EXIT_NO_PERMISSION)
    assert "uid 65534" in message and "mode 0600" in message and "--socket-group" in message


def _fleetctl(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = fleetctl.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_fleetctl_status_works_for_the_socket_group_and_payloads_stay_private(fleet_name):
    """End to end: fleetd with --socket-group; a unit's payload goes through the data plane;
    uid 65534 in that group runs `fleetctl status --json`, and cannot read the payload."""
    gid = unused_gid()
    marker = f"secret-{uuid.uuid4().hex}"
    with Fleetd(fleet_name, {"echo": role("echo", slots=1)}, args=("--socket-group", str(gid))) as d:
        with d.connect() as client:
            assert client.submit("echo", marker).result(BOUND_S) == marker
        data_path = shm.path(fleet_name, DATA)
        with open(data_path, "rb") as f:
            assert marker.encode() in f.read()  # what is at stake: the payload sits in the segment
        # the table's ledger is published by the supervisor loop: wait until it shows the unit
        wait_until(lambda: status.gather(fleet_name)["ledger"]["solved"] == 1, "the ledger to show the unit")

        def child():
            code, out, err = _fleetctl("status", "--json", "--name", fleet_name)
            return {"code": code, "doc": json.loads(out) if code == EXIT_OK else None, "err": err,
                    "data": try_open(data_path, os.O_RDONLY)}

        member = as_nobody(child, groups=[gid])
        outsider = as_nobody(child)
    assert member["code"] == EXIT_OK, member["err"]
    assert member["doc"]["fleet"] == fleet_name and member["doc"]["ledger"]["solved"] == 1
    assert member["data"] == "PermissionError"
    assert outsider["code"] == EXIT_NO_PERMISSION and "TableAccessDenied" in outsider["err"]
    assert outsider["data"] == "PermissionError"


@pytest.mark.parametrize("group", [None, "gid"])
def test_fleetd_gives_its_segments_these_modes(fleet_name, group):
    """The table is the socket group's to read only when fleetd is given one; the data segment never."""
    gid = unused_gid()
    args = ("--socket-group", str(gid)) if group else ()
    with Fleetd(fleet_name, {"echo": role("echo", slots=1)}, args=args):
        table, data = os.stat(shm.path(fleet_name, TABLE)), os.stat(shm.path(fleet_name, DATA))
    assert (table.st_mode & 0o777, table.st_gid) == ((0o640, gid) if group else (0o600, os.getegid()))
    assert (data.st_mode & 0o777, data.st_gid) == (0o600, os.getegid())


def test_an_owner_may_give_the_table_only_to_a_group_it_belongs_to(fleet_name):
    """fleetd run by an ordinary user: fchown to a group it is not in fails, typed, leaving nothing."""
    from fleet.shm.table import segment as seg

    gid = unused_gid()

    def child():
        out = {}
        try:
            seg.create(fleet_name, 2, 1, 0, readers_group=gid).close()
            out["outside"] = "created"
        except FleetError as exc:
            out["outside"] = [type(exc).__name__, str(exc)]
        out["left"] = os.path.exists(shm.path(fleet_name, TABLE))
        return out

    out = as_nobody(child)
    assert out["outside"][0] == "TableAccessDenied" and f"group {gid}" in out["outside"][1], out
    assert out["left"] is False

    def member():
        s = seg.create(fleet_name, 2, 1, 0, readers_group=gid)
        st = os.stat(shm.path(fleet_name, TABLE))
        s.close()
        return [st.st_mode & 0o777, st.st_uid, st.st_gid]

    assert as_nobody(member, groups=[gid]) == [0o640, 65534, gid]
