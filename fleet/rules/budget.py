"""FleetBudget: the one authority that bounds the sum of every consumer's CPU share.

Every consumer declares (peak cores, threads); `FleetBudget.derive(Q)` lays them
against a quota of Q CPUs and refuses, with a typed error listing every consumer,
when they do not fit. Pure: no clocks, no files, no logging.

The pinned projection (one process per seat, 002 §5):

    reserve H        1                     fixed; fleetd itself must never starve
    ambient I/O A    max(1, floor(Q/4))    pump, dispatch, delivery threads
    fixed roles      their declared peak   whole cores (resolve 1, merge 1)
    undeclared       one core per slot     a CPU-bound role that declares no peak:
                                           capped by the whole cores left after the
                                           rows above, the I/O roles' whole cores and
                                           the elastic role's minimum; at least 1
    elastic role S   floor(Q) - the above  the first keyed role (solver); S >= 2
    I/O-dominant     Q - integer shares    the fractional remainder only (simdriver)

At Q = 8 this gives 1 / 2 / 1 / 1 / 3 (6 pins) / remainder 0, sum 8: the worked
table. The reference writes A = max(1, floor((Q - H)/4)), which is 1 at Q = 8 and
would give S = 4; its worked table (the signed-off test vector) says A = 2 and S = 3.
We keep the table: floor(Q/4) reproduces it, equals floor((Q - H + 1)/4) for H = 1,
and keeps the smallest quota with S >= 2 at 6 CPUs, which is where the tier table
(002 §14) starts the pinned tier. Pins are threads, shares are cores: the keyed role
keeps its declared slots as pins, and at most min(S, pins) of its units run at once
(`admit`).

A CPU-bound role that declares no peak is read the way users read `slots`: as how
many of its units should run at once. Its share is its slots, capped by the cores the
quota has left (several such roles take turns, one core at a time, in declaration
order), so `slots = 4` gets 4 worker processes on a host with 4 spare cores and 2 on
one with 2. It never squeezes a declared share or the elastic role below its minimum:
with no core left it asks for 1 and the sum check decides (a small host runs serial).

Integer shares sum against floor(Q). The remainder (the 0.5 of 4.5, plus any whole
cores no keyed role absorbs) is spendable only by I/O-dominant roles, split evenly
among them; with none declared it is reported as `unallocated`.

Small quotas. "S >= 2 or fail" is a rule of the pinned projection: below 6 CPUs there
is no room for two concurrent keyed walks beside the reserve, the ambient runtime
and the fixed roles, so `derive(binding="pinned")` raises
QuotaTooSmallForPinnedRoles. The tier plan (002 §14) then runs such hosts *serial*:
one seat (`serial-0`) runs every granted unit in grant order, so the roles become
logical lanes on one thread and their per-role shares (and S >= 2) do not apply.
The serial projection is

    reserve H        1
    ambient I/O A    max(1, floor(Q/4)), but at most floor(Q) - H - 1
    serial-0         1 core, 1 thread, every CPU-bound role's lane
    I/O-dominant     Q - the rows above: the remainder, on a seat of their own
                     (with no I/O-dominant role, or only I/O-dominant roles, they
                     are lanes of serial-0 and the remainder is unallocated)

At Q = 2 the default ambient runtime folds into the reserve core (A = 0 cores,
still 1 thread): a 2-CPU host runs fleetd plus one worker seat, which is the least
that can run anything with a core reserved. Below 2 CPUs that does not fit:
BelowHostFloor (or, with ``loop = "auto"``, the loop runs by priority). At Q = 4.5 (002
§5's own example) the remainder is 1.5: the 0.5 of the fraction and the whole core
serial-0 leaves, spent by the I/O-dominant roles' seat.

Declared peaks (002 §5: "startup fails loudly if the declared peak shares exceed the
quota"). Every share a config declares for a role -- its ``peak_cpus``, or its
``[budget]`` override -- adds up against the quota on every tier (`check_declared`):
more is a configuration bug, refused with BudgetOverQuota whatever the profile. What
is left to the tier plan is the fleet's own structure (the reserve, the ambient
runtime, the keyed role's minimum): when the declared peaks fit the quota but that
structure does not, the host is small and ``auto`` runs serial. A role that declares
no peak asks for nothing here (its share is derived). ``[budget] oversubscribe =
true`` accepts declared peaks beyond the quota: they are then planned like the
fleet's structure -- ``auto`` on a host they do not fit runs serial, a forced pinned
profile runs them marked ``oversubscribed`` (``fleet.Executor(oversubscribe=True)``
sets it, to run more workers than the quota has cores).

Where the supervisor's loop runs (`[budget] loop`). ``reserved`` (the reference
profile's, 002): the reserve core H and the ambient runtime above, so fleetd's own
threads never starve. ``auto`` (the default): ``reserved`` wherever a reserved core
leaves room for a worker seat (2 CPUs and up) and always for the reference profile,
whose floor is 002's; ``priority`` below, so any fleet whose declared peaks fit runs
on any quota above zero. ``priority`` (what an embedded `fleet.Executor`
boots with): H = A = 0 cores, every whole core of the quota goes to worker seats, and
the loop keeps its place by scheduling priority instead (its workers run niced below
it: `fleet.host.priority`), as a ProcessPoolExecutor's parent shares the CPUs with
its workers. With nothing to reserve there is no host floor: any quota above zero
runs. Below one CPU the serial seat's share is the fractional quota itself (one
worker, pinned to one CPU, within the quota): "detection keeps the ceiling of a
fractional quota precisely so that one worker stays schedulable" (002 §5).

Overrides (`[budget]` in config, `FLEET_BUDGET__*` in the environment) are terminal:
the configured value wins, the share is marked `overridden` (with the value the rule
would have given) so boot can log it, and it takes part in the same sum check. A
forced pinned profile on a small host passes `oversubscribe=True`: shares keep their
floors, the sum exceeds the quota, and the budget says so instead of refusing.
"""
from __future__ import annotations

