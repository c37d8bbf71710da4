"""The VM run, shared by every test of tests/vm/: one boot per test session.

What it needs: root (debootstrap, chroot), qemu-system-x86_64, debootstrap, mkfs.ext4 and,
for a cold image, Debian's mirror. Missing any, the tests skip with one line naming what
is missing; with ``FLEET_REQUIRE_VM=1`` (CI, `.ci/run`) they fail instead.

Under pytest-xdist every worker that gets a VM test calls the fixture; the first takes a
lock and boots, the others wait on the lock and read what it wrote (the run's folder is
keyed by xdist's test-run id), so a session boots once.
"""
from __future__ import annotations

import fcntl
import os
import pathlib
import shutil

import pytest

from tests.vm import image, machine

#: The bound on one boot with every scenario (scenarios time out on their own well before).
BOOT_TIMEOUT_S = 1500
#: Commands the harness runs, and the Debian package each comes from.
TOOLS = {"qemu-system-x86_64": "qemu-system-x86", "debootstrap": "debootstrap", "mkfs.ext4": "e2fsprogs",
         "chroot": "coreutils"}


def missing() -> str | None:
    """What this machine lacks to run the VM tests, in one line (None: nothing)."""
    if os.geteuid() != 0:
        return "VM tests need root (debootstrap, chroot)"
    absent = [name for name in TOOLS if shutil.which(name) is None]
    if absent:
        packages = " ".join(sorted({TOOLS[n] for n in absent}))
        return f"VM tests need {', '.join(absent)} (apt-get install {packages})"
    return None


def runs_root() -> pathlib.Path:
    return image.cache_root().parent / "vm-runs"


@pytest.fixture(scope="session")
def vm_run() -> machine.Run:
    why = missing()
    if why is not None:
        if os.environ.get("FLEET_REQUIRE_VM") == "1":
            pytest.fail(f"FLEET_REQUIRE_VM=1: {why}")
        pytest.skip(why)
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    root = runs_root()
    root.mkdir(parents=True, exist_ok=True)
    work = root / run_id
    with open(root / f"{run_id}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = work / "run.json"
        if saved.exists():
            return machine.Run.from_json(saved.read_text())
        _prune(root, keep=work)
        work.mkdir(parents=True, exist_ok=True)
        img = image.ensure_image(work)
        wheel = image.fleet_wheel(work / "wheel", work / "wheel.log")
        only = tuple(os.environ.get("FLEET_VM_ONLY", "").split())  # a subset, by hand: FLEET_VM_ONLY="start stop"
        run = machine.boot(img, wheel, work, BOOT_TIMEOUT_S, only)
        shutil.rmtree(work / "wheel", ignore_errors=True)
        saved.write_text(run.to_json())
    return run


def _prune(root: pathlib.Path, keep: pathlib.Path, older_than_newest: int = 3) -> None:
    """Earlier runs' folders (logs and results, for a look after a failure): the newest few stay."""
    runs = sorted((p for p in root.iterdir() if p.is_dir() and p != keep), key=lambda p: p.stat().st_mtime)
    for old in runs[:-older_than_newest]:
        shutil.rmtree(old, ignore_errors=True)
        (root / f"{old.name}.lock").unlink(missing_ok=True)
