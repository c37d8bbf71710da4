"""Fractional quotas on real fleets (002 §5): the fraction of a 4.5-CPU quota is spent by
the I/O-dominant role on a seat of its own; any quota above zero runs (the Executor: one
worker within half a CPU, pinned); oversubscription stays the caller's explicit choice."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import fleet
from fleet.api.executor import quota_cores
from tests.cgroups import cpu_group
from tests.daemons import BOUND_S
from tests.fleets import config, role, running, worker_pids

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = """
import json, logging, os, sys

import fleet

def cpu_cgroup():
    with open("/proc/self/cgroup") as f:
        return next(line.split(":", 2)[2].strip() for line in f if ":cpu," in line or ":cpu:" in line)

def where(x):
    return x * x, os.getpid(), sorted(os.sched_getaffinity(0)), cpu_cgroup()

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
    with fleet.Executor() as ex:
        results = list(ex.map(where, range(200)))
        plan = ex.fleet.plan.to_dict()
        # the seats this quota runs (laid out for the CPUs a larger quota could give)
        placement = ex.fleet._sup.follow.placement
        seats = [dict(s.to_dict(), cpus=list(placement.cpus[s.index])) for s in ex.fleet.layout.seats
                 if s.index in placement.live]
    print(json.dumps({"results": results, "plan": plan, "seats": seats}))
"""


def test_an_executor_under_half_a_cpu_maps_to_completion_on_one_pinned_worker(tmp_path):
    script = tmp_path / "half.py"
    script.write_text(SCRIPT)
    with cpu_group(0.5) as group:
        proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=group.enter_self,
                                env={**os.environ, "PYTHONPATH": REPO})
        # half a CPU runs everything at half speed: a generous bound on a hang, never a figure
        out, err = proc.communicate(timeout=4 * BOUND_S)
        inside = "/" + os.path.relpath(group.path, "/sys/fs/cgroup/cpu")
    assert proc.returncode == 0, err[-3000:]
    doc = json.loads(out)
    assert [r[0] for r in doc["results"]] == [x * x for x in range(200)]
    plan = doc["plan"]["plan"]
    assert (plan["quota_cpus"], plan["binding"], plan["oversubscribed"]) == (0.5, "serial", False)
    assert plan["fractional"].startswith("quota 0.5 CPUs is fractional, below one CPU: one worker seat")
    assert doc["plan"]["budget"]["consumers"][-1]["name"] == "serial-0"
    assert doc["plan"]["budget"]["consumers"][-1]["cores"] == 0.5
    # one worker, in the group, pinned to one CPU (the ceiling of 0.5: it stays schedulable)
    [seat] = doc["seats"]
    assert len(seat["cpus"]) == 1
    assert len({r[1] for r in doc["results"]}) == 1
    assert {(tuple(r[2]), r[3]) for r in doc["results"]} == {(tuple(seat["cpus"]), inside)}
    # and the boot log said so, at INFO (an embedded program's stderr stays its own)
    assert "INFO fleet executor-" in err and "quota 0.5 CPUs is fractional, below one CPU" in err, err[-3000:]
    assert "WARNING" not in err, err[-3000:]


def test_oversubscribe_still_runs_every_worker_asked_for():
    """max_workers past the quota with oversubscribe=True: the caller's own opt-in
    (budget.oversubscribe) runs them all, marked oversubscribed."""
    cores = quota_cores()
    with fleet.Executor(max_workers=cores + 2, oversubscribe=True) as ex:
        assert sorted(ex.map(abs, range(-20, 0))) == list(range(1, 21))
        assert len(ex.fleet.layout.seats) == cores + 2 and ex.fleet.plan.oversubscribed


def test_the_remainder_at_4_5_is_spent_by_the_io_role_on_a_seat_of_its_own(fleet_name, tmp_path):
    """002 §5's own example: Q = 4.5. The reserve, the ambient runtime and serial-0 take
    three whole cores; the rest (its 0.5, and the core serial-0 leaves) is the I/O role's,
    on a worker of its own: its waits run while serial-0's CPU-bound unit holds that seat.
    (Laid on this host's two CPUs, the plan's five wrap around them.)"""
    cfg = config(fleet_name, {"crunch": role("wait_for_file", slots=1),
                              "net": role("whoami", slots=4, io_bound=True, peak_cpus=0)}, profile="serial")
    cfg["fleet"]["cpus"] = 4.5  # the reference profile's tier at 4.5 (its pinned floor is 6)
    gate = tmp_path / "go"
    with running(cfg, cpus=[0, 1]) as f:
        assert f.plan.binding == "serial" and f.plan.budget.share("net").cores == 1.5
        assert f.plan.budget.unallocated == 0 and f.plan.budget.share("serial-0").lanes == ("crunch",)
        seats = {s.name: s for s in f.layout.seats}
        assert sorted(seats) == ["net-0", "serial-0"] and seats["net-0"].binding == "shared"
        assert seats["serial-0"].cpus == (0,) and seats["net-0"].cpus == (1, 0)  # reserve 0, ambient 1, serial-0 0
        worker_pids(f)
        pids = f._sup.pids()
        serial, net = pids[seats["serial-0"].index], pids[seats["net-0"].index]
        assert serial != net
        busy = f.submit("crunch", (str(gate), 3))  # holds serial-0 until the gate opens
        answers = [f.submit("net", i).result(BOUND_S) for i in range(8)]
        assert answers == [(i, net) for i in range(8)] and not busy.done()
        gate.touch()
        assert busy.result(BOUND_S) == 9
        # each worker pins itself before its first unit: both have run one now
        assert os.sched_getaffinity(net) == {0, 1} and os.sched_getaffinity(serial) == {0}
