"""fleetctl top: watch a fleet live, read from its shared-memory table.

Each refresh is what `fleetctl status` reads (fleet.shm.status.gather): a lock-free
snapshot of the table, opened read-only, so watching costs the fleet nothing, never
blocks it, and works for a member of fleetd's ``--socket-group`` (the table is 0640
for that group). Rates are the difference between two snapshots over the time
between them. `frame` (pure) turns the documents into lines; the curses loop only
draws them, clipped to the terminal, so a terminal of any size shows what fits.
"""
from __future__ import annotations

import os
import time

from fleet.rules.errors import EXIT_OK, EXIT_USAGE, FleetError, NotRunning
from fleet.rules.fsm import STATE_NAMES
from fleet.cli._common import add_name_argument, fleet_name
from fleet.cli.cmd_status import saturation_lines
from fleet.rules.vocab import BulkheadState
from fleet.rules.when import utc
from fleet.shm.table.bulkheads import held_until
from fleet.cli.cmd_status import duration, run_state

NAME = "top"
HELP = ("Watch the fleet live (q quits): roles with in-flight, queued and outcomes per second, slots by state, "
        "posture and its cause, bulkheads and closures, slot leases; read from its table, costs the fleet nothing.")

#: Keys that quit.
QUIT_KEYS = (ord("q"), ord("Q"))


class NoTerminal(FleetError):
    """top was asked to draw where there is no terminal it can drive."""

    exit_code = EXIT_USAGE


def add_arguments(parser) -> None:
    add_name_argument(parser)
    parser.add_argument("--interval", type=_interval, default=1.0, metavar="SECONDS",
                        help="seconds between refreshes (default 1)")
    parser.add_argument("--once", action="store_true",
                        help="print one frame (two snapshots --interval apart, for the rates) and exit; "
                        "what a terminal-less caller gets")


def _interval(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.05 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r}: give between 0.05 and 3600 seconds")
    return value


def run(args) -> int:
    name = fleet_name(args)
    sample = Sampler(name, args.trust_uids or ())
    sample()  # NotRunning (exit 69) before the screen is taken over
    if args.once:
        time.sleep(args.interval)
        print("\n".join(frame(*sample(), interval_s=args.interval)))
        return EXIT_OK
    import curses

    # the terminal's size from the terminal, not from $LINES/$COLUMNS: curses prefers them
    # when set (shells and tools export them), and they go stale at the first resize
    for stale in ("LINES", "COLUMNS"):
        os.environ.pop(stale, None)
    try:
        curses.wrapper(_watch, sample, args.interval)
    except curses.error as exc:  # no terminal (TERM unset, not a tty): say so, change nothing
        raise NoTerminal(f"cannot draw on this terminal ({exc}); use --once") from None
    return EXIT_OK


class Sampler:
    """Successive status documents of one fleet; each call returns (now, before, seconds
    between them); ``now`` is None while the fleet is not running (its NotRunning text in
    ``self.gone``)."""

    def __init__(self, name: str, trust_uids, clock=time.monotonic):
        from fleet.shm.status import gather

        self._gather = lambda: gather(name, delay_source="schedstat", trust_uids=trust_uids)
        self._clock = clock
        self._last = None
        self._last_t = None
        self.name = name
        self.gone: str | None = None

    def __call__(self):
        before, before_t = self._last, self._last_t
        try:
            doc = self._gather()
            self.gone = None
        except NotRunning as exc:
            if before_t is None:
                raise  # never seen running: the command's error
            doc, self.gone = None, str(exc)
        now_t = self._clock()
        self._last, self._last_t = doc, now_t
        return doc, before, (now_t - before_t) if before_t is not None else None, self.gone


# ------------------------------------------------------------------------------ pure


def frame(doc: dict | None, before: dict | None, elapsed_s: float | None, gone: str | None = None, *,
          interval_s: float = 1.0, wall_s: float | None = None) -> list[str]:
    """The screen's lines for status document ``doc`` (``before``: the previous one,
    ``elapsed_s`` seconds earlier, for the rates)."""
    wall = utc(time.time() if wall_s is None else wall_s)
    if doc is None:
        return [f"fleetctl top  {wall}  (q quits)", f"NOT RUNNING: {gone}"]
    rate_of = _rates(doc, before, elapsed_s)
    state = run_state(doc)
    g = doc["ledger"]
    outcomes = g["solved"] + g["failed"] + g["suppressed"]
    items = g["items"]["solved"] + g["items"]["failed"] + g["items"]["suppressed"]
    total_rate = rate_of.get(None)
    lines = [
        f"fleet {doc['fleet']}  {state}  pid {doc['creator_pid']}  up {duration(doc['uptime_s'])}  {wall}  "
        f"(every {interval_s:g}s; q quits)",
        f"outcomes  {outcomes:,} units ({items:,} items): solved {g['solved']:,}  failed {g['failed']:,}  "
        f"suppressed {g['suppressed']:,}  in flight {g['inflight']:,}  {_rate(total_rate)}",
        _posture_line(doc["posture"]),
        _slots_line(doc["census"]),
        *saturation_lines(doc.get("saturated")),
        "",
        *_table(("role", "kind", "in flight/slots", "queued/bound", "outcomes/s"),
                [(q["name"], q["kind"], f"{q['in_use']}/{q['slot_cap']}", f"{q['queue_depth']}/{q['queue_bound']}",
                  _rate(rate_of.get(q["name"]), bare=True)) for q in doc["queues"]]),
        "",
        *_bulkheads(doc.get("bulkheads") or []),
        *_leases(doc["census"]),
    ]
    if doc["torn"]:
        lines.append(f"TORN records a writer never finished: {', '.join(doc['torn'])}")
    return lines


