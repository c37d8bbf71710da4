"""The embedded Fleet end to end: real zygote, real workers, real shared memory."""
from __future__ import annotations

import gc
import os
import signal
import time
from concurrent.futures import CancelledError
from concurrent.futures.process import _RemoteTraceback

import pytest

import fleet
from fleet import (
    BadUnit,
    FleetClosed,
    PayloadTooLarge,
    PayloadUnpicklable,
    QueueFull,
    RoleStopped,
    UnitFailed,
    UnitSuppressed,
    UnknownRoleError,
)
from tests.fleets import config, hold, role, running, worker_pids


def test_submit_and_map_return_handler_results(fleet_name):
    with running(config(fleet_name, {"work": role("square")})) as f:
        assert f.submit("work", 7).result(30) == 49
        assert list(f.map("work", range(50))) == [i * i for i in range(50)]
        assert list(f.map("work", range(50), chunksize=7)) == [i * i for i in range(50)]
        ledger = f.ledger()
        # 1 + 50 units, and ceil(50 / 7) = 8 chunk units
        assert (ledger["submitted"], ledger["solved"], ledger["failed"], ledger["inflight"]) == (59, 59, 0, 0)


def test_a_handlers_exception_is_raised_as_itself_with_the_workers_traceback(fleet_name):
    with running(config(fleet_name, {"work": role("fail")})) as f:
        with pytest.raises(ValueError) as info:
            f.submit("work", "x").result(30)
        assert info.value.args == ("bad payload 'x'",)
        cause = info.value.__cause__
        assert type(cause) is _RemoteTraceback  # the stdlib's remote-traceback convention
        assert "ValueError: bad payload 'x'" in cause.tb and "tests/handlers.py" in cause.tb
        assert f.ledger()["failed_by_reason"] == {"HandlerError": 1}  # the ledger keeps fleet's reason


def test_an_exception_that_cannot_be_pickled_still_fails_with_its_text(fleet_name):
    with running(config(fleet_name, {"work": role("raise_unpicklable")})) as f:
        with pytest.raises(UnitFailed) as info:
            f.submit("work").result(30)
        assert info.value.reason == "HandlerError" and info.value.original is None
        assert "carries a lock" in info.value.outcome.detail


def test_suppress_ends_the_unit_suppressed(fleet_name):
    with running(config(fleet_name, {"work": role("suppress")})) as f:
        with pytest.raises(UnitSuppressed) as info:
            f.submit("work", 5).result(30)
        assert info.value.outcome.kind == "suppressed" and "nothing to do for 5" in info.value.outcome.detail
        assert f.ledger()["suppressed"] == 1


def test_unpicklable_result_fails_with_result_error(fleet_name):
    with running(config(fleet_name, {"work": role("unpicklable")})) as f:
        with pytest.raises(UnitFailed) as info:
            f.submit("work").result(30)
        assert info.value.reason == "ResultError" and "cannot be pickled" in info.value.outcome.detail
        assert f.submit("work").exception(30).reason == "ResultError"  # and the worker lives on


def test_timeout_kills_and_replaces_the_worker(fleet_name):
    with running(config(fleet_name, {"work": role("hang"), "echo": role("echo")})) as f:
        before = worker_pids(f)
        with pytest.raises(UnitFailed) as info:
            f.submit("work", 600, timeout=0.3).result(60)
        assert info.value.reason == "Timeout"
        assert f.submit("echo", "still here").result(60) == "still here"
        assert worker_pids(f) and worker_pids(f).isdisjoint(before)


def test_role_timeout_applies_without_a_unit_timeout(fleet_name):
    with running(config(fleet_name, {"work": role("hang", timeout_s=0.3)})) as f:
        assert f.submit("work", 600).exception(60).reason == "Timeout"


