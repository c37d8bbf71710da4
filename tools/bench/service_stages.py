#!/usr/bin/env python3
"""Where a service-mode round trip's time goes: p50 of each stage, in microseconds.

    python tools/bench/service_stages.py [--json] [--units N]
    python tools/bench/service_stages.py --calls [--json] [--units N]

A diagnostic, not a ratio: it times ``client.submit("work", 0).result()`` one unit at a
time through a real fleetd (dispatch_bench's `Fleetd`: one role, one worker) and stamps
the steps on both sides of the socket by wrapping them (CLOCK_MONOTONIC is one clock for
every process of the machine, so the stamps line up). fleetd's stamps are written to a
file when it stops; each round trip takes, step by step, the first stamp of each step inside
its window after the step before it.

  client: submit -> sent          the caller's checks, pickling, the batch frame, its write
  sent -> fleetd reads            waking fleetd's control thread
  reads -> decoded                the frame decoded and checked (submit_batch)
  decoded -> admitted             the unit queued to the supervisor (its reply's unit id)
  admitted -> loop takes it       waking the supervisor's loop (and it taking the GIL, which
                                  the control thread holds on; negative when the loop took
                                  the unit before the admission's reply was made)
  taken -> granted                the loop's accept and the dispatcher's grant
  granted -> sent to the worker   the slot's transition and the push that wakes the worker
  sent -> result taken            waking the worker, the handler, its result, the loop seeing it
  result taken -> outcome held    the outcome recorded, the delivery up to its record
  outcome held -> push made       the rest of the delivery, the push frame made (on the loop)
  push made -> client reads       the write, waking the client's reader, the frame decoded
  client reads -> future set      the record parsed, the value unpickled, the future set
  future set -> caller back       waking the caller

`--calls` (the same round trips, seen as work): per round trip, each party's on-CPU time
and its time runnable but waiting for a CPU (/proc/<pid>/task/<tid>/schedstat, its first
two fields): the client's threads together, fleetd's control thread, its loop (whose look
before it sleeps counts as CPU) and its worker (whose look for its next task counts too).
The wall time beside it: when the parties' CPU comes near twice the wall on a 2-core
machine, a round trip is short of CPU, and the waits say who goes without. Then one more
run with the client's caller, its reader, fleetd's control thread and its loop under
cProfile: their Python calls per round trip, fixed for a given tree whatever the machine
is doing, which is how a change to their per-frame paths is read on a host too noisy to
time it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dispatch_bench  # noqa: E402

#: What fleetd runs first: its own steps wrapped to stamp the first call after each
#: other, the stamps written to $STAGES_OUT when it exits.
PRELUDE = """
import atexit, json, os, time
from fleet.service.control import server as _server
from fleet.service.control import outcome_record as _record
from fleet.service.control.ops import units as _units
from fleet.service import daemon as _daemon
_now, _stamps = time.perf_counter_ns, []

def _wrap(owner, name, key, after=False):
    original = getattr(owner, name)
    def stamped(*args, **kwargs):
        if not after:
            _stamps.append((key, _now()))
        out = original(*args, **kwargs)
        if after:
            _stamps.append((key, _now()))
        return out
    setattr(owner, name, stamped)

_wrap(_server.ControlServer, "_read", "d_read")
try:  # a batch through the client's inlet: the loop reads it (fleet.service.inlets)
    from fleet.service import inlets as _inlets
    _wrap(_inlets.Inlets, "_batch", "d_read")
except ImportError:  # a fleet from before the inlets
    pass
