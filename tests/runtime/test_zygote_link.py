"""A supervisor and its workers run one copy of fleet: the zygote imports the fleet
package its supervisor imported, whatever its working directory or PYTHONPATH holds,
and a zygote that runs another copy is refused at boot with both paths named."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

import fleet
from fleet.runtime.zygote_launch import FLEET_ROOT, zygote_env
from fleet.runtime.zygote_link import WorkerStartError, ZygoteLink
from fleet.shm.table import kernel_load

SCRIPT = textwrap.dedent("""
    import sys
    if len(sys.argv) > 2:
        sys.path.insert(0, sys.argv[2])  # this process's fleet comes from there
    import fleet
    print("fleet", fleet.__file__, flush=True)
    cfg = {"fleet": {"name": sys.argv[1], "profile": "serial"},
           "roles": {"w": {"kind": "pooled", "handler": "fleet.api.examples:square", "slots": 1}}}
    with fleet.Fleet.from_config(cfg, env={}) as f:
        print("result", f.submit("w", 7).result(60), flush=True)
""")


def _run(tmp_path, cwd, *args):
    script = tmp_path / "bin" / "run.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_folder_named_fleet_in_the_working_directory_is_not_what_the_workers_run(tmp_path, fleet_name):
    decoy = tmp_path / "work" / "fleet"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("")
    (decoy / "zygote.py").write_text("raise SystemExit('the decoy fleet was imported')\n")
    done = _run(tmp_path, decoy.parent, fleet_name)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "result 49" in done.stdout


def test_the_zygote_imports_the_fleet_this_process_imported(tmp_path, fleet_name):
    """A fleet found only on this process's own sys.path (a checkout beside the program,
    here a link to the installed package): the zygote takes that one too."""
    alt = tmp_path / "alt"
    alt.mkdir()
    (alt / "fleet").symlink_to(os.path.dirname(fleet.__file__), target_is_directory=True)
    done = _run(tmp_path, tmp_path, fleet_name, str(alt))
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"fleet {alt / 'fleet' / '__init__.py'}" in done.stdout and "result 49" in done.stdout


def test_zygote_env_puts_this_fleet_first_and_keeps_the_rest():
    env = zygote_env({"PYTHONPATH": "/a:/b", "HOME": "/root"}, root="/src/checkout", site_dirs=[])
    assert env == {"PYTHONPATH": "/src/checkout" + os.pathsep + "/a:/b", "HOME": "/root"}
    assert zygote_env({}, root="/src/checkout", site_dirs=[])["PYTHONPATH"] == "/src/checkout"


def test_zygote_env_leaves_an_installed_fleet_where_the_interpreter_finds_it(tmp_path):
    # site-packages ahead of the standard library could shadow it with a stale backport
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    assert zygote_env({"PYTHONPATH": "/a"}, root=str(site_dir), site_dirs=[str(site_dir)]) == {"PYTHONPATH": "/a"}
    assert "PYTHONPATH" not in zygote_env({}, root=str(site_dir), site_dirs=[str(site_dir)])


@pytest.mark.parametrize("reply, says", [
    ({"op": "ready", "pid": 1, "fleet": "/elsewhere"}, "'/elsewhere'"),
    ({"op": "ready", "pid": 1}, "None"),  # a zygote too old to say
])
def test_a_zygote_running_another_copy_of_fleet_is_refused_at_boot(reply, says):
    ours, theirs = socket.socketpair()

    def zygote_side():
        with theirs, theirs.makefile("rb") as lines:
            boot = json.loads(lines.readline())
            assert boot["op"] == "boot"
            theirs.sendall(json.dumps(reply).encode() + b"\n")

    peer = threading.Thread(target=zygote_side)
    peer.start()
    link = ZygoteLink(None, ours)
    try:
        with pytest.raises(WorkerStartError) as info:
            link._boot("x", [], None)
        assert says in str(info.value) and repr(FLEET_ROOT) in str(info.value)
    finally:
        ours.close()
        peer.join(10)



def test_what_boot_does_meanwhile_runs_once_the_boot_message_is_sent_and_before_the_reply_is_read():
    """The supervisor's full collection runs while the zygote boots (`boot._rest`), not
    after: `meanwhile` comes after the send (the zygote has its message) and before the
    reply is awaited (here the zygote waits for it before it answers)."""
    ours, theirs = socket.socketpair()
    ran = threading.Event()
    seen = {}

    def zygote_side():
        with theirs, theirs.makefile("rb") as lines:
            seen["boot"] = json.loads(lines.readline())["op"]
            seen["meanwhile_ran"] = ran.wait(10)  # before the reply: the link waits for it only after
            theirs.sendall(json.dumps({"op": "ready", "pid": 1, "fleet": FLEET_ROOT}).encode() + b"\n")

    peer = threading.Thread(target=zygote_side)
    peer.start()
    link = ZygoteLink(None, ours)
    try:
        link._boot("x", [], None, meanwhile=ran.set)
    finally:
        ours.close()
        peer.join(10)
    assert seen == {"boot": "boot", "meanwhile_ran": True}


def test_the_first_forks_go_to_the_zygote_in_one_write():
    """Boot asks for its seats' workers in one write (`fork_many`), so the zygote reads them
    as one batch and makes every fork before it reports any (fleet.worker.zygote.Zygote.handle)."""
    class Writes:  # the link's socket, each write recorded
        def __init__(self):
            self.sent = []

        def sendall(self, data):
            self.sent.append(data)

        def settimeout(self, _):
            pass

        def setblocking(self, _):
            pass

    writes = Writes()
    ZygoteLink(None, writes).fork_many([(0, (0,)), (1, (1,)), (2, ())])
    assert len(writes.sent) == 1
    assert [json.loads(line) for line in writes.sent[0].splitlines()] == [
        {"op": "fork", "seat": 0, "cpus": [0]}, {"op": "fork", "seat": 1, "cpus": [1]},
        {"op": "fork", "seat": 2, "cpus": []}]


# --- the zygote launched first (it loads the kernels while the supervisor loads its own) ----
def test_a_boot_that_fails_after_launching_the_zygote_leaves_no_process_and_no_segment(fleet_name):
    """Boot launches the zygote before it creates the table: a table that cannot be made
    (here: a readers group that does not exist) stops the launched zygote before the error goes up."""
    import psutil

    from fleet.runtime.config import load_config
    from fleet.runtime.loop import Supervisor
    from fleet.shm.table.segment import TableError

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    cfg = load_config({"fleet": {"name": fleet_name, "profile": "serial"},
                       "roles": {"w": {"kind": "pooled", "handler": "fleet.api.examples:square", "slots": 1}}}, env={})
    with pytest.raises(TableError, match="no-such-group-49"):
        Supervisor(cfg, readers_group="no-such-group-49").start()
    assert not {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not [n for n in os.listdir("/dev/shm") if fleet_name in n]
    assert not [t for t in threading.enumerate() if fleet_name in t.name]  # nor its spawner thread


def test_a_launch_whose_zygote_cannot_be_placed_leaves_no_process_and_no_thread(fleet_name):
    """`place` puts the zygote in its cgroup before it forks anything: one that cannot be
    placed is killed and reaped before the error goes up (never left to run, or forking,
    outside its cgroup), and the thread that started it is gone."""
    import psutil

    from fleet.runtime import zygote_launch

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    placed = []

    def place(pid):
        placed.append(pid)
        raise PermissionError("cgroup.procs: permission denied")

    with pytest.raises(PermissionError, match="cgroup.procs"):
        zygote_launch.launch(fleet_name, place=place)
    assert placed and not psutil.pid_exists(placed[0])  # reaped: not even a zombie
    assert not {p.pid for p in psutil.Process().children(recursive=True)} - before
    spawners = [t for t in threading.enumerate() if fleet_name in t.name]
    for t in spawners:
        t.join(10)  # shut down without waiting: it ends on its own at once
    assert not [t for t in spawners if t.is_alive()]


def test_stopping_an_adopted_launch_closes_the_links_socket_and_reaps_the_zygote(fleet_name):
    """The link adopts the launch's socket (one object owns the descriptor): a boot that
    fails after the adoption stops the launch, and that closes the link's socket too."""
    from fleet.runtime import zygote_launch

    launched = zygote_launch.launch(fleet_name)
    link = ZygoteLink.adopt(launched)
    assert isinstance(link._sock, socket.socket)
    launched.stop()
    launched.stop()  # idempotent
    assert link._sock.fileno() == -1
    assert launched.proc.returncode is not None


