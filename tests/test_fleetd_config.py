"""fleetd and a config file that cannot be loaded: a real fleetd process refuses to boot
with ConfigError (exit 78, one line, no traceback), and a running one refuses a SIGHUP
reload of such a file and keeps serving, unchanged."""
from __future__ import annotations

import os
import signal

import pytest

from fleet.errors import EXIT_CONFIG
from tests.daemons import BOUND_S, Fleetd, segments, wait_until
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
        expected = {"binary": "not a TOML text file", "directory": "it is a directory, not a regular file", "missing": "No such file"}
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
