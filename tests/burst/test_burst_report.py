"""The replay report read by a person: the console ends with a few lines that fit a terminal (per mode
ok, lost, makespan, p95 wait; what the admission bought; the report's path); report.md leaves out the
columns empty for the trace and says so, explains every column it shows, says what a rerun gives
again, and ends with one line per mode of what it cost and bought; rounds are counted one way in the
table and in report.json; the timeline draws rounds waiting beside rounds in flight per pool, keeps one
colour per pool, one y scale per column, the limits as lines, UTC time with a closure's start readable,
whole-number ticks and its legend off the data."""
from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest

from fleet.burst import report as R
from fleet.burst import timeline as T

START = datetime(2026, 10, 4, 0, 0, tzinfo=timezone.utc).timestamp()
CLOSED_AT = 14 * 3600 + 47 * 60  # 14:47Z


def section(mode, *, ok, refused, failed=0, cut=0, events=(), closures=(), met=None, round_log=(), profile="auto"):
    rounds = ok + sum(refused.values()) + failed + cut
    met = met or refused
    sim = {"m@p": {"requests": rounds, "200": ok, **{c: met.get(c, 0) for c in R.REFUSALS}, "max_concurrency": 3},
           "m@q": {"requests": 0, "200": 0, "429": 0, "402": 0, "403": 0, "max_concurrency": 0}}
    return {"mode": mode, "profile": profile, "rounds": rounds, "ok": ok, "failed": failed, "cut": cut,
            "refused": {c: refused.get(c, 0) for c in R.REFUSALS}, "not_ok": rounds - ok,
            "refusals_met": {c: met.get(c, 0) for c in R.REFUSALS}, "moved": 0, "probes": 0,
            "makespan_s": 100.0 + ok, "wait_s": {"review": {"n": ok, "p50": 1.0, "p95": 2.0 + ok, "max": 9.0}},
            "starving_s": {"review": 0.0}, "cycle_tail_ms": None,
            "lag_ms": {"n": rounds, "p50": 0.1, "p99": 0.2, "max": 0.3, "driver": "normal"},
            "ledger": {"exact": True}, "counts_match": True, "simulator": sim,
            "key_closures": {"k1": [[float(a), float(b)] for a, b in closures]}, "admission_closures": [],
            "events": [list(e) for e in events], "round_log": list(round_log)}


def waited(pool, ready, started, ended=None):
    """A round_log entry of a round ready at `ready` whose work started at `started` (None: never)."""
    return {"pool": pool, "role": "review", "ready": ready, "started": started,
            "ended": ended if ended is not None else (started or ready) + 60.0}


