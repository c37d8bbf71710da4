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
from fleet.burst.trace import load, parse_lines
from fleet.runtime.config import ConfigError, load_config
from tests.daemons import BOUND_S, Fleetd, segments, to_toml, wait_until
from tests.fleets import unique_name

ROLES = {"crunch": {"kind": "pooled", "handler": "fleet.burst.handlers:burn", "slots": 1},
         "binned": {"kind": "pinned", "handler": "fleet.burst.handlers:burn", "slots": 2}}


CRUNCH_MS, BINNED_MS = 10.0, 200.0


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
    name = unique_name("rec")
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
            with d.connect() as c:  # fleetd never unpickles these payloads: the shape must be measured
                futures = [c.submit("crunch", {"cpu_ms": CRUNCH_MS}, lane="triage") for _ in range(3)]
                futures += [c.submit("binned", {"cpu_ms": BINNED_MS}, key=f"bin-{i % 2}", lane="cycle")
                            for i in range(3)]
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
    # the measured shape: each unit's handler burned its own cpu_ms of thread CPU (10 ms against
    # 200 ms), and the recording says which burned more without reading a payload
    crunch, binned = [a.cpu_ms for a in arrivals[:3]], [a.cpu_ms for a in arrivals[3:]]
    assert 0 < max(crunch) < min(binned), (crunch, binned)
    rep = replay(trace, modes=("none",), speed=1.0, progress=False, name=unique_name("rep"))
    m = rep["modes"][0]
    assert m["ledger"]["exact"] and m["ok"] == 6 and m["ledger"]["ledger"]["submitted"] == 6


def test_an_embedded_fleet_records_the_work_shape(tmp_path):
    import fleet

    log = tmp_path / "a.jsonl"
    cfg = {"fleet": {"name": unique_name("emb")}, "roles": {"crunch": ROLES["crunch"]},
           "record": {"enabled": True, "path": str(log)}}
    with fleet.Fleet.from_config(cfg) as f:
        f.submit("crunch", {"id": "x", "cpu_ms": 2.5, "severity": "B"}, lane="l").result(BOUND_S)
        f.submit("crunch", {"id": "y", "cpu_ms": 1.0}).result(BOUND_S)
    every = [json.loads(x) for x in log.read_text().splitlines()]
    lines = [x for x in every if "done" not in x]
    assert [(x["role"], x["lane"], x["cpu_ms"], x["io"]) for x in lines] == [("crunch", "l", 2.5, False),
                                                                         ("crunch", None, 1.0, False)]
    assert lines[0]["severity"] == "B" and lines[0]["unit"] < lines[1]["unit"]
    done = {x["done"]: x for x in every if "done" in x}
    assert set(done) == {lines[0]["unit"], lines[1]["unit"]}  # one done line per unit a worker ran
    assert done[lines[0]["unit"]]["run_s"] > 0 and done[lines[0]["unit"]]["outcome"] == "solved"
    assert oct(os.stat(log).st_mode & 0o777) == "0o600"


def test_done_lines_give_the_shape_the_payload_did_not():
    """The join of `fleet-burst record`: measured run time for a CPU unit's cpu_ms and an I/O round's
    latency_s; a declared shape wins; a unit with no done line (it never ran) is a zero-CPU unit."""
    from fleet.burst.record import to_trace

    route = {"model": "m", "provider": "p", "credential": None}
    lines = [{"wall": 100.0, "unit": 1, "role": "crunch", "lane": None, "key": None, "io": False},
             {"done": 2, "wall": 100.2, "run_s": 0.5, "outcome": "solved"},  # written before its arrival line
             {"wall": 100.1, "unit": 2, "role": "chat", "lane": "review", "key": None, "io": True, "route": route},
             {"wall": 100.3, "unit": 3, "role": "crunch", "lane": None, "key": None, "io": False, "cpu_ms": 7.0},
             {"wall": 100.4, "unit": 4, "role": "crunch", "lane": None, "key": None, "io": False},
             {"done": 1, "wall": 101.0, "run_s": 0.025, "outcome": "solved"},
             {"done": 3, "wall": 101.0, "run_s": 0.9, "outcome": "failed"},
             {"done": 9, "wall": 101.0, "run_s": "bad", "outcome": "solved"}]
    header, arrivals = to_trace("f", lines)
    by_id = {a["id"]: a for a in arrivals}
    assert list(by_id) == ["u1", "u2", "u3", "u4"]
    assert by_id["u1"]["cpu_ms"] == 25.0 and by_id["u1"]["latency_s"] is None
    assert by_id["u2"]["latency_s"] == 0.5 and by_id["u2"]["cpu_ms"] == 0.0
    assert by_id["u3"]["cpu_ms"] == 7.0  # declared, not the measured 900
    assert by_id["u4"]["cpu_ms"] == 0.0  # never reported: no shape
    assert by_id["u2"]["t"] == pytest.approx(0.1)
    trace = parse_lines([json.dumps(header)] + [json.dumps(a) for a in arrivals])  # the replay accepts it
    assert [a.cpu_ms for a in trace.arrivals] == [25.0, 0.0, 7.0, 0.0]


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


