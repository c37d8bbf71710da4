"""fleetctl posture show|set, drain, resume: the real CLI against a real ControlServer on
a Unix socket, whose handler keeps the real posture rules (fleet.rules.posture.PostureOwner)."""
from __future__ import annotations

import json
import shutil
import socket
import tempfile

import pytest

from fleet.cli import fleetctl
from fleet.service.control import terminal
from fleet.service.control import ControlClient, ControlServer, encode_request, inline_dispatch
from fleet.rules.errors import EXIT_CONFIG, EXIT_NOT_RUNNING, EXIT_USAGE
from fleet.rules.posture import DEFAULT_POLICY, PostureOwner


class PostureDaemon:
    """A small handler: the posture owner a daemon would hold, plus a drain switch."""

    def __init__(self):
        self.now_ms = 50_000
        self.owner = PostureOwner(DEFAULT_POLICY, now_ms=0)
        self.draining = False
        self.calls = []

    def posture_show(self):
        self.calls.append("posture_show")
        return self.owner.show(self.now_ms)

    def posture_set(self, **patch):
        self.calls.append("posture_set")
        return self.owner.retune(patch, self.now_ms)

    def posture_release(self, cause):
        self.calls.append("posture_release")
        held = cause in self.owner.state.causes
        self.owner.release(cause, self.now_ms)
        return {**self.owner.show(self.now_ms), "released": held}

    def drain(self):
        self.calls.append("drain")
        self.draining = True
        return self.drain_state()

    def resume(self):
        self.calls.append("resume")
        self.draining = False
        return self.drain_state()

    def drain_state(self):
        since = 1_796_000_000.0 if self.draining else None
        return {"draining": self.draining, "since": since,
                "since_utc": "2026-11-28T23:33:20Z" if since else None, "owed": 0}


