"""Where this process sits in the cgroup trees, and how much CPU it was given.

Effective CPUs follow the JDK's rule (Go, .NET and automaxprocs read only the leaf,
and miss a limit set higher up):

    min(affinity count, cpuset effective count, lowest quota/period of any ancestor)

cgroup v2 is preferred where its `cpu` (or `cpuset`) controller is enabled for our
group; otherwise the v1 hierarchy for that controller is used. Hybrid hosts (v1
controllers plus a cgroup2 mount without `cpu`) are the common case on our machines.

Every reader degrades instead of crashing: a missing file or controller yields
"unlimited" or "unknown" with the reason appended to `reasons`, so the caller can
log why a limit was not found. All paths are read below an injectable `root`, so
the tests point the same code at fixture trees copied from real hosts.

Units: v1 `cpu.stat` reports `throttled_time` in nanoseconds, v2 `throttled_usec`
in microseconds; `CpuStat.throttled_ns` holds either, normalised to nanoseconds.
"""
from __future__ import annotations

import os
import re
import select

from admission.records import field, record
from fleet.host import seat_cpus
from fleet.rules import delegation
from fleet.rules.errors import FleetError
from fleet.rules.quota import CpuLimit  # what `effective_cpus` returns: the plan's input, a pure value

V1 = 1
V2 = 2


class CgroupUnavailable(FleetError):
    """A cgroup file or facility this call needs is not there (the reason says which)."""


# --- /proc/<pid>/cgroup and /proc/<pid>/mountinfo ---------------------------------


@record
class Membership:
    """The process's cgroup paths: `v2` from the `0::` line, `v1` per controller."""

    v2: str | None
    v1: dict = field(default_factory=dict)


def parse_proc_cgroup(text: str) -> Membership:
    """Parse /proc/<pid>/cgroup (``id:controllers:path`` lines)."""
    v2, v1 = None, {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hier_id, controllers, path = parts
        if hier_id == "0" and controllers == "":
            v2 = path
            continue
        for name in controllers.split(","):
            if name:
                v1[name] = path
    return Membership(v2=v2, v1=v1)


@record
class Mount:
    """One cgroup mount from mountinfo: where it is, which subtree it shows, its options."""

    mount_point: str
    root: str
    fstype: str
    options: frozenset


_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field_text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field_text)


def parse_mountinfo(text: str) -> tuple[Mount, ...]:
    """The cgroup and cgroup2 mounts listed in /proc/<pid>/mountinfo."""
    mounts = []
    for line in text.splitlines():
        pre, sep, post = line.partition(" - ")
        if not sep:
            continue
        pre_fields, post_fields = pre.split(), post.split()
        if len(pre_fields) < 5 or len(post_fields) < 3:
            continue
        fstype = post_fields[0]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        options = frozenset(post_fields[2].split(","))
        mounts.append(Mount(_unescape(pre_fields[4]), _unescape(pre_fields[3]), fstype, options))
    return tuple(mounts)


# --- locating the directories that matter ----------------------------------------


@record
class ControllerDir:
    """A controller's directory for this process, and the mount it lives under."""

    controller: str
    version: int
    path: str  # absolute on the host (without the injected root)
    top: str  # the mount point: ancestor walks stop here


@record
class CgroupPaths:
    """Result of `locate`: the cpu and cpuset directories (None if unknown) and why."""

    cpu: ControllerDir | None
    cpuset: ControllerDir | None
    v2_path: str | None
    reasons: tuple[str, ...] = ()


