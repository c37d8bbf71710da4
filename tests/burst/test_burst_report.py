"""The replay report read by a person: report.md explains every column, says what a rerun gives again,
and ends with one line per mode of what it cost and bought; rounds are counted one way in the table and
in report.json; the timeline keeps one colour per pool, one y scale, the limits as lines, UTC time
with a closure's start readable, whole-number ticks and its legend off the data."""
from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest

from fleet.burst import report as R

START = datetime(2026, 10, 4, 0, 0, tzinfo=timezone.utc).timestamp()
CLOSED_AT = 14 * 3600 + 47 * 60  # 14:47Z


def section(mode, *, ok, refused, failed=0, cut=0, events=(), closures=(), met=None):
    rounds = ok + sum(refused.values()) + failed + cut
    met = met or refused
    sim = {"m@p": {"requests": rounds, "200": ok, **{c: met.get(c, 0) for c in R.REFUSALS}, "max_concurrency": 3},
           "m@q": {"requests": 0, "200": 0, "429": 0, "402": 0, "403": 0, "max_concurrency": 0}}
    return {"mode": mode, "profile": "auto", "rounds": rounds, "ok": ok, "failed": failed, "cut": cut,
            "refused": {c: refused.get(c, 0) for c in R.REFUSALS}, "not_ok": rounds - ok,
            "refusals_met": {c: met.get(c, 0) for c in R.REFUSALS}, "moved": 0, "probes": 0,
            "makespan_s": 100.0 + ok, "wait_s": {"review": {"n": ok, "p50": 1.0, "p95": 2.0 + ok, "max": 9.0}},
            "starving_s": {"review": 0.0}, "cycle_tail_ms": None,
            "lag_ms": {"n": rounds, "p50": 0.1, "p99": 0.2, "max": 0.3, "driver": "normal"},
            "ledger": {"exact": True}, "counts_match": True, "simulator": sim,
            "key_closures": {"k1": [[float(a), float(b)] for a, b in closures]}, "admission_closures": [],
            "events": [list(e) for e in events], "round_log": []}


def a_report():
    ev_p = [(t * 600.0, "m@p", 200, n) for t, n in ((1, 1), (2, 3), (3, 2), (90, 1))] + [(2.5 * 600, "m@p", 429, 3)]
    ev_q = [(t * 600.0, "m@q", 200, n) for t, n in ((100, 1), (101, 7))] + [(CLOSED_AT, "m@p", 403, 1)]
    modes = [section("none", ok=7, refused={"429": 2, "403": 1}, events=ev_p + [(CLOSED_AT, "m@p", 403, 1)],
                     closures=[(CLOSED_AT, 86400)]),
             section("cap", ok=9, refused={}, failed=1, events=ev_q[:2]),  # m@q alone: first in no panel
             section("admission", ok=10, refused={}, met={"429": 4}, events=ev_q + ev_p[:4],
                     closures=[(CLOSED_AT, 86400)])]
    return {"version": R.REPORT_VERSION, "trace": "day", "speed": 600, "seed": 1, "arrivals": 10,
            "horizon_s": 86400.0, "start": START, "pools_k": {"m@p": 3, "m@q": 5}, "cap": 2, "modes": modes}


def table_rows(md):
    head = next(line for line in md.splitlines() if line.startswith("| profile | mode | ok"))
    names = [c.strip() for c in head.strip("|").split("|")]
    rows = [dict(zip(names, (c.strip() for c in line.strip("|").split("|"))))
            for line in md.splitlines() if re.match(r"\| auto \| (none|cap|admission) \| \d", line)]
    return names, rows


def test_every_column_is_explained():
    md = R.markdown(a_report())
    names, _ = table_rows(md)
    explained = " ".join(name for name, _ in R.COLUMNS)
    for name in names[2:]:
        assert name.split(" avg")[0] in explained or name in ("429", "402", "403"), name
    assert "## Columns" in md and "429 / 402 / 403" in explained


def test_the_table_and_the_json_count_rounds_one_way():
    rep = a_report()
    _, rows = table_rows(R.markdown(rep))
    for m, row in zip(rep["modes"], rows):
        ended = int(row["ok"]) + sum(int(row[c]) for c in R.REFUSALS) + int(row["failed"]) + int(row["cut"])
        assert ended == m["rounds"] == m["ok"] + sum(m["refused"].values()) + m["failed"] + m["cut"]
        assert m["not_ok"] == m["rounds"] - m["ok"]
        assert int(row["429s met"]) == m["refusals_met"]["429"]
    assert rows[2]["429"] == "0" and rows[2]["429s met"] == "4"  # met, then solved: not a lost round


