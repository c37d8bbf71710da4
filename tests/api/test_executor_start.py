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

import pytest

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


#: What `Executor()` has not imported yet when it launches its fork server: each would
#: delay the fork server's start, the first result's path (docs/executor.md, "What a boot
#: costs"). dataclasses is the costliest (the code of each dataclass is written and compiled
#: at import), multiprocessing and concurrent.futures.process come with ProcessPoolExecutor's
#: errors (fleet.rules.raised), hashlib and uuid with OpenSSL; socket brings its
#: constants and selectors (its C core makes the launch's socketpair), and the zygote's link, its
#: module and fleet's errors are the protocol's, wanted only once the zygote answers.
BEFORE_LAUNCH = ("dataclasses", "typing", "multiprocessing", "concurrent.futures.process", "hashlib", "uuid",
                 "socket", "fleet.runtime.zygote_link", "fleet.worker.zygote", "fleet.rules.errors",
                 "fleet.rules.unit", "fleet.rules.roles", "fleet.runtime.config", "fleet.runtime.workers",
                 "fleet.worker.prepare", "fleet.service.control.ops")

LAUNCH_SPY = """
    import json, sys
    sys.path.insert(0, {repo})
    BEFORE_LAUNCH = {before_launch}
    from fleet.runtime import zygote_launch

    seen = {}
    launch = zygote_launch.launch

    def spy(name, place=None):
        # what this process had imported when the zygote was launched
        seen["loaded"] = sorted(m for m in sys.modules if m.startswith(("numpy", "fleet.runtime.loop", "fleet.api.fleet")))
        seen["before_launch"] = sorted(m for m in sys.modules if m in BEFORE_LAUNCH)
        seen["launched"] = launched = launch(name, place=place)
        return launched

    zygote_launch.launch = spy
""".replace("{before_launch}", repr(BEFORE_LAUNCH))


def test_the_executor_launches_its_zygote_before_it_imports_the_runtime_and_boots_that_one(tmp_path):
    got = run(LAUNCH_SPY + """
    import fleet

    if __name__ == "__main__":
        with fleet.Executor(max_workers=1) as ex:
            result = ex.submit(abs, -3).result()
            booted = ex.fleet._sup._rig.workers.zygote.pid
        print(json.dumps({"loaded": seen["loaded"], "same": booted == seen["launched"].pid, "result": result,
                          "before_launch": seen["before_launch"]}))
    """, tmp_path)
    assert got == {"loaded": [], "same": True, "result": 3, "before_launch": []}


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
        print(json.dumps({"loaded": loaded, "same": booted == seen["launched"].pid, "result": result}))
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


def test_importing_fleet_loads_nothing_but_its_version(tmp_path):
    """`import fleet` (the fork server's first import, and every tool's) loads no module of
    fleet's or admission's beyond the version: each public name loads its module on first
    use, and is then the very object its module defines."""
    got = run("""
        import json, sys
        sys.path.insert(0, {repo})
        import fleet
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("fleet", "admission"))
        from fleet import Unit, Refused
        from fleet.rules.unit import Unit as unit_class
        from admission.errors import Refused as refused_class
        print(json.dumps({"loaded": loaded, "same": Unit is unit_class and Refused is refused_class}))
    """, tmp_path)
    assert got == {"loaded": ["fleet", "fleet._version"], "same": True}


def test_a_fork_servers_preloads_leave_out_processpoolexecutors_module(tmp_path):
    """What a worker runs (the fork server's preloads) does without concurrent.futures.process
    (ProcessPoolExecutor's module, and multiprocessing's connections and queues with it):
    fleet.rules.raised makes its BrokenProcessPool subclasses on first use, once, as its own
    names, and they pickle by them."""
    got = run("""
        import json, pickle, sys
        sys.path.insert(0, {repo})
        from fleet.worker import zygote
        zygote.preload_kernels()
        zygote.preload_worker()
        preloaded = "concurrent.futures.process" in sys.modules
        from fleet.rules import raised
        from concurrent.futures.process import BrokenProcessPool
        broken = raised.role_broken("stopped")
        print(json.dumps({
            "preloaded": preloaded,
            "is_ppe_error": isinstance(broken, BrokenProcessPool) and issubclass(raised.UnitBroken, BrokenProcessPool),
            "made_once": raised.RoleBroken is type(broken) and raised.UnitBroken is raised.UnitBroken,
            "name": f"{type(broken).__module__}.{type(broken).__qualname__}",
            "pickles": type(pickle.loads(pickle.dumps(broken))) is raised.RoleBroken,
        }))
    """, tmp_path)
    assert got == {"preloaded": False, "is_ppe_error": True, "made_once": True, "name": "fleet.rules.raised.RoleBroken",
                   "pickles": True}


def test_a_fleets_operator_methods_are_made_at_the_first_look_for_one(tmp_path):
    """fleet.Fleet's op methods come from the op registry, which its import leaves out: the
    first look for one (on the class or on a fleet) makes them all, as the class's own;
    a name that is no op is an AttributeError, before and after."""
    got = run("""
        import inspect, json, sys
        sys.path.insert(0, {repo})
        from fleet.api.fleet import Fleet
        imported = "fleet.service.control.ops" in sys.modules
        try:
            Fleet.no_such_op
            missing = None
        except AttributeError as exc:
            missing = str(exc)
        made = "fleet.service.control.ops" in sys.modules
        print(json.dumps({"imported": imported, "missing": missing, "made": made,
                          "own": "drain" in Fleet.__dict__ and "status" in dir(Fleet),
                          "signature": str(inspect.signature(Fleet.posture_set))}))
    """, tmp_path)
    assert got["imported"] is False and got["made"] is True and got["own"] is True
    assert got["missing"] == "type object 'Fleet' has no attribute 'no_such_op'"
    assert got["signature"].startswith("(self")