import math
from types import MappingProxyType

from admission.records import field, record, replace
from fleet.rules.errors import (
    EXIT_BELOW_HOST_FLOOR,
    EXIT_BUDGET_OVER_QUOTA,
    EXIT_QUOTA_TOO_SMALL,
    BootRefused,
    ConfigError,
)
from fleet.rules.ranges import CPUS_MAX, config_range
from fleet.rules.roles import REFERENCE_ROLES, RoleSet

PINNED = "pinned"
SERIAL = "serial"
BINDINGS = (PINNED, SERIAL)

#: No tier can host the fleet below this many CPUs (fleetd + one worker seat).
HOST_FLOOR_CPUS = 2
#: Where the supervisor's loop runs (`BudgetOverrides.loop`): on a reserved core (002's
#: reserve and ambient runtime), or on the workers' cores, ahead of them by priority;
#: ``auto``: reserved where the quota has room for it (`loop_for`).
LOOP_AUTO = "auto"
LOOP_RESERVED = "reserved"
LOOP_PRIORITY = "priority"
LOOP_RULES = (LOOP_AUTO, LOOP_RESERVED, LOOP_PRIORITY)
#: ... and when nothing is reserved there is no floor: any quota above zero runs one seat.
#: Default least share of the elastic keyed role under the pinned binding.
PINNED_MIN = 2
#: The whole cores an I/O-dominant role that declares no share counts for.
IO_DEFAULT_PEAK = 1.0
#: Largest quota the floor search tries: the largest quota there is (`fleet.rules.ranges`).
_FLOOR_SEARCH_LIMIT = CPUS_MAX


# --- typed refusals ---------------------------------------------------------------


class BelowHostFloor(BootRefused):
    """Fewer CPUs than the host floor (2, with the supervisor on a reserved core): no tier can host the fleet."""

    exit_code = EXIT_BELOW_HOST_FLOOR

    def __init__(self, quota: float, floor: int = HOST_FLOOR_CPUS):
        self.quota = quota
        super().__init__(f"quota {_fmt(quota)} CPUs is below the host floor of {floor}: no tier can host fleetd "
                         "and a worker seat beside a reserved core (budget.loop = \"priority\" has no floor)")


class QuotaTooSmallForPinnedRoles(BootRefused):
    """The pinned projection leaves the elastic keyed role below its minimum."""

    exit_code = EXIT_QUOTA_TOO_SMALL

    def __init__(self, quota, role, cores, minimum, shares, floor_cpus=None):
        self.quota, self.role, self.cores, self.minimum = quota, role, cores, minimum
        self.shares = tuple(shares)
        self.floor_cpus = floor_cpus
        floor = f"; the pinned floor is {floor_cpus} CPUs" if floor_cpus else ""
        super().__init__(
            f"quota {_fmt(quota)} CPUs leaves {role} {_fmt(cores)} cores, below its minimum of "
            f"{minimum} ({_list(shares)}){floor}"
        )


