"""Typed fleet configuration: a TOML file (or a dict), then ``FLEET_*`` environment overrides.

Sections and keys (every key optional; unknown sections and keys are rejected with
a ConfigError naming their dotted path)::

    [fleet]
    name = "fleet"            # names the shared table, socket and unit (see fleet.rules.names)
    profile = "auto"          # auto | serial | pinned (see fleet.rules.plan)
    cpus = 4.5                # use this quota instead of the detected one
    gc_freeze = true          # after boot, keep what boot loaded out of full GC collections (see FleetConfig)
    dispatch_priority = 10    # nice levels the supervisor's loop runs above its workers (fleet.host.priority)
    contention = "widen"      # widen | pin: a worker that waits for its CPUs runs on its share's (fleet.rules.contention)

    [budget]                  # terminal overrides of fleet.rules.budget's rules
    reserve = 1
    ambient_io = 2
    pinned_min = 2
    loop = "reserved"         # reserved | priority: the supervisor's loop on a reserved core, or
                              # ahead of its workers by priority (every core a worker's: fleet.Executor)
    solver = 3                # any declared role name: its share in cores

    [posture]                 # the six cordon keys of fleet.rules.posture.PosturePolicy
    cordon_enter_events = 2
    cordon_enter_window_ms = 1000
    cordon_duty_percent = 2.0
    cordon_duty_window_ms = 5000
    cordon_exit_clean_ms = 10000
    cordon_sim_intake_floor = 2   # omit for half the slot cap

    [roles.solver]            # fields of fleet.rules.roles.Role; no [roles] = the reference profile
    kind = "pinned"
    handler = "mypkg.work:solve"
    slots = 6                 # the budget count: most slots the role holds at once
    elastic_repin = false     # pinned roles only: re-key the least recently used idle pin on demand
    lookahead = 16            # pooled roles: units sent to a busy slot, so its worker never waits for the next

    [limits]
    max_payload_bytes = 1048576

    [saturation]              # when a role's backlog outruns its service (fleet.rules.saturation)
    window_s = 2.0            # seconds of samples a raise looks back over
    raise_depth = 8           # smallest backlog that can be saturated
    clear_depth = 0           # an episode clears once the backlog is at or below this
    margin = 0.05             # arrivals must beat service by this fraction to raise
    warn = true               # each episode's edges logged at WARNING (false: at INFO)

    [memory]                  # the fleet's own cgroup2 group's memory.pressure as a cordon input
    pressure_cordon = true    # hold the posture Cordoned (cause memory-pressure) while it is high
    pressure_stall_ms = 100   # the PSI trigger: this much stall of some task ...
    pressure_window_ms = 2000 # ... within this window (0.5..10 s; a multiple of 2 s unless root)

    [restart]                 # restart intensity: more than R restarts within T s stops the fleet
    max_restarts = 5
    within_seconds = 60
    fork_server_timeout_s = 5 # a fork server that leaves a fork unanswered this long is replaced

    [record]                  # the arrival log fleet-burst records traces from (fleet.runtime.arrivals)
    enabled = false
    path = "..."              # default: <runtime dir>/<name>.arrivals.jsonl

    [metrics]                 # the Prometheus endpoint (fleet.service.metrics); off unless enabled
    enabled = false
    host = "127.0.0.1"        # localhost only unless the operator opens it
    port = 9464               # 0 picks a free port
    spans = false             # a span per unit through OpenTelemetry (pip install 'fleet[otel]')

    [store]                   # the host-group admission store (admission.store); off without url
    url = "sqlite:///var/lib/fleet/store.db"   # or postgresql://user@db/fleet
    orchestrator = "host-a/demo"  # this fleet's id in the group; default "<hostname>/<fleet name>"
    lease_ttl = 30.0          # seconds a lease lasts unless renewed
    renew_every = 10.0        # default: a third of lease_ttl
    poll_every = 0.2          # how often queued requests are looked at
    global_limit = 8          # the group's quotas: written to the store at boot when any is set
    aging_interval = 60.0
    preemption = false
    [store.environments]      # also [store.providers], [store.tiers] (host defaults to 1)
    prod = 4
    [store.roles.solver]      # units of this role hold a lease from before dispatch to their outcome
    environment = "prod"
    provider = "local"
    tier = "host"             # host | container | vm | microvm | custom
    priority = 0
    preemptible = false
    queue_timeout = 600.0     # omit to wait without limit
    retries = 2               # a request timed out before the unit ran is asked again this often

    [admission]               # the provider admission (admission.policy; docs/admission.md)
    probe_every = 10.0        # a closed pool lets one probe through this often (seconds)
    closed_for = 2100.0       # credit / rejected-key closures last this long
    daily_limit_probe_every = 10.0   # probes of a daily-limit closure (default: probe_every)
    starved_after = 900.0     # a hard-pinned wait this long is listed as starving
    aging_unit = 86400.0      # urgency = (1 + severity) x (1 + age / aging_unit)
    closure_file = "..."      # closures kept across restarts; fleetd's default is in its state dir
    pinned_tags = ["coordinator"]
    [admission.severity]      # red-main 32, B 16, H 8, M 4, L 2, none 1 unless declared
    [admission.tiers]         # standard = ["glm-5.3", "gpt-6", ...]: model-id tokens, in order
    [admission.providers.openrouter.models."glm-5.3-review"]  # residency = "eu", retention = "zdr"
    [admission.alternatives]  # "glm-5.3-review" = ["gpt-6-sol@azure"]: replaces the tier defaults
    [admission.lanes.review]  # exclude = ["kimi"], residency = "eu", pinned = false

Bounds. The file must be a regular file (a FIFO, a device or a directory is refused
unread) of at most `fleet.rules.ranges.MAX_CONFIG_BYTES` (1 MiB), nesting tables and arrays at
most `MAX_CONFIG_DEPTH` (16) deep; every number must fall in its range in
`fleet.rules.ranges.CONFIG` (docs/configuration.md lists them). Each refusal is a ConfigError.

Environment. ``FLEET_<SECTION>__<KEY>`` sets one key (``FLEET_POSTURE__CORDON_DUTY_PERCENT=5``,
``FLEET_ROLES__SOLVER__SLOTS=4``); ``FLEET_NAME``, ``FLEET_PROFILE`` and ``FLEET_CPUS``
set the ``[fleet]`` keys. Values are parsed by the key's type (``null`` for an
optional value). Environment values win over the file and are listed in
`FleetConfig.env_overrides` so boot can log them. Other ``FLEET_*`` variables
without a ``__`` are not configuration and are left alone; a ``FLEET_X__Y`` whose
section is unknown is an error, so a typo cannot pass silently.
"""
from __future__ import annotations

