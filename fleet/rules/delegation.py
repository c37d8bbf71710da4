"""Which cgroup is a fleet's own, where each of its processes goes, and which files it
reads there (pure: the facts come from `fleet.host.cgroup.facts`, the acts are
`fleet.host.cgroup.arrange` and `place`).

A service with ``Delegate=yes`` owns its unit's group on a pure cgroup v2 hierarchy:
systemd marks the group (the ``trusted.delegate`` extended attribute, ``user.delegate``
under a user manager) and leaves what is below it to the service. The kernel's
no-internal-process rule then says a group that hands controllers to its children
holds no process itself, so the fleet makes two leaves under its group:

    <unit group>/supervisor   fleetd (and anything it started before it moved)
    <unit group>/workers      the fork server, and so every worker it forks

enables the controllers it needs in the unit group's ``cgroup.subtree_control``, and
reads the unit group: its ``cpu.stat``, ``cpu.pressure``, ``memory.events`` and
``memory.pressure`` cover the supervisor and the workers, and nothing else.

Everything else is *embedded*: no mark (a unit without ``Delegate=``, a shell, a
container), a hybrid or v1 host (the controllers live in v1 trees, where delegation
means nothing), or a fleet embedded in a program (`fleet.Executor`: the group is the
program's, never rearranged). An embedded fleet reads what it can — its own v2 group's
files where they exist, the v1 cpu group's ``cpu.stat``, the host-wide PSI files — and
each reading says whether it is the fleet's own group or the host's.

`decide` is the one answer to "which group is ours"; every reader (throttle, CPU and
memory pressure, OOM kills) asks it, so they all read the same group.
"""
from __future__ import annotations

import posixpath

from admission.records import field, record, replace

#: The leaves a delegated fleet makes under its group, by what runs in them.
SUPERVISOR, WORKERS = "supervisor", "workers"
LEAVES = (SUPERVISOR, WORKERS)
#: The controllers a delegated fleet turns on for its leaves (those its group has):
#: cpu and cpuset for quota and throttle counters per leaf, memory for memory.events
#: per leaf, io and pids for the operator's own limits on a leaf.
WANTED = ("cpu", "cpuset", "io", "memory", "pids")

#: What `Arrangement.hierarchy` says about the host.
PURE_V2, HYBRID, V1_ONLY, NO_CGROUPS = "v2", "hybrid", "v1", "none"
#: The readings, by the file each comes from.
CPU_STAT, CPU_PRESSURE, MEMORY_EVENTS, MEMORY_PRESSURE = "cpu.stat", "cpu.pressure", "memory.events", "memory.pressure"
READINGS = (CPU_STAT, CPU_PRESSURE, MEMORY_EVENTS, MEMORY_PRESSURE)
#: On a v1 (or hybrid) host, the controller and the file that stand in for a reading: the
#: v1 cpu group's cpu.stat (throttle counters in ns), and memory.oom_control, whose
#: ``oom_kill`` line (kernel >= 4.13) counts what memory.events' does.
V1_FILES = {CPU_STAT: ("cpu", "cpu.stat"), MEMORY_EVENTS: ("memory", "memory.oom_control")}
#: Host-wide PSI files, by the cgroup file they stand in for.
HOST_PSI = {CPU_PRESSURE: "/proc/pressure/cpu", MEMORY_PRESSURE: "/proc/pressure/memory"}


@record
class Group:
    """One cgroup2 directory as found: its path, the names of the files in it, its
    ``cgroup.controllers`` and whether systemd marked it delegated."""

    path: str
    files: frozenset = frozenset()
    controllers: frozenset = frozenset()
    marked: bool = False


@record
class Facts:
    """What the host says, read at the edge (`fleet.host.cgroup.facts`).

    Args:
        v2_mount: the cgroup2 mount point, None without one.
        own: the process's own cgroup2 group (None: no cgroup2, or outside the mount's view).
        parent: the group above `own` (None at the mount's root).
        v1: controller -> the process's v1 directory, for each v1 hierarchy mounted
            (cpu and memory are the ones read); `v1_tops` their mount points.
        host_psi: the host-wide PSI files present (paths from `HOST_PSI`).
        arrange: whether this fleet may rearrange its group (fleetd: yes; a fleet
            embedded in a program: no, the group is the program's).
    """

    v2_mount: str | None
    own: Group | None
    parent: Group | None = None
    v1: dict = field(default_factory=dict)
    host_psi: frozenset = frozenset()
    arrange: bool = False
    v1_tops: frozenset = frozenset()  # the v1 mount points: a v1 dir that is one is the host's


