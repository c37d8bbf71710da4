"""fleet.service.metrics: scrape the real HTTP endpoint over a real table and parse the exposition."""
from __future__ import annotations

import socket
import threading
import urllib.request

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleet.rules import fsm
from fleet.service.metrics import FleetMetrics, MetricsServer
from fleet.rules.outcomes import FAILURE_REASONS
from fleet.shm.table import SlotTable, TableNotFound
from tests import fleet_tables as ft

NOW_NS = ft.SINCE_NS + 4_000_000_000  # 4 s into the current cordoned stay


@pytest.fixture
def server(table):
    with MetricsServer(port=0, metrics=FleetMetrics(table.snapshot, clock=lambda: NOW_NS)) as s:
        yield s


def scrape(url: str) -> dict:
    """{(sample name, sorted labels): value} from one scrape of ``url``."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]


def test_binds_localhost_on_an_ephemeral_port(server):
    assert server.host == "127.0.0.1" and server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}/metrics"


def test_profile_and_identity(server, fleet_name):
    m = scrape(server.url)
    assert value(m, "fleet_profile", profile="auto", binding="pinned", oversubscribed="false") == 1
    assert [k for k in m if k[0] == "fleet_profile"] == [
        ("fleet_profile", (("binding", "pinned"), ("oversubscribed", "false"), ("profile", "auto")))
    ]
    info = [dict(k[1]) for k in m if k[0] == "fleet_info"]
    assert len(info) == 1 and info[0]["fleet"] == fleet_name and info[0]["mode"] == "service"
    assert value(m, "fleet_table_readable") == 1


def test_serial_oversubscribed_profile(fleet_name):
    t = SlotTable.create(fleet_name, ft.ROLES, ft.N_SLOTS, meta=ft.boot_meta(fleet_name, quota=4, profile="pinned"))
    try:
        with MetricsServer(port=0, provider=t.snapshot) as s:
            m = scrape(s.url)
        assert value(m, "fleet_profile", profile="pinned", binding="pinned", oversubscribed="true") == 1
    finally:
        t.close()


def test_slots_by_role_and_state(server):
    m = scrape(server.url)
    slots = {dict(k[1])["role"] + "/" + dict(k[1])["state"]: v for k, v in m.items() if k[0] == "fleet_slots"}
    assert slots["solver/Running"] == 1 and slots["solver/Pinned"] == 1
    assert slots["sim/Running"] == 1 and slots["merge/Leased"] == 1 and slots["/Idle"] == 1
    assert slots["sim/Draining"] == 0  # known pairs are exported at zero, so series never vanish
    assert sum(slots.values()) == ft.N_SLOTS


def test_slot_gauges_follow_the_table(server, table):
    table.apply(2, "DRAIN")
    m = scrape(server.url)
    assert value(m, "fleet_slots", role="sim", state="Draining") == 1
    assert value(m, "fleet_slots", role="sim", state="Running") == 0


def test_each_seats_contention(server):
    """fleet_seat_contended{seat} and fleet_seat_contentions_total{seat}, read on each seat's
    slot (tests.fleet_tables marks slot 1's seat contended, the second time)."""
    m = scrape(server.url)
    contended = {dict(k[1])["seat"]: v for k, v in m.items() if k[0] == "fleet_seat_contended"}
    episodes = {dict(k[1])["seat"]: v for k, v in m.items() if k[0] == "fleet_seat_contentions_total"}
    assert len(contended) == len(episodes) == ft.N_SLOTS  # one seat per slot in that table
    (seat,) = [name for name, v in contended.items() if v == 1]
    assert seat.endswith("-1") and episodes == {name: 2 if name == seat else 0 for name in contended}


def test_posture_counters_and_cordoned_seconds(server):
    m = scrape(server.url)
    assert value(m, "fleet_posture_cordoned") == 1
    assert value(m, "fleet_posture_enter_total") == 3 and value(m, "fleet_posture_exit_total") == 2
    # 5 s of earlier stays plus the 4 s of the current one
    assert value(m, "fleet_posture_cordoned_seconds_total") == pytest.approx(9.0)
    assert value(m, "fleet_intake_suppressed_total") == 17


def test_nominal_counts_no_current_stay(server, table):
    table.set_posture(fsm.NOMINAL, since_ns=ft.SINCE_NS, enter_count=3, exit_count=3, cordoned_ns=ft.CORDONED_BEFORE_NS)
    m = scrape(server.url)
    assert value(m, "fleet_posture_cordoned") == 0 and value(m, "fleet_posture_exit_total") == 3
    assert value(m, "fleet_posture_cordoned_seconds_total") == pytest.approx(5.0)


def test_ledger_by_outcome_and_by_reason(server):
    m = scrape(server.url)
    assert value(m, "fleet_units_submitted_total") == 40 and value(m, "fleet_units_inflight") == 3
    assert {o: value(m, "fleet_units_total", outcome=o) for o in ("solved", "suppressed", "failed")} == {
        "solved": 28, "suppressed": 2, "failed": 7,
    }
    by_reason = {r: value(m, "fleet_units_failed_total", reason=r) for r in FAILURE_REASONS}
    assert by_reason == dict(zip(FAILURE_REASONS, ft.FAILED_BY_REASON))


def test_queue_depths_by_role(server, table):
    table.set_queue_depth(ft.ROLES.code("merge"), 4, in_use=1)
    m = scrape(server.url)
    assert {r: value(m, "fleet_queue_depth", role=r) for r in ("solver", "sim", "merge")} == {
        "solver": 5, "sim": 11, "merge": 4,
    }
    assert value(m, "fleet_queue_bound", role="sim") == 64 and value(m, "fleet_role_slots_in_use", role="merge") == 1


def test_run_time_histogram_by_role(server):
    for seconds in (0.003, 0.02, 0.02, 7.0):
        server.observe_run("solver", seconds)
    server.metrics.observe_run("sim", 0.0002)
    m = scrape(server.url)
    assert value(m, "fleet_unit_run_seconds_count", role="solver") == 4
    assert value(m, "fleet_unit_run_seconds_sum", role="solver") == pytest.approx(7.043)
    assert value(m, "fleet_unit_run_seconds_bucket", role="solver", le="0.005") == 1
    assert value(m, "fleet_unit_run_seconds_bucket", role="solver", le="0.025") == 3
    assert value(m, "fleet_unit_run_seconds_bucket", role="solver", le="5.0") == 3
    assert value(m, "fleet_unit_run_seconds_bucket", role="solver", le="10.0") == 4
    assert value(m, "fleet_unit_run_seconds_bucket", role="sim", le="0.0005") == 1


@pytest.mark.parametrize("bad", [-0.001, float("nan"), float("inf")])
def test_a_bad_run_time_is_refused(server, bad):
    with pytest.raises(ValueError, match="run time"):
        server.observe_run("solver", bad)
    assert ("fleet_unit_run_seconds_count", (("role", "solver"),)) not in scrape(server.url)


def test_a_table_that_went_away_scrapes_as_unreadable(fleet_name):
    def gone():
        raise TableNotFound(f"fleet {fleet_name!r} is not running")

    with MetricsServer(port=0, provider=gone) as s:
        m = scrape(s.url)
    assert value(m, "fleet_table_readable") == 0
    assert not [k for k in m if k[0] in ("fleet_profile", "fleet_slots")]


def test_two_fleets_in_one_process_do_not_collide(table, fleet_name):
    other_name = fleet_name + "b"
    other = SlotTable.create(other_name, ft.ROLES, ft.N_SLOTS, meta=ft.boot_meta(other_name, quota=4))
    try:
        with MetricsServer(port=0, provider=table.snapshot) as a, MetricsServer(port=0, provider=other.snapshot) as b:
            a.observe_run("solver", 1.0)
            ma, mb = scrape(a.url), scrape(b.url)
        assert a.port != b.port
        assert [dict(k[1])["fleet"] for k in ma if k[0] == "fleet_info"] == [fleet_name]
        assert [dict(k[1])["fleet"] for k in mb if k[0] == "fleet_info"] == [other_name]
        assert value(mb, "fleet_profile", profile="auto", binding="serial", oversubscribed="false") == 1
        assert ("fleet_unit_run_seconds_count", (("role", "solver"),)) not in mb
        assert value(mb, "fleet_queue_depth", role="sim") == 0  # b's table was never populated
    finally:
        other.close()
        other.unlink()
    # the process-global registry never saw any fleet metric
    global_names = {m.name for m in prometheus_client.REGISTRY.collect()}
    assert not {n for n in global_names if n.startswith("fleet_")}


def test_close_stops_the_thread_and_frees_the_port(table):
    before = {t.ident for t in threading.enumerate()}
    server = MetricsServer(port=0, provider=table.snapshot).start()
    port = server.port
    assert scrape(server.url)
    server.close()
    server.close()  # idempotent
    assert {t.ident for t in threading.enumerate()} <= before
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    # the port can be bound again at once
    with MetricsServer(port=port, provider=table.snapshot) as again:
        assert scrape(again.url)


def test_a_taken_port_is_an_error(table):
    with MetricsServer(port=0, provider=table.snapshot) as first:
        with pytest.raises(OSError):
            MetricsServer(port=first.port, provider=table.snapshot).start()


def test_construction_binds_nothing(table):
    server = MetricsServer(port=0, provider=table.snapshot)
    assert server.port == 0 and server._server is None
    server.close()  # closing an unstarted server is harmless


def test_needs_a_provider():
    with pytest.raises(TypeError, match="provider"):
        MetricsServer(port=0)


def test_ipv6_localhost(table):
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.fail("this host has no IPv6 loopback; the endpoint's IPv6 path cannot be checked here")
    with MetricsServer(host="::1", port=0, provider=table.snapshot) as s:
        assert s.url.startswith("http://[::1]:") and value(scrape(s.url), "fleet_table_readable") == 1


# ------------------------------------------------- counters and run times from one point


def test_counters_and_run_times_agree_as_soon_as_a_map_returns(fleet_name):
    from tests.fleets import config, role, running

    cfg = config(fleet_name, {"sq": role("square", slots=2)})
    cfg["metrics"] = {"enabled": True, "host": "127.0.0.1", "port": 0}
    with running(cfg) as f:
        url = f._sup.publisher.metrics.url
        for n in range(1, 4):
            assert list(f.map("sq", range(5))) == [i * i for i in range(5)]
            m = scrape(url)  # at once: no sampling interval may pass first
            assert value(m, "fleet_units_total", outcome="solved") == 5 * n
            assert value(m, "fleet_units_inflight") == 0
            assert value(m, "fleet_units_submitted_total") == 5 * n
            assert value(m, "fleet_unit_run_seconds_count", role="sq") == 5 * n


def test_published_counters_and_run_times_are_read_together(table):
    metrics = FleetMetrics(table.snapshot, clock=lambda: NOW_NS)
    counts = {"submitted": 9, "solved": 4, "suppressed": 1, "failed": 2, "inflight": 2,
              "failed_by_reason": {"Timeout": 2}}
    metrics.publish_units(counts, [("solver", 0.01)] * 4 + [("sim", 0.2)] * 3)
    with MetricsServer(port=0, metrics=metrics) as s:
        m = scrape(s.url)
    # the published counters, not the table's (populate wrote others there)
    assert value(m, "fleet_units_total", outcome="solved") == 4
    assert value(m, "fleet_units_failed_total", reason="Timeout") == 2
    assert value(m, "fleet_units_inflight") == 2
    assert value(m, "fleet_unit_run_seconds_count", role="solver") == 4
    assert value(m, "fleet_unit_run_seconds_count", role="sim") == 3
    # a bad run time publishes nothing, counters included
    with pytest.raises(ValueError):
        metrics.publish_units({**counts, "solved": 5}, [("solver", -1.0)])
    with MetricsServer(port=0, metrics=metrics) as s:
        m = scrape(s.url)
    assert value(m, "fleet_units_total", outcome="solved") == 4
    assert value(m, "fleet_unit_run_seconds_count", role="solver") == 4


def test_item_counts_are_exported_beside_the_unit_counts_after_a_known_workload(fleet_name):
    """A chunk of a map is one unit of many items: the export counts both, as the ledger does."""
    from tests.fleets import config, role, running

    cfg = config(fleet_name, {"sq": role("square", slots=2), "mixed": role("sometimes", slots=1)})
    cfg["metrics"] = {"enabled": True, "host": "127.0.0.1", "port": 0}
    with running(cfg) as f:
        url = f._sup.publisher.metrics.url
        assert list(f.map("sq", range(10), chunksize=5)) == [i * i for i in range(10)]  # 2 units, 10 items
        outcomes = [f.submit("mixed", n) for n in range(3)]  # solved, suppressed, failed: 1 item each
        for fut in outcomes:
            fut.exception(60)
        m = scrape(url)
        ledger = f.ledger()
    assert value(m, "fleet_units_submitted_total") == 5
    assert value(m, "fleet_items_submitted_total") == 13 == ledger["items"]["submitted"]
    assert value(m, "fleet_items_total", outcome="solved") == 11 == ledger["items"]["solved"]
    assert value(m, "fleet_items_total", outcome="suppressed") == 1
    assert value(m, "fleet_items_total", outcome="failed") == 1
    assert value(m, "fleet_items_inflight") == 0
    assert value(m, "fleet_units_total", outcome="solved") == 3
    assert value(m, "fleet_fsm_refused_total") == 0 and value(m, "fleet_stray_results_total") == 0
    assert value(m, "fleet_role_repins_total", role="sq") == 0


def test_item_counts_come_from_the_table_before_anything_is_published(server, table):
    """A FleetMetrics over a table another process writes reads the table's item counters."""
    m = scrape(server.url)
    items = table.snapshot().ledger_view()["items"]
    assert value(m, "fleet_items_submitted_total") == items["submitted"]
    for outcome in ("solved", "suppressed", "failed"):
        assert value(m, "fleet_items_total", outcome=outcome) == items[outcome]
    assert value(m, "fleet_items_inflight") == items["inflight"]


# ------------------------------------------------- makespans (002 §7)


def test_makespan_buckets_after_a_known_workload(fleet_name, monkeypatch):
    """A scrape of the real exporter after a known workload: every unit in its role's (and
    its key's) series, in the buckets its makespan allows; a keyed role's keys past the
    bound share one series."""
    from fleet.service import metrics as metrics_mod
    from tests.fleets import config, role, running

    monkeypatch.setattr(metrics_mod, "MAKESPAN_KEYS", 2)
    cfg = config(fleet_name, {"nap": role("hang", slots=2), "bins": role("keyed", kind="pinned", slots=2,
                                                                         elastic_repin=True)})
    cfg["metrics"] = {"enabled": True, "host": "127.0.0.1", "port": 0}
    with running(cfg) as f:
        url = f._sup.publisher.metrics.url
        for fut in [f.submit("nap", 0.3) for _ in range(3)]:
            assert fut.result(timeout=60) == "woke"
        for k in ("a", "b", "a", "c", "d"):
            f.submit("bins", key=k).result(timeout=60)
        m = scrape(url)
    nap = dict(role="nap", key="", epoch="0")
    # each nap slept 0.3 s: none fits under 0.25 s, all under a generous 60 s
    assert value(m, "fleet_unit_makespan_seconds_bucket", le="0.25", **nap) == 0
    assert value(m, "fleet_unit_makespan_seconds_bucket", le="60.0", **nap) == 3
    assert value(m, "fleet_unit_makespan_seconds_bucket", le="+Inf", **nap) == 3
    assert value(m, "fleet_unit_makespan_seconds_count", **nap) == 3
    assert value(m, "fleet_unit_makespan_seconds_sum", **nap) >= 0.9
    # keys a and b have series of their own; c and d, past the bound of 2, share "_other"
    for key, n in (("a", 2), ("b", 1), ("_other", 2)):
        assert value(m, "fleet_unit_makespan_seconds_count", role="bins", key=key, epoch="0") == n
    assert value(m, "fleet_unit_makespan_keys_folded_total", role="bins") == 2
    assert ("fleet_unit_makespan_seconds_count", (("epoch", "0"), ("key", "c"), ("role", "bins"))) not in m


def test_makespan_series_are_bounded_by_epoch_and_refuse_bad_times(table):
    from fleet.service.metrics import MAKESPAN_EPOCHS

    metrics = FleetMetrics(table.snapshot, clock=lambda: NOW_NS)
    counts = {"submitted": 0, "solved": 0, "suppressed": 0, "failed": 0, "inflight": 0}
    for epoch in range(MAKESPAN_EPOCHS + 2):
        metrics.publish_units(counts, makespans=[("sim", None, epoch, 0.002)])
    with pytest.raises(ValueError):
        metrics.publish_units(counts, makespans=[("sim", None, 99, float("nan"))])
    with MetricsServer(port=0, metrics=metrics) as s:
        m = scrape(s.url)
    epochs = {dict(labels)["epoch"] for name, labels in m if name == "fleet_unit_makespan_seconds_count"}
    assert epochs == {str(e) for e in range(2, MAKESPAN_EPOCHS + 2)}  # the oldest two dropped; 99 never published
    assert value(m, "fleet_unit_makespan_seconds_bucket", role="sim", key="", epoch="2", le="0.0025") == 1
    assert value(m, "fleet_unit_makespan_seconds_bucket", role="sim", key="", epoch="2", le="0.001") == 0


def test_a_time_on_a_bucket_bound_counts_in_that_bucket(table):
    metrics = FleetMetrics(table.snapshot, clock=lambda: NOW_NS)
    counts = {"submitted": 0, "solved": 0, "suppressed": 0, "failed": 0, "inflight": 0}
    metrics.publish_units(counts, [("sim", 0.0025), ("sim", 700.0)], [("sim", None, 0, 0.0025)])
    with MetricsServer(port=0, metrics=metrics) as s:
        m = scrape(s.url)
    assert value(m, "fleet_unit_run_seconds_bucket", role="sim", le="0.0025") == 1  # le: at most the bound
    assert value(m, "fleet_unit_run_seconds_bucket", role="sim", le="0.001") == 0
    assert value(m, "fleet_unit_run_seconds_bucket", role="sim", le="600.0") == 1  # 700 s only under +Inf
    assert value(m, "fleet_unit_run_seconds_bucket", role="sim", le="+Inf") == 2
    assert value(m, "fleet_unit_makespan_seconds_bucket", role="sim", key="", epoch="0", le="0.0025") == 1
