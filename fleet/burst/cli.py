"""fleet-burst: replay recorded bursts against a real fleet and a local provider.

    fleet-burst replay TRACE [--modes none,cap,admission] [--speed X] [--seed N]
                             [--report DIR] [--cap K] [--profiles auto,pinned] [--name FLEET]
    fleet-burst record --name FLEET -o TRACE [--source FILE] [--duration S] [--count N]
    fleet-burst show REPORT
"""
from __future__ import annotations

import argparse
import os
import sys

# Its exit codes (the registry: fleet.rules.errors); EXIT_FAILURE is anything not named.
from fleet.rules.errors import (EXIT_BAD_REPORT, EXIT_BAD_TRACE, EXIT_FAILURE, EXIT_FLEET_FAILED, EXIT_NO_CGROUP,
                                EXIT_NO_FLEET, EXIT_OK)
from fleet.rules.errors import EXIT_BURST_USAGE as EXIT_USAGE
# stopped by SIGINT or SIGTERM: 128 + the signal (130, 143), once the fleet and the simulator are gone

EXIT_CODES = f"""exit codes:
  {EXIT_OK}   done (replay: every mode ran and the ledger was exact)
  {EXIT_FAILURE}   another failure (replay and show: the burst extra is not installed, named on stderr)
  {EXIT_USAGE}  bad arguments
  {EXIT_BAD_TRACE}  bad trace (one line per bad line: FILE:LINE: what is wrong; nothing ran)
  {EXIT_BAD_REPORT}  show: the report cannot be read
  {EXIT_NO_FLEET}  record: no fleet of that name runs, or it does not record arrivals
  {EXIT_FLEET_FAILED}  the replay fleet or its provider simulator did not start, or a unit did not get
      exactly one outcome
  {EXIT_NO_CGROUP}  --cpu-quota needs root and a v1 cpu cgroup hierarchy
  130, 143  stopped by SIGINT (Ctrl-C) or SIGTERM; the fleet, its simulator and its
      shared memory are gone first"""


def _modes(text: str) -> tuple[str, ...]:
    from fleet.burst.trace import MODES

    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in MODES]
    if not modes or bad:
        raise argparse.ArgumentTypeError(f"modes are a comma list of {', '.join(MODES)}; got {text!r}")
    return modes


def _profiles(text: str) -> tuple[str, ...]:
    from fleet.burst.trace import PROFILES

    profiles = tuple(p.strip() for p in text.split(",") if p.strip())
    if not profiles or any(p not in PROFILES for p in profiles):
        raise argparse.ArgumentTypeError(f"profiles are a comma list of {', '.join(PROFILES)}; got {text!r}")
    return profiles


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return v


def _speed(text: str) -> float:
    from fleet.burst.trace import SPEEDS

    v = _positive(text)
    if not SPEEDS[0] <= v <= SPEEDS[1]:
        raise argparse.ArgumentTypeError(f"must be from {SPEEDS[0]:g} to {SPEEDS[1]:g}, got {text!r}")
    return v


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return v


def _fleet_name(text: str) -> str:
    from fleet.rules.names import InvalidFleetName, validate_fleet_name

    try:
        return validate_fleet_name(text)
    except InvalidFleetName as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Parser(argparse.ArgumentParser):
    """argparse exiting EXIT_USAGE (its own default is 2) for bad arguments."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="fleet-burst", description=__doc__.splitlines()[0] if __doc__ else None,
                                  epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("replay", help="replay a trace once per mode and compare", epilog=EXIT_CODES,
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="Replay TRACE against a real embedded fleet (named, so `fleetctl status --name "
                                    "NAME` reads it meanwhile) and a local provider simulator on 127.0.0.1, once per "
                                    "mode, same seed; print the comparison and write report.json, report.md and "
                                    "timeline.png.")
    rp.add_argument("trace", help="a trace file (JSON lines; see docs/burst.md, 'Burst traces')")
    rp.add_argument("--modes", type=_modes, default=None,
                    help="comma list of none, cap, admission (the fleet's own provider admission: submit with route=); "
                         "default: the trace header's, else all three")
    rp.add_argument("--speed", type=_speed, default=None,
                    help="trace seconds per real second (default: the header's speed, else 60; CPU work is never scaled)")
    rp.add_argument("--seed", type=int, default=None, help="RNG seed of the latency draws and the admission "
                                                            "(default: the trace header's)")
    rp.add_argument("--report", default="burst-report", metavar="DIR", help="where to write the report "
                                                                            "(default ./burst-report)")
    rp.add_argument("--cap", type=_count, default=None, metavar="K",
                    help="the cap mode's per-pool limit (default: the header's cap, else each pool's k)")
    rp.add_argument("--profiles", type=_profiles, default=None,
                    help="fleet profiles to run, comma list of auto, serial, pinned (default: the header's)")
    rp.add_argument("--name", type=_fleet_name, default=None, help="the replay fleet's name (default burst-<pid>)")
    rp.add_argument("--cpu-quota", type=_positive, default=None, metavar="CPUS",
                    help="run inside the tool's own v1 cpu cgroup with this CFS quota (root; made and removed "
                         "by the tool). Below 2 CPUs the fleet reserves no core: its loop runs ahead of its "
                         "workers by priority")
    rp.add_argument("--no-progress", action="store_true", help="no progress bar")
    rp.add_argument("--no-realtime", action="store_true",
                    help="keep the replay's threads in the normal scheduling class (by default, as root, the "
                         "driver and the threads sharing its GIL run real-time while a mode runs, so arrivals "
                         "are on time; the report's lag_ms.driver says which class ran)")
    rec = sub.add_parser("record", help="capture arrivals from a running fleetd into a trace", epilog=EXIT_CODES,
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         description="Tail the arrival log of a running fleetd (config: [record] enabled = true) "
                                     "from now on and write what arrives as a trace. Stops after --duration "
                                     "seconds, after --count arrivals, when fleetd stops, or on Ctrl-C.")
    rec.add_argument("--name", type=_fleet_name, required=True, help="the fleet's name")
    rec.add_argument("-o", "--output", required=True, metavar="TRACE", help="the trace file to write")
    rec.add_argument("--source", default=None, metavar="FILE",
                     help="the arrival log (default: [record] path's default, <runtime dir>/<name>.arrivals.jsonl)")
    rec.add_argument("--duration", type=_positive, default=None, metavar="S", help="stop after S seconds")
    rec.add_argument("--count", type=_count, default=None, metavar="N", help="stop after N arrivals")
    sh = sub.add_parser("show", help="re-render a saved report", epilog=EXIT_CODES,
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="Print a saved report's table and re-draw its report.md and timeline.png.")
    sh.add_argument("report", help="a report.json, or the folder holding one")
    return top


#: What a command needs beyond fleet's own dependencies: the ``burst`` extra (pyproject.toml).
#: replay: the handlers call the simulator over HTTP, the report draws its timeline, and
#: the progress bar (unless --no-progress); show: the timeline again; record: nothing.
EXTRA = "burst"


def needs_of(args) -> tuple[str, ...]:
    """The modules of the extra that command `args` imports."""
    if args.command == "replay":
        return ("httpx", "matplotlib") + (() if args.no_progress else ("tqdm",))
    return ("matplotlib",) if args.command == "show" else ()


def missing_extra(args) -> str | None:
    """One line naming the extra to install when a module `args`'s command needs is absent; else None."""
    import importlib.util

    absent = [m for m in needs_of(args) if importlib.util.find_spec(m) is None]
    if not absent:
        return None
    return (f"fleet-burst: {args.command} needs {' and '.join(absent)}, not installed: install fleet's "
            f"{EXTRA!r} extra (pip install 'fleet[{EXTRA}]', or pip install '.[{EXTRA}]' from a checkout)")