_wrap(_units.SubmitBatchOp, "on_daemon", "d_decoded")
_wrap(_units.SubmitBatchOp, "on_daemon", "d_admitted", after=True)
_wrap(_record, "encode", "d_held")
# the supervisor's loop (the same steps latency_stages.py stamps for fleet.Executor)
from fleet.runtime import intake as _intake, seats as _seats, results as _results
from fleet.rules import dispatch as _dispatch
_wrap(_intake.Intake, "drain", "d_taken")
_wrap(_dispatch.Dispatcher, "grant", "d_granted", after=True)
_wrap(_seats.Seats, "send", "d_sent", after=True)
_wrap(_results.Results, "handle", "d_result")
import os as _os
if _os.environ.get("STAGES_FINE"):
    from fleet.runtime import submit as _submit
    _wrap(_server.ControlServer, "_check", "d_checked", after=True)
    _wrap(_daemon.OutcomeStore, "hold", "d_token_held", after=True)
    _wrap(_submit.Submitter, "submit_pickled", "d_posted", after=True)
if hasattr(_server, "Stream"):  # outcomes pushed on the submit connection
    _wrap(_server.ControlServer, "_push_some", "d_pushed")
    _wrap(_server.Stream, "write", "d_pushed")
else:  # a fleet from before the push: the collect reply carries them (its answer, on the control thread)
    _wrap(_server.ControlServer, "_answer", "d_pushed")
atexit.register(lambda: json.dump(_stamps, open(os.environ["STAGES_OUT"], "w")))
"""

STAGES = (
    ("client: submit -> sent", "c_submit", "c_sent"),
    ("sent -> fleetd reads", "c_sent", "d_read"),
    ("reads -> decoded", "d_read", "d_decoded"),
    ("decoded -> admitted", "d_decoded", "d_admitted"),
    ("admitted -> loop takes it", "d_admitted", "d_taken"),
    ("taken -> granted", "d_taken", "d_granted"),
    ("granted -> sent to the worker", "d_granted", "d_sent"),
    ("sent -> result taken", "d_sent", "d_result"),
    ("result taken -> outcome held", "d_result", "d_held"),
    ("outcome held -> push made", "d_held", "d_pushed"),
    ("push made -> client reads", "d_pushed", "c_read"),
    ("client reads -> future set", "c_read", "c_set"),
    ("future set -> caller back", "c_set", "c_back"),
)


def measure(units: int) -> dict:
    from fleet.api import client as client_mod
    from fleet.api import submit_pipe

    now, stamps = time.perf_counter_ns, []

    def wrap(owner, name, key, after=False):
        original = getattr(owner, name)

        def stamped(*args, **kwargs):
            if not after:
                stamps.append((key, now()))
            out = original(*args, **kwargs)
            if after:
                stamps.append((key, now()))
            return out

        setattr(owner, name, stamped)

    wrap(submit_pipe.SubmitPipe, "_write_frame", "c_sent", after=True)
    wrap(client_mod.Client, "_deliver", "c_read")
    wrap(client_mod.Client, "_deliver", "c_set", after=True)
    with tempfile.NamedTemporaryFile(prefix="stages-", suffix=".json", dir="/tmp", delete=False) as f:
        out = f.name  # fleetd writes its stamps here when it stops
    os.environ["STAGES_OUT"] = out
    dispatch_bench.FLEETD = PRELUDE + dispatch_bench.FLEETD
    windows = []
    try:
        with dispatch_bench.Fleetd(units) as daemon:
            with daemon.connect() as client:
                [client.submit("work", i).result() for i in range(200)]  # warm
                for _ in range(units):
                    t0 = now()
                    stamps.append(("c_submit", t0))
                    client.submit("work", 0).result()
                    t1 = now()
                    stamps.append(("c_back", t1))
                    windows.append((t0, t1))
        name = daemon.name
        with open(out) as f:
            stamps.extend((k, t) for k, t in json.load(f))  # written at fleetd's exit, once it stopped
    finally:
        if os.path.exists(out):
            os.unlink(out)
    return {"name": name, **stages(windows, stamps)}


#: A step looked for after an earlier one than the step before it: fleetd may read the
#: frame before the client's write returns (its stamp, after the write), and the loop may
#: take the unit before the admission that posted it returns (its stamp, after the reply
#: is made): that stage is then negative, for that round trip.
_AFTER = {"d_read": "c_submit", "d_taken": "d_decoded"}


def stages(windows: list, stamps: list) -> dict:
    """The p50 of each stage over the round trips whose every step was stamped: each step's
    time is its first stamp in the round trip's window at or after the step before it."""
    import bisect

    stamps.sort(key=lambda s: s[1])
    times = [t for _, t in stamps]
    keys = [STAGES[0][1]] + [b for _, _, b in STAGES]
    rows: dict[str, list] = {name: [] for name, _, _ in STAGES}
    totals = []
    for t0, t1 in windows:
        at, where, end = {}, {}, bisect.bisect_right(times, t1)
        i = bisect.bisect_left(times, t0)
        for key in keys:
            i = where.get(_AFTER.get(key), i)
            while i < end and stamps[i][0] != key:
                i += 1
            if i == end:
                break
            at[key], where[key] = stamps[i][1], i
        if len(at) < len(keys):
            continue
        totals.append(t1 - t0)
        for name, a, b in STAGES:
            rows[name].append(at[b] - at[a])
    p50 = {name: round(statistics.median(v) / 1000, 1) for name, v in rows.items() if v}
    return {"round_trips": len(totals), "round_trip_p50_us": round(statistics.median(totals) / 1000, 1),
            "stages_p50_us": p50, "stages_sum_us": round(sum(p50.values()), 1)}


