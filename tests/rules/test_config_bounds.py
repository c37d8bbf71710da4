"""The config's bounds: every number of the schema (fleet.rules.ranges.CONFIG) inside its stated
range or a ConfigError naming the key, the value and the range; a file that is not a
regular file, too large or nested too deep refused before it costs anything; and the
table of ranges in docs/configuration.md in step with the schema."""
from __future__ import annotations

import copy
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

from fleet.rules import ranges
from fleet.runtime.config import load_config
from fleet.rules.errors import ConfigError
from fleet.rules.posture import DEFAULT_POLICY, PostureOwner, PostureRetuneError
from fleet.rules.ranges import CONFIG, MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, Range
from tests.daemons import BOUND_S, REPO

BASE = {"roles": {"sq": {"kind": "pooled", "handler": "tests.handlers:square"}}}
#: Keys whose range is not their only rule: the values inside the range that the other rule allows.
INSIDE = {
    "store.renew_every": [1e-9, ranges.DAY_S - 1],  # below lease_ttl
    "admission.backoff_base": [1e-9, 300],  # at most backoff_max (300)
    "admission.backoff_max": [1.0, ranges.UNIT_WAIT_S],  # at least backoff_base (1)
    "saturation.clear_depth": [0, 7],  # below raise_depth (8)
    "memory.pressure_stall_ms": [1, 2000],  # at most pressure_window_ms (2000)
}


def concrete(path: str) -> str:
    """`path` with its ``*`` named: a role of BASE, or a tier the store knows."""
    return path.replace("*", "host" if path.startswith("store.tiers.") else "sq")


def config_with(path: str, value) -> dict:
    cfg = copy.deepcopy(BASE)
    if path.startswith("store."):
        cfg["store"] = {"url": "sqlite:///never-opened.db", "lease_ttl": ranges.DAY_S}
    node = cfg
    *parents, last = concrete(path).split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return cfg


def inside(path: str, r: Range) -> list:
    low = r.lo if not r.open_lo else (r.lo + 1 if r.integer else r.lo + 1e-9)
    return INSIDE.get(path, [low, r.hi])


def outside(r: Range) -> list:
    values = [r.hi + 1, 10**30, True, "1"]
    values.append(r.lo if r.open_lo else r.lo - 1)
    if r.integer:
        values.append(1.5)
    else:
        values += [math.nan, math.inf, -math.inf, r.hi * 1.000001]
    return values


CASES = [(path, r) for path, r in CONFIG.items()]


@pytest.mark.parametrize("path, r", CASES, ids=[p for p, _ in CASES])
def test_every_number_of_the_schema_is_taken_inside_its_range(path, r):
    for value in inside(path, r):
        load_config(config_with(path, value), env={})


@pytest.mark.parametrize("path, r", CASES, ids=[p for p, _ in CASES])
def test_every_number_of_the_schema_is_refused_outside_its_range_naming_key_value_and_range(path, r):
    for value in outside(r):
        with pytest.raises(ConfigError) as info:
            load_config(config_with(path, value), env={})
        assert info.value.path == concrete(path), (value, str(info.value))
        assert str(r) in str(info.value) and ranges.shown(value) in str(info.value), str(info.value)


@pytest.mark.parametrize("path, value", [
    ("roles.sq.slots", 100_000),  # exited 1 from the table's header check
    ("roles.sq.slots", 10**30),  # looped allocating slot specs, deaf to SIGTERM
    ("posture.cordon_enter_window_ms", 10**30),  # wrapped in the table's 64-bit word
    ("posture.cordon_duty_percent", 0.00001),  # 0 in the table's millionths
    ("roles.sq.queue_bound", 2**64),
])
def test_the_values_that_broke_a_fleet_are_config_errors(path, value):
    with pytest.raises(ConfigError, match=rf"^{re.escape(path)}: must be an? (integer|number) in "):
        load_config(config_with(path, value), env={})


def test_the_roles_slots_add_up_to_at_most_the_table(tmp_path):
    half = ranges.TOTAL_SLOTS.hi // 2
    roles = {name: {"kind": "pooled", "handler": "tests.handlers:square", "slots": half} for name in ("a", "b")}
    load_config({"roles": roles}, env={})
    roles["c"] = {"kind": "pooled", "handler": "tests.handlers:square", "slots": 1}
    with pytest.raises(ConfigError, match=rf"^roles: the roles' slots add up to {2 * half + 1}; .*\[1, 4096\]"):
        load_config({"roles": roles}, env={})


def test_an_environment_value_out_of_range_names_its_variable():
    with pytest.raises(ConfigError, match=r"roles\.sq\.slots: must be an integer in \[1, 4096\] slots, got 10{30} "
                                          r"\(set by FLEET_ROLES__SQ__SLOTS\)"):
        load_config(BASE, env={"FLEET_ROLES__SQ__SLOTS": str(10**30)})


def test_a_huge_integer_is_shown_by_its_size():
    with pytest.raises(ConfigError, match=r"got an integer of about 1001 digits$"):
        load_config(config_with("roles.*.slots", 10**1000), env={})


# ------------------------------------------------------------------ the file itself


def _deep_array(levels: int) -> str:
    head = '[fleet]\nname = "deep"\n[roles.sq]\nhandler = "tests.handlers:square"\n'
    return head + "x = " + "[" * levels + "]" * levels + "\n"


@pytest.mark.parametrize("levels", [MAX_CONFIG_DEPTH, 100, 500, 50_000])
def test_a_config_nested_too_deep_is_refused_by_its_depth(tmp_path, levels):
    path = tmp_path / "deep.toml"
    path.write_text(_deep_array(levels))
    with pytest.raises(ConfigError, match=f"nested more than {MAX_CONFIG_DEPTH} tables or arrays deep") as info:
        load_config(path, env={})
    assert str(path) in str(info.value)


