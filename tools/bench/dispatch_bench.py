#!/usr/bin/env python3
"""Dispatch benchmark: fleet against ProcessPoolExecutor, multiprocessing.Pool, mpire and loky.

    python tools/bench/dispatch_bench.py [--json] [--workers N] [--units N] [--noisy | --service]

Peers mpire and loky come with `pip install '.[bench]'`; an absent peer is reported as
such and its ratios are left out. Same worker count, same machine, same run, same no-op
and ~50 µs CPU handlers:
  submit_units_per_s     one future per unit (fleet.submit / executor.submit / apply_async);
                         `over_best_peer` = over the fastest of the peers' (`best_submit_peer`)
  map_chunkC_units_per_s fleet.map / Pool.imap_unordered at chunksize C = 1, 64, 1000
  spin50_map_units_per_s 50 µs units through map; `of_limit` = share of N workers x 20,000/s;
                         `of_ceiling` = share of N bare processes running them in a plain loop
  latency_us             single-submit round trip p50/p99 (one unit in flight at a time)
  idle_cpu_percent       fleet (supervisor thread + zygote + workers) over an idle period
  io_fleet               1,000 units that each `await asyncio.sleep(0.01)` on one I/O-bound
                         role with 100 slots; `io_fleet_of_ideal` = 0.1 s / the median run
  start                  a fresh interpreter each, fleet.Executor() against ProcessPoolExecutor()
                         (defaults): `first_result_s` from the import to the first result
                         (--start-samples starts of each face a round, interleaved: a start
                         is ~0.1 s, and the machine's noise is larger than the ratio's margin);
                         `script_100_s` a script mapping 100 items, end to end (the interpreter's
                         start and exit included); `idle_pss_mib` the PSS of the process tree
                         (parent, fork server, 2 workers) idle after a map, `idle_worker_uss_mib`
                         a worker's own memory (USS, the median of the tree's leaves), and
                         `idle_by_process_mib` the last round's PSS and USS of the parent, the
                         fork server and the workers together. Bytecode is
                         cached (PYTHONDONTWRITEBYTECODE is dropped). --python: the interpreter
                         of the start scripts (default this one; e.g. a venv where fleet is
                         installed from its wheel, as users install it: an editable install's
                         import hook runs in every interpreter's start, the fork server's
                         included). --only-start: these alone
  --noisy               the contenders and ratios above (not io_fleet, start, idle) twice in one
                         run, quiet and with a noise process (a Python busy loop pinned to one
                         core) running, interleaved measure by measure; "noisy" holds the noisy
                         rows, its "ratios" and "quotients" (noisy ratio / quiet ratio; for the
                         latency ratios quiet / noisy, so >= 0.8 means "held up" for every key),
                         and "held": each contender's own noisy / quiet figure per measure (a
                         quotient falls when fleet loses, and also when a peer gains)
  --service              per-unit submit through a real fleetd (fleet.connect(name).submit) against
                         a one-worker ProcessPoolExecutor, interleaved: units/s, round trip p50/p99
fleet.Executor runs with its defaults (no max_workers, no profile: every whole core of
the detected quota, the loop by priority) beside them; its keys are executor_*.
Fleet runs N worker processes (forced pinned, one role of N cores) in two configurations:
`slots` = N (what users write) and 32 slots per worker (the tuned one). Each throughput
ratio under "ratios" is the LOWER of the two; "ratios_by_config" keeps both figures.
Ratios are fleet / peer (higher is better for throughput, lower for latency).
Every contender is open for the whole run, and the run goes in --repeat rounds (3):
in each, every measure runs once on each contender, one right after another, so a
slow stretch of a shared machine falls on fleet and its peers alike. A throughput is
the median of its rounds ("runs" keeps each); a latency, the p50/p99 of every round's
round trips together. idle_cpu_percent is taken once the peers are closed.
Every mode reports "host": what this host does with an idle CPU (its cpuidle driver and
governor, and a KVM guest's `guest_halt_poll_ns`), which moves the peers' round trips
(docs/internals.md, "The host's idle CPUs").
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import multiprocessing as mp
import os
import signal
import statistics
import sys
import time
import uuid

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_handlers as H  # noqa: E402

import fleet  # noqa: E402

CHUNKS = (1, 64, 1000)
#: items per chunk-C map run (x --units): a few tenths of a second at each chunk size.
#: At 5 and 20 x --units, chunk 64 and 1000 runs lasted 20-90 ms: a stretch of this
#: shared VM's scheduling, not a rate (Pool's chunk-64 rate went 0.95-4.0 M/s between
#: rounds of one run, and both sides' chunk-1000 rates 4.4-9.0 M/s).
MAP_ITEMS = {1: 1, 64: 20, 1000: 100}
IO_UNITS, IO_SLOTS, IO_WAIT_S, IO_RUNS = 1000, 100, 0.01, 5
#: fleet configurations: slots per worker process
CONFIGS = {"slots_eq_workers": 1, "slots_32_per_worker": 32}
#: single-submit round trips timed per round (every round adds its own to the p50)
LATENCY_SAMPLES = 2000

#: rounds (--repeat): each figure is the median of one run per round (latency: the p50
#: and p99 of every round's samples together). Within a round each measure runs on every
#: contender back to back, so a stretch of a slower machine (a noisy neighbour on a
#: shared host) falls on fleet and its peers alike instead of on one of them.
REPEAT = 3


def spin50_units(units):
    """Units of a spin50 run: --units, and at least 20,000 (half a second on 2 workers)."""
    return max(20_000, units)


def timed(n, fn):
    """One run: n / the seconds `fn` took."""
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def round_trips(submit_one, n=LATENCY_SAMPLES):
    """Seconds of `n` single-submit round trips, one unit at a time."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        submit_one()
        out.append(time.perf_counter() - t0)
    return out


