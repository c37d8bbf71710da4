"""The provider admission's declared policy: the catalog, tiers, alternatives, lanes, pins, timings.

Theory of operation. Nothing here is measured; everything is declared by the operator
and validated once, into immutable data the pure scheduler reads on every decision:

* **Catalog.** Each provider lists the models it serves; each (model, provider) node
  carries its own ``residency`` and ``retention`` marks (e.g. ``"eu"``, ``"zdr"``).
  A fallback never leaves a unit on a node whose marks are weaker than its own node's.
* **Tiers** are ordered lists of model-id tokens. A model belongs to the first tier
  with a token its id contains; the token is its *family* (``glm-5.3-review`` and
  ``glm-5.3-coding`` are both family ``glm-5.3``). A model in no tier has no tier
  defaults; a new model joins a tier only through its id or an explicit entry.
  Fallback is on by default: a section that declares no ``tiers`` gets `DEFAULT_TIERS`,
  so with nothing but a catalog declared a model of a default tier falls back to the
  other models of its tier that the catalog has. ``tiers = {}`` turns them off.
* **Default alternatives** of a route, in three groups (reference 000 §7): the same
  model on another provider; then the tier's other families (own provider first, then
  token order); then the same family's variants on the same provider (they share the
  refused key, so they are tried last). An explicit ``alternatives`` entry for a model
  replaces the tier defaults; it is grouped the same way.
* **Lanes** are names, with no share: a lane may exclude model-id fragments from its
  fallbacks (applied to defaults and explicit entries alike), require marks of every
  route, and be hard-pinned. Units with a pinned tag are hard-pinned in every lane.
* **Timings** (seconds): ``probe_every`` 10, ``closed_for`` 2100 (35 min),
  ``daily_limit_probe_every`` (its own setting; defaults to ``probe_every``),
  ``starved_after`` 900, ``aging_unit`` 86400, and the 429 backoff (``backoff_base``
  doubling per consecutive refusal, up to ``backoff_max``).
* **Severity weights** for aging inside a lane: red-main 32, B 16, H 8, M 4, L 2, none 1.
* **A refused round's limit.** A unit the provider refuses (429, 402, 403) waits and is
  admitted again; it fails ``Refused`` only once it has met ``max_refusals`` refusals
  (default 10), or at a refusal or while it waits once ``refusal_deadline`` seconds
  have passed since its submit (default none: it waits out the closure, as long as it
  takes). A lane may set either for its own units.

`Policy.from_dict` takes the ``[admission]`` section of the fleet config (see README,
"Declaring a provider catalog"). Bad input raises `PolicyError` naming the dotted path
and builds nothing. `PolicyHolder.reload` swaps in a new policy only when it loads;
otherwise the last good one stays and the error is kept to be shown.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Mapping

from admission.errors import ConfigError
from admission.records import field, record
from admission.route import Route

SECTION = "admission"
DEFAULT_SEVERITY = {"red-main": 32, "B": 16, "H": 8, "M": 4, "L": 2, "none": 1}
MARKS = ("residency", "retention")
DEFAULT_MAX_REFUSALS = 10
#: The tiers a section that declares none gets (reference 000 §7: fallback is on by
#: default). Tokens name model families as their ids carry them; a model whose id
#: carries none (a dispatch-only model such as ``kimi-k2.7-code``) is in no tier and is
#: never a stand-in, nor stood in for, unless an explicit ``alternatives`` entry says so.
DEFAULT_TIERS = {
    "frontier": ("claude-opus", "claude-sonnet"),
    "standard": ("glm-5.3", "deepseek-v4", "gpt-6-sol"),
    "fast": ("claude-haiku", "gpt-6-mini"),
}
_CACHE_BOUND = 65_536  # (route, lane) pairs of alternatives kept per policy


class PolicyError(ConfigError):
    """The admission policy is invalid; `path` is the dotted path of the offending key."""


@record(slots=True)
class ModelNode:
    """One model as one provider serves it, with its own marks and its place in the tiers."""

    model: str
    provider: str
    residency: str | None = None
    retention: str | None = None
    tier: str | None = None
    family: str | None = None  # the tier token its id carries
    token_index: int = -1  # that token's position in its tier


@record(slots=True)
class LanePolicy:
    """What a lane declares: fallback exclusions, required marks, a hard pin."""

    name: str
    exclude: tuple[str, ...] = ()
    residency: str | None = None
    retention: str | None = None
    pinned: bool = False
    max_refusals: int | None = None  # None: the policy's
    refusal_deadline: float | None = None  # None: the policy's


@record(eq=False)
class Policy:
    """The validated, immutable admission policy. Build with `from_dict`."""

    nodes: Mapping[tuple[str, str], ModelNode] = field(default_factory=dict)
    tiers: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_TIERS))
    explicit: Mapping[str, tuple[tuple[str, str | None], ...]] = field(default_factory=dict)
    lanes: Mapping[str, LanePolicy] = field(default_factory=dict)
    pinned_tags: frozenset = frozenset()
    probe_every: float = 10.0
    closed_for: float = 35 * 60.0
    daily_limit_probe_every: float = 10.0
    starved_after: float = 15 * 60.0
    aging_unit: float = 86_400.0
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    max_refusals: int = DEFAULT_MAX_REFUSALS
    refusal_deadline: float | None = None
    severity: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_SEVERITY))
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    # --- reading -------------------------------------------------------------------
    @property
    def providers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p for _m, p in self.nodes))

    def node(self, model: str, provider: str) -> ModelNode | None:
        return self.nodes.get((model, provider))

    def lane(self, name: str | None) -> LanePolicy:
        lane = self.lanes.get(name)
        return lane if lane is not None else LanePolicy(name or "")

    def is_pinned(self, lane: str | None, tag: str | None = None, pinned: bool = False) -> bool:
        """A hard pin: the unit asked for it, its lane is pinned, or its tag is."""
        return pinned or self.lane(lane).pinned or (tag is not None and tag in self.pinned_tags)

    def weight(self, severity: str | None) -> int:
        """The severity's weight; PolicyError for a name the policy does not declare."""
        try:
            return self.severity["none" if severity is None else severity]
        except KeyError:
            raise PolicyError("severity", f"unknown severity {severity!r}; known: {', '.join(self.severity)}") from None

    def refusal_limit(self, lane: str | None) -> tuple[int, float | None]:
        """(refusals a unit of `lane` may meet, seconds after its submit it may keep trying or None)."""
        rules = self.lanes.get(lane) or LanePolicy("")
        return (self.max_refusals if rules.max_refusals is None else rules.max_refusals,
                self.refusal_deadline if rules.refusal_deadline is None else rules.refusal_deadline)

    def probe_interval(self, daily_limit: bool) -> float:
        """How often a closed pool lets one probe through: daily limits have their own setting."""
        return self.daily_limit_probe_every if daily_limit else self.probe_every

    def alternatives(self, route: Route, lane: str | None) -> tuple[tuple[Route, ...], ...]:
        """The route's fallbacks for `lane`, as groups in preference order (see module doc).

        Every candidate keeps the route's marks and the lane's required marks, and none
        carries a fragment the lane excludes. Cached: a policy never changes.
        """
        key = (route, lane)
        hit = self._cache.get(key)
        if hit is None:
            if len(self._cache) >= _CACHE_BOUND:
                self._cache.clear()  # lanes are free names: never let the cache grow without end
            hit = self._cache[key] = self._alternatives(route, self.lane(lane))
        return hit

    def breaks_lane(self, route: Route, lane: str | None) -> str | None:
        """Why `route` may not serve `lane` (a mark the lane requires and its node lacks), or None."""
        rules = self.lanes.get(lane)
        node = self.nodes.get((route.model, route.provider))
        if rules is None or node is None or _meets(rules, node):
            return None
        return (f"route {route} (residency {node.residency!r}, retention {node.retention!r}) does not carry "
                f"lane {lane!r}'s required marks (residency {rules.residency!r}, retention {rules.retention!r})")

    def _alternatives(self, route: Route, lane: LanePolicy) -> tuple[tuple[Route, ...], ...]:
        own = self.nodes.get((route.model, route.provider))
        if own is None:
            return ((), (), ())
        if route.model in self.explicit:
            candidates = []
            for model, provider in self.explicit[route.model]:
                providers = [provider] if provider is not None else [p for (m, p) in self.nodes if m == model]
                candidates += [self.nodes[(model, p)] for p in providers if (model, p) in self.nodes]
        else:
            candidates = self._defaults(own)
        same_elsewhere, others, variants = [], [], []
        seen = set()
        for node in candidates:
            if (node.model, node.provider) in seen or (node.model, node.provider) == (own.model, own.provider):
                continue
            seen.add((node.model, node.provider))
            if not (keeps_marks(own, node) and _meets(lane, node)) or _excluded(lane, node.model):
                continue
            # The key travels only within its provider: another provider's key is unknown.
            cred = route.credential if node.provider == route.provider else None
            alt = Route(node.model, node.provider, cred)
            if node.model == own.model:
                same_elsewhere.append(alt)
            elif node.provider == own.provider and own.family is not None and node.family == own.family:
                variants.append(alt)
            else:
                others.append(alt)
        return (tuple(same_elsewhere), tuple(others), tuple(variants))

    def _defaults(self, own: ModelNode) -> list[ModelNode]:
        # A model in no tier has no defaults at all, not even itself elsewhere (000 §7): it is
        # chosen by name, and only an explicit entry gives it a stand-in.
        if own.tier is None:
            return []
        out = [n for n in self.nodes.values() if n.model == own.model and n.provider != own.provider]
        tier = [n for n in self.nodes.values() if n.tier == own.tier and n.model != own.model]
        tier.sort(key=lambda n: (n.provider != own.provider, n.token_index, n.model, n.provider))
        return out + tier

    # --- building ------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, *, path: str = SECTION) -> "Policy":
        """Validate the ``[admission]`` section; PolicyError naming the dotted path if bad."""
        data = {} if data is None else data
        _mapping(data, path)
        known = {
            "probe_every", "closed_for", "daily_limit_probe_every", "starved_after", "aging_unit",
            "backoff_base", "backoff_max", "severity", "providers", "tiers", "alternatives", "lanes",
            "pinned_tags", "max_refusals", "refusal_deadline",
        }
        _no_unknown(data, known, path)
        timing = {}
        for key, default in (("probe_every", 10.0), ("closed_for", 2100.0), ("starved_after", 900.0),
                             ("aging_unit", 86_400.0), ("backoff_base", 1.0), ("backoff_max", 300.0)):
            timing[key] = _seconds(data.get(key, default), f"{path}.{key}")
        timing["daily_limit_probe_every"] = _seconds(
            data.get("daily_limit_probe_every", timing["probe_every"]), f"{path}.daily_limit_probe_every")
        if timing["backoff_max"] < timing["backoff_base"]:
            raise PolicyError(f"{path}.backoff_max", f"{timing['backoff_max']:g} is below backoff_base")

        timing["max_refusals"] = _count(data.get("max_refusals", DEFAULT_MAX_REFUSALS), f"{path}.max_refusals")
        if data.get("refusal_deadline") is not None:
            timing["refusal_deadline"] = _seconds(data["refusal_deadline"], f"{path}.refusal_deadline")

        severity = dict(DEFAULT_SEVERITY)
        sev = data.get("severity", {})
        _mapping(sev, f"{path}.severity")
        for name, weight in sev.items():
            if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
                raise PolicyError(f"{path}.severity.{name}", f"weight must be an integer >= 0, not {weight!r}")
            severity[str(name)] = weight

        tiers = _tiers(data.get("tiers", {t: list(tokens) for t, tokens in DEFAULT_TIERS.items()}), f"{path}.tiers")
        nodes = _catalog(data.get("providers", {}), f"{path}.providers", tiers)
        explicit = _explicit(data.get("alternatives", {}), f"{path}.alternatives", nodes)
        lanes = _lanes(data.get("lanes", {}), f"{path}.lanes")
        tags = data.get("pinned_tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
            raise PolicyError(f"{path}.pinned_tags", "must be a list of non-empty strings")
        return cls(nodes=nodes, tiers=tiers, explicit=explicit, lanes=lanes, pinned_tags=frozenset(tags),
                   severity=severity, **timing)


def keeps_marks(own: ModelNode, alt: ModelNode) -> bool:
    """An alternative keeps what the unit was promised: every mark its own node has, alt has too."""
    return (own.residency is None or alt.residency == own.residency) and (
        own.retention is None or alt.retention == own.retention)


def _meets(lane: LanePolicy, node: ModelNode) -> bool:
    return (lane.residency is None or node.residency == lane.residency) and (
        lane.retention is None or node.retention == lane.retention)


def _excluded(lane: LanePolicy, model: str) -> bool:
    low = model.lower()
    return any(fragment in low for fragment in lane.exclude)


# --- validation helpers -----------------------------------------------------------------
def _mapping(value, path):
    if not isinstance(value, Mapping):
        raise PolicyError(path, f"must be a table, not {type(value).__name__}")


def _no_unknown(data, known, path):
    for key in data:
        if key not in known:
            raise PolicyError(f"{path}.{key}", f"unknown key; known: {', '.join(sorted(known))}")


def _seconds(value, path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise PolicyError(path, f"must be a number of seconds > 0, not {value!r}")
    return float(value)


def _count(value, path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PolicyError(path, f"must be a whole number >= 1, not {value!r}")
    return value


def _name(value, path) -> str:
    if not isinstance(value, str) or not value.strip():
        raise PolicyError(path, f"must be a non-empty string, not {value!r}")
    return value


def _mark(value, path):
    if value is None:
        return None
    return _name(value, path)


def _tiers(data, path) -> dict[str, tuple[str, ...]]:
    _mapping(data, path)
    out, owner = {}, {}
    for tier, tokens in data.items():
        where = f"{path}.{tier}"
        if not isinstance(tokens, list) or not tokens:
            raise PolicyError(where, "must be a non-empty list of model-id tokens")
        for i, token in enumerate(tokens):
            _name(token, f"{where}[{i}]")
            if token in owner:
                raise PolicyError(f"{where}[{i}]", f"token {token!r} is already in tier {owner[token]!r}")
            owner[token] = tier
        out[str(tier)] = tuple(tokens)
    return out


def _tier_of(model: str, tiers) -> tuple[str | None, str | None, int]:
    for tier, tokens in tiers.items():
        # the longest token wins, so 'glm-5.3' does not swallow a declared 'glm-5.3-review'
        hits = [(len(t), i, t) for i, t in enumerate(tokens) if t in model]
        if hits:
            _n, i, token = max(hits)
            return tier, token, i
    return None, None, -1


def _catalog(data, path, tiers) -> dict[tuple[str, str], ModelNode]:
    _mapping(data, path)
    nodes = {}
    for provider, body in data.items():
        where = f"{path}.{provider}"
        _name(provider, where)
        if "/" in provider or "@" in provider:
            raise PolicyError(where, "a provider name may not contain '/' or '@'")
        _mapping(body, where)
        _no_unknown(body, {"models"}, where)
        models = body.get("models")
        if isinstance(models, list):
            models = {m: {} for m in models} if all(isinstance(m, str) for m in models) else None
        if not isinstance(models, Mapping) or not models:
            raise PolicyError(f"{where}.models", "must be a non-empty table (or list) of model ids")
        for model, marks in models.items():
            mwhere = f"{where}.models.{model}"
            _name(model, mwhere)
            if "@" in model:
                raise PolicyError(mwhere, "a model id may not contain '@'")
            _mapping(marks, mwhere)
            _no_unknown(marks, set(MARKS), mwhere)
            tier, family, index = _tier_of(model, tiers)
            nodes[(model, provider)] = ModelNode(
                model, provider, _mark(marks.get("residency"), f"{mwhere}.residency"),
                _mark(marks.get("retention"), f"{mwhere}.retention"), tier, family, index)
    return nodes


def _explicit(data, path, nodes) -> dict[str, tuple[tuple[str, str | None], ...]]:
    _mapping(data, path)
    models = {m for m, _p in nodes}
    out = {}
    for model, alts in data.items():
        where = f"{path}.{model}"
        if model not in models:
            raise PolicyError(where, f"model {model!r} is in no provider's catalog")
        if not isinstance(alts, list):
            raise PolicyError(where, "must be a list of 'model' or 'model@provider'")
        entries = []
        for i, text in enumerate(alts):
            _name(text, f"{where}[{i}]")
            alt, _, provider = text.rpartition("@") if "@" in text else (text, "", "")
            if provider and (alt, provider) not in nodes:
                raise PolicyError(f"{where}[{i}]", f"{text!r}: provider {provider!r} does not serve {alt!r}")
            if not provider and alt not in models:
                raise PolicyError(f"{where}[{i}]", f"model {alt!r} is in no provider's catalog")
            entries.append((alt, provider or None))
        out[model] = tuple(entries)
    return out


def _lanes(data, path) -> dict[str, LanePolicy]:
    _mapping(data, path)
    out = {}
    for lane, body in data.items():
        where = f"{path}.{lane}"
        _mapping(body, where)
        _no_unknown(body, {"exclude", "residency", "retention", "pinned", "max_refusals", "refusal_deadline"}, where)
        exclude = body.get("exclude", [])
        if not isinstance(exclude, list):
            raise PolicyError(f"{where}.exclude", "must be a list of model-id fragments")
        for i, frag in enumerate(exclude):
            _name(frag, f"{where}.exclude[{i}]")
        pinned = body.get("pinned", False)
        if not isinstance(pinned, bool):
            raise PolicyError(f"{where}.pinned", f"must be true or false, not {pinned!r}")
        out[str(lane)] = LanePolicy(
            str(lane), tuple(f.lower() for f in exclude), _mark(body.get("residency"), f"{where}.residency"),
            _mark(body.get("retention"), f"{where}.retention"), pinned,
            None if body.get("max_refusals") is None else _count(body["max_refusals"], f"{where}.max_refusals"),
            None if body.get("refusal_deadline") is None else _seconds(body["refusal_deadline"],
                                                                         f"{where}.refusal_deadline"))
    return out


class PolicyHolder:
    """The live policy: `reload` swaps in a new one only when it validates.

    A failed reload keeps the last good policy and remembers why (`last_error`), so
    an operator sees the fault and the admission never runs without a catalog.
    """

    def __init__(self, policy: Policy | None = None):
        self._policy = policy if policy is not None else Policy()
        self.last_error: str | None = None
        self.generation = 0
        self._lock = threading.Lock()

    @property
    def current(self) -> Policy:
        return self._policy

    def reload(self, data: Mapping[str, Any] | None) -> tuple[bool, str | None]:
        """Load `data` (an ``[admission]`` section); (True, None) or (False, why) — then nothing changed."""
        try:
            policy = Policy.from_dict(data)
        except (ConfigError, TypeError, ValueError) as exc:
            with self._lock:
                self.last_error = str(exc)
            return False, str(exc)
        with self._lock:
            self._policy, self.last_error = policy, None
            self.generation += 1
        return True, None
