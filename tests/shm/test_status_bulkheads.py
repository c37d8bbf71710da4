"""fleetctl status shows the provider bulkheads read from the table (no round trip), and the
in-process admission view (starving, waiting units) when the status document carries it."""
from __future__ import annotations

import json

from fleet.cli import cmd_status, fleetctl
from fleet.shm.table.bulkheads import BulkheadWriter

from ..admission_catalog import MIDNIGHT_AFTER, T_1447


def _row(pool, state, **fields):
    row = {"pool": pool, "state": state, "running": 0, "waiting": 0, "delegated": 0, "successes": 0,
           "failures": 0, "refusals": 0, "probes": 0, "closed_until": None, "backoff_until": None, "cause": None,
           "carrying_capacity": 0, "estimate": 1, "mean_seconds": 0.0, "mean_cost": 0.0,
           "closed_by_daily_limit": False}
    row.update(fields)
    return row


def test_status_reads_the_bulkheads_the_supervisor_published(table, fleet_name, capsys):
    BulkheadWriter(table).publish([
        _row("glm-5.3-review@openrouter-eu", "closed", closed_until=MIDNIGHT_AFTER, cause="daily-limit",
             closed_by_daily_limit=True, waiting=3, failures=1, refusals=1, probes=2),
        _row("glm-5.3-review@azure-eu", "open", running=2, successes=7, mean_seconds=1.5, mean_cost=0.002),
        _row("deepseek-v4-flash@openrouter-us", "backoff", backoff_until=T_1447 + 5, cause=None, refusals=2),
    ])
    assert fleetctl.main(["status", "--name", fleet_name, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    pools = {b["pool"]: b for b in doc["bulkheads"]}
    closed = pools["glm-5.3-review@openrouter-eu"]
    assert (closed["state"], closed["cause"], closed["closed_until"], closed["waiting"], closed["probes"]) == (
        "closed", "daily-limit", MIDNIGHT_AFTER, 3, 2)
    assert closed["closed_by_daily_limit"] is True
    assert pools["glm-5.3-review@azure-eu"]["successes"] == 7

    assert fleetctl.main(["status", "--name", fleet_name]) == 0
    out = capsys.readouterr().out
    assert "bulkheads 3 provider pool(s)" in out
    line = next(x for x in out.splitlines() if "glm-5.3-review@openrouter-eu" in x)
    assert "closed (daily limit)" in line and "daily-limit" in line and "2026-10-05T00:00:00Z" in line
    line = next(x for x in out.splitlines() if "deepseek-v4-flash@openrouter-us" in x)
    assert "backoff" in line and "2026-10-04T14:47:05Z" in line


def test_a_fleet_with_no_provider_pools_shows_no_bulkhead_section(table, fleet_name, capsys):
    assert fleetctl.main(["status", "--name", fleet_name]) == 0
    assert "bulkheads" not in capsys.readouterr().out


def test_the_in_process_view_renders_starving_first_and_the_waits():
    lines = cmd_status.render_admission({
        "policy_error": None,
        "starving": [{"kind": "provider-closed", "provider": "openrouter-eu", "credential": None,
                      "cause": "daily-limit", "until": MIDNIGHT_AFTER, "waiting": 2},
                     {"kind": "pinned", "unit": 7, "route": "glm-5.3-review@openrouter-eu", "waiting_s": 960.0}],
        "waiting_units": [{"unit": 7, "why": "hard-pinned to glm-5.3-review@openrouter-eu: closed"}],
    })
    assert lines[0].startswith("starving  openrouter-eu closed (daily-limit) until 2026-10-05T00:00:00Z: 2")
    assert "unit 7 hard-pinned" in lines[1] and "16m00s" in lines[1]
    assert lines[2].startswith("waiting   unit 7: hard-pinned")
    assert cmd_status.render_admission({"policy_error": "admission.tiers: bad", "starving": [],
                                        "waiting_units": []}) == [
        "admission catalog reload FAILED (the last good one runs): admission.tiers: bad"]
