"""Typed config: TOML or dict, FLEET_* environment overrides, unknown keys named by dotted path."""
import os

import pytest

from fleet.runtime.config import FleetConfig, Limits, MetricsConfig, RestartIntensity, load_config
from fleet.rules.errors import ConfigError
from fleet.rules.posture import DEFAULT_POLICY
from fleet.rules.roles import REFERENCE_ROLES

TOML = """
[fleet]
name = "pricing"
profile = "serial"
cpus = 4.5

[budget]
ambient_io = 1
solver = 2

[posture]
cordon_duty_percent = 3.5
cordon_sim_intake_floor = 2

[roles.solver]
kind = "pinned"
handler = "pkg.work:solve"
slots = 6
peak_cpus = 2

[roles.sim]
kind = "pooled"
cordon_class = "floor"
io_bound = true
peak_cpus = 0
slots = 4

[limits]
max_payload_bytes = 65536

[restart]
max_restarts = 3
within_seconds = 10
"""


def test_defaults():
    c = load_config(env={})
    assert c == FleetConfig()
    assert (c.name, c.profile, c.cpus) == ("fleet", "auto", None)
    assert c.roles is REFERENCE_ROLES and c.posture == DEFAULT_POLICY
    assert c.limits == Limits(None) and c.restart == RestartIntensity(5, 60.0)


def test_toml_file(tmp_path):
    path = tmp_path / "pricing.toml"
    path.write_text(TOML)
    c = load_config(path, env={})
    assert (c.name, c.profile, c.cpus, c.source) == ("pricing", "serial", 4.5, str(path))
    assert (c.budget.ambient_io, dict(c.budget.roles)) == (1, {"solver": 2})
    assert c.posture.cordon_duty_percent == 3.5 and c.posture.cordon_sim_intake_floor == 2
    assert c.roles.names == ("solver", "sim") and c.roles["sim"].io_bound
    assert c.limits.max_payload_bytes == 65536 and c.restart == RestartIntensity(3, 10)


def test_dict_source_is_not_mutated():
    source = {"posture": {"cordon_enter_events": 3}}
    load_config(source, env={"FLEET_POSTURE__CORDON_ENTER_EVENTS": "4"})
    assert source == {"posture": {"cordon_enter_events": 3}}


def test_env_overrides_win_and_are_listed():
    env = {
        "FLEET_PROFILE": "pinned",
        "FLEET_CPUS": "8",
        "FLEET_POSTURE__CORDON_DUTY_PERCENT": "5",
        "FLEET_POSTURE__CORDON_SIM_INTAKE_FLOOR": "null",
        "FLEET_BUDGET__AMBIENT_IO": "3",
        "FLEET_LIMITS__MAX_PAYLOAD_BYTES": "2048",
    }
    c = load_config({"posture": {"cordon_duty_percent": 1, "cordon_sim_intake_floor": 2}}, env=env)
    assert (c.profile, c.cpus, c.posture.cordon_duty_percent) == ("pinned", 8, 5)
    assert c.posture.cordon_sim_intake_floor is None and c.budget.ambient_io == 3
    assert c.limits.max_payload_bytes == 2048
    assert c.env_overrides == (
        "budget.ambient_io",
        "fleet.cpus",
        "fleet.profile",
        "limits.max_payload_bytes",
        "posture.cordon_duty_percent",
        "posture.cordon_sim_intake_floor",
    )


def test_env_role_override_applies_to_the_reference_profile():
    c = load_config(env={"FLEET_ROLES__SOLVER__SLOTS": "4", "FLEET_ROLES__SIMDRIVER__IO_BOUND": "false"})
    assert c.roles["solver"].slots == 4 and not c.roles["simdriver"].io_bound
    assert c.roles.names == REFERENCE_ROLES.names


def test_gc_freeze_is_on_by_default_and_set_by_file_or_env():
    assert load_config({}, env={}).gc_freeze is True
    assert load_config({"fleet": {"gc_freeze": False}}, env={}).gc_freeze is False
    cfg = load_config({}, env={"FLEET_FLEET__GC_FREEZE": "false"})
    assert cfg.gc_freeze is False and "fleet.gc_freeze" in cfg.env_overrides


def test_dispatch_priority_is_ten_levels_by_default_and_set_by_file_or_env():
    assert load_config({}, env={}).dispatch_priority == 10
    assert load_config({"fleet": {"dispatch_priority": 0}}, env={}).dispatch_priority == 0
    cfg = load_config({}, env={"FLEET_FLEET__DISPATCH_PRIORITY": "39"})
    assert cfg.dispatch_priority == 39 and "fleet.dispatch_priority" in cfg.env_overrides


def test_elastic_repin_is_off_unless_a_pinned_role_opts_in():
    c = load_config({"roles": {"solver": {"kind": "pinned", "elastic_repin": True}, "sim": {}}}, env={})
    assert c.roles["solver"].elastic_repin and not c.roles["sim"].elastic_repin
    assert not any(r.elastic_repin for r in load_config(env={}).roles)
    c = load_config(env={"FLEET_ROLES__SOLVER__ELASTIC_REPIN": "true"})
    assert c.roles["solver"].elastic_repin


