"""fleet-burst replay end to end: a real embedded fleet (read by `fleetctl status` while it runs), the
real simulator over HTTP, the three modes on one trace; the ledger is exact, the report's counts are
the simulator's own, each mode does what it says; the PNG renders and `show` re-renders it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from fleet.burst import cli
from fleet.burst.trace import FORMAT, VERSION

from tests.fleets import unique_name

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": REPO}
BOUND_S = 120


def write_trace(path):
    """Two waves of 8 rounds on a pool of K 3 (rounds held 20 trace s = 1 s real at speed 20); the
    second wave comes while the first wave's 429s are backing the pool off; a declared alternative."""
    header = {"format": FORMAT, "version": VERSION, "name": "mini-burst", "start": "2026-10-07T09:00:00Z",
              "seed": 3, "speed": 20, "horizon_s": 400,
              "pools": [{"model": "m", "provider": "p", "k": 3, "retry_after_s": 30, "residency": "eu",
                         "latency": {"median_s": 20, "sigma": 0.1},
                         "alternatives": [{"model": "m", "provider": "q"}]},
                        {"model": "m", "provider": "q", "k": 8, "residency": "eu",
                         "latency": {"median_s": 20, "sigma": 0.1}}]}
    rows = [json.dumps(header)]
    for wave, t0 in enumerate((0.0, 5.0)):
        for i in range(8):
            rows.append(json.dumps({"t": t0 + i * 0.01, "id": f"w{wave}-{i}", "role": "review",
                                    "lane": "review" if i % 2 else "triage",
                                    "route": {"model": "m", "provider": "p", "credential": "k1"}}))
    rows.append(json.dumps({"t": 6.0, "id": "cpu-1", "role": "crunch", "lane": "cpu", "cpu_ms": 5.0}))
    path.write_text("\n".join(rows) + "\n")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("burst")
    trace = folder / "mini.jsonl"
    write_trace(trace)
    name = unique_name("bursttest")
    report = folder / "report"
    proc = subprocess.Popen([sys.executable, "-m", "fleet.burst.cli", "replay", str(trace), "--modes",
                             "none,cap,admission", "--cap", "3", "--report", str(report), "--name", name],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    statuses = []
    try:
        deadline = time.monotonic() + BOUND_S
        while proc.poll() is None and time.monotonic() < deadline:
            st = subprocess.run([sys.executable, "-m", "fleet.cli.fleetctl", "status", "--name", name, "--json"],
                                capture_output=True, text=True, env=ENV, timeout=60)
            if st.returncode == 0:
                statuses.append(json.loads(st.stdout))
            time.sleep(0.2)
        out, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"name": name, "rc": proc.returncode, "out": out, "err": err, "folder": report, "statuses": statuses,
            "report": json.loads((report / "report.json").read_text()) if (report / "report.json").exists() else None}


def mode(replayed, name):
    return next(m for m in replayed["report"]["modes"] if m["mode"] == name)


def test_replay_runs_every_mode_and_ends_with_a_few_lines(replayed):
    assert replayed["rc"] == cli.EXIT_OK, replayed["err"]
    assert [m["mode"] for m in replayed["report"]["modes"]] == ["none", "cap", "admission"]
    lines = replayed["out"].splitlines()
    # what a person reads fits under the boot lines on an 80x24 terminal: no table, no glossary
    assert len(lines) <= 10 and max(map(len, lines[:-1])) <= 80, replayed["out"]  # the last: the path
    assert [line.split()[0] for line in lines[1:4]] == ["none", "cap", "admission"]
    assert any(line.startswith("The admission bought") for line in lines)
    assert lines[-1].startswith(f"report: {replayed['folder'] / 'report.md'}")


def test_fleetctl_status_reads_the_replay_fleet(replayed):
    statuses = replayed["statuses"]
    assert statuses, "fleetctl status never read the replay fleet's table"
    assert all(st["fleet"] == replayed["name"] and st["alive"] and st["mode"] == "embedded" for st in statuses)
    assert max(st["ledger"]["submitted"] for st in statuses) > 0  # read while units were going through