def test_worker_exit_fails_its_unit_with_lane_death_and_is_replaced(fleet_name):
    with running(config(fleet_name, {"die": role("die"), "echo": role("echo")})) as f:
        error = f.submit("die").exception(60)
        assert isinstance(error, UnitFailed) and error.reason == "LaneDeath"
        assert "exit code 3" in error.outcome.detail
        assert f.submit("echo", 1).result(60) == 1


def test_payload_limits_and_bad_arguments_are_refused_at_submit(fleet_name):
    idle = role("echo", peak_cpus=0)
    del idle["handler"]  # declared, not active
    cfg = config(fleet_name, {"work": role("echo"), "pin": role("keyed", kind="pinned"), "idle": idle},
                 limits={"max_payload_bytes": 1024})
    with running(cfg) as f:
        # A submit with no argument but the payload takes the short path (Submitter.submit_plain):
        # the role's own refusals are the same there.
        with pytest.raises(BadUnit, match="'idle' has no handler"):
            f.submit("idle", 1)
        with pytest.raises(PayloadTooLarge, match="1024"):
            f.submit("work", b"x" * 2000)
        with pytest.raises(PayloadUnpicklable):
            f.submit("work", lambda: None)
        with pytest.raises(UnknownRoleError, match="'nope'"):
            f.submit("nope")
        with pytest.raises(BadUnit, match="takes no key"):
            f.submit("work", 1, key="k")
        with pytest.raises(BadUnit, match="needs key"):
            f.submit("pin", 1)
        with pytest.raises(BadUnit, match="timeout"):
            f.submit("work", 1, timeout=-1)
        with pytest.raises(BadUnit, match="priority"):
            f.submit("work", 1, priority="high")
        assert f.ledger()["submitted"] == 0  # nothing was queued


def test_a_full_queue_refuses_loudly_when_told_not_to_wait(fleet_name):
    # lookahead 0: the queue's three units all wait in it (none is sent ahead to the seat)
    with running(config(fleet_name, {"work": role("hang", slots=1, queue_bound=3, lookahead=0)})) as f:
        futures = [f.submit("work", 600)]
        deadline = time.monotonic() + 30
        while f._sup.inspect(lambda s: s.dispatcher.queued(0)) and time.monotonic() < deadline:  # the first is granted
            time.sleep(0.01)
        futures += [f.submit("work", 600) for _ in range(3)]
        with pytest.raises(QueueFull, match="3 units waiting"):
            f.submit("work", 600, block=False)
        f.shutdown(wait=False, cancel_futures=True)
        from fleet.shm.table import layout as L

        assert f._sup.table.snapshot().flags & L.FLAG_CLOSING  # status can say "closing"
        for fut in futures[1:]:
            with pytest.raises(CancelledError):
                fut.result(30)
        f._sup.kill()
        assert futures[0].exception(30).reason == "Shutdown"


def test_units_of_one_key_stay_on_one_pin_and_keep_warm_state(fleet_name):
    cfg = config(fleet_name, {"solver": role("keyed", kind="pinned", slots=3, peak_cpus=2)}, profile="pinned")
    with running(cfg) as f:
        results = [f.submit("solver", None, key=f"bin{i % 3}").result(60) for i in range(30)]
        by_key = {}
        for key, count, pid in results:
            by_key.setdefault(key, []).append((count, pid))
        for key, seen in by_key.items():
            assert [c for c, _ in seen] == list(range(1, 11)), key  # warm state survived every cycle
            assert len({pid for _, pid in seen}) == 1, key  # on one process
        pins = f._sup.inspect(lambda s: s.dispatcher.pinned_keys(0))
        assert set(pins) == {"bin0", "bin1", "bin2"} and len(set(pins.values())) == 3
        snap = f._sup.table.snapshot()
        assert {snap.slot(s)["state"] for s in pins.values()} == {"Pinned"}