def _rates(doc: dict, before: dict | None, elapsed_s: float | None) -> dict:
    """Outcomes per second: by role (a slot's finished units counted for the role it
    serves, else the one it last served) and for the fleet (key None, from the ledger)."""
    if before is None or not elapsed_s or before.get("boot_id") != doc.get("boot_id"):
        return {}
    rates: dict = {}
    old = {r["slot"]: r["done"] for r in before["census"]}
    for row in doc["census"]:
        role = row["role"] or row.get("last_role")
        done = row["done"] - old.get(row["slot"], row["done"])
        if role is not None and done > 0:
            rates[role] = rates.get(role, 0) + done / elapsed_s
    g, h = doc["ledger"], before["ledger"]
    finished = sum(g[k] - h[k] for k in ("solved", "failed", "suppressed"))
    rates[None] = max(0, finished) / elapsed_s
    return rates


def _rate(value, bare: bool = False) -> str:
    if value is None:
        return "-" if bare else ""
    return f"{value:.1f}" if bare else f"{value:.1f} outcomes/s"


def _posture_line(p: dict) -> str:
    return (f"posture   {p['state']} (cause {p['cause']}) for {duration(p['dwell_s'])}; entered {p['enter_count']}, "
            f"cordoned {duration(p['cordoned_s'])} in all; intake suppressed {p['suppressed']}")


def _slots_line(census: list[dict]) -> str:
    counts = {name: 0 for name in STATE_NAMES}
    for row in census:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    return f"slots     {len(census)}: " + "  ".join(f"{state} {n}" for state, n in counts.items())


def _bulkheads(rows: list[dict]) -> list[str]:
    if not rows:
        return ["bulkheads none (no provider pools)", ""]
    table = []
    for b in rows:
        until = held_until(b)
        table.append((b["pool"], b["state"] + (" (daily limit)" if b.get("closed_by_daily_limit") else ""),
                      b["cause"] or "-", utc(until), str(b["running"]), str(b["waiting"]),
                      str(b["successes"]), str(b["failures"])))
    closed = sum(1 for b in rows if b["state"] == BulkheadState.CLOSED)
    return [f"bulkheads {len(rows)} provider pool(s), {closed} closed",
            *_table(("pool", "state", "cause", "until (UTC)", "running", "waiting", "ok", "failed"), table), ""]


def _leases(census: list[dict]) -> list[str]:
    held = [r for r in census if r["state"] != "Idle"]
    rows = [(str(r["slot"]), r["state"], r["role"] or "-", "-" if r["key"] is None else str(r["key"]),
             str(r["unit"] or "-"), str(r["pid"] or "-")) for r in held]
    return [f"leases    {len(held)} slot(s) leased", *_table(("slot", "state", "role", "key", "unit", "pid"), rows)]


def _table(headers, rows) -> list[str]:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    fmt = "  " + "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip()] + [fmt.format(*r).rstrip() for r in rows]


# ------------------------------------------------------------------------- the screen


def _watch(screen, sample, interval_s: float) -> None:
    import curses

    try:
        curses.curs_set(0)
    except curses.error:
        pass  # a terminal that cannot hide the cursor
    screen.timeout(int(interval_s * 1000))
    while True:
        draw(screen, frame(*sample(), interval_s=interval_s))
        key = screen.getch()  # waits up to the interval; a resize wakes it (KEY_RESIZE)
        if key in QUIT_KEYS:
            return
        if key == curses.KEY_RESIZE:
            # the terminal rewrapped what it showed: repaint every cell, not only the changes
            curses.update_lines_cols()
            screen.clear()


def draw(screen, lines: list[str]) -> None:
    """``lines`` clipped to the screen: what does not fit is left out, never an error."""
    import curses

    screen.erase()
    height, width = screen.getmaxyx()
    for y, line in enumerate(lines[:height]):
        try:
            # the bottom-right cell cannot be written without curses moving past the end
            screen.addnstr(y, 0, line, max(0, width - 1))
        except curses.error:
            pass
    screen.refresh()
