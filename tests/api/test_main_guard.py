"""A program whose main module makes a fleet outside the ``if __name__ == "__main__":``
guard gets fleet's own error in the program itself (fleet.worker.main_guard): a typed
`UnguardedMain` naming the guard, the line, and why fleet's workers import the main
module; not multiprocessing's "bootstrapping phase" text. Real scripts, run as programs."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.daemons import REPO
from tests.fleets import unique_name

SCRIPTS = {
    "fleet.Executor": """
        import sys
        sys.path.insert(0, {repo!r})
        import fleet

        def square(x):
            return x * x

        with fleet.Executor(max_workers=1) as ex:
            print(list(ex.map(square, range(3))))
    """,
    "fleet.Fleet": """
        import sys
        sys.path.insert(0, {repo!r})
        import fleet

        def double(unit):
            return unit.payload * 2

        roles = {{"w": {{"kind": "pooled", "handler": "__main__:double", "slots": 1, "peak_cpus": 1}}}}
        with fleet.Fleet.from_config({{"fleet": {{"name": {name!r}}}, "roles": roles}}, env={{}}) as f:
            print(f.submit("w", 2).result())
    """,
}
#: The line of each script that makes the fleet (after dedent, counting from 1).
MAKES = {"fleet.Executor": 8, "fleet.Fleet": 9}


@pytest.mark.parametrize("face", sorted(SCRIPTS))
def test_an_unguarded_main_module_gets_fleets_own_error_in_the_program(face, tmp_path):
    name = unique_name("ug")
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(SCRIPTS[face]).lstrip("\n").format(repo=REPO, name=name))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, (proc.returncode, stdout, stderr[-3000:])
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"fleet.rules.errors.UnguardedMain: {face} was made at the top level of this "
                           f"program's main module ({script}, line {MAKES[face]}), outside the "
                           '`if __name__ == "__main__":` guard.'), last
    assert "spawn and forkserver" in last and "Python 3.14" in last
    assert "freeze_support" not in stderr and "bootstrapping phase" not in stderr
    assert stdout == ""  # neither the program nor a worker ran any of it
    left = [p for p in os.listdir("/dev/shm") if p.startswith((f"fleet.{name}", f"fleet.executor-{proc.pid}-"))]
    assert not left


def test_the_error_is_a_boot_refusal_and_a_runtime_error():
    import fleet
    from fleet.rules.errors import UnguardedMain

    assert issubclass(UnguardedMain, fleet.BootRefused) and issubclass(UnguardedMain, RuntimeError)


def test_a_fleet_made_where_multiprocessings_spawn_imports_the_main_module_gets_its_own_error(tmp_path):
    """A spawned multiprocessing child that imports a main module making an Executor at its
    top level gets multiprocessing's own RuntimeError there (the guard defers to it), before
    any fork server is launched; the program's own process is unaffected."""
    script = tmp_path / "spawner.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing as mp
        import sys
        sys.path.insert(0, {repo!r})
        import fleet
        from fleet.runtime import zygote_launch

        def work():
            "Never runs: the spawned child fails importing this module first."

        def launch(*args, **kwargs):
            open("launched", "a").write("a fork server was launched\\n")  # the guard comes first
            return launch_it(*args, **kwargs)

        launch_it, zygote_launch.launch = zygote_launch.launch, launch

        if mp.current_process().name != "MainProcess":  # in the spawned child, as it imports this module
            fleet.Executor(max_workers=1)

        if __name__ == "__main__":
            child = mp.get_context("spawn").Process(target=work)
            child.start()
            child.join(120)
            print(child.exitcode)
    """).lstrip("\n").format(repo=REPO))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "1", (out.stdout, out.stderr[-3000:])
    assert "bootstrapping phase" in out.stderr and "UnguardedMain" not in out.stderr
    assert not (tmp_path / "launched").exists()
