"""fleetd and a config file that cannot be loaded: a real fleetd process refuses to boot
with ConfigError (exit 78, one line, no traceback), and a running one refuses a SIGHUP
reload of such a file and keeps serving, unchanged."""
from __future__ import annotations

import json
import os
import signal
import socket

import pytest

from fleet.rules.errors import EXIT_CONFIG
from tests.daemons import BOUND_S, Fleetd, segments, served_fleetd, wait_until
from tests.fleets import role

#: A gzip header: what an operator gets by pointing --config at a compressed backup.
BINARY = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xff\xfe\x00binary\x80\x81"


def roles():
    return {"sq": role("square", slots=2)}


def _write_binary(d: Fleetd) -> None:
    tmp = d.config_path + ".new"
    with open(tmp, "wb") as f:
        f.write(BINARY)
    os.replace(tmp, d.config_path)


@pytest.mark.parametrize("kind", ["binary", "directory", "missing"])
def test_a_config_that_cannot_be_loaded_refuses_boot_with_exit_78(fleet_name, kind):
    d = Fleetd(fleet_name, roles())
    try:
        os.unlink(d.config_path)
        if kind == "binary":
            _write_binary(d)
        elif kind == "directory":
            os.mkdir(d.config_path)
        d.start(wait_ready=False)
        assert d.wait() == EXIT_CONFIG
        err = d.stderr()
        assert "Traceback" not in err, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("fleetd: ConfigError: ") and d.config_path in last, err
        expected = {"binary": "not a TOML text file", "directory": "it is a directory, not a regular file",
                    "missing": "No such file"}
        assert expected[kind] in last, last
        assert not segments(fleet_name) and not d.notify.with_key("READY")
    finally:
        d.cleanup()


def test_sighup_with_a_binary_config_is_refused_and_the_daemon_keeps_running(fleet_name):
    with Fleetd(fleet_name, roles(), posture={"cordon_enter_events": 4}) as d:
        with d.connect() as client:
            assert client.submit("sq", 3).result(BOUND_S) == 9
        workers = d.descendants()
        _write_binary(d)
        d.signal(signal.SIGHUP)
        d.wait_ready(count=2)  # READY=1 again once the reload was handled
        wait_until(lambda: "reload refused, nothing changed: ConfigError" in d.stderr(), "the refusal logged")
        assert "not a TOML text file" in d.stderr() and "Traceback" not in d.stderr()
        assert d.proc.poll() is None
        assert d.descendants() == workers  # no worker was killed or replaced
        assert d.ctl_json("posture", "show")["policy"]["cordon_enter_events"] == 4
        with d.connect() as client:  # and it still serves
            assert client.submit("sq", 5).result(BOUND_S) == 25
        d.signal(signal.SIGTERM)
        assert d.wait() == 0


# ------------------------------------------------------------------ unbounded inputs
# Each bad file also retunes the posture (cordon_enter_events 4 -> 9): a refused reload must
# not apply that either. Each was once a hang, a traceback or a stopped fleetd.
RETUNE = {"cordon_enter_events": 9}
DEEP = 500


def _deep_text(d: Fleetd) -> str:
    head = f'[fleet]\nname = "{d.name}"\n[posture]\ncordon_enter_events = 9\n'
    head += '[roles.sq]\nhandler = "tests.handlers:square"\n'
    return head + f'x = {"[" * DEEP}{"]" * DEEP}\n'


def _make_bad(d: Fleetd, kind: str) -> None:
    """Put the bad config of `kind` where fleetd reads its config."""
    if kind == "deep":
        d.write_config(roles(), text=_deep_text(d))
        return
    if kind in ("slots_1e30", "slots_100000"):
        d.write_config({"sq": role("square", slots=10**30 if kind == "slots_1e30" else 100_000)}, posture=RETUNE)
        return
    if kind == "budget_over_quota":  # valid on its face; no host here has 64 cores for it
        d.extra = {"budget": {"sq": 64}}
        d.write_config(roles(), posture=RETUNE)
        d.extra = {}
        return
    if os.path.lexists(d.config_path):
        os.unlink(d.config_path)
    if kind == "fifo":
        os.mkfifo(d.config_path)  # nobody ever writes it: an open for reading would wait forever
    elif kind == "dev_zero":
        os.symlink("/dev/zero", d.config_path)  # endless: a read without a limit never returns
    else:
        raise AssertionError(kind)


#: What the one line of each refusal says.
WHY = {
    "deep": "nested more than 16 tables or arrays deep",
    "dev_zero": "it is a character device, not a regular file",
    "fifo": "it is a FIFO, not a regular file",
    "slots_1e30": "roles.sq.slots: must be an integer in [1, 4096] slots, got 1" + "0" * 30,
    "slots_100000": "roles.sq.slots: must be an integer in [1, 4096] slots, got 100000",
    "budget_over_quota": "declared shares sum to",
}
BOOT_KINDS = ["deep", "dev_zero", "fifo", "slots_1e30", "slots_100000"]


@pytest.mark.parametrize("kind", BOOT_KINDS)
def test_an_unbounded_config_refuses_boot_with_exit_78_and_one_line(fleet_name, kind):
    d = Fleetd(fleet_name, roles())
    try:
        _make_bad(d, kind)
        d.start(wait_ready=False)
        assert d.wait() == EXIT_CONFIG  # bounded: a FIFO or /dev/zero would hang here
        lines = d.stderr().strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("fleetd: ConfigError: ") and WHY[kind] in lines[0], lines
        assert not segments(fleet_name) and not d.notify.with_key("READY")
    finally:
        d.cleanup()


