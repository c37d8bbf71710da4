"""numba's kernel cache lives outside the package, keyed per build; without one the kernels run uncached.

These are numba's run-time kernels, which run when the ones built at install are missing
or stale: the children here ask for them (FLEET_KERNELS=jit).

The read-only cases copy the packages (fleet, and admission beside it) into a folder
bind-mounted read-only in a private mount namespace (so even root cannot write there),
then import them from there."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fleet
from fleet.rules.fsm import R_ILLEGAL
from fleet.shm.table import numba_env

PACKAGE = Path(numba_env.__file__).resolve().parents[2]  # .../fleet
ADMISSION = PACKAGE.parent / "admission"  # installed beside it (fleet's vocabulary re-exports its lease states)

CHILD = textwrap.dedent(
    """
    import os, sys
    import fleet.shm.table.kernels
    from fleet.shm.table import SlotTable
    from fleet.rules.roles import REFERENCE_ROLES
    assert fleet.__file__.startswith(sys.argv[1]), fleet.__file__
    t = SlotTable.create(sys.argv[2], REFERENCE_ROLES, 2)
    t.apply(0, "LEASE", 2)
    t.close(); t.unlink()
    print(os.environ.get("NUMBA_CACHE_DIR", ""))
    """
)


def _key():
    import numba

    return f"fleet-{fleet.__version__}-numba-{numba.__version__}-{sys.implementation.cache_tag}"


def _copy_package(tmp_path) -> Path:
    root = tmp_path / "site"
    shutil.copytree(PACKAGE, root / "fleet", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ADMISSION, root / "admission", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _env(root, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "CACHE_DIRECTORY")}
    env.update(PYTHONPATH=str(root), FLEET_KERNELS="jit", **extra)
    return env


def _kernel_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.suffix in (".nbi", ".nbc")]


def _run(tmp_path, fleet_name, env_extra, read_only: bool):
    root = _copy_package(tmp_path)
    child = [sys.executable, "-c", CHILD, str(root), fleet_name]
    if read_only:
        script = (f"mount --bind {root} {root} && mount -o remount,bind,ro {root} && "
                  f"exec {sys.executable} -c '{CHILD}' {root} {fleet_name}")
        child = ["unshare", "-m", "sh", "-c", script]
    out = subprocess.run(child, env=_env(root, **env_extra), cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert _kernel_files(root) == [], "a kernel was cached inside the package"
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "", out.stderr


@pytest.mark.root
def test_read_only_install_caches_under_xdg_in_a_folder_keyed_by_versions(tmp_path, fleet_name):
    xdg = tmp_path / "xdg"
    chosen, _ = _run(tmp_path, fleet_name, {"XDG_CACHE_HOME": str(xdg)}, read_only=True)
    assert chosen == str(xdg / "fleet" / "numba" / _key())
    assert _kernel_files(xdg / "fleet" / "numba" / _key()), "no kernel was cached"


def test_a_writable_package_is_never_written(tmp_path, fleet_name):
    home = tmp_path / "home"
    chosen, _ = _run(tmp_path, fleet_name, {"HOME": str(home), "XDG_CACHE_HOME": ""}, read_only=False)
    assert chosen == str(home / ".cache" / "fleet" / "numba" / _key())
    assert _kernel_files(Path(chosen))


def test_under_systemd_the_cache_directory_wins(tmp_path, fleet_name):
    service_cache = tmp_path / "var-cache-fleet"
    service_cache.mkdir()
    chosen, _ = _run(tmp_path, fleet_name, {"CACHE_DIRECTORY": str(service_cache),
                                            "XDG_CACHE_HOME": str(tmp_path / "xdg")}, read_only=False)
    assert chosen == str(service_cache / "numba" / _key())
    assert _kernel_files(Path(chosen)) and not (tmp_path / "xdg").exists()


@pytest.mark.root
def test_no_writable_cache_dir_runs_uncached_with_one_warning(tmp_path, fleet_name):
    # both candidates point into the read-only mount itself, so neither can be created
    inside = tmp_path / "site" / "fleet"
    chosen, stderr = _run(tmp_path, fleet_name, {"XDG_CACHE_HOME": str(inside / "xdg"),
                                                 "CACHE_DIRECTORY": str(inside / "svc")}, read_only=True)
    assert chosen == ""
    warnings = [line for line in stderr.splitlines() if "compiling them uncached" in line]
    assert len(warnings) == 1 and str(inside / "svc") in warnings[0], stderr


def test_explicit_cache_dir_wins(tmp_path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "mine"), "CACHE_DIRECTORY": str(tmp_path / "svc")}
    assert numba_env.choose_cache_dir(env, key="k") == str(tmp_path / "mine")


def test_each_version_and_python_gets_its_own_folder():
    keys = {numba_env.cache_key("0.1.0", "0.60.0", "cpython-311"), numba_env.cache_key("0.2.0", "0.60.0", "cpython-311"),
            numba_env.cache_key("0.1.0", "0.61.0", "cpython-311"), numba_env.cache_key("0.1.0", "0.60.0", "cpython-312")}
    assert len(keys) == 4


def test_without_a_home_no_relative_folder_is_chosen(tmp_path):
    assert numba_env.candidate_dirs({}, "k", home="~") == []
    assert numba_env.candidate_dirs({"CACHE_DIRECTORY": "/var/cache/fleet:/other"}, "k", home="~") == [
        Path("/var/cache/fleet/numba/k")]


# --- a changed FSM table is a cache miss, never a stale kernel -------------------------------------

FOLLOWS = textwrap.dedent(
    """
    import sys
    import fleet
    from fleet.rules import fsm
    from fleet.rules.roles import RoleSet, Role
    from fleet.shm.table import SlotTable
    assert fleet.__file__.startswith(sys.argv[1]), fleet.__file__
    roles = RoleSet((Role("pool", kind="pooled"),))
    t = SlotTable.create(sys.argv[2], roles, 1)
    try:
        kernel = []
        for event in (fsm.LEASE, fsm.START, fsm.RELEASE):  # T1, T2, then T5 (or whatever the table says)
            kernel.append(t.transition(0, event, 0 if event == fsm.LEASE else fsm.ANY_ROLE, 0))
            if kernel[-1] != fsm.OK:
                break
        rule = fsm.decide(fsm.RUNNING, 0, 0, fsm.RELEASE, fsm.ANY_ROLE, 0, fsm.KIND_POOLED, fsm.CLASS_NEVER, fsm.NOMINAL)[0]
        print(kernel[-1], rule)
    finally:
        t.close()
        t.unlink()
    """
)


def test_a_changed_fsm_table_recompiles_the_cached_kernels(tmp_path, fleet_name):
    """Warm the cache, edit fsm.TRANSITIONS (T5 removed: a pooled unit can no longer
    complete to Idle), run again on the same cache: the kernel follows the new table."""
    root = tmp_path / "site"
    shutil.copytree(PACKAGE, root / "fleet", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ADMISSION, root / "admission", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(root), "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "FLEET_KERNELS": "jit"}

    def run():
        out = subprocess.run([sys.executable, "-c", FOLLOWS, str(root), fleet_name], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return tuple(int(x) for x in out.stdout.split())

    assert run() == (0, 0)  # compiles and caches: T5 applies
    assert run() == (0, 0)  # from the cache
    assert list((tmp_path / "cache").rglob("*.nbc")), "nothing was cached"

    fsm_py = root / "fleet" / "rules" / "fsm.py"
    text = fsm_py.read_text()
    t5 = '    (RUNNING, RELEASE): (IDLE, "T5", frozenset({KIND_POOLED}), False),\n'
    assert t5 in text
    fsm_py.write_text(text.replace(t5, ""))
    # kernels.py is untouched (same mtime and size): only the digest can tell the table changed
    assert run() == (R_ILLEGAL, R_ILLEGAL)


def test_the_digest_covers_the_fsm_table():
    from fleet.rules import fsm
    from fleet.shm.table import kernels

    embedded = {**_constants(kernels), "atomics.py": kernels._source_digest(kernels._atomics)}
    assert kernels.TABLES_DIGEST == kernels.tables_digest(embedded)
    changed = kernels._GATED.copy()
    changed[fsm.RUNNING, fsm.PIN_KEYED] = 1  # T3 posture-gated
    assert kernels.tables_digest({**embedded, "_GATED": changed}) != kernels.TABLES_DIGEST
    assert kernels.tables_digest({**embedded, "atomics.py": 1}) != kernels.TABLES_DIGEST


def _constants(kernels):
    import numpy as np

    return {n: v for n, v in vars(kernels).items() if not n.startswith("__") and n != "TABLES_DIGEST"
            and isinstance(v, (int, np.integer, np.ndarray)) and not isinstance(v, bool)}
