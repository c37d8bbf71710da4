"""Which worker deaths the kernel's OOM killer caused (pure).

The kernel counts every OOM kill in the memory group's counter (cgroup v2
``memory.events`` ``oom_kill``, v1 ``memory.oom_control`` ``oom_kill``) *before* it sends
the victim SIGKILL (mm/oom_kill.c), so once a dead worker is reaped its kill is in the
count. The supervisor reads the counter at boot, at every sample and at every death it
did not cause; the growth between two readings is the kills seen then.

The rules:

* only a worker that died of SIGKILL the supervisor did not send can have been OOM-killed
  (the OOM killer sends SIGKILL and nothing else);
* such a death claims one kill seen and not yet claimed: it was OOM-killed;
* a kill stays claimable for `CLAIM_MS` after it was seen. A kill no worker death claims
  in that time was of another process in the group (one beside the fleet, the fork
  server): left claimable for ever, it would name a later ``kill -9`` an OOM kill;
* a counter that went back (the group was recreated) is a new baseline, no kill.

Two workers killed at once are both named: the first reading after them sees both kills.
Everything here is a pure function of (state, reading, now); `fleet.runtime.seat_deaths`
reads the counter (`fleet.host.cgroup.read_oom_kills`).
"""
from __future__ import annotations

from admission.records import record


#: How long a kill seen in the counter may be claimed by a worker's death: the loop hears a
#: death within a wait of its pidfd; a sample (0.25 s) may read the kill first.
CLAIM_MS = 5000


@record
class OomBooks:
    """`last`: the counter at the last reading (None: never read). `seen`: when each kill
    not yet claimed was seen (ms). `named`: deaths named OOM kills so far."""

    last: int | None = None
    seen: tuple[int, ...] = ()
    named: int = 0


def observe(books: OomBooks, now_ms: int, count: int | None) -> OomBooks:
    """Feed one reading of the counter (None: unreadable, nothing changes but expiry)."""
    seen = tuple(at for at in books.seen if now_ms - at < CLAIM_MS)
    if count is None:
        return OomBooks(books.last, seen, books.named)
    if books.last is None or count < books.last:  # the first reading, or the group was recreated
        return OomBooks(count, seen, books.named)
    return OomBooks(count, seen + (now_ms,) * (count - books.last), books.named)


def claim(books: OomBooks, now_ms: int, status: int, ours: bool, sigkill: int = 9) -> tuple[OomBooks, bool]:
    """Whether a worker that died with wait status `status` (negative: the signal) was
    OOM-killed; call after `observe` with a reading taken once it was reaped. `ours`: the
    supervisor killed it itself (a timeout, a lost lease, shutdown)."""
    if ours or status != -sigkill:
        return books, False
    seen = tuple(at for at in books.seen if now_ms - at < CLAIM_MS)
    if not seen:
        return OomBooks(books.last, seen, books.named), False
    return OomBooks(books.last, seen[1:], books.named + 1), True
