"""I/O-bound roles: a role marked ``io_bound = true`` runs up to its slot count of units at
once on one seat (``async def`` handlers on an asyncio loop, plain ones on a thread pool),
while every slot still walks the FSM and every unit gets exactly one outcome.

Real fleets (zygote, workers, shared memory). Overlap is asserted structurally — the most
units a worker saw running at once, and start/end stamps that do or do not overlap —
never as wall-clock bounds; every "eventually" has a generous deadline.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time

import psutil
import pytest

import fleet
from fleet import UnitError, UnitFailed, UnitSuppressed
from fleet.worker.io.runner import IoRunner
from tests.fleets import config, running, worker_pids
from tests.wakeups import switches_by_thread, woken

WAIT_S = 120.0  # generous: a unit that never gets its outcome fails the test, a slow box does not
ASYNC, PLAIN = "async", "plain"


def io_role(handler: str, *, slots: int = 8, module: str = "tests.io_handlers", **fields) -> dict:
    spec = {"kind": "pooled", "handler": f"{module}:{handler}", "slots": slots, "peak_cpus": 0, "io_bound": True,
            "queue_bound": 100_000}
    spec.update(fields)
    return spec


def cpu_role(handler: str, *, module: str = "tests.handlers", **fields) -> dict:
    spec = {"kind": "pooled", "handler": f"{module}:{handler}", "slots": 2, "peak_cpus": 1, "queue_bound": 100_000}
    spec.update(fields)
    return spec


@contextlib.contextmanager
def owing_fleet(cfg: dict):
    """`running`, for tests whose failure may be a unit that never gets its outcome: then
    the fleet could never balance its ledger and stop, so a failing body forgets what it
    owes (the fuse it trips is recorded, not fatal) and the test fails instead of hanging."""
    fuses = []
    with running(cfg, on_fuse=fuses.append) as f:
        try:
            yield f
        except BaseException:
            f._sup.inspect(lambda sup: sup.books._units.clear())  # the loop stops once nothing is owed
            raise
    assert not fuses, fuses


def role_slots(f, role: str) -> list[int]:
    return list(f.layout.slots_of(role))


def slot_rows(f, role: str) -> list[dict]:
    snap = f._sup.table.snapshot()
    return [snap.slot(i) for i in role_slots(f, role)]


def eventually(predicate, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def outcome(fut) -> tuple:
    exc = fut.exception(WAIT_S)
    if exc is None:
        return ("solved", fut.result())
    if not isinstance(exc, UnitError):  # the handler's own exception, raised as itself
        return ("raised", type(exc).__name__, exc.args)
    return (exc.outcome.kind, exc.outcome.reason)


def max_overlap(intervals) -> int:
    """The most intervals open at one instant."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    best = now = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


# --- overlap --------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["serial", "pinned"])
@pytest.mark.parametrize("kind", [ASYNC, PLAIN])
def test_units_of_an_io_role_run_up_to_its_slots_at_once_and_each_walks_the_fsm(fleet_name, kind, profile):
    handler = "together_async" if kind == ASYNC else "together"
    # A CPU-bound role on the same fleet keeps its one-after-another path (on serial-0, the same seat).
    cfg = config(fleet_name, {"io": io_role(handler, slots=8), "cpu": cpu_role("square")}, profile=profile)
    with running(cfg) as f:
        assert f.plan.binding == profile
        gens = [row["generation"] for row in slot_rows(f, "io")]
        payload = {"want": 8, "patience": 10.0, "hold": 0.2}
        futures = [f.submit("io", payload) for _ in range(16)]
        squares = [f.submit("cpu", i) for i in range(10)]
        results = [fut.result(WAIT_S) for fut in futures]
        assert [fut.result(WAIT_S) for fut in squares] == [i * i for i in range(10)]
        peaks = [peak for peak, _pid, _s, _e in results]
        assert max(peaks) == 8  # as many at once as the role has slots, and never more
        assert len({pid for _peak, pid, _s, _e in results}) == 1  # one seat's worker ran them all
        assert max_overlap([(s, e) for _p, _pid, s, e in results]) == 8
        ledger = f.ledger()
        assert (ledger["submitted"], ledger["solved"], ledger["failed"], ledger["inflight"]) == (26, 26, 0, 0)
        # Each unit walked its own slot: LEASE (T1), START (T2), RELEASE (T5); all Idle at the end.
        eventually(lambda: all(row["state"] == "Idle" for row in slot_rows(f, "io")), "the io slots to go Idle")
        rows = slot_rows(f, "io")
        assert sum(row["done"] for row in rows) == 16
        assert sum(row["generation"] for row in rows) - sum(gens) == 3 * 16


