"""tools/bench/dispatch_bench.py's --noisy, --service and --only-start modes at a tiny size: each prints
the rows it promises (every quiet ratio has its noisy twin and its quotient; the service's
ratios), and leaves nothing behind -- no noise process, no fleetd, no /dev/shm segment --
even when the bench itself is killed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.daemons import BOUND_S, wait_until
from tests.require import NOISE_ALONE

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "tools", "bench", "dispatch_bench.py")
TINY = ["--units", "200", "--repeat", "1", "--json"]


def run_bench(*argv: str) -> dict:
    out = subprocess.run([sys.executable, BENCH, *argv, *TINY], capture_output=True, text=True, timeout=240, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def bench_peers():
    """The bench's per-unit submit peers: (row, the key of its rate)."""
    return _bench().SUBMIT_PEERS


def _bench():
    """tools/bench/dispatch_bench.py as a module (its helpers, without running it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dispatch_bench_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_submit_is_read_against_the_fastest_peer_of_the_run():
    """`best_submit_peer`: the peer whose per-unit submit ran fastest (mpire's per-unit form
    is apply_async, not its map), a peer not installed left out."""
    bench = _bench()
    res = {"process_pool_executor": {"submit_units_per_s": 11_000.0},
           "loky": {"submit_units_per_s": 9_800.0, "map_chunk64_units_per_s": 5e5},
           "mpire": {"apply_async_units_per_s": 16_800.0, "map_default_units_per_s": 170_000.0}}
    assert bench.best_submit_peer(res) == ("mpire", 16_800.0)
    res["mpire"] = {}  # mpire not installed: its row is there, empty
    assert bench.best_submit_peer(res) == ("process_pool_executor", 11_000.0)
    res["loky"]["submit_units_per_s"] = 12_000.0
    assert bench.best_submit_peer(res) == ("loky", 12_000.0)


def test_the_host_says_what_it_does_with_an_idle_cpu(tmp_path):
    """Every mode reports the host's idle settings: on a guest that halts at once the peers'
    round trips pay the hypervisor's wake-up, and the ratios are read against it."""
    bench = _bench()
    cpuidle, haltpoll = tmp_path / "devices/system/cpu/cpuidle", tmp_path / "module/haltpoll/parameters"
    cpuidle.mkdir(parents=True)
    haltpoll.mkdir(parents=True)
    (cpuidle / "current_driver").write_text("haltpoll\n")
    (cpuidle / "current_governor").write_text("menu\n")  # an older kernel: no current_governor_ro
    (haltpoll / "guest_halt_poll_ns").write_text("200000\n")
    assert bench.host_idle(str(tmp_path)) == {"cpuidle_driver": "haltpoll", "cpuidle_governor": "menu",
                                              "guest_halt_poll_ns": 200000}
    (cpuidle / "current_governor_ro").write_text("haltpoll\n")
    assert bench.host_idle(str(tmp_path))["cpuidle_governor"] == "haltpoll"
    assert bench.host_idle(str(tmp_path / "elsewhere")) == dict.fromkeys(bench.HOST_IDLE)  # none of them here


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@NOISE_ALONE
def test_noisy_reports_every_ratio_quiet_noisy_and_its_quotient():
    res = run_bench("--noisy")
    noisy = res["noisy"]
    assert isinstance(noisy["noise_core"], int)
    for row in ("fleet_slots_eq_workers", "fleet_slots_32_per_worker", "fleet_executor", "process_pool_executor",
                "multiprocessing_pool", "bare_processes"):
        assert row in res and row in noisy, row
        assert set(noisy[row]) >= set(res[row]) - {"runs"}, row  # the same measures, noisy
    quiet, loud, quot = res["ratios"], noisy["ratios"], noisy["quotients"]
    for key in ("submit_fleet_over_ppe", "map_chunk1_fleet_over_pool", "map_chunk64_fleet_over_pool",
                "latency_p50_fleet_over_ppe", "spin50_fleet_of_limit", "executor_submit_over_ppe",
                "executor_p50_over_ppe"):
        assert key in quiet and key in loud, key
    assert set(loud) == set(quiet)
    assert set(quot) == {k for k in quiet if quiet[k] and loud[k]}
    # submit against the run's fastest peer, never above the ratio against ProcessPoolExecutor
    peer = res["best_submit_peer"]
    assert quiet["executor_submit_over_best_peer"] == pytest.approx(
        res["fleet_executor"]["submit_units_per_s"] / res[peer][dict(bench_peers())[peer]], abs=0.01)
    assert quiet["executor_submit_over_best_peer"] <= quiet["executor_submit_over_ppe"]
    assert quiet["submit_fleet_over_best_peer"] <= quiet["submit_fleet_over_ppe"]
    # the quotient is noisy / quiet, turned over for a latency (lower is better there)
    k = "submit_fleet_over_ppe"
    assert quot[k] == pytest.approx(loud[k] / quiet[k], abs=2e-3)
    k = "latency_p50_fleet_over_ppe"
    assert quot[k] == pytest.approx(quiet[k] / loud[k], abs=2e-3)
    assert "quotients" in res["targets"]
    # each contender's own figures, noisy / quiet (the p50 turned over), from the rows themselves
    kept = noisy["held"]
    assert set(kept) >= {"fleet_slots_eq_workers", "fleet_executor", "process_pool_executor", "multiprocessing_pool"}
    row, twin = res["process_pool_executor"], noisy["process_pool_executor"]
    assert kept["process_pool_executor"]["submit_units_per_s"] == pytest.approx(
        twin["submit_units_per_s"] / row["submit_units_per_s"], abs=2e-3)
    assert kept["process_pool_executor"]["latency_p50"] == pytest.approx(
        row["latency_us"]["p50"] / twin["latency_us"]["p50"], abs=2e-3)
    assert set(kept["fleet_executor"]) >= {"submit_units_per_s", "map_chunk1_units_per_s", "latency_p50"}
    # what each fleet's contention watch did over the run (widened, re-pinned, episodes per seat)
    assert set(noisy["contention"]) == {"fleet_slots_eq_workers", "fleet_slots_32_per_worker", "fleet_executor"}
    for counts in noisy["contention"].values():
        assert counts["widened"] >= counts["repinned"] >= 0 and all(e >= 0 for e in counts["episodes"]), counts