#: What fleetd runs first for `--calls`: its control thread and its supervisor's loop
#: under cProfile each, the stats written to $CALLS_OUT and $CALLS_OUT.loop when each
#: thread ends (fleetd's stop).
CALLS_PRELUDE = """
import cProfile as _cProfile, os as _os
from fleet.runtime import loop as _loop
from fleet.service.control import server as _server
def _profiled(run, out):
    profile = _cProfile.Profile()
    def profiled(self):
        profile.enable()
        try:
            return run(self)
        finally:
            profile.disable()
            profile.dump_stats(out)
    return profiled
_server.ControlServer._serve = _profiled(_server.ControlServer._serve, _os.environ["CALLS_OUT"])
_loop.Supervisor._loop = _profiled(_loop.Supervisor._loop, _os.environ["CALLS_OUT"] + ".loop")
"""


def _sched_ns(pid: int) -> dict:
    """Each thread of `pid`, by name: ``[on-CPU ns, runnable-but-waiting ns]`` so far."""
    out: dict = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run, wait = map(int, f.read().split()[:2])
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        both = out.setdefault(name, [0, 0])
        both[0] += run
        both[1] += wait
    return out


def _parties(client_pid: int, fleetd_pid: int) -> dict:
    """``[on-CPU ns, waiting ns]`` so far of each party of a round trip: the client's
    threads together, fleetd's control thread, its loop, and its workers together (the
    processes fleetd's fork server started: every descendant but it and its checker,
    `fleet.rules.titles`)."""
    import psutil

    from fleet.rules import titles

    not_workers = {titles.fork_server("").comm, titles.fork_server_check("").comm}
    client, fleetd = _sched_ns(client_pid), _sched_ns(fleetd_pid)
    out = {"client: every thread": [sum(v[0] for v in client.values()), sum(v[1] for v in client.values())],
           "fleetd: control thread": fleetd.get("fleet-control", [0, 0]),
           "fleetd: loop": fleetd.get("fleet-loop", [0, 0]), "fleetd: workers": [0, 0]}
    for child in psutil.Process(fleetd_pid).children(recursive=True):
        try:
            if child.name() in not_workers:
                continue
            threads = _sched_ns(child.pid)
        except (OSError, psutil.Error):
            continue  # gone meanwhile
        for run, wait in threads.values():
            out["fleetd: workers"][0] += run
            out["fleetd: workers"][1] += wait
    return out