class BudgetOverQuota(BootRefused):
    """Declared or overridden shares add up to more than the quota."""

    exit_code = EXIT_BUDGET_OVER_QUOTA

    def __init__(self, quota, total, shares, *, declared: bool = False):
        self.quota, self.total, self.shares = quota, total, tuple(shares)
        text = f"declared shares sum to {_fmt(total)} cores over a quota of {_fmt(quota)}: {_list(shares)}"
        if declared:  # the rule of every tier (`check_declared`)
            text += (" (the roles' declared peaks, which no tier may exceed; declare less, or set "
                     "budget.oversubscribe = true to accept them)")
        super().__init__(text)


def _fmt(x) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _list(shares) -> str:
    return ", ".join(f"{name} {_fmt(cores)}" for name, cores in shares)


# --- overrides ----------------------------------------------------------------------


def _in_range(where, key, value):
    """`value` if it is in the range fleet.rules.ranges gives ``budget.<key>``, else ConfigError."""
    why = config_range(f"budget.{key}").problem(value)
    if why:
        raise ConfigError(f"{where}.{key}", why)
    return value


@record
class BudgetOverrides:
    """Terminal overrides of the budget rules (None: the rule decides).

    Args:
        reserve: reserve cores H.
        ambient_io: ambient I/O cores (and threads) A.
        pinned_min: least share of the elastic keyed role in the pinned projection.
        roles: role name -> cores, replacing the role's declared peak (for the
            elastic role, replacing S).
        loop: where the supervisor's loop runs, ``auto``, ``reserved`` or ``priority``
            (the module docstring); not a share, so it is no override of one.
        oversubscribe: accept declared peaks that add up to more than the quota
            (`check_declared`): the tier plan then treats them as a small host
            (``auto`` runs serial; a forced pinned profile runs marked oversubscribed).
    """

    reserve: int | None = None
    ambient_io: int | None = None
    pinned_min: int | None = None
    roles: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    loop: str = LOOP_AUTO
    oversubscribe: bool = False
    #: set by `loop_for` when ``auto`` chose ``priority`` (the rows say why)
    chosen_below_floor: bool = field(default=False, compare=False, repr=False)

    def __post_init__(self):
        if self.loop not in LOOP_RULES:
            raise ConfigError("budget.loop", f"must be one of {', '.join(LOOP_RULES)}, got {self.loop!r}")
        if not isinstance(self.oversubscribe, bool):
            raise ConfigError("budget.oversubscribe", f"must be true or false, got {self.oversubscribe!r}")

    @classmethod
    def from_mapping(cls, data, where: str = "budget") -> "BudgetOverrides":
        """Build from a ``[budget]`` table; a bad value raises ConfigError naming its key."""
        data = dict(data or {})
        kwargs = {}
        for key in ("loop", "oversubscribe"):  # rules, not shares
            if key in data:
                kwargs[key] = data.pop(key)
        for key in ("reserve", "ambient_io", "pinned_min"):
            if key in data and data[key] is not None:
                kwargs[key] = _in_range(where, key, data.pop(key))
            else:
                data.pop(key, None)
        roles = {name: _in_range(where, name, value) for name, value in data.items()}  # role shares, in cores
        return cls(roles=MappingProxyType(roles), **kwargs)

    def check_roles(self, roles: RoleSet, where: str = "budget") -> None:
        """Raise ConfigError for an override naming a role that is not declared."""
        for name in self.roles:
            if name not in roles:
                raise ConfigError(
                    f"{where}.{name}",
                    f"not a budget key or a declared role; keys: reserve, ambient_io, pinned_min, loop, oversubscribe, "
                    f"{', '.join(roles.names)}",
                )

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("reserve", "ambient_io", "pinned_min") if getattr(self, k) is not None}
        if self.loop != LOOP_AUTO:
            out["loop"] = self.loop
        if self.oversubscribe:
            out["oversubscribe"] = True
        out.update(self.roles)
        return out


NO_OVERRIDES = BudgetOverrides()


# --- the table ------------------------------------------------------------------------