def a_report():
    ev_p = [(t * 600.0, "m@p", 200, n) for t, n in ((1, 1), (2, 3), (3, 2), (90, 1))] + [(2.5 * 600, "m@p", 429, 3)]
    ev_q = [(t * 600.0, "m@q", 200, n) for t, n in ((100, 1), (101, 7))] + [(CLOSED_AT, "m@p", 403, 1)]
    modes = [section("none", ok=7, refused={"429": 2, "403": 1}, events=ev_p + [(CLOSED_AT, "m@p", 403, 1)],
                     closures=[(CLOSED_AT, 86400)]),
             section("cap", ok=9, refused={}, failed=1, events=ev_q[:2],  # m@q alone: first in no panel
                     # three rounds wait for m@q from 1000 s: two start at 1600 s, one is cut at 5000 s
                     round_log=[waited("m@q", 1000.0, 1600.0), waited("m@q", 1000.0, 1600.0),
                                waited("m@q", 1000.0, None, 5000.0), waited("m@p", 0.0, 0.0)]),
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


def test_every_column_shown_is_explained():
    md = R.markdown(a_report())
    names, _ = table_rows(md)
    glossary = md.split("## Columns", 1)[1].split("##", 1)[0]
    explained = re.findall(r"^- \*\*(.+?)\*\*:", glossary, re.M)
    for name in names[2:]:
        assert name.split(" avg")[0] in explained or (name in R.REFUSALS and "429 / 402 / 403" in explained), name
    assert "cut" not in explained  # left out of the table: not explained either


def test_columns_empty_for_the_trace_are_left_out_and_named():
    rep = a_report()
    names, rows = table_rows(R.markdown(rep))
    # 0 in every mode: 402, cut, moved, probes; "-" in every mode: the cycle tail
    left_out = ("402", "cut", "moved", "probes", "cycle tail avg/p95/max ms")
    assert not set(left_out) & set(names)
    assert {"429", "403", "failed", "429s met", "makespan s", "ledger exact"} <= set(names)
    assert f"Left out, 0 (or -) in every row: {', '.join(left_out)}." in R.markdown(rep)
    rep["modes"][1]["cut"] = 1  # one row not empty: the column is back, with every row's cell
    names, rows = table_rows(R.markdown(rep))
    assert "cut" in names and [row["cut"] for row in rows] == ["0", "1", "0"]


def test_the_table_and_the_json_count_rounds_one_way():
    rep = a_report()
    _, rows = table_rows(R.markdown(rep))
    for m, row in zip(rep["modes"], rows):
        cell = lambda name: int(row.get(name, 0))  # noqa: E731 - a column left out is 0 in every row
        ended = cell("ok") + sum(cell(c) for c in R.REFUSALS) + cell("failed") + cell("cut")
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


def two_profiles():
    rep = a_report()
    rep["modes"] += [dict(m, profile="pinned") for m in rep["modes"]]
    return rep


@pytest.mark.parametrize("report", [a_report(), two_profiles()], ids=["one-profile", "two-profiles"])
def test_the_console_fits_a_terminal_and_says_what_a_person_reads(report):
    text = R.console(report, "burst-report/report.md")
    lines = text.splitlines()
    assert len(lines) <= 2 + len(report["modes"]) + 3 * 2 + 1 <= 24 and max(map(len, lines)) <= 80, text
    for m in report["modes"]:
        row = next(line for line in lines if re.match(rf"\s+({m['profile']}/)?{m['mode']}\s+ok", line))
        assert f"ok {m['ok']:>4}  lost {m['not_ok']:>4}" in row and "makespan" in row and "p95 wait" in row
    assert lines[-1] == "report: burst-report/report.md"
    sentence = " ".join(line for line in lines if not line.startswith(("  ", "report:")))
    # admission 10 ok, none 7 ok (3 lost): what it bought against none and against the cap
    assert "3 more round(s) ok than none (0 lost against 3)" in sentence
    assert "than the cap's with a p95 wait of 12.0 s against 11.0 s" in sentence
    assert not any(re.search(r"\d$", line) for line in lines[1 + len(report["modes"]):-1])  # "12.0 s" kept whole
    assert sentence.count("The admission") == len({m["profile"] for m in report["modes"]})


def test_the_console_names_what_went_wrong():
    rep = a_report()
    rep["modes"][2]["ledger"] = {"exact": False}
    assert "NOT EXACT in admission" in R.console(rep, "r.md")


def test_durations_read_in_one_unit_per_column():
    assert (R.duration(87.5, 141.4), R.duration(141.4), R.duration(5400.0), R.duration(9000.0)) == \
        ("1.5 min", "2.4 min", "90.0 min", "2.5 h")
    assert R.duration(None) == "-" and R.duration(42.8) == "42.8 s"


def test_waiting_counts_rounds_ready_and_not_started():
    cap = a_report()["modes"][1]
    xs, ys = T.waiting(cap["round_log"], provider=True)["m@q"]
    at = lambda t: ys[max(i for i, x in enumerate(xs) if x <= t)]  # noqa: E731 - the step's value at t
    assert (at(999.0), at(1000.0), at(1599.0), at(1600.0), at(4999.0), at(5000.0)) == (0, 3, 3, 1, 1, 0)
    assert max(T.waiting(cap["round_log"], provider=True)["m@p"][1]) == 0  # started as it was ready
    assert set(T.waiting(cap["round_log"], provider=False)) == {"review"}  # a CPU trace: per role


@pytest.fixture
def fig():
    import matplotlib.pyplot as plt

    f = T.figure(a_report())
    yield f
    plt.close(f)


def panels(fig, label):
    return [ax for ax in fig.axes if ax.get_label() == label]


def test_rounds_waiting_are_drawn_beside_rounds_in_flight_per_pool(fig):
    flight, waiting = panels(fig, T.IN_FLIGHT), panels(fig, T.WAITING)
    assert len(flight) == len(waiting) == 3
    for left, right in zip(flight, waiting):  # beside: one row, the same time axis
        assert left.get_position().y0 == pytest.approx(right.get_position().y0)
        assert left.get_position().x1 < right.get_position().x0 and left.get_xlim() == right.get_xlim()
    cap = waiting[1]
    steps = {line.get_color(): max(line.get_ydata()) for line in cap.get_lines()}
    colour_of = {line.get_color() for ax in flight for line in ax.get_lines()
                 if line.get_drawstyle().startswith("steps") and len(line.get_xdata()) == 3}  # m@q's in flight
    assert steps[colour_of.pop()] == 3  # the pool's own colour, its three rounds waiting at once
    assert "at most 3" in cap.get_title(loc="left")


def test_one_colour_per_pool_in_every_panel(fig):
    by_pool = {}
    for ax, n in zip(panels(fig, T.IN_FLIGHT), (1, 1, 2)):
        steps = [line for line in ax.get_lines() if line.get_drawstyle().startswith("steps")]
        assert len(steps) == n
        for line in steps:
            pool = "m@q" if len(line.get_xdata()) == 3 else "m@p"
            by_pool.setdefault(pool, set()).add(line.get_color())
    assert all(len(c) == 1 for c in by_pool.values()) and by_pool["m@p"] != by_pool["m@q"]


def test_one_y_scale_per_column_whole_number_ticks_limits_drawn(fig):
    for label in (T.IN_FLIGHT, T.WAITING):
        assert len({ax.get_ylim() for ax in panels(fig, label)}) == 1
    for ax in fig.axes:
        assert all(float(t).is_integer() for t in ax.get_yticks())
    levels = {round(line.get_ydata()[0], 6) for ax in panels(fig, T.IN_FLIGHT) for line in ax.get_lines()
              if not line.get_drawstyle().startswith("steps")}
    assert {3.0, 5.0, 2.0} <= levels  # each pool's k, and the cap


def test_time_is_utc_and_the_closure_is_readable(fig):
    fig.canvas.draw()
    ticks = [t.get_text() for t in fig.axes[-1].get_xticklabels() if t.get_text()]
    assert ticks and all(t.endswith("Z") for t in ticks), ticks
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "closed 14:47Z" in notes
    assert "UTC" in fig.axes[-1].get_xlabel()


@pytest.mark.parametrize("span_s", [20, 84, 138, 170, 600, 3000, 20000, 86400])
def test_a_time_axis_of_any_span_gets_utc_ticks_without_a_warning(span_s):
    # The README's first replay (speed 60) spans ~1.4-2.3 minutes: matplotlib's date
    # locator found no interval for it and warned on the newcomer's terminal.
    import warnings
    from datetime import datetime, timezone

    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    f, ax = plt.subplots(figsize=(9, 3))
    try:
        ax.plot([mdates.date2num(datetime.fromtimestamp(START + t, timezone.utc)) for t in (0, span_s)], [0, 1])
        T._time_axis(ax, {"start": START, "horizon_s": float(span_s)}, [({"m@p": ([0, span_s], [0, 1])}, {})],
                     utc=True, ticks=6)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            f.canvas.draw()
        ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert 2 <= len(ticks) <= 7 and all(t.endswith("Z") for t in ticks), ticks
    finally:
        plt.close(f)


def test_the_legend_is_off_the_data(fig):
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    fig.canvas.draw()
    box = legend.get_window_extent()
    assert all(box.y1 <= ax.get_window_extent().y0 for ax in fig.axes)
    labels = [t.get_text() for t in legend.get_texts()]
    assert "m@p (k 3)" in labels and "m@q (k 5)" in labels and "cap" in labels


def test_renewed_closures_draw_as_one():
    assert T.merged([(50.0, 60.0), (10.0, 20.0), (20.5, 30.0), (29.0, 40.0)], gap=1.0) == [(10.0, 40.0), (50.0, 60.0)]