def test_on_a_serial_seat_a_long_cpu_unit_does_not_stop_the_io_units_waits(fleet_name):
    """The seat's loop owns its slots; a unit of a role that is not I/O-bound runs on the
    seat's serial lane, so I/O units keep waking and ending while it burns its CPU."""
    cfg = config(fleet_name, {"io": io_role("sleep_async", slots=8), "cpu": cpu_role("spin", slots=1)},
                 profile="serial")
    with running(cfg) as f:
        assert f.plan.binding == "serial" and len(f.layout.seats) == 1
        f.submit("io", 0.0).result(WAIT_S)  # the seat's loop is up
        burn = f.submit("cpu", 3_000_000)  # ~3 s of CPU
        def cpu_running():
            snap = f._sup.table.snapshot()
            return any(snap.slot(i)["state"] == "Running" and snap.slot(i)["role"] == "cpu"
                       for i in range(snap.n_slots))

        eventually(cpu_running, "the cpu unit to run")  # on whichever Idle slot of the seat it leased
        t0 = time.monotonic()
        for _ in range(5):  # five rounds of eight 50 ms waits, while the cpu unit burns
            assert [x.result(WAIT_S) for x in [f.submit("io", 0.05) for _ in range(8)]] == [0.05] * 8
        took = time.monotonic() - t0
        assert not burn.done(), f"the io rounds took {took:.2f} s: they waited for the cpu unit"
        assert burn.result(WAIT_S) is None


@pytest.mark.parametrize("kind", [ASYNC, PLAIN])
def test_an_io_role_takes_a_hundred_slots_and_runs_them_all_at_once(fleet_name, kind):
    handler = "together_async" if kind == ASYNC else "together"
    with running(config(fleet_name, {"io": io_role(handler, slots=100)})) as f:
        assert {f.layout.seat_of(s) for s in role_slots(f, "io")} == {f.layout.seats[0].index}
        if f.plan.binding == "pinned":  # I/O-dominant: 100 threads on the fractional remainder of the quota
            io_share = next(s for s in f.plan.budget.consumers if s.name == "io")
            assert (io_share.kind, io_share.threads, io_share.cores < 1) == ("io", 100, True)
        payload = {"want": 100, "patience": 20.0, "hold": 0.2}
        results = [fut.result(WAIT_S) for fut in [f.submit("io", payload) for _ in range(100)]]
        assert max(peak for peak, *_ in results) == 100


@pytest.mark.parametrize("kind", [ASYNC, PLAIN])
def test_a_keyed_io_role_runs_each_keys_units_in_order_on_its_pin(fleet_name, kind):
    handler = "keyed_async" if kind == ASYNC else "keyed_plain"
    with running(config(fleet_name, {"io": io_role(handler, kind="pinned", slots=4)})) as f:
        futures = [f.submit("io", i, key=k) for i in range(6) for k in "abcd"]
        results = [fut.result(WAIT_S) for fut in futures]
        for k in "abcd":
            mine = [(payload, start, end) for key, payload, start, end in results if key == k]
            assert [p for p, _s, _e in mine] == list(range(6))
            assert all(mine[i][2] <= mine[i + 1][1] for i in range(5)), f"units of key {k} overlapped"
        assert f.ledger()["failed"] == 0  # no RESUME refused: a pin never ran two units at once
        eventually(lambda: all(row["state"] == "Pinned" for row in slot_rows(f, "io")), "the pins to settle")
        assert sorted(row["done"] for row in slot_rows(f, "io")) == [6, 6, 6, 6]


