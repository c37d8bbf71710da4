"""The replay report: one JSON document, a Markdown table and a PNG timeline.

`summarize(result, trace)` turns one mode's `ModeResult` into its report section;
`write(report, folder)` writes ``report.json``, ``report.md`` and ``timeline.png``;
`render(report, folder)` re-draws the Markdown and the PNG from a saved JSON (what
``fleet-burst show`` does). Times are trace seconds unless a name says ms.

Per mode: refusals (429, 402, 403) per pool and in total — every refusal the provider
answered, also those of a round the admission then ran again — rounds ok / lost (rounds
that did not end ok: refused past their limit, failed or cut) / failed / cut,
rounds moved to an alternative (the pool a round reached at the simulator is not the one
it asked for; ``admission_moved`` is the fleet admission's own count; ``delegated`` the rounds it started
as delegated, submitted with their parent's unit id), probes (the fleet
admission's bulkheads: probes it let through), makespan (first arrival to last end), wait
p50/p95/max per lane (from ready — released, and every arrival it comes
``after`` ended — to the start of the work), starving time per lane (from a
402/403 refusal or a cut round in the lane to its next clean round, or to the end),
cycle tail avg/p95/max (ms, first arrival of a cycle to its last end), the scheduler's
lag (real ms from when an arrival was due to when the driver handed it over: called
``fleet.submit`` for it or queued it behind the cap; ``driver`` names the
scheduling class the driver thread ran in, ``realtime`` or ``normal``), the ledger check, and the simulator's own counts with
``counts_match`` (the report's per-pool counts equal the simulator's).
"""
from __future__ import annotations

import collections
import json
import math
import os

from fleet.host.files import read_regular

REPORT_VERSION = 1
MAX_REPORT_BYTES = 1 << 30
REFUSALS = ("429", "402", "403")


class ReportError(Exception):
    """A saved report that cannot be read."""


def pct(values, q: float) -> float | None:
    """The q-quantile (0..1) by nearest rank; None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _stats(values) -> dict:
    return {"n": len(values), "p50": pct(values, 0.5), "p95": pct(values, 0.95),
            "max": max(values) if values else None}


def starving_time(rounds, end: float) -> float:
    """Seconds from a 402/403 refusal or a cut round to the lane's next clean round (or `end`)."""
    total, since = 0.0, None
    for r in sorted(rounds, key=lambda r: (r["ended"] if r["ended"] is not None else end)):
        t = r["ended"] if r["ended"] is not None else end
        if r["status"] in ("402", "403", "cut"):
            if since is None:
                since = t
        elif r["status"] == "ok" and since is not None:
            total += t - since
            since = None
    if since is not None:
        total += max(0.0, end - since)
    return total


