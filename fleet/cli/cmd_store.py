"""fleetctl store: check the host-group store, or read its audit trail.

``store check`` reaches the store and reports its url (password hidden), schema
version against the one this code supports, and the clock skew between this host
and the database. Exit codes: 0 fine; 90 unreachable; 91 schema newer than this
code; 95 the skew is larger than ``--max-skew`` (leases are judged by clocks, so
hosts of one group must agree on the time).

``store events`` prints the audit trail (every queue, admission, renewal,
release, cancellation, timeout, denial, preemption, policy change, provider closure
and closure reopen).
"""
from __future__ import annotations

import json
import sys

from fleet.rules.when import utc
from fleet.rules.errors import EXIT_CLOCK_SKEW, EXIT_OK
from fleet.cli._store import add_store_argument, open_for_operator

NAME = "store"
HELP = "Check the host-group store (reachable, schema version, clock skew) or print its audit events."


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="store_command", metavar="ACTION")
    sub.required = True
    check = sub.add_parser("check", help="reachability, schema version, clock skew (exit 95 over --max-skew)")
    add_store_argument(check)
    check.add_argument("--max-skew", type=_seconds, default=1.0, metavar="SECONDS",
                       help="largest acceptable |database clock - host clock| (default 1.0)")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    events = sub.add_parser("events", help="the audit trail, oldest first")
    add_store_argument(events)
    events.add_argument("--request", default=None, metavar="ID", help="only this request's events")
    events.add_argument("--since", type=int, default=0, metavar="SEQ", help="only events after this sequence")
    events.add_argument("--limit", type=int, default=None, metavar="N", help="at most N events")
    events.add_argument("--json", action="store_true", help="print the events as JSON")


def run(args) -> int:
    if args.store_command == "events":
        return _events(args)
    with open_for_operator(args) as store:
        health = store.check()
    report = {"url": health.url, "reachable": True, "schema_version": health.schema_version,
              "supported_schema_version": health.supported_version, "host_time": health.host_time,
              "db_time": health.db_time, "skew_s": round(health.skew, 6), "max_skew_s": args.max_skew}
    skewed = too_skewed(health, args.max_skew)
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(
            f"store      {health.url}\nreachable  yes\n"
            f"schema     version {health.schema_version} (this code: {health.supported_version})\n"
            f"clock skew {health.skew:+.3f}s (database - host){'  TOO LARGE' if skewed else ''}\n")
    return EXIT_CLOCK_SKEW if skewed else EXIT_OK


def too_skewed(health, max_skew: float) -> bool:
    """Whether the database's and this host's clocks disagree by more than `max_skew` seconds."""
    return abs(health.skew) > max_skew


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError(text)
    return value


def _events(args) -> int:
    with open_for_operator(args) as store:
        events = store.events(request_id=args.request, since=args.since, limit=args.limit)
    if args.json:
        sys.stdout.write(json.dumps([{**e.__dict__, "at_utc": utc(e.at, ms=True)} for e in events], indent=2) + "\n")
    else:
        for e in events:
            sys.stdout.write(f"{e.seq:>6}  {utc(e.at, ms=True)}  {e.kind:<9}  {e.request_id or '-':<20}  {e.actor}  "
                             f"{e.reason}\n")
    return EXIT_OK
