"""The range of every number fleet takes from outside, in one table: the config file and
its environment overrides, a posture retune (`fleetctl posture set`, the control op,
`Fleet.posture_set`), and the numbers of the control ops. The checks, their errors and
docs/configuration.md's table quote the same figures from here (a test keeps the doc in step).

A range is closed, ``[lo, hi]``, unless it says ``(lo, hi]``: a positive quantity
(seconds, cores) where 0 would mean nothing. A value outside is refused, never clamped,
and NaN and the infinities are outside every range. Why the bounds sit where they do:

* every slot has a record in the shared table, which holds at most `MAX_SLOTS` in all;
* the table keeps the posture thresholds in 64-bit words and the duty in millionths
  (0.0001 % is one); a window longer than a day, or more throttled periods than a
  day has, cannot be met and would only wrap the word;
* cores and CPU quotas: no host has more than `CPUS_MAX` CPUs;
* seconds a unit may run or wait: 30 days; restart and lease windows: a week and a day;
* a config file is at most `MAX_CONFIG_BYTES` and nests at most `MAX_CONFIG_DEPTH`
  tables or arrays deep, the file itself counted (the deepest that fleet's own sections
  need, an admission model's table, is 6).

This module is pure: constants and comparisons.
"""
from __future__ import annotations

import math

from admission.bounds import MAX_AGING_S, MAX_LEASE_TTL_S, MAX_LEASES, shown  # noqa: F401 - shown: re-exported
from admission.records import record
from fleet.rules.limits import LEVELS_MAX, MAX_SLOTS

CPUS_MAX = 1024
DAY_S = 86_400
WEEK_S = 7 * DAY_S
UNIT_WAIT_S = 30 * DAY_S
DAY_MS = DAY_S * 1000
#: Largest config file read: far above any real one, far below what a mistaken path
#: (``/dev/zero``, a log) would make the parser hold.
MAX_CONFIG_BYTES = 1 << 20
#: Deepest nesting of tables and arrays a config may have.
MAX_CONFIG_DEPTH = 16


@record
class Range:
    """Where a number must fall: ``[lo, hi]``, or ``(lo, hi]`` with `open_lo`.

    `integer`: only ints (bools are not numbers here); otherwise ints and finite floats.
    `unit` is shown after the range ("ms", "cores").
    """

    lo: int | float
    hi: int | float
    integer: bool = True
    open_lo: bool = False
    unit: str = ""

    def __str__(self) -> str:
        kind = "an integer" if self.integer else "a number"
        span = f"{'(' if self.open_lo else '['}{_figure(self.lo)}, {_figure(self.hi)}]"
        return f"{kind} in {span}" + (f" {self.unit}" if self.unit else "")

    def holds(self, value) -> bool:
        if isinstance(value, bool):
            return False
        if self.integer:
            if not isinstance(value, int):
                return False
        elif not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        return (self.lo < value if self.open_lo else self.lo <= value) and value <= self.hi

    def problem(self, value) -> str | None:
        """Why `value` is outside (None: it is inside), naming the range and the value."""
        return None if self.holds(value) else f"must be {self}, got {shown(value)}"


def _figure(x) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


_SLOTS = Range(1, MAX_SLOTS, unit="slots")
_MS = Range(1, DAY_MS, unit="ms")
_CORES = Range(0, CPUS_MAX, integer=False, unit="cores")
#: Seconds a unit may run (a role's timeout_s, a submit's timeout).
UNIT_TIMEOUT_S = Range(0, UNIT_WAIT_S, integer=False, open_lo=True, unit="s")
#: A unit id (cancel, a submit's parent) and a client's sequence number: a 63-bit count.
UNIT_ID = Range(1, (1 << 63) - 1)
SEQ = Range(0, (1 << 63) - 1)
#: The items of one chunk of a map (what the ledger counts beside the unit).
CHUNK_ITEMS = Range(1, (1 << 63) - 1, unit="items")
#: A submit's priority: a signed 32-bit level (higher first).
PRIORITY = Range(-(1 << 31), (1 << 31) - 1)
#: Units a coordinator asks `admission_plan` about at once.
PLAN_WANTED = Range(0, 1_000_000, unit="units")

_LEASES = Range(0, MAX_LEASES, unit="leases")
_ADMISSION_S = Range(0, UNIT_WAIT_S, integer=False, open_lo=True, unit="s")

