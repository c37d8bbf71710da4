"""Every number the store takes is bounded and typed, the same on both backends.

A value outside its range is refused with a typed error naming the field and the range,
changes nothing, and leaves the handle usable; a value at the edge of its range works
end to end (a PostgreSQL ``bigint`` and a SQLite integer take it alike). The ranges are
written out here from their statement, not read from the store.
"""
from __future__ import annotations

from admission.records import replace
import json
import math

import pytest

from admission.store import ADMITTED, BadRequest, Policy, QuotaConfigInvalid, Request, open_store

from ..store_backends import FakeClock, backend, pg_dsn, clock, req, store, store_url, stores  # noqa: F401

MILLION = 1_000_000
INT32 = (-(2**31), 2**31 - 1)
DAY, WEEK = 86_400, 7 * 86_400
NOT_NUMBERS = [True, "1", None, float("nan"), float("inf")]


def _still_usable(store, rid="after"):
    """The handle decides as before: a request is admitted and given back."""
    rec = store.submit(req(rid))
    assert rec.state == ADMITTED
    store.release(rec.id, rec.revision)


# ----------------------------------------------------------------------------- quotas and limits

QUOTA_FIELDS = {
    "global_limit": lambda v: {"global_limit": v},
    "environments.prod": lambda v: {"environments": {"prod": v}},
    "providers.openai": lambda v: {"providers": {"openai": v}},
    "tiers.container": lambda v: {"tiers": {"container": v}},
}


@pytest.mark.parametrize("path", sorted(QUOTA_FIELDS))
@pytest.mark.parametrize("value", [MILLION + 1, 10**30, -1, 1.5] + [v for v in NOT_NUMBERS if v is not None],
                         ids=repr)
def test_a_quota_out_of_range_is_refused_naming_it_and_the_handle_goes_on(store, path, value):
    before, events = store.policy(), store.events()
    with pytest.raises(QuotaConfigInvalid) as err:
        store.set_policy(Policy(**{**before.to_dict(), **QUOTA_FIELDS[path](value)}))
    assert err.value.path == path and "[0, 1000000]" in str(err.value) and err.value.exit_code == 78
    assert store.policy() == before and store.events() == events  # nothing written
    _still_usable(store)


@pytest.mark.parametrize("path", sorted(QUOTA_FIELDS))
def test_a_quota_at_the_top_of_its_range_decides_on_both_backends(store, path):
    store.set_policy(Policy.build(QUOTA_FIELDS[path](MILLION)))
    assert json.loads(json.dumps(store.policy().to_dict())) == Policy.build(QUOTA_FIELDS[path](MILLION)).to_dict()
    _still_usable(store, "a")  # the database function and the locked path both take the figure
    store.submit(req("b", tier="host"))  # host stays at its own default quota of 1
    assert store.submit(req("c", tier="host")).state == "queued"


def test_a_limit_past_every_column_is_refused_and_never_stops_the_handle(store):
    # A global limit of 10**30 fits no bigint: taken, it would make PostgreSQL refuse every
    # submit of the handle with a driver error, even after the policy was set back.
    with pytest.raises(QuotaConfigInvalid, match=r"global_limit: must be a whole number in \[0, 1000000\], "
                                                 r"got 1000000000000000000000000000000"):
        store.set_policy(Policy(global_limit=10**30))
    _still_usable(store, "a")
    store.set_policy(Policy.build(global_limit=3))
    _still_usable(store, "b")


def test_a_stored_policy_out_of_range_is_a_typed_refusal_until_a_valid_one_is_set(store, store_url):
    # a policy written by hand (or by code of another day) that no longer passes the checks
    body = json.dumps(dict(Policy().to_dict(), global_limit=10**30), sort_keys=True)
    _sql(store_url, "INSERT INTO policy (id, body, updated_at, updated_by) VALUES (1, ?, 0, 'hand') "
                    "ON CONFLICT (id) DO UPDATE SET body = excluded.body", (body,))
    with open_store(store_url, actor="orch-a", clock=store.clock) as fresh:
        with pytest.raises(QuotaConfigInvalid) as err:
            fresh.submit(req("a"))
        assert err.value.path == "stored policy.global_limit" and "[0, 1000000]" in str(err.value)
        assert fresh.events() == []  # decided nothing
        fresh.set_policy(Policy.build(global_limit=2))  # an operator sets a valid one: it goes on
        assert fresh.submit(req("a")).state == ADMITTED
        assert [e.kind for e in fresh.events()] == ["policy", "queued", "admitted"]


@pytest.mark.parametrize("value,ok", [(WEEK, True), (0.001, True), (WEEK + 1, False), (0, False), (-1, False),
                                      (float("inf"), False), (float("nan"), False), (True, False), ("60", False)],
                         ids=repr)
