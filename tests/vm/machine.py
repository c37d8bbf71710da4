"""One boot of the VM: qemu under software emulation (TCG: nested KVM cannot run a guest on
these machines), the cached image's kernel, a root disk made for this run from the cached
root folder (`prepare`: the project's wheel installed, the scenarios beside it), and the
results out on the second serial port as ``FLEETVM ...`` lines.

`boot` always leaves no qemu behind: it waits with a bound and kills the process group
when the bound passes or anything goes wrong.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess

SCENARIOS = pathlib.Path(__file__).resolve().parent / "scenarios"
#: qemu's command line, kernel arguments aside. 2 vCPUs like the host; TCG with a thread per vCPU.
QEMU = ("qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2", "-m", "1536",
        "-display", "none", "-monitor", "none", "-no-reboot", "-nodefaults")
#: The kernel's: a pure cgroup v2 hierarchy is what the scenarios are about.
APPEND = ("root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 quiet "
          "systemd.show_status=false panic=-1")


@dataclasses.dataclass
class Run:
    """What one boot brought out: each scenario's result by name, and the raw lines."""

    results: dict
    lines: list
    console: str
    returncode: int | None
    timed_out: bool

    @property
    def done(self) -> bool:
        return any(line.startswith("FLEETVM DONE") for line in self.lines)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Run":
        return cls(**json.loads(text))


def parse(text: str) -> tuple[dict, list]:
    """The ``FLEETVM RESULT <name> <json>`` lines of the results port, by name."""
    results, lines = {}, []
    for raw in text.splitlines():
        line = raw.strip("\r\n\x00 ")
        if not line.startswith("FLEETVM "):
            continue
        lines.append(line)
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[1] == "RESULT":
            try:
                results[parts[2]] = json.loads(parts[3])
            except ValueError:
                results[parts[2]] = {"error": f"unreadable result line: {parts[3][:500]}"}
    return results, lines


#: The run's disk: room for the root (about 700 MB with the project and its kernels).
ROOT_SIZE = "1600M"
GUEST_DIR = "opt/fleet-vm"
SITE = "opt/fleet-venv/lib/python3.11/site-packages"


def _step(cmd, log, timeout=600):
    with open(log, "ab") as out:
        out.write(f"+ {' '.join(map(str, cmd))}\n".encode())
        out.flush()
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            timeout=timeout).returncode
    if rc != 0:
        tail = "\n".join(pathlib.Path(log).read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"VM run step failed (exit {rc}): {' '.join(map(str, cmd))}\n{tail}")


def prepare(image: pathlib.Path, wheel: pathlib.Path, work: pathlib.Path, only=()) -> pathlib.Path:
    """The run's root disk: a copy of the cached root folder with the project's wheel
    installed, the scenarios in /opt/fleet-vm and numba's cache filled (scenarios/warm.py,
    run natively in a chroot); then ``mkfs.ext4 -d``. The copy goes away, the disk stays
    until `boot` is done with it."""
    root = work / "rootfs"
    log = work / "prepare.log"
    if root.exists():
        shutil.rmtree(root)
    _step(["cp", "-a", "--reflink=auto", str(image / "rootfs"), str(root)], log)
    guest = root / GUEST_DIR
    guest.mkdir(parents=True)
    for path in SCENARIOS.iterdir():
        if path.is_file():
            shutil.copy(path, guest / path.name)
    shutil.copy(SCENARIOS / "fleet_vm_handlers.py", root / SITE / "fleet_vm_handlers.py")
    shutil.copy(wheel, guest / wheel.name)
    if only:
        (guest / "only").write_text(" ".join(only) + "\n")
    # What a fleet needs in the chroot; nothing of the host's is bound in (the folder is
    # removed below: a bind mount left behind would take the host's files with it).
    # debootstrap made the device nodes /dev needs.
    mounts = [("proc", ["-t", "proc", "proc"]), ("sys", ["-t", "sysfs", "sysfs"]), ("dev/shm", ["-t", "tmpfs", "tmpfs"])]
    mounted = []
    try:
        for rel, how in mounts:
            (root / rel).mkdir(parents=True, exist_ok=True)
            _step(["mount", *how, str(root / rel)], log)
            mounted.append(root / rel)
        env = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LC_ALL=C", "PIP_CONFIG_FILE=/dev/null"]
        _step(["chroot", str(root), *env, "/opt/fleet-venv/bin/pip", "install", "-q", "--no-index", "--no-deps",
               f"/{GUEST_DIR}/{wheel.name}"], log)
        _step(["chroot", str(root), *env, "/opt/fleet-venv/bin/python", f"/{GUEST_DIR}/warm.py"], log, timeout=600)
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", str(path)], capture_output=True, timeout=60)
    still = [line.split()[1] for line in pathlib.Path("/proc/self/mounts").read_text().splitlines()
             if line.split()[1].startswith(str(root) + "/")]
    if still:
        raise RuntimeError(f"still mounted in the run's root, left in place: {still}")
    (guest / wheel.name).unlink()
    disk = work / "root.ext4"
    _step(["mkfs.ext4", "-q", "-F", "-L", "fleetroot", "-d", str(root), str(disk), ROOT_SIZE], log)
    shutil.rmtree(root)
    return disk


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that started it ends, so no qemu
    outlives a test process killed without teardown (pytest-timeout's os._exit, SIGKILL)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def boot(image: pathlib.Path, wheel: pathlib.Path, work: pathlib.Path, timeout_s: float, only=()) -> Run:
    """Boot the image once, run the scenarios (all, or those named in `only`), return what
    came out. The VM powers itself off when the scenarios end; after `timeout_s` it is killed."""
    work.mkdir(parents=True, exist_ok=True)
    disk = prepare(image, wheel, work, only)
    results_file, console_file = work / "results.txt", work / "console.log"
    for f in (results_file, console_file):
        f.unlink(missing_ok=True)
    cmd = [*QEMU, "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"), "-append", APPEND,
           "-drive", f"file={disk},format=raw,if=virtio",
           "-serial", f"file:{console_file}", "-serial", f"file:{results_file}"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=_die_with_parent)
    timed_out = False
    try:
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        if proc.poll() is None:  # the bound passed, or the caller was interrupted: no qemu left behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        disk.unlink(missing_ok=True)
    text = results_file.read_text(errors="replace") if results_file.exists() else ""
    console = console_file.read_text(errors="replace") if console_file.exists() else ""
    results, lines = parse(text)
    return Run(results, lines, console[-20000:], proc.returncode, timed_out)
