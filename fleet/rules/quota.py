"""The CPU quota a fleet plans with: where it comes from, and when it changed (pure).

Two inputs can set the quota (002 §5): ``[fleet] cpus`` in the config (an operator
override, terminal) and detection (`fleet.host.cgroup.effective_cpus`: min of affinity,
cpuset and the lowest ancestor quota). The plan uses the configured value when there
is one, the detected one otherwise; status shows both, each with its source, so an
override never hides what the kernel actually gives the fleet.

Runtime changes (002 §3.4, §5, §12). The quota is re-detected while the fleet runs
(`QuotaWatch`: every `every_ms`, or at once when a pressure trigger fires). A change
of the *detected* quota is always logged. A change of the quota the plan uses (the
detected one, when no `cpus` is configured) starts a new epoch: the budget is derived
again for the new quota (`replan`, logged with what differs from the boot's), pins are
released (T9) and in-flight deferrable work drains (T7), and the seats follow: the
seats were laid out at boot for the most CPUs the fleet may get (`capacity`), and each
epoch runs those its quota places (`fleet.rules.seats.place`, carried out by
`fleet.runtime.reseat`).

Everything here is a pure function of its inputs (readings, the clock in ms);
`fleet.runtime.loop` carries the decisions out.
"""
from __future__ import annotations

import math

from admission.records import record
from fleet.rules.budget import json_number

CONFIG = "config"
DETECTED = "detected"

#: Quotas closer than this (in CPUs) are the same quota: cpu.max and cfs files hold
#: integer microseconds, so two readings of one setting are exactly equal anyway.
SAME_QUOTA = 1e-6


@record
class CpuLimit:
    """The effective CPU budget and each input to it (None = no limit / unknown).

    `cpus` keeps a fractional quota (e.g. 4.5): the budget floors integer shares and
    gives the remainder to I/O-dominant consumers. `schedulable` is its ceiling: the
    number of threads that can run at once.
    """

    cpus: float
    affinity: int | None
    cpuset: int | None
    quota: float | None
    quota_dir: str | None
    reasons: tuple[str, ...] = ()

    @property
    def schedulable(self) -> int:
        return max(1, math.ceil(self.cpus))


def detected_from(limit: CpuLimit) -> str:
    """Which input bound the detected CPUs: the cgroup quota (and its directory), the
    cpuset, the affinity mask, or os.cpu_count() when nothing else was known."""
    if limit.quota is not None and limit.cpus == limit.quota:
        return f"cgroup quota at {limit.quota_dir}"
    if limit.cpuset is not None and limit.cpus == limit.cpuset:
        return "cpuset"
    if limit.affinity is not None and limit.cpus == limit.affinity:
        return "affinity"
    return "cpu count"


@record
class Quota:
    """The quota a plan uses, and both of its inputs with their sources."""

    cpus: float  # what the plan uses
    source: str  # CONFIG or DETECTED
    configured: float | None  # [fleet] cpus (None: not set)
    detected: float  # what detection found
    detected_from: str  # see `detected_from`

    def to_dict(self) -> dict:
        """The plan fields status shows (quota_cpus is the plan's own field)."""
        return {
            "quota_source": self.source,
            "configured_cpus": self.configured,
            "detected_cpus": json_number(self.detected),
            "detected_from": self.detected_from,
        }


def choose(configured: float | None, detected: float, source_of_detected: str) -> Quota:
    """The quota a plan uses: the configured one when set, else the detected one."""
    if configured is not None:
        return Quota(float(configured), CONFIG, float(configured), float(detected), source_of_detected)
    return Quota(float(detected), DETECTED, None, float(detected), source_of_detected)


def boot_warnings(quota: Quota, plan) -> list[str]:
    """What a boot should warn about (the status fields say it too, but a log line is
    what an operator reads): a plan that runs oversubscribed, and a configured quota
    larger than what the kernel gives the fleet."""
    out = []
    if plan.oversubscribed:
        why = f"; {plan.tier_refused.message}" if plan.tier_refused is not None else ""
        out.append(f"profile {plan.profile!r} runs the {plan.binding} binding OVERSUBSCRIBED on "
                   f"{_cpus(quota.cpus)} CPUs ({quota.source}){why}")
    if quota.configured is not None and quota.configured > quota.detected + SAME_QUOTA:
        out.append(f"fleet.cpus = {_cpus(quota.configured)} exceeds the {_cpus(quota.detected)} CPUs detected "
                   f"({quota.detected_from}): the plan counts on CPUs the kernel does not give this fleet")
    return out


