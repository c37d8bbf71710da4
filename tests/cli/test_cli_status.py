"""fleetctl status: reads a real table directly (no daemon), without numba; stale and
torn tables are reported; every section of the document comes from the table."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from fleet.rules import fsm
from fleet.shm import status as fleet_status
from fleet.cli import cmd_status, fleetctl
from fleet.rules.errors import EXIT_NOT_RUNNING, EXIT_USAGE
from fleet.shm.table import SlotTable
from fleet.shm.table import layout as L
from tests import fleet_tables as ft

FLEETCTL = shutil.which("fleetctl")


def status(capsys, *argv):
    rc = fleetctl.main(["status", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def status_json(capsys, name):
    rc, out, err = status(capsys, "--name", name, "--json")
    return rc, json.loads(out), err


# --- the document, in process ------------------------------------------------------------


def test_plan_and_budget_come_from_the_boot_metadata(table, fleet_name, capsys):
    rc, doc, _ = status_json(capsys, fleet_name)
    assert rc == 0 and doc["fleet"] == fleet_name and doc["alive"] and not doc["stale"]
    assert doc["plan"] == {
        "fleet_booted": True, "profile": "auto", "binding": "pinned", "quota_cpus": 8,
        "oversubscribed": False, "tier_refused": None, "quota_source": "config fleet.cpus", "fractional": None,
    }
    assert [c["name"] for c in doc["budget"]["consumers"]] == ["reserve", "ambient_io", "merge", "solver", "sim"]
    assert (doc["mode"], doc["version"], doc["creator_pid"]) == ("service", "0.1.0", os.getpid())


def test_census_has_one_row_per_slot(table, fleet_name, capsys):
    _, doc, _ = status_json(capsys, fleet_name)
    rows = doc["census"]
    got = [(r["slot"], r["role"], r["state"], r["key"], r["binding"], r["cpus"], r["unit"], r["done"]) for r in rows]
    assert got == [
        (0, "solver", "Running", 7, "pinned", [0, 1], 101, 0),
        (1, "solver", "Pinned", 9, "pinned", [1], 102, 1),
        (2, "sim", "Running", None, "shared", [0, 1], 103, 0),  # pooled and singleton
        (3, "merge", "Leased", None, "logical", [0], 0, 0),  # roles carry no key
        (4, None, "Idle", None, "pinned", [], 0, 0),
    ]
    assert [r["seat_name"] for r in rows] == [f"work-{fleet_name[:6]}-{i}" for i in range(5)]
    assert all(r["pid"] == os.getpid() for r in rows[:4]) and rows[4]["pid"] == 0


def test_census_carries_the_run_queue_delay_of_each_pid(table, fleet_name, capsys):
    _, doc, _ = status_json(capsys, fleet_name)
    assert doc["delay_source"] in (fleet_status.SCHEDSTAT, fleet_status.TASKSTATS)
    for row in doc["census"][:4]:
        assert isinstance(row["runq_delay_ns"], int) and row["runq_delay_ns"] >= 0
        assert row["runq_delay_source"] == doc["delay_source"]
    assert doc["census"][4]["runq_delay_ns"] is None  # no pid, no delay


def test_schedstat_delay_is_field_two(tmp_path):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "schedstat").write_text("987654321 123456 77\n")
    assert fleet_status.schedstat_delay(4242, proc=str(tmp_path)) == 123456
    assert fleet_status.schedstat_delay(4243, proc=str(tmp_path)) is None
    assert isinstance(fleet_status.schedstat_delay(os.getpid()), int)


def _taskstats_family_binds() -> bool:
    """Whether this host offers netlink taskstats, asked of the kernel here (pyroute2 binds
    the family), not of the status code under test."""
    from pyroute2 import TaskStats

    ts = TaskStats()
    try:
        ts.bind()
        return True
    except Exception:  # noqa: BLE001 - NetlinkError, OSError: not offered
        return False
    finally:
        ts.close()


def test_taskstats_source_when_asked(table, fleet_name, capsys):
    rc, out, _ = status(capsys, "--name", fleet_name, "--json", "--delay-source", "taskstats")
    doc = json.loads(out)
    # taskstats needs its netlink family; where it cannot be bound the source says schedstat
    expected = "taskstats" if _taskstats_family_binds() else "schedstat"
    assert rc == 0 and doc["delay_source"] == expected
    assert isinstance(doc["census"][0]["runq_delay_ns"], int)
    assert doc["census"][0]["runq_delay_source"] == expected


@pytest.mark.parametrize(
    "requested, delayacct, euid, source",
    [
        ("auto", False, 0, "schedstat"),
        ("auto", True, 0, "taskstats"),
        ("auto", True, 1000, "schedstat"),
        ("schedstat", True, 0, "schedstat"),
        ("taskstats", False, 1000, "taskstats"),
    ],
)
def test_choose_delay_source(requested, delayacct, euid, source):
    assert fleet_status.choose_delay_source(requested, delayacct, euid) == source


def test_delayacct_flag_is_read_from_proc(tmp_path):
    flag = tmp_path / "task_delayacct"
    flag.write_text("1\n")
    assert fleet_status.delayacct_enabled(str(flag))
    flag.write_text("0\n")
    assert not fleet_status.delayacct_enabled(str(flag))
    assert not fleet_status.delayacct_enabled(str(tmp_path / "missing"))


def test_posture_dwell_and_cordoned_time_use_the_monotonic_clock(table):
    now = ft.SINCE_NS + 2_500_000_000
    doc = fleet_status.build(table.snapshot(), alive=True, delays={}, delay_source="schedstat", now_ns=now, wall_ns=0)
    p = doc["posture"]
    assert (p["state"], p["cause"], p["enter_count"], p["exit_count"], p["suppressed"]) == (
        "Cordoned", "throttle-events", 3, 2, 17,
    )
    assert p["dwell_s"] == 2.5
    assert p["cordoned_s"] == 7.5  # 5 s of earlier stays + the current 2.5 s
    assert p["thresholds"]["cordon_duty_percent"] == 2.5 and p["thresholds"]["cordon_sim_intake_floor"] is None


def test_nominal_posture_adds_no_current_stay(table):
    table.set_posture(fsm.NOMINAL, since_ns=ft.SINCE_NS, cordoned_ns=ft.CORDONED_BEFORE_NS)
    now = ft.SINCE_NS + 2_000_000_000
    p = fleet_status.build(table.snapshot(), alive=True, delays={}, delay_source="schedstat", now_ns=now, wall_ns=0)["posture"]
    assert (p["state"], p["dwell_s"], p["cordoned_s"]) == ("Nominal", 2.0, 5.0)


def test_unpublished_posture_has_no_dwell(fleet_name):
    t = ft.create_table(fleet_name)
    try:
        p = fleet_status.build(t.snapshot(), alive=True, delays={}, delay_source="schedstat", now_ns=10**12, wall_ns=0)
        assert p["posture"]["dwell_s"] is None and p["posture"]["cordoned_s"] == 0
    finally:
        t.close()


def test_ledger_failures_by_reason_name(table, fleet_name, capsys):
    _, doc, _ = status_json(capsys, fleet_name)
    g = doc["ledger"]
    assert (g["submitted"], g["solved"], g["suppressed"], g["failed"], g["inflight"]) == (40, 28, 2, 7, 3)
    assert g["items"] == {"submitted": 1_000, "solved": 700, "suppressed": 50, "failed": 175, "inflight": 75}
    assert g["failed_by_reason"] == {
        "HandlerError": 2, "Timeout": 1, "LaneDeath": 3, "Shutdown": 0,
        "Refused": 0, "RoleStopped": 0, "ResultError": 0, "Cancelled": 1, "FsmRefused": 0, "LeaseExpired": 0,
        "LeaseDenied": 0, "LeasePreempted": 0,
    }
    assert (g["fsm_refused"], g["stray_results"]) == (4, 5)


def test_queue_depths_per_role(table, fleet_name, capsys):
    _, doc, _ = status_json(capsys, fleet_name)
    got = {q["name"]: (q["queue_depth"], q["queue_bound"], q["in_use"], q["slot_cap"]) for q in doc["queues"]}
    assert got == {"solver": (5, 1024, 2, 2), "sim": (11, 64, 1, 2), "merge": (0, 1024, 0, 1)}


def test_closing_flag_is_shown(table, fleet_name, capsys):
    table.set_flags(L.FLAG_CLOSING)
    rc, out, _ = status(capsys, "--name", fleet_name)
    assert rc == 0 and f"fleet {fleet_name}  closing" in out


def test_a_record_left_mid_write_is_reported_torn(table, fleet_name, capsys):
    # A writer that died inside its seqlock leaves the sequence odd for good.
    table.slots[2 * (L.SLOT_SIZE // L.U64) + L.S_SEQ] += 1
    rc, out, _ = status(capsys, "--name", fleet_name)
    assert rc == 0 and "TORN" in out and "slots[2]" in out
    _, doc, _ = status_json(capsys, fleet_name)
    assert doc["torn"] == ["slots[2]"]


def test_human_table_shows_every_section(table, fleet_name, capsys):
    rc, out, _ = status(capsys, "--name", fleet_name)
    assert rc == 0
    for needle in (
        "profile auto -> pinned binding", "quota 8 CPUs", "oversubscribed no", "tier refused -",
        "consumer", "ambient_io", "run-queue delay from", "Cordoned (cause throttle-events)",
        "entered 3, exited 2", "intake suppressed 17", "duty > 2.5%",
        "units submitted 40  solved 28  suppressed 2  failed 7  in flight 3",
        "items submitted 1,000  solved 700  suppressed 50  failed 175  in flight 75",
        "one chunk of a map: up to chunksize items",
        "LaneDeath 3", "slot FSM refusals: 4  stray results dropped: 5", "11/64",
    ):
        assert needle in out, needle
    # when it started, in UTC ISO 8601 (the table's creation time)
    assert re.search(r" up \S+ \(since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\)", out.splitlines()[0]), out.splitlines()[0]
    census = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ") and line.split()[0].isdigit()}
    assert census["1"][2:5] == ["solver", "Pinned", "9"] and census["1"][6:8] == ["1", "pinned"]
    assert census["2"][6:8] == ["0-1", "shared"] and census["3"][7] == "logical"
    assert census["4"][2:4] == ["-", "Idle"]
    # the role census: the role each slot last served, its role switches, and the children that
    # rode it (none here); then its seat's contention: now, and times found so
    assert census["4"][-5:-2] == ["merge", "1", "0"] and census["1"][-5:-2] == ["solver", "0", "0"]
    assert census["1"][-2] == "yes/2" and census["4"][-2] == "no/0"
    queues = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  solver ")}
    assert queues["solver"][-1] == "3"  # elastic re-pins


def test_json_census_has_the_last_role_and_switches(table, fleet_name, capsys):
    _, doc, _ = status_json(capsys, fleet_name)
    rows = {r["slot"]: r for r in doc["census"]}
    assert (rows[4]["role"], rows[4]["last_role"], rows[4]["switches"]) == (None, "merge", 1)
    assert (rows[2]["last_role"], rows[2]["switches"]) == ("sim", 0)
    assert [q["repins"] for q in doc["queues"]] == [3, 0, 0]
    # each slot's seat contention (fleet.rules.contention): contended now, and times found so
    assert [(rows[i]["contended"], rows[i]["contentions"]) for i in (0, 1)] == [(False, 0), (True, 2)]


def test_oversubscribed_plan_is_marked(fleet_name, capsys):
    t = SlotTable.create(fleet_name, ft.ROLES, ft.N_SLOTS, meta=ft.boot_meta(fleet_name, quota=4, profile="pinned"))
    try:
        rc, out, _ = status(capsys, "--name", fleet_name)
        assert rc == 0 and "oversubscribed YES" in out and "tier refused pinned: QuotaTooSmallForPinnedRoles" in out
    finally:
        t.close()


def test_name_comes_from_the_environment(table, fleet_name, capsys, monkeypatch):
    monkeypatch.setenv("FLEET_NAME", fleet_name)
    rc, out, _ = status(capsys, "--json")
    assert rc == 0 and json.loads(out)["fleet"] == fleet_name


def test_default_name_is_the_config_default(monkeypatch):
    from fleet.cli import _common

    monkeypatch.delenv("FLEET_NAME", raising=False)
    assert _common.default_name() == "fleet"
    assert _common.default_name({"FLEET_NAME": "pricing"}) == "pricing"


def test_not_running_exits_69(fleet_name, capsys):
    rc, out, err = status(capsys, "--name", fleet_name)
    assert rc == EXIT_NOT_RUNNING and out == ""
    assert err.count("\n") == 1 and "NotRunning" in err and fleet_name in err
    # a path one can look at (ls /dev/shm), not the shared-memory object's name
    assert f"(no table /dev/shm/fleet.{fleet_name})" in err


def test_bad_name_is_refused(capsys):
    rc, _, err = status(capsys, "--name", "../etc")
    assert rc == EXIT_USAGE and "InvalidFleetName" in err and "../etc" in err


@pytest.mark.parametrize(
    "cpus, text", [([], "-"), ([3], "3"), ([0, 1, 2, 5], "0-2,5"), ([0, 2, 4], "0,2,4"), ([1, 2, 3, 7, 8], "1-3,7-8")]
)
def test_cpu_list(cpus, text):
    assert cmd_status.cpu_list(cpus) == text


@pytest.mark.parametrize(
    "seconds, text", [(None, "-"), (0.25, "250ms"), (12.46, "12.5s"), (200, "3m20s"), (7500, "2h05m")]
)
def test_duration(seconds, text):
    assert cmd_status.duration(seconds) == text


# --- the installed entry point, in a subprocess --------------------------------------------


def test_installed_fleetctl_prints_the_census_without_importing_numba(table, fleet_name):
    assert FLEETCTL, "the fleetctl entry point is not installed"
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}  # -X importtime for a script
    # --no-waiting: the table alone (the waiting units are fleetd's to say, over its socket)
    proc = subprocess.run([FLEETCTL, "status", "--no-waiting", "--name", fleet_name], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "fleet.shm.table.snapshot" in imported  # the profile saw the table reader load
    assert not {m for m in imported if m == "numba" or m.startswith("numba.")}
    assert "pyroute2" not in imported  # only with --delay-source taskstats / delay accounting on
    assert "fleet.service.control" not in imported and "fleet.service.metrics" not in imported  # socket and exporter: not here
    assert "census    5 slots" in proc.stdout
    assert any(line.split()[:4] == ["0", f"work-{fleet_name[:6]}-0", "solver", "Running"] for line in proc.stdout.splitlines())


def test_status_leaves_numba_out_of_sys_modules(table, fleet_name):
    code = (
        "import sys\n"
        "from fleet.cli.fleetctl import main\n"
        f"rc = main(['status', '--name', {fleet_name!r}, '--json'])\n"
        "print('numba-loaded' if 'numba' in sys.modules else 'numba-absent', file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().endswith("numba-absent")
    assert json.loads(proc.stdout)["census"][1]["state"] == "Pinned"


def test_a_table_whose_creator_was_killed_is_stale(fleet_name, reaper):
    creator = subprocess.Popen(
        [sys.executable, "-m", "tests.fleet_tables", fleet_name], stdout=subprocess.PIPE, text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    reaper.append(creator)
    assert creator.stdout.readline().strip() == "ready"
    live = subprocess.run([FLEETCTL, "status", "--name", fleet_name, "--json"], capture_output=True, text=True)
    assert live.returncode == 0 and json.loads(live.stdout)["alive"] is True
    creator.send_signal(signal.SIGKILL)
    creator.wait()
    creator.stdout.close()
    proc = subprocess.run([FLEETCTL, "status", "--name", fleet_name], capture_output=True, text=True)
    assert proc.returncode == EXIT_NOT_RUNNING
    assert "stale" in proc.stderr and str(creator.pid) in proc.stderr
    assert "STALE" in proc.stdout and "census    5 slots" in proc.stdout  # what it was doing when it died
    doc = json.loads(subprocess.run([FLEETCTL, "status", "--name", fleet_name, "--json"], capture_output=True, text=True).stdout)
    assert doc["stale"] is True and doc["alive"] is False


def test_fleetctl_routes_each_command_to_its_module_and_knows_the_default_name():
    import importlib

    from fleet.cli import _common, fleetctl
    from fleet.runtime.config import FleetConfig

    assert _common.DEFAULT_NAME == FleetConfig.name
    for name, module in fleetctl.MODULE_OF.items():
        assert importlib.import_module(f"fleet.cli.{module}").NAME == name


# --- before boot: the projection a config would boot with -----------------------------------------

PROJECTED = """
[fleet]
name = "{name}"
profile = "serial"
cpus = 2

