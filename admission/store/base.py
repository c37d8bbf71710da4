"""The host-group admission store's contract: its records, its policy, its errors, its API.

Every orchestrator (every fleetd) of a host group opens the same durable store. The
store decides who may dispatch: a request is queued, then admitted under a renewable
lease when the host group's global limit and its environment, provider and
runtime-tier quotas all have room, or denied when policy can never admit it. One
store transaction is the serialization boundary, so the quotas hold across
processes and hosts. The decision rules themselves are pure (`admission.store.rules`);
the backends (`sqlite`, `postgres`) only read rows, call the rules and write rows.

Time is injected: a store takes a ``clock`` (seconds since the epoch, default
``time.time``) and reads it once per transaction, so tests step time by hand.

Errors are typed and carry an ``exit_code`` for the command line; a refused
request changes nothing.
"""
from __future__ import annotations

import abc
import math
from typing import Callable, Mapping

from admission.bounds import (  # noqa: F401 - re-exported: the store's callers read them here
    MAX_AGING_S, MAX_HEARTBEAT_S, MAX_LEASE_TTL_S, MAX_LEASES, MAX_QUEUE_TIMEOUT_S, PRIORITY_MAX, PRIORITY_MIN, shown,
)
from admission.errors import EXIT_CONFIG, FleetError
from admission.records import asdict, field, fields, record
from admission.store.tiers import HOST, TIERS, UnknownTier, tier_of  # noqa: F401 - re-exported
from admission.vocab import (  # noqa: F401 - the store's callers read the states here too
    ADMITTED, AWAITING_APPROVAL, BLOCKED_APPROVAL, BLOCKED_CAPACITY, BLOCKED_POLICY, CANCELLED, DENIED, EVENT_KINDS,
    HOLDING_STATES, LIVE_STATES, PREEMPTED, QUEUED, RELEASED, REOPENED, STATES, TERMINAL_STATES, TIMED_OUT,
)

# ----------------------------------------------------------------------------- states
# Request states and audit event kinds: admission.vocab (imported above, re-exported here).
# Runtime tiers and their aliases: admission.store.tiers. ``host`` admits one lease at a
# time unless the policy sets its quota.
HOST_TIER_DEFAULT_QUOTA = 1

# ----------------------------------------------------------------------------- bounds
# Every number the store takes has one range, the same on every backend (admission.bounds),
# checked before anything is written.
#: How long an orchestrator counts as alive after a call, unless it says otherwise
#: (`AdmissionStore.heartbeat`).
DEFAULT_HEARTBEAT_WINDOW = 30.0


def checked_text(name: str, value, empty_ok: bool = False) -> str:
    """`value` if it is a string without NUL (and not empty, unless `empty_ok`); else BadRequest naming `name`."""
    if not isinstance(value, str) or (not value and not empty_ok) or "\x00" in value:
        raise BadRequest(name, f"must be a{'' if empty_ok else ' non-empty'} string without NUL, got {shown(value)}")
    return value


