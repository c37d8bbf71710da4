"""The tests' throwaway PostgreSQL cluster (`tests.store_backends`, used when FLEET_PG_DSN is
not set) goes with its test process even when that process dies without its teardown:
killed, or aborted by a fleet's fuse (whose abort once left ten clusters running). Real
clusters, real processes."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.daemons import REPO
from tests.store_backends import _unavailable

CASE = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from tests.store_backends import _Cluster
cluster = _Cluster()
print(cluster.dir, cluster.data, flush=True)
{end}
"""


def servers_of(data: str) -> list[int]:
    """The pids of the PostgreSQL servers running on `data`."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if data in " ".join(p.info["cmdline"] or ()):
                found.append(p.info["pid"])
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("end", ["os.kill(os.getpid(), signal.SIGKILL)", "os.abort()", "cluster.stop()"])
def test_a_throwaway_cluster_goes_with_its_test_process_however_it_ends(end):
    if not glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        _unavailable("no /usr/lib/postgresql/*/bin/initdb")
    out = subprocess.run([sys.executable, "-c", CASE.format(repo=REPO, end=end)], capture_output=True, text=True,
                         timeout=180)
    assert out.stdout.strip(), out.stderr[-2000:]
    folder, data = out.stdout.split()
    deadline = time.monotonic() + 60
    while (os.path.exists(folder) or servers_of(data)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = servers_of(data)
    for pid in left:  # the test's own failure must not leave them either
        os.kill(pid, signal.SIGKILL)
    assert left == [] and not os.path.exists(folder), (left, folder)