def test_a_config_nested_to_the_limit_reads():
    # roles.sq.x: 3 levels of tables, then arrays up to the limit
    arrays = MAX_CONFIG_DEPTH - 3
    raw = {"fleet": {"name": "deep"}, "roles": {"sq": {"handler": "tests.handlers:square", "x": []}}}
    node = raw["roles"]["sq"]["x"]
    for _ in range(arrays - 1):
        node.append([])
        node = node[0]
    with pytest.raises(ConfigError, match=r"roles\.sq\.x: unknown key"):  # past the depth check, to the schema
        load_config(raw, env={})
    node.append([])
    with pytest.raises(ConfigError, match="nested more than"):
        load_config(raw, env={})


def test_a_dict_that_holds_itself_is_refused_by_its_depth():
    raw = {"fleet": {"name": "loop"}}
    raw["fleet"]["again"] = raw
    with pytest.raises(ConfigError, match="nested more than"):
        load_config(raw, env={})


def test_a_file_over_the_size_limit_is_refused_unparsed(tmp_path):
    path = tmp_path / "big.toml"
    path.write_bytes(b"# padding\n" * (MAX_CONFIG_BYTES // 10) + b"[fleet\n")  # invalid TOML past the limit
    with pytest.raises(ConfigError, match=f"larger than {MAX_CONFIG_BYTES} bytes"):
        load_config(path, env={})
    path.write_bytes(b"#" * (MAX_CONFIG_BYTES - 1) + b"\n")  # exactly the limit: read
    assert load_config(path, env={}).name == "fleet"


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "/dev/null", "directory", "socket"])
def test_only_a_regular_file_is_read(tmp_path, kind):
    """In a child bounded by a timeout: a FIFO opened for reading would wait for a writer
    forever, /dev/zero would be read forever."""
    if kind == "fifo":
        path = str(tmp_path / "fleet.toml")
        os.mkfifo(path)
    elif kind == "directory":
        path = str(tmp_path)
    elif kind == "socket":
        import socket

        path = str(tmp_path / "s")
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path)
        sock.close()
    else:
        path = kind
    code = ("import sys\nfrom fleet.runtime.config import load_config\nfrom fleet.rules.errors import ConfigError\n"
            "try:\n    load_config(sys.argv[1], env={})\nexcept ConfigError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=BOUND_S,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert out.returncode == 0, out.stderr
    names = {"fifo": "a FIFO", "/dev/zero": "a character device", "/dev/null": "a character device",
             "directory": "a directory", "socket": "a socket"}
    assert out.stdout.strip() == f"cannot read {path}: it is {names[kind]}, not a regular file"


def test_a_symlink_to_a_regular_file_reads(tmp_path):
    target = tmp_path / "real.toml"
    target.write_text('[fleet]\nname = "linked"\n')
    (tmp_path / "fleet.toml").symlink_to(target)
    assert load_config(tmp_path / "fleet.toml", env={}).name == "linked"


# ------------------------------------------------------------------ the docs


def test_the_configuration_doc_lists_every_range_of_the_schema():
    doc = (pathlib.Path(REPO) / "docs" / "configuration.md").read_text()
    for path, r in CONFIG.items():
        assert f"| `{path}` | {r} |" in doc, f"docs/configuration.md lacks the row of {path}: | `{path}` | {r} |"


# ------------------------------------------------------------------ a retune (the embedded API's path too)


@pytest.mark.parametrize("key, value", [("cordon_enter_window_ms", 10**30), ("cordon_duty_percent", math.inf),
                                        ("cordon_duty_percent", math.nan), ("cordon_exit_clean_ms", -1),
                                        ("cordon_sim_intake_floor", ranges.MAX_SLOTS + 1)])
def test_a_retune_out_of_range_names_key_value_and_range_and_changes_nothing(key, value):
    owner = PostureOwner(DEFAULT_POLICY)
    with pytest.raises(PostureRetuneError) as info:
        owner.retune({"cordon_enter_events": 7, key: value}, now_ms=0)
    within = ranges.posture_range(key)
    assert info.value.problems == {key: f"must be {within}, got {ranges.shown(value)}"}
    assert owner.policy == DEFAULT_POLICY  # not even the valid key
    assert str(within) in str(info.value) and key in str(info.value)


# ------------------------------------------------------------------ Fleet.submit's numbers


@pytest.mark.parametrize("field, value", [("priority", 2**31), ("priority", -(2**31) - 1), ("priority", 1.0),
                                          ("timeout", math.inf), ("timeout", math.nan), ("timeout", 0),
                                          ("timeout", ranges.UNIT_WAIT_S + 1)])
def test_a_submit_number_out_of_range_is_a_bad_unit_naming_its_range(field, value):
    from fleet.rules.roles import Role
    from fleet.runtime.submit import BadUnit, _check_unit

    spec = Role("sq", handler="tests.handlers:square")
    args = {"priority": 0, "timeout": None, field: value}
    within = ranges.PRIORITY if field == "priority" else ranges.UNIT_TIMEOUT_S
    with pytest.raises(BadUnit, match=re.escape(f"{field} must be {within}, got {ranges.shown(value)}")):
        _check_unit(spec, None, None, args["priority"], args["timeout"], None)
    inside = {"priority": 0, "timeout": None, field: within.hi}
    _check_unit(spec, None, None, inside["priority"], inside["timeout"], None)