def main(argv=None) -> int:
    from fleet.burst.stop import Stopped, on_signals

    args = parser().parse_args(argv)
    missing = missing_extra(args)
    if missing is not None:
        print(missing, file=sys.stderr)
        return EXIT_FAILURE
    try:
        with on_signals():
            return {"replay": _replay, "record": _record, "show": _show}[args.command](args)
    except Stopped as stop:  # unwound: the fleet and the simulator are gone
        print(f"fleet-burst: stopped by {stop.name}", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:
        return 130


def _replay(args) -> int:
    from fleet.burst import report as R
    from fleet.burst.cpuquota import CpuQuotaUnavailable, check_available
    from fleet.burst.replay import FleetFailed
    from fleet.burst.runner import replay
    from fleet.burst.simulator import SimulatorError
    from fleet.burst.trace import TraceError, load

    if args.cpu_quota is not None:
        try:
            check_available()
        except CpuQuotaUnavailable as exc:
            print(f"fleet-burst: {exc}", file=sys.stderr)
            return EXIT_NO_CGROUP
    try:
        trace = load(args.trace)
    except TraceError as exc:
        print(f"fleet-burst: {exc}", file=sys.stderr)
        return EXIT_BAD_TRACE
    try:
        rep = replay(trace, modes=args.modes, speed=args.speed or trace.header.speed or 60.0, seed=args.seed, cap=args.cap,
                     profiles=args.profiles, name=args.name, progress=not args.no_progress,
                     cpu_quota=args.cpu_quota, realtime=not args.no_realtime,
                     say=lambda line: print(f"fleet-burst: {line}", file=sys.stderr, flush=True))
    except CpuQuotaUnavailable as exc:
        print(f"fleet-burst: {exc}", file=sys.stderr)
        return EXIT_NO_CGROUP
    except (FleetFailed, SimulatorError) as exc:
        print(f"fleet-burst: {exc}", file=sys.stderr)
        return EXIT_FLEET_FAILED
    paths = R.write(rep, args.report)
    print(R.console(rep, f"{paths['md']} (beside it: report.json, timeline.png)"))
    if not all(m["ledger"]["exact"] for m in rep["modes"]):
        print("fleet-burst: a unit did not get exactly one outcome (see ledger in the report)", file=sys.stderr)
        return EXIT_FLEET_FAILED
    return EXIT_OK


def _record(args) -> int:
    from fleet.burst.record import NoRecording, capture

    try:
        n = capture(args.name, args.output, source=args.source, duration=args.duration, count=args.count,
                    on_ready=lambda path: print(f"recording arrivals of {args.name} from {path}", file=sys.stderr,
                                                flush=True))
    except NoRecording as exc:
        print(f"fleet-burst: {exc}", file=sys.stderr)
        return EXIT_NO_FLEET
    print(f"recorded {n} arrival(s) into {args.output}")
    return EXIT_OK


def _show(args) -> int:
    from fleet.burst import report as R

    try:
        rep = R.load(args.report)
    except R.ReportError as exc:
        print(f"fleet-burst: {exc}", file=sys.stderr)
        return EXIT_BAD_REPORT
    folder = args.report if os.path.isdir(args.report) else os.path.dirname(os.path.abspath(args.report))
    paths = R.render(rep, folder)
    print(R.console(rep, f"{paths['md']} (re-drawn, and timeline.png)"))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
