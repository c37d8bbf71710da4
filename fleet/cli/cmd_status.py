"""fleetctl status: the live fleet, read straight from its shared-memory table.

No socket round trip: the table is read with a lock-free snapshot, so this answers
while the daemon is busy, wedged or gone (a table whose creator died is reported as
stale). Nothing here imports numba: `fleet.table`'s reader path is numpy + cffi.

Layout of this module: the I/O edge (`gather`, the /proc and taskstats readers)
turns a fleet name into plain values; `build` (pure) turns a snapshot and those
values into the status document `--json` prints; `render` (pure) turns the
document into the human table.
"""
from __future__ import annotations

import json
import os
import sys
import time

from ..budget import json_number
from ..errors import EXIT_NOT_RUNNING, EXIT_OK, NotRunning
from ..outcomes import reason_name
from ..table import TableNotFound, snapshot
from ..table import layout as L
from ._common import add_name_argument, fleet_name

NAME = "status"
HELP = ("Show the fleet's plan, budget, slots, posture, ledger and queues (read from its table); "
        "with --config, a fleet that is not running shows the plan it would boot with.")

#: Where a slot's run-queue delay comes from.
SCHEDSTAT = "schedstat"  # /proc/PID/schedstat field 2: ns the task waited on a run queue
TASKSTATS = "taskstats"  # netlink taskstats cpu_delay_total (needs kernel.task_delayacct=1, root)
DELAY_SOURCES = ("auto", SCHEDSTAT, TASKSTATS)
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
        doc = gather(name, delay_source=args.delay_source)
    except NotRunning:
        if config is None:
            raise
        return _print_projection(args, config)
    sys.stdout.write(json.dumps(doc, indent=2) + "\n" if args.json else render(doc))
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


def _load_config(path):
    from ..config import load_config  # only here: plain status must start fast

    return load_config(path)


def _print_projection(args, config) -> int:
    doc = gather_projection(config, args.name or config.name)
    sys.stdout.write(json.dumps(doc, indent=2) + "\n" if args.json else render_projection(doc))
    print(f"fleetctl status: fleet {doc['fleet']!r} is not running; shown: the projection of {args.config} "
          "on this host", file=sys.stderr)
    return EXIT_NOT_RUNNING


# --------------------------------------------------------------------------- I/O edge


def gather(name: str, *, delay_source: str = "auto", now_ns=time.monotonic_ns, wall_ns=time.time_ns) -> dict:
    """Attach read-only to fleet ``name``'s table and build its status document.

    Read-only means O_RDONLY and PROT_READ: all that a member of fleetd's
    ``--socket-group`` may do with the table (it is mode 0640 for that group).

    Raises:
        NotRunning: no table of that name exists.
        InvalidFleetName: the name breaks the fleet-name rule (fleet.names).
        TableAccessDenied: this uid may not read the table (exit 77).
        TableCorrupt: the table is unreadable.
    """
    try:
        snap, alive = snapshot.read(name)
    except TableNotFound as exc:
        raise NotRunning(str(exc)) from None
    pids = sorted({snap.slot(i)["pid"] for i in range(snap.n_slots)} - {0})
    source = choose_delay_source(delay_source, delayacct_enabled(), os.geteuid())
    delays, source = read_delays(pids, source)
    return build(snap, alive=alive, delays=delays, delay_source=source, now_ns=now_ns(), wall_ns=wall_ns())


def gather_projection(config, name: str) -> dict:
    """The projection of `config` on this host (quota detected now, this process's CPUs)."""
    from .. import cgroup, quota
    from ..errors import FleetError

    try:
        proj = quota.project(config, cgroup.effective_cpus(), sorted(os.sched_getaffinity(0)))
    except FleetError as exc:
        return build_projection(name, config, None, exc)
    return build_projection(name, config, proj.meta(booted=False), None)


def delayacct_enabled(path: str = "/proc/sys/kernel/task_delayacct") -> bool:
    """Whether the kernel keeps per-task delay accounting (taskstats delays are 0 otherwise)."""
    try:
        with open(path) as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def read_delays(pids, source: str) -> tuple[dict[int, int | None], str]:
    """Run-queue delay (ns) per pid from ``source``; (delays, the source actually used).

    Taskstats needs a netlink socket root may open; when it cannot be opened the
    delays come from schedstat instead, and the returned source says so.
    """
    if source == TASKSTATS:
        delays = taskstats_delays(pids)
        if delays is not None:
            return delays, TASKSTATS
    return {pid: schedstat_delay(pid) for pid in pids}, SCHEDSTAT


