"""fleetctl plan: the tier plan and CPU budget for a quota, without booting anything.

What it plans: ``--config PATH``, else the fleet's installed config
(``/etc/fleet/<name>.toml``, the name from --name, $FLEET_NAME or the default) when it
exists, else the built-in reference profile, and its first line says which.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from admission.records import replace
from fleet.host import cgroup
from fleet.rules.budget import json_number
from fleet.cli._common import NAME_PRECEDENCE, fleet_name
from fleet.runtime.config import CONFIG_DIR, installed_config, load_config
from fleet.rules.errors import EXIT_OK
from fleet.rules.plan import PROFILES, fractional_note, resolve
from fleet.rules.ranges import config_range
from fleet.rules.processes import describe, role_processes
from fleet.rules.roles import RoleSet
from fleet.rules import seats

NAME = "plan"
HELP = ("Show the tier plan, the CPU budget and the worker processes each role would run on for a quota "
        "(dry run; boots nothing).")


def cpus_argument(text: str) -> float:
    """``--cpus``: a number in the range ``fleet.cpus`` has in a config (`fleet.rules.ranges`),
    so a dry run plans nothing a boot would refuse to read (and lays out no billion CPUs)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of CPUs, got {text!r}") from None
    why = config_range("fleet.cpus").problem(value)
    if why:
        raise argparse.ArgumentTypeError(f"{why} (the range of fleet.cpus)")
    return value


def add_arguments(parser) -> None:
    parser.add_argument("--cpus", type=cpus_argument, metavar="Q",
                        help=f"quota: {config_range('fleet.cpus')} (default: config, else detected)")
    parser.add_argument("--profile", choices=PROFILES, help="force a profile (default: config, else auto)")
    parser.add_argument("--config", metavar="PATH",
                        help=f"fleet TOML config (default: {CONFIG_DIR}/<name>.toml if it exists, else the "
                        "built-in reference profile)")
    parser.add_argument("--name", default=None, metavar="NAME",
                        help=f"the fleet whose {CONFIG_DIR}/<name>.toml to plan when --config is not given "
                        f"(precedence: {NAME_PRECEDENCE})")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _quota(args, config) -> tuple[float, str]:
    if args.cpus is not None:
        return args.cpus, "--cpus"
    if config.cpus is not None:
        return config.cpus, "config fleet.cpus"
    limit = cgroup.effective_cpus()
    return limit.cpus, "detected"


def config_path(args) -> str | None:
    """The config to plan: --config, else the fleet's installed one, else None (reference profile)."""
    return args.config or installed_config(fleet_name(args))


def config_line(path: str | None, config, name: str) -> str:
    """The first line: what is planned. The reference profile names its roles, so nobody
    takes solver and simdriver for their own."""
    if path is None:
        roles = ", ".join(r.name for r in config.roles)
        return (f"{'config':<16}none: the built-in reference profile (roles {roles}); "
                f"give --config PATH or write {CONFIG_DIR}/{name}.toml")
    return f"{'config':<16}{path} (fleet {config.name})"


def run(args) -> int:
    path = config_path(args)
    config = load_config(path)
    quota, origin = _quota(args, config)
    plan = resolve(quota, args.profile or config.profile, config.roles, config.budget)
    processes = plan_processes(plan, config.roles)
    if args.json:
        out = plan.to_dict()
        out["plan"]["quota_source"] = origin
        out["config"] = path  # null: the built-in reference profile
        out["role_processes"] = processes
        print(json.dumps(out, indent=2))
    else:
        sys.stdout.write(config_line(path, config, fleet_name(args)) + "\n" + render(plan, origin, processes))
    return EXIT_OK


def plan_processes(plan, roles) -> list[dict]:
    """The worker processes each role would run on under `plan` (`fleet.rules.processes`).
    A dry run lays the seats out as if every declared role had a handler (the
    reference profile names none), on CPUs numbered 0..Q-1."""
    active = RoleSet(tuple(r if r.handler else replace(r, handler="dry.run:unit") for r in roles))
    layout = seats.layout(plan, active, list(range(max(1, math.ceil(plan.quota_cpus)))))
    meta = {**layout.to_meta(), "slot_roles": [spec.role for spec in layout.slots]}
    return role_processes(meta, roles)


def _cell(value) -> str:
    return "-" if value is None else str(json_number(value))


def render(plan, origin: str = "--cpus", processes=()) -> str:
    """The plan as a human-readable table; `processes` from `plan_processes`."""
    budget = plan.budget
    refused = plan.tier_refused
    lines = [
        f"{'quota':<16}{_cell(plan.quota_cpus)} CPUs ({origin})",
        f"{'profile':<16}{plan.profile} -> {plan.binding} binding",
        f"{'oversubscribed':<16}{'YES' if plan.oversubscribed else 'no'}",
        f"{'tier refused':<16}{'-' if refused is None else f'{refused.tier}: {refused.message}'}",
        f"{'fractional':<16}{fractional_note(plan) or 'no'}",
        "",
        f"{'consumer':<18}{'cores':>7}{'threads':>9}  rule",
    ]
    for share in budget.consumers:
        mark = f" (override; {share.rule_gives()})" if share.overridden else ""
        lines.append(f"{share.name:<18}{_cell(share.cores):>7}{_cell(share.threads):>9}  {share.rule}{mark}")
        if share.lanes:
            lines.append(f"{'':<36}lanes: {', '.join(share.lanes)}")
    lines.append(f"{'sum':<18}{_cell(budget.total):>7}")
    if budget.unallocated:
        lines.append(f"{'unallocated':<18}{_cell(budget.unallocated):>7}  headroom no fleet thread uses")
    if budget.zero_share:
        lines.append(f"zero-share roles (declared peak 0): {', '.join(budget.zero_share)}")
    if processes:
        lines += ["", "processes (worker processes per role; a CPU-bound one runs one unit at a time)"]
        lines += [f"  {describe(row)}" for row in processes]
    return "\n".join(lines) + "\n"
