"""Contention: a seat whose worker waits for its own CPU runs on its share's other CPUs
while that lasts, and goes back to its pin after a calm spell (pure).

Why. A seat's worker is pinned to its core(s) (`fleet.rules.seats`): no migrations, warm
caches, and a role never spends more than its share. That is right on a quiet host and
wrong when an unrelated busy process takes one of those cores: the pinned worker gets
what the scheduler leaves it there (half a core beside one busy loop) and waits on that
core's run queue at every wake-up, while a peer's unpinned workers move to the core that
is free. Measured on 2 cores with one busy loop pinned to one of them (tools/bench,
``--noisy``): one-at-a-time round trips 170/s pinned against 1,800/s with the worker
free to move; half the single submits went to the seat on the busy core.

The reading. Each posture sample (`fleet.runtime.contention`) reads the worker's
``/proc/PID/schedstat``: ns run, ns waited on a run queue. Over the window the share of
its demand (run + wait) it spent waiting says how contended its CPUs are for it. A
worker that asked for the CPU for less than `ContentionPolicy.min_demand` of the window
gives no evidence (an idle seat waits for nothing): such a window counts as calm.
The worker's looks for its next task (see `spin_for` below) are left out of both, but
for their long yields: a look yields the CPU at every turn, so beside the fleet's own
threads, which look too (the loop, a caller waiting for its result), it sat on the run
queue with nothing to run, a few microseconds a yield. Counted, that made a quiet
host's lone round trips read as contention (the serving seat's wait share over 0.25
within a second, every run), which turned the worker's look off and woke it for every
task: a p50 of 90-120 us where 50-75 us with it kept. A yield that kept the worker off
its CPU for 500 us or more is another matter: a busy neighbour ran a slice of its own
there (0.7-4 ms), and a task that came meanwhile waited for it; that stays in the
reading, and is how a seat beside a busy loop is found contended while it looks (left
out too, the same lone round trips beside one took 4 ms each, never found). The worker
counts its looks itself in its tasks ring (`fleet.shm.dataplane.Ring.looked`).

The decision, per seat, with hysteresis:

* calm -> contended: one window whose wait share is at least `enter_share`. The seat's
  worker is then *widened*: its affinity becomes its share's CPUs (`share_cpus`: the
  CPUs of every running seat that runs the same roles), so the scheduler places it on
  whichever of them is free, as it does a peer's workers.
* contended -> calm: `hold` windows in a row below `exit_share` (or without evidence).
  The worker is *re-pinned* to its seat's own CPUs.
* A widened worker's wait is read where it runs now, not on its home core: a neighbour
  that stays may look like calm, the worker is re-pinned and waits again. Contention
  that comes back within `hold` windows of a re-pin doubles the hold (at most
  `hold_max`), so a neighbour that stays costs one window per hold, ever rarer;
  contention after a longer calm starts again from `calm_windows`.

A worker's spin backs off (`spin_for`). A worker that ran out of work looks for its next
task for a while (yielding the CPU between looks) before it sleeps: on a quiet host that
catches the next task without a wake-up. On contended CPUs that spin takes the CPU the
worker shares from the threads that would send the task (the caller, the loop). Measured
on 2 cores with a busy loop on one, fleet.Executor against ProcessPoolExecutor in the
same run, quiet and noisy halves interleaved, 6 rounds at load 7-11: with the workers'
spin off while contended, noisy / quiet of per-unit submit 1.29 (0.78 with it kept), map
chunk 1 1.19 (0.98), one-at-a-time round trips 0.59 (0.32). The supervisor's loop keeps
its own spin: turning that off too cost the round trip (0.40 against 0.77 without any
back-off), since the loop, ahead of the workers by priority, waits there for the caller's
next submit. So a worker spins only while its seat is not contended.

What it never does: widen past the seat's share. A role's share is its cores
(002 §5); the widened worker runs on its own role's cores only, so the budget's bound
on each role holds. A seat that is its share's only one (a singleton, a role of one
core, the serial seat) has nowhere to go: it is read and shown contended, and stays on
its pin. Keyed pins (Pinned slots, T6) are slots of a worker process, not CPUs: a key's
units go to the same process, widened or not.
"""
from __future__ import annotations

from collections.abc import Sequence

from admission.records import record, replace
from fleet.rules.errors import ConfigError

#: Actions `step` returns: widen the seat's worker to its share's CPUs, or pin it back.
WIDEN = "widen"
REPIN = "repin"
#: `[fleet] contention`: act on the rule (widen, re-pin), or keep every worker on its pin
#: whatever the host does (the reading and status only).
CONTENTION_WIDEN = "widen"
CONTENTION_PIN = "pin"
CONTENTION_MODES = (CONTENTION_WIDEN, CONTENTION_PIN)