# --- deaths and timeouts ---------------------------------------------------------------------
@pytest.mark.parametrize("kind", [ASYNC, PLAIN])
def test_200_units_in_flight_on_a_killed_io_worker_each_get_one_outcome(fleet_name, kind):
    handler = "sleep_async" if kind == ASYNC else "sleep_plain"
    with owing_fleet(config(fleet_name, {"io": io_role(handler, slots=200)})) as f:
        (pid,) = worker_pids(f)
        futures = [f.submit("io", None) for _ in range(200)]  # each waits an hour
        eventually(lambda: sum(row["state"] == "Running" for row in slot_rows(f, "io")) == 200,
                   "200 units running at once")
        os.kill(pid, signal.SIGKILL)
        errors = [fut.exception(WAIT_S) for fut in futures]
        assert all(isinstance(e, UnitFailed) and e.reason == "LaneDeath" for e in errors)
        assert all("signal 9" in e.outcome.detail for e in errors)
        ledger = f.ledger()
        assert (ledger["submitted"], ledger["failed"], ledger["inflight"]) == (200, 200, 0)
        assert ledger["failed_by_reason"] == {"LaneDeath": 200}
        eventually(lambda: worker_pids(f) and pid not in worker_pids(f), "the seat to be forked again")
        assert [fut.result(WAIT_S) for fut in [f.submit("io", 0.01) for _ in range(20)]] == [0.01] * 20
        eventually(lambda: all(row["state"] == "Idle" for row in slot_rows(f, "io")), "the io slots to go Idle")


@pytest.mark.parametrize("kind", [ASYNC, PLAIN])
def test_a_timeout_fails_its_unit_with_timeout_and_the_others_on_its_seat_with_lane_death(fleet_name, kind):
    handler = "sleep_async" if kind == ASYNC else "sleep_plain"
    with owing_fleet(config(fleet_name, {"io": io_role(handler, slots=8)})) as f:
        before = worker_pids(f)
        others = [f.submit("io", None) for _ in range(5)]
        eventually(lambda: sum(row["state"] == "Running" for row in slot_rows(f, "io")) == 5, "5 units running")
        timed = f.submit("io", None, timeout=0.5)
        error = timed.exception(WAIT_S)
        assert isinstance(error, UnitFailed) and error.reason == "Timeout"
        for fut in others:
            e = fut.exception(WAIT_S)
            assert isinstance(e, UnitFailed) and e.reason == "LaneDeath"
            # Honest about why its worker died: another unit's timeout, not its own.
            assert f"unit {timed.unit_id}" in e.outcome.detail and "timeout" in e.outcome.detail
        assert f.ledger()["failed_by_reason"] == {"Timeout": 1, "LaneDeath": 5}
        assert f.submit("io", 0.01).result(WAIT_S) == 0.01
        assert worker_pids(f).isdisjoint(before)


# --- outcomes: the same as the sequential path -------------------------------------------------
CORPUS = [("fail", "fail_async"), ("suppress", "suppress_async"), ("unpicklable", "unpicklable_async"),
          ("raise_unpicklable", "raise_unpicklable_async"), ("sometimes", "sometimes_async")]


def _summary(fut) -> tuple:
    exc = fut.exception(WAIT_S)
    if exc is None:
        return ("solved", fut.result())
    if not isinstance(exc, UnitError):  # the handler's own exception, raised as itself
        return ("own", type(exc).__name__, exc.args, exc.__cause__.tb.strip().splitlines()[-1])
    last = exc.outcome.detail.strip().splitlines()[-1] if exc.outcome.detail else ""
    kind = type(exc).__name__
    return (kind, exc.outcome.kind, exc.outcome.reason, last, type(exc.original).__name__ if exc.original else None)