def boot_notes(plan) -> list[str]:
    """What a boot says at INFO beside the processes: a fractional quota and where its
    fraction goes (`fleet.rules.plan.fractional_note`; INFO, not a warning: an embedded
    Executor's stderr stays its program's)."""
    from fleet.rules.plan import fractional_note

    note = fractional_note(plan)
    return [note] if note else []


@record
class Projection:
    """What a config boots on this host: the quota, the tier plan, the seats and slots.

    The supervisor boots exactly this; `fleetctl status --config` prints it before boot.
    """

    quota: Quota
    plan: object  # fleet.rules.plan.TierPlan
    layout: object  # fleet.rules.seats.SeatLayout: every seat the fleet can run (`capacity`)
    roles: object = None  # fleet.rules.roles.RoleSet (marks I/O-bound roles in role_processes)
    #: which of `layout`'s seats run on this quota, and on which CPUs (None: all, as laid out)
    placement: object = None  # fleet.rules.seats.Placement
    #: the seats this quota lays out itself (None: `layout`): where the supervisor's loop runs
    seated: object = None  # fleet.rules.seats.SeatLayout

    @property
    def live_placement(self):
        from fleet.rules import seats as seats_mod

        return self.placement if self.placement is not None else seats_mod.booted(self.layout)

    def meta(self, booted: bool) -> dict:
        """The plan, budget and seats as the table's boot metadata holds them."""
        doc = self.plan.to_dict()
        doc["plan"].update(fleet_booted=booted, **self.quota.to_dict())
        from fleet.rules.processes import role_processes

        slot_roles = [spec.role for spec in self.layout.slots]
        meta = {"plan": doc["plan"], "budget": doc["budget"], **self.layout.to_meta(), "slot_roles": slot_roles}
        # The processes the boot runs: the seats its quota places (the rest wait for a larger one)
        live = set(self.live_placement.live)
        running = {"seats": [s for s in meta["seats"] if s["index"] in live], "slot_roles": slot_roles}
        meta["role_processes"] = role_processes(running, self.roles)
        return meta

    def processes(self) -> list[str]:
        """One line per role, ``"w: 4 slots on 2 worker processes"`` (the boot log prints them)."""
        from fleet.rules.processes import describe

        return [describe(row) for row in self.meta(booted=False)["role_processes"]]


def project(config, limit: CpuLimit, cpus) -> Projection:
    """The projection of `config` (a FleetConfig) on a host whose detection found `limit`,
    with `cpus` (sorted CPU numbers) to lay seats on.

    Raises the plan's typed refusals (BelowHostFloor, BudgetOverQuota, ...), and
    ConfigError when no role has a handler (nothing could run).
    """
    from fleet.rules import plan as plan_mod
    from fleet.rules import seats as seats_mod

    from fleet.rules.errors import ConfigError, FleetError

    quota = choose(config.cpus, limit.cpus, detected_from(limit))
    plan = plan_mod.resolve(quota.cpus, config.profile, config.roles, config.budget)
    layout = seats_mod.layout(plan, config.roles, cpus)
    if not layout.seats:
        raise ConfigError("roles", "no role has a handler: nothing could run")
    most = capacity(quota, limit, cpus)
    if most is None:
        return Projection(quota, plan, layout, config.roles)
    try:
        widest = seats_mod.layout(plan_mod.resolve(most, config.profile, config.roles, config.budget),
                                  config.roles, cpus)
    except FleetError:
        return Projection(quota, plan, layout, config.roles)
    return Projection(quota, plan, widest, config.roles, seats_mod.place(widest, layout), layout)


def capacity(quota: Quota, limit: CpuLimit, cpus) -> int | None:
    """The most CPUs a quota change could give this fleet, when that is more than the
    quota it boots with (else None): its CPUs (affinity and cpuset), which no quota
    raises. The seats are laid out for it at boot (the table, the rings), and each
    epoch runs those of them its quota lays out (`fleet.rules.seats.place`). A
    configured ``cpus`` is terminal: no quota change moves its plan, so it is the capacity."""
    if quota.source == CONFIG:
        return None
    most = len(cpus)
    for bound in (limit.affinity, limit.cpuset):
        if bound is not None:
            most = min(most, bound)
    return most if most > quota.cpus + SAME_QUOTA else None


def _cpus(v: float) -> str:
    return f"{v:g}"