#: The config schema's numbers: dotted key -> range; ``*`` stands for one name (a role's,
#: an environment's, a severity's). The meaning of the [store] and [admission] figures
#: (and the store's per-role requests) is checked by admission.store and admission.policy.
CONFIG = {
    "fleet.cpus": Range(0, CPUS_MAX, integer=False, open_lo=True, unit="CPUs"),
    "fleet.dispatch_priority": Range(0, LEVELS_MAX, unit="nice levels"),
    "budget.reserve": Range(0, CPUS_MAX, unit="cores"),
    "budget.ambient_io": Range(0, CPUS_MAX, unit="cores"),
    "budget.pinned_min": Range(1, CPUS_MAX, unit="cores"),
    "budget.*": _CORES,
    "posture.cordon_enter_events": Range(1, DAY_MS // 100, unit="throttled periods"),
    "posture.cordon_enter_window_ms": _MS,
    "posture.cordon_duty_percent": Range(0.0001, 100, integer=False, unit="%"),
    "posture.cordon_duty_window_ms": _MS,
    "posture.cordon_exit_clean_ms": _MS,
    "posture.cordon_sim_intake_floor": _SLOTS,
    "roles.*.queue_bound": Range(1, 10_000_000, unit="units"),
    "roles.*.slots": _SLOTS,
    "roles.*.peak_cpus": _CORES,
    "roles.*.timeout_s": UNIT_TIMEOUT_S,
    "roles.*.lookahead": Range(0, 64, unit="units"),
    # A worker at least this big recycles after every unit: 1 MiB..1 TiB
    "roles.*.max_rss_mib": Range(1, 1 << 20, unit="MiB"),
    "limits.max_payload_bytes": Range(1, 1 << 48, unit="bytes"),
    "limits.max_parcel_bytes": Range(1, 1 << 48, unit="bytes"),
    "limits.max_held_outcome_bytes": Range(1, 1 << 48, unit="bytes"),
    "limits.held_outcome_ttl_s": Range(1, WEEK_S, integer=False, unit="s"),
    # The kernel takes PSI trigger windows of 0.5..10 s, and a stall no longer than its window
    "memory.pressure_stall_ms": Range(1, 10_000, unit="ms"),
    "memory.pressure_window_ms": Range(500, 10_000, unit="ms"),
    "restart.max_restarts": Range(0, 1_000_000),
    "restart.within_seconds": Range(0, WEEK_S, integer=False, open_lo=True, unit="s"),
    "restart.fork_server_timeout_s": Range(0.1, 3600, integer=False, unit="s"),
    "metrics.port": Range(0, 65535),
    "saturation.window_s": Range(0, 3600, integer=False, open_lo=True, unit="s"),
    "saturation.raise_depth": Range(1, 10_000_000, unit="units"),
    "saturation.clear_depth": Range(0, 10_000_000, unit="units"),  # and below raise_depth
    "saturation.margin": Range(0, 10, integer=False, unit="fraction of the service rate"),
    "store.lease_ttl": Range(0, MAX_LEASE_TTL_S, integer=False, open_lo=True, unit="s"),
    "store.renew_every": Range(0, DAY_S, integer=False, open_lo=True, unit="s"),
    "store.poll_every": Range(0, 3600, integer=False, open_lo=True, unit="s"),
    # The host group's quotas and timing: the store's own ranges (admission.bounds), which
    # admission.store checks again with what they mean.
    "store.global_limit": _LEASES,
    "store.environments.*": _LEASES,
    "store.providers.*": _LEASES,
    "store.tiers.*": _LEASES,
    "store.aging_interval": Range(0, MAX_AGING_S, integer=False, open_lo=True, unit="s"),
    # The provider admission's timing and weights (admission.policy checks what they mean).
    "admission.probe_every": _ADMISSION_S,
    "admission.closed_for": _ADMISSION_S,
    "admission.daily_limit_probe_every": _ADMISSION_S,
    "admission.starved_after": _ADMISSION_S,
    "admission.aging_unit": _ADMISSION_S,
    "admission.backoff_base": _ADMISSION_S,
    "admission.backoff_max": _ADMISSION_S,
    "admission.severity.*": Range(0, 1_000_000),
}

#: Every slot a config declares, over all its roles, has a record in the table.
TOTAL_SLOTS = _SLOTS


def config_range(path: str) -> Range:
    """The range of the config key at dotted `path` (``roles.solver.slots``)."""
    if path in CONFIG:
        return CONFIG[path]
    parts = path.split(".")
    for pattern, within in CONFIG.items():
        if _matches(pattern.split("."), parts):
            return within
    raise KeyError(path)


def _matches(names: list[str], parts: list[str]) -> bool:
    if names[-1] == "*" and len(parts) > len(names):  # a last name may hold dots (a quoted TOML key)
        parts = parts[:len(names) - 1] + [".".join(parts[len(names) - 1:])]
    return len(names) == len(parts) and all(n in ("*", p) for n, p in zip(names, parts))


def posture_range(key: str) -> Range:
    """The range of posture key `key` (config and retune alike)."""
    return CONFIG[f"posture.{key}"]
