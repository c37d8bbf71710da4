"""The host group's quotas hold when the store stalls and when an orchestrator dies.

Real processes on both backends: an embedded fleet whose unit ticks into a file while
it runs, a store that stops answering (another session holds the group lock; on
PostgreSQL also a statement that sleeps in the path), and a SIGKILLed fleet with
requests still queued. Expectations come from the store's own records (lease expiry,
audit rows) and the unit's ticks, never from the rules' code.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from admission.store import Policy, Request, StoreTimeout, StoreUnreachable, open_store

from ..store_backends import GroupLockHeld, Stores, backend, pg_dsn, pg_stores, store_url, stores  # noqa: F401
from ..runtime.test_store_fleet import BOUND_S, _fleet, _unlink_segments, wait_for


class SleepInThePath:
    """A trigger that sleeps in every update of a request (PostgreSQL): renewals and
    reconciliations run past their deadline."""

    def __init__(self, url: str):
        self.url = url

    def _exec(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as c:
            c.execute(sql)

    def __enter__(self):
        self._exec("CREATE FUNCTION stall_updates() RETURNS trigger LANGUAGE plpgsql AS "
                   "$$ BEGIN PERFORM pg_sleep(5); RETURN NEW; END $$; "
                   "CREATE TRIGGER stall_updates BEFORE UPDATE ON requests FOR EACH ROW "
                   "EXECUTE FUNCTION stall_updates()")
        return self

    def __exit__(self, *exc):
        self._exec("DROP TRIGGER stall_updates ON requests; DROP FUNCTION stall_updates()")


STALLS = [("sqlite", GroupLockHeld), ("postgresql", GroupLockHeld), ("postgresql", SleepInThePath)]


def _ticks(path) -> list[float]:
    try:
        with open(path) as f:
            return [float(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


class Peer(threading.Thread):
    """Another orchestrator asking for the same host-tier capacity, retrying through the stall."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.admitted, self.stop = url, None, threading.Event()

    def run(self):
        req = Request("peer-1", "peer", "prod", "x", "host", lease_ttl=30.0)
        s = None
        try:
            while not self.stop.is_set() and self.admitted is None:
                try:
                    s = s or open_store(self.url, actor="peer", call_timeout=0.2)
                    rec = s.submit(req)
                    if rec.state == "admitted":
                        self.admitted = rec
                except StoreUnreachable:
                    pass
                time.sleep(0.02)
        finally:
            if s is not None:
                s.close()


@pytest.mark.parametrize("kind,stall", STALLS, ids=[f"{k}-{s.__name__}" for k, s in STALLS])
def test_a_stalled_store_stops_the_unit_before_its_lease_ends_and_lets_no_peer_in(kind, stall, fleet_name, tmp_path,
                                                                                   request):
    import fleet

    stores = Stores(kind, tmp_path, request)
    request.addfinalizer(stores.cleanup)
    url = stores.new_url()
    ticks = tmp_path / "ticks"
    config = {
        "fleet": {"name": fleet_name},
        "roles": {"w": {"kind": "pooled", "handler": "tests.handlers:ticker", "slots": 1}},
        "store": {"url": url, "orchestrator": "orch-a", "lease_ttl": 2.0, "renew_every": 0.5, "poll_every": 0.05,
                  "roles": {"w": {"environment": "prod", "tier": "host"}}},
    }
    peer = Peer(url)
    with fleet.Fleet.from_config(config, env={}) as f:
        fut = f.submit("w", [str(ticks), 60_000])
        wait_for(lambda: len(_ticks(ticks)) > 5)
        with stall(url):
            peer.start()
            with pytest.raises(fleet.UnitFailed) as err:
                fut.result(timeout=BOUND_S)
            stopped = _ticks(ticks)[-1]
            time.sleep(1.0)  # the store stays stalled a while after the stop
        peer.join(BOUND_S)
        peer.stop.set()
        assert peer.admitted is not None
    assert err.value.outcome.reason == "LeaseExpired"
    last = _ticks(ticks)[-1]
    assert last == stopped  # the worker was gone: nothing ran after the stop
    with open_store(url, actor="observer") as s:
        (held,) = [e.request_id for e in s.events() if e.kind == "queued" and e.request_id.startswith("orch-a/")]
        rec = s.get(held)
        admitted_at = [e.at for e in s.events("peer-1") if e.kind == "admitted"]
    # the outcome records the request and the lease revision the unit ran under
    assert f"request {held} lease revision {rec.revision}" in err.value.outcome.detail
    assert last < rec.lease_expires, "the unit ran past its lease"
    assert admitted_at and admitted_at[0] > last, "a peer was admitted while the unit still ran"


