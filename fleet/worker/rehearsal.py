"""The fork server's rehearsal: a worker's loop run over scratch memory before any fork.

Why. Python 3.11+ specialises ("quickens") a function's bytecode in place once it has
run a few times, and counts down to it in the code object itself: the first units a
worker runs write into the code objects of its loop, its codec and pickle, pages it
shares with the fork server until then, and each page written is copied into the
worker's own memory. Run here once, before the forks, those writes land in the fork
server's pages, which every worker inherits already specialised and shares; a worker's
own memory is then what it makes and the reference counts it moves (~150 KiB less of
each worker's own memory, below a ProcessPoolExecutor worker's: docs/executor.md, "What
a boot costs").

What. One seat's `Worker`, as the fork server makes them, over a table and a data
segment in anonymous memory of this process alone (`SlotTable.scratch`,
`DataSegment.scratch`: nothing in /dev/shm, nothing of the fleet's touched), running
`UNITS` no-op calls through the real path: the slot leased as the supervisor leases it,
the task pushed to the seat's ring, taken and run (`Worker._tasks`), its result pushed,
and taken off the ring here. The role is fleet's own call handler (`fleet.worker.calls`)
on ``abs(-1)``, whatever the fleet's roles: no handler of the user's runs, and the
Worker's own code is the same for every role. Everything is released before the forks.
"""
from __future__ import annotations

import threading

from fleet.rules import fsm
from fleet.rules.roles import Role, RoleSet
from fleet.shm import messages as M
from fleet.shm.dataplane import DataSegment
from fleet.shm.table import SlotTable
from fleet.worker import calls, codec
from fleet.worker.process import Worker

#: Units the rehearsal runs: past 3.11's warm-up of a code object (8 calls) and the
#: back-off of its adaptive instructions' first misses, so what a worker runs per unit
#: is specialised before it is forked.
UNITS = 32
#: The rehearsal's one role.
ROLE = Role(name="rehearsal", handler="fleet.worker.calls:call", slots=1)


def rehearse(fleet: str, *, lend: bool, units: int = UNITS) -> int:
    """Run `units` no-op calls through a scratch worker of fleet `fleet` (its parcels would
    be named by it; the rehearsal's values are small and make none); the number whose
    result came back solved. Raises what a broken rehearsal raises: the fork server logs it
    and forks unrehearsed workers (`fleet.worker.zygote`)."""
    roles = RoleSet((ROLE,))
    table = SlotTable.scratch(roles)
    try:
        data = DataSegment.scratch(fleet)
    except BaseException:
        table.close()
        raise
    try:
        worker = Worker(0, table, data, roles, [calls.call], lend=lend)
        worker._server = threading.get_ident()  # as its loop sets it: the whole path of a unit
        body = codec.task_body(ROLE.name, (abs, (-1,), calls.NO_KWARGS), None, None, None, pickled_payload=None,
                               limit=None)
        tasks, results = data.tasks(0), data.results(0)
        solved = 0
        for unit_id in range(1, units + 1):
            reason = table.transition(0, fsm.LEASE, 0)
            if reason != fsm.OK:
                raise RuntimeError(f"rehearsal: LEASE refused: {fsm.REASON_NAMES[reason]}")
            tasks.push2(M.TASK, M.TASK_HEAD.pack(unit_id, 0, 0, 0, fsm.START, 0), body)
            worker._tasks(tasks.pop_many())
            for tag, view in results.pop_many():
                if tag == M.RESULT and M.RESULT_HEAD.unpack_from(view)[2] == M.ST_SOLVED:
                    solved += 1
                del view
        return solved
    finally:
        worker = tasks = results = None
        data.close()
        table.close()