@record
class Share:
    """One consumer's row: its cores, its threads (None: not a thread pool) and why.

    `kind` is one of reserve, ambient, fixed, elastic, io, seat. `admit` is how many
    units of an elastic role may run at once (its cores); `lanes` lists the roles a
    serial seat runs; `default` is what the rule would have given an overridden row.
    """

    name: str
    cores: float
    threads: int | None
    kind: str
    rule: str
    overridden: bool = False
    default: float | None = None
    admit: int | None = None
    lanes: tuple[str, ...] = ()

    def rule_gives(self) -> str:
        """What the rule would have given an overridden row, in words."""
        if self.default is None:
            return "its share would follow its slots"
        return f"rule gives {json_number(self.default)}"

    def to_dict(self) -> dict:
        out = {
            "name": self.name,
            "cores": json_number(self.cores),
            "threads": self.threads,
            "kind": self.kind,
            "rule": self.rule,
            "overridden": self.overridden,
        }
        if self.overridden:
            out["default"] = json_number(self.default)
        if self.admit is not None:
            out["admit"] = self.admit
        if self.lanes:
            out["lanes"] = list(self.lanes)
        return out


def json_number(x):
    """A number for JSON: whole values as int (8, not 8.0), others rounded to 6 places."""
    if x is None:
        return None
    x = round(float(x), 6)
    return int(x) if x.is_integer() else x


@record
class FleetBudget:
    """The shares table for one quota and binding. Build it with `FleetBudget.derive`."""

    quota_cpus: float
    binding: str
    consumers: tuple[Share, ...]
    zero_share: tuple[str, ...] = ()
    unallocated: float = 0.0
    oversubscribed: bool = False

    @property
    def total(self) -> float:
        """Sum of every consumer's cores (equals the quota unless unallocated or oversubscribed)."""
        return round(sum(s.cores for s in self.consumers), 6)

    @property
    def fraction(self) -> float:
        """The quota's fractional part (the 0.5 of 4.5; 0 for a whole quota)."""
        return round(self.quota_cpus - math.floor(self.quota_cpus), 6)

    def io_shares(self) -> tuple[Share, ...]:
        """The I/O-dominant roles' rows: the ones that spend the remainder."""
        return tuple(s for s in self.consumers if s.kind == "io")

    def share(self, name: str) -> Share:
        """The row named `name`; KeyError if there is none."""
        for s in self.consumers:
            if s.name == name:
                return s
        raise KeyError(name)

    def overrides(self) -> tuple[Share, ...]:
        """Rows whose value came from an override (boot logs each one)."""
        return tuple(s for s in self.consumers if s.overridden)

    def to_dict(self) -> dict:
        return {
            "binding": self.binding,
            "quota_cpus": json_number(self.quota_cpus),
            "consumers": [s.to_dict() for s in self.consumers],
            "sum": json_number(self.total),
            "unallocated": json_number(self.unallocated),
            "oversubscribed": self.oversubscribed,
            "zero_share": list(self.zero_share),
        }

    @classmethod
    def derive(
        cls,
        quota: float,
        roles: RoleSet = REFERENCE_ROLES,
        overrides: BudgetOverrides = NO_OVERRIDES,
        binding: str = PINNED,
        oversubscribe: bool = False,
    ) -> "FleetBudget":
        """Lay every consumer against `quota` CPUs.

        Args:
            quota: effective CPUs (may be fractional).
            roles: the declared roles (the reference profile by default).
            overrides: terminal overrides from config or environment.
            binding: ``pinned`` or ``serial`` (see the module docstring).
            oversubscribe: a forced profile: keep floors and mark the excess
                instead of refusing.
        Raises:
            BelowHostFloor: quota < 2, with the loop on a reserved core.
            QuotaTooSmallForPinnedRoles: pinned, and the elastic role gets < its minimum.
            BudgetOverQuota: the declared peaks add up past the quota (`check_declared`),
                or integer shares sum beyond floor(quota).
            ConfigError: a bad quota, binding, or an override naming no declared role.
        """
        if binding not in BINDINGS:
            raise ConfigError("fleet.profile", f"unknown binding {binding!r}; one of {', '.join(BINDINGS)}")
        check_declared(quota, roles, overrides)
        build = _derive_pinned if binding == PINNED else _derive_serial
        return build(float(quota), roles, loop_for(quota, roles, overrides), oversubscribe)


# --- what every tier must fit -----------------------------------------------------------------