def test_the_kernels_a_zygote_preloads_are_the_ones_its_table_calls(fleet_name):
    """On numba's run-time path (FLEET_KERNELS=jit: the kernels not built at install), the
    zygote compiles (or loads from numba's cache) the kernels' entry points before its
    boot message: attaching the table then calls those very entry points, and nothing is
    compiled or loaded after the boot message, on the critical path."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import json, sys
        from fleet.worker.zygote import preload_kernels
        from fleet.shm.table import kernel_load
        from fleet.rules.roles import Role, RoleSet
        from fleet.shm.table import SlotTable

        preload_kernels()
        first = kernel_load.load()
        entry = sys.modules.get(kernel_load.JIT)
        made = {{n: e.address for n, e in entry.ENTRY_POINTS.items()}} if entry else {{}}
        table = SlotTable.create({fleet_name!r}, RoleSet((Role("w", kind="pooled", handler="m:f", slots=1),)), 1)
        try:
            table.load_kernels()
            again = {{n: e.address for n, e in sys.modules[kernel_load.JIT].ENTRY_POINTS.items()}}
            print(json.dumps([first.name, table.kernels is first, list(first.addresses) == list(made.values()),
                              again == made]))
        finally:
            table.unlink()
            table.close()
    """)], capture_output=True, text=True, timeout=300, env={**os.environ, "FLEET_KERNELS": "jit"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [kernel_load.JIT, True, True, True]


def test_a_zygote_preloads_the_built_kernels_and_the_worker_without_numba(fleet_name):
    """With the kernels built at install, the zygote's preload is their module and the
    worker's own (fleet.worker.process, and fleet.host.priority, which its set-up after
    the fork calls), so a fork imports none of them; the table attached at boot takes
    that same module, and neither numba nor numpy is ever imported. asyncio comes only with an I/O-bound
    role (`preload_io`): the Executor's zygote starts without it."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import json, sys
        from fleet.worker.zygote import preload_io, preload_kernels, preload_worker
        from fleet.shm.table import kernel_load
        from fleet.rules.roles import Role, RoleSet
        from fleet.shm.table import SlotTable

        preload_kernels()
        preload_worker()
        preloaded = [m for m in ("fleet.shm.table._kernels", "fleet.worker.process", "fleet.host.priority",
                                 "asyncio") if m in sys.modules]
        roles = RoleSet((Role("w", kind="pooled", handler="m:f", slots=1),))
        preload_io(roles)
        io = ["asyncio" in sys.modules]
        preload_io(RoleSet((Role("w", kind="pooled", handler="m:f", slots=1),
                            Role("i", kind="pooled", handler="m:f", slots=1, io_bound=True))))
        io.append(all(m in sys.modules for m in ("asyncio", "fleet.worker.io.runner", "fleet.worker.io.selector")))
        table = SlotTable.create({fleet_name!r}, roles, 1)
        try:
            table.load_kernels()
            print(json.dumps([preloaded, io, table.kernels is kernel_load.load(), "numba" in sys.modules,
                              "numpy" in sys.modules]))
        finally:
            table.unlink()
            table.close()
    """)], capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if k != "FLEET_KERNELS"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [["fleet.shm.table._kernels", "fleet.worker.process", "fleet.host.priority"],
                                      [False, True], True, False, False]


