"""A light start (issue 49, item 3): `import fleet.api.executor` loads neither numpy nor
the runtime, and `fleet.Executor()` / `fleet.Fleet` launch the fork server (zygote) first,
before they import the supervisor's runtime, so that its start (its interpreter, numpy,
the kernels) overlaps those imports on the other core; the zygote the boot then uses is
that one. A boot that fails after the launch leaves no process behind. Each case runs in
a fresh interpreter: what a module imports is only seen in one that had not imported it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.daemons import REPO
from tests.fleets import unique_name

#: What `import fleet.api.executor` may not load: numpy and numba, the runtime (the supervisor,
#: boot, the config), shared memory (the table, the data plane), the role face and the service;
#: nor the email package (admission.errors parses an HTTP date with it, only when it must).
HEAVY = ("numpy", "numba", "llvmlite", "fleet.runtime.", "fleet.shm.", "fleet.api.fleet", "fleet.service.", "email.")


def run(script: str, cwd) -> dict:
    """`script` run as a main module in a fresh interpreter; the JSON it prints last."""
    path = os.path.join(cwd, "start_case.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(script).lstrip("\n").replace("{repo}", repr(REPO)))
    out = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=300, cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def heavy(modules) -> list:
    return sorted(m for m in modules if m.startswith(HEAVY) or m in {h.rstrip(".") for h in HEAVY})


def test_importing_the_executor_loads_neither_numpy_nor_the_runtime(tmp_path):
    got = run("""
        import json, sys
        sys.path.insert(0, {repo})
        from fleet import Executor
        import fleet.api.executor
        print(json.dumps(sorted(sys.modules)))
    """, tmp_path)
    assert "fleet.api.executor" in got
    assert heavy(got) == []


LAUNCH_SPY = """
    import json, sys
    sys.path.insert(0, {repo})
    from fleet.runtime import workers

    seen = {}
    launch = workers.launch

    def spy(name, place=None):
        # what this process had imported when the zygote was launched
        seen["loaded"] = sorted(m for m in sys.modules if m.startswith(("numpy", "fleet.runtime.loop", "fleet.api.fleet")))
        seen["launched"] = launched = launch(name, place=place)
        return launched

    workers.launch = spy
"""


def test_the_executor_launches_its_zygote_before_it_imports_the_runtime_and_boots_that_one(tmp_path):
    got = run(LAUNCH_SPY + """
    import fleet

    if __name__ == "__main__":
        with fleet.Executor(max_workers=1) as ex:
            result = ex.submit(abs, -3).result()
            booted = ex.fleet._sup._rig.workers.zygote.pid
        print(json.dumps({"loaded": seen["loaded"], "same": booted == seen["launched"].link.pid, "result": result}))
    """, tmp_path)
    assert got == {"loaded": [], "same": True, "result": 3}


def test_a_fleet_launches_its_zygote_before_it_imports_the_supervisor(tmp_path):
    name = unique_name("zf")
    got = run(LAUNCH_SPY + """
    import fleet

    def double(unit):
        return unit.payload * 2

    if __name__ == "__main__":
        roles = {"w": {"kind": "pooled", "handler": "__main__:double", "slots": 1, "peak_cpus": 1}}
        with fleet.Fleet.from_config({"fleet": {"name": %r}, "roles": roles}, env={}) as f:
            result = f.submit("w", 21).result()
            booted = f._sup._rig.workers.zygote.pid
        loaded = [m for m in seen["loaded"] if m.startswith("fleet.runtime.loop")]
        print(json.dumps({"loaded": loaded, "same": booted == seen["launched"].link.pid, "result": result}))
    """ % name, tmp_path)
    assert got == {"loaded": [], "same": True, "result": 42}


def test_an_executor_whose_boot_fails_after_the_launch_leaves_no_process(tmp_path):
    """The zygote is launched before the config is checked: a bad `max_parcel_bytes`
    (a ConfigError of the config that follows) stops it before the error goes up."""
    got = run("""
        import json, sys, threading, time
        sys.path.insert(0, {repo})
        import psutil
        import fleet

        if __name__ == "__main__":
            try:
                fleet.Executor(max_workers=1, max_parcel_bytes=-1)
            except fleet.ConfigError as exc:
                error = str(exc)
            # its spawner thread ends on its own once the zygote is reaped: a bounded wait
            deadline = time.monotonic() + 10
            while [t for t in threading.enumerate() if "spawner" in t.name] and time.monotonic() < deadline:
                time.sleep(0.01)
            print(json.dumps({"error": "max_parcel_bytes" in error, "children": len(psutil.Process().children()),
                              "threads": [t.name for t in threading.enumerate() if "spawner" in t.name]}))
    """, tmp_path)
    assert got == {"error": True, "children": 0, "threads": []}


def test_the_fork_server_ends_without_the_interpreters_finalization(tmp_path):
    """Asked to exit, the fork server ends as its workers do (os._exit after flushing what
    it printed): no teardown of what it loaded for the shutdown to wait for, and no exit
    handler of the main module it imported runs there. Only this process's runs, once."""
    got = run("""
        import atexit, json, os, sys
        sys.path.insert(0, {repo})
        import fleet

        atexit.register(lambda: open("exits", "a").write(f"{os.getpid()}\\n"))  # each process that imports this

        if __name__ == "__main__":
            with fleet.Executor(max_workers=1) as ex:
                server = ex.fleet._sup._rig.workers.zygote.pid
                result = ex.submit(abs, -5).result()
            print(json.dumps({"result": result, "server": server, "me": os.getpid()}))
    """, tmp_path)
    exits = (tmp_path / "exits").read_text().split()
    assert got["result"] == 5
    assert exits == [str(got["me"])], (exits, got["server"])
