"""fleetctl plan: the done-when commands, JSON and human output, refusals and their exit codes."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.cli import cmd_plan, fleetctl
from fleet.runtime.config import CONFIG_DIR
from fleet.rules.errors import EXIT_BELOW_HOST_FLOOR, EXIT_BUDGET_OVER_QUOTA, EXIT_CONFIG


def plan(capsys, *argv):
    rc = fleetctl.main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cpus_8_json_reproduces_the_reference_table(capsys):
    rc, out, _ = plan(capsys, "--cpus", "8", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert {k: doc["plan"][k] for k in ("profile", "binding", "quota_cpus", "oversubscribed", "tier_refused")} == {
        "profile": "auto",
        "binding": "pinned",
        "quota_cpus": 8,
        "oversubscribed": False,
        "tier_refused": None,
    }
    table = [(c["name"], c["cores"], c["threads"]) for c in doc["budget"]["consumers"]]
    assert table == [
        ("reserve", 1, None),
        ("ambient_io", 2, 2),
        ("resolve", 1, 1),
        ("merge", 1, 1),
        ("solver", 3, 6),
        ("simdriver", 0, 4),
    ]
    assert doc["budget"]["sum"] == 8


def test_cpus_1_is_refused_with_its_exit_code(capsys):
    rc, out, err = plan(capsys, "--cpus", "1", "--json")
    assert rc == EXIT_BELOW_HOST_FLOOR and out == ""
    assert err.count("\n") == 1 and "BelowHostFloor" in err


def test_cpus_4_resolves_serial(capsys):
    rc, out, _ = plan(capsys, "--cpus", "4", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["plan"]["binding"] == "serial" and not doc["plan"]["oversubscribed"]
    assert doc["plan"]["tier_refused"]["error"] == "QuotaTooSmallForPinnedRoles"


def test_cpus_4_forced_pinned_is_oversubscribed(capsys):
    rc, out, _ = plan(capsys, "--cpus", "4", "--profile", "pinned", "--json")
    doc = json.loads(out)
    assert rc == 0 and (doc["plan"]["binding"], doc["plan"]["oversubscribed"]) == ("pinned", True)
    assert doc["plan"]["tier_refused"]["floor_cpus"] == 6 and doc["budget"]["sum"] == 6


def test_human_table(capsys):
    rc, out, _ = plan(capsys, "--cpus", "4.5")
    assert rc == 0
    assert "auto -> serial binding" in out and "pinned floor is 6 CPUs" in out
    lines = {line.split()[0]: line.split()[1:3] for line in out.splitlines() if line[:1].isalpha()}
    # 002 §5's example: the remainder (its 0.5, and the core serial-0 leaves) is the I/O role's
    assert lines["serial-0"] == ["1", "1"] and lines["simdriver"] == ["1.5", "4"] and lines["sum"] == ["4.5"]
    assert "unallocated" not in lines
    fractional = next(line for line in out.splitlines() if line.startswith("fractional"))
    assert "the 0.5 beyond 4 whole CPUs" in fractional and "simdriver 1.5" in fractional
    assert "  simdriver: 4 slots on 1 worker process, I/O-bound" in out  # its own seat, not serial-0's


def test_json_says_whether_the_quota_is_fractional(capsys):
    assert json.loads(plan(capsys, "--cpus", "8", "--json")[1])["plan"]["fractional"] is None
    assert "fractional" in json.loads(plan(capsys, "--cpus", "6.5", "--json")[1])["plan"]["fractional"]


@pytest.mark.parametrize("cpus", ["1e9", "1025", "0", "-1", "nan", "inf", "-inf", "abc", "", "1e400"])
def test_cpus_out_of_range_is_a_usage_error_naming_the_range(cpus):
    # in a child: 1e9 used to lay out a billion CPUs until the kernel killed the process
    proc = subprocess.run([sys.executable, "-m", "fleet.cli.fleetctl", "plan", f"--cpus={cpus}", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert "argument --cpus: must be a number" in proc.stderr


def test_the_largest_quota_plans(capsys):
    rc, out, _ = plan(capsys, "--cpus", "1024", "--json")
    assert rc == 0 and json.loads(out)["plan"]["quota_cpus"] == 1024


@pytest.mark.parametrize("profile", ["auto", "serial", "pinned"])
def test_declared_peaks_over_the_quota_exit_with_the_budget_code(tmp_path, capsys, profile):
    cfg = tmp_path / "f.toml"
    cfg.write_text('[roles.w]\nhandler = "tests.handlers:square"\npeak_cpus = 50\n')
    rc, out, err = plan(capsys, "--cpus", "2", "--profile", profile, "--config", str(cfg), "--json")
    assert rc == EXIT_BUDGET_OVER_QUOTA and out == ""
    assert err.count("\n") == 1 and "BudgetOverQuota: declared shares sum to 50 cores over a quota of 2: w 50 (the roles' declared peaks" in err


def test_human_table_marks_overrides(tmp_path, capsys):
    cfg = tmp_path / "f.toml"
    cfg.write_text("[budget]\nambient_io = 3\n")
    rc, out, _ = plan(capsys, "--cpus", "8", "--config", str(cfg))
    assert rc == 0 and "override; rule gives 2" in out


def test_config_supplies_quota_and_profile(tmp_path, capsys):
    cfg = tmp_path / "f.toml"
    cfg.write_text('[fleet]\ncpus = 16\nprofile = "serial"\n')
    doc = json.loads(plan(capsys, "--config", str(cfg), "--json")[1])
    assert (doc["plan"]["quota_cpus"], doc["plan"]["binding"], doc["plan"]["quota_source"]) == (16, "serial", "config fleet.cpus")


def test_bad_config_exits_with_config_code(tmp_path, capsys):
    cfg = tmp_path / "f.toml"
    cfg.write_text("[posture]\ncordon_duty_pct = 1\n")
    rc, _, err = plan(capsys, "--cpus", "8", "--config", str(cfg))
    assert rc == EXIT_CONFIG and "posture.cordon_duty_pct" in err


def test_over_quota_overrides_exit_with_their_code(tmp_path, capsys):
    cfg = tmp_path / "f.toml"
    cfg.write_text("[budget]\nsolver = 5\n")
    rc, _, err = plan(capsys, "--cpus", "8", "--config", str(cfg))
    assert rc == EXIT_BUDGET_OVER_QUOTA and "BudgetOverQuota" in err


def test_without_cpus_the_quota_is_detected(capsys):
    rc, out, _ = plan(capsys, "--json")
    doc = json.loads(out) if rc == 0 else None
    assert rc in (0, EXIT_BELOW_HOST_FLOOR)
    assert doc is None or doc["plan"]["quota_source"] == "detected"


def test_the_installed_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.cli.fleetctl", "plan", "--cpus", "1"], capture_output=True, text=True
    )
    assert proc.returncode == EXIT_BELOW_HOST_FLOOR and "BelowHostFloor" in proc.stderr


def test_override_of_a_share_that_follows_slots_says_so(tmp_path, capsys):
    # A CPU-bound role with no declared share: the rule derives it from its slots, so an
    # override has no fixed number to compare with; the table says what the rule does.
    cfg = tmp_path / "f.toml"
    cfg.write_text('[roles.w]\nhandler = "fleet.api.examples:echo"\nslots = 4\n\n[budget]\nw = 2\n')
    rc, out, _ = plan(capsys, "--cpus", "8", "--config", str(cfg))
    row = next(line for line in out.splitlines() if line.startswith("w "))
    assert rc == 0 and "override; its share would follow its slots" in row and "None" not in row


# --- what is planned: --config, else /etc/fleet/<name>.toml, else the reference profile --------------


def test_without_a_config_the_first_line_says_reference_profile(capsys, monkeypatch):
    monkeypatch.delenv("FLEET_NAME", raising=False)
    monkeypatch.setattr(cmd_plan, "installed_config", lambda name: None)
    rc, out, _ = plan(capsys, "--cpus", "8")
    first = out.splitlines()[0]
    assert rc == 0 and "reference profile" in first and "solver" in first and "/etc/fleet/fleet.toml" in first
    rc, out, _ = plan(capsys, "--cpus", "8", "--json")
    assert json.loads(out)["config"] is None


def test_the_config_given_is_named_on_the_first_line(tmp_path, capsys):
    cfg = tmp_path / "mine.toml"
    cfg.write_text('[fleet]\nname = "mine"\n[roles.w]\nhandler = "tests.handlers:square"\nslots = 2\n')
    rc, out, _ = plan(capsys, "--cpus", "4", "--config", str(cfg))
    assert rc == 0 and out.splitlines()[0].split()[1:] == [str(cfg), "(fleet", "mine)"]
    assert "solver" not in out and "  w: 2 slots" in out


@pytest.mark.root
def test_the_fleets_installed_config_is_planned_when_no_config_is_given(fleet_name, capsys):
    installed = Path(CONFIG_DIR) / f"{fleet_name}.toml"
    installed.parent.mkdir(parents=True, exist_ok=True)
    installed.write_text(f'[fleet]\nname = "{fleet_name}"\n[roles.w]\nhandler = "tests.handlers:square"\nslots = 3\n')
    try:
        rc, out, _ = plan(capsys, "--name", fleet_name, "--cpus", "4")
        assert rc == 0 and out.splitlines()[0].split()[1] == str(installed)
        assert "  w: 3 slots" in out and "reference profile" not in out
        rc, out, _ = plan(capsys, "--cpus", "4", "--name", "other-than-" + fleet_name[:8])
        assert "reference profile" in out.splitlines()[0]
    finally:
        installed.unlink()