def check_quota(quota, overrides: BudgetOverrides = NO_OVERRIDES) -> None:
    """Raise ConfigError for a quota outside ``fleet.cpus``'s range (a number in (0, 1024]
    CPUs: `fleet.rules.ranges`), BelowHostFloor for one no tier hosts under `overrides`' loop."""
    why = config_range("fleet.cpus").problem(quota)
    if why:
        raise ConfigError("fleet.cpus", f"the quota {why}")
    floor = host_floor(overrides)
    if quota < floor:
        raise BelowHostFloor(quota, floor)


def declared_peaks(roles: RoleSet, overrides: BudgetOverrides = NO_OVERRIDES) -> tuple[tuple[str, float], ...]:
    """(role, cores) for every role whose share the config declares: its ``[budget]``
    override, else its ``peak_cpus``. A role that declares neither is not listed: its
    share is derived (from its slots, or what the quota leaves the keyed role)."""
    out = []
    for role in roles:
        if role.name in overrides.roles:
            out.append((role.name, overrides.roles[role.name]))
        elif role.peak_cpus is not None:
            out.append((role.name, role.peak_cpus))
    return tuple(out)


def loop_for(quota, roles: RoleSet, overrides: BudgetOverrides) -> BudgetOverrides:
    """`overrides` with its loop rule decided for `quota`: ``auto`` is ``reserved`` where a
    reserved core leaves a worker seat room (the host floor and up) or for the reference
    profile (002's floor is its own), else ``priority``. Others are as configured."""
    if overrides.loop != LOOP_AUTO:
        return overrides
    if roles == REFERENCE_ROLES or not isinstance(quota, (int, float)) or quota >= HOST_FLOOR_CPUS:
        return replace(overrides, loop=LOOP_RESERVED)
    return replace(overrides, loop=LOOP_PRIORITY, chosen_below_floor=True)


def check_declared(quota, roles: RoleSet = REFERENCE_ROLES, overrides: BudgetOverrides = NO_OVERRIDES) -> bool:
    """The rule every tier keeps (002 §5), pure, for boot, `fleetctl plan` and a reload alike:
    the quota is in range and above the host floor (`check_quota`), the overrides name
    declared roles, and the roles' declared peaks (`declared_peaks`) add up to no more
    than the quota.

    Returns True when the peaks exceed the quota and ``overrides.oversubscribe`` accepts
    it, False when they fit.
    Raises:
        ConfigError, BelowHostFloor: from `check_quota`, or an override naming no role.
        BudgetOverQuota: the declared peaks exceed the quota (the message lists them).
    """
    check_quota(quota, loop_for(quota, roles, overrides))
    overrides.check_roles(roles)
    declared = declared_peaks(roles, overrides)
    total = round(sum(cores for _, cores in declared), 6)
    if total <= quota + 1e-9:
        return False
    if overrides.oversubscribe:
        return True
    raise BudgetOverQuota(quota, total, [(name, cores) for name, cores in declared if cores], declared=True)


# --- the two projections ------------------------------------------------------------------


def host_floor(ov: BudgetOverrides) -> int:
    """The least quota any tier hosts under `ov`'s loop rule, decided (`loop_for`): 0, any
    quota above zero, with the loop ahead by priority."""
    return 0 if ov.loop == LOOP_PRIORITY else HOST_FLOOR_CPUS


def _reserve(ov: BudgetOverrides) -> Share:
    if ov.reserve is not None:
        return Share("reserve", ov.reserve, None, "reserve", "override", True, 1)
    if ov.loop == LOOP_PRIORITY:
        why = " (budget.loop = auto: below 2 CPUs no core can be reserved beside a worker)" \
            if ov.chosen_below_floor else ""
        return Share("reserve", 0, None, "reserve", f"0: loop = priority, the loop runs ahead of its workers by "
                     f"priority{why}")
    return Share("reserve", 1, None, "reserve", "fixed: fleetd must never starve I/O")


def _ambient(quota: float, ov: BudgetOverrides, cap: int | None = None) -> Share:
    rule_value = max(1, math.floor(quota / 4))
    if ov.ambient_io is None and ov.loop == LOOP_PRIORITY:
        return Share("ambient_io", 0, 1, "ambient", "0: loop = priority, its threads share the workers' cores")
    if ov.ambient_io is not None:
        return Share("ambient_io", ov.ambient_io, max(1, ov.ambient_io), "ambient", "override", True, rule_value)
    if cap is not None and rule_value > cap:
        return Share("ambient_io", max(0, cap), 1, "ambient", "max(1, floor(Q/4)), folded into the reserve core")
    return Share("ambient_io", rule_value, rule_value, "ambient", "max(1, floor(Q/4))")