from admission.records import field, fields, replace
import os

from admission.records import record
from fleet.rules.budget import BudgetOverrides
from fleet.rules.contention import CONTENTION_MODES, CONTENTION_WIDEN
from fleet.worker.prepare import WorkerSetup
from fleet.rules.errors import ConfigError
from fleet.host.files import FileTooLarge, NotRegularFile, read_regular
from fleet.rules.names import InvalidFleetName, validate_fleet_name
from fleet.rules.plan import PROFILES
from fleet.rules.posture import DEFAULT_POLICY, POLICY_KEYS, PosturePolicy, PostureRetuneError
from fleet.rules.vocab import PostureKey
from fleet.rules.ranges import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, config_range
from fleet.rules.roles import REFERENCE_ROLES, Role, RoleSet
from fleet.rules.saturation import DEFAULT_SATURATION, SATURATION_KEYS, SaturationPolicy

_ROLE_FIELDS = tuple(f.name for f in fields(Role) if f.name != "name")


@record
class Limits:
    """Input limits. `max_payload_bytes`: largest unit payload accepted, pickled (default:
    none below memory; a payload too large for its ring travels beside it, fleet.shm.parcels).
    `max_parcel_bytes`: the cap on payload bytes beside the rings at once. The last two are
    fleetd's own (`DAEMON_LIMITS`), for the outcomes it holds for its clients."""

    max_payload_bytes: int | None = None
    #: Most bytes of payloads held beside the rings at once (parcels made at submit and not
    #: yet removed by their unit's outcome); a submit waits for room (fleet.runtime.beside).
    #: None: a quarter of physical memory.
    max_parcel_bytes: int | None = None
    #: fleetd: most bytes of outcomes held for one client and not yet acknowledged (a value
    #: in a memfd counts its size); a single value over it fails its unit's future
    #: ResultError naming it, more of them held at once drop the client's outcomes
    #: (OutcomesDropped). None: a quarter of physical memory.
    max_held_outcome_bytes: int | None = None
    #: fleetd: seconds a client's outcomes are held after the client was last heard from (a
    #: submit, a poll, an acknowledgement); then they are dropped (OutcomesDropped). None:
    #: 300 s.
    held_outcome_ttl_s: float | None = None


#: The limits fleetd itself applies (its outcome store): a reload (SIGHUP) applies them live;
#: the others are the supervisor's, fixed at boot.
DAEMON_LIMITS = ("max_held_outcome_bytes", "held_outcome_ttl_s")


