"""Saturation on a real fleet (issue 47 item 4): 20 ms CPU units submitted faster than
the serial seat serves them read as saturated in status (JSON and text), `top`, the
metrics scrape and the log (once), and clear once the backlog drains."""
from __future__ import annotations

import json
import logging
import time

from fleet.cli import cmd_status, cmd_top, fleetctl
from tests.fleets import config, role, running
from tests.service.test_metrics import scrape, value

UNIT_US = 20_000  # a 20 ms CPU unit (tests.handlers.spin)


def _saturated(f) -> list[str]:
    return [s["role"] for s in f.status()["saturated"]]


def test_a_fleet_fed_past_its_rate_says_so_then_clears(fleet_name, caplog, capsys):
    cfg = config(fleet_name, {"work": role("spin", slots=2), "idle": role("noop", slots=1)}, profile="serial")
    cfg["saturation"] = {"window_s": 1.0, "raise_depth": 8}
    cfg["metrics"] = {"enabled": True, "host": "127.0.0.1", "port": 0}
    caplog.set_level(logging.WARNING, logger="fleet.runtime.saturation")
    with running(cfg) as f:
        url = f._sup.publisher.metrics.url
        assert _saturated(f) == []
        futures = []
        # One seat serves at most ~50 of these a second; 8 every 50 ms is ~160/s. Fed until
        # the fleet says so (bounded: a loaded machine only serves slower).
        deadline = time.monotonic() + 60
        while not _saturated(f):
            assert time.monotonic() < deadline, "never read as saturated"
            futures += [f.submit("work", UNIT_US) for _ in range(8)]
            time.sleep(0.05)
        # Two more seconds of backlog at the most one seat serves: the readings below are
        # taken well before it can drain, however fast the machine.
        futures += [f.submit("work", UNIT_US) for _ in range(100)]
        doc = f.status()
        (sat,) = doc["saturated"]
        assert sat["role"] == "work" and sat["episodes"] == 1
        assert sat["arrival_rate"] > sat["service_rate"] > 0 and sat["growth"] > 0 and sat["backlog"] >= 8
        assert sat["estimate"]["cores_now"] == 1 and sat["estimate"]["cores_needed"] >= 2
        text = cmd_status.render(doc)
        assert "SATURATED role work:" in text and "estimate: " in text
        assert any(line.startswith("SATURATED role work") for line in cmd_top.frame(doc, None, None))
        capsys.readouterr()
        assert fleetctl.main(["status", "--name", fleet_name, "--json"]) == 0
        assert [s["role"] for s in json.loads(capsys.readouterr().out)["saturated"]] == ["work"]
        assert fleetctl.main(["status", "--name", fleet_name]) == 0
        assert "SATURATED role work:" in capsys.readouterr().out
        m = scrape(url)
        assert value(m, "fleet_role_saturated", role="work") == 1
        assert value(m, "fleet_role_saturated", role="idle") == 0
        assert value(m, "fleet_role_saturation_episodes_total", role="work") == 1
        assert value(m, "fleet_role_arrival_rate", role="work") > value(m, "fleet_role_service_rate", role="work")
        # Stop feeding: the backlog drains, and the reading clears.
        for fut in futures:
            fut.result(300)
        deadline = time.monotonic() + 60
        while _saturated(f):
            assert time.monotonic() < deadline, "never cleared"
            time.sleep(0.05)
        doc = f.status()
        work = next(q for q in doc["queues"] if q["name"] == "work")
        assert work["saturation"]["saturated"] is False and work["saturation"]["episodes"] == 1
        assert "saturation none" in cmd_status.render(doc)
        assert fleetctl.main(["status", "--name", fleet_name, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["saturated"] == []
        assert value(scrape(url), "fleet_role_saturated", role="work") == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "fleet.runtime.saturation"]
    assert [("no longer" in line) for line in lines] == [False, True], lines  # one line per edge
    assert "role work saturated (episode 1)" in lines[0] and "arriving vs" in lines[0]


def _episode_levels(warn: bool, caplog) -> list[int]:
    """The levels of the watch's log records over one episode raised then cleared."""
    from types import SimpleNamespace

    from fleet.rules.roles import Role, RoleSet
    from fleet.rules.saturation import SaturationPolicy
    from fleet.runtime.saturation import SaturationWatch

    roles = RoleSet((Role(name="work", kind="pooled", cordon_class="never", handler=None, slots=1),))
    plan = SimpleNamespace(binding="pinned", tier_refused=None)
    watch = SaturationWatch("sat-log", roles, SaturationPolicy(window_s=1.0, raise_depth=8, warn=warn), None, plan, [])
    caplog.set_level(logging.DEBUG, logger="fleet.runtime.saturation")
    caplog.clear()
    t, depth = 0.0, 0
    for _ in range(12):  # 3 s of a backlog growing 40/s: raised once the 1 s window is full
        watch.sample(t, lambda code: depth)
        t, depth = t + 0.25, depth + 10
        watch.granted[0] += 1
    watch.sample(t, lambda code: 0)  # drained: cleared
    return [r.levelno for r in caplog.records if r.name == "fleet.runtime.saturation"]


def test_an_episode_is_a_warning_by_default_and_info_with_warn_off(caplog):
    # An Executor's map queues every call at once: its episodes go to INFO, not a script's stderr.
    assert _episode_levels(True, caplog) == [logging.WARNING, logging.WARNING]
    assert _episode_levels(False, caplog) == [logging.INFO, logging.INFO]


def test_an_executor_turns_its_episodes_warnings_off():
    import fleet

    with fleet.Executor(max_workers=1) as ex:
        assert ex._sup.config.saturation.warn is False
