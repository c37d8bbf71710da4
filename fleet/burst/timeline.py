"""The replay report's timeline: what was in flight and what was waiting, per pool, per mode.

`figure(report)` draws one row per profile x mode and two panels in each, on one time axis:
on the left the rounds in flight per pool (from the simulator's events; per role for a CPU
trace), each pool's limit k dashed in its colour and the cap mode's cap dotted, refusals as
marks, closures as hatched spans with their start written on them (at the provider: orange;
by the fleet's admission: blue); on the right the rounds waiting per pool (from the round
log: ready, and its work not started yet), so what a mode's waiting costs stands beside
what it keeps in flight. Each column has one y scale over every mode; one colour per pool
in every panel. Time is UTC when the report knows the trace's start (its header's), else
trace seconds. Legends sit below the panels, off the data. `timeline(report, path)` writes
the PNG.
"""
from __future__ import annotations

import collections

REFUSAL_MARKS = {429: ("x", "tab:red", "429 (too many in flight)"), 402: ("s", "tab:purple", "402 (out of credit)"),
                 403: ("v", "black", "403 (key limit)")}
POOL_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")
#: The panels' labels (`Axes.get_label()`), one per column.
IN_FLIGHT, WAITING = "in flight", "waiting"


def _steps(intervals) -> tuple[list, list]:
    """(times, how many intervals are open) from `intervals` [(from, until)], from 0 at time 0."""
    events = sorted(ev for a, b in intervals for ev in ((a, 1), (max(a, b), -1)))  # an end before a start at one instant
    xs, ys, n = [0.0], [0], 0
    for t, d in events:
        n += d
        xs.append(t)
        ys.append(n)
    return xs, ys


def _in_flight_by_role(round_log) -> dict:
    """{role: (times, units in flight)} from the rounds' start and end instants."""
    spans = collections.defaultdict(list)
    for r in round_log:
        if r["started"] is not None and r["ended"] is not None:
            spans[r["role"]].append((r["started"], r["ended"]))
    return {role: _steps(v) for role, v in spans.items()}


def waiting(round_log, *, provider: bool) -> dict:
    """{pool: (times, rounds waiting)}: a round waits from ready until its work starts, or until it
    ends when it never started (cut, failed). Its pool is the one it ran on (a moved round's
    alternative), else the one it asked for. A CPU trace's rounds (`provider` False) wait per role."""
    spans = collections.defaultdict(list)
    for r in round_log:
        until = r["started"] if r["started"] is not None else r["ended"]
        if r["ready"] is None or until is None:
            continue
        name = r["pool"] if provider else r["role"]
        if name is not None:
            spans[name].append((r["ready"], until))
    return {name: _steps(v) for name, v in spans.items()}


def _series(m) -> tuple[dict, dict]:
    """({pool or role: (times, in flight)}, {status: [(t, in flight)]}) of one section."""
    series = collections.defaultdict(lambda: ([0.0], [0]))
    refusals = collections.defaultdict(list)
    for t, pool, status, in_flight in m["events"]:
        if status in (0, 200):
            xs, ys = series[pool]
            xs.append(t)
            ys.append(in_flight)
        else:
            refusals[status].append((t, in_flight))
    if not series:  # a CPU trace: units in flight per role, from the round log
        series.update(_in_flight_by_role(m["round_log"]))
    return dict(series), dict(refusals)