def test_only_a_recording_fleets_workers_measure_cpu(tmp_path, monkeypatch):
    """A worker reads its thread's CPU time (a system call on each side of a unit, as long
    as a small unit's whole run) only when the task asks (F_CPU), and only a fleet that
    records arrivals asks: the CPU fields of the results its workers send say so."""
    import math

    import fleet
    from fleet.runtime import results
    from fleet.shm import messages as M

    seen: list[float] = []
    take = results.Results.take  # every slice of results, whichever path takes it

    def watched(self, batch, seat):
        for tag, view in batch:
            if tag == M.RESULT:
                seen.append(M.RESULT_HEAD.unpack_from(view)[-1])
        return take(self, batch, seat)

    monkeypatch.setattr(results.Results, "take", watched)
    roles = {"work": {"kind": "pooled", "handler": "tests.handlers:echo", "slots": 1}}
    for recorded in (False, True):
        cfg = {"fleet": {"name": unique_name("cpu")}, "roles": roles}
        if recorded:
            cfg["record"] = {"enabled": True, "path": str(tmp_path / "a.jsonl")}
        seen.clear()
        with fleet.Fleet.from_config(cfg) as f:
            assert [x.result(BOUND_S) for x in [f.submit("work", i) for i in range(20)]] == list(range(20))
        assert len(seen) == 20
        assert all(math.isnan(c) != recorded for c in seen), (recorded, seen)


def test_recording_measures_cpu_beside_run_time_and_the_replay_sleeps_the_rest(tmp_path, monkeypatch):
    """A handler that sleeps 200 ms on a CPU role is recorded as a sliver of CPU and the rest
    of its run as wait (not as cpu_ms 200), and its replay asks to burn the one and sleep the other."""
    import fleet
    from fleet.burst.record import to_trace

    log = tmp_path / "a.jsonl"
    cfg = {"fleet": {"name": unique_name("cpu")},
           "roles": {"sleeper": {"kind": "pooled", "handler": "tests.handlers:hang", "slots": 1}},
           "record": {"enabled": True, "path": str(log)}}
    with fleet.Fleet.from_config(cfg) as f:  # the payload declares no shape: it is measured
        assert f.submit("sleeper", 0.2).result(BOUND_S) == "woke"
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    done = next(x for x in lines if "done" in x)
    assert 0 <= done["cpu_s"] < done["run_s"], done  # asleep: its CPU is not its run time
    header, arrivals = to_trace("f", lines)
    (a,) = arrivals
    assert a["cpu_ms"] < a["wait_ms"], a
    assert a["cpu_ms"] + a["wait_ms"] == pytest.approx(done["run_s"] * 1000, abs=0.01)
    trace = parse_lines([json.dumps(header)] + [json.dumps(x) for x in arrivals])
    assert trace.arrivals[0].wait_ms == a["wait_ms"]
    sent = []
    real_submit = fleet.Fleet.submit

    def submit(self, role, payload=None, **kwargs):
        sent.append((role, payload))
        return real_submit(self, role, payload, **kwargs)

    monkeypatch.setattr(fleet.Fleet, "submit", submit)
    rep = replay(trace, modes=("none",), speed=1.0, progress=False, name=unique_name("cpurep"))
    (r,) = rep["modes"][0]["round_log"]
    assert r["status"] == "ok", r
    rounds = [(role, payload) for role, payload in sent if payload.get("id") == a["id"]]  # not the warm-up
    assert rounds == [("sleeper", {"id": a["id"], "cpu_ms": a["cpu_ms"], "wait_ms": a["wait_ms"]})]


def test_burn_spends_its_cpu_then_sleeps_its_wait(monkeypatch):
    """The replay's handler, with its clocks faked: thread CPU moves 250 ms per look."""
    import types

    from fleet.burst import handlers

    cpu, slept = [0.0], []

    def thread_time():
        cpu[0] += 0.25
        return cpu[0]

    monkeypatch.setattr(handlers, "time", types.SimpleNamespace(
        monotonic=lambda: 7.0, thread_time=thread_time, sleep=slept.append))
    out = handlers.burn(types.SimpleNamespace(payload={"cpu_ms": 1000.0, "wait_ms": 150.0}))
    assert out == {"status": 0, "started": 7.0, "ended": 7.0}
    assert cpu[0] == 1.25  # read at 0.25 for the goal, then looked at until a second more had passed
    assert slept == [0.15]
    handlers.burn(types.SimpleNamespace(payload={"cpu_ms": 0.0}))
    assert slept == [0.15]  # no wait_ms: no sleep