def test_a_copy_of_fleet_found_only_on_this_process_path_is_the_one_the_workers_run(tmp_path, fleet_name):
    """A second copy of the package (a checkout beside the program), not the installed one:
    the zygote imports it from the same directory, or the boot would refuse the mismatch."""
    alt = tmp_path / "alt"
    shutil.copytree(os.path.dirname(fleet.__file__), alt / "fleet", ignore=shutil.ignore_patterns("__pycache__"))
    done = _run(tmp_path, tmp_path, fleet_name, str(alt))
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"fleet {alt / 'fleet' / '__init__.py'}" in done.stdout and "result 49" in done.stdout


def _environment(_=None):
    """In a worker: its PYTHONPATH, and whether a Python it starts finds fleet's subpackages
    at the top level (it must not: they are fleet.api, fleet.rules, ...)."""
    probe = subprocess.run([sys.executable, "-c", "import importlib.util as u; "
                            "print([m for m in ('api', 'rules', 'runtime', 'worker') if u.find_spec(m)])"],
                           capture_output=True, text=True, timeout=60)
    return os.environ.get("PYTHONPATH"), probe.stdout.strip()


@pytest.mark.parametrize("pythonpath", [None, "/nowhere/a"])
def test_a_worker_inherits_the_callers_pythonpath_not_the_zygotes(pythonpath, monkeypatch):
    if pythonpath is None:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    else:
        monkeypatch.setenv("PYTHONPATH", pythonpath)
    with fleet.Executor(max_workers=1) as ex:
        assert ex.submit(_environment).result(60) == (pythonpath, "[]")