def calls(units: int) -> dict:
    """`--calls`: per round trip, each party's on-CPU and waiting microseconds, the wall
    time, and the Python calls of the client's threads and fleetd's."""
    import cProfile
    import pstats

    from fleet.api import submit_pipe

    reader = cProfile.Profile()
    read = submit_pipe.SubmitPipe._read

    def profiled_read(self, sock):  # the reader thread's whole life, under cProfile
        reader.enable()
        try:
            return read(self, sock)
        finally:
            reader.disable()

    with tempfile.NamedTemporaryFile(prefix="calls-", suffix=".prof", dir="/tmp", delete=False) as f:
        out = f.name  # fleetd's control thread writes its stats here when it stops, its loop beside
    os.environ["CALLS_OUT"] = out
    fleetd = dispatch_bench.FLEETD
    cpu, waits = {}, {}
    names = []
    try:
        with dispatch_bench.Fleetd(units) as daemon, daemon.connect() as client:  # the CPU view: nothing profiled
            names.append(daemon.name)
            [client.submit("work", i).result() for i in range(200)]  # warm: the worker is up
            before, t0 = _parties(os.getpid(), daemon.proc.pid), time.perf_counter()
            [client.submit("work", 0).result() for _ in range(units)]
            wall, after = time.perf_counter() - t0, _parties(os.getpid(), daemon.proc.pid)
            # the client's threads (the caller, its reader, the collector) bear the process's name
            for label, (run, wait) in after.items():
                cpu[label] = round((run - before[label][0]) / units / 1e3, 1)
                waits[label] = round((wait - before[label][1]) / units / 1e3, 1)
        dispatch_bench.FLEETD = CALLS_PRELUDE + fleetd
        submit_pipe.SubmitPipe._read = profiled_read
        caller = cProfile.Profile()
        with dispatch_bench.Fleetd(units) as daemon, daemon.connect() as client:
            names.append(daemon.name)
            [client.submit("work", i).result() for i in range(200)]
            caller.enable()
            [client.submit("work", 0).result() for _ in range(units)]
            caller.disable()
        counted = {"client: caller": pstats.Stats(caller).total_calls / units,
                   "client: reader": pstats.Stats(reader).total_calls / (units + 200),
                   "fleetd: control thread": pstats.Stats(out).total_calls / (units + 200),
                   "fleetd: loop": pstats.Stats(out + ".loop").total_calls / (units + 200)}
    finally:
        dispatch_bench.FLEETD = fleetd
        submit_pipe.SubmitPipe._read = read
        for path in (out, out + ".loop"):
            if os.path.exists(path):
                os.unlink(path)
    return {"fleets": names, "round_trips": units, "wall_us_per_round_trip": round(wall / units * 1e6, 1),
            "cpu_us_per_round_trip": cpu, "cpu_wait_us_per_round_trip": waits,
            "python_calls_per_round_trip": {k: round(v, 1) for k, v in counted.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--units", type=int, default=2000)
    parser.add_argument("--calls", action="store_true",
                        help="on-CPU and waiting time and Python calls per round trip, by party")
    args = parser.parse_args(argv)
    if args.units < 1:
        parser.error("--units must be at least 1")
    res, text = (calls(args.units), _calls_text) if args.calls else (measure(args.units), _stages_text)
    print(json.dumps(res, indent=2) if args.json else text(res))
    return 0


def _stages_text(res: dict) -> str:
    rows = [f"  {name:32s} {us:8.1f}" for name, us in res["stages_p50_us"].items()]
    return "\n".join([f"{res['round_trips']} round trips, p50 {res['round_trip_p50_us']} us", *rows])


def _calls_text(res: dict) -> str:
    waits = res["cpu_wait_us_per_round_trip"]
    rows = [f"  {label:28s} {us:8.1f} us on CPU, {waits[label]:8.1f} us waiting for one"
            for label, us in res["cpu_us_per_round_trip"].items()]
    rows.append(f"  {'all of them':28s} {sum(res['cpu_us_per_round_trip'].values()):8.1f} us on CPU, "
                f"{sum(waits.values()):8.1f} us waiting for one")
    rows += [f"  {label:28s} {n:8.1f} Python calls" for label, n in res["python_calls_per_round_trip"].items()]
    return "\n".join([f"{res['round_trips']} round trips; per round trip, {res['wall_us_per_round_trip']} us "
                      "of wall time:", *rows])


if __name__ == "__main__":
    sys.exit(main())