def test_a_new_key_rekeys_the_least_recently_used_idle_pin(fleet_name):
    cfg = config(fleet_name, {"solver": role("keyed", kind="pinned", slots=2, elastic_repin=True)})
    with running(cfg) as f:
        f.submit("solver", key="a").result(60)
        f.submit("solver", key="b").result(60)
        f.submit("solver", key="a").result(60)
        assert f.submit("solver", key="c").result(60)[1] == 1
        assert set(f._sup.inspect(lambda s: s.dispatcher.pinned_keys(0))) == {"a", "c"}  # b was least recently used
        deadline = time.monotonic() + 30  # the loop publishes role counters every sample tick
        while f.status()["queues"][0]["repins"] != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f.status()["queues"][0]["repins"] == 1


def test_shutdown_cancel_futures_cancels_what_is_queued(fleet_name):
    with running(config(fleet_name, {"work": role("hang", slots=1, lookahead=1)})) as f:
        first = f.submit("work", 0.5)
        ahead, *queued = [f.submit("work", 0.01) for _ in range(5)]
        f.shutdown(wait=True, cancel_futures=True)
        assert first.result(0) == "woke"
        # The seat's next unit was sent ahead to wait on its ring (lookahead): like the
        # call queue of ProcessPoolExecutor, it is running already, and runs.
        assert ahead.result(0) == "woke"
        assert all(q.cancelled() for q in queued)
        ledger = f.ledger()
        assert ledger["failed_by_reason"] == {"Cancelled": 4} and ledger["solved"] == 2
        with pytest.raises(FleetClosed):
            f.submit("work", 1)


def test_shutdown_without_cancel_runs_everything_queued(fleet_name):
    with running(config(fleet_name, {"work": role("square", slots=1)})) as f:
        futures = [f.submit("work", i) for i in range(200)]
        f.shutdown(wait=True)
        assert [x.result(0) for x in futures] == [i * i for i in range(200)]


def test_a_cancelled_future_is_not_run(fleet_name):
    # lookahead 0: the victim waits in the queue (one sent ahead is running, as in
    # ProcessPoolExecutor's call queue, and no longer cancellable)
    with running(config(fleet_name, {"work": role("hang", slots=1, lookahead=0), "echo": role("echo")})) as f:
        blocker = f.submit("work", 0.5)
        victim = f.submit("work", 0.01)
        assert victim.cancel()
        assert blocker.result(30) == "woke"
        assert f.submit("echo", 1).result(30) == 1
        f.shutdown()
        assert f.ledger()["failed_by_reason"] == {"Cancelled": 1}


def test_restart_intensity_stops_the_role_and_cordons(fleet_name):
    cfg = config(fleet_name, {"die": role("die", slots=1), "echo": role("echo")}, profile="pinned",
                 restart={"max_restarts": 2, "within_seconds": 60})
    with running(cfg) as f:
        for _ in range(3):
            assert f.submit("die").exception(60).reason == "LaneDeath"
        deadline = time.monotonic() + 30
        while 0 not in f._sup.inspect(lambda s: set(s.role_stops.view)) and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(RoleStopped):
            f.submit("die")
        posture = f._sup.table.snapshot().posture_view()
        assert (posture["state"], posture["cause"]) == ("Cordoned", "lane-death")
        assert f.submit("echo", "other roles serve").result(60) == "other roles serve"


def test_parity_serial_and_pinned_give_identical_outcomes(fleet_name):
    def corpus(profile):
        cfg = config(f"{fleet_name}-{profile}", {"work": role("sometimes", slots=8, peak_cpus=2)}, profile=profile)
        with running(cfg) as f:
            assert f.plan.binding == profile
            futures = [f.submit("work", i) for i in range(300)]
            out = []
            for fut in futures:
                exc = fut.exception(60)
                if exc is None:
                    out.append(("solved", fut.result()))
                elif isinstance(exc, fleet.UnitError):
                    out.append((exc.outcome.kind, exc.outcome.reason))
                else:  # the handler's own exception, raised as itself
                    out.append((type(exc).__name__, exc.args))
            return out, f.ledger()

    serial, serial_ledger = corpus("serial")
    pinned, pinned_ledger = corpus("pinned")
    assert serial == pinned
    assert serial_ledger == pinned_ledger
    assert serial_ledger["suppressed"] == 100 and serial_ledger["failed_by_reason"] == {"HandlerError": 100}


