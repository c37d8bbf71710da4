"""fleetctl leases / fleetctl store, against a real store on both backends."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from admission.store import Health, Policy, Request, open_store
from admission.store._sql import SCHEMA_VERSION
from fleet.cli import cmd_leases, cmd_store, fleetctl

from ..store_backends import FakeClock, backend, pg_dsn, store_url, stores  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent.parent
ISO_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def fleetctl_json(capsys, *argv):
    rc = fleetctl.main(list(argv))
    out = capsys.readouterr().out
    return rc, json.loads(out) if out.strip().startswith(("[", "{")) else out


def _fill(url):
    with open_store(url, actor="orch-a") as s:
        s.set_policy(Policy.build(aging_interval=3600))
        s.submit(Request("held", "orch-a", "prod", "openai", "host", priority=1, lease_ttl=300))
        s.submit(Request("waiting", "orch-a", "prod", "openai", "host", priority=4))


def test_leases_lists_admitted_and_queued_with_priority_and_expiry(store_url, capsys):
    _fill(store_url)
    rc, listing = fleetctl_json(capsys, "leases", "--store", store_url, "--json")
    assert rc == 0
    rows = listing["requests"]
    assert [(r["id"], r["state"], r["effective_priority"]) for r in rows] == [("held", "admitted", 1),
                                                                             ("waiting", "queued", 4)]
    assert 0 < rows[0]["lease_expires_in_s"] <= 300 and rows[0]["revision"] == 1
    assert rows[1]["lease_expires_in_s"] is None
    rc, text = fleetctl_json(capsys, "leases", "--store", store_url)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["ID", "STATE", "ORCHESTRATOR"]
    assert lines[1].startswith("held") and "rev 1" in lines[1] and lines[2].startswith("waiting")


def test_leases_row_ages_the_priority_and_marks_expiry():
    clock = FakeClock()
    policy = Policy.build(aging_interval=10)
    from admission.store import Record

    queued = Record(Request("q", "o", "e", "p", priority=2), submitted_at=clock.now, state="queued")
    row = cmd_leases.row_of(queued, policy, clock.now + 25)
    assert (row["effective_priority"], row["waited_s"], row["lease_expires_in_s"]) == (4, 25, None)
    rec = Record(Request("r", "o", "e", "p", priority=2, lease_ttl=5), submitted_at=clock.now, state="admitted",
                 revision=3, lease_expires=clock.now + 5)
    row = cmd_leases.row_of(rec, policy, clock.now + 25)
    # a lease no longer waits: it keeps its base priority
    assert (row["effective_priority"], row["waited_s"], row["lease_expires_in_s"]) == (2, 25, -20)
    assert "expired" in cmd_leases.render([row])
    expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock.now + 5))
    assert row["lease_expires_utc"] == expiry and f"(until {expiry})" in cmd_leases.render([row])


def test_leases_lists_live_and_lapsed_orchestrators(store_url, capsys):
    with open_store(store_url, actor="orch-gone", clock=lambda: time.time() - 100) as s:
        s.heartbeat(10.0)
    with open_store(store_url, actor="orch-live") as s:
        s.heartbeat(60.0)
    rc, listing = fleetctl_json(capsys, "leases", "--store", store_url, "--json")
    assert rc == 0
    assert [(o["id"], o["state"]) for o in listing["orchestrators"]] == [("orch-gone", "lapsed"), ("orch-live", "live")]
    rc, text = fleetctl_json(capsys, "leases", "--store", store_url)
    assert any(line.split()[:2] == ["orch-gone", "lapsed"] for line in text.splitlines())
    assert any(line.split()[:2] == ["orch-live", "live"] for line in text.splitlines())


_BEATER = """
import sys, time
from admission.store import Request, open_store
url, actor, window, every = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
with open_store(url, actor=actor) as s:
    s.heartbeat(window)
    s.submit(Request(actor + "-job", actor, "prod", "openai", "host"))
    print("beating", flush=True)
    while True:
        time.sleep(every)
        s.heartbeat(window)
