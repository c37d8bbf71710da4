"""The saturation rule (fleet.rules.saturation), on a fake clock: raise, hold, clear,
hysteresis, one event per episode edge, and the estimate."""
from __future__ import annotations

import re

import pytest

from fleet.rules import saturation as S

POLICY = S.SaturationPolicy(window_s=2.0, raise_depth=8, clear_depth=0, margin=0.05)


def feed(rule, t0, seconds, *, depth0, arrive, serve, granted0=0, step=0.25):
    """Samples every `step` s for `seconds`: `arrive` and `serve` units/s; returns (events, t, depth, granted)."""
    events, t, depth, granted = [], t0, depth0, granted0
    for _ in range(round(seconds / step)):
        t += step
        served = min(depth + arrive * step, serve * step)
        depth = depth + arrive * step - served
        granted += served
        e = rule.observe(t, round(depth), round(granted))
        if e is not None:
            events.append((t, e))
    return events, t, round(depth), round(granted)


def test_arrivals_outrunning_service_raise_once_after_a_full_window():
    rule = S.RoleSaturation(POLICY)
    rule.observe(0.0, 0, 0)
    events, t, depth, _ = feed(rule, 0.0, 6.0, depth0=0, arrive=100, serve=50)
    assert [e for _, e in events] == [S.RAISED]  # one raise, never one per check
    raised_at = events[0][0]
    assert raised_at >= POLICY.window_s  # the window had to be full
    r = rule.reading
    assert r.saturated and r.episodes == 1 and r.since == raised_at
    assert r.arrival_rate == pytest.approx(100, rel=0.05) and r.service_rate == pytest.approx(50, rel=0.05)
    assert r.growth == pytest.approx(50, rel=0.05) and r.backlog == depth
    assert r.drain_s == pytest.approx(depth / r.service_rate)


def test_a_service_that_keeps_up_never_raises():
    rule = S.RoleSaturation(POLICY)
    rule.observe(0.0, 20, 0)
    events, *_ = feed(rule, 0.0, 10.0, depth0=20, arrive=50, serve=50)
    assert events == [] and not rule.reading.saturated


def test_a_burst_shorter_than_the_window_that_drains_is_no_episode():
    rule = S.RoleSaturation(POLICY)
    rule.observe(0.0, 0, 0)
    events, t, depth, g = feed(rule, 0.0, 1.0, depth0=0, arrive=200, serve=50)
    events2, *_ = feed(rule, t, 6.0, depth0=depth, granted0=g, arrive=0, serve=50)
    assert events + events2 == []


def test_arrivals_within_the_margin_of_service_never_raise():
    rule = S.RoleSaturation(POLICY)
    rule.observe(0.0, 0, 0)
    events, _t, depth, _g = feed(rule, 0.0, 30.0, depth0=0, arrive=51, serve=50)  # 2 % over: inside 5 %
    assert depth >= 3 * POLICY.raise_depth and events == []


def test_a_small_backlog_never_raises():
    rule = S.RoleSaturation(POLICY)
    rule.observe(0.0, 0, 0)
    events, *_ = feed(rule, 0.0, 6.0, depth0=0, arrive=11, serve=10)  # grows ~6 units: under raise_depth
    assert events == []


def test_a_held_backlog_holds_and_a_drained_one_clears_once():
    rule = S.RoleSaturation(POLICY)
    rule.observe(0.0, 0, 0)
    ev1, t, depth, g = feed(rule, 0.0, 4.0, depth0=0, arrive=100, serve=50)
    # arrivals fall to the service rate: the backlog holds, so does the episode
    ev2, t, depth, g = feed(rule, t, 6.0, depth0=depth, granted0=g, arrive=50, serve=50)
    assert rule.reading.saturated and depth > 0
    # hysteresis: drained to a few units (under raise_depth, over clear_depth) still holds
    rule.observe(t + 0.25, 3, g + 10)
    assert rule.reading.saturated
    ev3, t, depth, g = feed(rule, t + 0.25, 8.0, depth0=3, granted0=g + 10, arrive=0, serve=50)
    assert [e for _, e in ev1 + ev2 + ev3] == [S.RAISED, S.CLEARED]
    assert not rule.reading.saturated and rule.reading.episodes == 1 and rule.reading.since is None
    # further quiet checks say nothing more
    ev4, *_ = feed(rule, t, 4.0, depth0=0, granted0=g, arrive=10, serve=50)
    assert ev4 == []


def test_a_second_episode_counts_two():
    rule = S.RoleSaturation(POLICY)
    rule.observe(0.0, 0, 0)
    t, depth, g, events = 0.0, 0, 0, []
    for _ in range(2):
        e, t, depth, g = feed(rule, t, 4.0, depth0=depth, granted0=g, arrive=100, serve=50)
        events += e
        e, t, depth, g = feed(rule, t, 12.0, depth0=depth, granted0=g, arrive=0, serve=50)
        events += e
    assert [e for _, e in events] == [S.RAISED, S.CLEARED, S.RAISED, S.CLEARED]
    assert rule.reading.episodes == 2


@pytest.mark.parametrize("bad", [
    {"window_s": 0}, {"window_s": -1.0}, {"window_s": "2"}, {"raise_depth": 0}, {"raise_depth": 2.5},
    {"clear_depth": 8}, {"clear_depth": -1}, {"margin": -0.1}, {"margin": True},
])
def test_bad_thresholds_are_refused_by_name(bad):
    key = next(iter(bad))
    with pytest.raises(ValueError, match=key):
        S.SaturationPolicy(**bad)


def test_the_estimate_scales_the_per_core_rate():
    est = S.estimate(80.0, 25.0, 1, binding="serial", pinned_cores=2, pinned_quota=4)
    assert est["per_core_rate"] == 25.0 and est["cores_needed"] == 4  # 3.2 cores' worth: 4 cores
    assert est["pinned"] == {"cores": 2, "quota_cpus": 4, "capacity": 50.0}
    line = S.describe(est, 80.0)
    assert "needs ~4 core(s)" in line and "quota of 4 cpus" in line and "~50.0/s" in line
    assert S.estimate(10.0, 0.0, 1, binding="serial") is None
    assert "no rate" in S.describe(None, 10.0)
    assert "at this quota" in S.describe(S.estimate(9.0, 3.0, 2, binding="pinned", pinned_cores=2), 9.0)


def test_the_config_section_sets_the_thresholds_and_refuses_a_bad_one_by_name():
    from fleet.rules.errors import ConfigError
    from fleet.runtime.config import load_config

    base = {"roles": {"sq": {"kind": "pooled", "handler": "tests.handlers:square"}}}
    cfg = load_config({**base, "saturation": {"window_s": 5, "raise_depth": 20, "clear_depth": 4}}, env={})
    assert cfg.saturation == S.SaturationPolicy(window_s=5, raise_depth=20, clear_depth=4)
    assert load_config(base, env={}).saturation == S.DEFAULT_SATURATION
    for bad, key in [({"clear_depth": 8}, "saturation.clear_depth"), ({"window": 1}, "saturation.window"),
                     ({"raise_depth": 0}, "saturation.raise_depth")]:
        with pytest.raises(ConfigError, match=re.escape(key)):
            load_config({**base, "saturation": bad}, env={})
