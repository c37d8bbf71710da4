"""The posture sampler: read a cgroup's cpu.stat on every tick and feed the posture;
and the quota watcher: re-detect the quota, read CPU pressure, on the same ticks.

The edge between the kernel and the pure posture rules: `tick()` reads the clock
and the counters, hands plain numbers to `PostureOwner.observe`, and returns what
changed. Clock, reader and wait are injected, so tests drive it tick by tick.

A group whose cpu.stat reports no throttle counters (cgroup2 without the cpu
controller) or cannot be read leaves the posture untouched: the sampler records
why in `unavailable` and keeps trying, it never raises out of a tick.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from admission.records import record
from fleet.host import cgroup
from fleet.rules import delegation, pressure, quota
from fleet.host.cgroup import CgroupUnavailable, CpuStat
from fleet.rules.posture import PostureOwner, Transition

log = logging.getLogger(__name__)


def monotonic_ms() -> int:
    """The default clock: monotonic milliseconds."""
    return time.monotonic_ns() // 1_000_000


@record
class Tick:
    """What one tick saw: the time, the reading (None if unreadable) and any change."""

    now_ms: int
    stat: CpuStat | None
    transition: Transition | None


class Sampler:
    """Reads throttle counters every `interval_s` and feeds a PostureOwner.

    Args:
        owner: the posture to feed.
        read_stat: returns the group's current CpuStat (raises CgroupUnavailable).
        clock: returns now in milliseconds (monotonic).
        interval_s: time between ticks in `run`.
    """

    def __init__(
        self,
        owner: PostureOwner,
        read_stat: Callable[[], CpuStat],
        clock: Callable[[], int] = monotonic_ms,
        interval_s: float = 0.25,
    ):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.owner = owner
        self._read = read_stat
        self._clock = clock
        self.interval_s = interval_s
        self.unavailable: str | None = None
        #: where the throttle counters come from, for status (`reads_from`); None: injected
        self.reads: dict | None = None

    @classmethod
    def for_cgroup(cls, owner: PostureOwner, path: str, version: int, root: str = "/", **kwargs) -> "Sampler":
        """A sampler over the cgroup directory `path` (v1 or v2)."""
        return cls(owner, lambda: cgroup.read_cpu_stat(path, version, root), **kwargs)

    @classmethod
    def for_self(cls, owner: PostureOwner, root: str = "/", **kwargs) -> "Sampler":
        """A sampler over this process's own cpu cgroup, as `fleet.host.cgroup.locate` finds it,
        and the groups above it."""
        paths = cgroup.locate(root)
        if paths.cpu is None:
            reason = "; ".join(paths.reasons) or "no cpu cgroup"

            def unavailable():
                raise CgroupUnavailable(reason)

            sampler = cls(owner, unavailable, **kwargs)
            sampler.reads = {"group": None, "version": None, "above": [], "reason": reason}
            return sampler
        return cls.for_dir(owner, paths.cpu, root, **kwargs)

    @classmethod
    def for_dir(cls, owner: PostureOwner, cdir, root: str = "/", **kwargs) -> "Sampler":
        """A sampler over the cpu group `cdir` (a `fleet.host.cgroup.ControllerDir`: a delegated
        fleet's unit group, or where `for_self` found this process) and the groups above it."""
        # Its own group and every group above it: a quota set higher up throttles this
        # fleet without its own group counting a period (`fleet.host.cgroup.read_throttle`).
        sampler = cls(owner, lambda: cgroup.read_throttle(cdir, root), **kwargs)
        sampler.reads = reads_from(cdir)
        return sampler

    @classmethod
    def for_arrangement(cls, owner: PostureOwner, arrangement, root: str = "/", **kwargs) -> "Sampler":
        """The sampler of a fleet whose group `arrangement` names (`fleet.host.cgroup.own_group`):
        a delegated fleet reads its unit group, never the leaf it sits in; an embedded one
        reads where `for_self` finds it."""
        if arrangement.arranged:
            group = arrangement.group
            return cls.for_dir(owner, cgroup.ControllerDir("cpu", cgroup.V2, group, arrangement.mount), root, **kwargs)
        return cls.for_self(owner, root, **kwargs)

    def describe(self) -> str:
        """Where the throttle counters come from, in one line (boot log, `fleetctl status`)."""
        return describe_reads(self.reads)

    def tick(self) -> Tick:
        """Read once and feed the posture. Never raises for a missing or partial cpu.stat."""
        now = self._clock()
        try:
            stat = self._read()
        except CgroupUnavailable as exc:
            self.unavailable = str(exc)
            return Tick(now, None, None)
        if not stat.has_throttle:
            self.unavailable = "cpu.stat has no throttle counters (no cpu controller on this group)"
            return Tick(now, stat, None)
        self.unavailable = None
        return Tick(now, stat, self.owner.observe(now, stat.nr_throttled, stat.throttled_ns))

    def run(self, stop: threading.Event, on_tick: Callable[[Tick], None] | None = None) -> None:
        """Tick every `interval_s` until `stop` is set."""
        while not stop.is_set():
            result = self.tick()
            if on_tick is not None:
                on_tick(result)
            stop.wait(self.interval_s)


def reads_from(cdir) -> dict:
    """Which groups a sampler over `cdir` (a `fleet.host.cgroup.ControllerDir`) reads: its own
    and those above it up to the mount, as status shows them."""
    chain = list(cgroup._ancestors(cdir))
    return {"group": cdir.path, "version": cdir.version, "above": chain[1:], "reason": None}


def describe_reads(reads: dict | None) -> str:
    if reads is None:
        return "throttle counters from an injected reader"
    if reads["group"] is None:
        return f"no throttle counters: {reads['reason']}"
    above = f" and the {len(reads['above'])} group(s) above it" if reads["above"] else ""
    return f"throttling read from {reads['group']}/cpu.stat (cgroup v{reads['version']}){above}"


# --------------------------------------------------------------------------- quota and pressure

#: How often the quota is re-detected (a pressure trigger wakes it sooner).
QUOTA_EVERY_MS = 2000
#: The PSI trigger: this much stall (µs) within the window (µs). Unprivileged
#: processes may only use windows that are a multiple of 2 s (PLATFORM.md).
PSI_STALL_US = 150_000
PSI_WINDOW_US = 2_000_000


class PressureInput:
    """A PSI trigger on a cpu.pressure (or memory.pressure) file, and the file's cumulative
    ``some`` total.

    `cordon` says whether the file is the fleet's own group's (a cordon input) or the
    host's (a wake-up for quota re-detection only). `poll` never blocks.
    """

    def __init__(self, path: str, cordon: bool, stall_us: int = PSI_STALL_US, window_us: int = PSI_WINDOW_US):
        self.path, self.cordon = path, cordon
        self.stall_us, self.window_us = stall_us, window_us
        self._trigger = cgroup.PsiTrigger(path, stall_us, window_us)  # CgroupUnavailable if refused

    @classmethod
    def for_self(cls, root: str = "/") -> "PressureInput | None":
        """The pressure input of this process (see `fleet.host.cgroup.pressure_file`); None
        when the kernel has no PSI or refuses the trigger."""
        path, own = cgroup.pressure_file(root)
        return cls.for_read(None if path is None else delegation.Read(path, None, own))

    @classmethod
    def for_read(cls, read) -> "PressureInput | None":
        """A pressure input on the `fleet.rules.delegation.Read` of a cpu.pressure file (the
        fleet's own group's cordons; the host's only wakes re-detection); None when there is
        none or the kernel refuses the trigger."""
        if read is None:
            return None
        try:
            return cls(read.path, read.own)
        except CgroupUnavailable:
            return None

    @staticmethod
    def memory_file(root: str = "/") -> str | None:
        """The memory.pressure file of this process's own cgroup2 group; None when it sits in
        none (host-wide memory pressure is other tenants' too: never a cordon input)."""
        return cgroup.own_pressure_file("memory", root)

    @classmethod
    def for_memory(cls, stall_us: int, window_us: int, root: str = "/", read=None) -> "PressureInput | None":
        """A trigger on this process's own group's memory.pressure (`[memory]` thresholds), or
        on the file `read` names (``path``, ``own``: a delegated unit's group) when it is the
        fleet's own; None when there is none or the kernel refuses the trigger (logged)."""
        path = cls.memory_file(root) if read is None else (read.path if read.own else None)
        if path is None:
            return None
        try:
            return cls(path, True, stall_us, window_us)
        except CgroupUnavailable as exc:
            log.warning("memory pressure is no cordon input: %s", exc)
            return None

    def poll(self) -> tuple[bool, int | None]:
        """(fired since the last poll, total µs stalled or None when unreadable)."""
        try:
            fired = self._trigger.wait(0)
            total = cgroup.read_psi(self.path).some.total_us
        except (CgroupUnavailable, ValueError, KeyError):
            return False, None
        return fired, total

    def close(self) -> None:
        self._trigger.close()


@record
class Seen:
    """What one `QuotaWatcher.poll` found: a quota change, and a pressure HOLD/RELEASE."""

    change: quota.Change | None = None
    pressure: str | None = None
    memory: str | None = None  # a memory pressure HOLD/RELEASE


class QuotaWatcher:
    """Re-detects the quota every `every_ms` (at once when a pressure trigger fired) and
    turns pressure readings into cordon holds; the rules are `fleet.rules.quota` and
    `fleet.rules.pressure`, this is their edge. Clock, detection and pressure are injected.

    Args:
        booted: the Quota the fleet booted with (epoch 0).
        detect: returns a `fleet.rules.quota.CpuLimit` (raises OSError/CgroupUnavailable).
        pressure_input: a `PressureInput`-like object (poll, cordon, stall_us,
            window_us, path), or None.
        arm_pressure: instead of `pressure_input`, a callable returning one (or None),
            called at the first poll: a fleet arms its trigger once it has booted, so
            the stalls of its own boot (imports, forks) do not cordon it.
        memory_input, arm_memory: the same for the group's memory.pressure (a cordon
            input under the cause ``memory-pressure``; never a quota wake-up).
    """

    def __init__(self, booted: quota.Quota, *, detect=cgroup.effective_cpus, clock=monotonic_ms,
                 every_ms: int = QUOTA_EVERY_MS, pressure_input=None, arm_pressure=None, memory_input=None,
                 arm_memory=None):
        self._detect, self._clock, self.every_ms = detect, clock, every_ms
        self.state = quota.watch_initial(booted, clock(), every_ms)
        self.pressure_input = pressure_input
        self._arm = arm_pressure
        self.pressure_state = pressure.PressureState()
        self.memory_input, self._arm_memory = memory_input, arm_memory
        self._memory_asked = memory_input is not None or arm_memory is not None
        self.memory_state = pressure.PressureState()
        self.unavailable: str | None = None

    def describe(self) -> str:
        """What is watched, for the boot log."""
        text = f"quota re-detected every {self.every_ms / 1000:g} s"
        p = self.pressure_input
        if p is None:
            text += "; no CPU pressure input (no PSI, or the trigger was refused)"
        elif p.cordon:
            text += f"; CPU pressure on {p.path} cordons the fleet"
        else:
            text += f"; host-wide CPU pressure ({p.path}) wakes re-detection (no cordon input: not the fleet's own group)"
        m = self.memory_input
        if m is None:
            if not self._memory_asked:
                return text
            return text + "; no memory pressure input (no own cgroup2 group, no PSI, or the trigger was refused)"
        return text + (f"; memory pressure on {m.path} ({m.stall_us // 1000} ms stalled in {m.window_us // 1000} ms) "
                       "cordons the fleet")

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def quota(self) -> quota.Quota:
        return self.state.quota

    def poll(self) -> Seen:
        if self._arm is not None or self._arm_memory is not None:
            if self._arm is not None:
                self.pressure_input, self._arm = self._arm(), None
            if self._arm_memory is not None:
                self.memory_input, self._arm_memory = self._arm_memory(), None
            log.info("%s", self.describe())
        now = self._clock()
        memory = None
        if self.memory_input is not None:
            m = self.memory_input
            m_fired, m_total = m.poll()
            self.memory_state, memory = pressure.observe(self.memory_state, now, m_fired, m_total, m.stall_us,
                                                         m.window_us)
        action, fired = None, False
        if self.pressure_input is not None:
            fired, total = self.pressure_input.poll()
            if self.pressure_input.cordon:
                p = self.pressure_input
                self.pressure_state, action = pressure.observe(self.pressure_state, now, fired, total,
                                                               p.stall_us, p.window_us)
        if not quota.due(self.state, now, fired):
            return Seen(None, action, memory)
        try:
            limit = self._detect()
            detected, source = limit.cpus, quota.detected_from(limit)
            self.unavailable = None
        except (OSError, CgroupUnavailable, ValueError) as exc:
            detected, source = None, ""
            self.unavailable = f"quota re-detection failed: {exc}"
        self.state, change = quota.observe(self.state, now, self.every_ms, detected, source)
        return Seen(change, action, memory)

    def close(self) -> None:
        for p in (self.pressure_input, self.memory_input):
            if p is not None:
                p.close()


# --------------------------------------------------------------------------- memory


class OomCounter:
    """The OOM-kill counter of one memory group: `path` is its v2 ``memory.events`` or v1
    ``memory.oom_control`` (`fleet.host.cgroup.read_oom_kills_at`), `version` its cgroup
    version. `read` returns the count, or None when it cannot be read (why in `unavailable`)."""

    def __init__(self, path: str | None, version: int | None, root: str = "/", reason: str | None = None):
        self.path, self.version, self._root = path, version, root
        self.unavailable: str | None = reason

    @classmethod
    def for_self(cls, root: str = "/") -> "OomCounter":
        """The counter of this process's own memory group (its workers inherit it)."""
        cdir, reasons = cgroup.memory_dir(root)
        if cdir is None:
            return cls(None, None, root, "; ".join(reasons) or "no memory cgroup")
        return cls(cgroup.oom_kills_file(cdir), cdir.version, root)

    @classmethod
    def for_read(cls, read, root: str = "/") -> "OomCounter":
        """The counter in the file a reading names (``path``, ``version``: a fleet whose group
        is not the one it sits in, a delegated unit's); None reads as no memory group."""
        if read is None:
            return cls(None, None, root, "no memory.events or memory.oom_control of the fleet's group")
        return cls(read.path, read.version, root)

    def read(self) -> int | None:
        if self.path is None:
            return None
        try:
            count = cgroup.read_oom_kills_at(self.path, self._root)
        except (CgroupUnavailable, ValueError) as exc:
            self.unavailable = str(exc)
            return None
        self.unavailable = None
        return count

    def describe(self) -> str:
        """Where OOM kills are counted from, in one line (boot log, status)."""
        if self.path is None or self.unavailable:
            return f"OOM kills not counted: {self.unavailable}"
        return f"OOM kills read from {self.path}" + (f" (cgroup v{self.version})" if self.version else "")
