"""The host-group store's quota rule, written out here from its statement for the tests to
judge the store by (the store decides with `admission.store.rules`; judging it with the same
module would pass whatever that module gets wrong).

The rule: an admitted lease counts once globally, once for its environment, once for its
provider and once for its runtime tier; no count may exceed its limit. Limits are given as
the tests set them, literally: ``{"global": 3, "environment": {"prod": 1}, "provider":
{"openai": 2}, "tier": {"vm": 1}}``, each part optional. The host tier admits one lease at
a time unless a policy says otherwise: `DEFAULT_LIMITS`.
"""
from __future__ import annotations

from collections import Counter

#: A store's limits under its default policy: one host-tier lease at a time, nothing else.
DEFAULT_LIMITS = {"tier": {"host": 1}}
LEVELS = ("environment", "provider", "tier")


def breaches(limits: dict, admitted) -> list[tuple[str, str, int, int]]:
    """(level, key, used, limit) for every limit the admitted requests (or records) exceed."""
    used: Counter = Counter()
    for item in admitted:
        request = getattr(item, "request", item)
        used["global", "*"] += 1
        for level in LEVELS:
            used[level, getattr(request, level)] += 1
    out = []
    for (level, key), n in sorted(used.items()):
        limit = limits.get("global") if level == "global" else limits.get(level, {}).get(key)
        if limit is not None and n > limit:
            out.append((level, key, n, limit))
    return out
