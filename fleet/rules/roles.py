"""Roles: the kinds of work a slot can be leased for, and how each reacts to cordon.

A role is declared data: a name, a kind (how slots hold it), a cordon class (what
posture does to its intake), a handler named as ``module:function``, a queue bound
and its declared peak CPU share. The reference profile ships the eight roles of the
worker-fleet design so that budgets and tests have a known vector to hold on to.
"""
from __future__ import annotations

import re

from admission.records import field, record
from fleet.rules import fsm, ranges
from fleet.rules.errors import ConfigError, FleetError
from fleet.rules.limits import DEFAULT_LOOKAHEAD, MAX_ROLES
from fleet.rules.vocab import CLASS_CODES, CordonClass

KINDS = {name: i for i, name in enumerate(fsm.KIND_NAMES)}
CORDON_CLASSES = CLASS_CODES

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,30}$")
_HANDLER_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class UnknownRoleError(FleetError, KeyError):
    """A role name that the fleet does not declare."""

    def __init__(self, name, known):
        self.name = name
        super().__init__(f"unknown role {name!r}; declared roles: {', '.join(known) or '(none)'}")

    def __str__(self):  # KeyError would repr() the message
        return self.args[0]


_NUMBERS = ("queue_bound", "slots", "lookahead", "peak_cpus", "timeout_s", "max_rss_mib")
_MAY_BE_NONE = ("peak_cpus", "timeout_s", "max_rss_mib")


def _in_range(path: str, value) -> None:
    why = ranges.config_range(path).problem(value)
    if why:
        raise ConfigError(path, why)


@record
class Role:
    """One declared role.

    Args:
        name: lower-case identifier, unique in the fleet.
        kind: ``pinned`` (keyed; one persistent pin per key), ``pooled`` or ``singleton``.
        cordon_class: ``never``, ``floor`` (intake floored under cordon) or ``deferrable``
            (what each does: `fleet.rules.cordon`).
        handler: ``module:function`` run for each unit (None: declared, not active).
        queue_bound: most units waiting in this role's queue; a full queue refuses.
        peak_cpus: declared peak CPU share (cores) for the budget's sum check. None (not
            declared): a CPU-bound role asks for one core per slot and the budget caps
            it to the cores the quota has left (`fleet.rules.budget`), so ``slots = 4`` on a
            roomy host runs on up to 4 worker processes; an I/O-bound role counts 1.
        slots: how many slots this role may hold at once (pins for a pinned role).
        io_bound: an I/O-dominant role: it may spend the fractional remainder of a quota,
            and its worker runs up to its slots of units at once (`fleet.worker.io.runner`).
        timeout_s: per-unit run-time limit (None: none).
        elastic_repin: a pinned role only. When every pin is taken and a unit of a new key
            arrives, re-key the least recently used pin that has nothing in flight (T9
            then T1) instead of waiting for the next epoch boundary. Off by default: pins
            are released only at an epoch boundary (quota change, config reload), so a
            key beyond the role's `slots` waits until then (002 §3.4).
        lookahead: a pooled role only. Most units sent to a slot beyond the one it runs,
            so its worker starts the next without waiting for a round trip through the
            supervisor (default 16; 0 sends a slot's next unit only once it is Idle). A
            unit sent ahead waits behind the one that runs: give 0 to a role whose units
            run long and unevenly, where waiting behind a long one costs more than the
            round trip. Sent ahead only while the role's queue holds at least as many
            units as each of its slots would then have waiting on it. An I/O-bound role
            sends at most one ahead per slot (its units wait far longer than the trip).
        max_rss_mib: recycle a worker whose resident memory is above this many MiB after
            it ran a unit of this role: it reports the unit, then exits and its seat is
            forked again (no unit fails, no death is counted; None: never). Not for an
            I/O-bound role, whose worker runs several units at once.
    """

    name: str
    kind: str = "pooled"
    cordon_class: str = CordonClass.NEVER
    handler: str | None = None
    queue_bound: int = 1024
    peak_cpus: float | None = None
    slots: int = 1
    io_bound: bool = False
    timeout_s: float | None = None
    elastic_repin: bool = False
    lookahead: int = DEFAULT_LOOKAHEAD
    max_rss_mib: int | None = None

    def __post_init__(self):
        where = f"roles.{self.name}"
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ConfigError(where, "role name must match [a-z][a-z0-9_]{0,30}")
        if self.kind not in KINDS:
            raise ConfigError(f"{where}.kind", f"unknown kind {self.kind!r}; one of {', '.join(KINDS)}")
        if self.cordon_class not in CORDON_CLASSES:
            raise ConfigError(
                f"{where}.cordon_class",
                f"unknown cordon class {self.cordon_class!r}; one of {', '.join(CORDON_CLASSES)}",
            )
        if self.handler is not None and not (isinstance(self.handler, str) and _HANDLER_RE.match(self.handler)):
            raise ConfigError(f"{where}.handler", f"handler must be 'module:function', got {self.handler!r}")
        for name in _NUMBERS:  # their ranges: fleet.rules.ranges
            value = getattr(self, name)
            if value is not None or name not in _MAY_BE_NONE:
                _in_range(f"{where}.{name}", value)
        if self.max_rss_mib is not None and self.io_bound:
            raise ConfigError(f"{where}.max_rss_mib", "an I/O-bound role's worker runs several units at once: "
                              "it has no point between units to be recycled at")
        if self.kind == "singleton" and self.slots != 1:
            raise ConfigError(f"{where}.slots", "a singleton role holds exactly one slot")
        if not isinstance(self.elastic_repin, bool):
            raise ConfigError(f"{where}.elastic_repin", f"must be true or false, got {self.elastic_repin!r}")
        if self.elastic_repin and self.kind != "pinned":
            raise ConfigError(f"{where}.elastic_repin",
                              f"re-pinning re-keys pins of a pinned (keyed) role; {self.name!r} is {self.kind}")

    @property
    def ahead(self) -> int:
        """Units sent to a slot beyond the one it runs (`lookahead`; pooled roles only)."""
        return self.lookahead if self.kind == "pooled" else 0

    @property
    def kind_code(self) -> int:
        return KINDS[self.kind]

    @property
    def class_code(self) -> int:
        return CORDON_CLASSES[self.cordon_class]

    @property
    def declares_share(self) -> bool:
        """Whether `peak_cpus` was declared (else the budget derives the share from `slots`)."""
        return self.peak_cpus is not None

    @property
    def keyed(self) -> bool:
        return self.kind == "pinned"


