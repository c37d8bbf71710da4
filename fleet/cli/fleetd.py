"""fleetd: run one fleet in the foreground (systemd's ``Type=notify`` service).

    fleetd --config /etc/fleet/app.toml [--name app] [--grace 30] [--log-level info]
    fleetd --print-unit [fleetd@.service|fleetd.service]

``--print-unit`` writes the systemd unit with this install's fleetd in ExecStart
(fleet.service.units) and exits; redirect it to /etc/systemd/system/.

See fleet.service.daemon for what it does and its signals. A boot refusal prints one line
on stderr (``fleetd: <ErrorType>: <what was wrong>``) and exits with the error's
code: 78 invalid config, 82 the fleet is already running (the line names its pid),
80/81/84 the CPU quota cannot host the plan (84: the declared peaks exceed it), 2 bad usage.
"""
from __future__ import annotations

import argparse
import logging
import sys

from fleet.rules.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, FleetError

LOG_LEVELS = ("debug", "info", "warning", "error")


def build_parser() -> argparse.ArgumentParser:
    from fleet.service.daemon import DEFAULT_GRACE_S, DEFAULT_LINGER_S

    parser = argparse.ArgumentParser(
        prog="fleetd",
        description="Run a fleet in the foreground: boot its workers, serve its control socket, "
        "speak sd_notify. SIGTERM drains and exits 0; SIGINT stops fast; SIGHUP reloads the config.",
    )
    from fleet.service.units import UNIT_NAMES

    parser.add_argument("--config", metavar="PATH", help="the fleet's TOML config (required to run)")
    parser.add_argument("--print-unit", nargs="?", const=UNIT_NAMES[0], choices=UNIT_NAMES, metavar="UNIT",
                        help=f"print the systemd unit ({' or '.join(UNIT_NAMES)}, default {UNIT_NAMES[0]}) with "
                        "this install's fleetd in ExecStart, and exit")
    parser.add_argument("--name", metavar="NAME", help="the fleet's name (overrides [fleet] name in the config)")
    parser.add_argument("--grace", type=_seconds, default=DEFAULT_GRACE_S, metavar="SECONDS",
                        help="on SIGTERM, how long queued units may still start before they fail with "
                        f"Shutdown (default {DEFAULT_GRACE_S:g}; keep it well below TimeoutStopSec)")
    parser.add_argument("--linger", type=_seconds, default=DEFAULT_LINGER_S, metavar="SECONDS",
                        help="after the fleet stops, how long to wait for clients to collect their "
                        f"outcomes (default {DEFAULT_LINGER_S:g})")
    parser.add_argument("--socket-group", metavar="GROUP", default=None,
                        help="group (name or gid) whose members may run read-only commands: it is given "
                        "the control socket and read access to the shared table (fleetctl status), never "
                        "the data segment (default: the socket gets the daemon's group; the table is the "
                        "daemon user's only)")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="default info")
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds >= 0")
    return value


def _group(text: str | None):
    return int(text) if text is not None and text.isdigit() else text


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.print_unit:
        from fleet.service import units

        sys.stdout.write(units.render(units.shipped(args.print_unit), units.this_fleetd()))
        return EXIT_OK
    if args.config is None:
        parser.error("--config is required (or --print-unit)")
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        stream=sys.stderr,
        # journald adds the time and the unit; keep a line short and greppable
        format="fleetd[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    from fleet.service.daemon import Daemon, Options

    options = Options(config_path=args.config, name=args.name, grace_s=args.grace, linger_s=args.linger,
                      socket_group=_group(args.socket_group), title_args=tuple(sys.argv[1:] if argv is None else argv))
    try:
        return Daemon(options).run()
    except FleetError as exc:
        print(f"fleetd: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # e.g. the runtime dir cannot be created
        print(f"fleetd: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:  # SIGINT before the handlers were installed
        return EXIT_USAGE + 128


if __name__ == "__main__":
    sys.exit(main())
