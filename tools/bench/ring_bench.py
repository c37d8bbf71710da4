#!/usr/bin/env python3
"""Benchmark the data plane's shared-memory rings between two processes.

    python tools/bench/ring_bench.py [--json] [--n N] [--rounds R]

Figures (all measured in this run, between two processes on this host):
  one-way throughput, msgs/s, for 64-byte and 4 KiB messages:
    ring_batched   producer push() per message + notify() every 32, consumer pop_many()
    ring_single    the same producer, consumer pop() per message
    pipe           multiprocessing.Pipe send_bytes / recv_bytes
    queue          multiprocessing.Queue put / get
  ping-pong round trip, µs p50/p99, 64-byte messages: tasks ring out, results ring
  back, each side sleeping in wait() (a futex) between messages; the same over a
  Pipe pair and a Queue pair.
  calls beside a busy thread, µs per call: a look at an empty ring through fleet._rings
  (the GIL kept, as Ring does) and through cffi (the GIL released), alone and while
  another Python thread of the process runs: what a released GIL costs the loop while
  a caller submits (`busy_cffi_over_rings`).
Ratios are ring/peer for throughput (higher is better for the ring) and peer/ring
for latency (higher is better for the ring).
"""
from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing as mp
import os
import sys
import threading
import time
import uuid

from fleet.shm.dataplane import DataSegment, unlink

CTX = mp.get_context("fork")
BATCH = 32  # pushes between notifies


# -- one-way throughput ----------------------------------------------------------------
def _ring_producer(name, n, size, start):
    ring = DataSegment.attach(name).tasks(0)
    data = b"x" * size
    start.wait()
    for i in range(n):
        if not ring.push(i, data):
            ring.notify()  # the consumer may be asleep on what we already pushed
            while not ring.push(i, data):
                ring.wait_space(size, None)
        if i % BATCH == BATCH - 1:
            ring.notify()
    ring.notify()


def _ring_consumer(name, n, batched, done):
    ring = DataSegment.attach(name).tasks(0)
    got = 0
    done.send("ready")
    if batched:
        while got < n:
            batch = ring.pop_many(max_bytes=1 << 16)
            if batch:
                got += len(batch)
            else:
                ring.wait(None)
    else:
        while got < n:
            if ring.pop() is not None:
                got += 1
            else:
                ring.wait(None)
    done.send(time.perf_counter())


def _pipe_producer(conn, n, size, start):
    data = b"x" * size
    start.wait()
    for _ in range(n):
        conn.send_bytes(data)


def _pipe_consumer(conn, n, done):
    done.send("ready")
    for _ in range(n):
        conn.recv_bytes()
    done.send(time.perf_counter())


def _queue_producer(q, n, size, start):
    data = b"x" * size
    start.wait()
    for _ in range(n):
        q.put(data)


def _queue_consumer(q, n, done):
    done.send("ready")
    for _ in range(n):
        q.get()
    done.send(time.perf_counter())


def _timed_pair(producer, pargs, consumer, cargs):
    """msgs/s from the producer's start signal to the consumer's last message."""
    start = CTX.Event()
    done_r, done_w = CTX.Pipe(duplex=False)
    c = CTX.Process(target=consumer, args=(*cargs, done_w))
    p = CTX.Process(target=producer, args=(*pargs, start))
    c.start()
    p.start()
    assert done_r.recv() == "ready"
    t0 = time.perf_counter()
    start.set()
    t1 = done_r.recv()
    p.join()
    c.join()
    if p.exitcode or c.exitcode:
        raise RuntimeError(f"benchmark process failed: producer {p.exitcode}, consumer {c.exitcode}")
    return t1 - t0


def throughput(n, size, capacity):
    out = {}
    name = f"bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    seg = DataSegment.create(name, 1, capacity, 4096)
    try:
        for label, batched in (("ring_batched", True), ("ring_single", False)):
            dt = _timed_pair(_ring_producer, (name, n, size), _ring_consumer, (name, n, batched))
            out[label] = n / dt
    finally:
        seg.close()
        unlink(name)
    a, b = CTX.Pipe(duplex=False)
    out["pipe"] = n / _timed_pair(_pipe_producer, (b, n, size), _pipe_consumer, (a, n))
    q = CTX.Queue()
    out["queue"] = n / _timed_pair(_queue_producer, (q, n, size), _queue_consumer, (q, n))
    out = {k: round(v) for k, v in out.items()}
    out["ring_vs_pipe"] = round(out["ring_batched"] / out["pipe"], 2)
    out["ring_vs_queue"] = round(out["ring_batched"] / out["queue"], 2)
    return out


# -- ping-pong latency -----------------------------------------------------------------
def _ring_echo(name, rounds):
    seg = DataSegment.attach(name)
    tasks, results = seg.tasks(0), seg.results(0)
    for _ in range(rounds):
        while (m := tasks.pop()) is None:
            tasks.wait(None)
        results.push(m[0], m[1])
        results.notify()


def _pipe_echo(conn, rounds):
    for _ in range(rounds):
        conn.send_bytes(conn.recv_bytes())