def test_handler_errors_suppress_and_unpicklable_results_give_the_sequential_outcomes(fleet_name):
    roles = {}
    for plain_name, async_name in CORPUS:
        # peak 0: the roles' declared peaks add up against the quota, and five cores would not fit
        roles[f"seq_{plain_name}"] = cpu_role(plain_name, slots=1, peak_cpus=0)
        roles[f"pool_{plain_name}"] = io_role(plain_name, module="tests.handlers", slots=2)
        roles[f"loop_{plain_name}"] = io_role(async_name, slots=2)
    with running(config(fleet_name, roles)) as f:
        pids = worker_pids(f)
        for plain_name, _ in CORPUS:
            payloads = range(6) if plain_name == "sometimes" else ["x"]
            seq = [_summary(f.submit(f"seq_{plain_name}", p)) for p in payloads]
            assert seq == [_summary(f.submit(f"pool_{plain_name}", p)) for p in payloads], plain_name
            assert seq == [_summary(f.submit(f"loop_{plain_name}", p)) for p in payloads], plain_name
        assert worker_pids(f) == pids  # no outcome cost a worker


@pytest.mark.parametrize("handler", ["exit_async", "exit_plain"])
def test_system_exit_in_an_io_handler_is_its_units_handler_error(fleet_name, handler):
    with running(config(fleet_name, {"io": io_role(handler, slots=2), "ok": io_role("sleep_async", slots=2)})) as f:
        pids = worker_pids(f)
        error = f.submit("io").exception(WAIT_S)
        assert isinstance(error, SystemExit) and "SystemExit" in error.__cause__.tb  # its own, as itself
        assert f.submit("ok", 0.01).result(WAIT_S) == 0.01
        assert worker_pids(f) == pids


def test_parity_the_same_corpus_on_io_and_cpu_roles_gives_the_same_outcomes(fleet_name):
    roles = {"cpu": cpu_role("sometimes", slots=4), "pool": io_role("sometimes", module="tests.handlers", slots=8),
             "loop": io_role("sometimes_async", slots=8)}
    with running(config(fleet_name, roles)) as f:
        futures = {name: [f.submit(name, i) for i in range(300)] for name in roles}
        outcomes = {name: [outcome(fut) for fut in futs] for name, futs in futures.items()}
        assert outcomes["cpu"] == outcomes["pool"] == outcomes["loop"]
        assert sum(o[0] == "suppressed" for o in outcomes["cpu"]) == 100
        assert sum(o[0] == "raised" for o in outcomes["cpu"]) == 100
        ledger = f.ledger()
        assert (ledger["submitted"], ledger["solved"], ledger["suppressed"], ledger["failed"]) == (900, 300, 300, 300)


@pytest.mark.parametrize("handler", ["sometimes_async", "sometimes"])
def test_chunks_on_an_io_role_run_their_items_in_order_and_raise_at_the_item(fleet_name, handler):
    module = "tests.io_handlers" if handler.endswith("_async") else "tests.handlers"
    with running(config(fleet_name, {"io": io_role(handler, module=module, slots=4)})) as f:
        assert list(f.map("io", [0, 3, 6, 9, 12], chunksize=2)) == [0, 6, 12, 18, 24]
        it = f.map("io", [0, 3, 6, 1, 9], chunksize=2)
        assert [next(it), next(it), next(it)] == [0, 6, 12]
        with pytest.raises(UnitSuppressed):
            next(it)


@pytest.mark.parametrize("handler", ["knows_itself_async", "knows_itself"])
def test_an_item_of_a_chunk_on_an_io_role_knows_its_unit(fleet_name, handler):
    module = "tests.io_handlers" if handler.endswith("_async") else "tests.handlers"
    with running(config(fleet_name, {"io": io_role(handler, module=module, slots=4)})) as f:
        assert list(f.map("io", range(9), chunksize=4)) == list(range(9))


def test_items_of_a_chunk_run_one_after_another(fleet_name):
    with running(config(fleet_name, {"io": io_role("keyed_async", slots=4)})) as f:
        stamps = list(f.map("io", range(12), chunksize=6))
        for chunk in (stamps[:6], stamps[6:]):
            assert all(chunk[i][3] <= chunk[i + 1][2] for i in range(5))