def supervisor_limits(limits: Limits) -> Limits:
    """`limits` without fleetd's own (`DAEMON_LIMITS`): what a reload compares to tell
    whether the supervisor's limits changed (they need a restart)."""
    return replace(limits, **{key: None for key in DAEMON_LIMITS})


@record
class RestartIntensity:
    """OTP-style restart intensity: more than `max_restarts` within `within_seconds` stops the fleet."""

    max_restarts: int = 5
    within_seconds: float = 60.0
    #: A fork server that leaves a fork unanswered this long (stopped, wedged) is killed and
    #: replaced; the grace of a worker stopped while the fleet closes; the zygote's grace at teardown.
    fork_server_timeout_s: float = 5.0


@record
class MemoryConfig:
    """Memory pressure as a cordon input (fleet.rules.pressure): a PSI trigger on the fleet's
    own cgroup2 group's memory.pressure fires at `pressure_stall_ms` of stall within
    `pressure_window_ms` and holds the posture Cordoned under ``memory-pressure`` until the
    stall rate stays below that for a whole window. Off with `pressure_cordon` false."""

    pressure_cordon: bool = True
    pressure_stall_ms: int = 100
    pressure_window_ms: int = 2000


@record
class MetricsConfig:
    """The Prometheus endpoint: served on `host`:`port` when `enabled` (port 0: any free port);
    `spans`: a span per unit through OpenTelemetry (fleet.runtime.spans; the fleet[otel] extra)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 9464
    spans: bool = False


@record
class StoreRole:
    """How units of one role ask the host-group store: placement, priority, waiting limit."""

    environment: str
    provider: str = "local"
    tier: str = "host"
    priority: int = 0
    preemptible: bool = False
    queue_timeout: float | None = None
    # How many times a unit's request is asked again after it timed out before the unit ran
    # (its queue timeout passed, or its lease ran out before the grant reached the fleet).
    retries: int = 2


#: The bound of ``[store.roles.<role>] retries``: each retry is a request of its own in the store.
MAX_LEASE_RETRIES = 100


@record
class StoreConfig:
    """The host-group admission store (admission.store); off unless `url` is set.

    Units of the roles listed in `roles` hold a lease of the store from before
    dispatch until their outcome. `policy` (None: leave the store's as it is) is
    written to the store at boot and then holds for the whole host group.
    """

    url: str | None = None
    orchestrator: str | None = None  # None: "<hostname>/<fleet name>"
    lease_ttl: float = 30.0
    renew_every: float | None = None  # None: a third of lease_ttl
    poll_every: float = 0.2
    policy: object = None  # admission.store.Policy, or None
    roles: tuple = ()  # ((role name, StoreRole), ...)

    def role(self, name: str) -> StoreRole | None:
        return dict(self.roles).get(name)


@record
class RecordConfig:
    """The arrival log: one JSON line per accepted unit at `path` when `enabled` (fleet.runtime.arrivals)."""

    enabled: bool = False
    path: str | None = None


@record
class AdmissionConfig:
    """The provider admission's declared policy (``[admission]``; see admission.policy).

    `section` is the section as declared (what a reload compares); `policy` its
    validated `admission.policy.Policy` (None: no section, the default policy);
    `closure_file` where closures outlive the process (None: fleetd's default, and
    none for an embedded fleet).
    """

    section: dict | None = None
    policy: object = field(default=None, compare=False)
    closure_file: str | None = None


@record
class FleetConfig:
    """The validated configuration. Build it with `load_config`."""

    name: str = "fleet"
    profile: str = "auto"
    cpus: float | None = None
    # After boot, gc.freeze(): the objects alive then (the modules; numba's compiler state,
    # some 100k, when the kernels run on numba's run-time path)
    # leave the collector's sight, so a full collection no longer walks them all, a stall
    # of every thread in the process (the dispatch loop's included) of 30-100 ms. Process-
    # wide, while a fleet that froze runs: the last one's stop thaws them (collector).
    gc_freeze: bool = True
    # Nice levels between the supervisor's loop and its workers, so a woken worker does not
    # preempt the loop that feeds every seat (fleet.host.priority: how, and what 0 keeps).
    dispatch_priority: int = 10
    # A seat's worker found waiting for its own CPUs (a noisy neighbour) runs on its role's
    # other CPUs while that lasts ("widen"), or stays on its pin whatever the host does ("pin");
    # either way status shows it contended (fleet.rules.contention).
    contention: str = CONTENTION_WIDEN
    budget: BudgetOverrides = field(default_factory=BudgetOverrides)
    posture: PosturePolicy = DEFAULT_POLICY
    roles: RoleSet = REFERENCE_ROLES
    limits: Limits = Limits()
    restart: RestartIntensity = RestartIntensity()
    memory: MemoryConfig = MemoryConfig()
    metrics: MetricsConfig = MetricsConfig()
    store: StoreConfig = StoreConfig()
    record: RecordConfig = RecordConfig()
    saturation: SaturationPolicy = DEFAULT_SATURATION
    admission: AdmissionConfig = AdmissionConfig()
    # What the workers do before their first unit beyond importing the handlers (the main
    # module, an initializer, retirement): set by fleet.Executor, not by a config file.
    workers: WorkerSetup = WorkerSetup()
    # Send ahead to a busy slot what its units' measured run time calls for, up to the
    # role's lookahead, and nothing before it is known (fleet.rules.pace): ProcessPool-
    # Executor's cancel, set by fleet.Executor; a role of a config file is fed its lookahead.
    paced: bool = False
    source: str | None = None
    env_overrides: tuple[str, ...] = ()


# --- value checks ---------------------------------------------------------------------


def _number(path, v):
    """`v` if it is in the range fleet.rules.ranges gives `path`, else ConfigError naming both."""
    why = config_range(path).problem(v)
    if why:
        raise ConfigError(path, why)
    return v


def _numbers_of(section, data, keys, tables) -> None:
    """Range-check the numbers of a section whose meaning another module checks: `keys`
    where given, and each value of the `tables` (name = number) when they are tables."""
    for key in keys:
        if data.get(key) is not None:
            _number(f"{section}.{key}", data[key])
    for table in tables:
        if isinstance(data.get(table), dict):
            for name, value in data[table].items():
                _number(f"{section}.{table}.{name}", value)


def _table(path, v) -> dict:
    if not isinstance(v, dict):
        raise ConfigError(path, f"must be a table, got {type(v).__name__}")
    return dict(v)


def _reject_unknown(path, data, known):
    for key in data:
        if key not in known:
            raise ConfigError(f"{path}.{key}", f"unknown key; known: {', '.join(known)}")


# --- sections ---------------------------------------------------------------------------


def _fleet(data):
    data = _table("fleet", data)
    _reject_unknown("fleet", data, ("name", "profile", "cpus", "gc_freeze", "dispatch_priority", "contention"))
    name = data.get("name", "fleet")
    try:
        validate_fleet_name(name)
    except InvalidFleetName as exc:
        raise ConfigError("fleet.name", str(exc)) from None
    profile = data.get("profile", "auto")
    if profile not in PROFILES:
        raise ConfigError("fleet.profile", f"must be one of {', '.join(PROFILES)}, got {profile!r}")
    cpus = data.get("cpus")
    gc_freeze = data.get("gc_freeze", True)
    if not isinstance(gc_freeze, bool):
        raise ConfigError("fleet.gc_freeze", f"must be true or false, got {gc_freeze!r}")
    levels = _number("fleet.dispatch_priority", data.get("dispatch_priority", FleetConfig.dispatch_priority))
    contention = data.get("contention", FleetConfig.contention)
    if contention not in CONTENTION_MODES:
        raise ConfigError("fleet.contention", f"must be one of {', '.join(CONTENTION_MODES)}, got {contention!r}")
    return {"name": name, "profile": profile, "cpus": None if cpus is None else _number("fleet.cpus", cpus),
            "gc_freeze": gc_freeze, "dispatch_priority": levels, "contention": contention}


def _posture(data):
    data = _table("posture", data)
    _reject_unknown("posture", data, POLICY_KEYS)
    try:
        return replace(DEFAULT_POLICY, **data)
    except PostureRetuneError as exc:
        key, why = next(iter(exc.problems.items()))
        raise ConfigError(f"posture.{key}", why) from None


def _roles(data):
    data = _table("roles", data)
    roles = []
    for name, fields_ in data.items():
        fields_ = _table(f"roles.{name}", fields_)
        _reject_unknown(f"roles.{name}", fields_, _ROLE_FIELDS)
        roles.append(Role(name=name, **fields_))
    return RoleSet(tuple(roles))


def _limits(data):
    data = _table("limits", data)
    keys = tuple(f.name for f in fields(Limits))
    _reject_unknown("limits", data, keys)
    caps = {key: data.get(key) for key in keys}
    return Limits(**{key: None if cap is None else _number(f"limits.{key}", cap) for key, cap in caps.items()})


def _restart(data):
    data = _table("restart", data)
    _reject_unknown("restart", data, ("max_restarts", "within_seconds", "fork_server_timeout_s"))
    return RestartIntensity(
        _number("restart.max_restarts", data.get("max_restarts", RestartIntensity.max_restarts)),
        _number("restart.within_seconds", data.get("within_seconds", RestartIntensity.within_seconds)),
        _number("restart.fork_server_timeout_s",
                data.get("fork_server_timeout_s", RestartIntensity.fork_server_timeout_s)),
    )


def _memory(data):
    data = _table("memory", data)
    _reject_unknown("memory", data, tuple(f.name for f in fields(MemoryConfig)))
    cordon = data.get("pressure_cordon", MemoryConfig.pressure_cordon)
    if not isinstance(cordon, bool):
        raise ConfigError("memory.pressure_cordon", f"must be true or false, got {cordon!r}")
    window = _number("memory.pressure_window_ms", data.get("pressure_window_ms", MemoryConfig.pressure_window_ms))
    stall = _number("memory.pressure_stall_ms", data.get("pressure_stall_ms", MemoryConfig.pressure_stall_ms))
    if stall > window:
        raise ConfigError("memory.pressure_stall_ms", f"must be at most memory.pressure_window_ms ({window}), "
                                                     f"got {stall!r}")
    return MemoryConfig(cordon, stall, window)


def _metrics(data):
    data = _table("metrics", data)
    _reject_unknown("metrics", data, ("enabled", "host", "port", "spans"))
    enabled = data.get("enabled", MetricsConfig.enabled)
    if not isinstance(enabled, bool):
        raise ConfigError("metrics.enabled", f"must be true or false, got {enabled!r}")
    spans = data.get("spans", MetricsConfig.spans)
    if not isinstance(spans, bool):
        raise ConfigError("metrics.spans", f"must be true or false, got {spans!r}")
    host = data.get("host", MetricsConfig.host)
    # An address or a host name, never empty: an empty host would bind every interface.
    if not isinstance(host, str) or not host.strip() or any(c.isspace() for c in host):
        raise ConfigError("metrics.host", f"must be a non-empty address or host name, got {host!r}")
    port = _number("metrics.port", data.get("port", MetricsConfig.port))
    return MetricsConfig(enabled, host, port, spans)


_STORE_KEYS = ("url", "orchestrator", "lease_ttl", "renew_every", "poll_every", "global_limit", "aging_interval",
               "preemption", "environments", "providers", "tiers", "roles")
_POLICY_KEYS = ("global_limit", "aging_interval", "preemption", "environments", "providers", "tiers")
_STORE_ROLE_KEYS = tuple(f.name for f in fields(StoreRole))


def _store(data, roles: RoleSet):
    """The [store] section: the url, this orchestrator's id, lease timing, the group's quotas,
    and which roles' units hold a lease ([store.roles.<role>])."""
    data = _table("store", data)
    _reject_unknown("store", data, _STORE_KEYS)
    url = data.get("url")
    if url is None:
        if data:
            raise ConfigError("store.url", "is required when [store] is configured")
        return StoreConfig()
    from admission.store import BadRequest, Policy, QuotaConfigInvalid, Request
    from admission.store.rules import validate_request

    if not isinstance(url, str) or not url.startswith(("sqlite://", "postgresql://", "postgres://")):
        raise ConfigError("store.url", f"must be sqlite:///path or postgresql://..., got {url!r}")
    orchestrator = data.get("orchestrator")
    if orchestrator is not None and (not isinstance(orchestrator, str) or not orchestrator.strip()):
        raise ConfigError("store.orchestrator", f"must be a non-empty name, got {orchestrator!r}")
    ttl = _number("store.lease_ttl", data.get("lease_ttl", StoreConfig.lease_ttl))
    renew = data.get("renew_every")
    if renew is not None and _number("store.renew_every", renew) >= ttl:
        raise ConfigError("store.renew_every", f"must be shorter than lease_ttl ({ttl}), got {renew!r}")
    poll = _number("store.poll_every", data.get("poll_every", StoreConfig.poll_every))
    policy = None
    _numbers_of("store", data, ("global_limit", "aging_interval"), ("environments", "providers", "tiers"))
    if any(k in data for k in _POLICY_KEYS):
        try:
            policy = Policy.build({k: data[k] for k in _POLICY_KEYS if k in data})
        except QuotaConfigInvalid as exc:
            raise ConfigError(f"store.{exc.path}", str(exc)[len(exc.path) + 2:]) from None
    gated = []
    for name, spec in _table("store.roles", data.get("roles", {})).items():
        path = f"store.roles.{name}"
        if name not in roles.names:
            raise ConfigError(path, f"no such role; roles: {', '.join(roles.names)}")
        spec = _table(path, spec)
        _reject_unknown(path, spec, _STORE_ROLE_KEYS)
        if "environment" not in spec:
            raise ConfigError(f"{path}.environment", "is required")
        role = StoreRole(**spec)
        retries = role.retries
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_LEASE_RETRIES:
            raise ConfigError(f"{path}.retries", f"must be a whole number in [0, {MAX_LEASE_RETRIES}], got {retries!r}")
        try:  # the store's own request check, on a sample request of this role
            validate_request(Request("check", "check", role.environment, role.provider, role.tier, role.priority,
                                     role.queue_timeout, role.preemptible, ttl))
        except BadRequest as exc:
            raise ConfigError(f"{path}.{exc.field}", str(exc)[len(exc.field) + 2:]) from None
        gated.append((name, role))
    return StoreConfig(url=url, orchestrator=orchestrator, lease_ttl=ttl, renew_every=renew, poll_every=poll,
                       policy=policy, roles=tuple(gated))


def _saturation(data):
    data = _table("saturation", data)
    _reject_unknown("saturation", data, SATURATION_KEYS)
    for key, value in data.items():
        if key == "warn":
            if not isinstance(value, bool):
                raise ConfigError("saturation.warn", f"must be true or false, got {value!r}")
        else:
            _number(f"saturation.{key}", value)
    raise_depth = data.get("raise_depth", DEFAULT_SATURATION.raise_depth)
    clear_depth = data.get("clear_depth", DEFAULT_SATURATION.clear_depth)
    if clear_depth >= raise_depth:
        raise ConfigError("saturation.clear_depth", f"must be below saturation.raise_depth ({raise_depth}), "
                                                    f"got {clear_depth!r}")
    return replace(DEFAULT_SATURATION, **data)


def _record(data):
    data = _table("record", data)
    _reject_unknown("record", data, ("enabled", "path"))
    enabled = data.get("enabled", RecordConfig.enabled)
    if not isinstance(enabled, bool):
        raise ConfigError("record.enabled", f"must be true or false, got {enabled!r}")
    path = data.get("path")
    if path is not None and (not isinstance(path, str) or not path.strip()):
        raise ConfigError("record.path", f"must be a file path, got {path!r}")
    return RecordConfig(enabled, path)


_ADMISSION_SECONDS = ("probe_every", "closed_for", "daily_limit_probe_every", "starved_after", "aging_unit",
                      "backoff_base", "backoff_max")


def _admission(data):
    """The [admission] section: the catalog and policy are validated by admission.policy (one
    rule in one place); `closure_file` is the fleet's own key."""
    data = _table("admission", data)
    closure_file = data.pop("closure_file", None)
    if closure_file is not None and (not isinstance(closure_file, str) or not closure_file.strip()):
        raise ConfigError("admission.closure_file", f"must be a file path, got {closure_file!r}")
    if not data and closure_file is None:
        return AdmissionConfig()
    _numbers_of("admission", data, _ADMISSION_SECONDS, ("severity",))
    from admission.policy import Policy

    return AdmissionConfig(section=data, policy=Policy.from_dict(data, path="admission"), closure_file=closure_file)


#: Where a fleet's config is installed: fleetd@NAME reads CONFIG_DIR/NAME.toml (the shipped
#: unit says so), and `fleetctl plan` plans it when no --config is given.
CONFIG_DIR = "/etc/fleet"


def installed_config(name: str, config_dir: str = CONFIG_DIR) -> str | None:
    """``CONFIG_DIR/<name>.toml`` when that file exists, else None."""
    path = os.path.join(config_dir, f"{name}.toml")
    return path if os.path.exists(path) else None


SECTIONS = ("fleet", "budget", "posture", "roles", "limits", "restart", "memory", "metrics", "store", "record",
            "admission", "saturation")


def _build(raw: dict, source, env_paths) -> FleetConfig:
    for key in raw:
        if key not in SECTIONS:
            raise ConfigError(key, f"unknown section; sections: {', '.join(SECTIONS)}")
    roles = _roles(raw["roles"]) if "roles" in raw else REFERENCE_ROLES
    budget = BudgetOverrides.from_mapping(_table("budget", raw.get("budget", {})))
    budget.check_roles(roles)
    return FleetConfig(
        **_fleet(raw.get("fleet", {})),
        budget=budget,
        posture=_posture(raw.get("posture", {})),
        roles=roles,
        limits=_limits(raw.get("limits", {})),
        restart=_restart(raw.get("restart", {})),
        memory=_memory(raw.get("memory", {})),
        metrics=_metrics(raw.get("metrics", {})),
        store=_store(raw.get("store", {}), roles),
        record=_record(raw.get("record", {})),
        saturation=_saturation(raw.get("saturation", {})),
        admission=_admission(raw.get("admission", {})),
        source=source,
        env_overrides=tuple(env_paths),
    )


# --- environment ---------------------------------------------------------------------------

_FLEET_SHORT = {"FLEET_NAME": ("fleet", "name"), "FLEET_PROFILE": ("fleet", "profile"), "FLEET_CPUS": ("fleet", "cpus")}
_TYPES = {
    ("fleet", "cpus"): "float?",
    ("fleet", "gc_freeze"): "bool",
    ("fleet", "dispatch_priority"): "int",
    ("fleet", "contention"): "str",
    ("budget", "reserve"): "int",
    ("budget", "ambient_io"): "int",
    ("budget", "pinned_min"): "int",
    ("budget", "loop"): "str",
    ("budget", "oversubscribe"): "bool",
    ("posture", PostureKey.ENTER_EVENTS): "int",
    ("posture", PostureKey.ENTER_WINDOW_MS): "int",
    ("posture", PostureKey.DUTY_PERCENT): "float",
    ("posture", PostureKey.DUTY_WINDOW_MS): "int",
    ("posture", PostureKey.EXIT_CLEAN_MS): "int",
    ("posture", PostureKey.INTAKE_FLOOR): "int?",
    ("limits", "max_payload_bytes"): "int?",
    ("limits", "max_parcel_bytes"): "int?",
    ("limits", "max_held_outcome_bytes"): "int?",
    ("limits", "held_outcome_ttl_s"): "float?",
    ("restart", "max_restarts"): "int",
    ("restart", "within_seconds"): "float",
    ("restart", "fork_server_timeout_s"): "float",
    ("memory", "pressure_cordon"): "bool",
    ("memory", "pressure_stall_ms"): "int",
    ("memory", "pressure_window_ms"): "int",
    ("metrics", "enabled"): "bool",
    ("metrics", "port"): "int",
    ("metrics", "spans"): "bool",
    ("store", "lease_ttl"): "float",
    ("store", "renew_every"): "float?",
    ("store", "poll_every"): "float",
    ("store", "global_limit"): "int?",
    ("store", "aging_interval"): "float",
    ("store", "preemption"): "bool",
    ("saturation", "window_s"): "float",
    ("saturation", "raise_depth"): "int",
    ("saturation", "clear_depth"): "int",
    ("saturation", "margin"): "float",
    ("saturation", "warn"): "bool",
    ("record", "enabled"): "bool",
    ("record", "path"): "str?",
    ("admission", "probe_every"): "float",
    ("admission", "closed_for"): "float",
    ("admission", "daily_limit_probe_every"): "float",
    ("admission", "starved_after"): "float",
    ("admission", "aging_unit"): "float",
    ("admission", "backoff_base"): "float",
    ("admission", "backoff_max"): "float",
    ("admission", "closure_file"): "str?",
}
_ROLE_TYPES = {
    "handler": "str?",
    "queue_bound": "int",
    "peak_cpus": "float",
    "slots": "int",
    "io_bound": "bool",
    "timeout_s": "float?",
    "elastic_repin": "bool",
    "lookahead": "int",
    "max_rss_mib": "int?",
}


def _type_of(parts) -> str:
    if parts[0] == "roles" and len(parts) == 3:
        return _ROLE_TYPES.get(parts[2], "str")
    if parts[0] == "budget" and len(parts) == 2:
        return _TYPES.get(tuple(parts), "float")
    return _TYPES.get(tuple(parts), "str")


def _parse_env(var, text, kind):
    if kind.endswith("?"):
        if text.strip().lower() in ("", "null", "none"):
            return None
        kind = kind[:-1]
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            value = float(text)
            return int(value) if value.is_integer() and "." not in text else value
        if kind == "bool":
            return {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}[text.strip().lower()]
    except (ValueError, KeyError):
        raise ConfigError("", f"{var}={text!r} is not a valid {kind}") from None
    return text


def _env_paths(env):
    """(dotted path parts, variable) for every FLEET_* variable that is configuration."""
    for var in sorted(env):
        if var in _FLEET_SHORT:
            yield _FLEET_SHORT[var], var
        elif var.startswith("FLEET_") and "__" in var:
            parts = [p.lower() for p in var[len("FLEET_"):].split("__")]
            if parts[0] not in SECTIONS or not all(parts):
                raise ConfigError(var, f"not a configuration variable: sections are {', '.join(SECTIONS)}")
            yield tuple(parts), var


def _apply_env(raw: dict, env) -> dict:
    """`raw` with environment overrides merged in; returns {dotted path: variable}."""
    origins = {}
    for parts, var in _env_paths(env):
        value = _parse_env(var, env[var], _type_of(parts))
        if parts[0] == "roles" and "roles" not in raw:
            raw["roles"] = {r.name: _role_dict(r) for r in REFERENCE_ROLES}
        node = raw
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(".".join(parts[: i + 1]), "is not a table")
        node[parts[-1]] = value
        origins[".".join(parts)] = var
    return origins


def _role_dict(role: Role) -> dict:
    return {f: getattr(role, f) for f in _ROLE_FIELDS}


# --- entry point -----------------------------------------------------------------------------


def _read_source(source):
    """(raw dict, where it came from). Every way a source can fail to load is a ConfigError:
    at boot it is exit 78, and on SIGHUP a refused reload that changes nothing (an escaping
    error would stop a running daemon)."""
    if source is None:
        return {}, None
    if isinstance(source, dict):
        _check_depth(source, "<dict>")  # before the copy: a dict that holds itself nests forever
        return _deep_copy(source), "<dict>"
    import tomllib  # a file's only: a dict's config (fleet.Executor's) starts without its parser

    path = os.fspath(source)
    text = _read_text(path)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"{path}: invalid TOML: {exc}") from None
    except RecursionError:  # the parser recurses once per level of an inline array or table
        raise ConfigError("", f"{path}: {_too_deep()}") from None
    except ValueError as exc:  # an integer past the interpreter's digit limit
        raise ConfigError("", f"{path}: invalid TOML: {exc}") from None
    return raw, path