@record
class RoleSet:
    """The fleet's roles in a fixed order; a role's index is its code in the slot word."""

    roles: tuple[Role, ...]
    _index: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if not self.roles:
            raise ConfigError("roles", "at least one role must be declared")
        if len(self.roles) > MAX_ROLES:
            raise ConfigError("roles", f"at most {MAX_ROLES} roles, got {len(self.roles)}")
        index = {}
        for i, role in enumerate(self.roles):
            if role.name in index:
                raise ConfigError(f"roles.{role.name}", "declared twice")
            index[role.name] = i
        total = sum(r.slots for r in self.roles)
        if not ranges.TOTAL_SLOTS.holds(total):
            raise ConfigError("roles", f"the roles' slots add up to {total}; in all they must be "
                              f"{ranges.TOTAL_SLOTS} (the slot table's size)")
        object.__setattr__(self, "_index", index)

    def __iter__(self):
        return iter(self.roles)

    def __len__(self):
        return len(self.roles)

    def __getitem__(self, name: str) -> Role:
        return self.roles[self.code(name)]

    def __contains__(self, name) -> bool:
        return name in self._index

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.roles)

    def code(self, name: str) -> int:
        """The role's index; raises UnknownRoleError naming the declared roles."""
        try:
            return self._index[name]
        except (KeyError, TypeError):
            raise UnknownRoleError(name, self.names) from None

    def by_code(self, code: int) -> Role:
        if not 0 <= code < len(self.roles):
            raise UnknownRoleError(code, self.names)
        return self.roles[code]

    def class_codes(self) -> list[int]:
        return [r.class_code for r in self.roles]


def _ref(name, kind, cordon_class, *, peak, slots, io_bound=False):
    return Role(
        name=name,
        kind=kind,
        cordon_class=cordon_class,
        handler=None,
        peak_cpus=peak,
        slots=slots,
        io_bound=io_bound,
    )


#: The reference profile (worker-fleet design, §3.1 and §5 at Q=8): four active
#: roles and four declared background ones with their cordon classes. The solver
#: declares no peak: its share is the rule's, S = what the quota leaves (3 at Q = 8),
#: not a declaration the quota must hold on every tier.
REFERENCE_ROLES = RoleSet(
    (
        _ref("solver", "pinned", CordonClass.NEVER, peak=None, slots=6),
        _ref("simdriver", "pooled", CordonClass.FLOOR, peak=0, slots=4, io_bound=True),
        _ref("resolve", "pooled", CordonClass.NEVER, peak=1, slots=1),
        _ref("merge", "singleton", CordonClass.NEVER, peak=1, slots=1),
        _ref("poolstateupdater", "pooled", CordonClass.DEFERRABLE, peak=0, slots=1),
        _ref("registrar", "pooled", CordonClass.DEFERRABLE, peak=0, slots=1),
        _ref("verifier", "pooled", CordonClass.DEFERRABLE, peak=0, slots=1),
        _ref("submitter", "pooled", CordonClass.NEVER, peak=0, slots=1),
    )
)
