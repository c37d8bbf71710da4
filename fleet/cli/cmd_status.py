"""fleetctl status: the live fleet, read straight from its shared-memory table.

Gathering the status document is the runtime's (fleet.shm.status: a lock-free table
snapshot plus /proc readings, pure `build`); this command chooses what to gather
from its arguments and formats the document: `--json` prints it, `render` (pure)
turns it into the human table.
"""
from __future__ import annotations

import json
import sys

from fleet.rules.budget import json_number
from fleet.rules.delegation import describe as describe_cgroup
from fleet.rules.errors import EXIT_NOT_RUNNING, EXIT_OK, FleetError, NotRunning
from fleet.rules.vocab import PostureKey as K
from fleet.rules.when import utc
from fleet.shm.table.bulkheads import held_until
from fleet.shm.status import DELAY_SOURCES, SCHEDSTAT, TASKSTATS, gather, gather_projection, runtime_view
from fleet.cli._common import add_name_argument, fleet_name

NAME = "status"
HELP = ("Show the fleet's plan, budget, slots, posture, ledger, queues and provider bulkheads (read from its table); "
        "with --config, a fleet that is not running shows the plan it would boot with.")

#: How the census header names where a slot's run-queue delay came from.
DELAY_SOURCE_TEXT = {
    SCHEDSTAT: "/proc/PID/schedstat (ns waited on a run queue)",
    TASKSTATS: "taskstats cpu_delay_total (delay accounting)",
}


def add_arguments(parser) -> None:
    add_name_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="the fleet's TOML config: names the fleet (unless --name does), and when it is not "
        "running, status prints the projection it would boot with on this host (plan, budget, "
        "seats and slots; fleet_booted false) and still exits 69",
    )
    parser.add_argument(
        "--no-waiting",
        action="store_true",
        help="leave out the oldest waiting units (which status asks fleetd for, waiting at most "
        f"{2.0:g} s): read the table alone, which answers while the daemon is busy",
    )
    parser.add_argument(
        "--delay-source",
        choices=DELAY_SOURCES,
        default="auto",
        help="where run-queue delay comes from: auto picks taskstats when kernel.task_delayacct "
        "is on and we are root, else /proc/PID/schedstat",
    )


def run(args) -> int:
    config = _load_config(args.config) if args.config else None
    name = (args.name or config.name) if config is not None else fleet_name(args)
    try:
        doc = gather(name, delay_source=args.delay_source, trust_uids=args.trust_uids or ())
    except NotRunning:
        if config is None:
            raise
        return _print_projection(args, config)
    if not doc["stale"] and not getattr(args, "no_waiting", False):
        doc["waiting"] = waiting_units(args, doc)
    sys.stdout.write(_json(doc) if args.json else render(doc))
    if doc["stale"]:
        # Its state is still worth showing (what was running when it died), but
        # nothing serves this fleet: callers and scripts must not read success.
        print(
            f"fleetctl status: fleet {doc['fleet']!r} is not running: its table is stale "
            f"(creator pid {doc['creator_pid']} is gone)",
            file=sys.stderr,
        )
        return EXIT_NOT_RUNNING
    return EXIT_OK


def _json(doc: dict) -> str:
    """The document as --json prints it: its keys, and the runtime view (`fleet.runtime_status()`'s
    shape) under ``runtime_status``."""
    return json.dumps({**doc, "runtime_status": runtime_view(doc)}, indent=2) + "\n"


#: How long status waits for the daemon's list of waiting units (the table's part never waits).
WAITING_TIMEOUT_S = 2.0


