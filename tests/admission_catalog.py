"""A declared provider catalog shaped like reference 000's instance, for the admission tests."""
from __future__ import annotations

import calendar
import copy

from admission.policy import Policy
from admission.pool import AdmissionPool, ManualClock
from admission.route import Route

EU = {"residency": "eu", "retention": "zdr"}
US = {"residency": "us"}

CATALOG = {
    "providers": {
        # one key serves every model here: its daily limit closes all of them
        "openrouter-eu": {"models": {
            "glm-5.3-review": EU, "glm-5.3-coding": EU, "deepseek-v4-flash": EU, "kimi-k2.7-code": EU,
        }},
        "azure-eu": {"models": {"glm-5.3-review": EU, "gpt-6-sol": EU}},
        "openrouter-us": {"models": {"glm-5.3-review": US, "deepseek-v4-flash": US}},
        "anthropic": {"models": {"claude-opus-5": {}, "claude-sonnet-5": {}}},
    },
    "tiers": {
        "standard": ["glm-5.3", "deepseek-v4", "gpt-6-sol"],
        "frontier": ["claude-opus", "claude-sonnet"],
    },
    "lanes": {
        "review": {"exclude": ["kimi"]},
        "coordinator": {"pinned": True},
        "eu-only": {"residency": "eu"},
    },
    "pinned_tags": ["fixer"],
}

GLM_OR = Route("glm-5.3-review", "openrouter-eu")
GLM_AZ = Route("glm-5.3-review", "azure-eu")
GLM_US = Route("glm-5.3-review", "openrouter-us")
GLM_CODING_OR = Route("glm-5.3-coding", "openrouter-eu")
DEEPSEEK_OR = Route("deepseek-v4-flash", "openrouter-eu")
DEEPSEEK_US = Route("deepseek-v4-flash", "openrouter-us")
KIMI_OR = Route("kimi-k2.7-code", "openrouter-eu")
GPT_AZ = Route("gpt-6-sol", "azure-eu")
OPUS = Route("claude-opus-5", "anthropic")
SONNET = Route("claude-sonnet-5", "anthropic")

#: 2026-10-04 14:47:00 UTC, the reference's day
T_1447 = calendar.timegm((2026, 10, 4, 14, 47, 0))
MIDNIGHT_AFTER = calendar.timegm((2026, 10, 5, 0, 0, 0))


#: A unit fails Refused at its first refusal: for tests that read what one refusal does to its
#: pool (the refused unit's own wait and re-admission have their tests: test_provider_refused).
ONE_REFUSAL = {"max_refusals": 1}


def catalog(**overrides) -> dict:
    data = copy.deepcopy(CATALOG)
    data.update(overrides)
    return data


def policy(**overrides) -> Policy:
    return Policy.from_dict(catalog(**overrides))


def make_pool(pol: Policy | None = None, *, wall: float = T_1447, rng=None, store=None):
    clock = ManualClock(wall=wall, mono=1000.0)
    return AdmissionPool(pol or policy(), clock=clock, rng=rng, store=store), clock