@pytest.fixture
def runtime_dir(monkeypatch):
    # A short path of our own: AF_UNIX paths stop at 108 bytes, pytest's tmp_path can be longer.
    path = tempfile.mkdtemp(prefix="fc-", dir="/tmp")
    monkeypatch.setenv("RUNTIME_DIRECTORY", path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon(runtime_dir, fleet_name):
    handler = PostureDaemon()
    server = ControlServer(f"{runtime_dir}/{fleet_name}.sock", inline_dispatch(handler))
    with server:
        yield handler


def cli(capsys, *argv):
    rc = fleetctl.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# --- posture show -------------------------------------------------------------------------


def test_show_json_is_the_daemons_view(daemon, fleet_name, capsys):
    rc, out, _ = cli(capsys, "posture", "show", "--name", fleet_name, "--json")
    assert rc == 0 and daemon.calls == ["posture_show"]
    doc = json.loads(out)
    assert doc["posture"] == "Nominal" and doc["policy"] == DEFAULT_POLICY.to_dict()


def test_show_human(daemon, fleet_name, capsys):
    daemon.owner.hold("lane-death", 1_000)
    rc, out, _ = cli(capsys, "posture", "show", "--name", fleet_name)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["posture", "Cordoned"] and "held by   lane-death" in lines
    assert "entered 1" in out and f"cordoned {daemon.now_ms - 1_000} ms" in out
    policy = dict(line.split() for line in lines[lines.index("policy") + 1 :])
    assert policy == {"cordon_enter_events": "2", "cordon_enter_window_ms": "1000", "cordon_duty_percent": "2.0",
                      "cordon_duty_window_ms": "5000", "cordon_exit_clean_ms": "10000", "cordon_sim_intake_floor": "null"}


# --- posture set ----------------------------------------------------------------------------


def test_set_applies_a_partial_patch_and_echoes_the_effective_policy(daemon, fleet_name, capsys):
    rc, out, _ = cli(capsys, "posture", "set", "--name", fleet_name, "cordon_duty_percent=3.5", "cordon_enter_events=4")
    assert rc == 0
    policy = daemon.owner.policy
    assert (policy.cordon_duty_percent, policy.cordon_enter_events) == (3.5, 4)
    assert policy.cordon_exit_clean_ms == DEFAULT_POLICY.cordon_exit_clean_ms  # absent keys keep their value
    echoed = {line.split()[0].lstrip("*"): line for line in out.splitlines() if line.startswith(" ")}
    assert echoed["cordon_duty_percent"].split() == ["*cordon_duty_percent", "3.5"]
    assert echoed["cordon_enter_events"].split() == ["*cordon_enter_events", "4"]
    assert echoed["cordon_exit_clean_ms"].split() == ["cordon_exit_clean_ms", "10000"]  # unchanged: unmarked


def test_set_json_echo_and_null_restores_the_floor(daemon, fleet_name, capsys):
    assert cli(capsys, "posture", "set", "--name", fleet_name, "cordon_sim_intake_floor=3")[0] == 0
    assert daemon.owner.policy.cordon_sim_intake_floor == 3
    rc, out, _ = cli(capsys, "posture", "set", "--name", fleet_name, "--json", "cordon_sim_intake_floor=null")
    assert rc == 0 and json.loads(out)["policy"]["cordon_sim_intake_floor"] is None
    assert daemon.owner.policy.cordon_sim_intake_floor is None


def test_set_keeps_the_live_posture(daemon, fleet_name, capsys):
    daemon.owner.hold("lane-death", 1_000)
    rc, out, _ = cli(capsys, "posture", "set", "--name", fleet_name, "--json", "cordon_exit_clean_ms=20000")
    doc = json.loads(out)
    assert rc == 0 and doc["posture"] == "Cordoned" and doc["policy"]["cordon_exit_clean_ms"] == 20000


@pytest.mark.parametrize(
    "assignment, key",
    [
        ("cordon_duty_percent=0", "cordon_duty_percent"),
        ("cordon_duty_percent=100.5", "cordon_duty_percent"),
        ("cordon_enter_events=0", "cordon_enter_events"),
        ("cordon_duty_window_ms=-5", "cordon_duty_window_ms"),
        ("cordon_exit_clean_ms=1.5", "cordon_exit_clean_ms"),
        ("cordon_sim_intake_floor=0", "cordon_sim_intake_floor"),
        ("cordon_enter_events=many", "cordon_enter_events"),
        ("cordon_duty_percent=nan", "cordon_duty_percent"),
    ],
)
def test_invalid_value_is_the_daemons_typed_error_and_changes_nothing(daemon, fleet_name, capsys, assignment, key):
    rc, out, err = cli(capsys, "posture", "set", "--name", fleet_name, "cordon_enter_window_ms=2000", assignment)
    assert rc == EXIT_CONFIG and out == ""
    assert err.count("\n") == 1 and "PostureRetuneError" in err and key in err
    assert daemon.calls == ["posture_set"]  # the daemon judged it
    assert daemon.owner.policy == DEFAULT_POLICY  # nothing applied, not even the valid key


def test_empty_patch_is_refused_with_the_ops_error(daemon, fleet_name, capsys):
    rc, out, err = cli(capsys, "posture", "set", "--name", fleet_name)
    assert rc == EXIT_USAGE and out == ""
    assert "InvalidArgs" in err and "patch is empty" in err
    assert daemon.owner.policy == DEFAULT_POLICY


def test_unknown_key_is_refused_with_the_ops_error(daemon, fleet_name, capsys):
    rc, out, err = cli(capsys, "posture", "set", "--name", fleet_name, "cordon_duty_pct=5")
    assert rc == EXIT_USAGE and out == ""
    assert "InvalidArgs" in err and "unknown posture key(s) cordon_duty_pct" in err
    assert daemon.owner.policy == DEFAULT_POLICY


@pytest.mark.parametrize("patch", [{}, {"cordon_duty_pct": 5}])
def test_the_daemon_sends_the_same_refusal_the_cli_prints(daemon, fleet_name, runtime_dir, capsys, patch):
    # The CLI's local check is the op's own check; the daemon, asked directly, says the same.
    argv = [f"{k}={v}" for k, v in patch.items()]
    _, _, err = cli(capsys, "posture", "set", "--name", fleet_name, *argv)
    with ControlClient(f"{runtime_dir}/{fleet_name}.sock") as c:
        reply = c.send_raw(encode_request("posture_set", {"patch": patch}, 1))
    assert not reply.ok and reply.error_type == "InvalidArgs"
    assert err.strip().endswith(f"{reply.error_type}: {reply.error_message}")
    assert daemon.calls == [] and daemon.owner.policy == DEFAULT_POLICY


@pytest.mark.parametrize("argv, why", [(["cordon_duty_percent"], "not KEY=VALUE"), (["=3"], "not KEY=VALUE"),
                                       (["cordon_enter_events=3", "cordon_enter_events=4"], "given twice")])
def test_malformed_assignments_are_usage_errors(daemon, fleet_name, capsys, argv, why):
    rc, _, err = cli(capsys, "posture", "set", "--name", fleet_name, *argv)
    assert rc == EXIT_USAGE and "PostureArgumentError" in err and why in err
    assert daemon.calls == []


@pytest.mark.parametrize(
    "text, value", [("3", 3), ("-2", -2), ("2.5", 2.5), ("1e3", 1000.0), ("null", None), ("None", None),
                    ("abc", "abc"), ("inf", "inf"), ("nan", "nan")]
)
def test_parse_value(text, value):
    assert terminal.parse_value(text) == value and type(terminal.parse_value(text)) is type(value)


# --- posture release --------------------------------------------------------------------------


def test_release_clears_a_held_cause_and_echoes_the_posture(daemon, fleet_name, capsys):
    daemon.owner.hold("lane-death", 1_000)
    rc, out, _ = cli(capsys, "posture", "release", "--name", fleet_name, "lane-death")
    assert rc == 0 and daemon.calls == ["posture_release"]
    assert daemon.owner.state.causes == frozenset()
    lines = out.splitlines()
    assert lines[0] == "lane-death: released"
    assert lines[1].split() == ["posture", "Cordoned"]  # until its exit window is clean
    assert not any(line.startswith("held by") for line in lines)


def test_release_json_and_a_cause_not_held_changes_nothing(daemon, fleet_name, capsys):
    daemon.owner.hold("lane-death", 1_000)
    rc, out, _ = cli(capsys, "posture", "release", "--name", fleet_name, "--json", "operator")
    doc = json.loads(out)
    assert rc == 0 and doc["released"] is False and doc["causes"] == ["lane-death"]
    assert daemon.owner.state.causes == frozenset({"lane-death"})
    rc, out, _ = cli(capsys, "posture", "release", "--name", fleet_name, "operator")
    assert rc == 0 and out.splitlines()[0] == "operator: was not held; nothing changed"


@pytest.mark.parametrize("cause", ["lane_death", "throttle-events", ""])
def test_release_of_an_unknown_cause_is_a_usage_error_sent_nowhere(daemon, fleet_name, capsys, cause):
    with pytest.raises(SystemExit) as exit_:
        fleetctl.main(["posture", "release", "--name", fleet_name, cause])
    assert exit_.value.code == EXIT_USAGE and "choose from 'lane-death', 'operator'" in capsys.readouterr().err
    assert daemon.calls == []


@pytest.mark.parametrize("args, why", [({"cause": "bogus"}, "unknown posture cause 'bogus'"),
                                       ({}, "missing required argument cause"),
                                       ({"cause": 3}, "argument cause must be string")])
def test_the_daemon_refuses_a_bad_release_and_changes_nothing(daemon, fleet_name, runtime_dir, args, why):
    daemon.owner.hold("lane-death", 1_000)
    with ControlClient(f"{runtime_dir}/{fleet_name}.sock") as c:
        reply = c.send_raw(encode_request("posture_release", args, 1))
    assert not reply.ok and reply.error_type == "InvalidArgs" and why in reply.error_message
    assert daemon.calls == [] and daemon.owner.state.causes == frozenset({"lane-death"})


# --- drain / resume --------------------------------------------------------------------------


def test_drain_then_resume(daemon, fleet_name, capsys):
    rc, out, _ = cli(capsys, "drain", "--name", fleet_name)
    assert rc == 0 and daemon.draining and out.startswith("draining since 2026-11-28T23:33:20Z")
    rc, out, _ = cli(capsys, "drain", "--name", fleet_name, "--json")
    assert rc == 0 and json.loads(out) == daemon.drain_state()
    rc, out, _ = cli(capsys, "resume", "--name", fleet_name, "--json")
    assert rc == 0 and not daemon.draining and json.loads(out)["draining"] is False
    assert daemon.calls == ["drain", "drain", "resume"]


# --- not running --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv", [["posture", "show"], ["posture", "set", "cordon_enter_events=3"], ["drain"], ["resume"], ["status"]]
)
def test_not_running_exits_69_with_one_clear_line(runtime_dir, fleet_name, capsys, argv):
    rc, out, err = cli(capsys, *argv[:2], "--name", fleet_name, *argv[2:]) if argv[0] == "posture" else cli(
        capsys, *argv, "--name", fleet_name
    )
    assert rc == EXIT_NOT_RUNNING and out == ""
    assert err.count("\n") == 1 and "NotRunning" in err and "not running" in err and fleet_name in err


def test_a_dead_daemons_socket_is_not_running(runtime_dir, fleet_name, capsys):
    # What a daemon killed with -9 leaves: the socket file, and nobody listening on it.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as left_behind:
        left_behind.bind(f"{runtime_dir}/{fleet_name}.sock")
    rc, out, err = cli(capsys, "posture", "show", "--name", fleet_name)
    assert rc == EXIT_NOT_RUNNING and out == "" and "NotRunning" in err


@pytest.mark.parametrize("argv", [["posture", "show"], ["posture", "set"], ["drain"], ["resume"], ["status"]])
def test_every_command_has_help_and_name(argv, capsys):
    with pytest.raises(SystemExit) as info:
        fleetctl.main([*argv, "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "--name NAME" in out and "FLEET_NAME" in out