def test_elastic_repin_on_a_role_without_pins_says_why():
    with pytest.raises(ConfigError, match="re-keys pins of a pinned .keyed. role; 'sim' is pooled"):
        load_config({"roles": {"sim": {"elastic_repin": True}}}, env={})


def test_unrelated_fleet_variables_are_left_alone():
    assert load_config(env={"FLEET_REQUIRE_PG": "1", "FLEETING": "x"}) == FleetConfig()


@pytest.mark.parametrize(
    "source, path",
    [
        ({"posture": {"cordon_duty_pct": 1}}, "posture.cordon_duty_pct"),
        ({"fleet": {"nmae": "x"}}, "fleet.nmae"),
        ({"limits": {"max_payload": 1}}, "limits.max_payload"),
        ({"restart": {"intensity": 1}}, "restart.intensity"),
        ({"roles": {"solver": {"kind": "pinned", "pins": 6}}}, "roles.solver.pins"),
        ({"budget": {"solvr": 2}}, "budget.solvr"),
        ({"scheduler": {}}, "scheduler"),
    ],
)
def test_unknown_keys_are_named_by_dotted_path(source, path):
    with pytest.raises(ConfigError) as info:
        load_config(source, env={})
    assert info.value.path == path and str(info.value).startswith(path + ":")


@pytest.mark.parametrize(
    "source, path",
    [
        ({"fleet": {"profile": "turbo"}}, "fleet.profile"),
        ({"fleet": {"cpus": 0}}, "fleet.cpus"),
        ({"fleet": {"gc_freeze": "yes"}}, "fleet.gc_freeze"),
        ({"fleet": {"gc_freeze": 1}}, "fleet.gc_freeze"),
        ({"fleet": {"dispatch_priority": -1}}, "fleet.dispatch_priority"),
        ({"fleet": {"dispatch_priority": 40}}, "fleet.dispatch_priority"),
        ({"fleet": {"dispatch_priority": 2.5}}, "fleet.dispatch_priority"),
        ({"fleet": {"dispatch_priority": True}}, "fleet.dispatch_priority"),
        ({"fleet": {"name": "has space"}}, "fleet.name"),
        ({"posture": {"cordon_duty_percent": 0}}, "posture.cordon_duty_percent"),
        ({"posture": {"cordon_exit_clean_ms": 0}}, "posture.cordon_exit_clean_ms"),
        ({"posture": "loud"}, "posture"),
        ({"roles": {"solver": {"kind": "keyed"}}}, "roles.solver.kind"),
        ({"roles": {"solver": {"kind": "pinned", "elastic_repin": "yes"}}}, "roles.solver.elastic_repin"),
        ({"roles": {"sim": {"kind": "pooled", "elastic_repin": True}}}, "roles.sim.elastic_repin"),
        ({"roles": {"merge": {"kind": "singleton", "elastic_repin": True}}}, "roles.merge.elastic_repin"),
        ({"limits": {"max_payload_bytes": 0}}, "limits.max_payload_bytes"),
        ({"restart": {"max_restarts": -1}}, "restart.max_restarts"),
        ({"restart": {"within_seconds": 0}}, "restart.within_seconds"),
        ({"budget": {"reserve": -1}}, "budget.reserve"),
    ],
)
def test_bad_values_are_named(source, path):
    with pytest.raises(ConfigError) as info:
        load_config(source, env={})
    assert info.value.path == path


def test_bad_env_value_names_the_variable():
    with pytest.raises(ConfigError) as info:
        load_config(env={"FLEET_POSTURE__CORDON_ENTER_EVENTS": "0"})
    assert info.value.path == "posture.cordon_enter_events"
    assert "FLEET_POSTURE__CORDON_ENTER_EVENTS" in str(info.value)


def test_unparsable_env_value():
    with pytest.raises(ConfigError, match="FLEET_BUDGET__RESERVE='two' is not a valid int"):
        load_config(env={"FLEET_BUDGET__RESERVE": "two"})


