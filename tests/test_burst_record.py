"""Recording: fleetd with [record] enabled writes its arrival log; `fleet-burst record` captures a
trace from a running fleetd; that trace replays against a real fleet with an exact ledger."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from fleet.burst import cli
from fleet.burst.runner import replay
from fleet.burst.trace import load
from fleet.config import ConfigError, load_config
from tests.daemons import BOUND_S, Fleetd, segments, to_toml, wait_until

ROLES = {"crunch": {"kind": "pooled", "handler": "fleet.burst.handlers:burn", "slots": 1},
         "binned": {"kind": "pinned", "handler": "fleet.burst.handlers:burn", "slots": 2}}


def test_record_config_is_validated():
    assert load_config({"record": {"enabled": True, "path": "/tmp/x"}}).record.path == "/tmp/x"
    assert load_config({}).record.enabled is False
    for bad in ({"enabled": "yes"}, {"path": ""}, {"where": "x"}):
        with pytest.raises(ConfigError, match="record"):
            load_config({"record": bad})


def test_record_without_a_running_fleet_is_exit_no_fleet(tmp_path):
    rc = cli.main(["record", "--name", f"absent{os.getpid()}", "-o", str(tmp_path / "t.jsonl"), "--duration", "1"])
    assert rc == cli.EXIT_NO_FLEET == 69
    assert not (tmp_path / "t.jsonl").exists()


def test_record_then_replay_round_trip(tmp_path):
    name = f"rec{os.getpid()}"
    log = tmp_path / "arrivals.jsonl"
    out = tmp_path / "captured.jsonl"
    d = Fleetd(name, ROLES)
    try:
        d.write_config(ROLES, text=to_toml({"fleet": {"name": name}, "roles": ROLES,
                                            "record": {"enabled": True, "path": str(log)}}))
        d.start()
        rec = subprocess.Popen([sys.executable, "-m", "fleet.burst.cli", "record", "--name", name, "-o", str(out),
                                "--source", str(log), "--count", "6"], env=d.env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        try:
            # reading starts at the log's end: wait for it before submitting
            wait_until(lambda: rec.poll() is not None or "recording arrivals" in _peek(rec), "record to start")
            with d.connect() as c:
                futures = [c.submit("crunch", {"cpu_ms": 1}, lane="triage") for _ in range(3)]
                futures += [c.submit("binned", {"cpu_ms": 1}, key=f"bin-{i % 2}", lane="cycle") for i in range(3)]
                for f in futures:
                    f.result(BOUND_S)
            stdout, stderr = rec.communicate(timeout=BOUND_S)
        finally:
            if rec.poll() is None:
                rec.kill()
                rec.wait()
        assert rec.returncode == cli.EXIT_OK, stderr
        assert "recorded 6 arrival(s)" in stdout
        d.signal(signal.SIGTERM)  # a clean stop removes fleetd's shared memory
        assert d.wait() == 0
    finally:
        d.cleanup()
    assert not segments(name)
    trace = load(out)
    arrivals = trace.arrivals
    assert [a.role for a in arrivals] == ["crunch"] * 3 + ["binned"] * 3
    assert [a.lane for a in arrivals] == ["triage"] * 3 + ["cycle"] * 3
    assert [a.key for a in arrivals] == [None] * 3 + ["bin-0", "bin-1", "bin-0"]
    assert arrivals[0].t == 0.0 and all(b.t >= a.t for a, b in zip(arrivals, arrivals[1:]))
    assert arrivals[-1].t < BOUND_S
    rep = replay(trace, modes=("none",), speed=1.0, progress=False, name=f"rep{os.getpid()}")
    m = rep["modes"][0]
    assert m["ledger"]["exact"] and m["ok"] == 6 and m["ledger"]["ledger"]["submitted"] == 6


def test_an_embedded_fleet_records_the_work_shape(tmp_path):
    import fleet

    log = tmp_path / "a.jsonl"
    cfg = {"fleet": {"name": f"emb{os.getpid()}"}, "roles": {"crunch": ROLES["crunch"]},
           "record": {"enabled": True, "path": str(log)}}
    with fleet.Fleet.from_config(cfg) as f:
        f.submit("crunch", {"id": "x", "cpu_ms": 2.5, "severity": "B"}, lane="l").result(BOUND_S)
        f.submit("crunch", {"id": "y", "cpu_ms": 1.0}).result(BOUND_S)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(x["role"], x["lane"], x["cpu_ms"]) for x in lines] == [("crunch", "l", 2.5), ("crunch", None, 1.0)]
    assert lines[0]["severity"] == "B" and lines[0]["unit"] < lines[1]["unit"]
    assert oct(os.stat(log).st_mode & 0o777) == "0o600"


_seen: dict = {}


def _peek(proc) -> str:
    """What the record process wrote to stderr so far (non-blocking)."""
    import fcntl

    fd = proc.stderr.fileno()
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    try:
        chunk = proc.stderr.read() or ""
    except (BlockingIOError, TypeError):
        chunk = ""
    _seen[proc.pid] = _seen.get(proc.pid, "") + chunk
    return _seen[proc.pid]