def waiting_units(args, doc: dict) -> dict:
    """The oldest units that wait, each with its reason (the `why` op: the one rule of
    `fleet.rules.why`), from the fleet's daemon: ``{"units": [...], "owed"}``; or
    ``{"units": None, "unavailable": why}`` when no daemon answers (an embedded fleet has
    none: ``Fleet.why()`` lists them in its process)."""
    if doc.get("mode") != "service":
        return {"units": None, "unavailable": "an embedded fleet serves no control socket: Fleet.why() lists them"}
    from fleet.rules.why import OLDEST
    from fleet.cli._common import client

    try:
        with client(args, timeout=WAITING_TIMEOUT_S) as c:
            reply = c.call("why", oldest=OLDEST)
    except (FleetError, OSError) as exc:
        return {"units": None, "unavailable": f"the daemon did not answer: {type(exc).__name__}: {exc}"}
    return {"units": reply["waiting"], "owed": reply["owed"]}


def render_waiting(waiting: dict | None) -> list[str]:
    if not waiting:
        return []
    units = waiting["units"]
    if units is None:
        return [f"waiting   ({waiting['unavailable']})"]
    if not units:
        return [f"waiting   none ({waiting['owed']} owed an outcome, all running)"]
    return [f"waiting   the oldest {len(units)} (fleetctl why UNIT for one)"] + [f"  {w['text']}" for w in units]


def _load_config(path):
    from fleet.runtime.config import load_config  # only here: plain status must start fast

    return load_config(path)


def _print_projection(args, config) -> int:
    doc = gather_projection(config, args.name or config.name)
    sys.stdout.write(_json(doc) if args.json else render_projection(doc))
    print(f"fleetctl status: fleet {doc['fleet']!r} is not running; shown: the projection of {args.config} "
          "on this host", file=sys.stderr)
    return EXIT_NOT_RUNNING


# --------------------------------------------------------------------------- render


def cpu_list(cpus) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``, as cpuset files write it; ``"-"`` for none."""
    if not cpus:
        return "-"
    runs, start, prev = [], cpus[0], cpus[0]
    for c in list(cpus[1:]) + [None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(runs)


def duration(seconds) -> str:
    """Seconds as a short human figure: ``850ms``, ``12.5s``, ``3m20s``, ``2h05m``."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def delay(ns) -> str:
    if ns is None:
        return "-"
    if ns < 1_000_000:
        return f"{ns / 1000:.0f}us"
    return duration(ns / 1e9) if ns >= 1e9 else f"{ns / 1e6:.1f}ms"


def _dash(v) -> str:
    return "-" if v is None else str(v)


def _table(headers, rows, indent="  ") -> list[str]:
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    fmt = indent + "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip()] + [fmt.format(*r).rstrip() for r in rows]


def run_state(doc: dict) -> str:
    """The fleet's state word for a person: stale, closing, draining (since when) or running."""
    if doc["stale"]:
        return "STALE (creator gone)"
    if doc["closing"]:
        return "closing"
    drain = doc.get("draining")  # absent from a document of an older fleetctl
    if drain:
        return f"DRAINING since {drain['since_utc']} (new submits refused; fleetctl resume)"
    return "running"


def render_header(doc: dict) -> list[str]:
    state = run_state(doc)
    return [
        f"fleet {doc['fleet']}  {state}  pid {doc['creator_pid']}  mode {_dash(doc['mode'])}  "
        f"version {_dash(doc['version'])}  up {duration(doc['uptime_s'])} (since {doc.get('created_utc', '-')})  "
        f"boot {doc['boot_id'][:12]}"
    ]


def render_plan(plan: dict | None) -> list[str]:
    if not plan:
        return ["plan      (no boot metadata in the table)"]
    refused = plan.get("tier_refused")
    refused_text = "-" if not refused else f"{refused.get('tier')}: {refused.get('error')}"
    return [
        f"plan      booted {'yes' if plan.get('fleet_booted') else 'no'}  profile {plan.get('profile')} -> "
        f"{plan.get('binding')} binding  {quota_text(plan)}",
        f"          oversubscribed {'YES' if plan.get('oversubscribed') else 'no'}  tier refused {refused_text}",
    ]


