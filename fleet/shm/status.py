"""The status of a live fleet, read straight from its shared-memory table.

What `fleetctl status --json` prints, `Fleet.status()` returns and fleetd's `status`
op answers. No socket round trip: the table is read with a lock-free snapshot, so
this answers while the daemon is busy, wedged or gone (a table whose creator died
is reported as stale). Nothing here imports numba: `fleet.shm.table`'s reader path is
numpy + cffi.

Layout: the I/O edge (`gather`, the /proc and taskstats readers) turns a fleet name
into plain values; `build` (pure) turns a snapshot and those values into the status
document. Rendering it for people is the CLI's (fleet.cli.cmd_status).
"""
from __future__ import annotations

import os
import time

from fleet.rules.budget import json_number
from fleet.rules.errors import NotRunning
from fleet.rules.outcomes import reason_name
from fleet.rules import saturation as saturation_rule
from fleet.rules.vocab import CORDONED, POSTURE_NAMES
from fleet.rules.when import utc
from fleet.shm.table import TableNotFound, snapshot
from fleet.shm.table import bulkheads as table_bulkheads
from fleet.shm.table import layout as L
from fleet.host.trust import trusted_uids

#: Where a slot's run-queue delay comes from.
SCHEDSTAT = "schedstat"  # /proc/PID/schedstat field 2: ns the task waited on a run queue
TASKSTATS = "taskstats"  # netlink taskstats cpu_delay_total (needs kernel.task_delayacct=1, root)
DELAY_SOURCES = ("auto", SCHEDSTAT, TASKSTATS)


# --------------------------------------------------------------------------- I/O edge


def gather(name: str, *, delay_source: str = "auto", trust_uids=(), now_ns=time.monotonic_ns,
           wall_ns=time.time_ns) -> dict:
    """Attach read-only to fleet ``name``'s table and build its status document.

    Read-only means O_RDONLY and PROT_READ: all that a member of fleetd's
    ``--socket-group`` may do with the table (it is mode 0640 for that group).

    Raises:
        NotRunning: no table of that name exists.
        InvalidFleetName: the name breaks the fleet-name rule (fleet.rules.names).
        TableAccessDenied: this uid may not read the table (exit 77).
        TableCorrupt: the table is unreadable.
        UntrustedPeer: the table belongs to a uid other than ours, root and
            ``trust_uids`` (exit 85): another user's table under this name.
    """
    try:
        snap, alive = snapshot.read(name, trust=trusted_uids(trust_uids))
    except TableNotFound as exc:
        raise NotRunning(str(exc)) from None
    pids = sorted({snap.slot(i)["pid"] for i in range(snap.n_slots)} - {0})
    source = choose_delay_source(delay_source, delayacct_enabled(), os.geteuid())
    delays, source = read_delays(pids, source)
    return build(snap, alive=alive, delays=delays, delay_source=source, now_ns=now_ns(), wall_ns=wall_ns())


def gather_projection(config, name: str) -> dict:
    """The projection of `config` on this host (quota detected now, this process's CPUs)."""
    from fleet.host import cgroup
    from fleet.rules import quota
    from fleet.rules.errors import FleetError

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
    queues = [snap.role_view(code) for code in range(len(snap.role_names))]
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
        "created_utc": utc(snap.created_ns / 1e9),
        "uptime_s": round(max(0, wall_ns - snap.created_ns) / 1e9, 3),
        "closing": bool(snap.flags & L.FLAG_CLOSING),
        "draining": draining(snap.draining_since_ns),
        "plan": meta.get("plan"),
        "quota": quota_now(meta.get("plan"), snap.posture_view()),
        "budget": meta.get("budget"),
        "seats": meta.get("seats", []),
        "role_processes": meta.get("role_processes", []),
        "dispatch_priority": meta.get("dispatch_priority"),
        "delay_source": delay_source,
        "census": census(snap, meta, delays, delay_source),
        "posture": posture(snap.posture_view(), now_ns),
        "throttle_reads": meta.get("throttle_reads"),
        "cgroup": meta.get("cgroup"),
        "memory": memory(snap.ledger_view(), meta),
        "ledger": ledger(snap.ledger_view()),
        "queues": queues,
        "saturated": saturated(queues, meta),
        "bulkheads": table_bulkheads.read(snap),
        "torn": list(snap.torn),
    }


