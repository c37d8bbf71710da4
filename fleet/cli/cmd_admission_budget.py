"""fleetctl admission budget: feed a provider's daily budget reading to a running fleet.

``admission budget PROVIDER --spent X [--limit Y]`` reports what the budget gate read for
PROVIDER today (``admission_budget``, `AdmissionPool.report_budget`): shown on every
bulkhead of that provider; at the limit the provider closes until the next UTC midnight
(reference 000 §8: read and shown, never reserved). Owner/root only (exit 77 otherwise).
An unknown provider or a bad amount is refused (``BadBudget``, exit 1) and changes nothing;
an amount that is no finite number >= 0 exits 2.
"""
from __future__ import annotations

import argparse
import math

from fleet.cli._common import add_name_argument, client


def _amount(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite amount >= 0")
    return value


def add_arguments(sub) -> None:
    """The ``budget`` action under ``fleetctl admission``."""
    budget = sub.add_parser("budget", help="report a provider's daily budget reading (owner/root only)")
    add_name_argument(budget)
    budget.add_argument("provider", metavar="PROVIDER", help="the provider whose budget was read")
    budget.add_argument("--spent", required=True, type=_amount, metavar="X", help="spent today (e.g. USD)")
    budget.add_argument("--limit", type=_amount, default=None, metavar="Y", help="the daily limit (omit: none)")
    budget.add_argument("--json", action="store_true", help="print the daemon's reply as JSON")


def run(args) -> tuple[dict, str]:
    """(the daemon's reply, the line to print)."""
    with client(args) as c:
        result = c.call("admission_budget", provider=args.provider, spent=args.spent, limit=args.limit)
    limit = "no limit" if result["limit"] is None else f"limit {result['limit']:g}"
    return result, f"{result['provider']}: spent {result['spent']:g} today, {limit}\n"