def quota_text(plan: dict) -> str:
    """The quota the plan uses and where it came from; a configured quota names the
    detected one beside it, so an override never hides what the kernel gives."""
    quota = f"quota {_dash(json_number(plan.get('quota_cpus')))} CPUs"
    source, detected = plan.get("quota_source"), plan.get("detected_cpus")
    where = plan.get("detected_from") or "?"
    if source == "config" and detected is not None:
        return f"{quota} (configured fleet.cpus; detected {json_number(detected)} CPUs from {where})"
    if source == "detected":
        return f"{quota} (detected from {where})"
    return f"{quota} ({source})" if source else quota


def render_quota(q: dict | None) -> list[str]:
    """The quota epoch line: which epoch runs, on what quota, against the boot's."""
    if not q or (q["cpus"] is None and not q["epoch"]):
        return []  # a table from before epochs were published
    text = f"quota     epoch {q['epoch']}: plans with {_dash(q['cpus'])} CPUs ({q['source']})"
    if q["source"] == "config":
        text += f"; detected now {_dash(q['detected_cpus'])} CPUs"
    if q["epoch"]:
        text += f"; booted with {_dash(q['booted_cpus'])} CPUs (the seats follow the quota; the budget rows stay as booted until a restart)"
    return [text]


def render_budget(budget: dict | None) -> list[str]:
    if not budget:
        return []
    rows = [
        (c["name"], _dash(c.get("cores")), _dash(c.get("threads")), c.get("rule", ""))
        for c in budget.get("consumers", [])
    ]
    rows.append(("sum", _dash(budget.get("sum")), "", ""))
    if budget.get("unallocated"):
        rows.append(("unallocated", _dash(budget["unallocated"]), "", "headroom no fleet thread uses"))
    return ["budget"] + _table(("consumer", "cores", "threads", "rule"), rows)


def render_processes(rows) -> list[str]:
    """One line per role: its slots and the worker processes that run them."""
    from fleet.rules.processes import describe

    return [f"{'processes' if i == 0 else '':<10}{describe(row)}" for i, row in enumerate(rows or [])]


def render_priority(prio: dict | None) -> list[str]:
    """The nices the loop and the workers run at (fleet.host.priority)."""
    if not prio:
        return []
    return [f"{'priority':<10}loop at nice {prio['loop_nice']}, workers at nice {prio['worker_nice']}"
            f" (dispatch_priority = {prio['levels']})"]


def render_census(doc: dict) -> list[str]:
    rows = [
        (
            str(r["slot"]),
            _dash(r.get("seat_name") or r.get("seat")),
            _dash(r["role"]),
            r["state"],
            _dash(r["key"]),
            _dash(r["pid"] or None),
            cpu_list(r["cpus"]),
            r["binding"],
            _dash(r["unit"] or None),
            str(r["done"]),
            _dash(r.get("last_role")),
            str(r.get("switches", 0)),
            str(r.get("rides", 0)),
            # its seat's worker waits for its CPUs now (fleet.rules.contention), and times found so: "yes/2"
            f"{'yes' if r.get('contended') else 'no'}/{r.get('contentions', 0)}",
            delay(r["runq_delay_ns"]),
        )
        for r in doc["census"]
    ]
    head = f"census    {len(rows)} slots; run-queue delay from {DELAY_SOURCE_TEXT.get(doc['delay_source'], doc['delay_source'])}"
    cols = ("slot", "seat", "role", "state", "key", "pid", "cpus", "binding", "unit", "done", "last-role", "switches",
            "rides", "contended", "runq-delay")
    return [head] + _table(cols, rows)


def render_posture(p: dict) -> list[str]:
    t = p["thresholds"]
    floor = t[K.INTAKE_FLOOR]
    return [
        f"posture   {p['state']} (cause {p['cause']}) for {duration(p['dwell_s'])}; "
        f"entered {p['enter_count']}, exited {p['exit_count']}; cordoned {duration(p['cordoned_s'])} in all; "
        f"intake suppressed {p['suppressed']}",
        f"          enter >= {t[K.ENTER_EVENTS]} events / {t[K.ENTER_WINDOW_MS]} ms "
        f"or duty > {json_number(t[K.DUTY_PERCENT])}% / {t[K.DUTY_WINDOW_MS]} ms; "
        f"exit after {t[K.EXIT_CLEAN_MS]} ms clean; "
        f"intake floor {'half the slot cap' if floor is None else floor}",
    ]