# --- configuration ----------------------------------------------------------------------------
def test_an_async_handler_on_a_role_that_is_not_io_bound_is_a_config_error(fleet_name):
    cfg = config(fleet_name, {"work": cpu_role("sleep_async", module="tests.io_handlers")})
    with pytest.raises(fleet.ConfigError, match=r"roles\.work\.handler.*io_bound"):
        fleet.Fleet.from_config(cfg, env={})
    assert not [p for p in os.listdir("/dev/shm") if p.startswith(f"fleet.{fleet_name}")]


def test_an_idle_io_worker_sleeps(fleet_name):
    with running(config(fleet_name, {"io": io_role("sleep_async", slots=8), "pool": io_role("sleep_plain", slots=8)})) as f:
        # Run units first, so the loop thread and the pool threads exist while it idles.
        for fut in [f.submit(r, 0.01) for r in ("io", "pool") for _ in range(16)]:
            fut.result(WAIT_S)
        pids = worker_pids(f)
        assert sum(psutil.Process(pid).num_threads() for pid in pids) >= len(pids) + 2  # the loop and pool threads
        time.sleep(0.3)
        before = {pid: switches_by_thread(pid) for pid in pids}
        time.sleep(1.0)  # an idle second
        # Of each worker's threads only the ring relay's wakes (it looks for a stop five
        # times a second, by design); the event loop and the pool threads sleep throughout.
        stirred = {pid: woken(pid, before[pid]) for pid in pids}
        assert all(len(tids) == 1 for tids in stirred.values()), stirred
        assert f.submit("io", 0.01).result(WAIT_S) == 0.01  # and it still wakes


# --- the runner and the ring's lossless wait, in one process -------------------------------------
def test_runner_reports_every_unit_on_the_loop_thread_and_keeps_one_unit_per_slot():
    """Coroutines, pool calls and serial calls all end in `on_done` on the loop's own
    thread (the seat's owner), with the slot already free; a slot and the serial lane
    each run one unit at a time."""
    loop = asyncio.new_event_loop()
    done, threads = {}, set()

    def on_done(slot, tag, result):
        threads.add(threading.get_ident())
        done[tag] = (slot, result, runner.busy(slot))

    runner = IoRunner(4, loop, on_done)
    gate = threading.Event()

    async def boom():
        raise KeyError("escaped")

    async def fine():
        await asyncio.sleep(0.01)
        return "fine"

    def until(pred):
        deadline = time.monotonic() + WAIT_S
        while not pred():
            assert time.monotonic() < deadline, "the runner never reported"
            loop.run_until_complete(asyncio.sleep(0.005))

    try:
        runner.call(0, "a", lambda: gate.wait(WAIT_S) and "a done")
        assert runner.busy(0) and runner.in_flight == 1
        with pytest.raises(RuntimeError):
            runner.call(0, "b", lambda: "b done")  # a slot runs one unit at a time: the worker defers
        runner.defer(0, "b")
        runner.defer(0, "c")
        runner.await_(1, "boom", boom)
        runner.await_(3, "fine", fine)
        runner.call(2, "raises", lambda: 1 / 0)
        runner.serial(5, "s1", lambda: "serial")
        assert runner.serial_busy
        with pytest.raises(RuntimeError):
            runner.serial(6, "s2", lambda: None)
        runner.defer_serial("s2")
        assert runner.next_serial() is None  # the lane is busy: its next waits
        until(lambda: {"boom", "fine", "raises", "s1"} <= set(done))
        assert isinstance(done["boom"][1], KeyError) and isinstance(done["raises"][1], ZeroDivisionError)
        assert done["fine"] == (3, "fine", False) and done["s1"] == (5, "serial", False)
        assert not runner.serial_busy and runner.next_serial() == "s2"
        assert runner.busy(0) and "a" not in done
        gate.set()
        until(lambda: "a" in done)
        assert done["a"] == (0, "a done", False) and runner.in_flight == 0
        assert [runner.next_for(0), runner.next_for(0), runner.next_for(0)] == ["b", "c", None]
        assert threads == {threading.get_ident()}  # every unit ended on the loop's thread
    finally:
        loop.close()


