"""fleet-burst's trace format: the shipped traces parse, every bad line is reported with its number,
and a bad trace runs nothing (exit code EXIT_BAD_TRACE)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fleet.burst import cli
from fleet.burst.trace import FORMAT, VERSION, TraceError, load, parse_lines

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACES = os.path.join(REPO, "examples", "traces")
HEADER = {"format": FORMAT, "version": VERSION, "name": "t", "start": "2026-10-04T00:00:00Z",
          "pools": [{"model": "m", "provider": "p", "k": 2}]}


def lines(*objs):
    return [o if isinstance(o, str) else json.dumps(o) for o in (HEADER,) + objs]


def good(i, t=0.0, **kw):
    a = {"t": t, "id": f"a{i}", "role": "review", "lane": "review",
         "route": {"model": "m", "provider": "p", "credential": "k1"}}
    a.update(kw)
    return a


@pytest.mark.parametrize("name", ["burst-35", "daily-limit-day", "solve-cycle"])
def test_shipped_traces_parse(name):
    trace = load(os.path.join(TRACES, f"{name}.jsonl"))
    assert trace.header.name == name and trace.arrivals


def test_shipped_traces_are_what_the_generator_makes(tmp_path):
    from fleet.burst.gen import main

    main([str(tmp_path)])
    for name in ("burst-35", "daily-limit-day", "solve-cycle"):
        with open(os.path.join(TRACES, f"{name}.jsonl")) as a, open(tmp_path / f"{name}.jsonl") as b:
            assert a.read() == b.read(), f"{name}.jsonl differs from what fleet.burst.gen writes"


def test_good_trace_fields():
    trace = parse_lines(lines(good(1, 0.5), good(2, 1.0, parent="a1", after=["a1"], severity="B"),
                              {"t": 2.0, "id": "c1", "role": "sim", "cpu_ms": 3.3, "key": "bin-1", "cycle": 4}))
    a1, a2, c1 = trace.arrivals
    assert a1.route.pool == "m@p" and a1.route.credential == "k1"
    assert a2.parent == "a1" and a2.after == ("a1",) and a2.severity == "B"
    assert c1.route is None and c1.cpu_ms == 3.3 and c1.key == "bin-1" and c1.cycle == 4
    assert trace.header.pools[0].k == 2


def test_every_bad_line_is_reported_with_its_number():
    with pytest.raises(TraceError) as err:
        parse_lines(lines(
            good(1),                                         # line 2: fine
            "{not json",                                     # line 3
            good(3, route={"model": "x", "provider": "p"}),  # line 4: undeclared pool
            good(4, t=-1),                                   # line 5: negative time
            good(1, t=1),                                    # line 6: id reused
            good(6, severity="urgent"),                      # line 7: unknown severity
            good(7, after=["nope"]),                         # line 8: unknown reference
            good(8, colour="red"),                           # line 9: unknown field
            good(9, role="Bad-Role"),                        # line 10: not a role name
        ), "x.jsonl")
    numbers = [n for n, _ in err.value.problems]
    assert numbers == [3, 4, 5, 6, 7, 8, 9, 10]
    text = str(err.value)
    assert "x.jsonl:3: not JSON" in text and "x@p is not a pool" in text and "already used on line 2" in text
    assert "unknown arrival 'nope'" in text and "colour" in text


def test_out_of_order_and_forward_references():
    with pytest.raises(TraceError) as err:
        parse_lines(lines(good(1, 5.0), good(2, 1.0)))
    assert err.value.problems[0][0] == 3 and "earlier" in err.value.problems[0][1]
    with pytest.raises(TraceError) as err:
        parse_lines(lines(good(1, 0.0, after=["a2"]), good(2, 1.0)))
    assert err.value.problems == [(2, "a1: refers to 'a2', which comes later")]


@pytest.mark.parametrize("header, what", [
    ({**HEADER, "version": 2}, "version 2 is not supported"),
    ({**HEADER, "format": "other"}, "format must be"),
    ({**HEADER, "start": "2026-10-04T00:00:00"}, "must name its zone"),
    ({**HEADER, "pools": [{"model": "m", "provider": "p", "k": 0}]}, "k must be"),
    ({**HEADER, "pools": [{"model": "m", "provider": "p", "k": 2, "alternatives": [{"model": "m", "provider": "q"}]}]},
     "not a declared pool"),
    ({**HEADER, "keys": [{"credential": "k", "reset": "never"}]}, "reset must be"),
    ({**HEADER, "lanes": {"review": {"share": 0.25}}}, "lanes.review"),
])
def test_bad_header_is_line_one(header, what):
    with pytest.raises(TraceError) as err:
        parse_lines([json.dumps(header), json.dumps(good(1))])
    assert err.value.problems[0][0] == 1 and what in err.value.problems[0][1]


def test_empty_and_unreadable():
    with pytest.raises(TraceError, match="no header"):
        parse_lines([])
    with pytest.raises(TraceError, match="cannot read"):
        load("/nonexistent/trace.jsonl")


def test_a_header_alone_parses_but_loads_as_nothing_to_replay(tmp_path):
    assert parse_lines(lines("", "   ")).arrivals == ()  # a simulator may take its pools from it
    path = tmp_path / "header-only.jsonl"
    path.write_text("\n".join(lines("", "   ")) + "\n")
    with pytest.raises(TraceError) as err:
        load(str(path))
    assert err.value.problems == [(0, "no arrivals: the trace has a header and nothing to replay")]


def test_cli_bad_trace_exits_with_its_code_and_runs_nothing(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines(good(1), "[1, 2", good(3, t="soon"))) + "\n")
    out = subprocess.run([sys.executable, "-m", "fleet.burst.cli", "replay", str(path), "--report",
                          str(tmp_path / "rep")], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert out.returncode == cli.EXIT_BAD_TRACE == 65
    assert f"{path}:3: not JSON" in out.stderr and f"{path}:4: t must be a number" in out.stderr
    assert not (tmp_path / "rep").exists()


def test_help_names_the_exit_codes():
    for argv in (["--help"], ["replay", "--help"], ["record", "--help"], ["show", "--help"]):
        out = subprocess.run([sys.executable, "-m", "fleet.burst.cli", *argv], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PYTHONPATH": REPO})
        assert out.returncode == 0
        for code in (cli.EXIT_BAD_TRACE, cli.EXIT_NO_FLEET, cli.EXIT_FLEET_FAILED):
            assert f"  {code}  " in out.stdout


def test_bad_arguments_are_usage_errors(tmp_path):
    for argv in (["replay", "x.jsonl", "--modes", "none,fast"], ["replay", "x.jsonl", "--speed", "0"],
                 ["replay", "x.jsonl", "--cap", "0"], ["replay", "x.jsonl", "--name", "a.b"],
                 ["record", "--name", "../x", "-o", "t.jsonl"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == cli.EXIT_USAGE


def _replay_cli(path, tmp_path, timeout=60):
    return subprocess.run([sys.executable, "-m", "fleet.burst.cli", "replay", str(path), "--report",
                           str(tmp_path / "rep")], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": REPO})


@pytest.mark.parametrize("line, what", [
    ("[" * 100_000 + "]" * 100_000, "2: nested too deeply"),
    ('{"t": ' + "7" * 5000 + ', "id": "a", "role": "r", "cpu_ms": 1}', "2: a number longer than"),
    ('{"t": ' + "7" * 400 + ', "id": "a", "role": "r", "cpu_ms": 1}', "2: t must be a number from 0 to"),
    ('{"t": Infinity, "id": "a", "role": "r", "cpu_ms": 1}', "2: t must be a number"),
    ('{"t": 0, "id": "a", "role": "r", "cpu_ms": 1e308}', "2: cpu_ms must be a number"),
    # an arrival's work on a worker is capped (it used to run for ever)
    ('{"t": 0, "id": "a", "role": "r", "cpu_ms": 1e9}', "2: cpu_ms must be a number from 0 to 600000, got 1000000000.0"),
    ('{"t": 0, "id": "a", "role": "r", "cpu_ms": 1, "wait_ms": 1e9}', "2: wait_ms must be a number from 0 to 600000"),
    ('{"t": 0, "id": "a", "role": "r", "cpu_ms": 400000, "wait_ms": 200001}',
     "2: cpu_ms + wait_ms (the arrival's wall time on a worker) must be at most 600000 ms, got 600001"),
], ids=["deep", "5000-digits", "400-digits", "infinity", "cpu-1e308", "cpu-1e9", "wait-1e9", "wall-over"])
def test_a_hostile_arrival_is_one_line_and_exit_65(tmp_path, line, what):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(HEADER) + "\n" + line + "\n")
    out = _replay_cli(path, tmp_path)
    assert out.returncode == cli.EXIT_BAD_TRACE == 65, out.stderr[-2000:]
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.startswith(f"fleet-burst: {path}:{what}") and len(out.stderr) < 300, out.stderr
    assert not (tmp_path / "rep").exists()


@pytest.mark.parametrize("field, value", [("horizon_s", 1e308), ("seed", 10**30), ("speed", 1e-300),
                                          ("cap", 10**400)])
def test_a_hostile_header_is_one_line_and_exit_65(tmp_path, field, value):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({**HEADER, field: value}) + "\n" + json.dumps(good(1)) + "\n")
    out = _replay_cli(path, tmp_path)
    assert out.returncode == cli.EXIT_BAD_TRACE, out.stderr[-2000:]
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.startswith(f"fleet-burst: {path}:1: {field} must be a number"), out.stderr


def test_a_trace_that_ends_past_the_calendar_is_one_line(tmp_path):
    path = tmp_path / "late.jsonl"
    path.write_text(json.dumps({**HEADER, "start": "9999-12-31T00:00:00Z", "horizon_s": 86400 * 2}) + "\n"
                    + json.dumps(good(1)) + "\n")
    out = _replay_cli(path, tmp_path)
    assert out.returncode == cli.EXIT_BAD_TRACE and out.stderr.count("\n") == 1, out.stderr[-2000:]
    assert "past the last date" in out.stderr


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_trace_is_refused_not_waited_on(tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "trace.fifo"
        os.mkfifo(path)  # no writer: an open() for reading would block for ever
    else:
        path = "/dev/zero"  # never ends
    out = _replay_cli(path, tmp_path, timeout=30)
    assert out.returncode == cli.EXIT_BAD_TRACE, out.stderr
    what = "a FIFO" if kind == "fifo" else "a character device"
    assert out.stderr == f"fleet-burst: {path}: cannot read: it is {what}, not a regular file\n"


def test_bad_arguments_exit_ex_usage(tmp_path):
    for argv in (["replay", "x.jsonl", "--speed", "inf"], ["replay", "x.jsonl", "--speed", "1e-300"], ["bogus"]):
        out = subprocess.run([sys.executable, "-m", "fleet.burst.cli", *argv], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PYTHONPATH": REPO})
        assert out.returncode == cli.EXIT_USAGE == 64, (argv, out.stderr)
        assert "error:" in out.stderr and "Traceback" not in out.stderr


def test_a_header_without_arrivals_is_a_data_error_not_a_fleet_failure(tmp_path):
    path = tmp_path / "header-only.jsonl"
    path.write_text(json.dumps(HEADER) + "\n")
    out = _replay_cli(path, tmp_path)
    assert out.returncode == cli.EXIT_BAD_TRACE == 65, out.stderr[-2000:]
    assert out.stderr == f"fleet-burst: {path}: no arrivals: the trace has a header and nothing to replay\n"
    assert not (tmp_path / "rep").exists()


def test_an_arrival_may_use_the_whole_cap():
    from fleet.burst.trace import MAX_UNIT_MS

    trace = parse_lines(lines({"t": 0, "id": "a", "role": "r", "cpu_ms": MAX_UNIT_MS / 2, "wait_ms": MAX_UNIT_MS / 2}))
    assert trace.arrivals[0].cpu_ms + trace.arrivals[0].wait_ms == MAX_UNIT_MS == 600_000
