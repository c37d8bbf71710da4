"""The shipped systemd units: `systemd-analyze verify` accepts them, and they say what fleetd needs.

`fleetd --print-unit` writes them with this install's fleetd in ExecStart.

`systemd-analyze verify` works offline (no systemd as PID 1 needed). It exits 0 on
unknown or misspelled directives and only warns on stderr, so the test also
requires stderr to say nothing about our units. It fails when ExecStart names a
missing executable; the shipped units name /usr/local/bin/fleetd (where `pip
install` puts it for the system Python), so the test verifies a copy whose
ExecStart binary is replaced by the `fleetd` this install provides — every other
line is verified as shipped.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.service import units as shipped_units

UNITS = Path(__file__).resolve().parent.parent.parent / "systemd"
SHIPPED_FLEETD = "/usr/local/bin/fleetd"
SYSTEMD_ANALYZE = "/usr/bin/systemd-analyze"


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections -> [(key, value)] in order; systemd allows repeated keys."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"directive outside a section: {raw!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not KEY=VALUE: {raw!r}"
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: dict, section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


@pytest.fixture(params=["fleetd.service", "fleetd@.service"])
def unit_file(request) -> Path:
    return UNITS / request.param


def test_verify_passes_without_warnings(unit_file, tmp_path):
    fleetd = shutil.which("fleetd")
    assert fleetd, "the fleetd console script is not installed (pip install -e .)"
    text = unit_file.read_text()
    assert SHIPPED_FLEETD in text
    copy = tmp_path / unit_file.name
    copy.write_text(text.replace(SHIPPED_FLEETD, fleetd))
    # A template is verified through an instance: systemd finds fleetd@.service
    # beside it and expands %i.
    target = tmp_path / unit_file.name.replace("@.", "@demo.")
    proc = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", str(target)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    about_us = [line for line in proc.stderr.splitlines() if "fleetd" in line or str(tmp_path) in line]
    assert proc.returncode == 0, proc.stderr
    assert about_us == [], proc.stderr


def test_verify_catches_a_bad_directive(tmp_path):
    """The check above can fail: an unknown key is reported on stderr."""
    fleetd = shutil.which("fleetd")
    text = (UNITS / "fleetd.service").read_text().replace(SHIPPED_FLEETD, fleetd)
    copy = tmp_path / "fleetd.service"
    copy.write_text(text.replace("[Service]\n", "[Service]\nWatchdogSecs=30s\n"))
    proc = subprocess.run([SYSTEMD_ANALYZE, "verify", str(copy)], capture_output=True, text=True, timeout=120)
    assert "WatchdogSecs" in proc.stderr


REQUIRED = {
    ("Service", "Type"): "notify",
    ("Service", "NotifyAccess"): "main",
    ("Service", "WatchdogSec"): "30s",
    ("Service", "Restart"): "on-failure",
    # every controller: fleetd arranges its group's leaves and reads memory.events there
    ("Service", "Delegate"): "yes",
    ("Service", "RuntimeDirectory"): "fleet",
    ("Service", "CacheDirectory"): "fleet",
    ("Service", "ExecReload"): "/bin/kill -HUP $MAINPID",
    ("Service", "KillMode"): "mixed",
    ("Service", "NoNewPrivileges"): "yes",
    ("Service", "ProtectSystem"): "strict",
    ("Service", "ProtectHome"): "yes",
    ("Service", "PrivateTmp"): "yes",
    ("Service", "ProtectKernelTunables"): "yes",
    # fleetd writes its delegated cgroup: read-only cgroupfs would break that
    ("Service", "ProtectControlGroups"): "no",
    ("Install", "WantedBy"): "multi-user.target",
}


def test_required_directives(unit_file):
    unit = parse_unit(unit_file.read_text())
    for (section, key), expected in REQUIRED.items():
        assert values(unit, section, key) == [expected], f"{unit_file.name}: [{section}] {key}"
    # fleet keys numba's cache folder under $CACHE_DIRECTORY itself: a fixed NUMBA_CACHE_DIR
    # would let two versions share one folder
    assert not any(v.startswith("NUMBA_CACHE_DIR") for v in values(unit, "Service", "Environment"))
    assert "/sys/fs/cgroup" in " ".join(values(unit, "Service", "ReadWritePaths")).split()
    (timeout,) = values(unit, "Service", "TimeoutStopSec")
    assert timeout
    # /dev/shm holds the table fleetctl reads from outside: no private /dev or IPC
    for key in ("PrivateDevices", "PrivateIPC", "MemoryDenyWriteExecute"):
        assert values(unit, "Service", key) in ([], ["no"]), key


def test_exec_start_per_unit():
    plain = parse_unit((UNITS / "fleetd.service").read_text())
    template = parse_unit((UNITS / "fleetd@.service").read_text())
    assert values(plain, "Service", "ExecStart") == [f"{SHIPPED_FLEETD} --config /etc/fleet/fleet.toml"]
    assert values(template, "Service", "ExecStart") == [
        f"{SHIPPED_FLEETD} --name %i --config /etc/fleet/%i.toml"
    ]


# --- fleetd --print-unit ---------------------------------------------------------------------------


def print_unit(argv, *unit):
    out = subprocess.run([*argv, "--print-unit", *unit], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def verify(tmp_path, name: str, text: str) -> subprocess.CompletedProcess:
    (tmp_path / name).write_text(text)
    target = tmp_path / name.replace("@.", "@demo.")
    return subprocess.run([SYSTEMD_ANALYZE, "verify", str(target)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def test_the_repository_units_are_the_ones_fleetd_prints():
    for name in ("fleetd.service", "fleetd@.service"):
        assert (UNITS / name).read_text() == shipped_units.shipped(name)


def test_print_unit_names_the_fleetd_script_that_runs(tmp_path):
    fleetd = shutil.which("fleetd")
    text = print_unit([fleetd])
    unit = parse_unit(text)
    assert values(unit, "Service", "ExecStart") == [f"{fleetd} --name %i --config /etc/fleet/%i.toml"]
    # the header says which fleetd it names, and says nothing of the shipped path
    assert "/usr/local/bin" not in text
    assert f"# Written by `fleetd --print-unit` for the install it ran from: ExecStart names\n# {fleetd}\n" in text
    # every other line as shipped
    shipped = [line for line in (UNITS / "fleetd@.service").read_text().splitlines()
               if not line.startswith("ExecStart=")]
    printed = [line for line in text.splitlines() if not line.startswith("ExecStart=")]
    note = range(shipped.index(shipped_units.SHIPPED_NOTE + ", where `pip install` puts it for the system"),
                 shipped.index("#", shipped.index("#") + 1))
    assert printed == shipped[:note.start] + printed[note.start:note.start + 2] + shipped[note.stop:]
    proc = verify(tmp_path, "fleetd@.service", text)
    assert proc.returncode == 0 and [line for line in proc.stderr.splitlines() if "fleetd" in line] == [], proc.stderr


def test_print_unit_run_as_a_module_names_this_interpreter(tmp_path):
    text = print_unit([sys.executable, "-m", "fleet.cli.fleetd"], "fleetd.service")
    unit = parse_unit(text)
    assert values(unit, "Service", "ExecStart") == [f"{sys.executable} -m fleet.cli.fleetd --config /etc/fleet/fleet.toml"]
    proc = verify(tmp_path, "fleetd.service", text)
    assert proc.returncode == 0 and [line for line in proc.stderr.splitlines() if "fleetd" in line] == [], proc.stderr


def test_print_unit_refuses_a_unit_fleet_does_not_ship():
    out = subprocess.run([sys.executable, "-m", "fleet.cli.fleetd", "--print-unit", "other.service"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == "" and "other.service" in out.stderr


def test_an_install_path_with_a_space_or_percent_is_quoted_for_systemd(tmp_path):
    odd = tmp_path / "my venv 100%" / "bin"
    odd.mkdir(parents=True)
    script = odd / "fleetd"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    command = shipped_units.this_fleetd(argv0=str(script))
    assert command == [str(script)]
    text = shipped_units.render(shipped_units.shipped("fleetd.service"), command)
    quoted = '"' + str(script).replace("%", "%%") + '"'
    assert values(parse_unit(text), "Service", "ExecStart") == [f"{quoted} --config /etc/fleet/fleet.toml"]
    proc = verify(tmp_path, "fleetd.service", text)
    assert proc.returncode == 0 and [line for line in proc.stderr.splitlines() if "fleetd" in line] == [], proc.stderr
