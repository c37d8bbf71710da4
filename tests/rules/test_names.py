"""The fleet-name rule: one rule (fleet.rules.names), and every place that takes a name follows it."""
from __future__ import annotations

import pytest

from fleet.service import control
from fleet.shm import dataplane
from fleet.rules import names
from fleet.runtime.config import load_config
from fleet.rules.errors import EXIT_USAGE, ConfigError
from fleet.shm.table import BadFleetName
from fleet.shm.table import segment as seg

VALID = ["a", "9", "qa6", "Fleet_2-x", "a-", "A_", "x" * 63, "0" + "-" * 62]
INVALID = [
    "",
    "qa\n",  # re.match(...$) let this through: '$' also matches before a final newline
    "qa\r",
    "\nqa",
    "q\0",
    "a.b",
    "qa6.data",  # would name the table segment /fleet.qa6.data: fleet qa6's data segment
    ".",
    "..",
    "-x",
    "_x",
    "a/b",
    "../x",
    "a b",
    "é",
    "x" * 64,
    None,
    5,
    b"qa",
]


def _config_name(name):
    return load_config({"fleet": {"name": name}}, env={}).name


# Every consumer of a fleet name, each called the way its callers call it.
CONSUMERS = {
    "names": names.validate_fleet_name,
    "control": control.validate_fleet_name,
    "config": _config_name,
    "config env": lambda name: load_config(env={"FLEET_NAME": name}).name,
    "table segment": seg.segment_name,
    "data segment": dataplane.data_segment_name,
    "control socket": lambda name: str(control.socket_path(name, {"RUNTIME_DIRECTORY": "/run/x"})),
}


@pytest.mark.parametrize("consumer", CONSUMERS)
@pytest.mark.parametrize("name", VALID)
def test_every_consumer_accepts_a_valid_name(consumer, name):
    assert name in CONSUMERS[consumer](name)


def _possible(consumer, name):
    # An environment variable holds only a NUL-free string.
    return consumer != "config env" or isinstance(name, str) and "\0" not in name


@pytest.mark.parametrize(
    "consumer, name",
    [(c, n) for c in CONSUMERS for n in INVALID if _possible(c, n)],
    ids=lambda v: repr(v) if not isinstance(v, str) or v not in CONSUMERS else v,
)
def test_every_consumer_refuses_an_invalid_name(consumer, name):
    with pytest.raises((names.InvalidFleetName, ConfigError)) as info:
        CONSUMERS[consumer](name)
    if consumer.startswith("config"):
        assert isinstance(info.value, ConfigError) and info.value.path == "fleet.name"
    else:
        assert isinstance(info.value, names.InvalidFleetName) and info.value.exit_code == EXIT_USAGE
    if isinstance(name, str):
        assert repr(name) in str(info.value)


def test_the_rule_is_one_object_wherever_it_is_imported():
    assert control.validate_fleet_name is names.validate_fleet_name
    assert control.InvalidFleetName is names.InvalidFleetName is BadFleetName


def test_length_limit_is_63():
    assert names.MAX_LENGTH == 63
    names.validate_fleet_name("a" * 63)
    with pytest.raises(names.InvalidFleetName, match="1-63"):
        names.validate_fleet_name("a" * 64)


def test_the_message_says_the_rule():
    with pytest.raises(names.InvalidFleetName) as info:
        names.validate_fleet_name("qa6.data")
    assert "no '.'" in str(info.value) and "'qa6.data'" in str(info.value)
    with pytest.raises(ConfigError, match=r"fleet\.name: fleet name 'a\.b' is not valid"):
        _config_name("a.b")