def test_fleetctl_status_shows_the_admission_modes_bulkheads(replayed):
    """The admission mode goes through the fleet's own admission: its bulkheads are in the shared
    table, and `fleetctl status` reads them while the replay runs."""
    rows = [row for st in replayed["statuses"] for row in st.get("bulkheads", [])]
    assert {row["pool"] for row in rows} >= {"m@p/k1"}, rows
    assert any(row["successes"] + row["refusals"] > 0 for row in rows), rows


@pytest.mark.parametrize("name", ["none", "cap", "admission"])
def test_ledger_exact_and_counts_are_the_simulators(replayed, name):
    m = mode(replayed, name)
    assert m["ledger"]["exact"], m["ledger"]
    assert m["ledger"]["ledger"]["submitted"] == m["ledger"]["submitted_by_replay"] > 0
    assert m["counts_match"], (m["pools"], m["simulator"])
    assert m["rounds"] == 17 and m["ok"] + m["not_ok"] == 17
    ended_refused = sum(1 for r in m["round_log"] if r["status"] in ("429", "402", "403"))
    assert m["not_ok"] == m["failed"] + m["cut"] + ended_refused == m["failed"] + m["cut"] + sum(m["refused"].values())
    sim_429 = sum(c["429"] for c in m["simulator"].values())
    assert m["refusals_met"]["429"] == sim_429 == sum(1 for r in m["round_log"] for _p, st in r["tries"] if st == 429)
    assert len(m["lag_ms"]) and m["lag_ms"]["n"] == 17
    assert m["lag_ms"]["driver"] == "realtime"  # CI runs as root: the driver thread was real-time


def test_none_mode_meets_429s_above_k(replayed):
    m = mode(replayed, "none")
    assert m["refusals_met"]["429"] >= 1
    assert m["simulator"]["m@p"]["max_concurrency"] == 3
    assert m["moved"] == 0


def test_cap_mode_never_exceeds_its_cap(replayed):
    m = mode(replayed, "cap")
    assert m["refusals_met"]["429"] == 0 and m["ok"] == 17
    assert m["simulator"]["m@p"]["max_concurrency"] <= 3


def test_admission_mode_moves_rounds_to_the_alternative(replayed):
    m = mode(replayed, "admission")
    assert m["moved"] >= 1
    # every round that reached q was moved there by the fleet's admission (some then ran on p again)
    reached_q = [r for r in m["round_log"] if any(pool == "m@q" for pool, _status in r["tries"])]
    assert len(moved := [r for r in m["round_log"] if r["moved"]]) <= len(reached_q) <= m["admission_moved"]
    assert moved
    assert m["simulator"]["m@q"]["200"] >= m["moved"]
    moved = [r for r in m["round_log"] if r["moved"]]
    assert all(r["pool"] == "m@q" for r in moved)
    # a refused round waits and runs (000 §8): every round ends ok, its 429s counted
    assert m["ok"] == 17 and m["not_ok"] == 0 and sum(m["refused"].values()) == 0
    assert m["refusals_met"]["429"] >= 1 and all(r["status"] == "ok" for r in m["round_log"])
    retried = [r for r in m["round_log"] if len(r["tries"]) > 1]
    assert retried and all(r["tries"][-1][1] == 200 for r in retried)


def test_report_files_and_png(replayed):
    import matplotlib.image as mpimg

    folder = replayed["folder"]
    md = (folder / "report.md").read_text()
    assert md.count("| auto |") >= 3
    img = mpimg.imread(str(folder / "timeline.png"))
    height, width = img.shape[:2]
    assert 600 <= width <= 2000 and 3 * 200 <= height <= 3000  # three panels


