"""The VM image: a Debian bookworm root with systemd, Python 3.11 and fleet's dependencies,
all from Debian's packages and from wheels fetched on the host; built once and cached.

The cache lives in ``$FLEET_VM_CACHE`` (default ``~/.cache/fleet-tests/vm``), one folder per
key, the key a digest of everything that decides the image: this file, the guest's files
beside it (``guest/``) and the project's dependency list. A changed builder or a new
dependency gets a new folder; the others are removed once the new one is complete. A build
that dies leaves no ``complete`` marker and is redone.

What goes in: ``debootstrap --variant=minbase`` plus systemd, dbus, udev, python3 and the
cloud kernel (installed in the chroot, so its initramfs carries virtio_blk); a venv at
``/opt/fleet-venv`` made in the chroot (under emulation it would take 40 s) with the
dependencies' wheels installed; users for the socket-group scenario; the guest runner unit
(``guest/fleet-vmtest.service``), which runs the run's scenarios (``/opt/fleet-vm``) and powers
off. Out of it come ``vmlinuz``, ``initrd.img`` and the root folder ``rootfs``. The project
itself is not in the image: each run copies the folder, installs a wheel built from the tree
(`fleet_wheel`) and makes the run's disk from it (`tests.vm.machine.prepare`), so a cached
image serves every commit.

Every step runs as root (debootstrap, chroot); the tests skip or fail before calling this
when the machine cannot (`tests/vm/conftest.py`).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib

HERE = pathlib.Path(__file__).resolve().parent
TREE = HERE.parent.parent
GUEST = HERE / "guest"

SUITE = "bookworm"
MIRROR = os.environ.get("FLEET_VM_MIRROR", "http://deb.debian.org/debian")
#: Debian packages of the guest: systemd as PID 1 (and D-Bus, which systemctl's talk with
#: it needs), udev (the second disk's device node), Python 3.11 with venv.
PACKAGES = ("systemd", "systemd-sysv", "dbus", "udev", "python3", "python3-venv", "procps", "kmod")
KERNEL = "linux-image-cloud-amd64"
VENV = "/opt/fleet-venv"
#: the socket-group scenario's users: one in fleetd's socket group, one outside it
SOCKET_GROUP, MEMBER, OUTSIDER = "fleetsock", "member", "outsider"


def cache_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get("FLEET_VM_CACHE") or pathlib.Path.home() / ".cache/fleet-tests/vm")


def dependencies() -> list[str]:
    """The project's runtime requirements, as pyproject.toml states them."""
    with open(TREE / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def key() -> str:
    """A digest of the builder's inputs: this file, the guest's files, the dependency list."""
    h = hashlib.sha256()
    for path in [pathlib.Path(__file__).resolve(), *sorted(GUEST.rglob("*"))]:
        if path.is_file():
            h.update(str(path.relative_to(HERE)).encode() + b"\0" + path.read_bytes() + b"\0")
    h.update("\n".join(dependencies()).encode())
    return h.hexdigest()[:16]


def _run(cmd, log, **kw):
    """Run a build step, its output appended to `log`; a failure raises naming the step."""
    with open(log, "ab") as out:
        out.write(f"+ {' '.join(map(str, cmd))}\n".encode())
        out.flush()
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            timeout=kw.pop("timeout", 600), **kw).returncode
    if rc != 0:
        tail = pathlib.Path(log).read_text(errors="replace").splitlines()[-30:]
        raise RuntimeError(f"VM image step failed (exit {rc}): {' '.join(map(str, cmd))}\n" + "\n".join(tail))


def _chroot(root, *cmd, log, env=None):
    base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    _run(["chroot", str(root), *cmd], log, env={**base, **(env or {})})


def fetch_wheels(dest: pathlib.Path, log) -> None:
    """Wheels of every dependency (and theirs), fetched on the host: the guest has no network.
    Host and guest are both CPython 3.11 on glibc 2.36, so the host's wheels fit."""
    dest.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(dest), *dependencies()], log)


