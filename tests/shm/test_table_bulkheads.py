"""Bulkhead records in a real shared-memory table: pack/unpack, publish, read from another process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from admission import state as T
from admission.pool import signal_for
from fleet.rules.outcomes import Refused
from fleet.rules.roles import REFERENCE_ROLES
from fleet.shm.table import SlotTable, TableVersionError
from fleet.shm.table import bulkheads as B
from fleet.shm.table import layout as L
from fleet.shm.table import snapshot

from ..admission_catalog import GLM_AZ, GLM_OR, MIDNIGHT_AFTER, make_pool

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def table(fleet_name):
    t = SlotTable.create(fleet_name, REFERENCE_ROLES, 4, n_bulkheads=3)
    yield t
    t.close()
    t.unlink()


def _census():
    pool, clock = make_pool()
    pool.admit(1, GLM_OR)
    pool.admit(2, GLM_OR)
    pool.report(1, signal_for(Refused(403, "Key limit exceeded (daily limit)")))
    pool.admit(3, GLM_AZ)
    clock.advance(2.5)
    pool.report(3, signal_for(None, cost=0.0125))
    pool.admit(4, GLM_AZ)
    return pool.census()["bulkheads"]


def test_pack_and_unpack_are_inverse():
    rows = _census()
    for row in rows:
        back = B.unpack(B.pack(row))
        for key, value in back.items():
            assert value == pytest.approx(row[key]), key
    closed = B.unpack(B.pack(rows[0]))
    assert closed["state"] == "closed" and closed["closed_by_daily_limit"] and closed["cause"] == T.DAILY_LIMIT
    assert closed["closed_until"] == MIDNIGHT_AFTER and closed["running"] == 1
    assert B.unpack([0] * B.FIELDS) is None  # an unused record


def test_a_long_pool_name_is_cut_at_a_character_boundary():
    row = dict(_census()[1], pool="é" * 40)  # 80 bytes of UTF-8
    assert B.unpack(B.pack(row))["pool"] == "é" * 32


def test_bulkheads_round_trip_through_a_real_table_read_by_another_process(table):
    rows = _census()
    writer = B.BulkheadWriter(table)
    assert writer.publish(rows) == 2
    # fleetctl's path: a separate process attaches read-only and reads the records
    code = (
        "import json, sys; from fleet.shm.table import snapshot, bulkheads;"
        "snap, alive = snapshot.read(sys.argv[1]); print(json.dumps(bulkheads.read(snap)))"
    )
    out = subprocess.run([sys.executable, "-c", code, table.name], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    read = json.loads(out.stdout)
    assert [r["pool"] for r in read] == [str(GLM_OR), str(GLM_AZ)]
    for got, row in zip(read, rows):
        assert got["state"] == row["state"] and got["running"] == row["running"]
        assert got["successes"] == row["successes"] and got["failures"] == row["failures"]
    assert read[1]["mean_cost"] == pytest.approx(0.0125) and read[1]["mean_seconds"] == pytest.approx(2.5)
    # a republished row keeps its record; a pool beyond the table's room is not published
    rows[0] = dict(rows[0], running=0, state="open", closed_until=None, cause=None, closed_by_daily_limit=False)
    more = [dict(rows[1], pool=f"m{i}@p") for i in range(3)]
    assert writer.publish(rows + more) == 3 and writer.overflow == {"m1@p", "m2@p"}
    got = B.read(table.snapshot())
    assert [r["pool"] for r in got] == [str(GLM_OR), str(GLM_AZ), "m0@p"] and got[0]["state"] == "open"


def test_a_table_of_the_old_bulkhead_layout_is_refused_by_version(table):
    # a reader of another layout version is told so, never shown misaligned records
    assert snapshot.read(table.name)[0].n_bulkheads == 3
    table.segment.header["version"] = 1  # the layout with 2-line bulkhead records
    with pytest.raises(TableVersionError, match="layout version 1"):
        snapshot.read(table.name)
    table.segment.header["version"] = L.LAYOUT_VERSION


WRITER = """
import sys, time
from fleet.shm.table import SlotTable, bulkheads
t = SlotTable.attach(sys.argv[1])
w = bulkheads.BulkheadWriter(t)
i = 0
while True:
    i += 1
    if i == 2:
        print("ready", flush=True)  # after one write: the kernels are loaded (or compiled)
    w.publish([{"pool": "p@q", "state": "open", "running": i, "waiting": i, "delegated": i, "successes": i,
                "failures": i, "refusals": i, "probes": i, "estimate": i, "carrying_capacity": i}])
"""


def test_bulkhead_snapshots_are_never_torn(table, reaper):
    writer = subprocess.Popen([sys.executable, "-c", WRITER, table.name], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    reaper.append(writer)
    assert writer.stdout.readline().strip() == "ready"
    seen = set()
    deadline = time.monotonic() + 60
    while len(seen) < 500:
        assert time.monotonic() < deadline, "the writer made no progress"
        snap = table.snapshot()
        assert snap.torn == ()
        rows = B.read(snap)
        if not rows:
            continue
        r = rows[0]
        values = {r[k] for k in ("running", "waiting", "delegated", "successes", "failures", "refusals", "probes",
                                 "estimate", "carrying_capacity")}
        assert len(values) == 1, f"torn bulkhead record: {r}"
        seen.add(r["running"])
    writer.kill()
