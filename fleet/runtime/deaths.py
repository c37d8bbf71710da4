"""What a seat's death means for each unit it owed (pure).

A worker that dies (killed from outside, crashed, or killed by the supervisor for a
unit's timeout or lost lease) owed an outcome for every unit granted to its seat's
slots and not yet delivered: the one that ran, and on a seat that runs its units one
after another, every other unit granted to its slots or sent ahead, waiting on its
ring. Whether a unit had started is the fact that decides. The worker leaves the
evidence itself: it records a unit's id in its slot's row of the table in the same
kernel call that STARTs (or RESUMEs) the slot, before it decodes the unit or calls
its handler (`SlotTable.start_unit`); a unit whose id is not there never ran a line
of its handler on that seat. (A chunk of a map is one unit: it started once any of
its items did.)

The rules, for each unit the seat owed, in this order:

* its host-group lease ended (its worker was killed for it, or the lease was lost
  while the unit waited on the seat): failed with the lease's own reason
  (LeaseExpired, LeaseDenied or LeasePreempted), started or not, since no unit runs
  without its lease;
* it ran past its timeout (its worker was killed for it): Failed(Timeout);
* it had started: Failed(LaneDeath). It may have done part of its work, so it never
  runs again: a unit runs at most once;
* it had not: no outcome. It goes back to the head of its queue, in the order it was
  granted, and runs where it is granted next (`Dispatcher.put_back_first`).

The shell (the supervisor) reads the facts, kills, re-forks, records the outcomes and
puts the units back; this module only decides.
"""
from __future__ import annotations

from typing import Sequence

from admission.records import record
from fleet.rules.outcomes import FAILED, FAILURE_REASONS, LANE_DEATH, TIMEOUT
from fleet.rules.unit import Outcome


@record(slots=True)
class Owed:
    """What is known of one unit a dead seat owed."""

    unit_id: int
    #: its id is in its slot's row: the worker STARTed it (its handler may have run)
    started: bool
    #: the supervisor killed the worker because this unit ran past its timeout
    timed_out: bool = False
    #: (reason, detail) of its host-group lease's end before its outcome (None: it still holds it)
    lease_lost: tuple[str, str] | None = None


#: How a LaneDeath's detail begins when the kernel's OOM killer killed the worker.
OOM = "oom"


def cause(status: int, timed_out: Sequence[int] = (), oom_where: str | None = None) -> str:
    """How the worker died, from its wait status (negative: the signal), naming the unit
    whose timeout killed it when there is one, and the kernel's OOM killer when it was
    that (`oom_where`: the file that counted the kill, fleet.rules.oom)."""
    how = f"signal {-status}" if status < 0 else f"exit code {status}"
    if oom_where is not None:
        how = f"{OOM}: killed by the kernel's OOM killer ({how}; counted in {oom_where})"
    if timed_out:  # the others on the seat die of that unit's timeout: say so
        how += f", killed because unit {timed_out[0]} ran past its timeout"
    return how


def verdict(unit: Owed, worker: str) -> Outcome | None:
    """The outcome the death gives `unit`, or None: it never started and goes back to its
    queue. `worker` says which worker died and how (the LaneDeath detail)."""
    if unit.lease_lost is not None:
        return Outcome(FAILED, *unit.lease_lost)
    if unit.timed_out:
        return Outcome(FAILED, FAILURE_REASONS[TIMEOUT], "the unit ran past its timeout; its worker was killed")
    if unit.started:
        return Outcome(FAILED, FAILURE_REASONS[LANE_DEATH], f"{worker} while the unit ran")
    return None
