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

from fleet.burst.timeline import timeline
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


def _tail(m) -> str:
    tail = m["cycle_tail_ms"]
    return "-" if not tail else f"{tail['avg']:.0f} / {tail['p95']:.0f} / {tail['max']:.0f}"


#: The comparison table's columns: (header, its entry in COLUMNS, its cell for a section, whether
#: it is left out when empty -- 0 or "-" -- in every row of the report).
TABLE = (
    ("ok", "ok", lambda m: str(m["ok"]), False),
    ("429", "429 / 402 / 403", lambda m: str(m["refused"]["429"]), True),
    ("402", "429 / 402 / 403", lambda m: str(m["refused"]["402"]), True),
    ("403", "429 / 402 / 403", lambda m: str(m["refused"]["403"]), True),
    ("failed", "failed", lambda m: str(m["failed"]), True),
    ("cut", "cut", lambda m: str(m["cut"]), True),
    ("429s met", "429s met", lambda m: str(_met(m)["429"]), True),
    ("moved", "moved", lambda m: str(m["moved"]), True),
    ("probes", "probes", lambda m: str(m["probes"]), True),
    ("makespan s", "makespan s", lambda m: _fmt(m["makespan_s"]), False),
    ("wait p95 s", "wait p95 s", lambda m: _fmt(_wait_p95(m)), False),
    ("lag p99 ms", "lag p99 ms", lambda m: _fmt(m["lag_ms"]["p99"], 2), False),
    ("cycle tail avg/p95/max ms", "cycle tail", _tail, True),
    ("ledger exact", "ledger exact", lambda m: "yes" if m["ledger"]["exact"] else "NO", False),
    ("counts = simulator", "counts = simulator", lambda m: "yes" if m["counts_match"] else "NO", False),
)
EMPTY = ("0", "-")


def table(report: dict) -> tuple[list, list[str]]:
    """(the columns of TABLE this report shows, the headers left out as empty in every row)."""
    shown, left_out = [], []
    for column in TABLE:
        header, _entry, cell, optional = column
        if optional and all(cell(m) in EMPTY for m in report["modes"]):
            left_out.append(header)
        else:
            shown.append(column)
    return shown, left_out


def markdown(report: dict) -> str:
    """The comparison table (one row per profile x mode; a column empty in every row is left out,
    and a line under the table names it), the per-lane waits, what each column shown means,
    what a rerun gives again, and one line per mode of what it cost and bought."""
    shown, left_out = table(report)
    out = [f"# fleet-burst: {report['trace']} ({report['arrivals']} arrivals, speed {report['speed']:g}, "
           f"seed {report['seed']})", "",
           "| profile | mode | " + " | ".join(c[0] for c in shown) + " |",
           "|---|---|" + "---|" * len(shown)]
    for m in report["modes"]:
        out.append(f"| {m['profile']} | {m['mode']} | " + " | ".join(c[2](m) for c in shown) + " |")
    if left_out:
        out += ["", f"Left out, 0 (or -) in every row: {', '.join(left_out)}."]
    out += ["", "| profile | mode | lane | wait p50 s | wait p95 s | wait max s | starving s |",
            "|---|---|---|---|---|---|---|"]
    for m in report["modes"]:
        for lane, w in sorted(m["wait_s"].items()):
            out.append(f"| {m['profile']} | {m['mode']} | {lane} | {_fmt(w['p50'])} | {_fmt(w['p95'])} | "
                       f"{_fmt(w['max'])} | {_fmt(m['starving_s'].get(lane, 0.0))} |")
    entries = {c[1] for c in shown} | {"starving s"}
    out += ["", "## Columns", ""] + [f"- **{name}**: {text}." for name, text in COLUMNS if name in entries]
    out += ["", "## Same trace, same seed", "",
            f"- Deterministic: {DETERMINISTIC}.", f"- Depends on timing: {TIMING}.",
            "", "## What each mode cost and bought", ""]
    first: dict = {}
    for m in report["modes"]:
        first.setdefault(m["profile"], m)
    out += [verdict(m, first[m["profile"]]) for m in report["modes"]]
    return "\n".join(out) + "\n"