def summarize(result, trace) -> dict:
    """One mode's report section (see the module docstring)."""
    rounds = [r.to_json() for r in result.rounds]
    ended = [r["ended"] for r in rounds if r["ended"] is not None]
    first = min((r["t"] for r in rounds), default=0.0)
    makespan = (max(ended) - first) if ended else 0.0
    statuses = collections.Counter(r["status"] for r in rounds)
    per_pool: dict = collections.defaultdict(lambda: {"requests": 0, "200": 0, "429": 0, "402": 0, "403": 0})
    for r in rounds:
        for pool, status in r.get("tries") or ():
            row = per_pool[pool]
            row["requests"] += 1
            row[str(status)] += 1
    sim = {pool: {k: v for k, v in c.items() if k != "max_concurrency"} for pool, c in result.simulator.items()}
    reported = {pool: dict(per_pool.get(pool, {"requests": 0, "200": 0, "429": 0, "402": 0, "403": 0})) for pool in sim}
    lanes = collections.defaultdict(list)
    for r in rounds:
        lanes[r["lane"] or "-"].append(r)
    end = max(ended + [trace.horizon_s if statuses.get("cut") else 0.0]) if ended else trace.horizon_s
    wait = {lane: _stats([r["started"] - r["ready"] for r in rs if r["started"] is not None and r["ready"] is not None])
            for lane, rs in lanes.items()}
    starving = {lane: starving_time(rs, end) for lane, rs in lanes.items()}
    cycles = collections.defaultdict(list)
    for r in rounds:
        if r["cycle"] is not None:
            cycles[r["cycle"]].append(r)
    tails = [1000.0 * (max(x["ended"] for x in rs) - min(x["t"] for x in rs)) for rs in cycles.values()
             if all(x["ended"] is not None for x in rs)]
    return {
        "mode": result.mode, "profile": result.profile, "rounds": len(rounds),
        # how rounds ended: ok + refused (ended on a refusal) + failed + cut = rounds
        "ok": statuses.get("ok", 0), "failed": statuses.get("failed", 0), "cut": statuses.get("cut", 0),
        "refused": {code: statuses.get(code, 0) for code in REFUSALS},
        "not_ok": len(rounds) - statuses.get("ok", 0),
        # refusals the provider answered, whatever the round did next (a round may meet one and still end ok)
        "refusals_met": {code: sum(c.get(code, 0) for c in result.simulator.values()) for code in REFUSALS},
        "moved": sum(1 for r in rounds if r["moved"]),
        "probes": result.probes if result.probes is not None else sum(1 for r in rounds if r["probe"]),
        "admission_moved": result.admission_moved, "delegated": result.delegated,
        "makespan_s": makespan, "wall_s": result.wall_s,
        "wait_s": wait, "starving_s": starving,
        "cycle_tail_ms": None if not tails else {"n": len(tails), "avg": sum(tails) / len(tails),
                                                   "p95": pct(tails, 0.95), "max": max(tails)},
        "lag_ms": {"n": len(result.lag_ms), "p50": pct(result.lag_ms, 0.5), "p99": pct(result.lag_ms, 0.99),
                   "max": max(result.lag_ms) if result.lag_ms else None, "driver": result.driver_class},
        "ledger": result.ledger_check(),
        "simulator": result.simulator, "pools": reported, "counts_match": reported == sim,
        "key_closures": {k: [list(x) for x in v] for k, v in result.key_closures.items()},
        "admission_closures": [
            {"provider": c["provider"], "credential": c["credential"], "cause": c["cause"],
             "from": c["since"] - trace.header.start, "until": c["until"] - trace.header.start}
            for c in result.admission_closures],
        "events": [list(e) for e in result.events],
        "round_log": rounds,
    }


def build(trace, sections: list[dict], *, speed: float, seed: int, fleet_name: str, cap: int | None = None) -> dict:
    """The report: `sections` (one per profile x mode) and what they were run from (`cap`: the
    cap mode's limit, None for each pool's k; ``start``: the UTC epoch second trace time 0 stands for)."""
    return {"version": REPORT_VERSION, "trace": trace.header.name, "trace_path": trace.path, "speed": speed,
            "seed": seed, "fleet": fleet_name, "arrivals": len(trace.arrivals), "horizon_s": trace.horizon_s,
            "start": trace.header.start, "pools_k": {p.name: p.k for p in trace.header.pools}, "cap": cap,
            "modes": sections}