def percentiles(samples):
    out = sorted(samples)
    return {"p50": round(out[len(out) // 2] * 1e6, 1), "p99": round(out[int(len(out) * 0.99)] * 1e6, 1)}


class Contender:
    """One dispatcher under test, open for the whole run: its measures by name (each a
    callable that makes one run and returns units/s, or for `latency_us` a list of round
    trips) and what it reports besides them."""

    def __init__(self, name, measures, facts=None):
        self.name, self.measures, self.facts = name, measures, dict(facts or {})
        self.runs: dict[str, list] = {key: [] for key in measures}

    def result(self) -> dict:
        out = dict(self.facts)
        for key, runs in self.runs.items():
            if key == "latency_us":
                out[key] = percentiles([t for run in runs for t in run])
            else:
                out[key] = round(statistics.median(runs))
                if len(runs) > 1:
                    out.setdefault("runs", {})[key] = [round(r) for r in runs]
        return out


def open_fleet(stack, workers, units, slots_per_worker):
    cfg = {
        "fleet": {"name": f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}", "profile": "pinned"},
        "roles": {
            # one role of `workers` declared cores, forced pinned: exactly `workers` processes
            "work": {"kind": "pooled", "handler": "bench_handlers:unit_work", "slots": slots_per_worker * workers,
                     "peak_cpus": workers, "queue_bound": 10 * units},
        },
    }
    f = stack.enter_context(fleet.Fleet.from_config(cfg, env={}))
    list(f.map("work", range(2000)))  # warm
    n50 = spin50_units(units)
    measures = {"submit_units_per_s": lambda: timed(units, lambda: [x.result() for x in [f.submit("work", i) for i in range(units)]])}
    for c in CHUNKS:
        n = units * MAP_ITEMS[c]
        measures[f"map_chunk{c}_units_per_s"] = lambda n=n, c=c: timed(n, lambda: list(f.map("work", range(n), chunksize=c)))
    measures["spin50_map_units_per_s"] = lambda: timed(n50, lambda: list(f.map("work", ["spin"] * n50, chunksize=64)))
    measures["latency_us"] = lambda: round_trips(lambda: f.submit("work", 0).result())
    facts = {"binding": f.plan.binding, "seats": len(f.layout.seats), "slots": slots_per_worker * workers}
    return f, measures, facts


def open_executor(stack, units):
    """fleet.Executor with its defaults (no max_workers: every whole core of the quota),
    measured as ProcessPoolExecutor is: submit(fn, x) and map(fn, xs, chunksize=C)."""
    ex = stack.enter_context(fleet.Executor())
    list(ex.map(H.work, range(2000)))  # warm
    n50 = spin50_units(units)
    measures = {"submit_units_per_s": lambda: timed(units, lambda: [x.result() for x in [ex.submit(H.work, i) for i in range(units)]])}
    for c in CHUNKS[:2]:
        n = units * MAP_ITEMS[c]
        measures[f"map_chunk{c}_units_per_s"] = lambda n=n, c=c: timed(n, lambda: list(ex.map(H.work, range(n), chunksize=c)))
    measures["spin50_map_units_per_s"] = lambda: timed(n50, lambda: list(ex.map(H.work, ["spin"] * n50, chunksize=64)))
    measures["latency_us"] = lambda: round_trips(lambda: ex.submit(H.work, 0).result())
    facts = {"workers": ex._max_workers, "binding": ex.fleet.plan.binding, "seats": len(ex.fleet.layout.seats)}
    return ex.fleet, measures, facts


def executor_ratios(ex, ppe, pool) -> dict:
    """fleet.Executor (defaults) against ProcessPoolExecutor and Pool (issue 30's targets)."""
    return {
        "executor_submit_over_ppe": round(ex["submit_units_per_s"] / ppe["submit_units_per_s"], 2),
        "executor_map_chunk1_over_pool": round(ex["map_chunk1_units_per_s"] / pool["imap_chunk1_units_per_s"], 2),
        "executor_map_chunk64_over_pool": round(ex["map_chunk64_units_per_s"] / pool["imap_chunk64_units_per_s"], 2),
        # of the quota's cores x 20,000/s: the limit for 50 us units on the cores it was given
        "executor_spin50_of_limit": round(ex["spin50_map_units_per_s"] / (ex["workers"] * 20_000), 3),
        "executor_p50_over_ppe": round(ex["latency_us"]["p50"] / ppe["latency_us"]["p50"], 3),
    }


def open_ppe(stack, workers, units):
    ex = stack.enter_context(cf.ProcessPoolExecutor(workers))
    list(ex.map(H.work, range(2000)))
    n50 = spin50_units(units)
    return {
        "submit_units_per_s": lambda: timed(units, lambda: [x.result() for x in [ex.submit(H.work, i) for i in range(units)]]),
        "latency_us": lambda: round_trips(lambda: ex.submit(H.work, 0).result()),
        "spin50_map_units_per_s": lambda: timed(n50, lambda: list(ex.map(H.work, ["spin"] * n50, chunksize=64))),
    }


def open_pool(stack, workers, units):
    pool = stack.enter_context(mp.Pool(workers))
    list(pool.imap_unordered(H.work, range(2000)))
    n50 = spin50_units(units)
    measures = {}
    for c in CHUNKS:
        n = units * MAP_ITEMS[c]
        measures[f"imap_chunk{c}_units_per_s"] = lambda n=n, c=c: timed(
            n, lambda: list(pool.imap_unordered(H.work, range(n), chunksize=c)))
    measures["spin50_imap_units_per_s"] = lambda: timed(
        n50, lambda: list(pool.imap_unordered(H.work, ["spin"] * n50, chunksize=64)))
    return measures


def _spin_server(conn):
    """A bare process: runs as many 50 µs units as it is sent, then says so."""
    while (n := conn.recv()) is not None:
        for _ in range(n):
            H.work("spin")
        conn.send(n)


def open_bare(stack, workers, units):
    """The machine's own ceiling for 50 µs units: `workers` processes that run their share
    in a plain loop, no dispatch at all (told how many through a pipe, timed from the
    sends to the last reply). On a VM it sits below the 2 x 20,000/s limit (preemption,
    steal): spin50_fleet_of_ceiling says how much of what the machine gives fleet gets."""
    ctx = mp.get_context("fork")
    conns = []
    for _ in range(workers):
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=_spin_server, args=(theirs,), daemon=True)
        proc.start()
        conns.append(ours)

        def stop(ours=ours, proc=proc):
            ours.send(None)
            proc.join(10)
        stack.callback(stop)
    n50 = spin50_units(units)

    def run():
        for c in conns:
            c.send(n50 // workers)
        for c in conns:
            c.recv()
    return {"spin50_units_per_s": lambda: timed(n50 // workers * workers, run)}


def open_mpire(stack, workers, units):
    """mpire's WorkerPool: its default `map` (it picks the chunk size) and one
    `apply_async` per unit (the per-unit submit shape). None when mpire is absent.
    Each run opens a pool of its own (not timed): an idle mpire pool polls (~4 % of a
    core here), which would run under every other contender's measures."""
    try:
        from mpire import WorkerPool
    except ImportError:
        return None
    n50 = spin50_units(units)

    def on_a_pool(n, run, warm):
        with WorkerPool(n_jobs=workers) as pool:
            warm(pool)
            return timed(n, lambda: run(pool))

    def warm_map(pool):
        pool.map(H.work, range(2000), progress_bar=False)

    def warm_apply(pool):
        # apply_async only: mpire 2.10's map fails on a pool that has run apply_async
        [r.get() for r in [pool.apply_async(H.work, (i,)) for i in range(200)]]

    return {
        "map_default_units_per_s": lambda: on_a_pool(
            units, lambda pool: pool.map(H.work, range(units), progress_bar=False), warm_map),
        # mpire unpacks an iterable item into arguments: a tuple keeps "spin" one argument
        "spin50_map_units_per_s": lambda: on_a_pool(
            n50, lambda pool: pool.map(H.work, [("spin",)] * n50, progress_bar=False), warm_map),
        "apply_async_units_per_s": lambda: on_a_pool(
            units, lambda pool: [r.get() for r in [pool.apply_async(H.work, (i,)) for i in range(units)]], warm_apply),
    }


def open_loky(stack, workers, units):
    """loky's reusable executor: one future per unit, and map at chunksize 64. None when
    loky is absent."""
    try:
        from loky import get_reusable_executor
    except ImportError:
        return None
    ex = get_reusable_executor(max_workers=workers)
    stack.callback(ex.shutdown, wait=True, kill_workers=True)
    list(ex.map(H.work, range(2000)))
    return {
        "submit_units_per_s": lambda: timed(units, lambda: [x.result() for x in [ex.submit(H.work, i) for i in range(units)]]),
        "map_chunk64_units_per_s": lambda: timed(units * 5, lambda: list(ex.map(H.work, range(units * 5), chunksize=64))),
        "latency_us": lambda: round_trips(lambda: ex.submit(H.work, 0).result()),
    }


def run_rounds(contenders, rounds, noise=None, noisy=None):
    """Every measure, round after round; within a round, each measure on every contender
    that has it, one after another. With `noise` (a Noise) and `noisy` (twins of
    `contenders`: same measures, runs of their own), each measure runs quiet on
    `contenders` and then with the noise on `noisy` (noisy first on odd rounds), so the
    two halves share the machine's state and neither always goes first."""
    keys = []
    for c in contenders:
        keys.extend(k for k in c.measures if k not in keys)
    phases = [(contenders, False)] + ([(noisy, True)] if noise is not None else [])
    for r in range(rounds):
        for key in keys:
            for group, on in (phases if r % 2 == 0 else phases[::-1]):
                if noise is not None:
                    noise.set(on)
                for c in group:
                    if key in c.measures:
                        c.runs[key].append(c.measures[key]())
    if noise is not None:
        noise.set(False)


#: The noise process: a plain Python busy loop, pinned to one core. It asks the kernel to
#: SIGKILL it when its parent dies (PR_SET_PDEATHSIG), and exits at once if the parent
#: died before it asked, so a bench killed by any signal leaves no busy loop behind.
NOISE = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
# Stopped for the quiet half, it would get the SIGHUP a shell's exit sends an orphaned
# group's stopped processes (a bench run in the background) and end the run: ignored.
signal.signal(signal.SIGHUP, signal.SIG_IGN)
if os.getppid() != {parent}:
    sys.exit(0)
os.sched_setaffinity(0, {{{core}}})
while True:
    pass
"""


class Noise:
    """An unrelated busy process pinned to one core (the last this process may use), alive
    for the whole measurement; `set(False)` stops it (SIGSTOP) for the quiet half,
    `set(True)` lets it run again (SIGCONT). A context manager: killed and reaped on
    every way out of the block."""

    def __init__(self):
        import subprocess

        self.core = max(os.sched_getaffinity(0))
        self.proc = subprocess.Popen([sys.executable, "-c", NOISE.format(parent=os.getpid(), core=self.core)],
                                     stdin=subprocess.DEVNULL)
        self.on = True
        self.set(False)

    def set(self, on: bool) -> None:
        if on != self.on:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the noise process exited ({self.proc.returncode})")
            self.proc.send_signal(signal.SIGCONT if on else signal.SIGSTOP)
            self.on = on

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # SIGKILL ends a stopped process too
        self.proc.wait(30)

    def __enter__(self) -> "Noise":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def bench_io_fleet():
    """I/O-bound units on one role: the time to run IO_UNITS waits of IO_WAIT_S with
    IO_SLOTS at once, against the ideal IO_UNITS / IO_SLOTS * IO_WAIT_S."""
    cfg = {
        "fleet": {"name": f"bench-io-{os.getpid()}-{uuid.uuid4().hex[:6]}"},
        "roles": {
            "io": {"kind": "pooled", "handler": "bench_handlers:unit_sleep_async", "slots": IO_SLOTS,
                   "peak_cpus": 0, "io_bound": True, "queue_bound": 10 * IO_UNITS},
        },
    }
    runs = []
    with fleet.Fleet.from_config(cfg, env={}) as f:
        [x.result() for x in [f.submit("io", IO_WAIT_S) for _ in range(IO_SLOTS)]]  # warm
        for _ in range(IO_RUNS):
            t0 = time.perf_counter()
            [x.result() for x in [f.submit("io", IO_WAIT_S) for _ in range(IO_UNITS)]]
            runs.append(time.perf_counter() - t0)
        binding = f.plan.binding
    runs.sort()
    return {"binding": binding, "units": IO_UNITS, "slots": IO_SLOTS, "wait_s": IO_WAIT_S,
            "ideal_s": IO_UNITS / IO_SLOTS * IO_WAIT_S, "median_s": round(runs[len(runs) // 2], 4),
            "runs_s": [round(r, 4) for r in runs]}


def idle_cpu(f, seconds=10.0):
    """CPU used by the whole fleet while it has nothing to do, in % of one core: this
    process (its supervisor thread; no peer is open any more) and its children."""
    me = psutil.Process()
    procs = [me] + me.children(recursive=True)

    def total():
        s = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                s += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return s

    time.sleep(0.5)
    c0, t0 = total(), time.monotonic()
    time.sleep(seconds)
    return round((total() - c0) / (time.monotonic() - t0) * 100, 3)


#: The start scripts (`bench_start`): {face} is the import line of the executor.
FACES = {"fleet": "from fleet import Executor", "ppe": "from concurrent.futures import ProcessPoolExecutor as Executor"}
FIRST_RESULT = """
import time
t0 = time.perf_counter()
{face}

if __name__ == "__main__":
    ex = Executor()
    ex.submit(abs, -1).result()
    print(time.perf_counter() - t0, flush=True)
    ex.shutdown()
"""
SCRIPT_100 = """
{face}

def square(x):
    return x * x

if __name__ == "__main__":
    with Executor() as ex:
        assert sum(ex.map(square, range(100))) == 328350
"""
IDLE = """
import sys
{face}

if __name__ == "__main__":
    with Executor(max_workers=2) as ex:
        list(ex.map(abs, range(100)))
        print("idle", flush=True)
        sys.stdin.readline()  # measured meanwhile
"""


_SCRIPTS = None  # the folder of the start scripts, while bench_start runs


#: The interpreter of the start scripts (--python).
START_PYTHON = sys.executable
#: First results measured per face and round (--start-samples), interleaved face by face.
START_SAMPLES = 5


def _python(text: str) -> list:
    """The command that runs `text` as a script file (a main module the workers can import)."""
    path = os.path.join(_SCRIPTS, f"start_{abs(hash(text))}.py")
    with open(path, "w") as f:
        f.write(text)
    return [START_PYTHON, path]


def tree_memory_mib(pid: int) -> tuple[float, float, dict]:
    """(PSS of process `pid` and its descendants, median USS of the tree's leaves, where:
    {"parent" | "fork_server" | "workers": {"pss", "uss"}}), in MiB. PSS splits shared pages
    among their users; the leaves are the workers (fleet's are the fork server's children,
    ProcessPoolExecutor's the parent's), and a worker's USS is the memory that is its own alone."""
    root = psutil.Process(pid)
    pss, leaves = 0, []
    where = {}
    for p in [root] + root.children(recursive=True):
        try:
            info = p.memory_full_info()
            leaf = p != root and not p.children()
        except psutil.NoSuchProcess:
            continue
        pss += info.pss
        if leaf:
            leaves.append(info.uss)
        part = where.setdefault("parent" if p == root else "workers" if leaf else "fork_server", {"pss": 0, "uss": 0})
        part["pss"] += info.pss / 2**20
        part["uss"] += info.uss / 2**20
    where = {k: {m: round(v, 1) for m, v in part.items()} for k, part in where.items()}
    return pss / 2**20, (statistics.median(leaves) / 2**20 if leaves else 0.0), where


#: The start scripts' environment: bytecode is cached as in any installed environment
#: (a PYTHONDONTWRITEBYTECODE=1 inherited here would make every interpreter recompile
#: each module it imports, which weighs on fleet's ~300 modules more than on the peer's).
START_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _idle_memory(face: str, settle_s: float = 1.0) -> tuple[float, float, dict]:
    import subprocess

    proc = subprocess.Popen(_python(IDLE.format(face=FACES[face])), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=START_ENV)
    try:
        assert proc.stdout.readline() == "idle\n"
        time.sleep(settle_s)  # the workers' first pages settle; nothing runs
        return tree_memory_mib(proc.pid)
    finally:
        proc.communicate("\n", timeout=120)


def bench_start(rounds: int) -> dict:
    """First result, a 100-item script end to end and the idle footprint, fleet.Executor
    and ProcessPoolExecutor in turn in each round (fresh interpreters: nothing is warm
    but the OS's file cache, which the first round warms for both)."""
    import subprocess
    import tempfile

    global _SCRIPTS
    runs = {face: {"first_result_s": [], "script_100_s": [], "idle_pss_mib": [], "idle_worker_uss_mib": []}
            for face in FACES}
    where = {}  # the last round's idle tree, process by process
    with tempfile.TemporaryDirectory(prefix="dispatch-bench-") as _SCRIPTS:
        _start_rounds(rounds, runs, where)
    res = {face: {k: round(statistics.median(v), 3) for k, v in r.items()} for face, r in runs.items()}
    for face in FACES:
        res[face]["runs"] = {k: [round(x, 3) for x in v] for k, v in runs[face].items()}
        res[face]["idle_by_process_mib"] = where[face]
    return res


def _start_rounds(rounds: int, runs: dict, where: dict) -> None:
    import subprocess

    for _ in range(rounds):
        for _sample in range(START_SAMPLES):
            for face, line in FACES.items():
                out = subprocess.run(_python(FIRST_RESULT.format(face=line)), capture_output=True, text=True,
                                     timeout=300, check=True, env=START_ENV)
                runs[face]["first_result_s"].append(float(out.stdout))
        for face, line in FACES.items():
            t0 = time.perf_counter()
            subprocess.run(_python(SCRIPT_100.format(face=line)), capture_output=True, timeout=300, check=True,
                           env=START_ENV)
            runs[face]["script_100_s"].append(time.perf_counter() - t0)
            pss, worker_uss, where[face] = _idle_memory(face)
            runs[face]["idle_pss_mib"].append(pss)
            runs[face]["idle_worker_uss_mib"].append(worker_uss)


def start_ratios(start: dict) -> dict:
    fl, ppe = start["fleet"], start["ppe"]
    return {
        "executor_first_result_over_ppe": round(fl["first_result_s"] / ppe["first_result_s"], 2),
        "executor_script_100_over_ppe": round(fl["script_100_s"] / ppe["script_100_s"], 2),
        "executor_idle_pss_over_ppe_mib": round(fl["idle_pss_mib"] - ppe["idle_pss_mib"], 1),
        "executor_worker_uss_over_ppe": round(fl["idle_worker_uss_mib"] / ppe["idle_worker_uss_mib"], 2),
    }


START_TARGETS = {
    "executor_first_result_over_ppe": "<= 3",
    "executor_script_100_over_ppe": "<= 3",
    "executor_idle_pss_over_ppe_mib": "<= 120",
    "executor_worker_uss_over_ppe": "<= 1",
}


#: fleetd under the bench: started through this launcher, which asks the kernel to send it
#: SIGINT (fleetd's fast stop) when the bench dies, and exits if the bench died before it
#: asked; then it runs fleetd's own main.
FLEETD = """
import ctypes, os, runpy, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG
if os.getppid() != {parent}:
    sys.exit(0)
sys.argv = ["fleetd", "--config", {config!r}, "--name", {name!r}]
runpy.run_module("fleet.cli.fleetd", run_name="__main__")
"""
SERVICE_BOUND_S = 60.0  # fleetd's boot and stop: a generous bound on a loaded machine


class Fleetd:
    """A real fleetd of one role (bench_handlers:unit_work, one core, one worker) under a
    name of its own, with its runtime and state dirs in a temporary folder. A context
    manager: on every way out it is stopped (SIGTERM, then SIGKILL after the bound), its
    zygote and workers are reaped, and its /dev/shm segments are removed."""

    def __init__(self, units: int):
        import subprocess
        import tempfile

        self.name = f"bench-svc-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.dir = tempfile.mkdtemp(prefix="fd-", dir="/tmp")  # short: AF_UNIX paths <= 107 bytes
        config = os.path.join(self.dir, "fleet.toml")
        with open(config, "w") as f:
            f.write(f'[fleet]\nname = "{self.name}"\n\n[roles.work]\nkind = "pooled"\n'
                    f'handler = "bench_handlers:unit_work"\nslots = 1\npeak_cpus = 1\nqueue_bound = {10 * units}\n')
        here = os.path.dirname(os.path.abspath(__file__))
        self.env = {**os.environ, "RUNTIME_DIRECTORY": os.path.join(self.dir, "run"),
                    "STATE_DIRECTORY": os.path.join(self.dir, "state"),
                    "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
        for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "FLEET_NAME"):
            self.env.pop(key, None)
        self.stderr = open(os.path.join(self.dir, "fleetd.stderr"), "wb")
        self.children: set = set()
        self.proc = subprocess.Popen([sys.executable, "-c", FLEETD.format(parent=os.getpid(), config=config,
                                                                          name=self.name)],
                                     env=self.env, cwd=self.dir, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.stderr)

    def connect(self):
        """A client, once fleetd answers (polled; it boots its zygote and worker first)."""
        deadline = time.monotonic() + SERVICE_BOUND_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fleetd exited {self.proc.returncode}: {self._stderr_text()}")
            try:
                client = fleet.connect(self.name, env=self.env)
                self.children |= self._descendants()
                return client
            except fleet.FleetError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _stderr_text(self) -> str:
        with open(self.stderr.name, "rb") as f:
            return f.read().decode(errors="replace")[-2000:]

    def _descendants(self) -> set:
        try:
            return {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()

    def close(self) -> None:
        import shutil
        import subprocess

        from fleet.shm import dataplane
        from fleet.shm.table import segment

        try:
            self.children |= self._descendants()
            if self.proc.poll() is None:
                self.proc.terminate()  # drains: nothing is queued by now
            try:
                self.proc.wait(SERVICE_BOUND_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(SERVICE_BOUND_S)
            deadline = time.monotonic() + 10
            while (left := [p for p in self.children if psutil.pid_exists(p)]) and time.monotonic() < deadline:
                time.sleep(0.05)
            for pid in left:  # a zygote or worker that outlived a killed fleetd
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            self.stderr.close()
            segment.unlink(self.name)
            dataplane.unlink(self.name)
            for entry in os.listdir("/dev/shm"):  # whatever a killed fleetd left under its names
                if entry == f"fleet.{self.name}" or entry.startswith(f"fleet.{self.name}."):
                    where = os.path.join("/dev/shm", entry)
                    if os.path.isdir(where):
                        shutil.rmtree(where, ignore_errors=True)
                    else:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(where)
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Fleetd":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def bench_service(units: int, rounds: int) -> dict:
    """Per-unit submit through fleetd (fleet.connect(name).submit: client, socket, fleetd's
    loops, its worker) against a one-worker ProcessPoolExecutor in this process, round by
    round: `units` futures then their results (units/s), and single-submit round trips."""
    samples = min(LATENCY_SAMPLES, max(50, units))
    with contextlib.ExitStack() as stack:
        daemon = stack.enter_context(Fleetd(units))
        client = stack.enter_context(daemon.connect())
        [x.result() for x in [client.submit("work", i) for i in range(200)]]  # warm
        ex = stack.enter_context(cf.ProcessPoolExecutor(1))
        list(ex.map(H.work, range(200)))
        fleetd = Contender("fleetd", {
            "submit_units_per_s": lambda: timed(units, lambda: [x.result() for x in
                                                                [client.submit("work", i) for i in range(units)]]),
            "latency_us": lambda: round_trips(lambda: client.submit("work", 0).result(), samples),
        }, {"workers": 1, "name": daemon.name})
        ppe = Contender("process_pool_executor", {
            "submit_units_per_s": lambda: timed(units, lambda: [x.result() for x in
                                                                [ex.submit(H.work, i) for i in range(units)]]),
            "latency_us": lambda: round_trips(lambda: ex.submit(H.work, 0).result(), samples),
        }, {"workers": 1})
        run_rounds([fleetd, ppe], rounds)
        # how the client's batches went: through its inlet (shared memory), or frames on the socket
        paths = {"frames": client._pipe.frames, "through_inlet": client._pipe.inlet_frames}
        out = {"units": units, "latency_samples_per_round": samples, "fleetd": {**fleetd.result(), **paths},
               "process_pool_executor": ppe.result()}
    return out


def service_ratios(svc: dict) -> dict:
    fd, ppe = svc["fleetd"], svc["process_pool_executor"]
    return {
        "service_submit_over_ppe": round(fd["submit_units_per_s"] / ppe["submit_units_per_s"], 3),
        "service_p50_over_ppe": round(fd["latency_us"]["p50"] / ppe["latency_us"]["p50"], 3),
        "service_submit_units_per_s": fd["submit_units_per_s"],
        "service_p50_us": fd["latency_us"]["p50"],
    }


SERVICE_TARGETS = {
    "service_submit_over_ppe": ">= 1",
    "service_p50_us": "<= 200",
}


def fleet_ratios(fl, ppe, pool, mpire, workers) -> dict:
    """Throughput ratios of one fleet configuration against the peers."""
    out = {
        "submit_fleet_over_ppe": round(fl["submit_units_per_s"] / ppe["submit_units_per_s"], 2),
        "spin50_fleet_of_limit": round(fl["spin50_map_units_per_s"] / (workers * 20_000), 3),
    }
    if "map_default_units_per_s" in mpire:
        out["submit_fleet_over_mpire"] = round(fl["submit_units_per_s"] / mpire["map_default_units_per_s"], 3)
    for c in CHUNKS:
        out[f"map_chunk{c}_fleet_over_pool"] = round(fl[f"map_chunk{c}_units_per_s"] / pool[f"imap_chunk{c}_units_per_s"], 2)
    out["latency_p50_fleet_over_ppe"] = round(fl["latency_us"]["p50"] / ppe["latency_us"]["p50"], 3)
    return out


#: Each peer's per-unit submit, as its row holds it: the contenders of "the best peer" for
#: submit (mpire's is `apply_async`, its per-unit form; a peer not installed is left out).
SUBMIT_PEERS = (("process_pool_executor", "submit_units_per_s"), ("loky", "submit_units_per_s"),
                ("mpire", "apply_async_units_per_s"))


def best_submit_peer(res) -> tuple[str, float]:
    """The peer whose per-unit submit ran fastest in `res`: its row's name and units/s."""
    rate, row = max((res[row][key], row) for row, key in SUBMIT_PEERS if key in res.get(row, {}))
    return row, rate


def contender_ratios(res, w) -> dict:
    """The ratios of the interleaved contenders' rows in `res` (the quiet ones, or --noisy's)."""
    ppe, pool, mpire = res["process_pool_executor"], res["multiprocessing_pool"], res["mpire"]
    by_config = {name: fleet_ratios(res[f"fleet_{name}"], ppe, pool, mpire, w) for name in CONFIGS}
    res["ratios_by_config"] = by_config
    ratios = {}
    for key in by_config["slots_eq_workers"]:
        values = [by_config[name][key] for name in CONFIGS]
        # the headline is the worse configuration: lower throughput, higher latency
        ratios[key] = max(values) if key.startswith("latency") else min(values)
    ratios["spin50_pool_of_limit"] = round(pool["spin50_imap_units_per_s"] / (w * 20_000), 3)
    ceiling = res["bare_processes"]["spin50_units_per_s"]
    ratios["spin50_ceiling_of_limit"] = round(ceiling / (w * 20_000), 3)
    ratios["spin50_fleet_of_ceiling"] = min(
        round(res[f"fleet_{name}"]["spin50_map_units_per_s"] / ceiling, 3) for name in CONFIGS)
    if "spin50_map_units_per_s" in mpire:
        ratios["spin50_mpire_of_limit"] = round(mpire["spin50_map_units_per_s"] / (w * 20_000), 3)
        ratios["mpire_map_over_ppe_submit"] = round(mpire["map_default_units_per_s"] / ppe["submit_units_per_s"], 2)
    if "submit_units_per_s" in res["loky"]:
        ratios["submit_fleet_over_loky"] = min(
            round(res[f"fleet_{name}"]["submit_units_per_s"] / res["loky"]["submit_units_per_s"], 2) for name in CONFIGS)
    # submit against whichever peer submitted fastest in this run (the lower figure)
    best, rate = best_submit_peer(res)
    res["best_submit_peer"] = best
    ratios["submit_fleet_over_best_peer"] = min(
        round(res[f"fleet_{name}"]["submit_units_per_s"] / rate, 2) for name in CONFIGS)
    ratios["executor_submit_over_best_peer"] = round(res["fleet_executor"]["submit_units_per_s"] / rate, 2)
    ratios.update(executor_ratios(res["fleet_executor"], ppe, pool))
    # what the machine gave bare processes meanwhile (a shared VM's stretch falls on both)
    ratios["executor_spin50_of_ceiling"] = round(res["fleet_executor"]["spin50_map_units_per_s"] / ceiling, 3)
    return ratios


#: What the kernel does with an idle CPU, read for every run: on a VM whose guest halts at
#: once (cpuidle driver ``haltpoll`` with ``guest_halt_poll_ns`` 0), waking a thread whose
#: CPU halted is an exit to the hypervisor and back, tens of microseconds, which every
#: peer pays on each round trip and fleet, whose threads look before they sleep, does not;
#: a CPU kept busy (the --noisy mode's noise) never halts, so the peers get faster under
#: noise there. The ratios are read against it (docs/internals.md, "The host's idle CPUs").
#: Each setting's files under /sys, the first there read (an older kernel has no
#: ``current_governor_ro``).
HOST_IDLE = {
    "cpuidle_driver": ("devices/system/cpu/cpuidle/current_driver",),
    "cpuidle_governor": ("devices/system/cpu/cpuidle/current_governor_ro",
                         "devices/system/cpu/cpuidle/current_governor"),
    "guest_halt_poll_ns": ("module/haltpoll/parameters/guest_halt_poll_ns",),
}


def host_idle(sysfs: str = "/sys") -> dict:
    """`HOST_IDLE`'s settings as this host has them (None: not there), as text; a number
    as an int."""
    out = dict.fromkeys(HOST_IDLE)
    for key, paths in HOST_IDLE.items():
        for rel in paths:
            try:
                with open(os.path.join(sysfs, rel)) as f:
                    text = f.read().strip()
            except OSError:
                continue
            out[key] = int(text) if text.isdigit() else text
            break
    return out


def contention_counts(f) -> dict:
    """A fleet's contention watch over the run: workers widened and re-pinned, and each
    seat's contended episodes."""
    watch = f._sup.contention
    return {"widened": watch.widened, "repinned": watch.repinned,
            "episodes": [state.episodes for state in watch.states]}


def lower_is_better(key: str) -> bool:
    """A ratio where fleet wins by being lower: a latency over a peer's."""
    return "p50" in key or key.startswith("latency")


def quotients(quiet: dict, noisy: dict) -> dict:
    """How much of each quiet ratio holds with the noise on: noisy / quiet, or quiet / noisy
    for a latency ratio (lower is better there), so 1 is "unchanged" and < 1 "lost"
    for every key alike. A ratio of peers alone (pool, mpire, the ceiling) is kept too:
    it says how hard the noise hit the machine."""
    out = {}
    for key, q in quiet.items():
        nz = noisy.get(key)
        if nz is None or not q or not nz:
            continue
        out[key] = round(q / nz if lower_is_better(key) else nz / q, 3)
    return out


def held(quiet: dict, noisy: dict) -> dict:
    """Per contender (a row in both), how much of its own quiet figure each measure keeps with
    the noise on: noisy / quiet for a throughput, quiet / noisy for the round trip's p50. The
    quotients compare fleet's ratio over a peer's, and a peer can gain from the noise (its
    processes crowd onto the free core, where hand-overs are cheaper): these say which side
    moved."""
    out = {}
    for name, row in quiet.items():
        twin = noisy.get(name)
        if not isinstance(row, dict) or not isinstance(twin, dict):
            continue
        kept = {k: round(twin[k] / v, 3) for k, v in row.items()
                if k.endswith("_per_s") and isinstance(v, (int, float)) and v and twin.get(k)}
        p50, loud = (row.get("latency_us") or {}).get("p50"), (twin.get("latency_us") or {}).get("p50")
        if p50 and loud:
            kept["latency_p50"] = round(p50 / loud, 3)
        if kept:
            out[name] = kept
    return out


def _round_rates(res) -> None:
    for section in [k for k in res if isinstance(res[k], dict) and k not in ("ratios", "ratios_by_config", "targets")]:
        for k, v in list(res[section].items()):
            if isinstance(v, float) and k.endswith("_per_s"):
                res[section][k] = round(v)


def main(argv=None):
    global REPEAT, START_SAMPLES, START_PYTHON
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--units", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=REPEAT,
                        help="rounds: every measure runs once per round on each contender; a throughput is "
                             "the median of its rounds (default %(default)s)")
    parser.add_argument("--only-start", action="store_true",
                        help="only the start rows: first result, a 100-item script, the idle footprint")
    parser.add_argument("--start-samples", type=int, default=START_SAMPLES,
                        help="first results of each face per round, interleaved (default %(default)s)")
    parser.add_argument("--python", default=START_PYTHON,
                        help="the interpreter that runs the start scripts (default: this one)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--noisy", action="store_true",
                      help="the contenders and ratios, quiet and with a busy process pinned to one core, "
                           "interleaved; reports each ratio's noisy / quiet quotient")
    mode.add_argument("--service", action="store_true",
                      help="per-unit submit through a real fleetd against a one-worker ProcessPoolExecutor")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.start_samples < 1:
        parser.error("--start-samples must be at least 1")
    if not (os.path.isfile(args.python) and os.access(args.python, os.X_OK)):
        parser.error(f"--python {args.python!r} is not an executable file")
    REPEAT = args.repeat
    START_SAMPLES, START_PYTHON = args.start_samples, args.python
    if args.only_start:
        start = bench_start(REPEAT)
        res = {"rounds": REPEAT, "host": host_idle(), "start": start, "ratios": start_ratios(start),
               "targets": START_TARGETS}
        print(json.dumps(res, indent=2) if args.json else res)
        return 0
    w, n = args.workers, args.units
    if args.service:
        res = {"rounds": REPEAT, "host": host_idle(), "service": bench_service(n, REPEAT)}
        res["ratios"] = service_ratios(res["service"])
        res["targets"] = SERVICE_TARGETS
        print(json.dumps(res, indent=2) if args.json else res)
        return 0
    res = {"workers": w, "rounds": REPEAT, "host": host_idle()}
    with contextlib.ExitStack() as natural:
        noise = natural.enter_context(Noise()) if args.noisy else None
        # the tuned configuration closes with the peers: the idle figure is the natural one's alone
        opened = {"slots_eq_workers": open_fleet(natural, w, n, CONFIGS["slots_eq_workers"])}
        with contextlib.ExitStack() as peers:
            opened.update({name: open_fleet(peers, w, n, per_worker)
                           for name, per_worker in CONFIGS.items() if name not in opened})
            contenders = [Contender(f"fleet_{name}", measures, facts)
                          for name, (_f, measures, facts) in opened.items()]
            ex_fleet, *executor = open_executor(peers, n)
            opened["executor"] = (ex_fleet, None, None)
            contenders.append(Contender("fleet_executor", *executor))
            contenders.append(Contender("process_pool_executor", open_ppe(peers, w, n)))
            contenders.append(Contender("multiprocessing_pool", open_pool(peers, w, n)))
            contenders.append(Contender("bare_processes", open_bare(peers, w, n)))
            for name, opener in (("mpire", open_mpire), ("loky", open_loky)):
                measures = opener(peers, w, n)
                if measures is None:
                    res[name] = {"absent": "pip install '.[bench]'"}
                else:
                    contenders.append(Contender(name, measures))
            twins = [Contender(c.name, c.measures, c.facts) for c in contenders] if noise else None
            run_rounds(contenders, REPEAT, noise, twins)
            for c in contenders:
                res[c.name] = c.result()
            if noise:
                res["noisy"] = {"noise_core": noise.core, **{c.name: c.result() for c in twins}}
                # what each fleet's contention watch did over the run (fleet.rules.contention)
                res["noisy"]["contention"] = {f"fleet_{name}": contention_counts(f) for name, (f, _m, _x) in opened.items()}
                for name in ("mpire", "loky"):
                    res["noisy"].setdefault(name, res[name])
        if not noise:
            # every peer closed: the fleet's idle CPU is its own (workers, zygote, loop thread)
            res["fleet_slots_eq_workers"]["idle_cpu_percent"] = idle_cpu(opened["slots_eq_workers"][0])
    if noise:
        # the interleaved contenders only: io_fleet, start and idle are not measured twice
        res["ratios"] = contender_ratios(res, w)
        res["noisy"]["ratios"] = contender_ratios(res["noisy"], w)
        res["noisy"]["quotients"] = quotients(res["ratios"], res["noisy"]["ratios"])
        res["noisy"]["held"] = held({k: v for k, v in res.items() if k != "noisy"}, res["noisy"])
        res["targets"] = {"quotients": ">= 0.8 each (noisy ratio / quiet ratio; latency: quiet / noisy)"}
        _round_rates(res)
        _round_rates(res["noisy"])
        print(json.dumps(res, indent=2) if args.json else res)
        return 0
    res["io_fleet"] = bench_io_fleet()
    res["start"] = bench_start(REPEAT)
    ratios = contender_ratios(res, w)
    ratios["idle_cpu_percent_fleet"] = res["fleet_slots_eq_workers"]["idle_cpu_percent"]
    ratios["io_fleet_of_ideal"] = round(res["io_fleet"]["ideal_s"] / res["io_fleet"]["median_s"], 3)
    ratios.update(start_ratios(res["start"]))
    res["ratios"] = ratios
    res["targets"] = {
        **START_TARGETS,
        "executor_submit_over_ppe": ">= 5",
        "executor_map_chunk1_over_pool": ">= 1",
        "executor_map_chunk64_over_pool": ">= 1",
        "executor_spin50_of_limit": ">= 0.9",
        "executor_p50_over_ppe": "<= 0.5",
        "submit_fleet_over_ppe": ">= 5 (aim 10)",
        "submit_fleet_over_mpire": "reported (aim >= 1)",
        "submit_fleet_over_best_peer": "reported (aim 10): over the fastest per-unit submit of the run's "
                                       "peers (best_submit_peer)",
        "executor_submit_over_best_peer": "reported (aim 10), as submit_fleet_over_best_peer",
        "map_chunk1_fleet_over_pool": ">= 1",
        "map_chunk64_fleet_over_pool": ">= 1",
        "map_chunk1000_fleet_over_pool": ">= 1",
        "latency_p50_fleet_over_ppe": "<= 0.5 (aim 0.25)",
        "spin50_fleet_of_limit": ">= 0.9",
        "spin50_fleet_of_ceiling": "reported: the share of what bare processes get on this machine",
        "io_fleet_of_ideal": ">= 0.8",
        "idle_cpu_percent_fleet": "< 1",
    }
    _round_rates(res)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        for section, values in res.items():
            print(section, values)
    return 0


if __name__ == "__main__":
    sys.exit(main())