def _elastic_role(roles: RoleSet):
    return next((r for r in roles if r.kind == "pinned"), None)


def _role_share(role, ov: BudgetOverrides) -> Share:
    """A fixed (non-elastic, non-I/O) role's whole-core share."""
    if role.name in ov.roles:
        value = ov.roles[role.name]
        if not float(value).is_integer():
            raise ConfigError(f"budget.{role.name}", f"a CPU-bound role takes whole cores, got {value!r}")
        return Share(role.name, int(value), role.slots, "fixed", "override", True, role.peak_cpus)
    if not float(role.peak_cpus).is_integer():
        raise ConfigError(f"roles.{role.name}.peak_cpus", f"a CPU-bound role takes whole cores, got {role.peak_cpus!r}")
    return Share(role.name, int(role.peak_cpus), role.slots, "fixed", "declared peak")


def _io_whole(role, ov: BudgetOverrides) -> tuple[int, bool]:
    value = ov.roles.get(role.name, role.peak_cpus if role.declares_share else IO_DEFAULT_PEAK)
    return math.floor(value), role.name in ov.roles


def _follows_slots(role, ov: BudgetOverrides) -> bool:
    """A CPU-bound role that declares no share and has no override: its share is derived."""
    return not role.declares_share and role.name not in ov.roles


def _slot_shares(roles, room: int) -> list[Share]:
    """Shares of the roles whose share follows their slots: one core per slot, capped by
    the `room` the quota has left. Every role gets one core first (a CPU-bound role
    needs one to run at all; if the room has fewer, the sum check refuses, as it would
    a declared 1); the rest of the room is dealt one core at a time, round-robin in
    declaration order, until each role has its slots or the room is spent."""
    cores = {r.name: 1 for r in roles}
    spare = room - len(roles)
    while spare > 0:
        wanting = [r for r in roles if cores[r.name] < r.slots]
        if not wanting:
            break
        for role in wanting[:spare]:
            cores[role.name] += 1
        spare -= min(spare, len(wanting))
    rule = f"its slots, capped by the {max(0, room)} cores left"
    return [Share(r.name, cores[r.name], r.slots, "fixed", rule) for r in roles]


def _derive_pinned(quota, roles, ov, oversubscribe, find_floor=True):
    whole = math.floor(quota)
    rows = [_reserve(ov), _ambient(quota, ov)]
    elastic = _elastic_role(roles)
    io_roles = [r for r in roles if r.io_bound]
    zero, by_slots, fixed = [], [], {}
    for role in roles:
        if role is elastic or role.io_bound:
            continue
        if role.peak_cpus == 0 and role.name not in ov.roles:
            zero.append(role.name)
        elif _follows_slots(role, ov):
            by_slots.append(role)
        else:
            fixed[role.name] = _role_share(role, ov)
    io_whole = sum(_io_whole(r, ov)[0] for r in io_roles)
    if by_slots:
        # What is left once every declared consumer, and the elastic role's least
        # share, has its cores: shares that follow slots never squeeze a declared one.
        room = whole - sum(s.cores for s in rows) - sum(s.cores for s in fixed.values()) - io_whole
        if elastic is not None:
            room -= _elastic_reservation(elastic, ov)
        fixed.update((s.name, s) for s in _slot_shares(by_slots, room))
    rows += [fixed[r.name] for r in roles if r.name in fixed]  # declaration order
    used = sum(s.cores for s in rows) + io_whole
    if elastic is not None:
        floor = (lambda: pinned_floor(roles, ov)) if find_floor else (lambda: None)
        io_listed = [(r.name, _io_whole(r, ov)[0]) for r in io_roles]
        rows.append(_elastic_share(quota, whole - used, elastic, ov, rows, io_listed, oversubscribe, floor))
    return _finish(quota, PINNED, rows, io_roles, ov, zero, oversubscribe)


def _elastic_reservation(role, ov: BudgetOverrides) -> int:
    """The cores the elastic role keeps before shares that follow slots are dealt."""
    if role.name in ov.roles:
        return int(ov.roles[role.name])
    return ov.pinned_min if ov.pinned_min is not None else PINNED_MIN


