"""tools/bench/cycle_bench.py at a tiny size: it prints the rows it promises (every
contender at every load: p50/p95/max and missed cycles per run and summed; the target's
ratio per load), every planned sim ran exactly once on every contender (each sim appends
its id to a log of its contender, load and run), and nothing of its fleets is left behind.
No figure is judged: speed is the bench's to report, not a test's to assert."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import fleet

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_DIR = os.path.join(REPO, "tools", "bench")
BENCH = os.path.join(BENCH_DIR, "cycle_bench.py")
LOADS = ("0.3", "0.6")
CYCLES, SEED = 3, 5
INSIDE = ("fleet_inside_auto", "fleet_inside_pinned")
EVERY = (*INSIDE, "fleet_outside_auto", "fleet_outside_pinned", "process_pool_executor")


def planned_ids(cycles: int, seed: int) -> list[str]:
    sys.path.insert(0, BENCH_DIR)
    try:
        import cycle_bench
    finally:
        sys.path.remove(BENCH_DIR)
    plan = cycle_bench.make_plan(seed, cycles)
    return [sim_id for cycle in plan for gaps in cycle for ids in gaps for sim_id in ids]


def test_a_tiny_run_reports_every_row_and_runs_every_sim_once(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    proc = subprocess.Popen([sys.executable, BENCH, "--json", "--runs", "1", "--cycles", str(CYCLES),
                             "--seed", str(SEED), "--loads", ",".join(LOADS), "--note-dir", str(notes)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    res = json.loads(out)

    # every contender ran, or says why it could not (only the inside face may be missing)
    inside_here = hasattr(fleet, "current_fleet")
    assert set(res["contenders"]) | set(res["absent"]) == set(EVERY)
    assert set(res["absent"]) == (set() if inside_here else set(INSIDE))
    assert set(res["scaling"]) == {*LOADS, "unit"}
    for name, row in res["contenders"].items():
        assert set(row["loads"]) == set(LOADS), name
        for load, at in row["loads"].items():
            (run,) = at["runs"]
            assert run["cycles"] == CYCLES and 0 <= run["missed"] <= CYCLES
            assert 0 < run["p50_ms"] <= run["p95_ms"] <= run["max_ms"]
            assert at["summary"] == {**run, "cycles": CYCLES}
    if inside_here:
        assert set(res["target"]) >= {f"p95_over_pool_{load}" for load in LOADS} | {"met"}
    for name in ("fleet_outside_pinned", "fleet_inside_pinned"):
        if name in res["contenders"]:
            assert res["contenders"][name]["binding"] == "pinned"

    # every planned sim ran exactly once, on every contender at every load (its own log)
    # -- the run's plan is seed + 0; the warm-up's sims note nothing
    want = collections.Counter(planned_ids(CYCLES, SEED))
    assert len(want) == sum(want.values()) >= CYCLES * 85
    for name, row in res["contenders"].items():
        for load in LOADS:
            ran = collections.Counter((notes / f"{name}-{load}-0.log").read_text().split())
            assert ran == want, (name, load, ran - want, want - ran)
            (tally,) = row["loads"][load]["sims"]
            assert tally == {"sims_planned": len(want), "sims_returned": len(want), "sims_twice": 0,
                             "sims_missing": 0}, (name, load)
        if "ledger" in row:  # a fleet's ledger balances: everything submitted solved
            ledger = row["ledger"]
            assert ledger["failed"] == ledger["suppressed"] == 0 and ledger["solved"] == ledger["submitted"]

    # nothing of its fleets is left behind
    assert not [e for e in os.listdir("/dev/shm") if e.startswith(f"fleet.cycle-{proc.pid}-")]
