"""Child-process programs for the multi-process table tests and the benchmark.

Run as ``python -m tests.table_procs COMMAND FLEET_NAME ...`` from the project root.
Each prints ``ready`` once attached and compiled, then waits for a line on stdin
before it starts, so that several processes hammer the table at the same time.
"""
from __future__ import annotations

import mmap
import sys

import numpy as np
from numba import njit

from fleet.rules import fsm
from fleet.shm.table import SlotTable
from fleet.shm.table.atomics import fetch_add, load_acquire
from fleet.shm.table.kernels import SLOT_FIELDS, apply_transition, seq_write

LEASE, START, RELEASE, ANY = fsm.LEASE, fsm.START, fsm.RELEASE, fsm.ANY_ROLE


@njit(cache=True, _nrt=False)
def hammer(slots, roles, n_roles, posture, n_slots, role, target, counts):
    """Cycle every slot Idle -> Leased -> Running -> Idle, racing other processes.

    counts[s, 0..2] tallies the LEASE, START and RELEASE this process won on slot s.
    Stops once this process has applied `target` transitions (target < 0: never).
    Returns the number of attempts.
    """
    done = 0
    attempts = 0
    s = 0
    while target < 0 or done < target:
        if apply_transition(slots, roles, n_roles, posture, s, LEASE, role, 0, -1) == 0:
            counts[s, 0] += 1
            done += 1
        if apply_transition(slots, roles, n_roles, posture, s, START, ANY, 0, -1) == 0:
            counts[s, 1] += 1
            done += 1
        if apply_transition(slots, roles, n_roles, posture, s, RELEASE, ANY, 0, -1) == 0:
            counts[s, 2] += 1
            done += 1
        attempts += 3
        s += 1
        if s == n_slots:
            s = 0
    return attempts


@njit(cache=True, _nrt=False)
def arrive(gate, parties, spins):
    """A start barrier: count this process in, then look until `parties` have (at most
    `spins` looks: a party that died lets the rest go). Reading "go" on stdin does not
    start the racers together: on a loaded host one may run its whole share before the
    scheduler wakes the other."""
    fetch_add(gate, 0, 1)
    for _ in range(spins):
        if load_acquire(gate, 0) >= parties:
            return True
    return False


@njit(cache=True, _nrt=False)
def write_meta(slots, slot, rounds, fields, values):
    """Rewrite a slot's record `rounds` times (rounds < 0: for ever) with one value in
    every field, so a reader that sees two different values saw a torn record."""
    i = 0
    while rounds < 0 or i < rounds:
        i += 1
        for j in range(values.size):
            values[j] = np.uint64(i)
        seq_write(slots, slot * SLOT_FIELDS + 1, fields, values)
        # A breath between writes (~1 µs; still a million writes a second): a seqlock reader
        # needs the record to be whole at some moment, and a writer that rewrites it
        # back to back for ever starves every reader.
        for _ in range(1000):
            load_acquire(slots, slot * SLOT_FIELDS + 1)
    return i


def _arrays(table):
    """numpy views of the table's regions (a SlotTable gives memoryviews), for the njit loops."""
    return (np.frombuffer(table.slots, dtype=np.uint64), np.frombuffer(table.roles, dtype=np.uint64),
            np.frombuffer(table.posture, dtype=np.uint64))


def main(argv):
    command, name = argv[0], argv[1]
    table = SlotTable.attach(name)
    table._kernels()
    slots, roles, posture = _arrays(table)
    if command == "meta-writer":
        fields = np.array([2, 3, 4, 5], dtype=np.int64) + int(argv[2]) * SLOT_FIELDS  # unit, pid, cpus lo/hi
        values = np.zeros(4, dtype=np.uint64)
        write_meta(slots, int(argv[2]), 1, fields, values)
        print("ready", flush=True)
        sys.stdin.readline()
        write_meta(slots, int(argv[2]), -1, fields, values)
        return
    role, n_slots, target, out = int(argv[2]), int(argv[3]), int(argv[4]), argv[5]
    counts = np.zeros((n_slots, 3), dtype=np.int64)
    # Compile before the start line, so the race starts together.
    hammer(slots, roles, table.n_roles, posture, n_slots, role, 0, counts)
    gate = None
    if len(argv) > 7:  # a start barrier: a file of uint64 words the racers share, and how many they are
        with open(argv[6], "r+b") as f:
            gate = np.frombuffer(mmap.mmap(f.fileno(), 0), dtype=np.uint64)
        arrive(np.zeros(1, dtype=np.uint64), 0, 0)  # compiled before the start line too
    print("ready", flush=True)
    sys.stdin.readline()
    if gate is not None:
        arrive(gate, int(argv[7]), 2_000_000_000)
    if command == "hammer":
        attempts = hammer(slots, roles, table.n_roles, posture, n_slots, role, target, counts)
        np.save(out, counts)
        print(f"attempts {attempts}", flush=True)
    del slots, roles, posture
    table.close()


if __name__ == "__main__":
    main(sys.argv[1:])