@record
class Read:
    """Where one reading comes from: the file, its cgroup version (None: a /proc file),
    and whether it is the fleet's own group's (False: the host's, other tenants in it)."""

    path: str
    version: int | None
    own: bool


@record
class Arrangement:
    """`decide`'s answer.

    `group` is the group the fleet reads as its own (None: none, host-wide files only);
    `delegated` says systemd delegated it; `arranged` says the fleet puts its processes
    in `leaves` (name -> path) below it: `move_self` when the supervisor is not in its
    leaf yet, `enable` the controllers to write to the group's subtree_control. `reads`
    maps each reading to its `Read` (None: none to be had); `notes` say why, one line each.
    """

    hierarchy: str
    group: str | None
    delegated: bool
    arranged: bool = False
    mount: str | None = None  # the cgroup2 mount point (a delegated group's ancestors stop there)
    leaves: dict = field(default_factory=dict)
    move_self: bool = False
    enable: tuple = ()
    reads: dict = field(default_factory=dict)
    notes: tuple = ()

    @property
    def mode(self) -> str:
        return "delegated" if self.arranged else "embedded"

    def to_meta(self) -> dict:
        """The status document's ``cgroup`` section (JSON-safe)."""
        return {
            "mode": self.mode,
            "hierarchy": self.hierarchy,
            "group": self.group,
            "delegated": self.delegated,
            "leaves": dict(self.leaves),
            "enabled": list(self.enable) if self.arranged else [],
            "reads": {k: (None if r is None else {"path": r.path, "version": r.version, "own": r.own})
                      for k, r in self.reads.items()},
            "notes": list(self.notes),
        }


def hierarchy(facts: Facts) -> str:
    if facts.v2_mount is not None:
        return HYBRID if facts.v1 else PURE_V2
    return V1_ONLY if facts.v1 else NO_CGROUPS


def ours(facts: Facts) -> tuple[Group | None, bool]:
    """The delegated group this process belongs to, and whether it already sits in one of
    its leaves: its own group when marked; its parent when marked and the own group is
    one of `LEAVES` (a fleet that arranged itself, or was started in a leaf by
    ``DelegateSubgroup=``). (None, False) when neither is marked."""
    own, parent = facts.own, facts.parent
    if own is not None and own.marked:
        return own, False
    if own is not None and parent is not None and parent.marked and posixpath.basename(own.path) in LEAVES:
        return parent, True
    return None, False


def decide(facts: Facts) -> Arrangement:
    """Where the fleet's processes go and which files it reads (see the module's text)."""
    kind = hierarchy(facts)
    root, in_leaf = ours(facts)
    if root is not None and kind == PURE_V2:
        # In a leaf of a delegated group the fleet arranged itself already: any reader of
        # it (fleetd's own, long after boot) gets the same answer, asked to arrange or not.
        if not (facts.arrange or in_leaf):
            return _embedded(facts, kind, root, ("the group is delegated, but this fleet is embedded in a program: "
                                                 "its group is the program's and is not rearranged",))
        return _delegated(facts, root, in_leaf)
    notes = []
    if root is not None:
        notes.append(f"the group is delegated, but the host is {kind} (the controllers are cgroup v1): "
                     "delegation is not used")
    elif kind == PURE_V2:
        notes.append("not delegated (no Delegate= on the unit, or not started by systemd): the group may hold "
                     "processes that are not the fleet's")
    else:
        notes.append(f"not delegated: the host is {kind}" + (" (cgroup v1 controllers)" if kind != NO_CGROUPS else ""))
    return _embedded(facts, kind, root if root is not None else facts.own, tuple(notes))


def _delegated(facts: Facts, root: Group, in_leaf: bool) -> Arrangement:
    leaves = {name: posixpath.join(root.path, name) for name in LEAVES}
    enable = tuple(c for c in WANTED if c in root.controllers)
    reads = {name: _in_group(root, name) for name in READINGS}
    notes = [f"delegated: the supervisor in {SUPERVISOR}/, the fork server and its workers in {WORKERS}/"]
    for name in READINGS:
        if reads[name] is None:
            reads[name] = _host(facts, name)
            notes.append(_missing(name, root, reads[name]))
    move_self = not (in_leaf and facts.own.path == leaves[SUPERVISOR])
    return Arrangement(PURE_V2, root.path, True, True, facts.v2_mount, leaves, move_self, enable, reads, tuple(notes))