def test_status_and_table_show_the_plan_and_slots(fleet_name):
    with running(config(fleet_name, {"work": role("square", slots=2)})) as f:
        f.submit("work", 2).result(30)
        status = f.status()
        assert status["plan"]["fleet_booted"] is True
        assert status["plan"]["binding"] == f.plan.binding
        pids = {row["pid"] for row in status["census"]}
        assert pids == worker_pids(f)


def test_two_fleets_of_one_name_cannot_run(fleet_name):
    from fleet.shm.table import TableInUse

    with running(config(fleet_name, {"work": role("echo")})):
        with pytest.raises(TableInUse, match=str(os.getpid())):
            fleet.Fleet.from_config(config(fleet_name, {"work": role("echo")}), env={})


def test_a_handler_that_cannot_be_imported_is_a_config_error(fleet_name):
    with pytest.raises(fleet.ConfigError, match="roles.work.handler"):
        fleet.Fleet.from_config(config(fleet_name, {"work": role("nope")}), env={})
    assert not [p for p in os.listdir("/dev/shm") if p.startswith(f"fleet.{fleet_name}")]


def test_map_with_chunks_raises_at_the_item_that_did_not_solve(fleet_name):
    with running(config(fleet_name, {"work": role("sometimes")})) as f:
        it = f.map("work", [0, 3, 6, 1, 9], chunksize=2)
        assert [next(it), next(it), next(it)] == [0, 6, 12]
        with pytest.raises(UnitSuppressed):
            next(it)
        it = f.map("work", [0, 2], chunksize=2)
        assert next(it) == 0
        with pytest.raises(RuntimeError, match="two: 2") as info:
            next(it)
        assert "RuntimeError: two: 2" in info.value.__cause__.tb
        ledger = f.ledger()
        # chunk units: [0,3] solved, [6,1] suppressed, [9] solved, [0,2] failed
        assert (ledger["solved"], ledger["suppressed"], ledger["failed"]) == (2, 1, 1)


def test_a_chunk_runs_every_item_past_one_that_did_not_solve(fleet_name):
    with running(config(fleet_name, {"work": role("sometimes")})) as f:
        # one chunk: solved, suppressed, failed, solved, failed, solved (in that order)
        fut = f._sup.submit("work", [0, 1, 2, 3, 5, 6], chunk=True)
        values, failures, seconds = fut.result(30)  # and how long its items ran in the worker
        assert values == [0, None, None, 6, None, 12] and seconds >= 0
        assert sorted(failures) == [1, 2, 4]
        assert failures[1] == (fleet.shm.messages.ST_SUPPRESSED, "one")
        assert failures[2][0] == failures[4][0] == fleet.shm.messages.ST_HANDLER_ERROR
        assert "RuntimeError: two: 2" in failures[2][1][0] and "RuntimeError: two: 5" in failures[4][1][0]
        # and map hands out the items around them, raising where it reaches each
        it = f.map("work", [0, 1, 3, 2, 6], chunksize=5)
        assert next(it) == 0
        with pytest.raises(UnitSuppressed):
            next(it)


def test_an_item_of_a_chunk_knows_its_unit_and_may_report_a_cost(fleet_name):
    # fleet.current_unit() and fleet.report_cost() raise outside a handler: an item of a
    # chunk is inside one, as a single unit is
    with running(config(fleet_name, {"work": role("knows_itself")})) as f:
        assert list(f.map("work", range(10), chunksize=4)) == list(range(10))
        assert sorted(f.map_unordered("work", range(10), chunksize=3)) == list(range(10))
        assert f.submit("work", 7).result(30) == 7