def schedstat_delay(pid: int, proc: str = "/proc") -> int | None:
    """Field 2 of ``/proc/PID/schedstat``: ns the task has waited on a run queue; None if gone."""
    try:
        with open(f"{proc}/{pid}/schedstat") as f:
            fields = f.read().split()
        return int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def taskstats_delays(pids) -> dict[int, int | None] | None:
    """``cpu_delay_total`` per pid over netlink taskstats; None when taskstats is unavailable."""
    # pyroute2 costs ~0.2 s to import: only pay it when taskstats is asked for.
    from pyroute2 import TaskStats
    from pyroute2.netlink.exceptions import NetlinkError

    ts = TaskStats()
    try:
        ts.bind()
    except (NetlinkError, OSError):
        ts.close()
        return None
    out: dict[int, int | None] = {}
    try:
        for pid in pids:
            try:
                msg = ts.get_pid_stat(pid)[0]
                stats = msg.get_attr("TASKSTATS_TYPE_AGGR_PID").get_attr("TASKSTATS_TYPE_STATS")
                out[pid] = int(stats["cpu_delay_total"])
            except (NetlinkError, OSError, IndexError, KeyError, AttributeError, TypeError):
                out[pid] = None  # the task exited between the snapshot and the query
    finally:
        ts.close()
    return out


# ------------------------------------------------------------------------------ pure


def choose_delay_source(requested: str, delayacct_on: bool, euid: int) -> str:
    """The delay source for ``requested`` (auto | schedstat | taskstats).

    auto prefers taskstats only where it carries numbers: delay accounting on, and
    root (the taskstats family refuses per-pid queries to others on most kernels).
    """
    if requested not in DELAY_SOURCES:
        raise ValueError(f"delay source must be one of {', '.join(DELAY_SOURCES)}, got {requested!r}")
    if requested != "auto":
        return requested
    return TASKSTATS if delayacct_on and euid == 0 else SCHEDSTAT


def build(snap, *, alive: bool, delays: dict, delay_source: str, now_ns: int, wall_ns: int) -> dict:
    """The status document for one table snapshot (the shape `--json` prints).

    Args:
        snap: a `TableSnapshot`.
        alive: whether the table's creator process still runs.
        delays: run-queue delay in ns per pid (None: unknown).
        delay_source: where ``delays`` came from.
        now_ns: CLOCK_MONOTONIC now (posture dwell is measured on it).
        wall_ns: CLOCK_REALTIME now (the table's creation time is on it).
    """
    meta = snap.meta or {}
    return {
        "fleet": snap.name,
        "fleet_booted": True,
        "alive": alive,
        "stale": not alive,
        "creator_pid": snap.creator_pid,
        "boot_id": snap.boot_id,
        "version": meta.get("version"),
        "mode": meta.get("mode"),
        "socket": meta.get("socket"),
        "created_ns": snap.created_ns,
        "uptime_s": round(max(0, wall_ns - snap.created_ns) / 1e9, 3),
        "closing": bool(snap.flags & L.FLAG_CLOSING),
        "plan": meta.get("plan"),
        "quota": quota_now(meta.get("plan"), snap.posture_view()),
        "budget": meta.get("budget"),
        "seats": meta.get("seats", []),
        "delay_source": delay_source,
        "census": census(snap, meta, delays, delay_source),
        "posture": posture(snap.posture_view(), now_ns),
        "ledger": ledger(snap.ledger_view()),
        "queues": [snap.role_view(code) for code in range(len(snap.role_names))],
        "torn": list(snap.torn),
    }


def build_projection(name: str, config, meta: dict | None, refused: Exception | None) -> dict:
    """The status document of a fleet that is not running: what `config` would boot.

    Args:
        meta: `fleet.quota.Projection.meta` (plan, budget, seats, slot_seats), or None
            when the config would be refused at boot (`refused` is the error).
    """
    doc = {"fleet": name, "fleet_booted": False, "alive": False, "config": config.source}
    if meta is None:
        doc.update(plan=None, budget=None, seats=[], slots=[], queues=[],
                   refused={"error": type(refused).__name__, "message": str(refused),
                            "exit_code": getattr(refused, "exit_code", None)})
        return doc
    seats = meta["seats"]
    slots = []
    for index, (seat, role) in enumerate(zip(meta["slot_seats"], meta["slot_roles"])):
        row = seats[seat] if seat >= 0 else None
        slots.append({"slot": index, "role": role, "seat": seat if seat >= 0 else None,
                      "seat_name": row["name"] if row else None, "cpus": row["cpus"] if row else [],
                      "binding": row["binding"] if row else "logical"})
    queues = [{"name": r.name, "kind": r.kind, "cordon_class": r.cordon_class, "queue_bound": r.queue_bound,
               "slot_cap": r.slots} for r in config.roles]
    doc.update(plan=meta["plan"], budget=meta["budget"], seats=seats, slots=slots, queues=queues, refused=None)
    return doc


def quota_now(plan: dict | None, posture_view: dict) -> dict:
    """The quota epoch and the quota now in force (the plan in the meta is the boot's).

    A configured quota stays in force whatever is detected; otherwise the latest
    detected quota is the one the current epoch plans with.
    """
    plan = plan or {}
    detected = posture_view.get("detected_cpus")
    if detected is None:
        detected = plan.get("detected_cpus")
    configured = plan.get("configured_cpus")
    cpus = configured if configured is not None else detected
    return {"epoch": posture_view.get("epoch", 0), "cpus": json_number(cpus), "detected_cpus": json_number(detected),
            "booted_cpus": plan.get("quota_cpus"), "source": "config" if configured is not None else "detected"}