@record
class ContentionPolicy:
    """The thresholds, each a share of one reading's window (a posture sample: 0.25 s)."""

    #: a window whose wait share reaches this makes the seat contended (one busy loop on
    #: its core: ~0.5; a quiet host with the fleet's own loop beside it: ~0-0.1)
    enter_share: float = 0.25
    #: a window below this counts toward calm
    exit_share: float = 0.10
    #: demand (run + wait) below this share of the window: no evidence, counts as calm
    min_demand: float = 0.05
    #: calm windows before a re-pin (2 s at the posture's 0.25 s)
    calm_windows: int = 8
    #: the most calm windows a re-pin ever waits for (16 s)
    hold_max: int = 64

    def __post_init__(self):
        for name in ("enter_share", "exit_share", "min_demand"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"contention.{name}", f"must be a share in [0, 1], got {value!r}")
        if self.exit_share > self.enter_share:
            raise ConfigError("contention.exit_share",
                              f"must not exceed enter_share ({self.enter_share}), got {self.exit_share}")
        if not 1 <= self.calm_windows <= self.hold_max:
            raise ConfigError("contention.calm_windows",
                              f"must be in [1, hold_max={self.hold_max}], got {self.calm_windows!r}")


POLICY = ContentionPolicy()


@record
class SeatContention:
    """One seat's contention state (each worker of the seat starts calm)."""

    contended: bool = False
    #: calm windows in a row (contended only)
    calm: int = 0
    #: calm windows the next re-pin waits for
    hold: int = POLICY.calm_windows
    #: windows since the last re-pin, while that may still double the hold (None: longer, or never)
    since_repin: int | None = None
    #: times the seat was found contended, over the fleet's life
    episodes: int = 0


def wait_share(run_ns: int, wait_ns: int, window_ns: int, policy: ContentionPolicy = POLICY,
               looked: tuple[int, int] = (0, 0)) -> float | None:
    """The share of a worker's demand over a window spent waiting for a CPU; None when it
    asked for too little of the window (or the window or readings make no sense) to tell.
    `looked`: of `run_ns` and `wait_ns`, what its looks for a task took on CPU and off
    it in short yields (left out: the module doc says why)."""
    if window_ns <= 0 or run_ns < 0 or wait_ns < 0 or looked[0] < 0 or looked[1] < 0:
        return None
    run_ns, wait_ns = max(0, run_ns - looked[0]), max(0, wait_ns - looked[1])
    demand = run_ns + wait_ns
    if demand <= 0 or demand < policy.min_demand * window_ns:
        return None
    return wait_ns / demand


def step(state: SeatContention, share: float | None, policy: ContentionPolicy = POLICY
         ) -> tuple[SeatContention, str | None]:
    """One window's reading (`wait_share`) applied to a seat: its new state, and WIDEN,
    REPIN or None for what its worker's affinity should do."""
    if not state.contended:
        since = None if state.since_repin is None or state.since_repin >= state.hold else state.since_repin + 1
        if share is None or share < policy.enter_share:
            return replace(state, since_repin=since), None
        # back within a hold of the last re-pin: the neighbour stayed, wait twice as long next time
        hold = min(policy.hold_max, state.hold * 2) if since is not None else policy.calm_windows
        return SeatContention(True, 0, hold, None, state.episodes + 1), WIDEN
    if share is not None and share >= policy.exit_share:
        return replace(state, calm=0), None
    calm = state.calm + 1
    if calm < state.hold:
        return replace(state, calm=calm), None
    return SeatContention(False, 0, state.hold, 0, state.episodes), REPIN


def spin_for(spin_s: float, contended: bool) -> float:
    """How long a thread looks for its next message before it sleeps: `spin_s` on calm
    CPUs, none on contended ones (the module doc says why)."""
    return 0.0 if contended else spin_s


class LookBeforeSleep:
    """How long the supervisor's loop looks for its next event (a result, a submit)
    before it sleeps on its bell, learnt from how soon the last ones came.

    Why. Looking catches an event that comes within the look without a wake-up (~20-50
    us on a busy VM, each one on the round trip of a small unit); but the look runs on a
    core the workers need, and the loop looks after every turn with units out. Units of
    milliseconds (a map's chunks) bring a result every millisecond or so: a fixed look of
    150 us after each was ~9% of a core taken from the workers on 2 cores (50 us calls in
    chunks of 64 ran at 0.88-0.90 of the CPU limit against bare processes' 0.97-0.98).

    The rule. After a wait, ``waited(seconds, came)``: an event that came within `most_s`
    of the wait's start (caught in the look, or soon after the sleep began) means looking
    pays: the next look is `most_s` again. A wait that outlasted `most_s` (nothing came in
    that long) halves the next look, down to none below `least_s`: a loop whose events
    come slower than a look looks no more, and looks again from the first one that comes
    within it."""

    __slots__ = ("most_s", "least_s", "look_s")

    def __init__(self, most_s: float, least_s: float):
        self.most_s, self.least_s = most_s, least_s
        self.look_s = most_s  # the next look's length

    def waited(self, seconds: float, came: bool) -> None:
        if came and seconds <= self.most_s:
            self.look_s = self.most_s
        else:
            half = self.look_s / 2
            self.look_s = half if half >= self.least_s else 0.0


def share_cpus(seat_roles: Sequence[frozenset], placement: Sequence[tuple[int, ...] | None], seat: int
               ) -> tuple[int, ...]:
    """The CPUs a contended `seat`'s worker may run on: those of every running seat
    (`placement[i]` not None) that runs the same roles (`seat_roles[i]`) as it: its
    role's share, never beyond. Its own CPUs alone when no other seat shares them."""
    mine = seat_roles[seat]
    cpus = set(placement[seat] or ())
    for i, where in enumerate(placement):
        if where is not None and seat_roles[i] == mine:
            cpus.update(where)
    return tuple(sorted(cpus))