def duration(seconds: float | None, scale: float | None = None) -> str:
    """Trace seconds as a person reads them (42.8 s, 23.4 min, 5.2 h), in the unit that suits
    `scale` (the largest figure they are read beside; default: `seconds` itself)."""
    if seconds is None:
        return "-"
    scale = seconds if scale is None else scale
    if scale < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if scale < 7200 else f"{seconds / 3600:.1f} h"


def bought(report: dict, profile: str) -> str | None:
    """One sentence of what the admission bought in `profile`, against the other modes run
    (more rounds ok than none, a makespan and a p95 wait against the cap); None without an
    admission mode."""
    by_mode = {m["mode"]: m for m in report["modes"] if m["profile"] == profile}
    adm = by_mode.get("admission")
    if adm is None:
        return None
    parts = []
    none = by_mode.get("none")
    if none is not None:
        more = adm["ok"] - none["ok"]
        parts.append(f"{more} more round(s) ok than none ({adm['not_ok']} lost against {none['not_ok']})" if more > 0
                     else f"{-more} fewer round(s) ok than none" if more < 0 else f"as many rounds ok as none ({adm['ok']})")
    cap = by_mode.get("cap")
    if cap is not None:
        sooner = cap["makespan_s"] - adm["makespan_s"]
        parts.append(f"a makespan {duration(abs(sooner))} {'shorter' if sooner >= 0 else 'longer'} than the cap's "
                     f"with a p95 wait of {duration(_wait_p95(adm))} against {duration(_wait_p95(cap))}")
    if not parts:
        return f"The admission ({profile}) ran alone: {adm['ok']} of {adm['rounds']} rounds ok."
    head = "The admission bought " if len(profile_names(report)) == 1 else f"The admission ({profile}) bought "
    return head + (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]) + "."


def profile_names(report: dict) -> list[str]:
    return list(dict.fromkeys(m["profile"] for m in report["modes"]))


def _wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width`, never parting a figure from its unit (42.8 s)."""
    import re
    import textwrap

    kept = re.sub(r"(\d) (s|min|h)\b", "\\1\0\\2", text)
    return [line.replace("\0", " ") for line in textwrap.wrap(kept, width)]


def console(report: dict, report_path: str, width: int = 80) -> str:
    """The few lines fleet-burst ends with: per mode ok, lost, makespan and p95 wait; one sentence
    per profile of what the admission bought; what went wrong, if anything; the report's path.
    Every line but the path fits `width` columns."""
    single = len(profile_names(report)) == 1
    label = {id(m): m["mode"] if single else f"{m['profile']}/{m['mode']}" for m in report["modes"]}
    pad = max(len(v) for v in label.values()) if label else 0
    longest = max([m["makespan_s"] for m in report["modes"]] or [0.0])
    slowest = max([w for w in map(_wait_p95, report["modes"]) if w is not None] or [0.0])
    out = [f"{report['trace']}: {report['arrivals']} arrivals, speed {report['speed']:g}, seed {report['seed']}"]
    for m in report["modes"]:
        out.append(f"  {label[id(m)]:<{pad}}  ok {m['ok']:>4}  lost {m['not_ok']:>4}  "
                   f"makespan {duration(m['makespan_s'], longest):>9}  p95 wait {duration(_wait_p95(m), slowest):>9}")
    for profile in profile_names(report):
        sentence = bought(report, profile)
        if sentence:
            out += _wrap(sentence, width)
    wrong = [label[id(m)] for m in report["modes"] if not (m["ledger"]["exact"] and m["counts_match"])]
    if wrong:
        out += _wrap(f"NOT EXACT in {', '.join(wrong)}: a unit did not get exactly one outcome, or the "
                     "counts differ from the simulator's (see the report)", width)
    out.append(f"report: {report_path}")
    return "\n".join(out)


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
