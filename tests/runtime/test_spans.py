"""A span per unit through OpenTelemetry (fleet.runtime.spans, 002 §7): collected with the
SDK's in-memory exporter from a real fleet, for a solved, a failed and a LaneDeath unit
(its worker SIGKILLed mid-run); and none, nor any stamp, when spans are off."""
from __future__ import annotations

import os
import signal

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import fleet
from fleet.runtime.config import ConfigError
from fleet.runtime.spans import SPAN_NAME
from tests.fleets import config, role, running, worker_pids
from tests.runtime.test_seat_deaths import LONG_S, WAIT_S, eventually, runs

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans():
    """The process's tracer provider (set once: OpenTelemetry allows no second), its
    spans collected in memory; emptied before and after each test."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def _cfg(name: str, spans_on: bool) -> dict:
    cfg = config(name, {"sq": role("square", slots=2, peak_cpus=0), "bad": role("fail", slots=1, peak_cpus=0),
                        "bins": role("keyed", kind="pinned", slots=1, peak_cpus=0),
                        "w": role("marked", slots=1, peak_cpus=0)},
                 restart={"max_restarts": 100, "within_seconds": 10})
    cfg["metrics"] = {"spans": spans_on}
    return cfg


def _by_unit(exporter) -> dict:
    return {s.attributes["fleet.unit_id"]: s for s in exporter.get_finished_spans() if s.name == SPAN_NAME}


def _events(span) -> dict:
    return {e.name: e.timestamp for e in span.events}


def test_a_span_per_unit_solved_failed_and_lane_death(fleet_name, tmp_path, spans):
    d = str(tmp_path)
    with running(_cfg(fleet_name, True)) as f:
        ok = f.submit("sq", 7)
        assert ok.result(WAIT_S) == 49
        bad = f.submit("bad", 1)
        with pytest.raises(ValueError):  # the handler's own exception
            bad.result(WAIT_S)
        keyed = f.submit("bins", key="k3")
        keyed.result(WAIT_S)
        doomed = f.submit("w", (d, 0, LONG_S))
        eventually(lambda: runs(d, 0) == 1, "the doomed unit runs")
        pids = worker_pids(f)
        for pid in pids:  # every worker: the one running it among them
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(fleet.UnitFailed) as err:
            doomed.result(WAIT_S)
        assert err.value.outcome.reason == "LaneDeath"
        eventually(lambda: len(_by_unit(spans)) == 4, "four spans")
        seat_names = {s.name for s in f.layout.seats}
    got = _by_unit(spans)
    solved, failed, pinned, died = (got[u.unit_id] for u in (ok, bad, keyed, doomed))
    for span, role_name, outcome in ((solved, "sq", "solved"), (failed, "bad", "failed"),
                                     (pinned, "bins", "solved"), (died, "w", "failed")):
        a = span.attributes
        assert (a["fleet.role"], a["fleet.outcome"], a["fleet.epoch"], a["fleet.name"]) == (
            role_name, outcome, 0, fleet_name)
        assert a["fleet.seat"] in seat_names
        # submit -> grant -> start -> end, in order on one clock
        ev = _events(span)
        assert span.start_time <= ev["grant"] <= span.end_time
        if "start" in ev:
            assert ev["grant"] <= ev["start"] <= span.end_time
    assert "start" in _events(solved) and "start" in _events(failed)
    assert "start" not in _events(died)  # its worker died before it said anything
    assert pinned.attributes["fleet.key"] == "k3" and "fleet.key" not in solved.attributes
    assert solved.status.status_code == StatusCode.UNSET and "fleet.reason" not in solved.attributes
    assert failed.status.status_code == StatusCode.ERROR and failed.attributes["fleet.reason"] == "HandlerError"
    assert died.status.status_code == StatusCode.ERROR and died.attributes["fleet.reason"] == "LaneDeath"


def test_spans_off_stamp_nothing(fleet_name, spans):
    with running(_cfg(fleet_name, False)) as f:
        assert f.submit("sq", 3).result(WAIT_S) == 9
        assert f._sup.inspect(lambda sup: sup.books.watch) is None  # no stamps: one attribute check
    assert _by_unit(spans) == {}


def test_spans_must_be_a_bool():
    with pytest.raises(ConfigError, match="metrics.spans"):
        fleet.Fleet.from_config({"fleet": {"name": "never"}, "metrics": {"spans": "yes"},
                                 "roles": {"sq": role("square")}}, env={})


def test_spans_without_opentelemetry_refuse_the_boot_and_leave_nothing(fleet_name, monkeypatch):
    import sys

    from fleet.runtime.spans import OtelMissing
    from tests.fleets import descendants

    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if fleet[otel] were not installed
    before = descendants()
    with pytest.raises(OtelMissing, match=r"fleet\[otel\]"):
        fleet.Fleet.from_config(_cfg(fleet_name, True), env={})
    eventually(lambda: not (descendants() - before), "no worker or fork server left")
    assert not [p for p in os.listdir("/dev/shm") if p.startswith(f"fleet.{fleet_name}")]
