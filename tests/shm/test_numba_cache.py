"""Kernels load from a read-only install: numba's cache goes to a writable folder.

The packages (fleet, and admission beside it) are copied into a folder that is bind-mounted read-only in a private
mount namespace (so even root cannot write there), then imported from it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


def _run_read_only(tmp_path, fleet_name, env_extra):
    root = tmp_path / "site"
    shutil.copytree(PACKAGE, root / "fleet", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ADMISSION, root / "admission", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(PYTHONPATH=str(root), **env_extra)
    script = (
        f"mount --bind {root} {root} && mount -o remount,bind,ro {root} && "
        f"exec {sys.executable} -c '{CHILD}' {root} {fleet_name}"
    )
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert not (root / "fleet" / "shm" / "table" / "__pycache__").exists()
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.root
def test_read_only_install_caches_under_xdg(tmp_path, fleet_name):
    xdg = tmp_path / "xdg"
    chosen = _run_read_only(tmp_path, fleet_name, {"XDG_CACHE_HOME": str(xdg), "TMPDIR": str(tmp_path)})
    assert chosen == str(xdg / "fleet" / "numba")
    assert list((xdg / "fleet" / "numba").rglob("*.nbi")), "no kernel was cached"


@pytest.mark.root
def test_read_only_install_with_unwritable_xdg_falls_back_to_tmp(tmp_path, fleet_name):
    # XDG points into the read-only mount itself, so it cannot be created.
    xdg = tmp_path / "site" / "fleet" / "cache"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    chosen = _run_read_only(tmp_path, fleet_name, {"XDG_CACHE_HOME": str(xdg), "TMPDIR": str(tmp)})
    assert chosen == str(tmp / f"fleet-numba-{os.getuid()}")
    assert list(Path(chosen).rglob("*.nbi"))


def test_explicit_cache_dir_wins(tmp_path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "mine")}
    assert numba_env.choose_cache_dir(env) == str(tmp_path / "mine")


def test_writable_package_caches_beside_the_source(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    assert numba_env.choose_cache_dir({}, package_dir=pkg) is None
    assert (pkg / "__pycache__").is_dir()


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
    env = {**os.environ, "PYTHONPATH": str(root), "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

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
