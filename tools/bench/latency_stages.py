#!/usr/bin/env python3
"""Where a unit's microseconds go: a single submit's round trip stage by stage, and the
CPU each thread spends per unit over a burst.

    python tools/bench/latency_stages.py [--json] [--units N] [--slots-per-worker K]
    python tools/bench/latency_stages.py --burst [--json] [--units N] [--rounds R]
    python tools/bench/latency_stages.py --map C [--json] [--units N] [--rounds R]

`--burst` (the throughput view): fleet.Executor with its defaults takes N no-op
`submit`s, then the caller takes every result (dispatch_bench's submit key). Reported per
unit, the median of R rounds: the CPU of the caller thread (its submits, then its result
taking), of the supervisor's loop thread and of the workers (each thread's on-CPU time
from /proc/<pid>/task/<tid>/schedstat, which counts a spinning wait as CPU: the loop
and a caller watch for what comes next before they sleep), and the submits' wall time
(`caller_submit_wall`: past the caller's CPU, the time it waited, for the GIL above
all, which it shares with the loop thread); then one more round under cProfile on the
loop thread, its time split by stage (each function's own time, by the module it is
in) and the Python calls per unit, one under cProfile on the caller's submits, and one
under cProfile in each worker (both workers' time together, per unit), split the same
way. cProfile slows a thread several times over: read its split as shares, not as
microseconds.

`--map C` (the same view of a map): fleet.Executor's `map` of N no-op calls at chunksize
C, the caller taking every value. Per item, the median of R rounds: the caller's CPU (the
whole map: feeding it and taking its values), the loop's, the workers' and the wall
time; then one more round under cProfile on the loop thread: its Python calls per unit
(a chunk of C calls is one unit).

Without --burst or --map (the latency view), a diagnostic, not a ratio: it times `f.submit(role, 0).result()` one unit at a time (the
shape of dispatch_bench's latency key) on 2 pinned workers, and stamps the supervisor's
own steps by wrapping them (each wrapper adds well under a microsecond):

  caller: submit -> post     the caller's checks, pickling and queue room, up to its post
  post -> loop accepts       waking the loop thread (and it taking the GIL)
  accept -> granted          the loop's accept and the dispatcher's grant
  granted -> pushed          the slot's transition and the push that wakes the worker
  pushed -> result read      waking the worker, the handler, its result, the loop seeing it
  result read -> delivered   the outcome recorded, the freed slot granted, the future set
  delivered -> caller back   waking the caller (and it taking the GIL)
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fleet  # noqa: E402
from fleet.rules import dispatch
from fleet.runtime import accept, books, intake, results, seats  # noqa: E402

STAGES = (
    ("caller: submit -> post", None, "post"),
    ("post -> loop accepts", "post", "accept"),
    ("accept -> granted", "accept", "granted"),
    ("granted -> pushed", "granted", "pushed"),
    ("pushed -> result read", "pushed", "collect"),
    ("result read -> delivered", "collect", "delivered"),
    ("delivered -> caller back", "delivered", None),
)


class Stamps:
    """The first time each step ran since `clear` (a round trip is one unit at a time)."""

    def __init__(self):
        self.at: dict[str, int] = {}

    def clear(self) -> None:
        self.at.clear()

    def wrap(self, owner, name: str, key: str, after: bool = False, once_after: str | None = None) -> None:
        original, at, now = getattr(owner, name), self.at, time.perf_counter_ns

        def stamped(*args, **kwargs):
            if not after:
                at.setdefault(key, now())
            out = original(*args, **kwargs)
            if after and (once_after is None or once_after in at):
                at.setdefault(key, now())
            return out

        setattr(owner, name, stamped)


def measure(units: int, slots_per_worker: int) -> dict:
    stamps = Stamps()
    stamps.wrap(intake.Intake, "post", "post")
    stamps.wrap(accept.Acceptor, "accept", "accept")
    stamps.wrap(dispatch.Dispatcher, "grant", "granted", after=True)
    stamps.wrap(seats.Seats, "send", "pushed", after=True)
    stamps.wrap(results.Results, "handle", "collect")
    stamps.wrap(books.Books, "deliver", "delivered", after=True, once_after="collect")
    cfg = {
        "fleet": {"name": f"stages-{os.getpid()}-{uuid.uuid4().hex[:6]}", "profile": "pinned"},
        "roles": {"work": {"kind": "pooled", "handler": "bench_handlers:unit_work",
                           "slots": 2 * slots_per_worker, "peak_cpus": 2, "queue_bound": 1000}},
    }
    rows = []
    with fleet.Fleet.from_config(cfg, env={}) as f:
        list(f.map("work", range(2000)))  # warm
        for _ in range(units):
            stamps.clear()
            t0 = time.perf_counter_ns()
            f.submit("work", 0).result()
            t1 = time.perf_counter_ns()
            at = dict(stamps.at, start=t0, end=t1)
            if all(k in at for _, a, b in STAGES for k in (a or "start", b or "end")):
                rows.append(at)
    out = {}
    for label, a, b in STAGES:
        out[label] = p50([r[b or "end"] - r[a or "start"] for r in rows])
    out["total"] = p50([r["end"] - r["start"] for r in rows])
    return {"units_timed": len(rows), "slots": 2 * slots_per_worker, "p50_us": out}


def p50(ns: list) -> float:
    ns = sorted(ns)
    return round(ns[len(ns) // 2] / 1e3, 1) if ns else float("nan")


#: The loop's stages in the cProfile split: a function's own time goes to the first stage
#: with a pattern found in its "path:function" (a built-in's path is "~").
LOOP_STAGES = (
    ("wait (bell spin and sleep)", ("bell_wait", "word_watch", "dataplane.py:wait")),
    ("intake drain", ("intake.py:drain", "intake.py:post")),
    ("accept", ("accept.py:", "books.py:enter", "ledger.py:submitted", "ledger.py:_submitted")),
    ("grant (dispatcher)", ("rules/dispatch.py:", "books.py:skip_at_grant", "future.py:claim")),
    ("FSM transitions (table)", ("shm/table/", "_kernels", "fleet._table")),
    ("send (task pack, push)", ("seats.py:", "push_many", "loop.py:dispatch", "gates.py:started",
                                "provider_gate.py:started", "method 'pack'")),
    ("result taking", ("results.py:", "pop_many", "codec.py:", "books.py:close", "books.py:solved", "books.py:_end",
                       "books.py:get", "books.py:_told", "ledger.py:solved", "ledger.py:record", "inside.py:ended",
                       "gates.py:ended", "provider_gate.py:ended", "pace.py:", "intake.py:give", "unpack_from")),
    ("settle / future", ("books.py:deliver", "future.py:", "submit.py:", "parcels.py:", "bump")),
    ("builtins (dict, len, locks)", ("~:",)),
    ("publish / other", ("",)),
)


#: The caller's stages of a submit, as LOOP_STAGES.
CALLER_STAGES = (
    ("pickling (codec)", ("codec.py:", "_pickle", "parcels.py:")),
    ("checks and queue room", ("intake.py:on_loop", "intake.py:refuse", "intake.py:take", "intake.py:closed",
                               "roles.py:", "get_ident", "lock' objects>")),
    ("unit and future", ("_new_unit", "future.py:", "<string>:", "intake.py:new_id", "builtins.next")),
    ("post to the loop", ("intake.py:post", "intake.py:_wait", "bell_ring", "submit.py:_ring", "loop.py:_ring")),
    ("submit (its own frames)", ("submit.py:", "executor.py:")),
    ("other", ("",)),
)


#: A worker's stages of a unit, as LOOP_STAGES.
WORKER_STAGES = (
    ("wait (ring spin and sleep)", ("ring_wait", "word_watch", "bell_wait", "dataplane.py:wait")),
    ("task taking and decoding", ("process.py:_task", "process.py:_message", "process.py:_unit",
                                  "process.py:_decode", "codec.py:_load", "codec.py:loads", "_pickle.loads",
                                  "pop_many", "dataplane.py:seq", "strays.py:", "unit.py:", "method 'unpack")),
    ("the call (fleet's frames around it)", ("process.py:_run", "process.py:_execute", "calls.py:",
                                             "bench_handlers.py:", "<lambda>")),
    ("result encoding and sending", ("process.py:_send", "process.py:_finish", "process.py:_result",
                                     "codec.py:", "_pickle.dumps", "dataplane.py:push", "push2", "method 'pack'",
                                     "shm/table/", "fleet._table")),
    ("builtins (len, locks, ...)", ("~:",)),
    ("other", ("",)),
)

#: Each worker's profiler while `burst` profiles the workers (`_worker_profiling`).
_WORKER_PROFILER = None


def _worker_profiling(dump_to: str | None):
    """In a worker: start profiling (``dump_to`` None), or stop and write the profile to
    ``dump_to``.<pid>; idempotent, so `burst` sends it until every worker has run it.
    Returns (this worker's pid, whether it acted)."""
    global _WORKER_PROFILER
    import cProfile

    if dump_to is None:
        if _WORKER_PROFILER is not None:
            return os.getpid(), False
        _WORKER_PROFILER = cProfile.Profile()
        _WORKER_PROFILER.enable()
        return os.getpid(), True
    if _WORKER_PROFILER is None:
        return os.getpid(), False
    _WORKER_PROFILER.disable()
    _WORKER_PROFILER.dump_stats(f"{dump_to}.{os.getpid()}")
    _WORKER_PROFILER = None
    return os.getpid(), True


def _on_every_worker(ex, pids, arg) -> None:
    """Run `_worker_profiling(arg)` until each of `pids` has (units go where the
    dispatcher sends them, so a few at a time until every worker has had one)."""
    seen: set = set()
    for _ in range(1000):
        seen |= {pid for pid, _acted in ex.map(_worker_profiling, [arg] * 8, chunksize=1)}
        if seen >= set(pids):
            return
    raise RuntimeError(f"workers {sorted(set(pids) - seen)} never ran the profiler's switch")


def _on_cpu_ns(pid: int, tid: int | None = None) -> int:
    """Nanoseconds on CPU of a thread (`tid`) or a whole process (its schedstat)."""
    path = f"/proc/{pid}/task/{tid}/schedstat" if tid is not None else f"/proc/{pid}/schedstat"
    with open(path) as f:
        return int(f.read().split()[0])


def _workers_cpu_ns(pids) -> int:
    total = 0
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                total += _on_cpu_ns(pid, int(tid))
            except OSError:
                pass
    return total


def _split(stats, stages) -> tuple[dict, int]:
    """cProfile's own time per stage of `stages`, and the Python calls it saw."""
    totals = {label: 0.0 for label, _ in stages}
    calls = 0
    for (path, _line, func), (cc, _nc, tt, _ct, _callers) in stats.stats.items():
        calls += cc
        where = f"{path}:{func}"
        for label, patterns in stages:
            if any(part in where for part in patterns):
                totals[label] += tt
                break
    return totals, calls


def _caller_split(stats, units: int) -> dict:
    """The caller's submits under cProfile: each stage's share, and calls per unit."""
    totals, calls = _split(stats, CALLER_STAGES)
    whole = sum(totals.values()) or 1.0
    return {"share": {k: round(v / whole, 3) for k, v in totals.items()},
            "profiled_us_per_unit": round(whole / units * 1e6, 2), "python_calls_per_unit": round(calls / units, 1)}


def _work_split(stats, stages, units: int) -> dict:
    """cProfile's own time per stage of `stages` whose first is the waits (the loop's, or
    the workers' together): each other stage's share of the work, and the Python calls,
    work and waits per unit."""
    totals, calls = _split(stats, stages)
    waited = totals.pop(stages[0][0])
    whole = sum(totals.values()) or 1.0
    return {"share_of_work": {k: round(v / whole, 3) for k, v in totals.items()},
            "profiled_work_us_per_unit": round(whole / units * 1e6, 2),
            "profiled_wait_us_per_unit": round(waited / units * 1e6, 2),
            "python_calls_per_unit": round(calls / units, 1)}


def burst(units: int, rounds: int) -> dict:
    """The throughput view (see the module doc): CPU per unit of each thread over bursts."""
    import cProfile
    import pstats
    import statistics

    import bench_handlers as H

    with fleet.Executor() as ex:
        sup = ex._sup
        list(ex.map(H.work, range(2000)))  # warm
        loop_tid = sup.door._thread.native_id
        me = os.getpid()
        pids = list(sup.pids().values())

        def one_round(caller=None):
            c0, l0, w0 = time.thread_time_ns(), _on_cpu_ns(me, loop_tid), _workers_cpu_ns(pids)
            t0 = time.perf_counter_ns()
            if caller is not None:
                caller.enable()
            futures = [ex.submit(H.work, i) for i in range(units)]
            if caller is not None:
                caller.disable()
            c1, s1 = time.thread_time_ns(), time.perf_counter_ns()
            for fut in futures:
                fut.result()
            t1 = time.perf_counter_ns()
            c2, l1, w1 = time.thread_time_ns(), _on_cpu_ns(me, loop_tid), _workers_cpu_ns(pids)
            return {"wall": (t1 - t0) / units, "caller_submit": (c1 - c0) / units,
                    "caller_submit_wall": (s1 - t0) / units, "caller_results": (c2 - c1) / units,
                    "loop": (l1 - l0) / units, "workers (all)": (w1 - w0) / units}

        rows = [one_round() for _ in range(rounds)]
        split = _work_split(_loop_profiled(sup, one_round), LOOP_STAGES, units)
        caller = cProfile.Profile()
        one_round(caller)
        caller_split = _caller_split(pstats.Stats(caller), units)
        with tempfile.TemporaryDirectory(prefix="latency-stages-") as where:
            dump_to = os.path.join(where, "worker")
            _on_every_worker(ex, pids, None)
            one_round()
            _on_every_worker(ex, pids, dump_to)
            dumps = [os.path.join(where, name) for name in os.listdir(where)]
            worker_split = _work_split(pstats.Stats(*dumps), WORKER_STAGES, units)
    per_unit = {k: round(statistics.median(r[k] for r in rows) / 1e3, 2) for k in rows[0]}
    return {"units": units, "rounds": rounds, "workers": len(pids), "us_per_unit": per_unit,
            "units_per_s": round(1e9 / statistics.median(r["wall"] for r in rows)), "loop_profile": split,
            "caller_profile": caller_split, "worker_profile": worker_split}


def _loop_profiled(sup, one_round):
    """One more `one_round()` under cProfile on the supervisor's loop thread (cProfile
    profiles the thread that enables it): its stats."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    sup.inspect(lambda _sup: prof.enable())
    one_round()
    sup.inspect(lambda _sup: prof.disable())
    return pstats.Stats(prof)


def map_burst(items: int, chunksize: int, rounds: int) -> dict:
    """The map view (see the module doc): CPU per item of each thread over maps."""
    import statistics

    import bench_handlers as H

    with fleet.Executor() as ex:
        sup = ex._sup
        list(ex.map(H.work, range(2000), chunksize=chunksize))  # warm
        loop_tid = sup.door._thread.native_id
        me = os.getpid()
        pids = list(sup.pids().values())

        def one_round():
            c0, l0, w0 = time.thread_time_ns(), _on_cpu_ns(me, loop_tid), _workers_cpu_ns(pids)
            t0 = time.perf_counter_ns()
            collections.deque(ex.map(H.work, range(items), chunksize=chunksize), maxlen=0)  # taken, none kept
            t1 = time.perf_counter_ns()
            c1, l1, w1 = time.thread_time_ns(), _on_cpu_ns(me, loop_tid), _workers_cpu_ns(pids)
            return {"wall": (t1 - t0) / items, "caller": (c1 - c0) / items, "loop": (l1 - l0) / items,
                    "workers (all)": (w1 - w0) / items}

        rows = [one_round() for _ in range(rounds)]
        calls = sum(cc for cc, _nc, _tt, _ct, _callers in _loop_profiled(sup, one_round).stats.values())
    units = -(-items // chunksize)
    return {"items": items, "chunksize": chunksize, "rounds": rounds, "workers": len(pids),
            "ns_per_item": {k: round(statistics.median(r[k] for r in rows)) for k in rows[0]},
            "items_per_s": round(1e9 / statistics.median(r["wall"] for r in rows)),
            "loop_python_calls_per_unit": round(calls / units, 1)}


def _print_work_split(title: str, prof: dict) -> None:
    """A `_work_split` as text: its calls, work and waits per unit, then each stage's share."""
    print(f"{title}: {prof['python_calls_per_unit']} Python calls per unit; {prof['profiled_work_us_per_unit']} "
          f"us of work (profiled) by stage, besides {prof['profiled_wait_us_per_unit']} us waiting:")
    for label, share in prof["share_of_work"].items():
        print(f"  {label:36} {share:8.1%}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--units", type=int, help="units (3000), or with --map the calls mapped (400,000)")
    parser.add_argument("--slots-per-worker", type=int, default=1)
    parser.add_argument("--burst", action="store_true", help="CPU per unit of each thread over bursts of submits")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--map", type=int, metavar="C", help="CPU per item of each thread over maps at chunksize C")
    args = parser.parse_args(argv)
    if args.units is None:
        args.units = 400_000 if args.map is not None else 3000
    for name in ("units", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.map is not None:
        if args.map < 1:
            parser.error("--map (a chunksize) must be at least 1")
        if args.burst:
            parser.error("--map and --burst are two views: give one")
        res = map_burst(args.units, args.map, args.rounds)
        if args.json:
            print(json.dumps(res, indent=2))
        else:
            print(f"{res['items_per_s']} items/s at chunksize {res['chunksize']}; CPU per item, ns "
                  f"(median of {res['rounds']} rounds):")
            for label, value in res["ns_per_item"].items():
                print(f"  {label:28} {value:8d}")
            print(f"the loop: {res['loop_python_calls_per_unit']} Python calls per unit of {res['chunksize']} calls")
        return 0
    if args.burst:
        res = burst(args.units, args.rounds)
        if args.json:
            print(json.dumps(res, indent=2))
        else:
            print(f"{res['units_per_s']} units/s; CPU per unit, us (median of {res['rounds']} rounds):")
            for label, value in res["us_per_unit"].items():
                print(f"  {label:28} {value:8.2f}")
            _print_work_split("loop under cProfile", res["loop_profile"])
            prof = res["caller_profile"]
            print(f"caller's submits under cProfile: {prof['python_calls_per_unit']} Python calls per unit; "
                  f"{prof['profiled_us_per_unit']} us (profiled) by stage:")
            for label, share in prof["share"].items():
                print(f"  {label:28} {share:8.1%}")
            _print_work_split("the workers under cProfile (both together)", res["worker_profile"])
        return 0
    res = measure(args.units, args.slots_per_worker)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        for label, value in res["p50_us"].items():
            print(f"{label:28} {value:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