def saturated(queues: list[dict], meta: dict) -> list[dict]:
    """The roles saturated now (fleet.rules.saturation), each with how far behind it is and
    what more cores would give; each queue's ``saturation`` gains the same derived fields."""
    plan, seats = meta.get("plan") or {}, meta.get("seats") or []
    refused = plan.get("tier_refused") or {}
    pinned_quota = refused.get("floor_cpus") if refused.get("tier") == "pinned" else None
    out = []
    for q in queues:
        sat = q.get("saturation")
        if sat is None:
            continue
        arrival, service = sat["arrival_rate"], sat["service_rate"]
        cores = len({c for seat in seats if q["name"] in seat.get("roles", ()) for c in seat.get("cpus", ())})
        est = saturation_rule.estimate(arrival, service, cores, binding=plan.get("binding", "?"),
                                       pinned_cores=sat["pinned_cores"], pinned_quota=pinned_quota)
        sat.update(backlog=q["queue_depth"], growth=round(arrival - service, 3),
                   drain_s=round(q["queue_depth"] / service, 3) if service > 0 else None,
                   estimate=est, estimate_line=saturation_rule.describe(est, arrival))
        if sat["saturated"]:
            out.append({"role": q["name"], **sat})
    return out


def build_projection(name: str, config, meta: dict | None, refused: Exception | None) -> dict:
    """The status document of a fleet that is not running: what `config` would boot.

    Args:
        meta: `fleet.rules.quota.Projection.meta` (plan, budget, seats, slot_seats), or None
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
    doc.update(plan=meta["plan"], budget=meta["budget"], seats=seats, role_processes=meta.get("role_processes", []),
               slots=slots, queues=queues, refused=None)
    return doc


def draining(since_ns: int) -> dict | None:
    """None, or the drain that refuses new submits: ``since`` (epoch seconds), ``since_utc``."""
    if not since_ns:
        return None
    return {"since": since_ns / 1e9, "since_utc": utc(since_ns / 1e9)}


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
    """One row per slot: its FSM state, who serves it and where, the role it last served and
    its role switches (slots switch roles, 002 §3.4), and its run-queue delay."""
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
    current = (dwell_ns or 0) if view["state"] == POSTURE_NAMES[CORDONED] else 0
    cordoned_ns = view["cordoned_ns"] + current
    return {
        **view,
        "dwell_s": None if dwell_ns is None else round(dwell_ns / 1e9, 3),
        "cordoned_s": round(cordoned_ns / 1e9, 3),
    }


def memory(ledger_view: dict, meta: dict) -> dict:
    """Workers gone outside an outcome: killed by the kernel's OOM killer (their units
    failed LaneDeath, its detail beginning ``oom``) and recycled over max_rss_mib; and
    which files the counts and the memory pressure are read from (None: not read)."""
    reads = meta.get("memory_reads") or {}
    return {"oom_kills": ledger_view.get("oom_kills", 0), "worker_recycles": ledger_view.get("worker_recycles", 0),
            "oom_kills_from": reads.get("oom_kills"), "oom_kills_unread": reads.get("reason"),
            "pressure_from": reads.get("pressure")}


def ledger(view: dict) -> dict:
    """Ledger counters, failures keyed by reason name (`fleet.rules.outcomes`); ``children``:
    the units submitted from inside running units (counted in ``submitted`` too)."""
    by_reason = {reason_name(code): n for code, n in enumerate(view["failed_by_reason"])}
    return {**view, "failed_by_reason": by_reason}


# ------------------------------------------------------------------ the runtime view (002 §14)

#: The plan's fields the runtime view carries (002 §14: fleet_booted, profile, quota_cpus,
#: binding, oversubscribed, tier_refused).
RUNTIME_PLAN_KEYS = ("profile", "quota_cpus", "binding", "oversubscribed", "tier_refused")


def runtime_view(doc: dict) -> dict:
    """`fleet.runtime_status()`'s document from a status document (`build`, a live fleet's)
    or a projection (`build_projection`, a fleet not built): the plan, the budget table
    (the seat/share rows) and the census, each entry with its lane-to-thread binding
    (pinned: a seat of its own; shared: a seat the I/O roles share; logical: a lane on
    another's seat). Pure."""
    booted = bool(doc.get("fleet_booted"))
    plan = doc.get("plan") or {}
    seats = {s.get("index", i): s for i, s in enumerate(doc.get("seats") or [])}
    view = {
        "fleet": doc.get("fleet"),
        "fleet_booted": booted,
        "plan": {"fleet_booted": booted, **{k: plan.get(k) for k in RUNTIME_PLAN_KEYS}},
        "budget": doc.get("budget"),
        "census": [],
    }
    if doc.get("refused"):
        view["refused"] = doc["refused"]
    if booted:
        view["quota"] = doc.get("quota")
        for row in doc.get("census") or []:
            seat = seats.get(row.get("seat"))
            view["census"].append({
                "slot": row.get("slot"), "role": row.get("role"), "state": row.get("state"),
                "seat": row.get("seat"), "seat_name": row.get("seat_name"), "pid": row.get("pid"),
                "binding": seat.get("binding") if seat else "logical",
            })
    else:
        for row in doc.get("slots") or []:
            view["census"].append({"slot": row["slot"], "role": row["role"], "state": None, "seat": row["seat"],
                                   "seat_name": row["seat_name"], "pid": None, "binding": row["binding"]})
    return view
