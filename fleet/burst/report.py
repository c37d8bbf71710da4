"""The replay report: one JSON document, a Markdown table and a PNG timeline.

`summarize(result, trace)` turns one mode's `ModeResult` into its report section;
`write(report, folder)` writes ``report.json``, ``report.md`` and ``timeline.png``;
`render(report, folder)` re-draws the Markdown and the PNG from a saved JSON (what
``fleet-burst show`` does). Times are trace seconds unless a name says ms.

Per mode: refusals (429, 402, 403) per pool and in total, rounds ok / failed / cut,
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
        if r["pool"] is None or r["submitted"] is None or r["status"] in ("failed", "cut"):
            continue
        row = per_pool[r["pool"]]
        row["requests"] += 1
        row["200" if r["status"] == "ok" else r["status"]] += 1
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
        "ok": statuses.get("ok", 0), "failed": statuses.get("failed", 0), "cut": statuses.get("cut", 0),
        "refused": {code: statuses.get(code, 0) for code in REFUSALS},
        "failed_or_cut": sum(statuses.get(k, 0) for k in ("failed", "cut") + REFUSALS),
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


def build(trace, sections: list[dict], *, speed: float, seed: int, fleet_name: str) -> dict:
    return {"version": REPORT_VERSION, "trace": trace.header.name, "trace_path": trace.path, "speed": speed,
            "seed": seed, "fleet": fleet_name, "arrivals": len(trace.arrivals), "horizon_s": trace.horizon_s,
            "modes": sections}


def _fmt(v, digits=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def markdown(report: dict) -> str:
    """The comparison table (one row per profile x mode) and the per-lane waits."""
    out = [f"# fleet-burst: {report['trace']} ({report['arrivals']} arrivals, speed {report['speed']:g}, "
           f"seed {report['seed']})", "",
           "| profile | mode | ok | 429 | 402 | 403 | failed | cut | moved | probes | makespan s | "
           "lag p99 ms | cycle tail avg/p95/max ms | ledger exact | counts = simulator |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in report["modes"]:
        tail = m["cycle_tail_ms"]
        tail_text = "-" if not tail else f"{tail['avg']:.0f} / {tail['p95']:.0f} / {tail['max']:.0f}"
        out.append(f"| {m['profile']} | {m['mode']} | {m['ok']} | {m['refused']['429']} | {m['refused']['402']} | "
                   f"{m['refused']['403']} | {m['failed']} | {m['cut']} | {m['moved']} | {m['probes']} | "
                   f"{_fmt(m['makespan_s'])} | {_fmt(m['lag_ms']['p99'], 2)} | {tail_text} | "
                   f"{'yes' if m['ledger']['exact'] else 'NO'} | {'yes' if m['counts_match'] else 'NO'} |")
    out += ["", "| profile | mode | lane | wait p50 s | wait p95 s | wait max s | starving s |",
            "|---|---|---|---|---|---|---|"]
    for m in report["modes"]:
        for lane, w in sorted(m["wait_s"].items()):
            out.append(f"| {m['profile']} | {m['mode']} | {lane} | {_fmt(w['p50'])} | {_fmt(w['p95'])} | "
                       f"{_fmt(w['max'])} | {_fmt(m['starving_s'].get(lane, 0.0))} |")
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


def timeline(report: dict, path: str) -> None:
    """The PNG: one panel per profile x mode; in-flight per pool over time (from the simulator),
    refusals as marks, key closures (provider side) and admission closures shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = report["modes"]
    fig, axes = plt.subplots(len(modes), 1, figsize=(11, 2.8 * max(1, len(modes))), squeeze=False, sharex=True)
    marks = {429: ("x", "tab:red"), 402: ("s", "tab:purple"), 403: ("v", "black")}
    for ax, m in zip(axes[:, 0], modes):
        for cred, spans in m["key_closures"].items():
            for a, b in spans:
                ax.axvspan(a, min(b, report["horizon_s"]), color="tab:orange", alpha=0.15, lw=0)
        for c in m["admission_closures"]:
            ax.axvspan(c["from"], min(c["until"], report["horizon_s"]), color="tab:blue", alpha=0.10, lw=0)
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
        for pool, (xs, ys) in sorted(series.items()):
            ax.step(xs, ys, where="post", lw=1.0, label=pool)
        for status, pts in refusals.items():
            shape, color = marks.get(status, ("o", "gray"))
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=shape, color=color, s=14,
                       label=f"{status}", zorder=3)
        ax.set_title(f"{m['profile']} / {m['mode']}: 429 {m['refused']['429']}, 402 {m['refused']['402']}, "
                     f"403 {m['refused']['403']}, cut {m['cut']}, moved {m['moved']}", fontsize=9)
        ax.set_ylabel("in flight")
        if series or refusals:
            ax.legend(fontsize=7, loc="upper right", ncol=3)
    axes[-1, 0].set_xlabel("trace seconds (orange: key closed at the provider; blue: closed by the admission)")
    fig.suptitle(f"fleet-burst {report['trace']}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


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
    from .trace import read_regular

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