def build(target: pathlib.Path, log) -> None:
    """Build the image's files into `target` (vmlinuz, initrd.img, rootfs/)."""
    rootdir = target / "rootfs"
    if rootdir.exists():
        shutil.rmtree(rootdir)
    _run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootdir), MIRROR],
         log, timeout=900)
    # The kernel in the chroot: its postinst builds an initrd that can mount a virtio disk.
    _chroot(rootdir, "apt-get", "install", "-y", "-q", "--no-install-recommends", KERNEL, log=log)
    _chroot(rootdir, "apt-get", "clean", log=log)

    wheels = target / "wheels"
    fetch_wheels(wheels, log)
    shutil.copytree(wheels, rootdir / "tmp/wheels")
    _chroot(rootdir, "python3", "-m", "venv", VENV, log=log)
    _chroot(rootdir, f"{VENV}/bin/pip", "install", "-q", "--no-index", "--find-links", "/tmp/wheels",
            *dependencies(), log=log, env={"PIP_CONFIG_FILE": "/dev/null"})
    shutil.rmtree(rootdir / "tmp/wheels")

    _configure(rootdir, log)
    boot = sorted((rootdir / "boot").glob("vmlinuz-*"))[-1]
    shutil.copy(boot, target / "vmlinuz")
    shutil.copy(rootdir / "boot" / boot.name.replace("vmlinuz", "initrd.img"), target / "initrd.img")
    shutil.rmtree(wheels)


def _configure(root: pathlib.Path, log) -> None:
    """The guest's own settings: hostname, fstab, users, the runner unit, no waiting on a
    network or a getty that nobody uses."""
    (root / "etc/hostname").write_text("fleetvm\n")
    (root / "etc/fstab").write_text("/dev/vda / ext4 rw,errors=remount-ro 0 1\n")
    _chroot(root, "groupadd", "--system", SOCKET_GROUP, log=log)
    _chroot(root, "useradd", "--create-home", "--groups", SOCKET_GROUP, MEMBER, log=log)
    _chroot(root, "useradd", "--create-home", OUTSIDER, log=log)
    unit_dir = root / "etc/systemd/system"
    shutil.copy(GUEST / "fleet-vmtest.service", unit_dir / "fleet-vmtest.service")
    shutil.copy(GUEST / "fleet-vmtest", root / "usr/local/sbin/fleet-vmtest")
    wants = unit_dir / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / "fleet-vmtest.service").symlink_to("/etc/systemd/system/fleet-vmtest.service")
    # Nothing on the console but the runner's own lines; no login prompt to wait on.
    for unit in ("getty@tty1.service", "serial-getty@ttyS0.service", "serial-getty@ttyS1.service",
                 "systemd-timesyncd.service", "apt-daily.timer", "apt-daily-upgrade.timer"):
        (unit_dir / unit).unlink(missing_ok=True)
        (unit_dir / unit).symlink_to("/dev/null")
    (root / "etc/machine-id").write_text("")


def ensure_image(log_dir: pathlib.Path) -> pathlib.Path:
    """The cached image's folder for the current key, built first when missing.

    Concurrent callers (pytest-xdist workers, two CI runs) serialise on a lock file; the
    first builds, the others find it complete."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / key()
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "complete").exists():
            return target
        if target.exists():
            shutil.rmtree(target)
        target.mkdir()
        build(target, log_dir / "vm-image-build.log")
        (target / "complete").write_text(key() + "\n")
        for other in root.iterdir():  # an older builder's images: never used again
            if other.is_dir() and other != target:
                shutil.rmtree(other, ignore_errors=True)
    return target


def fleet_wheel(dest: pathlib.Path, log) -> pathlib.Path:
    """A wheel of the project built from this tree on the host (what the guest installs)."""
    dest.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--wheel-dir", str(dest),
          str(TREE)], log, timeout=600)
    return next(dest.glob("fleet-*.whl"))


if __name__ == "__main__":  # build (or find) the image by hand: python -m tests.vm.image
    print(ensure_image(pathlib.Path(os.environ.get("TMPDIR", "/tmp"))))