def test_env_with_an_unknown_section_is_an_error():
    with pytest.raises(ConfigError) as info:
        load_config(env={"FLEET_POSTRE__CORDON_ENTER_EVENTS": "3"})
    assert info.value.path == "FLEET_POSTRE__CORDON_ENTER_EVENTS"


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[fleet\nname=")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(bad, env={})


# Bytes that are not UTF-8 (a gzip header, a stray Latin-1 byte), and NUL bytes in valid UTF-8.
@pytest.mark.parametrize("content, match", [
    (b"\x1f\x8b\x08\x00\xff\xfe binary", "byte 1 is not UTF-8"),
    (b'[fleet]\nname = "caf\xe9"\n', "byte 19 is not UTF-8"),
    (b"\x00\x00\x00\x00", "invalid TOML"),
])
def test_a_binary_file_is_a_config_error(tmp_path, content, match):
    path = tmp_path / "fleet.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=match) as info:
        load_config(path, env={})
    assert str(path) in str(info.value)


def test_a_directory_and_a_nul_in_the_path_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read .*it is a directory, not a regular file"):
        load_config(tmp_path, env={})
    with pytest.raises(ConfigError, match="cannot read .*null byte"):
        load_config(str(tmp_path / "a\0b.toml"), env={})


def test_a_file_the_reader_may_not_read_is_a_config_error(tmp_path):
    """As uid 65534 (root reads any file): a 0600 file of root's is refused by name."""
    path = tmp_path / "fleet.toml"
    path.write_text("[fleet]\nname = 'x'\n")
    path.chmod(0o600)
    os.chmod(tmp_path, 0o755)
    if os.geteuid() != 0:
        with pytest.raises(ConfigError, match="cannot read .*Permission denied"):
            load_config(path, env={})
        return
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports what load_config raised, then leaves without cleanup
        os.close(r)
        try:
            os.setresgid(65534, 65534, 65534)
            os.setgroups([])
            os.setresuid(65534, 65534, 65534)
            load_config(path, env={})
            report = "loaded"
        except ConfigError as exc:
            report = f"ConfigError: {exc}"
        except BaseException as exc:  # noqa: BLE001 - any other escape is the failure we look for
            report = f"{type(exc).__name__}: {exc}"
        os.write(w, report.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        report = f.read().decode()
    os.waitpid(pid, 0)
    assert report.startswith("ConfigError: cannot read") and "Permission denied" in report, report


# --- [metrics] ------------------------------------------------------------------------


def test_metrics_default_is_off_and_local():
    assert load_config(env={}).metrics == MetricsConfig(enabled=False, host="127.0.0.1", port=9464)


def test_metrics_section_from_toml(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('[metrics]\nenabled = true\nhost = "0.0.0.0"\nport = 0\n')
    assert load_config(path, env={}).metrics == MetricsConfig(True, "0.0.0.0", 0)


def test_metrics_env_overrides_are_typed_and_listed():
    env = {"FLEET_METRICS__ENABLED": "true", "FLEET_METRICS__PORT": "9100", "FLEET_METRICS__HOST": "::1"}
    c = load_config(env=env)
    assert c.metrics == MetricsConfig(True, "::1", 9100)
    assert c.env_overrides == ("metrics.enabled", "metrics.host", "metrics.port")


@pytest.mark.parametrize(
    "metrics, path",
    [
        ({"enabled": "yes"}, "metrics.enabled"),
        ({"enabled": 1}, "metrics.enabled"),
        ({"port": 65536}, "metrics.port"),
        ({"port": -1}, "metrics.port"),
        ({"port": True}, "metrics.port"),
        ({"port": "9464"}, "metrics.port"),
        ({"host": ""}, "metrics.host"),
        ({"host": "local host"}, "metrics.host"),
        ({"host": 127}, "metrics.host"),
        ({"path": "/metrics"}, "metrics.path"),
    ],
)
def test_bad_metrics_values_are_named(metrics, path):
    with pytest.raises(ConfigError) as info:
        load_config({"metrics": metrics}, env={})
    assert info.value.path == path


def test_metrics_port_bounds_are_inclusive():
    assert load_config({"metrics": {"port": 65535}}, env={}).metrics.port == 65535
    assert load_config({"metrics": {"port": 0}}, env={}).metrics.port == 0


def test_bad_metrics_env_value_names_the_variable():
    with pytest.raises(ConfigError, match="FLEET_METRICS__PORT"):
        load_config(env={"FLEET_METRICS__PORT": "70000"})


def test_the_memory_section_defaults_reads_and_overrides():
    from fleet.runtime.config import MemoryConfig

    assert load_config(env={}).memory == MemoryConfig(True, 100, 2000)
    cfg = load_config({"memory": {"pressure_stall_ms": 300, "pressure_window_ms": 4000}},
                      env={"FLEET_MEMORY__PRESSURE_CORDON": "false"})
    assert cfg.memory == MemoryConfig(False, 300, 4000)


@pytest.mark.parametrize("section, path, text", [
    ({"pressure_stall_ms": 3000}, "memory.pressure_stall_ms",
     "memory.pressure_stall_ms: must be at most memory.pressure_window_ms (2000), got 3000"),
    ({"pressure_window_ms": 100}, "memory.pressure_window_ms",
     "memory.pressure_window_ms: must be an integer in [500, 10000] ms, got 100"),
    ({"pressure_cordon": "yes"}, "memory.pressure_cordon", "must be true or false, got 'yes'"),
    ({"pressure": 1}, "memory.pressure", "unknown key; known: pressure_cordon, pressure_stall_ms, pressure_window_ms"),
])
def test_a_bad_memory_key_is_named_with_what_was_wrong(section, path, text):
    with pytest.raises(ConfigError) as info:
        load_config({"memory": section}, env={})
    assert info.value.path == path and text in str(info.value), str(info.value)
