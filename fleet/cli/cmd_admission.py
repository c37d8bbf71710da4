"""fleetctl admission: the provider admission of a running fleet (reference 000).

``admission show`` prints what the fleet's own process knows: every bulkhead (state,
closure cause and end, counters), the lane x bulkhead rows, live closures, the
starving list and the units waiting with their reason (``admission_show``).

``admission close POOL --until T`` takes a provider (``POOL`` = ``provider``) or one
key (``provider/credential``) out until T; ``admission reopen POOL`` lifts a closure
(an operator who topped up a key). Both are owner/root only (exit 77 otherwise) and
kept across a fleetd restart. T is a UTC time (``2026-10-05T00:00:00Z``, ``2026-10-05
00:00``), epoch seconds, or ``+DURATION`` from now (``+35m``, ``+2h``, ``+90s``). An
unknown pool or a time not in the future is refused (``BadPool``, exit 1) and changes
nothing; a malformed POOL or T exits 2.
"""
from __future__ import annotations

import calendar
import json
import math
import re
import sys
import time

from fleet.rules.errors import EXIT_OK, EXIT_USAGE, FleetError
from fleet.rules.when import utc
from fleet.cli._common import add_name_argument, client

NAME = "admission"
HELP = "Show the provider admission's bulkheads, closures and starving list; close or reopen a provider or key."

_DURATION = re.compile(r"\+(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_FORMATS = ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%MZ", "%Y-%m-%d %H:%M",
            "%Y-%m-%d")


class AdmissionArgumentError(FleetError, ValueError):
    """A time that is none of the accepted forms."""

    exit_code = EXIT_USAGE


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="admission_command", metavar="ACTION")
    sub.required = True
    show = sub.add_parser("show", help="bulkheads, lane rows, closures, starving list and waiting units")
    add_name_argument(show)
    show.add_argument("--json", action="store_true", help="print the daemon's reply as JSON")
    close = sub.add_parser("close", help="close a provider or key until a time (owner/root only)")
    add_name_argument(close)
    close.add_argument("pool", metavar="POOL", help="provider, or provider/credential")
    close.add_argument("--until", required=True, metavar="T",
                       help="UTC time (2026-10-05T00:00:00Z), epoch seconds, or +DURATION (+35m, +2h)")
    close.add_argument("--message", default="", help="why (shown with the closure)")
    close.add_argument("--json", action="store_true", help="print the daemon's reply as JSON")
    reopen = sub.add_parser("reopen", help="reopen a closed provider or key (owner/root only)")
    add_name_argument(reopen)
    reopen.add_argument("pool", metavar="POOL", help="provider, or provider/credential")
    reopen.add_argument("--json", action="store_true", help="print the daemon's reply as JSON")


def run(args) -> int:
    if args.admission_command == "close":
        until = parse_until(args.until, time.time())
        with client(args) as c:
            result = c.call("admission_close", pool=args.pool, until=until, message=args.message)
        text = f"{result['pool']}: closed until {utc(result['closed_until'])}\n"
    elif args.admission_command == "reopen":
        with client(args) as c:
            result = c.call("admission_reopen", pool=args.pool)
        text = f"{result['pool']}: {'reopened' if result['reopened'] else 'was not closed; nothing changed'}\n"
    else:
        with client(args) as c:
            result = c.call("admission_show")
        text = render(result)
    sys.stdout.write(json.dumps(result, indent=2) + "\n" if args.json else text)
    return EXIT_OK


# ------------------------------------------------------------------------------ pure


def parse_until(text: str, now: float) -> float:
    """A closing time as UTC epoch seconds (see the module doc); AdmissionArgumentError if none."""
    text = text.strip()
    m = _DURATION.fullmatch(text)
    if m:
        return now + float(m.group(1)) * _UNITS[m.group(2)]
    try:
        epoch = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(epoch):
            return epoch
        raise AdmissionArgumentError(f"--until {text!r}: a closure ends at a finite time")
    for fmt in _FORMATS:
        try:
            return float(calendar.timegm(time.strptime(text, fmt)))
        except ValueError:
            continue
    raise AdmissionArgumentError(f"--until {text!r}: expected a UTC time (2026-10-05T00:00:00Z), "
                                 "epoch seconds, or +DURATION (+35m, +2h)")




def render(doc: dict) -> str:
    from fleet.cli.cmd_status import _table, render_admission, render_bulkheads

    lines = render_bulkheads(doc.get("bulkheads", [])) or ["bulkheads none yet (no unit has asked for a provider)"]
    lanes = [(_dash(r["lane"]), r["pool"], str(r["running"]), str(r["waiting"]), str(r["delegated"]),
              str(r["moved_in"]), str(r["refused"]), f"${r['spent_today']:.4f}") for r in doc.get("lanes", [])]
    if lanes:
        lines += ["lanes"] + _table(("lane", "pool", "running", "waiting", "delegated", "moved in", "refused",
                                     "spent today"), lanes)
    for b in doc.get("bulkheads", []):
        if b.get("pinned_wait"):
            lines.append(f"pinned    {b['pool']}: {b['pinned_wait']}")
    for c in doc.get("closures", []):
        who = c["provider"] + (f"/{c['credential']}" if c.get("credential") else "")
        lines.append(f"closed    {who}: {c['cause']}{' (daily limit)' if c['daily'] else ''} until {utc(c['until'])}"
                     + (f": {c['message']}" if c.get("message") else ""))
    lines += render_admission(doc)
    return "\n".join(lines) + "\n"


def _dash(v) -> str:
    return "-" if v is None else str(v)