def render_reads(reads: dict | None) -> list[str]:
    """Which cgroup the posture's throttle counters come from (absent from an older fleetd's table)."""
    if reads is None:
        return []
    from fleet.host.sampler import describe_reads

    return [f"          {describe_reads(reads)}"]


def render_cgroup(meta: dict | None) -> list[str]:
    """Which group is the fleet's, delegated or embedded, and what it reads there (absent
    from an older fleetd's table)."""
    lines = describe_cgroup(meta)
    return [("cgroup    " if i == 0 else "          ") + line for i, line in enumerate(lines)]


def render_memory(m: dict | None) -> list[str]:
    """Workers the OOM killer killed and workers recycled, and where OOM kills and memory
    pressure are read from (absent from an older fleetd's table)."""
    if m is None:
        return []
    where = m["oom_kills_from"] or f"not read: {m['oom_kills_unread'] or 'no memory cgroup'}"
    pressure = m["pressure_from"] or "none (no own cgroup2 group, or off)"
    return [f"workers   OOM-killed {m['oom_kills']:,}  recycled over max_rss_mib {m['worker_recycles']:,}",
            f"          OOM kills from {where}; memory pressure cordons from {pressure}"]


def render_ledger(g: dict) -> list[str]:
    failed = ", ".join(f"{k} {n}" for k, n in g["failed_by_reason"].items() if n) or "none"
    i = g["items"]
    return [
        f"ledger    units submitted {g['submitted']:,}  solved {g['solved']:,}  suppressed {g['suppressed']:,}  "
        f"failed {g['failed']:,}  in flight {g['inflight']:,}",
        f"          of them submitted from inside running units (children) {g.get('children', 0):,}",
        f"          items submitted {i['submitted']:,}  solved {i['solved']:,}  suppressed {i['suppressed']:,}  "
        f"failed {i['failed']:,}  in flight {i['inflight']:,}",
        "          (a unit is one submit, or one chunk of a map: up to chunksize items)",
        f"          failed by reason: {failed}",
        f"          slot FSM refusals: {g['fsm_refused']}  stray results dropped: {g['stray_results']}",
    ]


def render_queues(queues: list[dict]) -> list[str]:
    rows = [
        (q["name"], q["kind"], q["cordon_class"], f"{q['queue_depth']}/{q['queue_bound']}", f"{q['in_use']}/{q['slot_cap']}",
         str(q.get("repins", 0)))
        for q in queues
    ]
    return ["queues"] + _table(("role", "kind", "cordon", "queued/bound", "slots in use/cap", "re-pins"), rows)


def saturation_lines(saturated: list[dict] | None) -> list[str]:
    """One line per saturated role (fleet.rules.saturation): how far arrivals outrun service,
    the backlog and its growth, and what more cores would give. `top` shows the same lines."""
    if not saturated:
        return ["saturation none: every role's backlog keeps up with its service"]
    lines = []
    for s in saturated:
        drain = "-" if s.get("drain_s") is None else duration(s["drain_s"])
        lines.append(f"SATURATED role {s['role']}: {s['arrival_rate']:.1f}/s arriving vs {s['service_rate']:.1f}/s "
                     f"served; backlog {s['backlog']:,} growing {s['growth']:.1f}/s ({drain} to drain); "
                     f"episode {s['episodes']}")
        lines.append(f"          estimate: {s['estimate_line']}")
    return lines