def _utc(report, t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(report["start"] + t, timezone.utc).strftime("%H:%MZ")


def timeline(report: dict, path: str) -> None:
    """Draw `figure(report)` into the PNG at `path`."""
    import matplotlib.pyplot as plt

    fig = figure(report)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def figure(report: dict):
    """The timeline's matplotlib figure (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    modes = report["modes"]
    utc = report.get("start") is not None
    if utc:
        from datetime import datetime, timezone

        def x(t):
            return mdates.date2num(datetime.fromtimestamp(report["start"] + t, timezone.utc))
    else:
        def x(t):
            return t
    provider = any(m["events"] for m in modes) or bool(report.get("pools_k"))  # else a CPU trace: roles
    drawn = [_series(m) for m in modes]
    waits = [waiting(m["round_log"], provider=provider) for m in modes]
    names = sorted({name for series, _ in drawn for name in series} | {name for w in waits for name in w}
                   | set(report.get("pools_k", {})))
    colour = {name: POOL_COLOURS[i % len(POOL_COLOURS)] for i, name in enumerate(names)}
    height = 2.6 * max(1, len(modes)) + 1.4
    # each column its own x axis (its own ticks: the narrower one takes fewer), both over one span
    fig, axes = plt.subplots(len(modes), 2, figsize=(15, height), squeeze=False, sharex="col",
                             gridspec_kw={"width_ratios": (3, 2)})
    used = {"marks": set(), "spans": set(), "cap": False}
    top = _y_top(report, drawn)
    wait_top = max([y for w in waits for _xs, ys in w.values() for y in ys] or [1]) * 1.15 + 0.5
    for row, m, (series, refusals), waits_of in zip(axes, modes, drawn, waits):
        left, right = row
        _in_flight_panel(left, report, m, series, refusals, x=x, colour=colour, top=top, used=used, utc=utc)
        refused = (f"ended 429 {m['refused']['429']}, 402 {m['refused']['402']}, 403 {m['refused']['403']}, "
                   if provider else "")
        left.set_title(f"{m['profile']} / {m['mode']}: ok {m['ok']} of {m['rounds']}; {refused}failed {m['failed']}, "
                       f"cut {m['cut']}" + (f"; moved {m['moved']}" if provider else ""), fontsize=9, loc="left")
        for name, (xs, ys) in sorted(waits_of.items()):
            right.step([x(t) for t in xs], ys, where="post", lw=1.0, color=colour[name])
        right.set_label(WAITING)
        right.set_title(f"waiting (ready, not started): at most {max((max(ys) for _xs, ys in waits_of.values()), default=0)}",
                        fontsize=9, loc="left")
        right.set_ylabel("waiting")
        right.set_ylim(0, wait_top)
        for ax in row:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(axis="x", color="0.9", lw=0.5)
    left, right = axes[-1]
    right.set_xlim(left.get_xlim())
    for bottom, ticks in ((left, 10), (right, 6)):
        _time_axis(bottom, report, drawn, utc=utc, ticks=ticks)
    rows = -(-_legend(fig, report, names, colour, used, provider=provider) // 4)
    fig.tight_layout(rect=(0, 0.03 + 0.035 * rows * 4.2 / height, 1, 1))
    return fig


def _in_flight_panel(ax, report, m, series, refusals, *, x, colour, top, used, utc) -> None:
    horizon = report["horizon_s"]
    ax.set_label(IN_FLIGHT)
    spans = [(a, b, "provider") for a, b in merged([tuple(v) for c in m["key_closures"].values() for v in c],
                                                   horizon / 200)]
    spans += [(a, b, "admission") for a, b in merged([(c["from"], c["until"]) for c in m["admission_closures"]],
                                                     horizon / 200)]
    for a, b, who in spans:
        style = {"provider": ("tab:orange", "///"), "admission": ("tab:blue", "\\\\\\")}[who]
        ax.axvspan(x(a), x(min(b, horizon)), facecolor=style[0], alpha=0.12, hatch=style[1], edgecolor=style[0], lw=0)
        ax.annotate(f"closed {_utc(report, a) if utc else f'{a:.0f} s'}", (x(a), 1.0),
                    xycoords=("data", "axes fraction"), xytext=(2, -10), textcoords="offset points",
                    fontsize=7, color=style[0])
        used["spans"].add(who)
    for name, (xs, ys) in sorted(series.items()):
        ax.step([x(t) for t in xs], ys, where="post", lw=1.0, color=colour[name])
        k = report.get("pools_k", {}).get(name)
        if k is not None and k <= top:  # a limit far above every count would flatten them: the legend gives it
            ax.axhline(k, color=colour[name], ls="--", lw=0.8, alpha=0.8)
    if m["mode"] == "cap" and series and report.get("pools_k"):
        for cap in ({report["cap"]} if report.get("cap") else set(report["pools_k"].values())):
            ax.axhline(cap, color="black", ls=":", lw=1.2)
        used["cap"] = True
    for status, pts in sorted(refusals.items()):
        shape, mark_colour, _label = REFUSAL_MARKS.get(status, ("o", "gray", str(status)))
        ax.scatter([x(p[0]) for p in pts], [p[1] for p in pts], marker=shape, color=mark_colour, s=14, zorder=3,
                   alpha=0.7, lw=0.8)
        used["marks"].add(status)
    ax.set_ylabel("in flight")
    ax.set_ylim(0, top)


def _time_axis(ax, report, drawn, *, utc, ticks) -> None:
    import matplotlib.dates as mdates

    if not utc:
        ax.set_xlabel("trace seconds")
        return
    locator = mdates.AutoDateLocator(minticks=3, maxticks=ticks, tz=mdates.UTC)
    # A span of two or three minutes has too many seconds for its steps of up to 30 s and
    # too few minutes for its minute steps: matplotlib warned on stderr, as it fell back
    # to 30 s (the README's first replay, at speed 60). Whole minutes, counted in seconds:
    locator.intervald[mdates.SECONDLY] = [*locator.intervald[mdates.SECONDLY], 60, 120]
    ax.xaxis.set_major_locator(locator)
    span = max([t for series, _ in drawn for xs, _ys in series.values() for t in xs] or [report["horizon_s"]])
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%SZ" if span < 3 * 3600 else "%H:%MZ", tz=mdates.UTC))
    if span >= 6 * 3600:
        ax.xaxis.set_minor_locator(mdates.HourLocator(tz=mdates.UTC))
    ax.set_xlabel(f"time, UTC ({_utc_day(report)})")


def _legend(fig, report, names, colour, used, *, provider) -> int:
    """The legend below the panels and the title; returns how many entries it has."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ks = report.get("pools_k", {})
    handles = [Line2D([], [], color=colour[n], lw=1.5, label=f"{n} (k {ks[n]})" if n in ks else n) for n in names]
    if ks:
        handles.append(Line2D([], [], color="gray", ls="--", lw=0.8, label="pool limit k (its colour)"))
    if used["cap"]:
        handles.append(Line2D([], [], color="black", ls=":", lw=1.2, label="cap"))
    handles += [Line2D([], [], ls="", marker=REFUSAL_MARKS.get(s, ("o", "gray", str(s)))[0],
                       color=REFUSAL_MARKS.get(s, ("o", "gray", str(s)))[1], label=REFUSAL_MARKS.get(s, ("", "", str(s)))[2])
                for s in sorted(used["marks"])]
    handles += [Patch(facecolor={"provider": "tab:orange", "admission": "tab:blue"}[w], alpha=0.25,
                      hatch={"provider": "///", "admission": "\\\\\\"}[w],
                      label={"provider": "key closed at the provider", "admission": "closed by the admission"}[w])
                for w in sorted(used["spans"])]
    what = "rounds in flight and waiting, per pool" if provider else "units in flight and waiting, per role"
    fig.suptitle(f"fleet-burst {report['trace']}: {what}", fontsize=11)
    fig.legend(handles=handles, loc="lower center", ncol=min(4, max(1, len(handles))), fontsize=8, frameon=False)
    return len(handles)


def merged(spans, gap: float) -> list[tuple[float, float]]:
    """`spans` (from, until) as their union, spans less than `gap` apart joined: a closure the
    admission renewed after each probe is one closure to the eye."""
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _y_top(report, drawn) -> float:
    """The in-flight column's one y scale: the highest count drawn, or the cap or a pool limit
    when they are not far above it (at most twice), with room for the closure notes."""
    counts = [y for series, refusals in drawn for _xs, ys in series.values() for y in ys]
    counts += [p[1] for _series_, refusals in drawn for pts in refusals.values() for p in pts]
    high = max(counts or [1])
    limits = [v for v in list(report.get("pools_k", {}).values()) + [report.get("cap") or 0] if v and v <= 2 * high]
    return max([high] + limits) * 1.15 + 0.5


def _utc_day(report) -> str:
    from datetime import datetime, timezone

    first = datetime.fromtimestamp(report["start"], timezone.utc)
    last = datetime.fromtimestamp(report["start"] + report["horizon_s"], timezone.utc)
    day = first.strftime("%Y-%m-%d")
    return day if first.date() == last.date() else f"{day} to {last.strftime('%Y-%m-%d')}"
