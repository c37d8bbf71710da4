"""Child-process programs for the multi-process table tests and the benchmark.

Run as ``python -m tests.table_procs COMMAND FLEET_NAME ...`` from the project root.
Each prints ``ready`` once attached and compiled, then waits for a line on stdin
before it starts, so that several processes hammer the table at the same time.
"""
from __future__ import annotations

import sys

import numpy as np
from numba import njit

from fleet import fsm
from fleet.table import SlotTable
from fleet.table.kernels import apply_transition

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


def main(argv):
    command, name = argv[0], argv[1]
    table = SlotTable.attach(name)
    table._kernels()
    role, n_slots, target, out = int(argv[2]), int(argv[3]), int(argv[4]), argv[5]
    counts = np.zeros((n_slots, 3), dtype=np.int64)
    # Compile before the start line, so the race starts together.
    hammer(table.slots, table.roles, table.n_roles, table.posture, n_slots, role, 0, counts)
    print("ready", flush=True)
    sys.stdin.readline()
    if command == "hammer":
        attempts = hammer(table.slots, table.roles, table.n_roles, table.posture, n_slots, role, target, counts)
        np.save(out, counts)
        print(f"attempts {attempts}", flush=True)
    table.close()


if __name__ == "__main__":
    main(sys.argv[1:])