def render_bulkheads(rows: list[dict]) -> list[str]:
    """The provider admission's bulkheads, one per pool (model@provider[/key]), as the table holds them."""
    if not rows:
        return []
    table = []
    for b in rows:
        state = b["state"] + (" (daily limit)" if b.get("closed_by_daily_limit") else "")
        until = held_until(b)
        table.append((b["pool"], state, _dash(b["cause"]), utc(until), str(b["running"]), str(b["waiting"]),
                      str(b["delegated"]), str(b["successes"]), str(b["failures"]), str(b["refusals"]),
                      str(b["probes"]), str(b["carrying_capacity"]), str(b["estimate"]),
                      duration(b["mean_seconds"]) if b["mean_seconds"] else "-",
                      f"${b['mean_cost']:.4f}" if b["mean_cost"] else "-"))
    cols = ("pool", "state", "cause", "until (UTC)", "running", "waiting", "delegated", "ok", "failed",
            "refusals", "probes", "carrying", "estimate", "mean", "mean cost")
    return [f"bulkheads {len(rows)} provider pool(s)"] + _table(cols, table)


def render_admission(adm: dict | None) -> list[str]:
    """What only the fleet's own process knows (Fleet.status(), fleetd's status op): the
    starving list, waiting units and a catalog that failed to load."""
    if not adm:
        return []
    lines = []
    if adm.get("policy_error"):
        lines.append(f"admission catalog reload FAILED (the last good one runs): {adm['policy_error']}")
    for s in adm.get("starving", []):
        if s["kind"] == "provider-closed":
            who = s["provider"] + (f"/{s['credential']}" if s.get("credential") else "")
            lines.append(f"starving  {who} closed ({s['cause']}) until {utc(s['until'])}: {s['waiting']} unit(s) waiting")
        else:
            lines.append(f"starving  unit {s['unit']} hard-pinned to {s['route']} for {duration(s['waiting_s'])}")
    for w in adm.get("waiting_units", [])[:20]:
        refused = f" (refused {w['refusals']}x, last: {w['refused']})" if w.get("refused") else ""
        lines.append(f"waiting   unit {w['unit']}: {w['why']}{refused}")
    return lines


def render_projection(doc: dict) -> str:
    """A not-running fleet's projection (`build_projection`) as the human table."""
    lines = [f"fleet {doc['fleet']}  NOT RUNNING (not booted)  projection from {doc['config']}"]
    if doc["refused"] is not None:
        r = doc["refused"]
        lines += [f"plan      boot would be REFUSED: {r['error']}: {r['message']} (exit {r['exit_code']})"]
        return "\n".join(lines) + "\n"
    rows = [(str(s["slot"]), _dash(s["seat_name"]), s["role"], cpu_list(s["cpus"]), s["binding"]) for s in doc["slots"]]
    queues = [(q["name"], q["kind"], q["cordon_class"], str(q["queue_bound"]), str(q["slot_cap"])) for q in doc["queues"]]
    sections = [
        lines,
        render_plan(doc["plan"]),
        render_budget(doc["budget"]),
        render_processes(doc.get("role_processes")),
        [f"seats     {len(doc['seats'])} worker process(es); slots {len(rows)}"]
        + _table(("slot", "seat", "role", "cpus", "binding"), rows),
        ["queues"] + _table(("role", "kind", "cordon", "bound", "slots"), queues),
    ]
    return "\n".join(line for section in sections if section for line in section + [""]).rstrip("\n") + "\n"


def render(doc: dict) -> str:
    """The status document as the human table."""
    sections = [
        render_header(doc),
        render_plan(doc["plan"]),
        render_quota(doc.get("quota")),
        render_budget(doc["budget"]),
        render_processes(doc.get("role_processes")) + render_priority(doc.get("dispatch_priority")),
        render_census(doc),
        render_posture(doc["posture"]) + render_reads(doc.get("throttle_reads")),
        render_cgroup(doc.get("cgroup")),
        render_ledger(doc["ledger"]),
        render_memory(doc.get("memory")),
        render_queues(doc["queues"]),
        saturation_lines(doc.get("saturated")),
        render_bulkheads(doc.get("bulkheads", [])),
        render_admission(doc.get("admission")),
        render_waiting(doc.get("waiting")),
    ]
    if doc["torn"]:
        sections.append([f"TORN      records a writer never finished: {', '.join(doc['torn'])}"])
    return "\n".join(line for section in sections if section for line in section + [""]).rstrip("\n") + "\n"