def _refusals(d: Fleetd) -> list[str]:
    return [line for line in d.stderr().splitlines()
            if " WARNING fleet.service.daemon: " in line and "reload refused, nothing changed" in line]


def test_sighup_refuses_every_unbounded_config_and_the_daemon_keeps_its_own(fleet_name):
    with Fleetd(fleet_name, roles(), posture={"cordon_enter_events": 4}) as d:
        workers = d.descendants()
        for n, kind in enumerate(BOOT_KINDS + ["budget_over_quota"], start=1):
            _make_bad(d, kind)
            d.signal(signal.SIGHUP)
            d.wait_ready(count=n + 1)  # READY=1 again once the reload was handled
            wait_until(lambda: len(_refusals(d)) >= n, f"the refusal of {kind} logged")
            assert WHY[kind] in _refusals(d)[n - 1], (kind, _refusals(d)[n - 1])
            assert d.proc.poll() is None, d.stderr()
            assert d.ctl_json("posture", "show")["policy"]["cordon_enter_events"] == 4, kind
        assert "Traceback" not in d.stderr() and " ERROR " not in d.stderr()
        assert "BudgetOverQuota" in _refusals(d)[-1]  # refused as boot refuses it, not "applied nothing"
        assert d.descendants() == workers  # no worker was killed or replaced
        with d.connect() as client:
            assert client.submit("sq", 5).result(BOUND_S) == 25
        d.write_config(roles(), posture=RETUNE)  # a good file still reloads
        d.signal(signal.SIGHUP)
        wait_until(lambda: d.ctl_json("posture", "show")["policy"]["cordon_enter_events"] == 9, "the good reload")
        d.signal(signal.SIGTERM)
        assert d.wait() == 0


# ------------------------------------------------------------------ retune and op ranges, over the socket


@pytest.fixture(scope="module")
def served():
    """One fleetd for the refusals below: each changes nothing, so they can share it."""
    with served_fleetd("t", roles()) as d:
        yield d


def _raw_call(d: Fleetd, frame: bytes) -> dict:
    """One request frame as any client could write it (the library's client checks first)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(BOUND_S)
        sock.connect(d.socket_path)
        sock.sendall(frame + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = sock.recv(65536)
            assert chunk, "the daemon closed the connection without a reply"
            buf += chunk
    return json.loads(buf)


@pytest.mark.parametrize("key, text, shown, within", [
    ("cordon_enter_window_ms", "1" + "0" * 30, "1" + "0" * 30, "an integer in [1, 86400000] ms"),
    ("cordon_exit_clean_ms", "-1", "-1", "an integer in [1, 86400000] ms"),
    ("cordon_enter_events", str(2**64), str(2**64), "an integer in [1, 864000] throttled periods"),
    ("cordon_duty_percent", "1e400", "inf", "a number in [0.0001, 100] %"),  # JSON's 1e400 is inf
    ("cordon_duty_percent", "0.00001", "1e-05", "a number in [0.0001, 100] %"),
    ("cordon_sim_intake_floor", "5000", "5000", "an integer in [1, 4096] slots"),
])
def test_a_retune_out_of_range_is_refused_over_the_socket_and_changes_nothing(served, key, text, shown, within):
    d = served
    before = d.ctl_json("posture", "show")["policy"]
    valid = "cordon_exit_clean_ms=20000" if key == "cordon_enter_events" else "cordon_enter_events=7"
    frame = '{"id":1,"op":"posture_set","args":{"patch":{"%s":%s,"%s":%s}}}' % (*valid.split("="), key, text)
    reply = _raw_call(d, frame.encode())
    assert reply["ok"] is False and reply["error"]["type"] == "PostureRetuneError", reply
    assert reply["error"]["message"] == f"{key}: must be {within}, got {shown}", reply
    if text != "1e400":  # fleetctl sends what JSON can carry
        out = d.ctl("posture", "set", valid, f"{key}={text}")
        assert out.returncode == EXIT_CONFIG and f"{key}: must be {within}, got {shown}" in out.stderr, out.stderr
    assert d.ctl_json("posture", "show")["policy"] == before  # not even the valid key was applied


@pytest.mark.parametrize("op, args, needle", [
    ("submit", '"role":"sq","payload":3,"timeout":1e400', "timeout must be a number in (0, 2592000] s, got inf"),
    ("submit", '"role":"sq","payload":3,"timeout":-1.0', "timeout must be a number in (0, 2592000] s, got -1.0"),
    ("submit", '"role":"sq","payload":3,"priority":%d' % 2**40, "priority must be an integer in [-2147483648, "),
    ("submit", '"role":"sq","payload":3,"token":"abcdefgh","seq":-1', "seq must be an integer in [0, "),
    ("cancel", '"unit":%d' % 2**64, "unit must be an integer in [1, 9223372036854775807], got 18446744073709551616"),
])
def test_an_op_number_out_of_range_is_refused_over_the_socket(served, op, args, needle):
    d = served
    reply = _raw_call(d, ('{"id":1,"op":"%s","args":{%s}}' % (op, args)).encode())
    assert reply["ok"] is False and reply["error"]["type"] == "InvalidArgs", reply
    assert needle in reply["error"]["message"], reply
    ledger = _raw_call(d, b'{"id":2,"op":"ledger","args":{}}')["result"]
    assert ledger["submitted"] == 0, ledger  # nothing was admitted
