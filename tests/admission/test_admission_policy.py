"""The declared admission policy: defaults, validation with dotted paths, alternatives, reload."""
import pytest

from admission import scheduler as S
from admission.errors import Refused
from admission.policy import DEFAULT_SEVERITY, Policy, PolicyError, PolicyHolder
from admission.pool import AdmissionPool, ManualClock, signal_for
from admission.route import Route

from ..admission_catalog import (
    CATALOG, DEEPSEEK_OR, DEEPSEEK_US, GLM_AZ, GLM_CODING_OR, GLM_OR, GLM_US, GPT_AZ, KIMI_OR, OPUS, SONNET, T_1447,
    catalog, policy,
)


def test_defaults_are_the_reference_figures():
    p = Policy.from_dict({})
    assert (p.probe_every, p.closed_for, p.starved_after, p.aging_unit) == (10.0, 35 * 60.0, 15 * 60.0, 86_400.0)
    assert p.daily_limit_probe_every == p.probe_every
    assert dict(p.severity) == {"red-main": 32, "B": 16, "H": 8, "M": 4, "L": 2, "none": 1} == DEFAULT_SEVERITY
    assert p.weight(None) == 1 and p.weight("L") == 2
    assert dict(Policy().tiers) == dict(p.tiers) != {}  # built by hand or from nothing: the default tiers


def test_daily_limit_probe_interval_is_its_own_setting():
    p = Policy.from_dict({"probe_every": 5, "daily_limit_probe_every": 3600})
    assert p.probe_interval(daily_limit=True) == 3600.0
    assert p.probe_interval(daily_limit=False) == 5.0


def test_catalog_marks_and_tiers():
    p = policy()
    node = p.node("glm-5.3-review", "openrouter-eu")
    assert (node.residency, node.retention, node.tier, node.family) == ("eu", "zdr", "standard", "glm-5.3")
    assert p.node("kimi-k2.7-code", "openrouter-eu").tier is None  # in no tier: never a stand-in
    assert set(p.providers) == {"openrouter-eu", "azure-eu", "openrouter-us", "anthropic"}


def test_default_alternatives_in_reference_order():
    same, others, variants = policy().alternatives(GLM_OR, None)
    assert same == (GLM_AZ,)  # same model elsewhere; the US node would weaken the marks
    assert others == (DEEPSEEK_OR, GPT_AZ)  # own provider before others
    assert variants == (GLM_CODING_OR,)  # same family, same provider: last
    assert KIMI_OR not in others + variants  # no tier, no default


def test_alternatives_never_weaken_marks_but_may_strengthen():
    same, others, _ = policy().alternatives(GLM_US, None)
    # a US node has only residency "us": an EU node does not keep it, and neither does anthropic (no marks)
    assert GLM_AZ not in same and GLM_OR not in same
    assert others == (DEEPSEEK_US,)
    # a model with no marks may go anywhere in its tier
    assert policy().alternatives(OPUS, None) == ((), (SONNET,), ())


def test_explicit_alternatives_replace_defaults_and_keep_the_grouping():
    p = policy(alternatives={"glm-5.3-review": ["kimi-k2.7-code", "glm-5.3-review@azure-eu"]})
    assert p.alternatives(GLM_OR, None) == ((GLM_AZ,), (KIMI_OR,), ())
    # the review lane excludes kimi even when an explicit entry names it
    assert p.alternatives(GLM_OR, "review") == ((GLM_AZ,), (), ())


def test_the_credential_travels_only_within_its_provider():
    same, others, variants = policy().alternatives(Route("glm-5.3-review", "openrouter-eu", "k1"), None)
    assert same == (GLM_AZ,)
    assert others[0] == Route("deepseek-v4-flash", "openrouter-eu", "k1")
    assert variants == (Route("glm-5.3-coding", "openrouter-eu", "k1"),)


def test_lane_requirement_filters_alternatives():
    p = policy()
    assert p.alternatives(OPUS, "eu-only") == ((), (), ())
    assert p.alternatives(OPUS, None) == ((), (SONNET,), ())


def test_pins_by_lane_tag_or_unit():
    p = policy()
    assert p.is_pinned("coordinator") and p.is_pinned("review", tag="fixer") and p.is_pinned("review", pinned=True)
    assert not p.is_pinned("review", tag="other")


@pytest.mark.parametrize("data, path", [
    ({"probe_every": 0}, "admission.probe_every"),
    ({"closed_for": "35m"}, "admission.closed_for"),
    ({"daily_limit_probe_every": -1}, "admission.daily_limit_probe_every"),
    ({"bogus": 1}, "admission.bogus"),
    ({"severity": {"B": -1}}, "admission.severity.B"),
    ({"providers": {"p": {"models": {"m": {"residency": 3}}}}}, "admission.providers.p.models.m.residency"),
    ({"providers": {"p": {"models": {"m": {"colour": "red"}}}}}, "admission.providers.p.models.m.colour"),
    ({"providers": {"p": {"models": {}}}}, "admission.providers.p.models"),
    ({"providers": {"p/q": {"models": ["m"]}}}, "admission.providers.p/q"),
    ({"tiers": {"t": []}}, "admission.tiers.t"),
    ({"tiers": {"t": ["a"], "u": ["a"]}}, "admission.tiers.u[0]"),
    ({"providers": {"p": {"models": ["m"]}}, "alternatives": {"m": ["x"]}}, "admission.alternatives.m[0]"),
    ({"providers": {"p": {"models": ["m"]}}, "alternatives": {"m": ["m@q"]}}, "admission.alternatives.m[0]"),
    ({"providers": {"p": {"models": ["m"]}}, "alternatives": {"x": []}}, "admission.alternatives.x"),
    ({"lanes": {"review": {"exclude": "kimi"}}}, "admission.lanes.review.exclude"),
    ({"lanes": {"review": {"pinned": "yes"}}}, "admission.lanes.review.pinned"),
    ({"pinned_tags": "fixer"}, "admission.pinned_tags"),
    ({"backoff_base": 10, "backoff_max": 5}, "admission.backoff_max"),
])
def test_bad_input_names_its_dotted_path(data, path):
    with pytest.raises(PolicyError) as err:
        Policy.from_dict(data)
    assert err.value.path == path
    assert str(err.value).startswith(path)


