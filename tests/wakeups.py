"""How often a process's threads were woken: the kernel's context-switch counts. A thread
asleep in a wait without a timeout is never switched in, so an idle window in which its
count did not move shows that it did not poll, spin or tick."""
from __future__ import annotations

import os


def switches_by_thread(pid: int) -> dict[int, int]:
    """Voluntary and involuntary context switches so far, per thread of ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                text = f.read()
        except FileNotFoundError:  # the thread ended since the listing
            continue
        out[int(tid)] = sum(int(line.split()[1]) for line in text.splitlines()
                            if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")))
    return out


def woken(pid: int, before: dict[int, int]) -> list[int]:
    """The threads of ``pid`` switched in since ``before`` (a `switches_by_thread`)."""
    return sorted(tid for tid, n in switches_by_thread(pid).items() if n != before.get(tid))