def _elastic_share(quota, left, role, ov, rows, io_listed, oversubscribe, floor):
    minimum = ov.pinned_min if ov.pinned_min is not None else PINNED_MIN
    if role.name in ov.roles:
        cores = _role_share(role, ov).cores
        share = Share(role.name, cores, role.slots, "elastic", "override", True, left, admit=min(cores, role.slots))
    else:
        share = Share(role.name, left, role.slots, "elastic", "floor(Q) - reserve - ambient - fixed",
                      admit=min(left, role.slots))
    if share.cores < minimum:
        if not oversubscribe:
            listed = [(s.name, s.cores) for s in rows] + [(share.name, share.cores)] + io_listed
            raise QuotaTooSmallForPinnedRoles(quota, role.name, share.cores, minimum, listed, floor())
        share = Share(role.name, minimum, role.slots, "elastic", f"pinned minimum {minimum} (oversubscribed)",
                      share.overridden, share.default, admit=min(minimum, role.slots))
    return share


def _derive_serial(quota, roles, ov, oversubscribe):
    whole = math.floor(quota)
    reserve = _reserve(ov)
    rows = [reserve, _ambient(quota, ov, cap=whole - reserve.cores - 1)]
    # I/O-dominant roles spend the remainder on a seat of their own (002 §5), so their
    # waits never queue behind serial-0's CPU-bound unit -- unless every role is
    # I/O-dominant: then serial-0 is theirs, and no seat would be left for the rest.
    cpu_bound = tuple(r.name for r in roles if not r.io_bound)
    everyone = tuple(r.name for r in roles)
    if quota < 1:  # one worker: the fraction is serial-0's, every role a lane of it
        rows.append(Share("serial-0", quota, 1, "seat", "below one CPU: one seat runs every granted unit within "
                          "the fractional quota", lanes=everyone))
        return _finish(quota, SERIAL, rows, [], ov, (), oversubscribe)
    remainder = quota - sum(s.cores for s in rows) - 1
    io_roles = [r for r in roles if r.io_bound] if cpu_bound and remainder > 1e-9 else []
    rows.append(Share("serial-0", 1, 1, "seat", "one seat runs every granted unit in grant order",
                      lanes=cpu_bound if io_roles else everyone))
    return _finish(quota, SERIAL, rows, io_roles, ov, (), oversubscribe)


def _finish(quota, binding, rows, io_roles, ov, zero, oversubscribe):
    """Check the integer sum, then hand the remainder to the I/O-dominant roles."""
    whole = math.floor(quota)
    io_fixed = {r.name: _io_whole(r, ov) for r in io_roles} if binding == PINNED else {}
    integer_sum = sum(s.cores for s in rows) + sum(w for w, _ in io_fixed.values())
    # Below one CPU the one seat's share is the fraction itself; above, shares are whole cores.
    over = integer_sum > (whole if whole >= 1 else quota) + 1e-9
    if over and not oversubscribe:
        listed = [(s.name, s.cores) for s in rows] + [(n, w) for n, (w, _) in io_fixed.items()]
        raise BudgetOverQuota(quota, integer_sum, listed)
    remainder = max(0.0, round(quota - integer_sum, 6))
    unallocated = remainder if not io_roles else 0.0
    rule = "remainder only; I/O-dominant" + (", on a seat of its own beside serial-0" if binding == SERIAL else "")
    for role in io_roles:
        base, overridden = io_fixed.get(role.name, (0, False))
        cores = round(base + remainder / len(io_roles), 6)
        rows.append(Share(role.name, cores, role.slots, "io", rule, overridden,
                          role.peak_cpus if overridden else None))
    return FleetBudget(quota, binding, tuple(rows), tuple(zero), unallocated, over)


def pinned_floor(roles: RoleSet = REFERENCE_ROLES, overrides: BudgetOverrides = NO_OVERRIDES) -> int | None:
    """The least whole number of CPUs on which the pinned projection fits (None: none does)."""
    for cpus in range(1, _FLOOR_SEARCH_LIMIT + 1):
        ov = loop_for(cpus, roles, overrides)
        if cpus < host_floor(ov):
            continue
        try:
            _derive_pinned(float(cpus), roles, ov, False, find_floor=False)
            return cpus
        except (QuotaTooSmallForPinnedRoles, BudgetOverQuota):
            continue
    return None