def _read_text(path: str) -> str:
    """The text of the regular file at `path`, at most MAX_CONFIG_BYTES of it
    (`fleet.host.files.read_regular`: a FIFO, a device or a directory is refused unread)."""
    try:
        data = read_regular(path, MAX_CONFIG_BYTES)
    except FileTooLarge:
        raise ConfigError("", f"{path}: larger than {MAX_CONFIG_BYTES} bytes, the most a config file may hold") from None
    except OSError as exc:  # missing, unreadable, ...
        raise ConfigError("", f"cannot read {path}: {exc.strerror or exc}") from None
    except NotRegularFile as exc:
        raise ConfigError("", f"cannot read {path}: {exc}") from None
    except ValueError as exc:  # e.g. a NUL byte in the path
        raise ConfigError("", f"cannot read {path!r}: {exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("", f"{path}: not a TOML text file: byte {exc.start} is not UTF-8") from None


def _too_deep() -> str:
    return f"nested more than {MAX_CONFIG_DEPTH} tables or arrays deep, the most a config may nest"


def _check_depth(raw: dict, where: str) -> None:
    """ConfigError if tables and arrays nest deeper than MAX_CONFIG_DEPTH (walked without
    recursion: the check must not be what a deep file breaks)."""
    todo = [(raw, 1, "")]
    while todo:
        node, depth, path = todo.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(path, f"{where or 'the environment'}: {_too_deep()}")
        if isinstance(node, dict):
            children = ((f"{path}.{key}" if path else str(key), value) for key, value in node.items())
        else:
            children = ((f"{path}[{i}]", value) for i, value in enumerate(node))
        todo.extend((value, depth + 1, where_) for where_, value in children if isinstance(value, (dict, list)))


def _deep_copy(d):
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in d.items()}


def load_config(source=None, env=None) -> FleetConfig:
    """Load, override from the environment, and validate.

    Args:
        source: a TOML file path, a dict of the same shape, or None for defaults.
        env: the environment to read ``FLEET_*`` overrides from (default os.environ).
    Returns:
        A frozen FleetConfig.
    Raises:
        ConfigError: naming the dotted path (and the variable, for an environment
            value) of the first bad or unknown key. Nothing is loaded.
    """
    env = os.environ if env is None else env
    raw, where = _read_source(source)
    origins = _apply_env(raw, env)
    _check_depth(raw, where)
    try:
        return _build(raw, where, sorted(origins))
    except ConfigError as exc:
        var = origins.get(exc.path)
        if var is None:
            raise
        message = str(exc)[len(exc.path) + 2 :]
        raise ConfigError(exc.path, f"{message} (set by {var})") from None
