"""fleetctl's fleet name: --name before or after the command, $FLEET_NAME as the
default, an explicit name winning, disagreeing names refused, bad names exit 2."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from fleet.cli import fleetctl
from fleet.rules.errors import EXIT_NOT_RUNNING, EXIT_OK, EXIT_USAGE

FLEETCTL = shutil.which("fleetctl")
#: Every command that addresses a fleet, as argv after the command word's position.
FLEET_COMMANDS = (["status"], ["posture", "show"], ["posture", "set", "cordon_enter_events=3"],
                  ["posture", "release", "operator"], ["drain"], ["resume"])


@pytest.fixture
def no_env_name(monkeypatch):
    monkeypatch.delenv("FLEET_NAME", raising=False)


def run(capsys, *argv):
    rc = fleetctl.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv", [
    ["--name", "{n}", "status", "--json"],
    ["--name={n}", "status", "--json"],
    ["status", "--name", "{n}", "--json"],
    ["status", "--json", "--name", "{n}"],
    ["--name", "{n}", "status", "--name", "{n}", "--json"],  # the same name twice agrees
])
def test_name_before_or_after_the_command(table, fleet_name, capsys, no_env_name, argv):
    rc, out, err = run(capsys, *(a.format(n=fleet_name) for a in argv))
    assert rc == EXIT_OK, err
    assert json.loads(out)["fleet"] == fleet_name


@pytest.mark.parametrize("command", FLEET_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("placement", ["before", "after", "env"])
def test_every_fleet_command_addresses_the_named_fleet(fleet_name, capsys, monkeypatch, command, placement):
    # No daemon for this fleet: each command must say it looked for exactly this one.
    monkeypatch.delenv("FLEET_NAME", raising=False)
    if placement == "before":
        argv = ["--name", fleet_name, *command]
    elif placement == "after":
        argv = [*command, "--name", fleet_name]
    else:
        monkeypatch.setenv("FLEET_NAME", fleet_name)
        argv = list(command)
    rc, out, err = run(capsys, *argv)
    assert rc == EXIT_NOT_RUNNING and out == ""
    assert "NotRunning" in err and repr(fleet_name) in err


def test_fleet_name_from_the_environment(table, fleet_name, capsys, monkeypatch):
    monkeypatch.setenv("FLEET_NAME", fleet_name)
    rc, out, err = run(capsys, "status", "--json")
    assert rc == EXIT_OK, err
    assert json.loads(out)["fleet"] == fleet_name


@pytest.mark.parametrize("before", [True, False])
def test_explicit_name_beats_the_environment(table, fleet_name, capsys, monkeypatch, before):
    monkeypatch.setenv("FLEET_NAME", "not-this-fleet")
    argv = ["--name", fleet_name, "status", "--json"] if before else ["status", "--name", fleet_name, "--json"]
    rc, out, err = run(capsys, *argv)
    assert rc == EXIT_OK, err
    assert json.loads(out)["fleet"] == fleet_name


def test_neither_name_nor_environment_keeps_the_default(capsys, no_env_name):
    rc, _, err = run(capsys, "status")
    # no fleet called "fleet" runs on a test host; the refusal names the default it looked for
    assert rc == EXIT_NOT_RUNNING and "'fleet'" in err


@pytest.mark.parametrize("command", FLEET_COMMANDS, ids=" ".join)
def test_disagreeing_names_are_refused_naming_both(capsys, no_env_name, command):
    rc, out, err = run(capsys, "--name", "alpha", *command, "--name", "beta")
    assert rc == EXIT_USAGE and out == ""
    assert "NameConflict" in err and "'alpha'" in err and "'beta'" in err


@pytest.mark.parametrize("argv", [["--name", "../etc", "status"], ["status", "--name", "a.b"],
                                  ["--name", "x" * 64, "drain"]])
def test_bad_explicit_name_exits_2(capsys, no_env_name, argv):
    rc, out, err = run(capsys, *argv)
    assert rc == EXIT_USAGE and out == ""
    assert "InvalidFleetName: --name:" in err and argv[argv.index("--name") + 1] in err


@pytest.mark.parametrize("command", [["status"], ["drain"], ["posture", "show"]], ids=" ".join)
def test_bad_name_in_the_environment_exits_2_naming_it(capsys, monkeypatch, command):
    monkeypatch.setenv("FLEET_NAME", "qa6.data")
    rc, out, err = run(capsys, *command)
    assert rc == EXIT_USAGE and out == ""
    assert "InvalidFleetName" in err and "$FLEET_NAME" in err and "qa6.data" in err


def test_bad_environment_name_does_not_matter_under_an_explicit_name(table, fleet_name, capsys, monkeypatch):
    monkeypatch.setenv("FLEET_NAME", "../etc")
    rc, out, err = run(capsys, "--name", fleet_name, "status", "--json")
    assert rc == EXIT_OK, err
    assert json.loads(out)["fleet"] == fleet_name


@pytest.mark.parametrize("command", [["leases"], ["store", "check"]], ids=" ".join)
def test_name_on_a_command_that_addresses_no_fleet_is_refused(capsys, no_env_name, command):
    rc, out, err = run(capsys, "--name", "demo", *command)
    assert rc == EXIT_USAGE and out == ""
    assert "NameNotApplicable" in err and "'demo'" in err


def test_help_states_the_precedence(capsys):
    with pytest.raises(SystemExit) as exit_:
        fleetctl.main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "--name NAME" in out and "$FLEET_NAME" in out and "before or after the command" in out


def test_command_word_skips_the_global_name():
    assert fleetctl._command_word(["--name", "status", "drain"]) == "drain"  # a fleet called "status"
    assert fleetctl._command_word(["--name=x", "status"]) == "status"
    assert fleetctl._command_word(["--name"]) is None


def test_installed_fleetctl_takes_name_before_the_command_and_from_the_environment(table, fleet_name):
    assert FLEETCTL, "the fleetctl entry point is not installed"
    env = {k: v for k, v in os.environ.items() if k != "FLEET_NAME"}
    before = subprocess.run([FLEETCTL, "--name", fleet_name, "status", "--json"], capture_output=True, text=True, env=env)
    assert before.returncode == EXIT_OK, before.stderr
    assert json.loads(before.stdout)["fleet"] == fleet_name
    from_env = subprocess.run([FLEETCTL, "status", "--json"], capture_output=True, text=True,
                              env={**env, "FLEET_NAME": fleet_name})
    assert from_env.returncode == EXIT_OK, from_env.stderr
    assert json.loads(from_env.stdout)["fleet"] == fleet_name
    clash = subprocess.run([FLEETCTL, "--name", fleet_name, "status", "--name", "other"], capture_output=True,
                           text=True, env=env)
    assert clash.returncode == EXIT_USAGE and "NameConflict" in clash.stderr and "'other'" in clash.stderr