def _join(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/")) if root not in ("", "/") else path


def _read_text(root: str, path: str) -> str | None:
    try:
        with open(_join(root, path), encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _dir_under(mount: Mount, cg_path: str) -> str | None:
    """The directory of cgroup `cg_path` inside `mount`, or None if the mount cannot show it."""
    root = mount.root.rstrip("/") or "/"
    if root == "/":
        rel = cg_path
    elif cg_path == root or cg_path.startswith(root + "/"):
        rel = cg_path[len(root):]
    elif cg_path == "/":
        # A cgroup namespace shows "/" for the mount's own root.
        rel = "/"
    else:
        return None
    return os.path.normpath(mount.mount_point + "/" + rel.lstrip("/"))


def _v2_dir(mounts, membership, root, controller, reasons):
    v2 = next((m for m in mounts if m.fstype == "cgroup2"), None)
    if v2 is None or membership.v2 is None:
        return None
    path = _dir_under(v2, membership.v2)
    if path is None:
        reasons.append(f"v2 path {membership.v2} is outside the cgroup2 mount root {v2.root}")
        return None
    path = _delegated_group(root, v2.mount_point, path)
    enabled = (_read_text(root, path + "/cgroup.controllers") or "").split()
    if controller not in enabled:
        reasons.append(f"cgroup2 at {path} has no {controller} controller")
        return None
    return ControllerDir(controller, V2, path, v2.mount_point)


def _delegated_group(root: str, mount_point: str, path: str) -> str:
    """`path`, or the delegated group above it when `path` is one of the leaves a delegated
    fleet made there (`fleet.rules.delegation.ours`): what fleetd finds from its leaf is the
    group it reads, as every reader of "our group" must."""
    if path == mount_point:
        return path
    own = delegation.Group(path, marked=delegate_mark(_join(root, path)))
    parent = delegation.Group(os.path.dirname(path), marked=delegate_mark(_join(root, os.path.dirname(path))))
    group, _ = delegation.ours(delegation.Facts(mount_point, own, parent))
    return path if group is None else group.path


def _v1_dir(mounts, membership, controller, reasons):
    mount = next((m for m in mounts if m.fstype == "cgroup" and controller in m.options), None)
    if mount is None:
        reasons.append(f"no cgroup v1 {controller} hierarchy mounted")
        return None
    cg_path = membership.v1.get(controller)
    if cg_path is None:
        reasons.append(f"/proc cgroup lists no v1 {controller} path")
        return None
    path = _dir_under(mount, cg_path)
    if path is None:
        reasons.append(f"v1 {controller} path {cg_path} is outside its mount root {mount.root}; using the mount")
        path = mount.mount_point
    return ControllerDir(controller, V1, path, mount.mount_point)


def locate(root: str = "/", pid: str = "self") -> CgroupPaths:
    """Find the cpu and cpuset cgroup directories of process `pid` (v2 first, then v1).

    Args:
        root: file-system root to read under (tests pass a fixture tree).
        pid: ``"self"`` or a process id.
    Returns:
        CgroupPaths; a controller that cannot be found is None, with the reason recorded.
    """
    reasons: list[str] = []
    cg_text = _read_text(root, f"/proc/{pid}/cgroup")
    mi_text = _read_text(root, f"/proc/{pid}/mountinfo")
    if cg_text is None or mi_text is None:
        reasons.append(f"cannot read /proc/{pid}/cgroup or mountinfo: not in a cgroup-capable system")
        return CgroupPaths(None, None, None, tuple(reasons))
    membership, mounts = parse_proc_cgroup(cg_text), parse_mountinfo(mi_text)
    dirs = {}
    for controller in ("cpu", "cpuset"):
        dirs[controller] = _v2_dir(mounts, membership, root, controller, reasons) or _v1_dir(
            mounts, membership, controller, reasons
        )
    return CgroupPaths(dirs["cpu"], dirs["cpuset"], membership.v2, tuple(reasons))


# --- quota, cpuset, effective CPUs ------------------------------------------------


def parse_cpu_max(text: str) -> float | None:
    """v2 ``cpu.max`` ("max 100000" or "150000 100000") -> CPUs, or None when unlimited."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    period = int(parts[1]) if len(parts) > 1 else 100000
    return int(parts[0]) / period


def parse_cfs(quota_text: str, period_text: str) -> float | None:
    """v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` -> CPUs, or None when unlimited (-1)."""
    quota = int(quota_text.strip())
    return None if quota < 0 else quota / int(period_text.strip())


def _ancestors(cdir: ControllerDir):
    path = cdir.path
    while True:
        yield path
        if path == cdir.top or len(path) <= len(cdir.top):
            return
        path = os.path.dirname(path)


def _quota_at(root: str, cdir: ControllerDir, path: str) -> float | None:
    if cdir.version == V2:
        text = _read_text(root, path + "/cpu.max")
        return parse_cpu_max(text) if text else None
    quota = _read_text(root, path + "/cpu.cfs_quota_us")
    period = _read_text(root, path + "/cpu.cfs_period_us")
    return parse_cfs(quota, period) if quota and period else None


def lowest_quota(cdir: ControllerDir, root: str = "/") -> tuple[float | None, str | None]:
    """The lowest quota/period over `cdir` and every ancestor up to its mount: (cpus, dir)."""
    best, where = None, None
    for path in _ancestors(cdir):
        try:
            cpus = _quota_at(root, cdir, path)
        except ValueError:
            cpus = None  # an unparsable file sets no limit we can honour
        if cpus is not None and (best is None or cpus < best):
            best, where = cpus, path
    return best, where


def parse_cpu_list(text: str) -> frozenset:
    """A kernel CPU list ("0-3,6,8-9") -> the set of CPU numbers."""
    cpus = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cpus)


def cpuset_count(cdir: ControllerDir, root: str = "/") -> int | None:
    """How many CPUs the cpuset controller lets this group use (None: unknown)."""
    names = ("cpuset.cpus.effective",) if cdir.version == V2 else ("cpuset.effective_cpus", "cpuset.cpus")
    for name in names:
        text = _read_text(root, f"{cdir.path}/{name}")
        if text and text.strip():
            return len(parse_cpu_list(text))
    return None


def _affinity_count() -> int | None:
    # The process's mask (its main thread's), not the calling thread's: the supervisor
    # pins its own loop thread to the reserve cores, and re-detects the quota from it.
    # A worker counts its seat's CPUs (fleet.host.seat_cpus).
    try:
        return len(seat_cpus.budget_cpus())
    except (AttributeError, OSError):
        return None


def effective_cpus(paths: CgroupPaths | None = None, root: str = "/", affinity=_affinity_count) -> CpuLimit:
    """min(affinity, cpuset, lowest ancestor quota) for this process.

    Args:
        paths: from `locate` (located here when None).
        root: file-system root to read under.
        affinity: callable returning the affinity CPU count (None when unknown).
    """
    paths = paths if paths is not None else locate(root)
    reasons = list(paths.reasons)
    quota, quota_dir = (None, None)
    if paths.cpu is not None:
        quota, quota_dir = lowest_quota(paths.cpu, root)
    cpuset = cpuset_count(paths.cpuset, root) if paths.cpuset is not None else None
    aff = affinity()
    known = [v for v in (aff, cpuset, quota) if v is not None]
    if not known:
        reasons.append("no affinity, cpuset or quota known; using os.cpu_count()")
        known = [os.cpu_count() or 1]
    return CpuLimit(min(known), aff, cpuset, quota, quota_dir, tuple(reasons))


# --- cpu.stat ---------------------------------------------------------------------


@record
class CpuStat:
    """Cumulative CPU counters of one cgroup. Throttle fields are None when not reported.

    `nr_throttled` counts CFS periods in which the group ran out of quota (once per
    period); `throttled_ns` is summed over per-CPU run queues and can exceed wall time.
    """

    nr_periods: int | None
    nr_throttled: int | None
    throttled_ns: int | None
    usage_ns: int | None = None

    @property
    def has_throttle(self) -> bool:
        return self.nr_throttled is not None and self.throttled_ns is not None


def parse_cpu_stat(text: str, version: int) -> CpuStat:
    """Parse ``cpu.stat`` of a v1 (ns) or v2 (µs) cgroup into a normalised CpuStat."""
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    if version == V2:
        throttled = values.get("throttled_usec")
        usage = values.get("usage_usec")
        return CpuStat(
            values.get("nr_periods"),
            values.get("nr_throttled"),
            None if throttled is None else throttled * 1000,
            None if usage is None else usage * 1000,
        )
    return CpuStat(values.get("nr_periods"), values.get("nr_throttled"), values.get("throttled_time"))


def read_cpu_stat(path: str, version: int, root: str = "/") -> CpuStat:
    """Read and parse `<path>/cpu.stat`; raises CgroupUnavailable if it cannot be read."""
    text = _read_text(root, path.rstrip("/") + "/cpu.stat")
    if text is None:
        raise CgroupUnavailable(f"cannot read {path}/cpu.stat")
    return parse_cpu_stat(text, version)


def read_throttle(cdir: ControllerDir, root: str = "/") -> CpuStat:
    """The throttling that slows the group `cdir`: its own ``cpu.stat`` with the throttle
    counters of every ancestor up to the mount added in.

    A group counts only the periods in which its *own* quota ran out (v1 and v2 alike). A
    quota set above it — a slice's ``CPUQuota=``, a container's limit, the unit's group
    when fleetd sits in a delegated leaf below it — throttles every process beneath while
    the leaf's ``nr_throttled`` stays 0, so reading the leaf alone never sees it. An
    ancestor without a quota counts nothing and adds nothing; one whose file cannot be
    read (above a container's view) is passed over. When quotas on two levels run out in
    the same period, both count it: the posture only errs towards cordoning sooner.

    Raises CgroupUnavailable when the group's own ``cpu.stat`` cannot be read.
    """
    own = read_cpu_stat(cdir.path, cdir.version, root)
    nr, ns = own.nr_throttled, own.throttled_ns
    for path in list(_ancestors(cdir))[1:]:
        try:
            above = read_cpu_stat(path, cdir.version, root)
        except CgroupUnavailable:
            continue
        if above.has_throttle:
            nr, ns = (nr or 0) + above.nr_throttled, (ns or 0) + above.throttled_ns
    return CpuStat(own.nr_periods, nr, ns, own.usage_ns)


# --- PSI --------------------------------------------------------------------------


@record
class PsiLine:
    """One PSI line: share of time stalled (percent) over 10/60/300 s, and total µs."""

    avg10: float
    avg60: float
    avg300: float
    total_us: int


@record
class Pressure:
    """A PSI file: `some` always, `full` where the kernel reports it (None otherwise)."""

    some: PsiLine
    full: PsiLine | None


def parse_psi(text: str) -> Pressure:
    """Parse a PSI file: /proc/pressure/{cpu,memory} or a cgroup's cpu.pressure or memory.pressure."""
    lines = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        kv = dict(p.split("=", 1) for p in pairs)
        lines[kind] = PsiLine(float(kv["avg10"]), float(kv["avg60"]), float(kv["avg300"]), int(kv["total"]))
    if "some" not in lines:
        raise ValueError("PSI text has no 'some' line")
    return Pressure(lines["some"], lines.get("full"))


def read_psi(path: str = "/proc/pressure/cpu", root: str = "/") -> Pressure:
    """Read a PSI file; raises CgroupUnavailable when PSI is off or the file is missing."""
    text = _read_text(root, path)
    if not text:
        raise CgroupUnavailable(f"cannot read {path} (PSI disabled or not supported)")
    return parse_psi(text)


def pressure_file(root: str = "/", pid: str = "self") -> tuple[str | None, bool]:
    """The CPU pressure file to watch for process `pid`: (path, own group).

    The ``cpu.pressure`` of the group `own_group` names (a delegated service group, or its
    own cgroup2 group below the root: pressure there is this fleet's own), else the
    host-wide ``/proc/pressure/cpu`` (own group False: other tenants' load shows there
    too), else (None, False) when the kernel has no PSI.
    """
    read = own_group(root, pid).reads.get(delegation.CPU_PRESSURE)
    return (None, False) if read is None else (read.path, read.own)


# --- memory: OOM kills and memory pressure --------------------------------------------


def memory_dir(root: str = "/", pid: str = "self") -> tuple[ControllerDir | None, tuple[str, ...]]:
    """The memory cgroup directory of process `pid` (v2 first, then v1), and why not when None.

    The group whose ``memory.events`` (v2) or ``memory.oom_control`` (v1) counts the OOM
    kills of this fleet's processes: the one this process sits in, which its workers inherit.
    """
    reasons: list[str] = []
    cg_text = _read_text(root, f"/proc/{pid}/cgroup")
    mi_text = _read_text(root, f"/proc/{pid}/mountinfo")
    if cg_text is None or mi_text is None:
        return None, (f"cannot read /proc/{pid}/cgroup or mountinfo",)
    membership, mounts = parse_proc_cgroup(cg_text), parse_mountinfo(mi_text)
    found = _v2_dir(mounts, membership, root, "memory", reasons) or _v1_dir(mounts, membership, "memory", reasons)
    return found, tuple(reasons)


def parse_flat_keyed(text: str) -> dict[str, int]:
    """A cgroup "flat keyed" file (``key value`` lines: memory.events, memory.oom_control)."""
    values = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if value.strip().isdigit():
            values[key] = int(value)
    return values


def oom_kills_file(cdir: ControllerDir) -> str:
    """Where the group's OOM-kill counter is: v2 ``memory.events`` (hierarchical: kills in the
    groups below count too), v1 ``memory.oom_control`` (its ``oom_kill`` line, kernel >= 4.13)."""
    return cdir.path.rstrip("/") + ("/memory.events" if cdir.version == V2 else "/memory.oom_control")


def read_oom_kills(cdir: ControllerDir, root: str = "/") -> int:
    """The group's cumulative count of processes the kernel's OOM killer killed in it.

    The kernel counts the kill before it sends SIGKILL (mm/oom_kill.c), so once a dead
    worker is reaped its kill is in the count. Raises CgroupUnavailable when the file
    cannot be read or has no ``oom_kill`` line (a v1 kernel older than 4.13).
    """
    return read_oom_kills_at(oom_kills_file(cdir), root)


def read_oom_kills_at(path: str, root: str = "/") -> int:
    """The ``oom_kill`` count of a v2 ``memory.events`` or a v1 ``memory.oom_control`` file
    (`read_oom_kills`); raises CgroupUnavailable when unreadable or without the counter."""
    text = _read_text(root, path)
    if text is None:
        raise CgroupUnavailable(f"cannot read {path}")
    count = parse_flat_keyed(text).get("oom_kill")
    if count is None:
        raise CgroupUnavailable(f"{path} has no oom_kill counter")
    return count


def own_pressure_file(resource: str, root: str = "/", pid: str = "self") -> str | None:
    """The ``<resource>.pressure`` file of process `pid`'s own cgroup2 group, when it sits in
    one below the root; None otherwise (the host-wide file is not the fleet's own)."""
    cg_text = _read_text(root, f"/proc/{pid}/cgroup")
    mi_text = _read_text(root, f"/proc/{pid}/mountinfo")
    if cg_text is None or mi_text is None:
        return None
    membership = parse_proc_cgroup(cg_text)
    v2 = next((m for m in parse_mountinfo(mi_text) if m.fstype == "cgroup2"), None)
    if v2 is None or membership.v2 in (None, "/"):
        return None
    path = _dir_under(v2, membership.v2)
    if path is None or not os.path.exists(_join(root, f"{path}/{resource}.pressure")):
        return None
    return f"{path}/{resource}.pressure"


class PsiTrigger:
    """A PSI trigger: wakes when `stall_us` of stall fall within `window_us`.

    Triggers fire only on rising pressure; leaving a pressured state must be found by
    polling `total` (see `read_psi`). One trigger per file descriptor. Without
    CAP_SYS_RESOURCE the kernel wants the window to be a multiple of 2 s.
    """

    def __init__(self, path: str, stall_us: int, window_us: int, kind: str = "some"):
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        except OSError as exc:
            raise CgroupUnavailable(f"cannot open {path} for a PSI trigger: {exc.strerror}") from None
        try:
            # The kernel parses a NUL-terminated string.
            os.write(self._fd, f"{kind} {stall_us} {window_us}\0".encode())
        except OSError as exc:
            os.close(self._fd)
            raise CgroupUnavailable(f"PSI trigger '{kind} {stall_us} {window_us}' refused: {exc.strerror}") from None
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLPRI)

    def wait(self, timeout_s: float) -> bool:
        """True if the trigger fired within `timeout_s` seconds."""
        events = self._poll.poll(max(0, int(timeout_s * 1000)))
        if any(ev & select.POLLERR for _, ev in events):
            raise CgroupUnavailable("PSI trigger file went away")
        return any(ev & select.POLLPRI for _, ev in events)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --- which group is ours: delegation (the rule is fleet.rules.delegation) ------------

#: The extended attributes systemd sets on a group it delegates: ``trusted.delegate`` from
#: the system manager, ``user.delegate`` from a user manager (systemd >= 251).
DELEGATE_XATTRS = ("trusted.delegate", "user.delegate")


def delegate_mark(path: str) -> bool:
    """Whether systemd marked the group at `path` delegated."""
    for name in DELEGATE_XATTRS:
        try:
            if os.getxattr(path, name).strip(b"\0 \n") in (b"1", b"yes", b"true"):
                return True
        except OSError:
            continue
    return False


def _group_at(root: str, path: str, mark) -> "delegation.Group":
    real = _join(root, path)
    try:
        files = frozenset(os.listdir(real))
    except OSError:
        files = frozenset()
    controllers = frozenset((_read_text(root, path + "/cgroup.controllers") or "").split())
    return delegation.Group(path, files, controllers, bool(mark(real)))


def facts(root: str = "/", pid: str = "self", *, arrange: bool = False, mark=delegate_mark) -> "delegation.Facts":
    """The facts `fleet.rules.delegation.decide` needs, read for process `pid`.

    Args:
        root: file-system root to read under (tests pass a fake tree).
        arrange: whether the fleet may rearrange its group (fleetd: True).
        mark: path -> whether systemd marked that group delegated (`delegate_mark`).
    """
    cg_text = _read_text(root, f"/proc/{pid}/cgroup") or ""
    mi_text = _read_text(root, f"/proc/{pid}/mountinfo") or ""
    membership, mounts = parse_proc_cgroup(cg_text), parse_mountinfo(mi_text)
    v2 = next((m for m in mounts if m.fstype == "cgroup2"), None)
    own = parent = None
    if v2 is not None and membership.v2 is not None:
        path = _dir_under(v2, membership.v2)
        if path is not None:
            own = _group_at(root, path, mark)
            if path != v2.mount_point:
                parent = _group_at(root, os.path.dirname(path), mark)
    v1, tops = {}, set()
    for controller in ("cpu", "memory"):
        found = _v1_dir(mounts, membership, controller, [])
        if found is not None:
            v1[controller] = found.path
            tops.add(found.top)
    host_psi = frozenset(p for p in delegation.HOST_PSI.values() if os.path.exists(_join(root, p)))
    return delegation.Facts(v2.mount_point if v2 else None, own, parent, v1, host_psi, arrange, frozenset(tops))


def own_group(root: str = "/", pid: str = "self", *, arrange: bool = False, mark=delegate_mark) -> "delegation.Arrangement":
    """Which group is this fleet's, and what it reads there: the one answer every reader
    asks (throttling, CPU and memory pressure, OOM kills). See `fleet.rules.delegation`."""
    return delegation.decide(facts(root, pid, arrange=arrange, mark=mark))


def _write(root: str, path: str, text: str) -> None:
    with open(_join(root, path), "w") as f:
        f.write(text)


def place(pid: int, leaf: str, root: str = "/") -> None:
    """Move process `pid` (all its threads) into the group `leaf`. Raises OSError."""
    _write(root, leaf + "/cgroup.procs", str(pid))


def arrange(arrangement: "delegation.Arrangement", root: str = "/", pid: int | None = None) -> "delegation.Arrangement":
    """Carry out a delegated arrangement for the supervisor `pid` (this process): make the
    leaves, move into the supervisor leaf every process of the group (this one first;
    the group must hold none for its controllers to reach the leaves), enable the
    controllers. On any failure the moves are undone, the leaves made here removed, and
    the arrangement returned says why (`fleet.rules.delegation.failed`): the group is
    still read, nothing is left half done. An arrangement not to arrange comes back as is."""
    if not arrangement.arranged:
        return arrangement
    pid = os.getpid() if pid is None else pid
    group, sup = arrangement.group, arrangement.leaves[delegation.SUPERVISOR]
    made, moved = [], []
    try:
        for leaf in arrangement.leaves.values():
            if not os.path.isdir(_join(root, leaf)):
                os.mkdir(_join(root, leaf))
                made.append(leaf)
        if arrangement.move_self:
            place(pid, sup, root)
            moved.append(pid)
            # Whatever else sits in the group is the unit's (started before this point)
            for other in (_read_text(root, group + "/cgroup.procs") or "").split():
                if int(other) != pid:
                    place(int(other), sup, root)
                    moved.append(int(other))
        if arrangement.enable:
            _write(root, group + "/cgroup.subtree_control", " ".join("+" + c for c in arrangement.enable))
    except OSError as exc:
        for p in moved:
            try:
                place(p, group, root)
            except OSError:
                pass
        for leaf in made:
            try:
                os.rmdir(_join(root, leaf))
            except OSError:
                pass
        return delegation.failed(arrangement, f"{exc.filename or group}: {exc.strerror or exc}")
    return arrangement