def test_the_aging_interval_is_seconds_up_to_a_week(store, value, ok):
    if ok:
        assert store.set_policy(Policy.build(aging_interval=value)).aging_interval == value
        _still_usable(store)
        return
    with pytest.raises(QuotaConfigInvalid) as err:
        store.set_policy(Policy.build(aging_interval=value))
    assert err.value.path == "aging_interval" and "(0, 604800]" in str(err.value)


@pytest.mark.parametrize("data,path", [
    (dict(global_limit=-1), "global_limit"), (dict(global_limit=1.5), "global_limit"),
    (dict(tiers={"bare": 1}), "tiers.bare"), (dict(tiers={"vm": -2}), "tiers.vm"),
    (dict(environments={"prod": "x"}), "environments.prod"), (dict(providers=[1]), "providers"),
    (dict(aging_interval=0), "aging_interval"), (dict(preemption="on"), "preemption"),
    (dict(quotas=1), "quotas"),
])
def test_invalid_quota_config_is_named(store, data, path):
    before = store.policy()
    with pytest.raises(QuotaConfigInvalid) as err:
        store.set_policy(Policy(**{**before.to_dict(), **data}) if path != "quotas" else Policy.build(data))
    assert err.value.path == path and err.value.exit_code == 78
    assert store.policy() == before


# ----------------------------------------------------------------------------- a request's numbers

REQUEST_BOUNDS = [
    ("priority", [INT32[0], INT32[1]], [INT32[1] + 1, INT32[0] - 1, 10**30, 1.5, True, "1"], "[-2147483648, 2147483647]"),
    ("queue_timeout", [30 * DAY, 0.001], [30 * DAY + 1, 0, -1, math.inf, math.nan, True], "(0, 2.592e+06]"),
    ("lease_ttl", [DAY, 0.001], [DAY + 1, 0, -1, math.inf, math.nan, None, "30"], "(0, 86400]"),
]


@pytest.mark.parametrize("field,good,bad,span", REQUEST_BOUNDS, ids=[b[0] for b in REQUEST_BOUNDS])
def test_a_request_number_out_of_range_is_refused_naming_it_and_the_handle_goes_on(store, field, good, bad, span):
    for i, value in enumerate(good):
        rec = store.submit(req(f"good-{i}", **{field: value}))
        assert getattr(store.get(rec.id).request, field) == value  # stored and read back as given
        store.cancel(rec.id)
    events = store.events()
    for value in bad:
        with pytest.raises(BadRequest) as err:
            store.submit(req("bad", **{field: value}))
        assert err.value.field == field and span in str(err.value) and err.value.exit_code == 94
    assert store.events() == events  # nothing stored
    _still_usable(store)


@pytest.mark.parametrize("call", ["renew", "release"])
@pytest.mark.parametrize("revision", [-1, 2**63, 10**30, 1.0, True], ids=repr)
def test_a_revision_out_of_range_is_refused(store, call, revision):
    rec = store.submit(req("a"))
    with pytest.raises(BadRequest) as err:
        getattr(store, call)("a", revision)
    assert err.value.field == "revision"
    assert store.get("a").revision == rec.revision  # nothing renewed or released
    store.release("a", rec.revision)


@pytest.mark.parametrize("window", [0, -1, DAY + 1, math.inf, math.nan, True, "5"], ids=repr)
def test_a_heartbeat_window_out_of_range_is_refused(store, store_url, window):
    with pytest.raises(BadRequest) as err:
        store.heartbeat(window)
    assert err.value.field == "window" and "(0, 86400]" in str(err.value)
    assert store.orchestrators() == []
    with pytest.raises(BadRequest) as err:
        open_store(store_url, actor="orch-b", heartbeat_window=window)
    assert err.value.field == "heartbeat_window"
    assert store.heartbeat(DAY).lapses_at == store.clock() + DAY  # the edge is inside


def test_events_paging_is_bounded(store):
    store.submit(req("a"))
    for kw in ({"since": -1}, {"since": 2**63}, {"limit": -1}, {"limit": 1.5}):
        with pytest.raises(BadRequest):
            store.events(**kw)
    assert [e.kind for e in store.events(since=0, limit=1)] == ["queued"]


def _sql(url: str, statement: str, args=()) -> None:
    if url.startswith("sqlite://"):
        import sqlite3

        with sqlite3.connect(url[len("sqlite://"):]) as c:
            c.execute(statement, args)
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as c:
            c.execute(statement.replace("?", "%s"), args)


def test_a_request_built_by_hand_is_checked_field_by_field(store):
    # a dataclass does not check its fields: the store does, whatever built the request
    bad = replace(req("x"), priority=2**40)
    with pytest.raises(BadRequest, match="priority"):
        store.submit(bad)
    assert store.active() == []
