"""Contention (fleet.rules.contention) on a real fleet: two real busy processes pinned to
the CPU one seat's worker is pinned to, while the fleet runs CPU units. The seat is read
as contended and its worker (every thread) widened to its role's CPUs; once the busy
processes and the load are gone it goes back to its pin. With ``contention = "pin"`` it
is shown contended and never moved. Judged by the workers' affinity and the status
census, never by a time; every wait bounded.

And the watch itself (fleet.runtime.contention) against a fake host: what it reads,
what it moves, what it publishes, and how a new worker or an epoch resets it."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from types import SimpleNamespace

from fleet.rules import contention as rule
from fleet.rules.seats import Seat
from fleet.runtime.contention import ContentionWatch
from tests import require
from tests.require import NOISE_ALONE
from tests.daemons import BOUND_S, wait_until
from tests.fleets import running

UNIT_US = 2_000  # 2 ms CPU units: each seat's worker busy while the load runs
IN_FLIGHT = 8

#: A busy loop pinned to one CPU that dies with its parent (PR_SET_PDEATHSIG), so a test
#: that fails leaves none behind.
BUSY = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
if os.getppid() != {parent}:
    sys.exit(0)
os.sched_setaffinity(0, {{{cpu}}})
while True:
    pass
"""


@contextlib.contextmanager
def busy_on(cpu: int, n: int = 2):
    """`n` unrelated busy processes pinned to `cpu`; killed and reaped on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY.format(parent=os.getpid(), cpu=cpu)],
                              stdin=subprocess.DEVNULL) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(BOUND_S)


@contextlib.contextmanager
def load(f):
    """Submits CPU units, IN_FLIGHT at a time, until the block ends (then waits for them)."""
    stop, futures = threading.Event(), []

    def run():
        gate = threading.Semaphore(IN_FLIGHT)
        while not stop.is_set():
            if gate.acquire(timeout=0.1):
                fut = f.submit("work", UNIT_US)
                fut.add_done_callback(lambda _f: gate.release())
                futures.append(fut)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield futures
    finally:
        stop.set()
        thread.join(BOUND_S)
        assert all(fut.result(BOUND_S) is None for fut in futures)  # every unit its one outcome


def two_seats(name: str, mode: str) -> dict:
    """A role on two seats, one per CPU, the loop ahead by priority (fleet.Executor's layout)."""
    return {"fleet": {"name": name, "profile": "auto", "contention": mode}, "budget": {"loop": "priority"},
            "roles": {"work": {"kind": "pooled", "handler": "tests.handlers:spin", "slots": 2, "queue_bound": 10_000}}}


def affinity(pid: int) -> set[tuple[int, ...]]:
    """The affinity of every thread of `pid` (one entry when they all agree)."""
    return {tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir(f"/proc/{pid}/task")}


def seat_rows(f, seat: int) -> list[dict]:
    return [r for r in f.status()["census"] if r["seat"] == seat]


def _cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _the_busy_seat(f):
    """(seat, its pid, its CPU) of the seat on the last CPU this process may use."""
    if len(_cpus()) < 2:
        require.lacking("two CPUs needed: one taken by the busy processes, one free")
    seats = f.layout.seats
    assert [s.cpus for s in seats] == [(c,) for c in _cpus()][: len(seats)] and len(seats) >= 2
    cpu = seats[-1].cpus[0]
    return seats[-1].index, f._sup.seats.workers.pids[seats[-1].index], cpu


@NOISE_ALONE
def test_a_worker_whose_cpu_a_busy_process_takes_runs_on_its_roles_cpus_then_goes_back(fleet_name):
    with running(two_seats(fleet_name, "widen")) as f:
        seat, pid, cpu = _the_busy_seat(f)
        share = tuple(sorted(c for s in f.layout.seats for c in s.cpus))
        # On its own CPU first: a worker pins itself just after its fork, which the boot does
        # not wait for (nor for a host busy at boot, where the watch may widen it at once).
        wait_until(lambda: affinity(pid) == {(cpu,)}, f"seat {seat}'s worker on CPU {cpu}", BOUND_S)
        with busy_on(cpu), load(f):
            wait_until(lambda: affinity(pid) == {share}, f"seat {seat}'s worker widened to CPUs {share}", BOUND_S)
            # status says so: the seat's slots contended, on the CPUs the worker runs on now
            wait_until(lambda: all(r["contended"] and tuple(r["cpus"]) == share for r in seat_rows(f, seat))
                       or affinity(pid) != {share}, "the census showing it", BOUND_S)
        assert f._sup.contention.widened >= 1
        # the busy processes and the load gone: calm, and back on its own CPU
        wait_until(lambda: affinity(pid) == {(cpu,)} and not any(r["contended"] for r in seat_rows(f, seat)),
                   f"seat {seat}'s worker back on CPU {cpu}", BOUND_S)
        rows = seat_rows(f, seat)
        assert all(r["contentions"] >= 1 and r["cpus"] == [cpu] for r in rows), rows
        assert not any(f._sup.table.contended(r["slot"]) for r in rows)  # its worker spins again
        assert f._sup.contention.repinned >= 1
        assert f._sup.seats.workers.pids[seat] == pid  # the same worker: moved, never replaced


@NOISE_ALONE
def test_with_contention_pin_a_contended_worker_is_shown_and_stays_on_its_cpu(fleet_name):
    with running(two_seats(fleet_name, "pin")) as f:
        seat, pid, cpu = _the_busy_seat(f)
        with busy_on(cpu), load(f):
            wait_until(lambda: all(r["contended"] for r in seat_rows(f, seat)), f"seat {seat} contended", BOUND_S)
            assert affinity(pid) == {(cpu,)}
            # what the seat's worker reads before it spins for its next task (it does not, now)
            assert all(f._sup.table.contended(r["slot"]) for r in seat_rows(f, seat))
            assert all(r["cpus"] == [cpu] for r in seat_rows(f, seat))
        assert f._sup.contention.widened == 0


# ------------------------------------------------------------------ the watch, on a fake host

P = rule.ContentionPolicy(calm_windows=2, hold_max=4)


class FakeHost:
    def __init__(self):
        self.stats: dict[int, tuple[int, int]] = {}
        self.looks: dict[int, tuple[int, int]] = {}  # seat -> its tasks ring's look counts (ns run, ns waited)
        self.pins: list[tuple[int, tuple[int, ...]]] = []
        self.refuse = False

    def schedstat(self, pid):
        return self.stats.get(pid)

    def pin_process(self, pid, cpus):
        if self.refuse:
            raise PermissionError("refused")
        self.pins.append((pid, tuple(cpus)))
        return True


class FakeTable:
    def __init__(self):
        self.cpus: dict[int, tuple] = {}
        self.contention: dict[int, tuple] = {}

    def set_slot_meta(self, slot, *, cpus):
        self.cpus[slot] = tuple(cpus)

    def set_contention(self, slot, contended, episodes):
        self.contention[slot] = (contended, episodes)


def fake_watch(widen=True, roles=("work", "work", "other")):
    seats = tuple(Seat(i, f"s{i}", (r,), (i,), "pinned") for i, r in enumerate(roles))
    layout = SimpleNamespace(seats=seats)
    follow = SimpleNamespace(placement=SimpleNamespace(cpus=[(i,) for i in range(len(roles))]))
    workers = SimpleNamespace(pids={i: 100 + i for i in range(len(roles))},
                              cpus_of=lambda seat: follow.placement.cpus[seat])
    host, table = FakeHost(), FakeTable()
    watch = ContentionWatch("t", layout, follow, workers, table, lambda seat: (2 * seat, 2 * seat + 1), host,
                            lambda seat: host.looks.get(seat, (0, 0)), policy=P, widen=widen)
    return watch, host, table, follow, workers


def window(watch, host, now, waits):
    """One sample `now` (s): each pid ran 100 ms more and waited `waits[pid]` ms more."""
    for pid, wait_ms in waits.items():
        run, wait = host.stats.get(pid, (0, 0))
        host.stats[pid] = (run + 100_000_000, wait + wait_ms * 1_000_000)
    watch.sample(now)


def test_the_watch_widens_a_contended_seat_over_its_roles_seats_and_re_pins_it_after_the_hold():
    watch, host, table, _follow, _workers = fake_watch()
    window(watch, host, 0.0, {100: 0, 101: 0, 102: 0})  # the first reading: nothing to compare yet
    window(watch, host, 0.25, {100: 0, 101: 100, 102: 100})  # seat 1 and seat 2 wait half their demand
    # seat 1 widens over the role's two seats; seat 2 is its role's only one: shown, not moved
    assert host.pins == [(101, (0, 1))]
    assert table.cpus == {2: (0, 1), 3: (0, 1)}
    assert table.contention == {2: (True, 1), 3: (True, 1), 4: (True, 1), 5: (True, 1)}
    window(watch, host, 0.5, {100: 0, 101: 0, 102: 0})
    assert len(host.pins) == 1  # one calm window of the hold's two
    window(watch, host, 0.75, {100: 0, 101: 0, 102: 0})
    assert host.pins[1:] == [(101, (1,))] and table.cpus[2] == (1,)
    assert table.contention[2] == (False, 1) and table.contention[4] == (False, 1)
    assert (watch.widened, watch.repinned) == (1, 1)


def test_a_seat_whose_worker_waited_only_in_its_looks_for_a_task_stays_calm():
    watch, host, table, _follow, _workers = fake_watch()
    window(watch, host, 0.0, {100: 0, 101: 0})
    # both waited 100 ms of their 200 ms demand; seat 0's waits were its looks (beside the
    # fleet's own looking threads), seat 1's were its units'
    host.looks[0] = (50_000_000, 100_000_000)
    window(watch, host, 0.25, {100: 100, 101: 100})
    assert not watch.states[0].contended and watch.states[1].contended
    assert host.pins == [(101, (0, 1))]
    # the counts are read as deltas: the next window's looks are its own
    host.looks[0] = (60_000_000, 110_000_000)
    window(watch, host, 0.5, {100: 100, 101: 0})
    assert watch.states[0].contended  # 90 of its units' 180 ms of demand waited


def test_with_widen_off_the_watch_reads_and_shows_but_never_moves():
    watch, host, table, _follow, _workers = fake_watch(widen=False)
    window(watch, host, 0.0, {100: 0, 101: 0, 102: 0})
    window(watch, host, 0.25, {100: 0, 101: 100, 102: 0})
    assert host.pins == [] and table.cpus == {} and table.contention[2] == (True, 1)


def test_a_new_worker_starts_calm_on_its_seats_cpus():
    watch, host, table, _follow, workers = fake_watch()
    window(watch, host, 0.0, {100: 0, 101: 0})
    window(watch, host, 0.25, {100: 0, 101: 100})
    assert watch.states[1].contended
    workers.pids[1] = 201  # the worker died and was replaced: forked on its seat's CPUs
    window(watch, host, 0.5, {100: 0, 201: 100})
    assert not watch.states[1].contended and table.contention[2] == (False, 1)  # read afresh from here
    assert table.cpus[2] == table.cpus[3] == (1,)  # status shows it on its seat's CPU again
    assert host.pins == [(101, (0, 1))]  # nothing moved: the new worker is where it was forked
    window(watch, host, 0.75, {100: 0, 201: 100})
    assert host.pins[-1] == (201, (0, 1)) and watch.states[1].episodes == 2


def test_an_epoch_that_moves_a_widened_seat_widens_it_again_over_the_new_cpus():
    watch, host, table, follow, _workers = fake_watch()
    window(watch, host, 0.0, {100: 0, 101: 0})
    window(watch, host, 0.25, {100: 0, 101: 100})
    assert host.pins == [(101, (0, 1))]
    follow.placement.cpus = [(0,), (3,), (2,)]  # the epoch re-pinned seat 1's worker to CPU 3
    window(watch, host, 0.5, {100: 0, 101: 100})
    assert host.pins[-1] == (101, (0, 3)) and table.cpus[2] == (0, 3)


def test_a_retired_seat_is_forgotten_and_a_refused_move_is_logged_not_raised(caplog):
    watch, host, table, follow, _workers = fake_watch()
    window(watch, host, 0.0, {100: 0, 101: 0})
    window(watch, host, 0.25, {100: 0, 101: 100})
    follow.placement.cpus = [(0,), None, (2,)]  # seat 1 retired
    window(watch, host, 0.5, {100: 0, 101: 100})
    assert not watch.states[1].contended and table.contention[2] == (False, 1)
    host.refuse = True
    window(watch, host, 0.75, {100: 100, 102: 0})  # seat 0 contended, but its sibling is retired
    assert watch.states[0].contended and len(host.pins) == 1  # nowhere to widen to: nothing tried
    follow.placement.cpus = [(0,), (1,), (2,)]
    window(watch, host, 1.0, {100: 100, 101: 0, 102: 0})
    assert "cannot move seat s0's worker" in caplog.text and watch.widened == 1
    window(watch, host, 1.25, {100: 100, 101: 0, 102: 0})
    assert caplog.text.count("cannot move seat s0's worker") == 1  # once, until a move succeeds
    host.refuse = False
    window(watch, host, 1.5, {100: 100, 101: 0, 102: 0})
    assert host.pins[-1] == (100, (0, 1)) and watch.widened == 2