def test_unknown_severity_is_a_typed_error():
    with pytest.raises(PolicyError, match="unknown severity 'X'"):
        policy().weight("X")


def test_failed_reload_keeps_the_last_good_catalog_and_says_why():
    holder = PolicyHolder()
    assert holder.reload(catalog()) == (True, None)
    good = holder.current
    ok, why = holder.reload(catalog(probe_every=-3))
    assert not ok and "admission.probe_every" in why
    assert holder.current is good and holder.last_error == why
    # control: a good reload replaces it and clears the error
    assert holder.reload(catalog(probe_every=3)) == (True, None)
    assert holder.current.probe_every == 3.0 and holder.last_error is None


def test_the_documented_catalog_example_loads():
    import pathlib
    import tomllib

    text = (pathlib.Path(__file__).resolve().parent.parent.parent / "docs" / "admission.md").read_text()
    from fleet.runtime.config import load_config

    section = text.split("# Provider admission", 1)[1]
    block = section.split("```toml\n", 1)[1].split("```", 1)[0]
    admission = load_config(tomllib.loads(block), env={}).admission  # as fleet's config reads it
    assert admission.closure_file == "/var/lib/fleet/demo.closures.json"
    p = admission.policy
    assert p.lane("review").exclude == ("kimi",) and p.pinned_tags == {"fixer"}
    assert p.alternatives(Route("deepseek-v4-flash", "openrouter-eu"), None) == ((), (GLM_AZ,), ())


# --- fallback is on by default (000 §7) ------------------------------------------------------------
#: The default tiers as docs/admission.md states them, written out here.
DOCUMENTED_TIERS = {"frontier": ("claude-opus", "claude-sonnet"), "standard": ("glm-5.3", "deepseek-v4", "gpt-6-sol"),
                    "fast": ("claude-haiku", "gpt-6-mini")}


def _catalog_only(**extra):
    """The catalog and nothing else: no tiers, no alternatives, no lanes."""
    import copy

    return Policy.from_dict({"providers": copy.deepcopy(CATALOG["providers"]), **extra})


def _backed_off_pool(pol, route):
    pool = AdmissionPool(pol, clock=ManualClock(wall=T_1447, mono=1000.0))
    pool.admit(1, route)
    pool.report(1, signal_for(Refused(429, "slow down", retry_after=600)))
    return pool


def test_with_nothing_configured_a_model_of_a_default_tier_falls_back_within_it():
    p = _catalog_only()
    assert {t: tuple(tokens) for t, tokens in p.tiers.items()} == DOCUMENTED_TIERS
    assert (p.node("glm-5.3-review", "openrouter-eu").tier, p.node("claude-opus-5", "anthropic").tier) == (
        "standard", "frontier")
    # the reference order, from the catalog alone: the same model elsewhere, the tier's other
    # models the catalog has, then the same family's variants on the same provider
    assert p.alternatives(GLM_OR, None) == ((GLM_AZ,), (DEEPSEEK_OR, GPT_AZ), (GLM_CODING_OR,))
    assert p.alternatives(OPUS, None) == ((), (SONNET,), ())
    pool = _backed_off_pool(p, GLM_OR)
    moved = pool.admit(2, GLM_OR)
    assert moved.action == S.MOVE and moved.route == GLM_AZ  # fallback, with nothing configured


def test_a_model_in_no_tier_has_no_defaults_and_waits():
    p = _catalog_only()
    assert p.node("kimi-k2.7-code", "openrouter-eu").tier is None
    assert p.alternatives(KIMI_OR, None) == ((), (), ())
    assert KIMI_OR not in sum(p.alternatives(GLM_OR, None), ())  # nor is it anyone's stand-in
    pool = _backed_off_pool(p, KIMI_OR)
    assert pool.admit(2, KIMI_OR).action == S.WAIT


def test_a_model_joins_a_default_tier_by_a_token_in_its_id_or_an_explicit_entry():
    providers = {"openrouter-eu": {"models": {"glm-5.3-review": {}, "deepseek-v4-pro": {}, "kimi-k2.7-code": {}}}}
    p = Policy.from_dict({"providers": providers})
    newcomer, glm = Route("deepseek-v4-pro", "openrouter-eu"), Route("glm-5.3-review", "openrouter-eu")
    assert p.node("deepseek-v4-pro", "openrouter-eu").tier == "standard"  # its id carries "deepseek-v4"
    assert p.alternatives(glm, None) == ((), (newcomer,), ())
    explicit = Policy.from_dict({"providers": providers, "alternatives": {"kimi-k2.7-code": ["glm-5.3-review"]}})
    assert explicit.alternatives(Route("kimi-k2.7-code", "openrouter-eu"), None) == ((), (glm,), ())


def test_declared_tiers_replace_the_defaults_and_an_empty_table_turns_them_off():
    assert _catalog_only(tiers={"mine": ["glm-5.3"]}).alternatives(GLM_OR, None) == ((GLM_AZ,), (), (GLM_CODING_OR,))
    off = _catalog_only(tiers={})
    assert dict(off.tiers) == {} and off.alternatives(GLM_OR, None) == ((), (), ())
    assert _backed_off_pool(off, GLM_OR).admit(2, GLM_OR).action == S.WAIT
