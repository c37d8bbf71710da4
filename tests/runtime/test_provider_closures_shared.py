"""Provider closures shared by the fleets of a host group through its store (both backends).

Two real fleets, one store: the first 403 either meets closes the key for both, so the
other never spends a round on it; an operator's reopen reaches the store too. Each
fleet's admission clock is a ManualClock at the same instant (closures are wall time).
"""
from __future__ import annotations

import time

import pytest

from admission.pool import ManualClock
from admission.store import closure_store
from admission.store.closures import SyncedClosures

from ..admission_catalog import GLM_AZ, GLM_OR, MIDNIGHT_AFTER, ONE_REFUSAL, T_1447, catalog
from ..fleets import config, running, unique_name
from ..store_backends import backend, pg_dsn, store_url, stores  # noqa: F401
from ..runtime.test_provider_admission import DAILY, _refusal, _roles


def _fleet(name, url):
    cfg = config(name, _roles())
    cfg["admission"] = catalog(**ONE_REFUSAL)
    cfg["store"] = {"url": url, "orchestrator": f"test/{name}"}
    return running(cfg, admission_clock=ManualClock(wall=T_1447, mono=1000.0))


def _closures(f):
    return [(c["provider"], c["credential"], c["until"]) for c in f.status()["admission"]["closures"]]


def _eventually(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the fleet never learned it"
        time.sleep(0.05)


def test_a_key_one_fleet_found_spent_is_closed_for_the_other_and_a_reopen_reaches_the_store(store_url):
    with _fleet(unique_name("shclA"), store_url) as a, _fleet(unique_name("shclB"), store_url) as b:
        assert _closures(b) == []
        _refusal(a.submit("llm", {"openrouter-eu": DAILY}, route=GLM_OR))
        spent = ("openrouter-eu", None, MIDNIGHT_AFTER)
        assert _closures(a) == [spent]
        _eventually(lambda: _closures(b) == [spent])
        assert b.status()["admission"]["closure_store"] == "host-group store"
        # b never met the 403 itself: its unit moves off the key before it runs
        assert b.submit("llm", {"openrouter-eu": DAILY}, route=GLM_OR).result(60) == str(GLM_AZ)
        assert b.ledger()["failed"] == 0

        a.admission_reopen(str(GLM_OR.provider))
        with closure_store(store_url, "test/reader", clock=lambda: T_1447) as store:
            _eventually(lambda: store.load() == [])


def test_closures_posted_while_the_store_is_away_are_written_once_it_answers(tmp_path):
    from admission import state as T

    url = f"sqlite:///{tmp_path}/group.db"
    attempts = []

    def opener():
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            from admission.store import StoreUnreachable

            raise StoreUnreachable("the database is away")
        return closure_store(url, "test/sync", clock=lambda: T_1447)

    synced = SyncedClosures(opener, every_s=0.05, boot_wait_s=0.01)
    try:
        with pytest.raises(Exception, match="no reading from the store"):
            synced.load()  # the pool then starts without, and learns later
        closure = T.Closure("prov", "key-1", T_1447 + 600, "credit", False, T_1447, "no credit")
        synced.save([closure])  # posted: returns at once, written when the store answers
        _eventually(lambda: synced.fresh() == [closure], timeout=10)
        assert len(attempts) >= 3 and synced.error is None
    finally:
        synced.close()
    with closure_store(url, "test/reader", clock=lambda: T_1447) as store:
        assert [(c.provider, c.credential, c.until) for c in store.load()] == [("prov", "key-1", T_1447 + 600)]


def test_learning_a_reading_never_shortens_a_known_closure_and_ignores_ended_ones():
    from admission import state as T
    from admission.pool import AdmissionPool

    pool = AdmissionPool(clock=ManualClock(wall=T_1447, mono=0.0))
    long = T.Closure("prov", None, T_1447 + 3600, "credit", False, T_1447, "")
    assert pool.learn([long]) == 1 and pool.learn([long]) == 0  # nothing new the second time
    shorter = long._replace(until=T_1447 + 60)
    ended = T.Closure("other", None, T_1447 - 1, "credit", False, T_1447 - 100, "")
    assert pool.learn([shorter, ended]) == 0
    assert [(c.provider, c.until) for c in pool.state.closures.values()] == [("prov", T_1447 + 3600)]
    later = long._replace(until=T_1447 + 7200)
    assert pool.learn([later]) == 1
    assert [c.until for c in pool.state.closures.values()] == [T_1447 + 7200]


def test_one_closure_the_store_refuses_keeps_no_other_from_the_group_and_the_refusal_stays_shown(tmp_path):
    import math

    from admission import state as T

    url = f"sqlite:///{tmp_path}/group.db"
    synced = SyncedClosures(lambda: closure_store(url, "test/sync", clock=lambda: T_1447), every_s=0.05)
    try:
        synced.load()
        endless = T.Closure("prov", "key-0", math.inf, "operator", False, T_1447, "no end")
        spent = T.Closure("prov", "key-1", T_1447 + 600, "credit", False, T_1447, "no credit")
        synced.save([endless, spent])
        _eventually(lambda: [c.credential for c in synced.fresh() or []] == ["key-1"], timeout=10)
        time.sleep(0.3)  # several good readings later, the refused save is still what status shows
        assert synced.error is not None and "prov/key-0" in synced.error and "key-1" not in synced.error
        synced.save([spent])  # a save that goes through clears it
        _eventually(lambda: synced.error is None, timeout=10)
    finally:
        synced.close()
