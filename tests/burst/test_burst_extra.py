"""fleet-burst's own dependencies are the `burst` extra: fleet runs without them, and a
command that needs one that is absent says so in one line naming the extra, before doing
anything. An absent module is made so by blocking its import in a fresh interpreter."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXTRA = ("httpx", "matplotlib", "tqdm")  # pyproject.toml's [project.optional-dependencies] burst


def without(modules, code: str, *args: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter in which `modules` cannot be imported."""
    script = f"import sys\nfor m in {tuple(modules)!r}:\n    sys.modules[m] = None\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})


BURST = "from fleet.burst.cli import main\nsys.exit(main(sys.argv[1:]))\n"


@pytest.mark.parametrize("absent, argv, named", [
    (EXTRA, ["replay", "examples/traces/burst-35.jsonl"], "httpx and matplotlib and tqdm"),
    (("httpx",), ["replay", "examples/traces/burst-35.jsonl", "--no-progress"], "httpx"),
    (("tqdm",), ["replay", "examples/traces/burst-35.jsonl"], "tqdm"),
    (("matplotlib",), ["show", "no-such-report"], "matplotlib"),
])
def test_a_command_missing_the_extra_says_so_in_one_line_and_does_nothing(absent, argv, named, tmp_path):
    out = without(absent, BURST, *argv, *(["--report", str(tmp_path / "r")] if argv[0] == "replay" else []))
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.splitlines() == [
        f"fleet-burst: {argv[0]} needs {named}, not installed: install fleet's 'burst' extra "
        "(pip install 'fleet[burst]', or pip install '.[burst]' from a checkout)"]
    assert not (tmp_path / "r").exists()


def test_what_a_command_does_not_need_is_not_asked_for(tmp_path, fleet_name):
    # without a progress bar the replay needs no tqdm: it goes on, here to the trace it cannot read
    out = without(("tqdm",), BURST, "replay", str(tmp_path / "missing.jsonl"), "--no-progress")
    assert out.returncode == 65, out.stderr
    assert "extra" not in out.stderr
    # record needs none of the extra: it goes on, here to a fleet that is not running
    out = without(EXTRA, BURST, "record", "--name", fleet_name, "-o", str(tmp_path / "t.jsonl"))
    assert out.returncode == 69, out.stderr
    assert "extra" not in out.stderr
    out = without(EXTRA, BURST, "--help")
    assert out.returncode == 0 and out.stdout.startswith("usage: fleet-burst")


def test_fleet_runs_without_the_extra(fleet_name):
    code = """
        import fleet
        config = {"fleet": {"name": sys.argv[1], "profile": "serial"},
                  "roles": {"square": {"kind": "pooled", "handler": "fleet.api.examples:square", "slots": 1,
                                       "peak_cpus": 1}}}
        with fleet.Fleet.from_config(config, env={}) as f:
            print(sum(f.map("square", range(10))))
        with fleet.Executor(max_workers=1) as ex:
            print(sum(ex.map(abs, range(-3, 0))))
        from fleet.cli.fleetctl import main
        sys.exit(main(["plan", "--cpus", "8"]))
    """
    out = without(EXTRA, code, fleet_name)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["285", "6"]