class StallingClock:
    """The wall clock, which first stalls `pause` seconds while `stalled` is set, doing
    `meanwhile()` in that time. The store reads its clock inside a locked transaction,
    between the round trip that takes the group lock and reads and the one that writes: a
    stalled read is the client kept off its CPU there (stopped, swapped out, on a busy host)."""

    def __init__(self, pause: float):
        self.pause, self.stalled, self.meanwhile = pause, False, lambda: None

    def __call__(self) -> float:
        if self.stalled:
            until = time.monotonic() + self.pause
            self.meanwhile()
            time.sleep(max(0.0, until - time.monotonic()))
        return time.time()


def test_a_client_stalled_inside_its_transaction_frees_the_group_lock_at_its_deadline(pg_stores):
    """PostgreSQL: a client kept inside a locked transaction past its call's deadline loses
    its session, and the group lock with it, at the deadline: another orchestrator's locked
    call goes through meanwhile (with a bound shorter than the stall). The stalled call
    fails StoreTimeout, as a call past its deadline does (never a raw driver error, which a
    fleet's lease gate takes for a crash), having decided nothing; its next call works."""
    url = pg_stores.new_url()
    clock = StallingClock(2.0)
    with open_store(url, actor="orch-a", clock=clock, call_timeout=0.1) as slow, \
            open_store(url, actor="observer", call_timeout=1.0) as observer:
        rec = slow.submit(Request("r1", "orch-a", "prod", "x", "host", lease_ttl=30.0))
        assert rec.state == "admitted", rec
        seen = []
        clock.meanwhile = lambda: seen.append(observer.get("r1"))  # a locked call, bound 1 s
        clock.stalled = True
        with pytest.raises(StoreTimeout, match="kept .* inside its transaction") as err:
            slow.renew("r1", rec.revision)
        clock.stalled = False
        assert seen == [rec], seen  # the lock was free within the stall
        assert "nothing was decided" in str(err.value)
        assert observer.get("r1") == rec  # nothing renewed
        lease = slow.renew("r1", rec.revision)
        assert lease.revision == rec.revision + 1 and observer.get("r1").revision == lease.revision


def test_a_session_ended_for_idling_in_a_transaction_is_store_timeout_and_the_next_call_works(pg_stores):
    """PostgreSQL: whatever left the handle's session idle in a transaction past its
    deadline, the server ends it (FATAL 25P03, which psycopg raises as an InternalError, not
    an OperationalError); the handle's next call fails StoreTimeout, never the raw error,
    and the one after runs on a new connection."""
    url = pg_stores.new_url()
    with open_store(url, actor="orch-a", call_timeout=0.1) as s:
        rec = s.submit(Request("r1", "orch-a", "prod", "x", "host", lease_ttl=30.0))
        s._connection().execute("BEGIN")  # left open: the state a stalled call leaves
        time.sleep(0.5)
        r2 = Request("r2", "orch-a", "prod", "x", "host", lease_ttl=30.0)
        with pytest.raises(StoreTimeout, match="idle-in-transaction"):
            s.submit(r2)  # one statement, not a pipeline: libpq reads the server's FATAL
        assert s.submit(r2).state == "queued" and s.get("r1") == rec  # the host tier: one lease, r1 holds it


def test_a_sigkilled_orchestrators_queued_requests_block_nobody_past_its_heartbeat(store_url, reaper):
    with open_store(store_url, actor="blocker") as blocker, open_store(store_url, actor="live") as live:
        blocker.set_policy(Policy.build())  # host tier: one lease in the whole group
        hold = blocker.submit(Request("hold", "blocker", "prod", "x", "host", lease_ttl=300.0))
        dead = _fleet(store_url, "fleet-dead", 4, 60_000, 2.0)
        reaper.append(dead)

        def queued_of_dead():
            return [r for r in blocker.active() if r.request.orchestrator == "fleet-dead" and r.state == "queued"]

        wait_for(lambda: len(queued_of_dead()) == 4)
        os.kill(dead.pid, signal.SIGKILL)
        dead.wait(30)
        _unlink_segments(f"stfleet-dead-{dead.pid}")
        (beat,) = [o for o in blocker.orchestrators() if o.id == "fleet-dead"]
        mine = live.submit(Request("mine", "live", "prod", "x", "host", lease_ttl=30.0))
        blocker.release("hold", hold.revision)
        wait_for(lambda: live.get("mine").state == "admitted")
        dead_ids = [e.request_id for e in blocker.events() if e.kind == "queued"
                    and e.request_id.startswith("fleet-dead/")]
        recs = [blocker.get(rid) for rid in dead_ids]
    assert mine.state == "queued"
    admitted_to_dead = [r for r in recs if r.revision > 0]
    # at most the one at the head got the capacity, and only until the dead one's beat lapsed
    assert len(admitted_to_dead) <= 1
    assert all(r.lease_expires <= beat.lapses_at for r in admitted_to_dead)
    cancelled = [r for r in recs if r.revision == 0]
    assert len(cancelled) >= 3 and all(r.state == "cancelled" and "fleet-dead" in r.reason for r in cancelled)