[roles.sq]
kind = "pooled"
handler = "tests.handlers:square"
slots = 2
peak_cpus = 1
queue_bound = 7

[roles.idle]
kind = "pooled"
slots = 1
"""


def _config(tmp_path, name):
    path = tmp_path / "fleet.toml"
    path.write_text(PROJECTED.format(name=name))
    return str(path)


def test_status_with_a_config_before_boot_prints_the_projection(tmp_path, fleet_name, capsys):
    path = _config(tmp_path, fleet_name)
    rc, out, err = status(capsys, "--config", path, "--json")
    assert rc == EXIT_NOT_RUNNING and f"fleet {fleet_name!r} is not running" in err
    doc = json.loads(out)
    assert (doc["fleet"], doc["fleet_booted"], doc["alive"], doc["config"]) == (fleet_name, False, False, path)
    plan = doc["plan"]
    assert plan["fleet_booted"] is False and (plan["profile"], plan["binding"]) == ("serial", "serial")
    assert (plan["quota_cpus"], plan["quota_source"], plan["configured_cpus"]) == (2, "config", 2)
    assert plan["detected_cpus"] > 0 and plan["detected_from"]
    assert {c["name"] for c in doc["budget"]["consumers"]} == {"reserve", "ambient_io", "serial-0"}
    assert [s["name"] for s in doc["seats"]] == ["serial-0"]
    assert [(s["slot"], s["role"], s["seat_name"], s["binding"]) for s in doc["slots"]] == [
        (0, "sq", "serial-0", "logical"), (1, "sq", "serial-0", "logical"), (2, "idle", None, "logical")]
    assert [(q["name"], q["queue_bound"], q["slot_cap"]) for q in doc["queues"]] == [("sq", 7, 2), ("idle", 1024, 1)]
    assert not os.path.exists(f"/dev/shm/fleet.{fleet_name}")  # a projection boots nothing

    rc, out, _ = status(capsys, "--config", path)
    assert rc == EXIT_NOT_RUNNING
    for needle in (f"fleet {fleet_name}  NOT RUNNING (not booted)  projection from {path}",
                   "booted no  profile serial -> serial binding  quota 2 CPUs (configured fleet.cpus; detected",
                   "serial-0", "seats     1 worker process(es); slots 3",
                   "processes sq: 2 slots on 1 worker process: at most 1 unit at once",
                   "idle: 1 slot, no worker process (no handler: declared, not run)"):
        assert needle in out, (needle, out)


def test_the_projection_of_a_config_that_cannot_boot_says_why(tmp_path, fleet_name, capsys, monkeypatch):
    monkeypatch.setenv("FLEET_CPUS", "1.5")
    monkeypatch.setenv("FLEET_BUDGET__LOOP", "reserved")  # a reserved core asked for: 1.5 CPUs cannot hold one
    rc, out, _ = status(capsys, "--config", _config(tmp_path, fleet_name), "--json")
    doc = json.loads(out)
    assert rc == EXIT_NOT_RUNNING and doc["fleet_booted"] is False and doc["plan"] is None
    assert (doc["refused"]["error"], doc["refused"]["exit_code"]) == ("BelowHostFloor", 80)
    rc, out, _ = status(capsys, "--config", _config(tmp_path, fleet_name))
    assert "boot would be REFUSED: BelowHostFloor" in out


def test_status_with_a_config_of_a_running_fleet_reads_the_live_table(table, tmp_path, fleet_name, capsys):
    rc, out, _ = status(capsys, "--config", _config(tmp_path, fleet_name), "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["fleet_booted"] is True and doc["plan"]["fleet_booted"] is True
    assert len(doc["census"]) == ft.N_SLOTS  # the live table's slots, not the config's three


def test_status_with_a_bad_config_is_a_config_error(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_bytes(b"\xff\xfe")
    rc, _, err = status(capsys, "--config", str(path))
    assert rc == 78 and "ConfigError" in err and "not a TOML text file" in err


def test_status_help_names_the_projection(capsys):
    with pytest.raises(SystemExit):
        fleetctl.main(["status", "--help"])
    out = capsys.readouterr().out
    assert "--config PATH" in out and "projection" in out


def test_status_says_which_cgroup_groups_the_posture_reads(fleet_name, capsys):
    reads = {"group": "/sys/fs/cgroup/system.slice/fleetd@x.service", "version": 2,
             "above": ["/sys/fs/cgroup/system.slice", "/sys/fs/cgroup"], "reason": None}
    meta = {**ft.boot_meta(fleet_name), "throttle_reads": reads}
    t = SlotTable.create(fleet_name, ft.ROLES, ft.N_SLOTS, meta=meta)
    try:
        rc, out, _ = status(capsys, "--name", fleet_name)
        assert rc == 0
        assert ("throttling read from /sys/fs/cgroup/system.slice/fleetd@x.service/cpu.stat (cgroup v2) "
                "and the 2 group(s) above it") in out
        _, doc, _ = status_json(capsys, fleet_name)
        assert doc["throttle_reads"] == reads
    finally:
        t.close()
        t.unlink()


def test_a_fleet_without_a_cpu_cgroup_says_why_in_status(fleet_name, capsys):
    reads = {"group": None, "version": None, "above": [], "reason": "no cgroup v1 cpu hierarchy mounted"}
    t = SlotTable.create(fleet_name, ft.ROLES, ft.N_SLOTS, meta={**ft.boot_meta(fleet_name), "throttle_reads": reads})
    try:
        rc, out, _ = status(capsys, "--name", fleet_name)
        assert rc == 0 and "no throttle counters: no cgroup v1 cpu hierarchy mounted" in out
    finally:
        t.close()
        t.unlink()


def _cgroup_meta(arranged: bool) -> dict:
    from fleet.rules import delegation as D

    files = frozenset(D.READINGS + ("cgroup.procs",))
    unit = D.Group("/sys/fs/cgroup/system.slice/fleetd@x.service", files, frozenset({"cpu", "memory"}), True)
    parent = D.Group("/sys/fs/cgroup/system.slice", files)
    return D.decide(D.Facts("/sys/fs/cgroup", unit, parent, arrange=arranged)).to_meta()


def test_status_names_the_group_the_fleet_reads_and_whether_it_is_delegated(fleet_name, capsys):
    meta = _cgroup_meta(True)
    t = SlotTable.create(fleet_name, ft.ROLES, ft.N_SLOTS, meta={**ft.boot_meta(fleet_name), "cgroup": meta})
    try:
        rc, out, _ = status(capsys, "--name", fleet_name)
        assert rc == 0
        assert ("cgroup    delegated: group /sys/fs/cgroup/system.slice/fleetd@x.service (cgroup v2); "
                "leaves supervisor/, workers/") in out
        assert "          reads cpu.stat, cpu.pressure, memory.events, memory.pressure\n" in out
        _, doc, _ = status_json(capsys, fleet_name)
        assert doc["cgroup"]["mode"] == "delegated" and doc["cgroup"]["delegated"] is True
        assert doc["cgroup"]["group"] == "/sys/fs/cgroup/system.slice/fleetd@x.service"
        assert doc["cgroup"]["reads"]["memory.events"] == {
            "path": "/sys/fs/cgroup/system.slice/fleetd@x.service/memory.events", "version": 2, "own": True}
    finally:
        t.close()
        t.unlink()


def test_status_of_an_embedded_fleet_says_so_and_why(fleet_name, capsys):
    t = SlotTable.create(fleet_name, ft.ROLES, ft.N_SLOTS, meta={**ft.boot_meta(fleet_name), "cgroup": _cgroup_meta(False)})
    try:
        rc, out, _ = status(capsys, "--name", fleet_name)
        assert rc == 0
        assert "cgroup    embedded: group /sys/fs/cgroup/system.slice/fleetd@x.service (cgroup v2)\n" in out
        assert "embedded in a program" in out
        _, doc, _ = status_json(capsys, fleet_name)
        assert doc["cgroup"]["mode"] == "embedded" and doc["cgroup"]["leaves"] == {}
    finally:
        t.close()
        t.unlink()


def test_status_counts_workers_oom_killed_and_recycled_from_the_table(table, fleet_name, capsys):
    """The two counters live in the ledger record (same writer, same seqlock): a fleet that
    never wrote them (or is older) shows 0, and a write shows in --json and the table.
    Mutations that turn it red: the snapshot reading the wrong words, `set_worker_exits`
    writing outside the seqlock's fields."""
    _, doc, _ = status_json(capsys, fleet_name)
    assert doc["memory"] == {"oom_kills": 0, "worker_recycles": 0, "oom_kills_from": None, "oom_kills_unread": None,
                             "pressure_from": None}
    table.set_worker_exits(oom_kills=3, recycles=7)
    _, doc, _ = status_json(capsys, fleet_name)
    assert (doc["memory"]["oom_kills"], doc["memory"]["worker_recycles"]) == (3, 7)
    assert doc["ledger"]["submitted"] == 40  # the ledger's own words untouched
    _, out, _ = status(capsys, "--name", fleet_name)
    assert "workers   OOM-killed 3  recycled over max_rss_mib 7" in out
    assert "OOM kills from not read: no memory cgroup; memory pressure cordons from none" in out