def test_a_slots_next_unit_started_as_one_ends_runs_in_that_task_before_the_loops_next_pass():
    loop = asyncio.new_event_loop()
    order, tasks = [], {}

    def make(tag):
        async def unit():
            tasks[tag] = asyncio.current_task()
            order.append(("start", tag))
            await asyncio.sleep(0)
            return tag
        return unit

    def on_done(slot, tag, result):
        order.append(("done", tag))
        if tag == "first":
            runner.await_(slot, "second", make("second"))  # the slot's next, started as the first ends
            loop.call_soon(order.append, ("next pass", None))

    runner = IoRunner(1, loop, on_done)
    try:
        runner.await_(0, "first", make("first"))
        deadline = time.monotonic() + WAIT_S
        while ("done", "second") not in order:
            assert time.monotonic() < deadline
            loop.run_until_complete(asyncio.sleep(0.001))
        assert order.index(("start", "second")) < order.index(("next pass", None))
        assert tasks["first"] is tasks["second"] and not runner.busy(0)
    finally:
        loop.close()


def test_a_ring_relay_fires_for_a_message_or_a_notify_and_never_loses_one(fleet_name):
    """The relay makes the task ring's wake-ups a readable fd for the seat's event loop;
    like `wait_since`, a notify between the look and the arming still fires it."""
    import select

    from fleet.shm.dataplane import DataSegment, RingRelay

    seg = DataSegment.create(fleet_name, 1, 4096, 4096)
    relay = None
    try:
        ring = seg.tasks(0)
        relay = RingRelay(ring)
        relay.arm(ring.seq())
        assert select.select([relay], [], [], 0.05)[0] == []  # armed, nothing came: silent
        ring.push(7, b"x")
        ring.notify()
        assert select.select([relay], [], [], WAIT_S)[0] == [relay]
        relay.clear()
        assert ring.pop() == (7, b"x")
        seen = ring.seq()
        ring.notify()  # e.g. a task pushed between the loop's look and its arming
        relay.arm(seen)
        assert select.select([relay], [], [], WAIT_S)[0] == [relay]
        relay.clear()
        relay.arm(ring.seq())
        assert select.select([relay], [], [], 0.05)[0] == []  # fires once per arming, not twice
    finally:
        if relay is not None:
            relay.close()
        seg.unlink()
        seg.close()


def test_ring_wait_since_returns_for_a_notify_that_came_before_the_sleep(fleet_name):
    from fleet.shm.dataplane import DataSegment

    seg = DataSegment.create(fleet_name, 1, 4096, 4096)
    try:
        ring = seg.tasks(0)
        seen = ring.seq()
        ring.notify()  # e.g. a hand-back between the worker's look and its sleep
        assert ring.wait_since(seen, None) is True  # would sleep forever if the notify were lost
        assert ring.wait_since(ring.seq(), 0.01) is False  # nothing new: it sleeps until the timeout
        seen = ring.seq()
        threading.Timer(0.05, ring.notify).start()  # another thread of the process wakes it
        assert ring.wait_since(seen, WAIT_S) is True
        assert ring.seq() != seen
    finally:
        seg.unlink()
        seg.close()


def test_results_of_many_units_finishing_at_once_arrive_whole_and_once(fleet_name):
    """The result ring has one producer: the worker's main thread pushes every result its
    pool hands back. (Pool threads pushing results themselves race on the ring's head:
    under this load that garbles and loses results.)"""
    with owing_fleet(config(fleet_name, {"io": io_role("echo", module="tests.handlers", slots=64)})) as f:
        payloads = [bytes([i % 251]) * 20_000 for i in range(4000)]
        futures = [f.submit("io", p) for p in payloads]
        assert sum(fut.result(WAIT_S) != p for fut, p in zip(futures, payloads)) == 0
        ledger = f.ledger()
        assert (ledger["submitted"], ledger["solved"], ledger["inflight"]) == (4000, 4000, 0)
