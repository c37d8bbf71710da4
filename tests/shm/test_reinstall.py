"""An install survives the README's order: install, run a fleet, reinstall editable, import.

A non-editable install into a fresh venv runs a small fleet (on the kernels the install
built, without numba), then the same tree is reinstalled editable. Had the run written numba's
cache into site-packages/fleet, pip would leave that folder behind on uninstall and
it would shadow the editable install as an empty namespace package (no
``fleet.Fleet``, a broken ``fleetctl``). The venv sees the packages of the environment
running the tests (numba, numpy, setuptools, wheel, cffi, pip, ... which the ``test``
extra brings), so nothing is downloaded and the build, without isolation, has what
``[build-system]`` asks; the C extensions build from ``native/``.
"""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TREE = Path(__file__).resolve().parents[2]
_BUILD_OUTPUT = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.o",
                                      ".pytest_cache", ".hypothesis", "burst-report", "_native.c")


def NOT_IN_A_CLONE(folder, names):
    """What a fresh clone does not hold: build output, compiled extensions, caches, and
    a venv made in the checkout (the brief's `.venv`, or any folder with a pyvenv.cfg)."""
    venvs = {n for n in names if os.path.isfile(os.path.join(folder, n, "pyvenv.cfg"))}
    return set(_BUILD_OUTPUT(folder, names)) | venvs

RUN_A_FLEET = textwrap.dedent(
    """
    import sys
    import fleet
    assert fleet.__file__.startswith(sys.argv[1]), fleet.__file__
    config = {"fleet": {"name": sys.argv[2], "profile": "serial"},
              "roles": {"square": {"kind": "pooled", "handler": "fleet.api.examples:square", "slots": 1,
                                   "peak_cpus": 1}}}
    with fleet.Fleet.from_config(config, env={}) as f:
        print(sum(f.map("square", range(10))), "numba" in sys.modules)
    """
)


def _sh(argv, **kwargs):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kwargs)
    assert out.returncode == 0, f"{argv}: {out.stdout}\n{out.stderr}"
    return out.stdout


def _kernel_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.suffix in (".nbi", ".nbc")]


def _running_site_packages() -> list[str]:
    """The site-packages folders of the interpreter running the tests: a venv's own (not
    its base interpreter's, which ``--system-site-packages`` would give), or the base's."""
    folders = site.getsitepackages()
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        folders.append(site.getusersitepackages())
    return folders


@pytest.fixture
def venv(tmp_path):
    """A venv of its own, without pip, that sees the running environment's packages
    after its own: listed as plain folders in a .pth file, whose own .pth files (this
    checkout's editable fleet among them) are not run, so only the venv's fleet imports."""
    root = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    (Path(purelib) / "zz-running-environment.pth").write_text("\n".join(_running_site_packages()) + "\n")
    return root


def test_install_run_reinstall_editable_then_import_from_outside(tmp_path, venv, fleet_name):
    src = tmp_path / "src"
    shutil.copytree(TREE, src, ignore=NOT_IN_A_CLONE)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    python, pip = str(venv / "bin" / "python"), [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                                                "--no-deps", "--no-build-isolation"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR", "CACHE_DIRECTORY")}
    env.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME="", PIP_DISABLE_PIP_VERSION_CHECK="1")

    _sh([*pip, str(src)], env=env, cwd=outside)
    site = Path(_sh([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env=env,
                    cwd=outside).strip())
    installed = site / "fleet"
    assert _sh([python, "-c", RUN_A_FLEET, str(installed), fleet_name], env=env, cwd=outside).split() == ["285", "False"]
    assert list(installed.glob("shm/table/_kernels*.so")), "the install built no kernels"
    assert _kernel_files(installed) == [], "a kernel was cached inside the installed package"
    assert not (tmp_path / "home" / ".cache" / "fleet").exists(), "the build or the run cached numba kernels"
    unit = _sh([str(venv / "bin" / "fleetd"), "--print-unit"], env=env, cwd=outside)
    assert f"ExecStart={venv}/bin/fleetd --name %i --config /etc/fleet/%i.toml\n" in unit

    _sh([*pip, "-e", str(src)], env=env, cwd=outside)
    assert not installed.exists(), f"the old install left {sorted(p.name for p in installed.rglob('*'))}"
    where = _sh([python, "-c", "import fleet; print(fleet.__file__, fleet.Fleet.__name__)"], env=env, cwd=outside)
    assert where.split() == [str(src / "fleet" / "__init__.py"), "Fleet"]
    assert "usage: fleetctl" in _sh([str(venv / "bin" / "fleetctl"), "--help"], env=env, cwd=outside)
    assert _kernel_files(src / "fleet") == []