def _queue_echo(qin, qout, rounds):
    for _ in range(rounds):
        qout.put(qin.get())


def _percentiles(samples_ns):
    s = sorted(samples_ns)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))] / 1000  # noqa: E731
    return {"p50_us": round(pick(0.50), 2), "p99_us": round(pick(0.99), 2)}


def latency(rounds, warmup=1000):
    total = rounds + warmup
    data = b"p" * 64
    out = {}
    name = f"bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    seg = DataSegment.create(name, 1, 1 << 16, 1 << 16)
    try:
        tasks, results = seg.tasks(0), seg.results(0)
        echo = CTX.Process(target=_ring_echo, args=(name, total))
        echo.start()
        samples = []
        for i in range(total):
            t0 = time.perf_counter_ns()
            tasks.push(i, data)
            tasks.notify()
            while results.pop() is None:
                results.wait(None)
            samples.append(time.perf_counter_ns() - t0)
        echo.join()
        out["ring"] = _percentiles(samples[warmup:])
    finally:
        seg.close()
        unlink(name)

    a, b = CTX.Pipe()
    echo = CTX.Process(target=_pipe_echo, args=(b, total))
    echo.start()
    samples = []
    for _ in range(total):
        t0 = time.perf_counter_ns()
        a.send_bytes(data)
        a.recv_bytes()
        samples.append(time.perf_counter_ns() - t0)
    echo.join()
    out["pipe"] = _percentiles(samples[warmup:])

    qin, qout = CTX.Queue(), CTX.Queue()
    echo = CTX.Process(target=_queue_echo, args=(qin, qout, total))
    echo.start()
    samples = []
    for _ in range(total):
        t0 = time.perf_counter_ns()
        qin.put(data)
        qout.get()
        samples.append(time.perf_counter_ns() - t0)
    echo.join()
    out["queue"] = _percentiles(samples[warmup:])
    for peer in ("pipe", "queue"):
        out[f"{peer}_vs_ring_p50"] = round(out[peer]["p50_us"] / out["ring"]["p50_us"], 2)
        out[f"{peer}_vs_ring_p99"] = round(out[peer]["p99_us"] / out["ring"]["p99_us"], 2)
    return out


def _per_call_us(fn, n):
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def gil_calls(n=2000):
    """µs per empty-ring look, GIL kept (fleet._rings) vs released (cffi), alone and with
    a busy Python thread beside the caller."""
    from fleet import _rings
    from fleet._native import ffi, lib

    mapping = mmap.mmap(-1, lib.fleet_ring_bytes(4096), mmap.MAP_SHARED)  # page-aligned, as a segment's rings
    mem = ffi.from_buffer(mapping)
    assert lib.fleet_ring_init(mem, 4096) == 0
    addr = int(ffi.cast("uintptr_t", mem))
    calls = {"rings": lambda: _rings.used(addr), "cffi": lambda: lib.fleet_ring_used(mem)}
    out = {f"alone_{k}_us": round(_per_call_us(fn, n * 10), 3) for k, fn in calls.items()}
    stop, running = threading.Event(), threading.Event()

    def busy():
        running.set()
        while not stop.is_set():
            pass

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    running.wait()  # it runs, and wants the GIL back whenever it lets it go
    try:
        out.update({f"busy_{k}_us": round(_per_call_us(fn, n), 3) for k, fn in calls.items()})
    finally:
        stop.set()
        t.join()
    out["busy_cffi_over_rings"] = round(out["busy_cffi_us"] / out["busy_rings_us"], 1)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--n", type=int, default=200_000, help="messages per one-way run (64 B; 4 KiB runs use n/4)")
    ap.add_argument("--rounds", type=int, default=20_000, help="ping-pong round trips")
    ap.add_argument("--capacity", type=int, default=1 << 20, help="tasks ring capacity for the one-way runs")
    args = ap.parse_args(argv)
    result = {
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "python": sys.version.split()[0],
        "throughput_msgs_s": {
            "64B": throughput(args.n, 64, args.capacity),
            "4KiB": throughput(max(1, args.n // 4), 4096, args.capacity),
        },
        "pingpong_64B": latency(args.rounds),
        "calls_beside_a_busy_thread": gil_calls(),
        "params": {"n": args.n, "rounds": args.rounds, "capacity": args.capacity, "notify_every": BATCH},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for size, row in result["throughput_msgs_s"].items():
            print(f"one-way {size:>5}: " + "  ".join(f"{k}={v:,}" for k, v in row.items()))
        lat = result["pingpong_64B"]
        for k in ("ring", "pipe", "queue"):
            print(f"ping-pong {k:>5}: p50 {lat[k]['p50_us']} µs  p99 {lat[k]['p99_us']} µs")
        print(f"ratios: pipe/ring p50 {lat['pipe_vs_ring_p50']}  queue/ring p50 {lat['queue_vs_ring_p50']}")
        print("calls beside a busy thread: " + "  ".join(f"{k}={v}" for k, v in result["calls_beside_a_busy_thread"].items()))


if __name__ == "__main__":
    main()