def census(snap, meta: dict, delays: dict, delay_source: str) -> list[dict]:
    """One row per slot: its FSM state, who serves it and where, and its run-queue delay."""
    seat_of = meta.get("slot_seats") or []
    seats = {s.get("index"): s for s in meta.get("seats") or []}
    rows = []
    for i in range(snap.n_slots):
        row = snap.slot(i)
        seat = seat_of[i] if i < len(seat_of) else None
        row["seat"] = seat
        row["seat_name"] = seats.get(seat, {}).get("name")
        row["runq_delay_ns"] = delays.get(row["pid"]) if row["pid"] else None
        row["runq_delay_source"] = delay_source if row["runq_delay_ns"] is not None else None
        rows.append(row)
    return rows


def posture(view: dict, now_ns: int) -> dict:
    """The posture record plus what follows from the clock: dwell and total cordoned time."""
    since = view["since_ns"]
    # since_ns 0: the supervisor never published a posture; a dwell measured from
    # the clock's epoch would be a lie.
    dwell_ns = max(0, now_ns - since) if since else None
    current = (dwell_ns or 0) if view["state"] == "Cordoned" else 0
    cordoned_ns = view["cordoned_ns"] + current
    return {
        **view,
        "dwell_s": None if dwell_ns is None else round(dwell_ns / 1e9, 3),
        "cordoned_s": round(cordoned_ns / 1e9, 3),
    }


def ledger(view: dict) -> dict:
    """Ledger counters, failures keyed by reason name (`fleet.outcomes`)."""
    by_reason = {reason_name(code): n for code, n in enumerate(view["failed_by_reason"])}
    return {**view, "failed_by_reason": by_reason}


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


def render_header(doc: dict) -> list[str]:
    state = "STALE (creator gone)" if doc["stale"] else "running"
    if doc["closing"] and not doc["stale"]:
        state = "closing"
    return [
        f"fleet {doc['fleet']}  {state}  pid {doc['creator_pid']}  mode {_dash(doc['mode'])}  "
        f"version {_dash(doc['version'])}  up {duration(doc['uptime_s'])}  boot {doc['boot_id'][:12]}"
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
        text += f"; booted with {_dash(q['booted_cpus'])} CPUs (seats and budget as booted until a restart)"
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
            delay(r["runq_delay_ns"]),
        )
        for r in doc["census"]
    ]
    head = f"census    {len(rows)} slots; run-queue delay from {DELAY_SOURCE_TEXT.get(doc['delay_source'], doc['delay_source'])}"
    cols = ("slot", "seat", "role", "state", "key", "pid", "cpus", "binding", "unit", "done", "runq-delay")
    return [head] + _table(cols, rows)


def render_posture(p: dict) -> list[str]:
    t = p["thresholds"]
    floor = t["cordon_sim_intake_floor"]
    return [
        f"posture   {p['state']} (cause {p['cause']}) for {duration(p['dwell_s'])}; "
        f"entered {p['enter_count']}, exited {p['exit_count']}; cordoned {duration(p['cordoned_s'])} in all; "
        f"intake suppressed {p['suppressed']}",
        f"          enter >= {t['cordon_enter_events']} events / {t['cordon_enter_window_ms']} ms "
        f"or duty > {json_number(t['cordon_duty_percent'])}% / {t['cordon_duty_window_ms']} ms; "
        f"exit after {t['cordon_exit_clean_ms']} ms clean; "
        f"intake floor {'half the slot cap' if floor is None else floor}",
    ]


def render_ledger(g: dict) -> list[str]:
    failed = ", ".join(f"{k} {n}" for k, n in g["failed_by_reason"].items() if n) or "none"
    return [
        f"ledger    submitted {g['submitted']}  solved {g['solved']}  suppressed {g['suppressed']}  "
        f"failed {g['failed']}  in flight {g['inflight']}",
        f"          failed by reason: {failed}",
    ]


def render_queues(queues: list[dict]) -> list[str]:
    rows = [
        (q["name"], q["kind"], q["cordon_class"], f"{q['queue_depth']}/{q['queue_bound']}", f"{q['in_use']}/{q['slot_cap']}")
        for q in queues
    ]
    return ["queues"] + _table(("role", "kind", "cordon", "queued/bound", "slots in use/cap"), rows)


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
        render_census(doc),
        render_posture(doc["posture"]),
        render_ledger(doc["ledger"]),
        render_queues(doc["queues"]),
    ]
    if doc["torn"]:
        sections.append([f"TORN      records a writer never finished: {', '.join(doc['torn'])}"])
    return "\n".join(line for section in sections if section for line in section + [""]).rstrip("\n") + "\n"