def test_summarize_counts_met_refusals_from_the_simulator_and_ended_ones_from_the_rounds():
    from types import SimpleNamespace

    from fleet.burst.replay import Round
    from fleet.burst.trace import Arrival, Route

    route = Route("m", "p")
    rounds = [Round(i, Arrival(float(i), f"a{i}", "review", route=route)) for i in range(4)]
    for r, status in zip(rounds, ("ok", "ok", "429", "failed")):
        r.status, r.route, r.submitted, r.ready, r.started, r.ended = status, route, 0.0, 0.0, 1.0, 2.0
    result = SimpleNamespace(rounds=rounds, mode="admission", profile="auto", probes=None, admission_moved=None,
                             delegated=None, wall_s=1.0, lag_ms=[0.1], driver_class="normal", key_closures={},
                             admission_closures=[], events=[], ledger_check=lambda: {"exact": True},
                             simulator={"m@p": {"requests": 6, "200": 2, "429": 3, "402": 0, "403": 0,
                                                "max_concurrency": 2}})
    trace = SimpleNamespace(horizon_s=10.0, header=SimpleNamespace(start=0.0))
    m = R.summarize(result, trace)
    assert (m["ok"], m["refused"]["429"], m["failed"], m["not_ok"]) == (2, 1, 1, 2)
    assert m["refusals_met"]["429"] == 3 and "failed_or_cut" not in m


def test_it_ends_with_one_line_per_mode_of_cost_and_gain_and_says_what_is_deterministic():
    rep = a_report()
    md = R.markdown(rep)
    tail = md.rstrip("\n").split("## What each mode cost and bought\n\n", 1)[1].splitlines()
    assert len(tail) == len(rep["modes"])
    for line, m in zip(tail, rep["modes"]):
        assert line.startswith(f"- **auto / {m['mode']}**: bought {m['ok']} of {m['rounds']} rounds ok")
        assert "cost" in line
    assert "Against none: +3 ok" in tail[2]
    assert "Deterministic:" in md and "Depends on timing:" in md


@pytest.fixture
def fig():
    import matplotlib.pyplot as plt

    f = R.figure(a_report())
    yield f
    plt.close(f)


def test_one_colour_per_pool_in_every_panel(fig):
    by_pool = {}
    for ax, n in zip(fig.axes, (1, 1, 2)):
        steps = [line for line in ax.get_lines() if line.get_drawstyle().startswith("steps")]
        assert len(steps) == n
        for line in steps:
            pool = "m@q" if len(line.get_xdata()) == 3 else "m@p"
            by_pool.setdefault(pool, set()).add(line.get_color())
    assert all(len(c) == 1 for c in by_pool.values()) and by_pool["m@p"] != by_pool["m@q"]


def test_one_y_scale_whole_number_ticks_limits_drawn(fig):
    assert len({ax.get_ylim() for ax in fig.axes}) == 1
    for ax in fig.axes:
        assert all(float(t).is_integer() for t in ax.get_yticks())
    levels = {round(line.get_ydata()[0], 6) for ax in fig.axes for line in ax.get_lines()
              if not line.get_drawstyle().startswith("steps")}
    assert {3.0, 5.0, 2.0} <= levels  # each pool's k, and the cap


def test_time_is_utc_and_the_closure_is_readable(fig):
    fig.canvas.draw()
    ticks = [t.get_text() for t in fig.axes[-1].get_xticklabels() if t.get_text()]
    assert ticks and all(t.endswith("Z") for t in ticks), ticks
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "closed 14:47Z" in notes
    assert "UTC" in fig.axes[-1].get_xlabel()


def test_the_legend_is_off_the_data(fig):
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    fig.canvas.draw()
    box = legend.get_window_extent()
    assert all(box.y1 <= ax.get_window_extent().y0 for ax in fig.axes)
    labels = [t.get_text() for t in legend.get_texts()]
    assert "m@p (k 3)" in labels and "m@q (k 5)" in labels and "cap" in labels


def test_renewed_closures_draw_as_one():
    assert R.merged([(50.0, 60.0), (10.0, 20.0), (20.5, 30.0), (29.0, 40.0)], gap=1.0) == [(10.0, 40.0), (50.0, 60.0)]
