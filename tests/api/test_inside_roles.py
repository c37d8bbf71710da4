"""Submit from inside (issue 47, items 1 and 2) on the role face: a handler fans out and
joins, embedded and under a real fleetd; every slot holding a waiting parent still
completes; a tree three deep; a keyed bin keeps its key, process and warm state across
its wait.

Real fleets (zygote, workers, rings); every wait is bounded by a timeout.
"""
from __future__ import annotations

import pytest

from tests.daemons import Fleetd
from tests.fleets import config, running

WAIT_S = 120


def role(handler: str, **fields) -> dict:
    spec = {"kind": "pooled", "handler": f"tests.inside_handlers:{handler}", "slots": 2,
            "queue_bound": 10_000}
    spec.update(fields)
    return spec


def roles(**extra) -> dict:
    return {"bin": role("keyed_walk", kind="pinned", slots=2), "walk": role("walk"), "walk_map": role("walk_map"),
            "sim": role("square"), "tree": role("tree"), "boom": role("boom"), "child_fails": role("child_fails"),
            **extra}


def balanced(ledger: dict) -> bool:
    return ledger["inflight"] == 0 and ledger["submitted"] == ledger["solved"] + ledger["failed"] + ledger["suppressed"]


def test_a_handler_fans_out_and_joins(fleet_name):
    with running(config(fleet_name, roles())) as f:
        assert f.submit("walk", 25).result(WAIT_S) == sum(i * i for i in range(25))
        assert f.submit("walk_map", (12, 5)).result(WAIT_S) == [i * i for i in range(12)]
        ledger = f.ledger()
        assert ledger["submitted"] == 2 + 25 + 3  # the parents, 25 children, 3 chunks of a map
        assert ledger["items"]["submitted"] == 2 + 25 + 12
        assert balanced(ledger)


def test_children_are_counted_in_status_and_metrics(fleet_name):
    # Where operators look: status (its JSON and the human text) and the metrics count the
    # units submitted from inside running units, as the ledger counts them in `submitted`.
    from fleet.cli.cmd_status import render_ledger
    from tests.service.test_metrics import scrape, value

    cfg = config(fleet_name, roles())
    cfg["metrics"] = {"enabled": True, "port": 0}
    with running(cfg) as f:
        assert f.status()["ledger"]["children"] == 0
        assert f.submit("walk", 7).result(WAIT_S) == sum(i * i for i in range(7))
        assert f.submit("sim", 3).result(WAIT_S) == 9  # from outside: not a child
        ledger = f.status()["ledger"]
        assert (ledger["children"], ledger["submitted"]) == (7, 9)
        assert "(children) 7" in "\n".join(render_ledger(ledger))
        samples = scrape(f._sup._rig.publisher.metrics.url)
        assert value(samples, "fleet_units_children_total") == 7
        assert value(samples, "fleet_units_submitted_total") == 9


def test_every_slot_holding_a_waiting_parent_with_children_queued_completes(fleet_name):
    # The walk role's two slots both hold a walk waiting on its sims, and the sims queue
    # past the sim role's slots: they ride their parents' slots.
    from tests.service.test_metrics import scrape, value

    cfg = config(fleet_name, roles(walk=role("walk", slots=2), sim=role("square", slots=1)))
    cfg["metrics"] = {"enabled": True, "port": 0}
    with running(cfg) as f:
        futures = [f.submit("walk", 10) for _ in range(6)]
        assert [x.result(WAIT_S) for x in futures] == [285] * 6
        rides = f._sup.inspect(lambda sup: sum(sup.dispatcher.rides))
        assert rides > 0  # some children rode a parent's slot: none was free
        assert balanced(f.ledger())
        # the metrics count them where operators look (published with the last outcome)
        samples = scrape(f._sup._rig.publisher.metrics.url)
        assert value(samples, "fleet_child_rides_total", role="sim") == rides
        # and status's census, slot by slot ("rides": children run on the slot's waiting parent)
        assert sum(r["rides"] for r in f.status()["census"]) == rides


def test_a_tree_three_deep_of_one_role_completes_with_every_slot_waiting(fleet_name):
    # 1 + 3 + 9 parents of one role with two slots: the slots hold waiting parents all along
    with running(config(fleet_name, roles(tree=role("tree", slots=2)))) as f:
        assert f.submit("tree", (3, 3)).result(WAIT_S) == 27
        ledger = f.ledger()
        assert ledger["submitted"] == 1 + 3 + 9 + 27 and balanced(ledger)


def test_a_keyed_bin_keeps_its_key_process_and_warm_state_across_its_wait(fleet_name):
    with running(config(fleet_name, roles())) as f:
        first = [f.submit("bin", 5, key=k) for k in ("a", "b")]
        second = [f.submit("bin", 5, key=k) for k in ("a", "b")]
        a1, b1 = (x.result(WAIT_S) for x in first)
        a2, b2 = (x.result(WAIT_S) for x in second)
        for one, two in ((a1, a2), (b1, b2)):
            assert one[0] == one[1] == two[0] == two[1]  # one process before, across and after the wait
            assert one[2] == two[2] == 30
            assert two[3][-2:] == one[3][-1:] + two[3][-1:]  # its warm state: the key's earlier unit is there
        pins = f._sup.inspect(lambda sup: sup.dispatcher.pinned_keys(sup.roles.code("bin")))
        assert set(pins) == {"a", "b"}


def test_a_handler_fans_out_and_joins_under_fleetd(fleet_name):
    with Fleetd(fleet_name, roles()) as d, d.connect() as client:
        assert client.submit("walk", 15).result(WAIT_S) == sum(i * i for i in range(15))
        assert client.submit("tree", (2, 3)).result(WAIT_S) == 9
        assert client.submit("walk_map", (7, 3)).result(WAIT_S) == [i * i for i in range(7)]
        # a child's own exception reaches its parent as itself, relayed pickled by fleetd
        assert client.submit("child_fails", 3).result(WAIT_S) == ("ValueError", "boom 3", "_RemoteTraceback")


def test_a_childs_own_exception_reaches_its_parent_as_itself(fleet_name):
    with running(config(fleet_name, roles())) as f:
        assert f.submit("child_fails", 4).result(WAIT_S) == ("ValueError", "boom 4", "_RemoteTraceback")
        walk = f.submit("walk", 40)
        f.shutdown(wait=True)  # it closes while the walk submits: its sims are still taken
        assert walk.result(0) == sum(i * i for i in range(40))


def test_a_childs_payload_is_held_to_the_fleets_payload_limit(fleet_name):
    cfg = config(fleet_name, roles(length=role("length"), send_bytes=role("send_bytes")),
                 limits={"max_payload_bytes": 2 << 20})
    with running(cfg) as f:
        assert f.submit("send_bytes", 1 << 20).result(WAIT_S) == 1 << 20  # beside the ring, under the limit
        assert f.submit("send_bytes", 3 << 20).result(WAIT_S) == "PayloadTooLarge"
        ledger = f.ledger()
        assert ledger["submitted"] == 3 and balanced(ledger)  # the refused child never became a unit