"""


def _beater(url, actor, window, every=0.1):
    """An orchestrator process that heartbeats in `url` every `every` s for `window` s, with a request queued."""
    p = subprocess.Popen([sys.executable, "-c", _BEATER, url, actor, str(window), str(every)], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "beating"
    return p


def test_leases_shows_two_heartbeating_orchestrators_and_a_lapsed_one(store_url):
    with open_store(store_url, actor="setup") as s:
        s.set_policy(Policy.build(aging_interval=3600))
    procs = [_beater(store_url, "orch-b", 60.0), _beater(store_url, "orch-c", 60.0),
             _beater(store_url, "orch-a", 0.5, every=0.1)]
    try:
        procs[2].kill()  # orch-a dies: its last beat lapses 0.5 s later
        procs[2].wait(30)
        with open_store(store_url, actor="watch") as s:
            lapses = next(o.lapses_at for o in s.orchestrators() if o.id == "orch-a")
        time.sleep(max(0.0, lapses - time.time()) + 0.2)
        p = _run("leases", "--store", store_url, "--json")
        assert p.returncode == 0, p.stderr
        beats = {o["id"]: o for o in json.loads(p.stdout)["orchestrators"]}
        assert [(o, beats[o]["state"]) for o in sorted(beats)] == [
            ("orch-a", "lapsed"), ("orch-b", "live"), ("orch-c", "live")]
        assert beats["orch-a"]["lapses_in_s"] < 0 and beats["orch-a"]["up_s"] is None
        for live in ("orch-b", "orch-c"):
            assert 0 < beats[live]["lapses_in_s"] <= 60 and beats[live]["up_s"] >= beats[live]["beat_s_ago"] >= 0
        p = _run("leases", "--store", store_url)
        assert p.returncode == 0, p.stderr
        table = p.stdout.split("\n\n", 1)[1].splitlines()
        assert table[0].split() == ["ORCHESTRATOR", "STATE", "LAST", "BEAT", "LAPSE"]
        rows = {line.split()[0]: line.split() for line in table[1:]}
        assert sorted(rows) == ["orch-a", "orch-b", "orch-c"]
        assert rows["orch-a"][1] == "lapsed" and rows["orch-a"][-1] == "ago"  # "lapsed ... 0.3s ago"
        assert all(rows[o][1] == "live" and rows[o][-2] == "in" for o in ("orch-b", "orch-c"))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(30)


def test_store_url_from_the_environment(store_url, capsys, monkeypatch):
    _fill(store_url)
    monkeypatch.setenv("FLEET_STORE__URL", store_url)
    rc, rows = fleetctl_json(capsys, "leases", "--json")
    assert rc == 0 and len(rows) == 2


def test_no_store_named_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.delenv("FLEET_STORE__URL", raising=False)
    assert fleetctl.main(["leases"]) == 2
    assert "FLEET_STORE__URL" in capsys.readouterr().err


def test_store_check_reports_version_and_skew(store_url, capsys):
    _fill(store_url)
    rc, report = fleetctl_json(capsys, "store", "check", "--store", store_url, "--json", "--max-skew", "5")
    assert rc == 0
    assert report["reachable"] is True and report["schema_version"] == SCHEMA_VERSION
    assert abs(report["skew_s"]) < 5


def test_reports_never_show_a_password():
    from admission.store._sql import redact

    assert redact("postgresql://fleet:s3cret@db:5432/x") == "postgresql://fleet:***@db:5432/x"
    assert redact("postgresql://fleet@db/x") == "postgresql://fleet@db/x"
    assert redact("sqlite:///var/lib/fleet/store.db") == "sqlite:///var/lib/fleet/store.db"


def test_skew_verdict():
    h = Health("u", 1, 1, host_time=100.0, db_time=101.5)
    assert h.skew == 1.5
    assert cmd_store.too_skewed(h, 1.0) and not cmd_store.too_skewed(h, 2.0)
    assert cmd_store.too_skewed(Health("u", 1, 1, 100.0, 98.0), 1.0)


def test_store_events_lists_the_audit_trail(store_url, capsys):
    _fill(store_url)
    rc, events = fleetctl_json(capsys, "store", "events", "--store", store_url, "--request", "held", "--json")
    assert rc == 0 and [e["kind"] for e in events] == ["queued", "admitted"]
    assert events[0]["actor"] == "orch-a"
    # a person reads UTC ISO 8601; JSON keeps the number beside it
    assert all(isinstance(e["at"], float) and ISO_MS.fullmatch(e["at_utc"]) for e in events), events
    rc, text = fleetctl_json(capsys, "store", "events", "--store", store_url, "--request", "held")
    assert rc == 0 and all(ISO_MS.fullmatch(line.split()[1]) for line in text.splitlines()), text


def _run(*argv):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "fleet.cli.fleetctl", *argv], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def test_unreachable_store_exits_90_and_is_not_created(tmp_path, backend):
    url = (f"sqlite://{tmp_path}/absent.db" if backend == "sqlite"
           else "postgresql://postgres@127.0.0.1:1/none?connect_timeout=2")
    p = _run("store", "check", "--store", url)
    assert p.returncode == 90 and "StoreUnreachable" in p.stderr
    assert not (tmp_path / "absent.db").exists()


def test_a_file_that_is_not_a_database_exits_90_without_a_traceback(tmp_path):
    path = tmp_path / "notes.db"
    path.write_bytes(b"plain text, not a store\n" * 200)
    p = _run("store", "check", "--store", f"sqlite://{path}")
    assert p.returncode == 90 and "StoreUnreachable" in p.stderr and "Traceback" not in p.stderr
    assert path.read_bytes() == b"plain text, not a store\n" * 200


def test_schema_too_new_exits_91(store_url):
    _fill(store_url)
    if store_url.startswith("sqlite://"):
        import sqlite3

        with sqlite3.connect(store_url[len("sqlite://"):]) as c:
            c.execute("UPDATE schema_version SET version = 99")
    else:
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as c:
            c.execute("UPDATE schema_version SET version = 99")
    p = _run("leases", "--store", store_url)
    assert p.returncode == 91 and "SchemaTooNew" in p.stderr and "99" in p.stderr


def test_bad_max_skew_is_refused():
    p = _run("store", "check", "--store", "sqlite:///x", "--max-skew", "-1")
    assert p.returncode == 2 and "--max-skew" in p.stderr


@pytest.mark.parametrize("command", ["leases", "store"])
def test_help_names_the_command(command):
    p = _run(command, "--help")
    assert p.returncode == 0 and "store" in p.stdout


def test_leases_approve_and_reject_decide_a_request_held_for_approval(store_url, capsys):
    with open_store(store_url, actor="orch-a") as s:
        s.set_policy(Policy.build(global_limit=2))
        s.submit(Request("ok", "orch-a", "prod", "openai", "container", approval=True, lease_ttl=300))
        s.submit(Request("no", "orch-a", "prod", "openai", "VM", approval=True, lease_ttl=300))
    rc, listing = fleetctl_json(capsys, "leases", "--store", store_url, "--json")
    rows = {r["id"]: r for r in listing["requests"]}
    assert {rid: r["state"] for rid, r in rows.items()} == {"ok": "awaiting-approval", "no": "awaiting-approval"}
    assert 0 < rows["ok"]["lease_expires_in_s"] <= 300  # the reservation's lease, listed as a lease
    assert (rows["no"]["tier"], rows["no"]["runtime"]) == ("vm", "VM")
    rc, row = fleetctl_json(capsys, "leases", "approve", "ok", "--store", store_url, "--json", "--reason", "go")
    assert rc == 0 and (row["state"], row["reason"]) == ("admitted", "approved by fleetctl@" + os.uname().nodename
                                                         + ": go")
    rc, text = fleetctl_json(capsys, "leases", "--store", store_url, "reject", "no")
    assert rc == 0 and text.splitlines()[1].split()[:2] == ["no", "denied"]
    with open_store(store_url, actor="watch") as s:
        assert [(e.kind, e.request_id) for e in s.events() if e.kind in ("approved", "rejected")] == [
            ("approved", "ok"), ("rejected", "no")]
        assert s.get("ok").state == "admitted" and s.get("no").state == "denied"


def test_leases_approve_of_what_awaits_no_approval_exits_94_and_changes_nothing(store_url):
    _fill(store_url)
    for argv in (("approve", "held"), ("reject", "waiting"), ("approve", "nobody")):
        p = _run("leases", *argv, "--store", store_url)
        assert p.returncode == 94 and "Traceback" not in p.stderr, p.stderr
        assert ("NotAwaitingApproval" if argv[1] != "nobody" else "UnknownRequest") in p.stderr
    with open_store(store_url, actor="watch") as s:
        assert [(r.id, r.state) for r in s.active()] == [("held", "admitted"), ("waiting", "queued")]
    p = _run("leases", "approve", "--store", store_url)  # no id: a usage error
    assert p.returncode == 2