def _embedded(facts: Facts, kind: str, own: Group | None, notes: tuple) -> Arrangement:
    # The mount's root is everyone's: its files (where it has any) are the host's.
    group = own if own is not None and own.path != facts.v2_mount else None
    reads, notes = {}, list(notes)
    for name in READINGS:
        read = _in_group(group, name) if group is not None else None
        if read is None and name in V1_FILES and V1_FILES[name][0] in facts.v1:
            controller, file = V1_FILES[name]
            read = Read(posixpath.join(facts.v1[controller], file), 1, facts.v1[controller] not in facts.v1_tops)
            if name != CPU_STAT:
                notes.append(f"{name}: cgroup v1 {file} (its oom_kill line) in its stead")
        if read is None:
            read = _host(facts, name)
            notes.append(_missing(name, group, read))
        reads[name] = read
    # No cgroup2 group of its own: the v1 cpu group names it, unless that is the hierarchy's root
    cpu = reads[CPU_STAT]
    group_path = group.path if group is not None else (cpu.path.rsplit("/", 1)[0] if cpu and cpu.own else None)
    return Arrangement(kind, group_path, own is not None and own.marked, mount=facts.v2_mount, reads=reads,
                       notes=tuple(notes))


def _in_group(group: Group | None, name: str) -> Read | None:
    """`name` in `group` when the group has it; cpu.stat counts throttling only where the
    cpu controller is on (without it the file has usage alone: no reading for the posture),
    memory.events only where the memory controller is (a hybrid host's cgroup2 has neither)."""
    if group is None or name not in group.files:
        return None
    if _NEEDS.get(name, "") and _NEEDS[name] not in group.controllers:
        return None
    return Read(posixpath.join(group.path, name), 2, True)


#: The controller a reading needs in its group (PSI files need none).
_NEEDS = {CPU_STAT: "cpu", MEMORY_EVENTS: "memory"}


def _host(facts: Facts, name: str) -> Read | None:
    path = HOST_PSI.get(name)
    return Read(path, None, False) if path is not None and path in facts.host_psi else None


def _missing(name: str, group: Group | None, read: Read | None) -> str:
    if read is not None:
        return f"{name}: host-wide {read.path} (other tenants' load shows there too)"
    where = f"in {group.path}" if group is not None else "without a group of its own"
    return f"{name}: none {where}"


def failed(arrangement: Arrangement, reason: str) -> Arrangement:
    """The arrangement when making the leaves or moving into them failed: the same group
    read (it is still delegated and the fleet's), no leaves, and why."""
    return replace(arrangement, arranged=False, leaves={}, move_self=False, enable=(),
                   notes=(f"delegated, but not arranged: {reason}",) + arrangement.notes[1:])


def describe(meta: dict | None) -> list[str]:
    """The cgroup section as status lines (from `Arrangement.to_meta`)."""
    if not meta:
        return []
    mode = meta["mode"]
    head = f"{mode}: group {meta['group'] or '(none)'} ({_kind(meta['hierarchy'])})"
    if meta["leaves"]:
        head += "; leaves " + ", ".join(f"{name}/" for name in meta["leaves"])
    lines = [head]
    parts = []
    for name in READINGS:  # in this order: the table's JSON sorts its keys
        r = meta["reads"].get(name)
        if r is None:
            parts.append(f"{name} -")
        elif meta["group"] and r["path"].startswith(meta["group"] + "/"):
            parts.append(name)
        else:
            parts.append(f"{name} {r['path']}" + ("" if r["own"] else " (host-wide)"))
    lines.append("reads " + ", ".join(parts))
    lines += list(meta["notes"][1:] if mode == "delegated" else meta["notes"])
    return lines


def _kind(h: str) -> str:
    return {PURE_V2: "cgroup v2", HYBRID: "hybrid: v1 controllers and cgroup2", V1_ONLY: "cgroup v1",
            NO_CGROUPS: "no cgroups"}.get(h, h)