def whole_problem(value, lo: int, hi: int) -> str | None:
    """Why `value` is no whole number in [lo, hi] (None: it is one)."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        return f"must be a whole number in [{lo}, {hi}], got {shown(value)}"
    return None


def seconds_problem(value, hi: float) -> str | None:
    """Why `value` is no number of seconds in (0, hi] (None: it is one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= hi:
        return f"must be a number of seconds in (0, {hi:g}], got {shown(value)}"
    return None

# ----------------------------------------------------------------------------- exit codes

EXIT_STORE_UNREACHABLE = 90  # the database cannot be reached (or stopped answering)
EXIT_SCHEMA_TOO_NEW = 91  # the store was migrated by newer code than this
EXIT_IDENTITY_CONFLICT = 92  # a request id reused with a different identity
EXIT_LEASE_LOST = 93  # the lease expired, was preempted, or its revision is stale
EXIT_BAD_STORE_REQUEST = 94  # a malformed request, unknown id, or not the owner
EXIT_QUOTA_CONFIG_INVALID = EXIT_CONFIG  # 78: the quota policy is invalid


class StoreError(FleetError):
    """Base of every error the admission store raises on purpose."""

    exit_code = EXIT_STORE_UNREACHABLE


class StoreUnreachable(StoreError):
    """The database could not be reached or the connection dropped mid-transaction.

    Fails closed: nothing was decided, and no lease counts as current until the
    store answers again. The next call reconnects.
    """

    exit_code = EXIT_STORE_UNREACHABLE


class StoreTimeout(StoreUnreachable):
    """A store call passed its deadline (a lock held elsewhere, a statement that would not end).

    Fails closed like any unreachable store: nothing was decided.
    """


class SchemaMissing(StoreUnreachable):
    """The database schema the url names does not exist and this user may not create it."""

    def __init__(self, url: str, schema: str, statement: str, cause):
        self.schema, self.statement = schema, statement
        super().__init__(f"{url}: schema {schema!r} does not exist and could not be created ({cause}); "
                         f"have its owner run: {statement}")


class SchemaTooNew(StoreError):
    """The store's schema version is newer than this code knows; it is not touched."""

    exit_code = EXIT_SCHEMA_TOO_NEW

    def __init__(self, found: int, supported: int):
        self.found, self.supported = found, supported
        super().__init__(f"store schema version {found} is newer than this code supports ({supported})")


class QuotaConfigInvalid(StoreError, ValueError):
    """A quota policy value is invalid; `path` names it (e.g. ``tiers.vm``)."""

    exit_code = EXIT_QUOTA_CONFIG_INVALID

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(f"{path}: {message}")


class BadRequest(StoreError, ValueError):
    """A request field is invalid (`field` names it); nothing was stored."""

    exit_code = EXIT_BAD_STORE_REQUEST

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(f"{field_name}: {message}")


class UnknownRequest(StoreError, KeyError):
    """No request with that id is in the store."""

    exit_code = EXIT_BAD_STORE_REQUEST

    def __str__(self):
        return f"no request {self.args[0]!r} in the store"


class NotOwner(StoreError):
    """Only the orchestrator that submitted a request may renew, release or cancel it."""

    exit_code = EXIT_BAD_STORE_REQUEST


class IdentityConflict(StoreError):
    """A request id already names a request with a different identity; fails closed."""

    exit_code = EXIT_IDENTITY_CONFLICT

    def __init__(self, request_id: str, fields: tuple[str, ...]):
        self.request_id, self.fields = request_id, fields
        super().__init__(f"request {request_id!r} already exists with different {', '.join(fields)}")


class NotAwaitingApproval(StoreError):
    """Approve or reject of a request that is not held for an approval; nothing changed.

    `state` is the request's state now.
    """

    exit_code = EXIT_BAD_STORE_REQUEST

    def __init__(self, request_id: str, state: str, verb: str):
        self.request_id, self.state = request_id, state
        super().__init__(f"cannot {verb} {request_id!r}: it is {state}, not {AWAITING_APPROVAL}")


class LeaseLost(StoreError):
    """The lease is not current: expired, preempted, released, or a stale revision.

    `state` is the request's state now and `reason` says why it is not admitted. A lease
    lost by preemption, by its timing out or by a policy denial is raised as the
    `Backpressure` of that state as well (`Preempted`, `TimedOut`, `BlockedPolicy`).
    """

    exit_code = EXIT_LEASE_LOST

    def __init__(self, request_id: str, state: str, reason: str):
        self.request_id, self.state, self.reason = request_id, state, reason
        StoreError.__init__(self, f"lease of {request_id!r} lost ({state}: {reason})")


class Backpressure(StoreError):
    """Why a request may not dispatch now, in the terms its caller acts on (reference 001).

    `outcome` is one of admission.vocab.BACKPRESSURE; `retryable` says whether asking again
    can help; `budgeted` that a retry is a new request (the old one ended) and spends the
    caller's retry budget. `state` and `reason` are the request's. The store never raises
    the retryable waits from a call: `backpressure_of(record)` (or `Record.require_lease`)
    turns a record into one; renewing a lease that was lost raises the lost kinds.

    ============================  ===================  =========  ========
    the request is                outcome              retryable  budgeted
    ============================  ===================  =========  ========
    queued for capacity           ``blocked/capacity``  yes        no (wait)
    awaiting approval             ``blocked/approval``  yes        no (wait, renewing)
    denied, or rejected           ``blocked/policy``    no         -
    preempted                     ``preempted``         no         -
    timed out (lease or queue)    ``timed-out``         yes        yes
    ============================  ===================  =========  ========
    """

    outcome = ""
    retryable = False
    budgeted = False
    exit_code = EXIT_LEASE_LOST

    def __init__(self, request_id: str, state: str, reason: str):
        self.request_id, self.state, self.reason = request_id, state, reason
        StoreError.__init__(self, f"request {request_id!r} {self.outcome} ({state}: {reason})")


class BlockedCapacity(Backpressure):
    """Queued: the host group has no room for it yet. Wait and ask again (`get`)."""

    outcome = BLOCKED_CAPACITY
    retryable = True


class BlockedApproval(Backpressure):
    """Admitted but held for an approval: keep renewing its lease, and ask again."""

    outcome = BLOCKED_APPROVAL
    retryable = True


class BlockedPolicy(LeaseLost, Backpressure):
    """Denied: the policy never admits it (a quota of 0), or someone rejected it. Final."""

    outcome = BLOCKED_POLICY


class Preempted(LeaseLost, Backpressure):
    """A request of strictly higher priority displaced its lease. Final for this request."""

    outcome = PREEMPTED


class TimedOut(LeaseLost, Backpressure):
    """Its lease ran out unrenewed, or it waited past its queue timeout. Worth a new request
    (`rules.retry_of`), within the caller's retry budget."""

    outcome = TIMED_OUT
    retryable = True
    budgeted = True


_BACKPRESSURE_OF = {QUEUED: BlockedCapacity, AWAITING_APPROVAL: BlockedApproval, DENIED: BlockedPolicy,
                    PREEMPTED: Preempted, TIMED_OUT: TimedOut}


def backpressure_of(record: "Record") -> Backpressure | None:
    """The backpressure `record` puts on its caller (not raised), or None: admitted (dispatch),
    or ended by an orchestrator's own act (released, cancelled)."""
    kind = _BACKPRESSURE_OF.get(record.state)
    return None if kind is None else kind(record.id, record.state, record.reason)


def lease_lost(request_id: str, state: str, reason: str) -> LeaseLost:
    """The LeaseLost to raise for a lease of a request now in `state` (its backpressure kind when it has one)."""
    kind = _BACKPRESSURE_OF.get(state)
    return kind(request_id, state, reason) if kind is not None and issubclass(kind, LeaseLost) \
        else LeaseLost(request_id, state, reason)


# ----------------------------------------------------------------------------- records


@record
class Request:
    """What an orchestrator asks the store for: permission to dispatch one piece of work.

    `id` is globally unique. `orchestrator`, `environment`, `provider` and `tier` are
    its placement identity. `tier` names the runtime tier (``host``, ``container``,
    ``vm``, ``microvm``, ``custom``) or a runtime that runs in one (``docker``,
    ``firecracker``, ``custom:<name>``; see admission.store.tiers), in any case: the
    store keeps the tier in `tier` and the name as given in `runtime` (which a caller
    may also set itself, as a label). `priority` is the base priority (higher first,
    a signed 32-bit level); `queue_timeout` (seconds, None = wait forever, at most 30
    days) bounds how long it may stay queued; `lease_ttl` (seconds, at most a day) is
    how long each lease grant or renewal lasts. `approval`: once admitted it waits for an
    approval (`AdmissionStore.approve`) before it may dispatch, holding its capacity
    while its lease is renewed.
    """

    id: str
    orchestrator: str
    environment: str
    provider: str
    tier: str = HOST
    priority: int = 0
    queue_timeout: float | None = None
    preemptible: bool = False
    lease_ttl: float = 30.0
    approval: bool = False
    runtime: str = ""


#: The fields two submissions of one id must share to be the same request (`runtime` is a
#: label: a replay that names the same tier otherwise is the same request).
IDENTITY_FIELDS = tuple(f.name for f in fields(Request) if f.name not in ("id", "runtime"))
#: Of those, the ones that say where the work runs.
PLACEMENT_FIELDS = ("orchestrator", "environment", "provider", "tier")


@record
class Record:
    """A request as the store holds it: the request, when it arrived, and where it stands.

    `revision` counts lease grants and renewals (0 while queued); `lease_expires` is
    the current lease's end (None unless admitted); `decided_at`/`reason` describe
    the latest state change.
    """

    request: Request
    submitted_at: float
    state: str
    revision: int = 0
    lease_expires: float | None = None
    decided_at: float | None = None
    reason: str = ""

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def lease(self) -> "Lease | None":
        """Its lease while it holds capacity (admitted, or awaiting approval), else None."""
        if self.state not in HOLDING_STATES:
            return None
        return Lease(self.id, self.revision, self.lease_expires, self.state)

    @property
    def backpressure(self) -> "Backpressure | None":
        """Why it may not dispatch (see `Backpressure`), or None."""
        return backpressure_of(self)

    def require_lease(self) -> "Lease":
        """Its lease when it may dispatch (admitted); else raise why not: its `Backpressure`
        (BlockedCapacity, BlockedApproval, BlockedPolicy, Preempted, TimedOut), or LeaseLost
        for one that was released or cancelled."""
        if self.state == ADMITTED:
            return self.lease
        raise backpressure_of(self) or LeaseLost(self.id, self.state, self.reason)

    def to_dict(self) -> dict:
        d = asdict(self.request)
        d.update(submitted_at=self.submitted_at, state=self.state, revision=self.revision,
                 lease_expires=self.lease_expires, decided_at=self.decided_at, reason=self.reason)
        return d


@record
class Lease:
    """Capacity held for `request_id` until `expires`, at revision `revision`.

    `state` ``admitted``: permission to dispatch; ``awaiting-approval``: the capacity is
    reserved, but the work may not start before an approval.
    """

    request_id: str
    revision: int
    expires: float
    state: str = ADMITTED

    def current(self, now: float) -> bool:
        return now < self.expires

    def dispatchable(self, now: float) -> bool:
        """Current, and admitted (not only reserved)."""
        return self.state == ADMITTED and now < self.expires


@record
class Event:
    """One audit row: `actor` (an orchestrator id) did `kind` to `request_id` at `at`, because `reason`."""

    seq: int
    at: float
    kind: str
    request_id: str
    actor: str
    reason: str


@record
class Orchestrator:
    """One orchestrator's heartbeat: it beat at `beat_at` and counts as gone from `lapses_at` on.

    Requests it queued are not admitted once it has lapsed (they are cancelled), and an
    admission granted to it never outlasts `lapses_at`. Its admitted leases still run to
    their own expiry: an absent heartbeat alone is no proof that its work stopped.
    """

    id: str
    beat_at: float
    lapses_at: float
    started_at: float

    def live(self, now: float) -> bool:
        return now < self.lapses_at


@record
class Closure:
    """A provider (credential None) or one of its keys known to be spent, as the host group shares it.

    Closed `until` (UTC epoch seconds) because of `cause` (a refusal kind such as
    ``daily-limit``), since `since`, with the provider's `message`; `daily` marks a
    daily limit (closed until the next UTC midnight). `written_at`/`written_by`: when
    and by which orchestrator the row was last written (set by the store).
    """

    provider: str
    credential: str | None
    until: float
    cause: str
    daily: bool = False
    since: float = 0.0
    message: str = ""
    written_at: float = 0.0
    written_by: str = ""

    @property
    def scope(self) -> str:
        """``provider/credential``, or ``provider/*`` for the whole provider (the audit rows' subject)."""
        return f"{self.provider}/{'*' if self.credential is None else self.credential}"


@record
class Health:
    """What `fleetctl store check` reports."""

    url: str
    schema_version: int
    supported_version: int
    host_time: float
    db_time: float

    @property
    def skew(self) -> float:
        """Seconds the database's clock is ahead of this host's (negative: behind)."""
        return self.db_time - self.host_time


# ----------------------------------------------------------------------------- policy


def _limit(path: str, value) -> int:
    problem = whole_problem(value, 0, MAX_LEASES)
    if problem:
        raise QuotaConfigInvalid(path, problem)
    return value


def _limits(path: str, value) -> dict:
    if not isinstance(value, Mapping):
        raise QuotaConfigInvalid(path, f"must be a table of name = limit, got {type(value).__name__}")
    out = {}
    for name, limit in value.items():
        if not isinstance(name, str) or not name:
            raise QuotaConfigInvalid(path, f"names must be non-empty strings, got {shown(name)}")
        out[name] = _limit(f"{path}.{name}", limit)
    return out


def _tier_limits(value) -> dict:
    """The tier quotas by tier, each name normalized (``VM``, ``docker``: vm, container)."""
    out, given = {}, {}
    for name, limit in _limits("tiers", value).items():
        try:
            tier = tier_of(name)
        except UnknownTier as exc:
            raise QuotaConfigInvalid(f"tiers.{name}", str(exc)) from None
        if tier in out:
            raise QuotaConfigInvalid(f"tiers.{name}", f"names tier {tier!r} again (as {given[tier]!r})")
        out[tier], given[tier] = limit, name
    return out


@record
class Policy:
    """The host group's limits, shared through the store.

    `global_limit`: admitted leases across the whole group (None = no limit).
    `environments`/`providers`/`tiers`: per-name quotas; a name not listed has no
    quota of its own, except the ``host`` tier, which defaults to 1. Tiers are named as
    requests name them (``VM``, ``docker``: see admission.store.tiers) and kept by their
    tier. A limit is a whole number in [0, MAX_LEASES]; 0 forbids: such requests are
    denied. `aging_interval` (seconds, at most a week): effective priority = base + 1
    per interval waited. `preemption`: off unless enabled. Build one with
    `Policy.build` to have every value checked.
    """

    global_limit: int | None = None
    environments: Mapping[str, int] = field(default_factory=dict)
    providers: Mapping[str, int] = field(default_factory=dict)
    tiers: Mapping[str, int] = field(default_factory=dict)
    aging_interval: float = 60.0
    preemption: bool = False

    @classmethod
    def build(cls, data: Mapping | None = None, **kw) -> "Policy":
        """A checked policy from a mapping (config or JSON) and/or keywords.

        Raises QuotaConfigInvalid naming the first bad key.
        """
        raw = dict(data or {}, **kw)
        known = {f.name for f in fields(cls)}
        for key in raw:
            if key not in known:
                raise QuotaConfigInvalid(str(key), f"unknown key; keys: {', '.join(sorted(known))}")
        g = raw.get("global_limit")
        tiers = _tier_limits(raw.get("tiers", {}))
        aging = raw.get("aging_interval", 60.0)
        problem = seconds_problem(aging, MAX_AGING_S)
        if problem:
            raise QuotaConfigInvalid("aging_interval", problem)
        pre = raw.get("preemption", False)
        if not isinstance(pre, bool):
            raise QuotaConfigInvalid("preemption", f"must be true or false, got {shown(pre)}")
        return cls(
            global_limit=None if g is None else _limit("global_limit", g),
            environments=_limits("environments", raw.get("environments", {})),
            providers=_limits("providers", raw.get("providers", {})),
            tiers=tiers,
            aging_interval=float(aging),
            preemption=pre,
        )

    def checked(self) -> "Policy":
        """This policy through `build`'s checks (for one built by hand)."""
        return Policy.build({f.name: getattr(self, f.name) for f in fields(self)})

    def tier_limit(self, tier: str) -> int | None:
        if tier in self.tiers:
            return self.tiers[tier]
        return HOST_TIER_DEFAULT_QUOTA if tier == HOST else None

    def to_dict(self) -> dict:
        return {"global_limit": self.global_limit, "environments": dict(self.environments),
                "providers": dict(self.providers), "tiers": dict(self.tiers),
                "aging_interval": self.aging_interval, "preemption": self.preemption}


DEFAULT_POLICY = Policy()


# ----------------------------------------------------------------------------- the contract


class AdmissionStore(abc.ABC):
    """The durable store every orchestrator of a host group shares.

    Each mutating call is one transaction that also reconciles: expired leases and
    queue deadlines become ``timed-out``, and the next eligible requests are
    admitted (or preempt, when the policy allows). So every call sees, and leaves,
    a reconciled store. `actor` names this orchestrator in the audit trail.

    Liveness comes with the calls: every call an orchestrator makes about its own
    requests (submit, get, renew, release, cancel, reconcile, active) is also its
    heartbeat, written in the same transaction whenever less than half of its
    `heartbeat_window` is left. An orchestrator that stops calling therefore lapses
    within one window: its queued requests are cancelled then, and no grant to them
    outlasts it. `heartbeat(window)` beats without a call (an orchestrator that is idle
    for longer than half a window) and sets the window its later calls renew.
    Operator calls (policy, approvals, listings, the audit trail, closures) beat nothing.
    """

    url: str
    actor: str
    clock: Callable[[], float]
    heartbeat_window: float = DEFAULT_HEARTBEAT_WINDOW

    @abc.abstractmethod
    def submit(self, request: Request) -> Record:
        """Queue (or at once admit, or deny) `request`; an exact replay returns its record.

        A request with `approval` set is admitted as ``awaiting-approval`` (its capacity
        held under a lease) until `approve` or `reject`. Its tier is stored normalized.
        Raises BadRequest (nothing stored), IdentityConflict (id reused differently).
        """

    @abc.abstractmethod
    def get(self, request_id: str) -> Record:
        """The request's record, reconciled to now. Raises UnknownRequest."""

    @abc.abstractmethod
    def renew(self, request_id: str, revision: int) -> Lease:
        """Extend a current lease (admitted, or awaiting approval) by its ttl; returns the
        lease at the next revision.

        Raises LeaseLost when the lease is not current (or `revision` is stale): as
        `Preempted`, `TimedOut` or `BlockedPolicy` when that is why.
        """

    @abc.abstractmethod
    def release(self, request_id: str, revision: int, reason: str = "done") -> Record:
        """Give a lease back at the end of its work; its capacity goes to the next request.

        When requests are queued, the release reconciles in the same call, so the next
        of them is admitted into the freed capacity at once where the rules allow (if
        the store does not answer that reconcile in time, the next reconciling call of
        any orchestrator does it). A request awaiting approval may be released too (its
        reservation given back). Releasing a request that no longer holds capacity is a
        no-op that returns its record.
        """

    @abc.abstractmethod
    def cancel(self, request_id: str, reason: str = CANCELLED) -> Record:
        """Cancel a live request (queued, admitted, awaiting approval); a finished one is returned as it is."""

    @abc.abstractmethod
    def approve(self, request_id: str, reason: str = "approved") -> Record:
        """Let a request awaiting approval dispatch: it is admitted under the lease it holds
        (same revision and expiry). Any orchestrator or operator may approve; audited
        (kind ``approved``). Approving one that was approved already returns its record.

        Raises UnknownRequest, NotAwaitingApproval (nothing changed).
        """

    @abc.abstractmethod
    def reject(self, request_id: str, reason: str = "rejected") -> Record:
        """Refuse a request awaiting approval: it is denied (``blocked/policy``) and its
        capacity goes to the next request. Audited (kind ``rejected``). Rejecting one that
        was rejected already returns its record.

        Raises UnknownRequest, NotAwaitingApproval (nothing changed).
        """

    @abc.abstractmethod
    def reconcile(self) -> list[Record]:
        """Apply expiries and admissions now; returns the live records (queued, admitted, awaiting approval)."""

    @abc.abstractmethod
    def active(self) -> list[Record]:
        """The live records, reconciled to now: those holding capacity, then the queue in queue order."""

    @abc.abstractmethod
    def events(self, request_id: str | None = None, since: int = 0, limit: int | None = None) -> list[Event]:
        """Audit rows after sequence `since`, oldest first (of one request, if given)."""

    @abc.abstractmethod
    def heartbeat(self, window: float) -> Orchestrator:
        """Say this orchestrator (`actor`) is alive for the next `window` seconds (at most a day).

        The orchestrator is judged by its heartbeat: once `window` passes without another
        beat (or a call, which beats too: see the class doc), its queued requests are
        cancelled. `window` is also what this handle's later calls renew.
        """

    @abc.abstractmethod
    def orchestrators(self) -> list[Orchestrator]:
        """Every orchestrator that has heartbeat in this store, by id."""

    @abc.abstractmethod
    def policy(self) -> Policy:
        """The host group's policy (the default one until an operator sets one)."""

    @abc.abstractmethod
    def set_policy(self, policy: Policy) -> Policy:
        """Store `policy` for the whole host group (audited), then reconcile under it."""

    @abc.abstractmethod
    def put_closures(self, closures) -> list[Closure]:
        """Write provider closures (`Closure`s; their written_* fields are ignored) in one transaction.

        Merge rule: per scope (provider, credential) a closure replaces the stored one
        only if its `until` is later, so a fleet never shortens what another fleet
        recorded; only `reopen_closure` ends one early. Every closure written (new or
        extended) is an audit row of kind ``closure``. Returns the closure in force
        for each given scope after the write. Raises BadRequest naming the first bad
        field (nothing is written).
        """

    @abc.abstractmethod
    def closures(self, now: float | None = None) -> list[Closure]:
        """The closures still in force at `now` (default: the store clock), by scope."""

    @abc.abstractmethod
    def reopen_closure(self, provider: str, credential: str | None = None, reason: str = REOPENED) -> bool:
        """Lift the closure of one scope, whatever its `until`; audited (kind ``reopened``).

        Returns whether there was one in force.
        """

    @abc.abstractmethod
    def check(self) -> Health:
        """Reach the database and report its schema version and clock."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection; the store may not be used afterwards."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
