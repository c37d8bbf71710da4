"""Declared peaks over the quota are refused at boot on every profile (002 §5: "startup
fails loudly if the declared peak shares exceed the quota"): the embedded face raises the
typed error and the program lives on; fleetd exits with its code. Nothing is left behind."""
from __future__ import annotations

import os

import pytest

import fleet
from fleet.rules.errors import EXIT_BUDGET_OVER_QUOTA
from tests.daemons import Fleetd, segments
from tests.fleets import config, descendants, role


@pytest.mark.parametrize("profile", ["auto", "serial", "pinned"])
def test_an_embedded_fleet_declaring_more_than_the_quota_is_refused(fleet_name, profile):
    before = descendants()
    cfg = config(fleet_name, {"w": role("square", peak_cpus=50)}, profile=profile)
    with pytest.raises(fleet.BudgetOverQuota) as info:
        fleet.Fleet.from_config(cfg, env={})
    assert info.value.exit_code == EXIT_BUDGET_OVER_QUOTA and "w 50" in str(info.value)
    assert descendants() == before and segments(fleet_name) == []


def test_fleetd_exits_with_the_budget_code(fleet_name):
    d = Fleetd(fleet_name, {"a": role("square", peak_cpus=os.cpu_count()), "b": role("echo", peak_cpus=1)})
    try:
        d.start(wait_ready=False)
        assert d.wait() == EXIT_BUDGET_OVER_QUOTA, d.stderr()
        assert "fleetd: BudgetOverQuota: declared shares sum to" in d.stderr()
        assert not d.notify.with_key("READY", "1")
    finally:
        d.cleanup()
    assert segments(fleet_name) == []