def _share(share) -> str:
    if share is None:
        return "none"
    cores, threads = share
    return f"{cores:g} cores" + ("" if threads is None else f"/{threads} threads")


# --------------------------------------------------------------------------- runtime


@record
class Change:
    """What one re-detection found that differs from the last one.

    `epoch` is None when only the detected quota moved and a configured `cpus` keeps
    the plan's quota; otherwise the number of the epoch this change starts.
    """

    at_ms: int
    old: Quota
    new: Quota
    epoch: int | None

    def describe(self) -> str:
        moved = (f"detected quota {_cpus(self.old.detected)} -> {_cpus(self.new.detected)} CPUs "
                 f"({self.new.detected_from})")
        if self.epoch is None:
            return f"{moved}; fleet.cpus = {_cpus(self.new.cpus)} is configured and stays in force"
        return f"{moved}: epoch {self.epoch} plans with {_cpus(self.new.cpus)} CPUs"


@record
class WatchState:
    """What `QuotaWatch` remembers: the quota now in force, its epoch, the next check."""

    quota: Quota
    epoch: int
    next_check_ms: int


def watch_initial(quota: Quota, now_ms: int, every_ms: int) -> WatchState:
    """Epoch 0 is the boot's."""
    return WatchState(quota, 0, now_ms + every_ms)


def due(state: WatchState, now_ms: int, pressure: bool = False) -> bool:
    """Re-detect now? At every period, and at once when a pressure trigger fired."""
    return pressure or now_ms >= state.next_check_ms


def observe(state: WatchState, now_ms: int, every_ms: int, detected: float | None, source: str) -> tuple[WatchState, Change | None]:
    """Feed one re-detection (`detected` None: it failed; the quota in force stays).

    Returns the next state and the change, if the detected quota moved.
    """
    state = WatchState(state.quota, state.epoch, now_ms + every_ms)
    if detected is None or abs(detected - state.quota.detected) <= SAME_QUOTA:
        return state, None
    old = state.quota
    new = choose(old.configured, detected, source)
    if abs(new.cpus - old.cpus) <= SAME_QUOTA:
        return WatchState(new, state.epoch, state.next_check_ms), Change(now_ms, old, new, None)
    epoch = state.epoch + 1
    return WatchState(new, epoch, state.next_check_ms), Change(now_ms, old, new, epoch)


@record
class Replan:
    """The plan for an epoch's quota, against the plan the seats were booted with.

    `plan` is None when the new quota cannot host any plan (`refused` says why): the
    fleet keeps running its booted seats, and a restart would refuse to boot.
    `needs_restart` lists what differs from the booted plan (binding, shares per
    consumer); the seats follow the new plan (`fleet.runtime.reseat`), the rest (the
    budget rows status shows) stays as booted until a restart.
    """

    plan: object | None
    refused: str | None
    needs_restart: tuple[str, ...]

    def describe(self, booted) -> str:
        if self.plan is None:
            return (f"no plan fits: {self.refused}; the fleet keeps its {booted.binding} seats as booted "
                    "(a restart on this quota would refuse to boot)")
        b = self.plan.budget
        text = f"budget re-derived: {self.plan.binding} binding, " + ", ".join(
            f"{c.name} {c.cores:g}" for c in b.consumers if c.cores) + f" (sum {b.total:g})"
        if self.needs_restart:
            text += "; differs from the boot's: " + ", ".join(self.needs_restart)
        else:
            text += "; the same as the boot's"
        return text


def replan(quota: float, booted, config) -> Replan:
    """The plan `config` (a FleetConfig: profile, roles, budget overrides) resolves to on
    `quota` CPUs, compared with the `booted` plan."""
    from fleet.rules.errors import FleetError
    from fleet.rules.plan import resolve

    try:
        plan = resolve(quota, config.profile, config.roles, config.budget)
    except FleetError as exc:
        return Replan(None, f"{type(exc).__name__}: {exc}", ())
    differs = []
    if plan.binding != booted.binding:
        differs.append(f"binding {booted.binding} -> {plan.binding}")
    old = {s.name: (s.cores, s.threads) for s in booted.budget.consumers}
    for share in plan.budget.consumers:
        was = old.get(share.name)
        if was != (share.cores, share.threads):
            differs.append(f"{share.name} {_share(was)} -> {_share((share.cores, share.threads))}")
    if plan.oversubscribed != booted.oversubscribed:
        differs.append(f"oversubscribed {booted.oversubscribed} -> {plan.oversubscribed}")
    return Replan(plan, None, tuple(differs))
