"""Build real fleet tables the way the supervisor lays them out, for the tools' tests.

`create_table` writes boot metadata in the supervisor's shape (plan, budget, seats,
slot_seats) and `populate` drives slots, posture, ledger and queues to a known
state through the table's own writers and kernels. Run as a script
(``python -m tests.fleet_tables NAME``) it creates and populates a table, prints
``ready`` and sleeps: a creator process a test can kill to leave a stale table.
"""
from __future__ import annotations

import os
import sys
import time

from fleet.rules import fsm
from fleet.rules.plan import resolve
from fleet.rules.roles import Role, RoleSet
from fleet.shm.table import SlotTable

ROLES = RoleSet(
    (
        Role(name="solver", kind="pinned", slots=2, peak_cpus=2),
        Role(name="sim", kind="pooled", cordon_class="floor", slots=2, queue_bound=64, io_bound=True, peak_cpus=0),
        Role(name="merge", kind="singleton", peak_cpus=1),
    )
)
N_SLOTS = 5
#: posture record written by `populate`: Cordoned for DWELL_NS before `since`'s reference
SINCE_NS = 1_000_000_000_000
CORDONED_BEFORE_NS = 5_000_000_000
FAILED_BY_REASON = [2, 1, 3, 0, 0, 0, 0, 1, 0, 0, 0, 0]  # HandlerError 2, Timeout 1, LaneDeath 3, Cancelled 1
FSM_REFUSED = 4  # transitions the slot FSM refused (a dead seat's reset refusals need not cost a unit)
STRAY_RESULTS = 5  # messages from workers that were no owed unit's outcome
#: The 40 units in items (submitted, solved, suppressed, failed, in flight): some were chunks of a map.
ITEMS = (1_000, 700, 50, 175, 75)


def boot_meta(name: str, quota: float = 8, profile: str = "auto", pid: int | None = None) -> dict:
    plan = resolve(quota, profile, ROLES).to_dict()
    seats = [
        {"index": i, "name": f"work-{name[:6]}-{i}", "roles": ["solver"], "cpus": [i % 2], "binding": "pinned"}
        for i in range(N_SLOTS)
    ]
    return {
        "fleet": name,
        "version": "0.1.0",
        "pid": os.getpid() if pid is None else pid,
        "mode": "service",
        "started_ns": time.time_ns(),
        "plan": {"fleet_booted": True, **plan["plan"], "quota_source": "config fleet.cpus"},
        "budget": plan["budget"],
        "seats": seats,
        "slot_seats": list(range(N_SLOTS)),
        "socket": None,
    }


def create_table(name: str, **meta_kwargs) -> SlotTable:
    return SlotTable.create(name, ROLES, N_SLOTS, meta=boot_meta(name, **meta_kwargs))


def populate(table: SlotTable, worker_pid: int | None = None) -> None:
    """Slots: 0 Running solver key 7, 1 Pinned solver key 9 (its seat contended), 2 Running sim,
    3 Leased merge, 4 Idle after serving sim, then merge (one role switch)."""
    pid = os.getpid() if worker_pid is None else worker_pid
    solver, sim, merge = (ROLES.code(r) for r in ("solver", "sim", "merge"))
    table.set_slot_meta(0, pid=pid, cpus=[0, 1], binding="pinned", unit=101)
    table.apply(0, "LEASE", solver, 7)
    table.apply(0, "START")
    table.set_slot_meta(1, pid=pid, cpus=[1], binding="pinned", unit=102)
    table.apply(1, "LEASE", solver, 9)
    table.apply(1, "START")
    table.apply(1, "PIN_KEYED")
    table.count_done(1)
    table.set_contention(1, True, 2)  # its seat's worker waits for its CPU now, the second time
    table.set_slot_meta(2, pid=pid, cpus=[0, 1], binding="shared", unit=103)
    table.apply(2, "LEASE", sim)
    table.apply(2, "START")
    table.set_slot_meta(3, pid=pid, cpus=[0], binding="logical")
    table.apply(3, "LEASE", merge)
    for event, role in (("LEASE", sim), ("START", None), ("RELEASE", None), ("LEASE", merge), ("START", None),
                        ("PIN_SINGLETON", None), ("UNPIN", None)):
        table.apply(4, event, fsm.ANY_ROLE if role is None else role)
    table.set_posture(
        fsm.CORDONED, cause=1, since_ns=SINCE_NS, enter_count=3, exit_count=2, cordoned_ns=CORDONED_BEFORE_NS,
        suppressed=17, enter_events=2, enter_window_ms=1000, duty_ppm=25_000, duty_window_ms=5000,
        exit_clean_ms=10000, intake_floor=0,
    )
    table.set_ledger(submitted=40, solved=28, suppressed=2, failed=7, inflight=3, failed_by_reason=FAILED_BY_REASON,
                     fsm_refused=FSM_REFUSED, stray_results=STRAY_RESULTS, items=ITEMS)
    table.set_queue_depth(solver, 5, in_use=2, repins=3)
    table.set_queue_depth(sim, 11, in_use=1)


def main(name: str) -> None:
    table = create_table(name)
    populate(table)
    print("ready", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1])