def test_a_boot_that_fails_while_the_fork_server_boots_leaves_nothing(tmp_path):
    """The provider gate is made while the fork server boots (after its boot message, before
    its answer). A failure there (injected: the gate's constructor raises) goes up as it
    is, and the fork server, its workers and the fleet's segments are gone with it."""
    name = unique_name("pg")
    got = run("""
        import json, os, sys, time
        sys.path.insert(0, {repo})
        import psutil
        import fleet
        from fleet.runtime import provider_gate

        class Injected(Exception):
            "The provider gate failing, injected."

        def refuse(self, *args, **kwargs):
            raise Injected("the provider gate could not be made")

        provider_gate.ProviderGate.__init__ = refuse

        if __name__ == "__main__":
            roles = {"w": {"kind": "pooled", "handler": "json:dumps", "slots": 1, "peak_cpus": 1}}
            try:
                fleet.Fleet.from_config({"fleet": {"name": %r}, "roles": roles}, env={})
                error = None
            except Injected as exc:
                error = str(exc)
            deadline = time.monotonic() + 10
            while psutil.Process().children(recursive=True) and time.monotonic() < deadline:
                time.sleep(0.01)
            print(json.dumps({"error": error, "children": len(psutil.Process().children(recursive=True)),
                              "left": [p for p in os.listdir("/dev/shm") if p.startswith("fleet.%s")]}))
    """ % (name, name), tmp_path)
    assert got == {"error": "the provider gate could not be made", "children": 0, "left": []}


def test_the_fork_servers_start_reads_its_command_line_without_argparse(tmp_path):
    """argparse (gettext, and shutil with the compression modules for its help's width) is
    ~8 ms of the fork server's start, which the first result waits for: the command line
    its supervisor writes is read by hand, and neither it nor the preloads import them."""
    got = run("""
        import json, sys
        sys.path.insert(0, {repo})
        from fleet.worker import zygote
        args = zygote.parse_args(["--fd", "7", "--parent=42", "--nofile", "1024"])
        zygote.preload_kernels()
        zygote.preload_worker()
        print(json.dumps({"args": args, "loaded": sorted(m for m in ("argparse", "shutil", "gettext", "bz2", "lzma")
                                                         if m in sys.modules)}))
    """, tmp_path)
    assert got == {"args": {"fd": 7, "parent": 42, "nofile": 1024}, "loaded": []}


@pytest.mark.parametrize("argv, says", [
    (["--parent", "1"], "--fd required"),
    (["--fd", "3"], "--parent required"),
    (["--fd", "x", "--parent", "1"], "--fd expects a number, got 'x'"),
    (["--fd", "3", "--parent", "1", "--bogus"], "unrecognized argument '--bogus'"),
    (["--fd", "3", "--parent"], "--parent expects a number"),
], ids=["no fd", "no parent", "not a number", "unknown", "no value"])
def test_a_bad_fork_server_command_line_exits_2_naming_what_is_wrong(argv, says, capsys):
    from fleet.worker import zygote

    with pytest.raises(SystemExit) as exc:
        zygote.parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"fleet.worker.zygote: error: {says}\n" in err and err.startswith("usage: "), err


#: What neither process of a start imports, your process through its first result and the
#: fork server through its preloads (docs/executor.md, "What a boot costs"): dataclasses
#: (fleet declares records), inspect with ast and dis, and in the fork server typing and
#: pathlib, each 2-5 ms of a start on its path.
NEVER_IMPORTED = ("dataclasses", "inspect", "ast", "dis")
NOT_IN_THE_FORK_SERVER = (*NEVER_IMPORTED, "typing", "pathlib")


def test_a_first_result_imports_neither_dataclasses_nor_inspect(tmp_path):
    got = run("""
        import json, sys
        sys.path.insert(0, {repo})
        from fleet import Executor

        if __name__ == "__main__":
            with Executor(max_workers=1) as ex:
                assert ex.submit(abs, -3).result() == 3
            print(json.dumps(sorted(m for m in %r if m in sys.modules)))
    """ % (NEVER_IMPORTED,), tmp_path)
    assert got == []


def test_the_fork_server_preloads_without_typing_pathlib_or_inspect():
    """Its preloads, in an interpreter without `site` (whose .pth files, an editable install's
    import hook among them, import pathlib and more before fleet runs), fleet's root and
    the site-packages on its path."""
    import sysconfig

    paths = os.pathsep.join([REPO, sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    code = textwrap.dedent("""
        import json, sys
        before = set(sys.modules)
        import fleet.worker.zygote as z
        assert z.__file__.startswith(sys.argv[1]), z.__file__
        z.preload_kernels()
        z.preload_worker()
        print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules and m not in before)))
    """)
    out = subprocess.run([sys.executable, "-S", "-c", code, REPO, json.dumps(NOT_IN_THE_FORK_SERVER)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": paths})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == []
