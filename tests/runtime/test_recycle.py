"""A role's `max_rss_mib` (and fleet.Executor's keyword): a worker whose RSS is above it
after a unit reports the unit, then exits to be replaced; no unit fails, no death counts.

Real fleets, a real leak: `tests.handlers.leak` keeps LEAK_MIB more per call in a
module-level list, and returns (pid, resident MiB). The bound is the resident size of a
fresh worker on this host (measured once, `fresh_mib`) plus a few leaks, so a worker
recycles every few units whatever the host's baseline.
"""
from __future__ import annotations

import logging

import pytest

import fleet
from fleet.rules import posture as posture_mod
from tests.daemons import wait_until
from tests.fleets import config, role, running, worker_pids
from tests.handlers import LEAK_MIB
from tests.service.test_metrics import scrape, value

WAIT_S = 120.0
UNITS = 40
#: leaks a worker takes before it passes the bound (a recycle every ~this many units)
LEAKS_PER_LIFE = 4


def _one_seat(name: str, metrics: bool = False, **fields) -> dict:
    # One slot, no look-ahead across seats: one seat, every unit on it, in turn; restart
    # intensity 0 deaths: a recycle counted as a death would stop the role at once.
    cfg = config(name, {"leaky": role("leak", slots=1, **fields)}, restart={"max_restarts": 0, "within_seconds": 60})
    cfg["fleet"]["cpus"] = 2
    if metrics:
        cfg["metrics"] = {"enabled": True, "port": 0}
    return cfg


@pytest.fixture(scope="module")
def fresh_mib(tmp_path_factory) -> float:
    """Resident MiB of a fresh worker after one leak, on this host."""
    from fleet.shm.table import segment
    from tests.fleets import unique_name

    name = unique_name("t")
    try:
        with running(_one_seat(name)) as f:
            _pid, mib = f.submit("leaky").result(WAIT_S)
    finally:
        segment.unlink(name)
    return mib


def _causes(f) -> set:
    return set(f._sup.call(lambda: f._sup.posture.causes, view=True))


def test_a_leaking_worker_is_recycled_between_units_and_no_unit_fails(fleet_name, fresh_mib, caplog):
    """Mutations that turn it red: the worker's check removed (pid never changes); the
    supervisor's planned set without EXIT_RECYCLED (a LaneDeath cordon; the role stops at
    once with max_restarts 0, units fail); the RECYCLING note not kept (recycles counted
    under "?"); the publisher's `recycled` not called (no fleet_worker_recycles_total, and status counts 0)."""
    bound = int(fresh_mib) + LEAKS_PER_LIFE * LEAK_MIB
    caplog.set_level(logging.INFO, logger="fleet.runtime.seat_deaths")
    with running(_one_seat(fleet_name, metrics=True, max_rss_mib=bound)) as f:
        first = worker_pids(f)
        results = [f.submit("leaky").result(WAIT_S) for _ in range(UNITS)]
        pids = [pid for pid, _ in results]
        ledger = f.ledger()
        assert (ledger["submitted"], ledger["solved"], ledger["failed"]) == (UNITS, UNITS, 0)
        changes = sum(a != b for a, b in zip(pids, pids[1:]))
        assert changes >= 2, pids  # recycled again and again
        assert pids[0] in first
        # a worker changes only after a unit that left it over the bound
        for (pid, mib), nxt in zip(results, pids[1:]):
            if nxt != pid:
                assert mib > bound, (mib, bound)
        # Every unit that left its worker over the bound recycles it; the last one's recycle
        # shows in no later pid, and may land after its result: waited for, never raced.
        over = sum(mib > bound for _pid, mib in results)
        assert changes == over - (results[-1][1] > bound)
        wait_until(lambda: f._sup.recycles() == {"leaky": over}, f"{over} recycles counted")
        memory = f.status()["memory"]
        assert (memory["worker_recycles"], memory["oom_kills"]) == (over, 0)  # status counts them too
        assert posture_mod.LANE_DEATH not in _causes(f)
        lines = [r.getMessage() for r in caplog.records if "recycled" in r.getMessage()]
        assert len(lines) == over
        assert f"max_rss_mib {bound} MiB" in lines[0] and "RSS " in lines[0]
        samples = scrape(f._sup._rig.publisher.metrics.url)
        assert value(samples, "fleet_worker_recycles_total", role="leaky") == over


def test_units_sent_ahead_to_a_recycled_worker_run_on_its_successor(fleet_name, fresh_mib):
    """Submitted at once, so units wait sent ahead behind the one that recycles its worker:
    each still solves exactly once, on the successor (mutations that turn it red: the
    worker's check removed; the planned set without EXIT_RECYCLED; the RECYCLING note
    not kept)."""
    bound = int(fresh_mib) + LEAKS_PER_LIFE * LEAK_MIB
    with running(_one_seat(fleet_name, max_rss_mib=bound, lookahead=8)) as f:
        futures = [f.submit("leaky") for _ in range(UNITS)]
        results = [fut.result(WAIT_S) for fut in futures]
        pids = [pid for pid, _ in results]
        ledger = f.ledger()
        assert (ledger["submitted"], ledger["solved"], ledger["failed"]) == (UNITS, UNITS, 0)
        changes = sum(a != b for a, b in zip(pids, pids[1:]))
        assert changes >= 1
        # as above: the last unit's recycle shows in no later pid, and may come after it
        over = sum(mib > bound for _pid, mib in results)
        assert changes == over - (results[-1][1] > bound)
        wait_until(lambda: f._sup.recycles() == {"leaky": over}, f"{over} recycles counted")
        assert posture_mod.LANE_DEATH not in _causes(f)


def test_without_max_rss_mib_the_worker_is_never_recycled(fleet_name):
    """Mutation that turns it red: the worker's check made unconditional (a default bound)."""
    with running(_one_seat(fleet_name)) as f:
        pids = {f.submit("leaky").result(WAIT_S)[0] for _ in range(UNITS)}
        assert len(pids) == 1
        assert f._sup.recycles() == {}


def test_the_executor_keyword_recycles_the_same_way(fresh_mib):
    from tests import executor_calls as C

    bound = int(fresh_mib) + LEAKS_PER_LIFE * LEAK_MIB
    with fleet.Executor(max_workers=1, max_rss_mib=bound) as ex:
        results = [ex.submit(C.leak).result(WAIT_S) for _ in range(UNITS)]
        pids = [pid for pid, _ in results]
        assert len(set(pids)) > 1
        assert ex.fleet.ledger()["failed"] == 0
        # as above: every call over the bound recycles its worker, the last one's maybe after it
        over = sum(mib > bound for _pid, mib in results)
        assert sum(a != b for a, b in zip(pids, pids[1:])) == over - (results[-1][1] > bound)
        wait_until(lambda: sum(ex._sup.recycles().values()) == over, f"{over} recycles counted")
        assert list(ex.map(C.square, range(10))) == [i * i for i in range(10)]


def test_the_executor_without_it_keeps_its_worker():
    from tests import executor_calls as C

    with fleet.Executor(max_workers=1) as ex:
        assert len({ex.submit(C.leak).result(WAIT_S)[0] for _ in range(UNITS)}) == 1


@pytest.mark.parametrize("value, error", [(0, ValueError), (1 << 21, ValueError), (1.5, TypeError), (True, TypeError)])
def test_a_bad_executor_bound_is_a_typed_error_and_starts_nothing(value, error):
    from tests.fleets import descendants

    before = descendants()
    with pytest.raises(error, match="max_rss_mib"):
        fleet.Executor(max_workers=1, max_rss_mib=value)
    assert descendants() == before


@pytest.mark.parametrize("fields, what", [({"max_rss_mib": 0}, "must be an integer in"),
                                          ({"max_rss_mib": "big"}, "must be an integer in"),
                                          ({"max_rss_mib": 64, "io_bound": True}, "I/O-bound")])
def test_a_bad_role_bound_is_a_config_error_naming_the_key(fields, what):
    from fleet.rules.errors import ConfigError
    from fleet.runtime.config import load_config

    with pytest.raises(ConfigError, match=what) as err:
        load_config({"roles": {"leaky": role("leak", **fields)}}, env={})
    assert "roles.leaky.max_rss_mib" in str(err.value)
