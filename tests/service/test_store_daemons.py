"""Two real fleetd processes as two orchestrators of one host group (SQLite and PostgreSQL).

Done-when of the host-group store: fleetd daemons configured with one store share its
quotas (a ``host``-tier quota of 1 runs one unit at a time across both), and the lease of
a SIGKILLed fleetd is reclaimed by the other once it expires.
"""
from __future__ import annotations

import signal
import subprocess
import uuid

from admission.store import open_store

from ..daemons import BOUND_S, Fleetd, segments, wait_until
from ..quotas import DEFAULT_LIMITS
from ..store_backends import backend, pg_dsn, quota_history_violations, store_url, stores  # noqa: F401

ROLES = {"w": {"kind": "pooled", "handler": "tests.handlers:interval", "slots": 1}}


def store_section(url: str, orchestrator: str, ttl: float) -> dict:
    return {"store": {"url": url, "orchestrator": orchestrator, "lease_ttl": ttl, "poll_every": 0.05,
                      "roles": {"w": {"environment": "prod", "tier": "host"}}}}


def daemon(url: str, tag: str, ttl: float) -> Fleetd:
    name = f"sd{tag}{uuid.uuid4().hex[:6]}"
    return Fleetd(name, ROLES, extra=store_section(url, f"fleetd-{tag}", ttl))


def intervals(path: str) -> list[tuple[float, float, int]]:
    with open(path) as f:
        return sorted((float(a), float(b), int(pid)) for a, b, pid in (line.split() for line in f))


def stop(*daemons: Fleetd) -> None:
    """Stop each daemon (SIGTERM, so it removes its segments), kill what remains, and remove
    the segments a SIGKILLed one could not."""
    from fleet.shm import dataplane
    from fleet.shm.table import segment

    for d in daemons:
        try:
            if d.proc is not None and d.proc.poll() is None:
                d.signal(signal.SIGTERM)
                d.wait(30)  # bounded: a failed test may leave a unit that never gets its lease
        except subprocess.TimeoutExpired:
            pass  # cleanup kills it
        finally:
            d.cleanup()
            if segments(d.name):
                segment.unlink(d.name)
                dataplane.unlink(d.name)


def test_two_fleetd_share_a_host_tier_quota_of_one(store_url, tmp_path):
    log = str(tmp_path / "ran.log")
    a, b = daemon(store_url, "a", 10.0), daemon(store_url, "b", 10.0)
    try:
        a.start()
        b.start()
        with a.connect() as ca, b.connect() as cb:
            futures = [c.submit("w", [log, 150]) for _ in range(3) for c in (ca, cb)]
            assert [f.result(BOUND_S) for f in futures] == [150] * 6
        ran = intervals(log)
        assert len(ran) == 6 and len({pid for _, _, pid in ran}) == 2  # both daemons' workers ran units
        # one at a time across both daemons: each unit began after the one before it ended
        assert all(later[0] >= earlier[1] for earlier, later in zip(ran, ran[1:])), ran
        with open_store(store_url, actor="observer") as s:
            admitted = [e for e in s.events() if e.kind == "admitted"]
            assert len(admitted) == 6 and {e.actor for e in admitted} <= {"fleetd-a", "fleetd-b"}
            assert {e.request_id.split("/")[0] for e in admitted} == {"fleetd-a", "fleetd-b"}
            assert quota_history_violations(s, DEFAULT_LIMITS) == []
            wait_until(lambda: s.active() == [], "every lease to be given back")
    finally:
        stop(a, b)


def test_a_sigkilled_fleetds_lease_is_reclaimed_by_the_other_after_expiry(store_url, tmp_path):
    log = str(tmp_path / "ran.log")
    dead, live = daemon(store_url, "dead", 2.0), daemon(store_url, "live", 2.0)
    try:
        dead.start()
        live.start()
        with open_store(store_url, actor="observer") as s:
            with dead.connect() as cd:
                cd.submit("w", [log, 60_000])  # holds the host tier for a minute unless killed
                wait_until(lambda: any(e.kind == "admitted" for e in s.events()), "the dead fleetd's admission")
                held = next(e.request_id for e in s.events() if e.kind == "admitted")
                with live.connect() as cl:
                    waiting = cl.submit("w", [log, 10])
                    wait_until(lambda: any(e.kind == "queued" and e.request_id.startswith("fleetd-live/")
                                           for e in s.events()), "the live fleetd's request to queue")
                    dead.signal(signal.SIGKILL)
                    dead.wait()
                    assert waiting.result(BOUND_S) == 10
            rec = s.get(held)
            assert (rec.state, rec.reason) == ("timed-out", "lease expired")
            kinds = [(e.kind, e.request_id.split("/")[0]) for e in s.events() if e.kind in ("admitted", "timed-out")]
            assert kinds == [("admitted", "fleetd-dead"), ("timed-out", "fleetd-dead"), ("admitted", "fleetd-live")]
            assert quota_history_violations(s, DEFAULT_LIMITS) == []
        assert len(intervals(log)) == 1  # only the live fleetd's unit finished; the killed one never did
    finally:
        stop(dead, live)
