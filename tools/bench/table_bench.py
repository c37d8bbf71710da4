#!/usr/bin/env python3
"""Benchmark the shared table's transition kernels and snapshots.

    python tools/bench/table_bench.py [--json] [--transitions N]

Figures (all measured in this run):
  ns_per_transition_njit       one process, kernel called in an njit loop
  ns_per_transition_contended  two processes racing on the same slots (per attempt, each side)
  ns_per_call_python           one transition from Python through SlotTable.transition
  ns_per_call_kernel_direct    the same kernel called from Python without the wrapper
                               (fleet._table's call over the mapping)
  ns_per_grant_K_per_pass_*    a loop pass granting K slots (LEASE each): one call per grant
                               (`calls`) against one `apply_ops` call for the pass (`batch`)
  us_per_snapshot              full consistent snapshot of a 64-slot table
and a peer measured the same way: the same Idle->Leased->Running->Idle cycle done
from Python on a multiprocessing shared array under a multiprocessing.Lock, with
ratios peer/fleet (how many times faster fleet is).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
import timeit
import uuid

import numpy as np
from numba import njit

from fleet.rules import fsm
from fleet.rules.roles import REFERENCE_ROLES
from fleet.shm.table import SlotTable
from fleet.shm.table.kernels import apply_transition

LEASE, START, RELEASE, ANY = fsm.LEASE, fsm.START, fsm.RELEASE, fsm.ANY_ROLE
ROLE = REFERENCE_ROLES.code("resolve")


@njit(cache=True, _nrt=False)
def cycle(slots, roles, n_roles, posture, n_slots, role, attempts):
    """`attempts` transition attempts cycling slots Idle->Leased->Running->Idle; returns #applied."""
    applied = 0
    s = 0
    i = 0
    while i < attempts:
        applied += apply_transition(slots, roles, n_roles, posture, s, LEASE, role, 0, -1) == 0
        applied += apply_transition(slots, roles, n_roles, posture, s, START, ANY, 0, -1) == 0
        applied += apply_transition(slots, roles, n_roles, posture, s, RELEASE, ANY, 0, -1) == 0
        i += 3
        s += 1
        if s == n_slots:
            s = 0
    return applied


def _kernel_args(t):
    """The table as the njit loop takes it: numpy views of its regions (memoryviews in a SlotTable)."""
    as_array = lambda region: np.frombuffer(region, dtype=np.uint64)  # noqa: E731
    return as_array(t.slots), as_array(t.roles), t.n_roles, as_array(t.posture)


def bench_njit(table, n):
    cycle(*_kernel_args(table), 4, ROLE, 30)  # compile / load
    t0 = time.perf_counter_ns()
    applied = cycle(*_kernel_args(table), 4, ROLE, n)
    dt = time.perf_counter_ns() - t0
    assert applied == n - n % 3 or applied >= n - 3
    return dt / applied


def child(name, n):
    table = SlotTable.attach(name)
    cycle(*_kernel_args(table), 4, ROLE, 30)
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter_ns()
    applied = cycle(*_kernel_args(table), 4, ROLE, n)
    dt = time.perf_counter_ns() - t0
    print(json.dumps({"ns": dt, "attempts": n, "applied": int(applied)}), flush=True)
    table.close()


