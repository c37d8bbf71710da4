"""Kernels load from a read-only install: numba's cache goes to a writable folder.

The package is copied into a folder that is bind-mounted read-only in a private
mount namespace (so even root cannot write there), then imported from it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fleet.table import numba_env

PACKAGE = Path(numba_env.__file__).resolve().parent.parent  # .../fleet

CHILD = textwrap.dedent(
    """
    import os, sys
    import fleet.table.kernels
    from fleet.table import SlotTable
    from fleet.roles import REFERENCE_ROLES
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
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(PYTHONPATH=str(root), **env_extra)
    script = (
        f"mount --bind {root} {root} && mount -o remount,bind,ro {root} && "
        f"exec {sys.executable} -c '{CHILD}' {root} {fleet_name}"
    )
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert not (root / "fleet" / "table" / "__pycache__").exists()
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
