"""fleetctl leases: the host-group store's live requests; approve or reject one held for approval.

``fleetctl leases``: the requests holding capacity first (admitted, or awaiting
approval; soonest lease expiry first), then the queue in queue order, each with its
effective priority (base + 1 per aging interval waited) and, for a lease, its
revision and the seconds until it expires; then every orchestrator that heartbeats
in the store, live or lapsed (a lapsed one's queued requests are cancelled, never
admitted). Read-only: nothing is reconciled, so a lease past its expiry shows
``expired`` until a store transaction times it out. ``--json`` prints
``{"requests": [...], "orchestrators": [...]}``.

``fleetctl leases approve ID [--reason TEXT]`` lets a request awaiting approval
dispatch (it is admitted under the lease it holds); ``reject`` denies it and gives its
capacity to the next request. Either prints the request's record (``--json``: as
JSON); audited under the operator's name (``fleetctl@HOST``). Store errors exit with
their code (90 unreachable, 91 schema too new, 94 an unknown request or one that
awaits no approval: nothing changed).
"""
from __future__ import annotations

import argparse
import json
import sys

from fleet.rules.errors import EXIT_OK
from fleet.rules.vocab import lease_states
from fleet.rules.when import utc
from fleet.cli._store import add_store_argument, open_for_operator

NAME = "leases"
HELP = ("List the host-group store's live requests with effective priority and lease expiry, and its live and "
        "lapsed orchestrators; approve or reject a request held for approval.")


def add_arguments(parser) -> None:
    add_store_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    sub = parser.add_subparsers(dest="leases_command", metavar="ACTION")
    for verb, what in (("approve", "let a request awaiting approval dispatch"),
                       ("reject", "deny a request awaiting approval (its capacity goes to the next one)")):
        p = sub.add_parser(verb, help=what, description=what)
        p.add_argument("request_id", metavar="ID", help="the request's id (as `fleetctl leases` lists it)")
        p.add_argument("--reason", default=f"{verb}d by an operator", help="why, for the audit trail")
        # given after the action too; argparse.SUPPRESS keeps a --store given before it
        p.add_argument("--store", default=argparse.SUPPRESS, metavar="URL", help="the store (as above)")
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the record as JSON")


def run(args) -> int:
    if getattr(args, "leases_command", None):
        return _decide(args)
    with open_for_operator(args) as store:
        records, policy, now = store.snapshot()
        beats = store.orchestrators()
    rows = [row_of(r, policy, now) for r in records]
    orchestrators = [orchestrator_row(o, now) for o in beats]
    if args.json:
        sys.stdout.write(json.dumps({"requests": rows, "orchestrators": orchestrators}, indent=2) + "\n")
    else:
        sys.stdout.write(render(rows) + render_orchestrators(orchestrators))
    return EXIT_OK


def _decide(args) -> int:
    with open_for_operator(args) as store:
        decide = store.approve if args.leases_command == "approve" else store.reject
        record = decide(args.request_id, args.reason)
        _records, policy, now = store.snapshot()
    row = row_of(record, policy, now)
    sys.stdout.write(json.dumps(row, indent=2) + "\n" if args.json else render([row]))
    return EXIT_OK


# ------------------------------------------------------------------------------ pure


def row_of(record, policy, now: float) -> dict:
    """One listing row: the record plus its effective priority and lease time left at `now`."""
    from admission.store.rules import effective_priority

    row = record.to_dict()
    row["effective_priority"] = effective_priority(record, now, policy.aging_interval)
    row["waited_s"] = round(now - record.submitted_at, 3)
    row["lease_expires_in_s"] = None if record.lease_expires is None \
        or record.state not in lease_states.HOLDING_STATES else round(record.lease_expires - now, 3)
    row["lease_expires_utc"] = utc(record.lease_expires) if row["lease_expires_in_s"] is not None else None
    return row


def orchestrator_row(beat, now: float) -> dict:
    """One orchestrator's heartbeat at `now`: live or lapsed, and for how long."""
    live = beat.live(now)
    return {"id": beat.id, "state": "live" if live else "lapsed", "beat_s_ago": round(now - beat.beat_at, 3),
            "lapses_in_s": round(beat.lapses_at - now, 3), "up_s": round(now - beat.started_at, 3) if live else None}


def render_orchestrators(rows: list[dict]) -> str:
    if not rows:
        return "no orchestrator heartbeats\n"
    table = [("ORCHESTRATOR", "STATE", "LAST BEAT", "LAPSE")]
    for r in rows:
        lapse = f"in {r['lapses_in_s']:.1f}s" if r["state"] == "live" else f"{-r['lapses_in_s']:.1f}s ago"
        table.append((r["id"], r["state"], f"{r['beat_s_ago']:.1f}s ago", lapse))
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    return "\n" + "".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n" for row in table)


_COLUMNS = ("ID", "STATE", "ORCHESTRATOR", "ENVIRONMENT", "PROVIDER", "TIER", "PRIO", "EFF", "WAITED", "LEASE")


def render(rows: list[dict]) -> str:
    """A plain table; ``(none)`` when the store holds no live request."""
    if not rows:
        return "no queued or admitted requests\n"
    table = [_COLUMNS]
    for r in rows:
        if r["state"] in lease_states.HOLDING_STATES:
            left = r["lease_expires_in_s"]
            lease = f"rev {r['revision']}, " + (f"{left:.1f}s left" if left > 0 else "expired") \
                + f" (until {r['lease_expires_utc']})"
        else:
            lease = "-"
        table.append((r["id"], r["state"], r["orchestrator"], r["environment"], r["provider"], r["tier"],
                      str(r["priority"]), str(r["effective_priority"]), f"{r['waited_s']:.1f}s", lease))
    widths = [max(len(row[i]) for row in table) for i in range(len(_COLUMNS))]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n" for row in table)
