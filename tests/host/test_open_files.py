"""fleet.host.open_files in a process of its own (it changes the limits of the process it
runs in): started by prlimit with a low soft limit, as a service starts."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.daemons import REPO

_SCRIPT = r"""
import json, resource
from fleet.host import open_files as of
out = {"first": of.raise_soft(), "now": resource.getrlimit(resource.RLIMIT_NOFILE), "found": of.found_soft()}
out["again"] = of.raise_soft()  # at its hard limit already: nothing to do
out["found_after"] = of.found_soft()
of.restore_soft(100)
out["restored"] = resource.getrlimit(resource.RLIMIT_NOFILE)
of.restore_soft(1 << 30)  # never above the hard limit
out["capped"] = resource.getrlimit(resource.RLIMIT_NOFILE)
print(json.dumps(out))
"""


def _run(soft: int, hard: int) -> dict:
    proc = subprocess.run(["prlimit", f"--nofile={soft}:{hard}", "--", sys.executable, "-c", _SCRIPT],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_soft_limit_is_raised_to_the_hard_one_and_the_one_found_is_kept():
    out = _run(256, 4096)
    assert out["first"] == [256, 4096] and out["now"] == [4096, 4096] and out["found"] == 256
    assert out["again"] is None and out["found_after"] == 256
    assert out["restored"] == [100, 4096] and out["capped"] == [4096, 4096]


def test_a_limit_at_its_hard_one_is_left_as_it_is():
    out = _run(4096, 4096)
    assert out["first"] is None and out["found"] is None and out["now"] == [4096, 4096]