def test_show_re_renders_a_saved_report(replayed, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    folder.mkdir()
    shutil.copy(replayed["folder"] / "report.json", folder / "report.json")
    out = subprocess.run([sys.executable, "-m", "fleet.burst.cli", "show", str(folder)], capture_output=True,
                         text=True, env=ENV, timeout=BOUND_S)
    assert out.returncode == cli.EXIT_OK, out.stderr
    assert (folder / "report.md").read_text() == (replayed["folder"] / "report.md").read_text()
    assert (folder / "timeline.png").stat().st_size > 10_000
    assert out.stdout.splitlines()[2].split()[:3] == ["cap", "ok", str(mode(replayed, "cap")["ok"])]


def test_show_refuses_what_is_not_a_report(tmp_path):
    (tmp_path / "report.json").write_text('{"version": 99}')
    assert cli.main(["show", str(tmp_path)]) == cli.EXIT_BAD_REPORT
    assert cli.main(["show", str(tmp_path / "missing.json")]) == cli.EXIT_BAD_REPORT


def test_admission_rounds_held_by_a_backoff_start_when_it_ends(tmp_path):
    """Two rounds arrive while a 429 backs the only pool off and nothing else is running: only the
    end of the backoff can start them (not a completion). None may be cut at the horizon: the fleet's
    admission runs on the replay clock (on the host's clock, Retry-After 20 would outlast the horizon)."""
    from fleet.burst.runner import replay
    from fleet.burst.trace import load

    header = {"format": FORMAT, "version": VERSION, "name": "backoff", "start": "2026-10-07T09:00:00Z", "seed": 1,
              "horizon_s": 200, "pools": [{"model": "m", "provider": "p", "k": 1, "retry_after_s": 20,
                                           "latency": {"median_s": 2, "sigma": 0}}]}
    rows = [json.dumps(header)]
    route = {"model": "m", "provider": "p", "credential": "k"}
    for i, t in enumerate((0.0, 0.0, 0.0, 10.0, 10.0)):
        rows.append(json.dumps({"t": t, "id": f"r{i}", "role": "review", "lane": "review", "route": route}))
    path = tmp_path / "backoff.jsonl"
    path.write_text("\n".join(rows) + "\n")
    rep = replay(load(str(path)), modes=("admission",), speed=20.0, progress=False, name=unique_name("bo"))
    m = rep["modes"][0]
    assert m["refusals_met"]["429"] >= 1, "the first burst must meet the pool's K"
    assert m["cut"] == 0 and m["ok"] == 5, m["round_log"]  # every round ran: a refused one waits and runs
    late = [r for r in m["round_log"] if r["id"] in ("r3", "r4")]
    # both start once the backoff (Retry-After 20) has ended; with K 1 one may meet a 429 and run later
    assert all(r["started"] >= 20.0 and r["status"] == "ok" for r in late), late
    assert m["ledger"]["exact"]


def test_cpu_quota_runs_inside_the_tools_own_group_and_removes_it(tmp_path):
    """As root with v1 cpu (CI): the fleet sees the group's quota; the group is gone afterwards."""
    from tests.cgroups import require_v1_cpu

    require_v1_cpu()
    import glob

    from fleet.burst.runner import replay
    from fleet.burst.trace import load

    header = {"format": FORMAT, "version": VERSION, "name": "quota", "start": "2026-09-08T00:00:00Z",
              "modes": ["none"], "horizon_s": 60}
    rows = [json.dumps(header)] + [json.dumps({"t": i * 0.01, "id": f"c{i}", "role": "crunch", "cpu_ms": 2.0})
                                   for i in range(20)]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(rows) + "\n")
    before = set(glob.glob("/sys/fs/cgroup/cpu/fleet-burst-*"))
    with open("/proc/self/cgroup") as f:
        home = f.read()
    rep = replay(load(str(path)), speed=1.0, progress=False, name=unique_name("quota"), cpu_quota=2.0)
    m = rep["modes"][0]
    assert m["ledger"]["exact"] and m["ok"] == 20
    assert rep["cpu_quota"]["cpu_stat"]["nr_periods"] > 0  # the fleet ran under the group's CFS quota
    assert rep["cpu_quota"]["cgroup"] not in before and not os.path.exists(rep["cpu_quota"]["cgroup"])
    assert set(glob.glob("/sys/fs/cgroup/cpu/fleet-burst-*")) == before
    with open("/proc/self/cgroup") as f:
        assert f.read() == home  # this process is back where it was


