"""The [admission] section of the fleet config: parsed by admission.policy, typed errors by dotted path."""
import pytest

from admission.policy import Policy
from fleet.runtime.config import AdmissionConfig, load_config
from fleet.rules.errors import ConfigError
from admission.route import Route

from ..admission_catalog import CATALOG, catalog


def test_no_section_is_the_default_policy():
    cfg = load_config({}, env={})
    assert cfg.admission == AdmissionConfig()
    assert cfg.admission.policy is None


def test_the_catalog_loads_with_marks_tiers_alternatives_lanes_pins_and_timings(tmp_path):
    section = catalog(probe_every=5, closed_for=60, daily_limit_probe_every=600, starved_after=30,
                      aging_unit=3600, severity={"B": 20}, alternatives={"claude-opus-5": ["glm-5.3-review@azure-eu"]},
                      closure_file=str(tmp_path / "c.json"))
    cfg = load_config({"admission": section}, env={})
    pol = cfg.admission.policy
    assert isinstance(pol, Policy)
    assert cfg.admission.closure_file == str(tmp_path / "c.json")
    assert "closure_file" not in cfg.admission.section
    assert pol.node("glm-5.3-review", "openrouter-eu").residency == "eu"
    assert pol.node("glm-5.3-review", "openrouter-eu").tier == "standard"
    assert (pol.probe_every, pol.closed_for, pol.daily_limit_probe_every) == (5.0, 60.0, 600.0)
    assert (pol.starved_after, pol.aging_unit) == (30.0, 3600.0)
    assert pol.weight("B") == 20 and pol.weight("L") == 2
    assert pol.lane("review").exclude == ("kimi",)
    assert pol.is_pinned("coordinator") and pol.is_pinned(None, tag="fixer")
    groups = pol.alternatives(Route("claude-opus-5", "anthropic"), None)
    assert Route("glm-5.3-review", "azure-eu") in [r for g in groups for r in g]


def test_the_section_reads_from_toml(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text('[admission]\nprobe_every = 2.5\n[admission.providers.p]\nmodels = ["m1", "m2"]\n'
                    '[admission.lanes.eu]\nresidency = "eu"\n')
    pol = load_config(path, env={}).admission.policy
    assert pol.probe_every == 2.5 and pol.node("m1", "p") is not None and pol.lane("eu").residency == "eu"


@pytest.mark.parametrize("section, path", [
    ({"probe_evry": 1}, "admission.probe_evry"),
    ({"providers": {"p": {"modles": ["m"]}}}, "admission.providers.p.modles"),
    ({"providers": {"p": {"models": {"m": {"residence": "eu"}}}}}, "admission.providers.p.models.m.residence"),
    ({"lanes": {"review": {"exclude": ["x"], "pin": True}}}, "admission.lanes.review.pin"),
    ({"probe_every": 0}, "admission.probe_every"),
    ({"closed_for": "35m"}, "admission.closed_for"),
    ({"severity": {"B": -1}}, "admission.severity.B"),
    ({"alternatives": {"nope": ["m"]}}, "admission.alternatives.nope"),
    ({"closure_file": ""}, "admission.closure_file"),
])
def test_bad_admission_keys_are_named_by_dotted_path(section, path):
    with pytest.raises(ConfigError) as info:
        load_config({"admission": section}, env={})
    assert info.value.path == path


def test_env_overrides_an_admission_timing_and_is_typed():
    cfg = load_config({"admission": catalog()}, env={"FLEET_ADMISSION__PROBE_EVERY": "3"})
    assert cfg.admission.policy.probe_every == 3.0
    assert "admission.probe_every" in cfg.env_overrides
    with pytest.raises(ConfigError, match="FLEET_ADMISSION__CLOSED_FOR"):
        load_config({}, env={"FLEET_ADMISSION__CLOSED_FOR": "-1"})


def test_configs_compare_by_the_declared_section():
    a = load_config({"admission": catalog()}, env={})
    b = load_config({"admission": catalog()}, env={})
    c = load_config({"admission": catalog(probe_every=1)}, env={})
    assert a.admission == b.admission and a.admission != c.admission
    assert CATALOG["tiers"]  # the shared catalog was not mutated