def bench_contended(table, n):
    procs = [
        subprocess.Popen([sys.executable, __file__, "--child", table.name, str(n)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.communicate(timeout=600)[0]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    per_attempt = [r["ns"] / r["attempts"] for r in results]
    applied = sum(r["applied"] for r in results)
    wall = max(r["ns"] for r in results)
    return float(np.mean(per_attempt)), applied / (wall / 1e9)


def bench_python_call(table, n):
    t = table
    t.transition(0, LEASE, ROLE)
    t.transition(0, START)
    t.transition(0, RELEASE)
    per_method = timeit.timeit(lambda: t.transition(1, LEASE, ROLE) or t.transition(1, START) or t.transition(1, RELEASE),
                               number=n // 3) / (n // 3 * 3)
    fn = t._kernels().transition
    per_direct = timeit.timeit(
        lambda: (fn(2, LEASE, ROLE, 0, -1), fn(2, START, ANY, 0, -1), fn(2, RELEASE, ANY, 0, -1)),
        number=n // 3) / (n // 3 * 3)
    return per_method * 1e9, per_direct * 1e9


def bench_grant_pass(table, grants, n):
    """ns per grant for one loop pass of `grants` LEASEs: one `transition` call each
    (what the loop did) against the rows joined into one `apply_ops` call (what it does).
    Each round leases slots 0..grants-1 and walks them home, outside the timing."""
    t = table
    rows = [[s, LEASE, ROLE, 0, 0] for s in range(grants)]

    def home():
        for s in range(grants):
            t.transition(s, START)
            t.transition(s, RELEASE)

    per_call = batch = 0
    for _ in range(n):
        t0 = time.perf_counter_ns()
        for s, event, role, key, _chained in rows:
            t.transition(s, event, role, key)
        t1 = time.perf_counter_ns()
        home()
        t2 = time.perf_counter_ns()
        ops: list = []
        for row in rows:
            ops += row
        t.apply_ops(ops)
        t3 = time.perf_counter_ns()
        home()
        per_call += t1 - t0
        batch += t3 - t2
    return per_call / n / grants, batch / n / grants


def bench_snapshot(name, n):
    with SlotTable.create(name, REFERENCE_ROLES, 64) as t:
        try:
            t.snapshot()
            return timeit.timeit(t.snapshot, number=n) / n * 1e6
        finally:
            t.unlink()


def peer_cycle(words, lock, n):
    """The peer: the same cycle as plain Python under a process-shared lock."""
    applied = 0
    for i in range(n // 3):
        s = i % 4
        for expect, to in ((0, 1), (1, 2), (2, 0)):
            with lock:
                if words[s] & 0xF == expect:
                    words[s] = ((words[s] >> 36) + 1) << 36 | to
                    applied += 1
    return applied


def bench_peer(n):
    words = mp.Array("Q", 4, lock=False)
    lock = mp.Lock()
    t0 = time.perf_counter_ns()
    applied = peer_cycle(words, lock, n)
    return (time.perf_counter_ns() - t0) / applied


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--transitions", type=int, default=3_000_000, help="transitions per in-kernel run")
    parser.add_argument("--child", nargs=2, metavar=("NAME", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]))
        return 0
    name = f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    with SlotTable.create(name, REFERENCE_ROLES, 8) as table:
        try:
            njit_ns = min(bench_njit(table, args.transitions) for _ in range(3))
            contended_ns, contended_rate = bench_contended(table, args.transitions)
            method_ns, direct_ns = bench_python_call(table, 300_000)
            pass1 = bench_grant_pass(table, 1, 30_000)
            pass8 = bench_grant_pass(table, 8, 30_000)
        finally:
            table.unlink()
    snapshot_us = bench_snapshot(name + "-s", 20_000)
    peer_ns = bench_peer(300_000)
    result = {
        "ns_per_transition_njit": round(njit_ns, 1),
        "ns_per_transition_contended": round(contended_ns, 1),
        "contended_applied_per_s": round(contended_rate),
        "ns_per_call_python": round(method_ns, 1),
        "ns_per_call_kernel_direct": round(direct_ns, 1),
        "ns_per_grant_1_per_pass_calls": round(pass1[0], 1),
        "ns_per_grant_1_per_pass_batch": round(pass1[1], 1),
        "ns_per_grant_8_per_pass_calls": round(pass8[0], 1),
        "ns_per_grant_8_per_pass_batch": round(pass8[1], 1),
        "ratio_grant_calls_over_batch_8_per_pass": round(pass8[0] / pass8[1], 2),
        "us_per_snapshot": round(snapshot_us, 2),
        "snapshot_slots": 64,
        "peer_mp_lock_python_ns_per_transition": round(peer_ns, 1),
        "ratio_peer_over_njit": round(peer_ns / njit_ns, 1),
        "ratio_peer_over_python_call": round(peer_ns / method_ns, 2),
        "targets": {"ns_per_transition_njit": 50, "ns_per_transition_contended": 200, "us_per_snapshot": 20},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:40} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