@pytest.mark.parametrize("freeze", [True, False])
def test_boot_freezes_what_it_loaded_out_of_the_collectors_sight_unless_told_not_to(fleet_name, freeze):
    cfg = config(fleet_name, {"work": role("square")})
    cfg["fleet"]["gc_freeze"] = freeze
    before = gc.get_freeze_count()
    with running(cfg) as f:
        assert f.submit("work", 3).result(30) == 9
        frozen = gc.get_freeze_count()
    if freeze:
        assert frozen > before  # boot's own objects (its table, its loop) joined the frozen ones
    else:
        # the embedding process's collector is left as it was (frozen objects may die meanwhile)
        assert frozen <= before


def test_a_unit_is_an_immutable_named_record(fleet_name):
    unit = fleet.Unit(7, "work", payload={"a": 1}, key=None, lane="batch")
    assert (unit.id, unit.role, unit.payload, unit.lane, unit.request_id) == (7, "work", {"a": 1}, "batch", None)
    with pytest.raises(AttributeError):
        unit.payload = 2


def test_cordon_holds_new_deferrable_work_and_lets_in_flight_work_finish(fleet_name):
    cfg = config(fleet_name, {"bg": role("hang", cordon_class="deferrable", slots=2), "echo": role("echo")})
    with running(cfg) as f:
        sup = f._sup
        running_unit = f.submit("bg", 1.0)
        deadline = time.monotonic() + 30
        while sup.table.snapshot().slot(0)["state"] != "Running" and time.monotonic() < deadline:
            time.sleep(0.005)
        hold(f)
        snap = sup.table.snapshot()
        assert snap.posture_view()["state"] == "Cordoned"
        assert snap.slot(0)["state"] == "Draining"  # T7: finishes, takes nothing new
        held = f.submit("bg", 0.01)
        assert f.submit("echo", "never-class roles still run").result(30) == "never-class roles still run"
        assert running_unit.result(30) == "woke"  # in-flight work always completes
        deadline = time.monotonic() + 30
        while sup.table.snapshot().posture_view()["suppressed"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # published with the next posture sample
        assert sup.table.snapshot().posture_view()["suppressed"] == 1
        assert not held.done()  # deferrable intake waits while cordoned
        f.posture_release("operator")
        assert held.result(30) == "woke"
        assert sup.table.snapshot().posture_view()["state"] == "Nominal"


def test_a_fleet_outlives_the_thread_that_booted_it(fleet_name):
    import threading

    box = {}
    booter = threading.Thread(target=lambda: box.setdefault("f", fleet.Fleet.from_config(
        config(fleet_name, {"work": role("whoami")}), env={})))
    booter.start()
    booter.join()
    f = box["f"]
    try:
        first = f.submit("work", 1).result(30)[1]
        time.sleep(0.3)  # a worker killed with its booting thread would be gone by now
        assert f.submit("work", 2).result(30)[1] == first
        assert f.ledger()["failed"] == 0
    finally:
        f.shutdown()


def test_the_fleet_survives_the_death_of_its_fork_server(fleet_name):
    cfg = config(fleet_name, {"work": role("hang", slots=2), "echo": role("whoami")}, profile="pinned")
    with running(cfg) as f:
        stuck = f.submit("work", 600)
        old_pid = f.submit("echo", 0).result(30)[1]
        deadline = time.monotonic() + 30
        while f._sup.table.snapshot().slot(0)["state"] != "Running" and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(f._sup.seats.workers.zygote.pid, signal.SIGKILL)
        error = stuck.exception(60)
        assert isinstance(error, UnitFailed) and error.reason == "LaneDeath"
        value, pid = f.submit("echo", "again").result(60)
        assert value == "again" and pid != old_pid
        ledger = f.ledger()
        assert ledger["inflight"] == 0 and ledger["failed_by_reason"] == {"LaneDeath": 1}