def _fmt(v, digits=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


COLUMNS = (
    ("ok", "rounds that ended with their answer (a round the admission held or re-admitted after a "
           "refusal counts here once it is answered)"),
    ("429 / 402 / 403", "rounds that ended on that refusal (too many in flight / out of credit / key "
                        "limit); ok + these + failed + cut = the rounds of the trace"),
    ("failed", "rounds that ended another way (an error, refused at submit)"),
    ("cut", "rounds still waiting at the trace's horizon, cancelled"),
    ("429s met", "429 answers the provider gave in the mode, also to rounds that then ended ok "
                 "(the simulator's own count)"),
    ("moved", "rounds that ran on a declared alternative, not the pool they asked for"),
    ("probes", "rounds the admission let through to test a closed or backed-off pool"),
    ("makespan s", "trace seconds from the first arrival to the last round's end"),
    ("wait p95 s", "95th percentile over rounds of trace seconds from ready (released, and what it "
                   "comes after ended) to the start of its work"),
    ("lag p99 ms", "real milliseconds from when an arrival was due to when the replay handed it over "
                   "(the replay's own punctuality, not the fleet's)"),
    ("cycle tail", "ms from a cycle's first arrival to its last end (solve-cycle traces)"),
    ("ledger exact", "every submitted unit got exactly one outcome in the fleet's ledger"),
    ("counts = simulator", "the per-pool counts of this report equal the simulator's own"),
    ("starving s", "per lane: trace seconds from a 402/403 or a cut round to the lane's next ok round"),
)

#: What the same trace and seed give again, and what the host's timing decides (`markdown` says so).
DETERMINISTIC = ("the arrivals (count, instants, lanes, routes, what comes after what), each round's "
                 "latency draw (seeded by seed, round id and attempt), the pools' limits and the cap, the key "
                 "limits' instants, and that the ledger is exact and the counts match the simulator's")
TIMING = ("how many rounds are in flight at the instant a request lands, so which rounds meet a 429 and "
          "the load factor on their latency, and so ok / refused / moved / probes, makespan, waits, "
          "starving time, cycle tails and the replay's lag; run it again to see the spread")


def _wait_p95(m) -> float | None:
    """The worst lane's p95 wait of a section."""
    values = [w["p95"] for w in m["wait_s"].values() if w["p95"] is not None]
    return max(values) if values else None


def _refused(m) -> int:
    return sum(m["refused"].values())


def _met(m) -> dict:
    """The refusals the provider answered (older reports: the rounds that ended on one)."""
    return m.get("refusals_met") or m["refused"]


def verdict(m: dict, base: dict | None) -> str:
    """One line: what a mode cost (refusals met, waits, probes) and bought (rounds ok, makespan),
    against `base` (the profile's first mode) when it is another mode."""
    met = _met(m)
    refusals = ", ".join(f"{met[c]} x {c}" for c in REFUSALS if met.get(c)) or "no refusals"
    p95 = _wait_p95(m)
    line = (f"- **{m['profile']} / {m['mode']}**: bought {m['ok']} of {m['rounds']} rounds ok in "
            f"{_fmt(m['makespan_s'])} s; cost {refusals} met, {_refused(m)} round(s) lost to a refusal, "
            f"{m['failed']} failed, {m['cut']} cut, wait p95 {_fmt(p95)} s")
    if m.get("probes"):
        line += f", {m['probes']} probe(s)"
    if m.get("moved"):
        line += f", {m['moved']} moved"
    if base is not None and base is not m:
        dp = None if p95 is None or _wait_p95(base) is None else p95 - _wait_p95(base)
        line += (f". Against {base['mode']}: {m['ok'] - base['ok']:+d} ok, makespan "
                 f"{m['makespan_s'] - base['makespan_s']:+.1f} s, wait p95 {'-' if dp is None else f'{dp:+.1f}'} s")
    return line + "."


def markdown(report: dict) -> str:
    """The comparison table (one row per profile x mode), the per-lane waits, what each column
    means, what a rerun gives again, and one line per mode of what it cost and bought."""
    out = [f"# fleet-burst: {report['trace']} ({report['arrivals']} arrivals, speed {report['speed']:g}, "
           f"seed {report['seed']})", "",
           "| profile | mode | ok | 429 | 402 | 403 | failed | cut | 429s met | moved | probes | makespan s | "
           "wait p95 s | lag p99 ms | cycle tail avg/p95/max ms | ledger exact | counts = simulator |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in report["modes"]:
        tail = m["cycle_tail_ms"]
        tail_text = "-" if not tail else f"{tail['avg']:.0f} / {tail['p95']:.0f} / {tail['max']:.0f}"
        out.append(f"| {m['profile']} | {m['mode']} | {m['ok']} | {m['refused']['429']} | {m['refused']['402']} | "
                   f"{m['refused']['403']} | {m['failed']} | {m['cut']} | {_met(m)['429']} | {m['moved']} | "
                   f"{m['probes']} | {_fmt(m['makespan_s'])} | {_fmt(_wait_p95(m))} | {_fmt(m['lag_ms']['p99'], 2)} | "
                   f"{tail_text} | {'yes' if m['ledger']['exact'] else 'NO'} | {'yes' if m['counts_match'] else 'NO'} |")
    out += ["", "| profile | mode | lane | wait p50 s | wait p95 s | wait max s | starving s |",
            "|---|---|---|---|---|---|---|"]
    for m in report["modes"]:
        for lane, w in sorted(m["wait_s"].items()):
            out.append(f"| {m['profile']} | {m['mode']} | {lane} | {_fmt(w['p50'])} | {_fmt(w['p95'])} | "
                       f"{_fmt(w['max'])} | {_fmt(m['starving_s'].get(lane, 0.0))} |")
    out += ["", "## Columns", ""] + [f"- **{name}**: {text}." for name, text in COLUMNS]
    out += ["", "## Same trace, same seed", "",
            f"- Deterministic: {DETERMINISTIC}.", f"- Depends on timing: {TIMING}.",
            "", "## What each mode cost and bought", ""]
    first: dict = {}
    for m in report["modes"]:
        first.setdefault(m["profile"], m)
    out += [verdict(m, first[m["profile"]]) for m in report["modes"]]
    return "\n".join(out) + "\n"


def _in_flight_by_role(round_log) -> dict:
    """{role: (times, units in flight)} from the rounds' start and end instants."""
    steps = collections.defaultdict(list)
    for r in round_log:
        if r["started"] is not None and r["ended"] is not None:
            steps[r["role"]] += [(r["started"], 1), (r["ended"], -1)]
    out = {}
    for role, ev in steps.items():
        xs, ys, n = [0.0], [0], 0
        for t, d in sorted(ev):
            n += d
            xs.append(t)
            ys.append(n)
        out[role] = (xs, ys)
    return out


REFUSAL_MARKS = {429: ("x", "tab:red", "429 (too many in flight)"), 402: ("s", "tab:purple", "402 (out of credit)"),
                 403: ("v", "black", "403 (key limit)")}
POOL_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")


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
    """The timeline's matplotlib figure: one panel per profile x mode on one time axis and one y scale; in flight per pool
    (one colour per pool in every panel, from the simulator; per role for a CPU trace), each
    pool's limit k dashed in its colour and the cap mode's cap dotted, refusals as marks, closures
    as hatched spans with their start written on them (at the provider: orange; by the fleet's
    admission: blue). Time is UTC when the report knows the trace's start (its header's), else
    trace seconds. Legends sit below the panels, off the data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    modes = report["modes"]
    horizon = report["horizon_s"]
    utc = report.get("start") is not None
    if utc:
        from datetime import datetime, timezone

        def x(t):
            return mdates.date2num(datetime.fromtimestamp(report["start"] + t, timezone.utc))
    else:
        def x(t):
            return t
    drawn = [_series(m) for m in modes]
    names = sorted({name for series, _ in drawn for name in series} | set(report.get("pools_k", {})))
    colour = {name: POOL_COLOURS[i % len(POOL_COLOURS)] for i, name in enumerate(names)}
    fig, axes = plt.subplots(len(modes), 1, figsize=(12, 2.6 * max(1, len(modes)) + 1.4), squeeze=False,
                             sharex=True, sharey=True)
    used_marks, used_spans, cap_drawn = set(), set(), False
    top = _y_top(report, drawn)
    provider = any(m["events"] for m in modes) or bool(report.get("pools_k"))  # else a CPU trace: roles
    for ax, m, (series, refusals) in zip(axes[:, 0], modes, drawn):
        spans = [(a, b, "provider") for a, b in merged([tuple(x) for v in m["key_closures"].values() for x in v],
                                                       horizon / 200)]
        spans += [(a, b, "admission") for a, b in merged([(c["from"], c["until"]) for c in m["admission_closures"]],
                                                         horizon / 200)]
        for a, b, who in spans:
            style = {"provider": ("tab:orange", "///"), "admission": ("tab:blue", "\\\\\\")}[who]
            ax.axvspan(x(a), x(min(b, horizon)), facecolor=style[0], alpha=0.12, hatch=style[1],
                       edgecolor=style[0], lw=0)
            ax.annotate(f"closed {_utc(report, a) if utc else f'{a:.0f} s'}", (x(a), 1.0),
                        xycoords=("data", "axes fraction"), xytext=(2, -10), textcoords="offset points",
                        fontsize=7, color=style[0])
            used_spans.add(who)
        for name, (xs, ys) in sorted(series.items()):
            ax.step([x(t) for t in xs], ys, where="post", lw=1.0, color=colour[name])
            k = report.get("pools_k", {}).get(name)
            if k is not None and k <= top:  # a limit far above every count would flatten them: the legend gives it
                ax.axhline(k, color=colour[name], ls="--", lw=0.8, alpha=0.8)
        if m["mode"] == "cap" and series and report.get("pools_k"):
            caps = {report["cap"]} if report.get("cap") else set(report["pools_k"].values())
            for cap in caps:
                ax.axhline(cap, color="black", ls=":", lw=1.2)
            cap_drawn = True
        for status, pts in sorted(refusals.items()):
            shape, mark_colour, _label = REFUSAL_MARKS.get(status, ("o", "gray", str(status)))
            ax.scatter([x(p[0]) for p in pts], [p[1] for p in pts], marker=shape, color=mark_colour, s=14, zorder=3,
                       alpha=0.7, lw=0.8)
            used_marks.add(status)
        refused = (f"ended 429 {m['refused']['429']}, 402 {m['refused']['402']}, 403 {m['refused']['403']}, "
                   if provider else "")
        ax.set_title(f"{m['profile']} / {m['mode']}: ok {m['ok']} of {m['rounds']}; {refused}failed {m['failed']}, "
                     f"cut {m['cut']}" + (f"; moved {m['moved']}" if provider else ""), fontsize=9, loc="left")
        ax.set_ylabel("in flight")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, top)
        ax.grid(axis="x", color="0.9", lw=0.5)
    bottom = axes[-1, 0]
    if utc:
        locator = mdates.AutoDateLocator(minticks=6, maxticks=14, tz=mdates.UTC)
        bottom.xaxis.set_major_locator(locator)
        span = max([t for series, _ in drawn for xs, _ys in series.values() for t in xs] or [horizon])
        bottom.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%SZ" if span < 3 * 3600 else "%H:%MZ",
                                                              tz=mdates.UTC))
        if span >= 6 * 3600:
            bottom.xaxis.set_minor_locator(mdates.HourLocator(tz=mdates.UTC))
        day = _utc_day(report)
        bottom.set_xlabel(f"time, UTC ({day})")
    else:
        bottom.set_xlabel("trace seconds")
    ks = report.get("pools_k", {})
    handles = [Line2D([], [], color=colour[n], lw=1.5, label=f"{n} (k {ks[n]})" if n in ks else n) for n in names]
    if report.get("pools_k"):
        handles.append(Line2D([], [], color="gray", ls="--", lw=0.8, label="pool limit k (its colour)"))
    if cap_drawn:
        handles.append(Line2D([], [], color="black", ls=":", lw=1.2, label="cap"))
    handles += [Line2D([], [], ls="", marker=REFUSAL_MARKS.get(s, ("o", "gray", str(s)))[0],
                       color=REFUSAL_MARKS.get(s, ("o", "gray", str(s)))[1], label=REFUSAL_MARKS.get(s, ("", "", str(s)))[2])
                for s in sorted(used_marks)]
    handles += [Patch(facecolor={"provider": "tab:orange", "admission": "tab:blue"}[w], alpha=0.25,
                      hatch={"provider": "///", "admission": "\\\\\\"}[w],
                      label={"provider": "key closed at the provider", "admission": "closed by the admission"}[w])
                for w in sorted(used_spans)]
    what = "rounds in flight per pool" if provider else "units in flight per role"
    fig.suptitle(f"fleet-burst {report['trace']}: {what}", fontsize=11)
    fig.legend(handles=handles, loc="lower center", ncol=min(4, max(1, len(handles))), fontsize=8, frameon=False)
    rows = -(-len(handles) // 4)
    fig.tight_layout(rect=(0, 0.03 + 0.035 * rows * 4.2 / (2.6 * max(1, len(modes)) + 1.4), 1, 1))
    return fig


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
    """The one y scale: the highest count drawn, or the cap or a pool limit when they are not far
    above it (at most twice), with room for the closure notes."""
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


def write(report: dict, folder: str) -> dict:
    """Write report.json, report.md and timeline.png into `folder`; returns their paths."""
    os.makedirs(folder, exist_ok=True)
    paths = {"json": os.path.join(folder, "report.json")}
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    paths.update(render(report, folder))
    return paths


def render(report: dict, folder: str) -> dict:
    paths = {"md": os.path.join(folder, "report.md"), "png": os.path.join(folder, "timeline.png")}
    with open(paths["md"], "w", encoding="utf-8") as f:
        f.write(markdown(report))
    timeline(report, paths["png"])
    return paths


def load(path: str) -> dict:
    """A saved report (a report.json, or the folder holding one); ReportError if unreadable."""
    if os.path.isdir(path):
        path = os.path.join(path, "report.json")
    try:
        data = read_regular(path, MAX_REPORT_BYTES)
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror}") from None
    except ValueError as exc:
        raise ReportError(f"{path}: cannot read: {exc}") from None
    try:
        report = json.loads(data)
    except RecursionError:
        raise ReportError(f"{path}: not JSON: nested too deeply") from None
    except ValueError as exc:
        raise ReportError(f"{path}: not JSON: {exc}") from None
    if not isinstance(report, dict) or report.get("version") != REPORT_VERSION or not isinstance(report.get("modes"), list):
        raise ReportError(f"{path}: not a fleet-burst report (version {REPORT_VERSION})")
    return report
