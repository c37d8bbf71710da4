"""`Fleet.why` of units waiting for their host-group lease: the request's place in the store's
queue and the quota that holds it, checked against the store the test filled."""
from __future__ import annotations

import fleet
from admission.store import Request, open_store
from fleet.rules import why as rule

from ..daemons import BOUND_S, wait_until
from ..store_backends import backend, pg_dsn, store_url, stores  # noqa: F401 - fixtures


def _gated_fleet(store_url, fleet_name):
    return fleet.Fleet.from_config({
        "fleet": {"name": fleet_name},
        "roles": {"w": {"kind": "pooled", "handler": "fleet.api.examples:square", "slots": 2}},
        "store": {"url": store_url, "orchestrator": "orch-a", "lease_ttl": 30.0, "poll_every": 0.05,
                  "tiers": {"host": 1},
                  "roles": {"w": {"environment": "prod", "tier": "host"}}},
    }, env={})


def test_a_unit_waiting_for_its_lease_names_its_place_in_the_queue_and_the_quota_that_holds_it(store_url, fleet_name):
    with open_store(store_url, actor="orch-b") as other:
        blocker = other.submit(Request("blocker", "orch-b", "prod", "x", "host", lease_ttl=300))
        assert blocker.state == "admitted"  # orch-b holds the host tier's one lease
        with _gated_fleet(store_url, fleet_name) as f:
            try:
                first, second = f.submit("w", 3), f.submit("w", 4)
                wait_until(lambda: all((f.why(u.unit_id)["gate"] or {}).get("state") == "queued" for u in (first, second)),
                           "both requests to be queued in the store")
                a, b = f.why(first.unit_id), f.why(second.unit_id)
                assert (a["state"], b["state"]) == (rule.LEASE, rule.LEASE)
                queue = sorted((r for r in other.active() if r.state == "queued"), key=lambda r: r.submitted_at)
                assert [r.id for r in queue] == [a["gate"]["request"], b["gate"]["request"]]  # the store's own order
                assert (a["gate"]["position"], a["gate"]["ahead"]) == (1, [])
                assert (b["gate"]["position"], b["gate"]["ahead"]) == (2, [a["gate"]["request"]])
                assert a["gate"]["quotas"] == [{"level": "tier", "key": "host", "limit": 1, "used": 1, "held": 0}]
                # behind the first: its place at the host tier is kept for the first, too
                assert b["gate"]["quotas"] == [{"level": "tier", "key": "host", "limit": 1, "used": 1, "held": 1}]
                assert "number 1 in the host group's queue (0 ahead)" in a["text"]
                assert "held by the tier quota 'host' (1 of 1 in use)" in a["text"]
                assert "1 of 1 in use, 1 kept for requests ahead" in b["text"]
            finally:  # a failed assertion must not leave the units waiting on the store at shutdown
                other.release("blocker", blocker.revision)
            assert (first.result(BOUND_S), second.result(BOUND_S)) == (9, 16)