def test_cpu_quota_needs_root(tmp_path):
    """Not root: a typed refusal before anything runs, exit EXIT_NO_CGROUP."""
    trace = tmp_path / "t.jsonl"
    write_trace(trace)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child drops to uid 65534 and runs the command
        code = 1
        try:
            # the burst extra, loaded while this process may still read the interpreter's
            # site-packages (under /root here): a user who is not root has an install of their own
            import httpx, matplotlib, tqdm  # noqa: E401, F401
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            sys.stderr = os.fdopen(write_end, "w")  # pytest's capture is not fd 2
            code = cli.main(["replay", str(trace), "--modes", "none", "--cpu-quota", "2", "--no-progress",
                             "--report", str(tmp_path / "r")])
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        stderr = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == cli.EXIT_NO_CGROUP == 91, stderr
    assert "needs root" in stderr and not (tmp_path / "r").exists()


def test_admission_through_the_fleet_loses_no_round_of_burst_35(tmp_path):
    """The shipped 35-head burst, same seed: with the fleet's own admission (submit with route=,
    lane=, severity=, age=) every round runs, its 429s counted, where dispatching everything at once
    loses rounds to them; every unit one outcome; the report's counts are the simulator's."""
    from fleet.burst.runner import replay
    from fleet.burst.trace import load

    rep = replay(load(os.path.join(REPO, "examples", "traces", "burst-35.jsonl")), modes=("none", "admission"),
                 speed=60.0, seed=35, progress=False, name=unique_name("b35"))
    none, adm = rep["modes"]
    for m in (none, adm):
        assert m["ledger"]["exact"], m["ledger"]
        assert m["counts_match"], (m["pools"], m["simulator"])
        assert m["ok"] + m["not_ok"] == m["rounds"] == 105
    assert none["moved"] == 0 and none["admission_moved"] is None
    # control: without admission a refused round is lost, one round per 429 met
    assert none["not_ok"] == none["refused"]["429"] == none["refusals_met"]["429"] > 0
    assert adm["ok"] == 105 and adm["not_ok"] == 0, adm["round_log"]
    assert adm["refusals_met"]["429"] == sum(c["429"] for c in adm["simulator"].values()) > 0
    assert adm["moved"] >= 1 and adm["admission_moved"] >= adm["moved"]
    # a follow-up comes after its parent ended: it is no delegation (a parent must be running)
    assert adm["delegated"] == 0


def test_a_closure_lifted_before_the_modes_end_is_in_the_report_and_its_timeline(tmp_path):
    """A key meets its daily limit at 10 s and is topped up at 40 s: the round refused there waits,
    is the probe every 10 s, and runs once a probe passes; the closure is over before the mode ends.
    The report still lists it (admission_closures, from its refusal to its end) and the timeline
    draws it, though no round ended on the 403 and no closure is live at the end."""
    from fleet.burst.runner import replay
    from fleet.burst.timeline import figure
    from fleet.burst.trace import load

    header = {"format": FORMAT, "version": VERSION, "name": "topup", "start": "2026-10-07T09:00:00Z", "seed": 1,
              "horizon_s": 300, "admission": {"daily_limit_probe_every": 10},
              "keys": [{"credential": "k", "provider": "p", "daily_limit_at": [10], "top_ups": [40]}],
              "pools": [{"model": "m", "provider": "p", "k": 8, "latency": {"median_s": 2, "sigma": 0}}]}
    route = {"model": "m", "provider": "p", "credential": "k"}
    rows = [json.dumps(header)] + [json.dumps({"t": t, "id": f"r{i}", "role": "review", "lane": "review",
                                               "route": route}) for i, t in enumerate((0.0, 12.0))]
    path = tmp_path / "topup.jsonl"
    path.write_text("\n".join(rows) + "\n")
    rep = replay(load(str(path)), modes=("admission",), speed=20.0, progress=False, name=unique_name("tu"))
    m = rep["modes"][0]
    assert m["ok"] == 2 and m["refusals_met"]["403"] >= 1, m["round_log"]  # refused, waited, ran
    (closure,) = m["admission_closures"]  # refused probes renew it: one closure
    assert (closure["provider"], closure["credential"], closure["cause"]) == ("p", "k", "daily-limit")
    assert 10.0 <= closure["from"] < 40.0  # from the round's refusal ...
    # ... to the clean probe that lifted it (after the top-up), not to its midnight
    assert 40.0 <= closure["until"] < header["horizon_s"]
    fig = figure(rep)
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any(n.startswith("closed 09:00") for n in notes), notes  # drawn where it began (UTC)