def test_service_reports_submit_ratio_and_p50_and_cleans_up():
    res = run_bench("--service")
    svc = res["service"]
    name = svc["fleetd"]["name"]
    assert svc["fleetd"]["workers"] == svc["process_pool_executor"]["workers"] == 1
    for row in ("fleetd", "process_pool_executor"):
        assert svc[row]["submit_units_per_s"] > 0
        assert 0 < svc[row]["latency_us"]["p50"] <= svc[row]["latency_us"]["p99"]
    r = res["ratios"]
    assert set(r) == {"service_submit_over_ppe", "service_p50_over_ppe", "service_submit_units_per_s", "service_p50_us"}
    assert res["host"] == _bench().host_idle()  # what the figures were measured on
    assert r["service_p50_us"] == svc["fleetd"]["latency_us"]["p50"]
    # the client's plain submits went through its inlet, every batch
    assert svc["fleetd"]["through_inlet"] == svc["fleetd"]["frames"] > 0
    assert not [e for e in os.listdir("/dev/shm") if name in e]
    assert not [p for p in psutil.process_iter(["cmdline"]) if name in " ".join(p.info["cmdline"] or [])]


def test_service_stages_reports_every_stage_and_cleans_up():
    stages = os.path.join(REPO, "tools", "bench", "service_stages.py")
    out = subprocess.run([sys.executable, stages, "--units", "60", "--json"], capture_output=True, text=True,
                         timeout=240, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    sys.path.insert(0, os.path.dirname(stages))
    try:
        import service_stages
    finally:
        sys.path.pop(0)
    assert res["round_trips"] > 0 and set(res["stages_p50_us"]) == {name for name, _, _ in service_stages.STAGES}
    name = res["name"]
    assert not [e for e in os.listdir("/dev/shm") if name in e]
    assert not [p for p in psutil.process_iter(["cmdline"]) if name in " ".join(p.info["cmdline"] or [])]


def test_service_stages_counts_each_threads_work_and_cleans_up():
    """`--calls`: per round trip, each party's on-CPU time and its wait for a CPU (the
    client, fleetd's control thread, its loop, its worker), the wall time, and Python calls
    (the client's, the control thread's, the loop's), from real fleetds that leave nothing
    behind."""
    stages = os.path.join(REPO, "tools", "bench", "service_stages.py")
    out = subprocess.run([sys.executable, stages, "--calls", "--units", "60", "--json"], capture_output=True,
                         text=True, timeout=240, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    assert res["round_trips"] == 60 and len(res["fleets"]) == 2
    parties = {"client: every thread", "fleetd: control thread", "fleetd: loop", "fleetd: workers"}
    cpu, waits, wall = res["cpu_us_per_round_trip"], res["cpu_wait_us_per_round_trip"], res["wall_us_per_round_trip"]
    assert set(cpu) == set(waits) == parties
    # the client's batches go through its inlet: fleetd's control thread has next to nothing of them
    assert cpu["client: every thread"] > 0 and cpu["fleetd: loop"] > 0 and cpu["fleetd: control thread"] >= 0
    assert cpu["fleetd: workers"] > 0  # the worker ran every unit (its fork server is not counted)
    assert all(us >= 0 for us in waits.values())
    # the parties cannot use more CPU than the machine has over the round trips (a unit
    # slip, ns for us, would pass it many times over); the reads of /proc around them add a little
    assert 0 < sum(cpu.values()) <= os.cpu_count() * wall + 5000 / 60
    calls = res["python_calls_per_round_trip"]
    assert set(calls) == {"client: caller", "client: reader", "fleetd: control thread", "fleetd: loop"}
    assert calls["client: caller"] > 10 and calls["client: reader"] > 10  # each one's path is dozens of calls
    assert 0 <= calls["fleetd: control thread"] < calls["client: reader"]
    assert calls["fleetd: loop"] > calls["client: caller"]  # the loop takes each unit in and its outcome out
    for name in res["fleets"]:
        assert not [e for e in os.listdir("/dev/shm") if name in e]
        assert not [p for p in psutil.process_iter(["cmdline"]) if name in " ".join(p.info["cmdline"] or [])]


@NOISE_ALONE
def test_a_killed_bench_leaves_no_busy_process():
    """The noise process dies with the bench, however it dies (PR_SET_PDEATHSIG)."""
    # killed only once the noise is past its start (pinned: busy looping), not while it
    # could still see its parent gone on its own
    code = ("import os, signal, sys, time; sys.path.insert(0, sys.argv[1]); import dispatch_bench as d; "
            "n = d.Noise(); n.set(True); t = time.monotonic() + 60\n"
            "while os.sched_getaffinity(n.proc.pid) != {n.core} and time.monotonic() < t: time.sleep(0.01)\n"
            "time.sleep(0.2); print(n.proc.pid, flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.Popen([sys.executable, "-c", code, os.path.dirname(BENCH)], stdout=subprocess.PIPE, text=True,
                            cwd=REPO)
    pid = int(proc.stdout.readline())
    try:
        assert proc.wait(BOUND_S) == -signal.SIGKILL
        wait_until(lambda: gone(pid), "the noise process to die with the bench")
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)
        proc.stdout.close()


def test_only_start_reports_each_face_and_the_start_ratios():
    """--only-start: first result, the 100-item script, the idle tree's PSS and a worker's
    USS, for fleet.Executor and ProcessPoolExecutor, and the four ratios with their targets;
    the first result --start-samples times a round, the start scripts run by --python."""
    out = subprocess.run([sys.executable, BENCH, "--only-start", "--repeat", "1", "--start-samples", "3",
                          "--python", sys.executable, "--json"], capture_output=True, text=True, timeout=240, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    measures = {"first_result_s", "script_100_s", "idle_pss_mib", "idle_worker_uss_mib"}
    for face in ("fleet", "ppe"):
        row = res["start"][face]
        assert set(row) == measures | {"runs", "idle_by_process_mib"}, face
        assert all(row[m] > 0 and row["runs"][m] == [row[m]] for m in measures - {"first_result_s"}), row
        assert len(row["runs"]["first_result_s"]) == 3 and row["first_result_s"] == sorted(row["runs"]["first_result_s"])[1]
    # where the idle tree's memory is: fleet has a fork server, ProcessPoolExecutor none
    assert set(res["start"]["fleet"]["idle_by_process_mib"]) == {"parent", "fork_server", "workers"}
    assert set(res["start"]["ppe"]["idle_by_process_mib"]) == {"parent", "workers"}
    fl, ppe, r = res["start"]["fleet"], res["start"]["ppe"], res["ratios"]
    assert set(res["host"]) == set(_bench().HOST_IDLE)
    assert set(r) == set(res["targets"]) == {"executor_first_result_over_ppe", "executor_script_100_over_ppe",
                                             "executor_idle_pss_over_ppe_mib", "executor_worker_uss_over_ppe"}
    assert r["executor_first_result_over_ppe"] == pytest.approx(fl["first_result_s"] / ppe["first_result_s"], abs=6e-3)
    assert r["executor_idle_pss_over_ppe_mib"] == pytest.approx(fl["idle_pss_mib"] - ppe["idle_pss_mib"], abs=0.06)
    assert r["executor_worker_uss_over_ppe"] == pytest.approx(fl["idle_worker_uss_mib"] / ppe["idle_worker_uss_mib"],
                                                              abs=6e-3)


@pytest.mark.parametrize("args, says", [(["--start-samples", "0"], "--start-samples must be at least 1"),
                                        (["--python", "/no/such/python"], "is not an executable file")])
def test_only_start_refuses_a_bad_argument(args, says):
    out = subprocess.run([sys.executable, BENCH, "--only-start", *args], capture_output=True, text=True, timeout=60,
                         cwd=REPO)
    assert out.returncode == 2 and says in out.stderr
