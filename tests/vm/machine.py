"""One boot of the VM: qemu under software emulation (TCG: nested KVM cannot run a guest on
these machines), the cached image's kernel and root (``snapshot=on``: the cached disk never
changes), a second disk made from a folder of this run's files (the project's wheel, the
scenarios), and the results out on the second serial port as ``FLEETVM ...`` lines.

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


def input_disk(work: pathlib.Path, wheel: pathlib.Path, only=()) -> pathlib.Path:
    """The second disk: the wheel, the scenarios and their handlers, from a folder."""
    folder = work / "in"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for path in SCENARIOS.iterdir():
        if path.is_file():
            shutil.copy(path, folder / path.name)
    shutil.copy(wheel, folder / wheel.name)
    if only:
        (folder / "only").write_text(" ".join(only) + "\n")
    disk = work / "in.ext4"
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "fleetin", "-d", str(folder), str(disk), "64M"],
                   check=True, capture_output=True, timeout=120)
    shutil.rmtree(folder)
    return disk


def boot(image: pathlib.Path, wheel: pathlib.Path, work: pathlib.Path, timeout_s: float, only=()) -> Run:
    """Boot the image once, run the scenarios (all, or those named in `only`), return what
    came out. The VM powers itself off when the scenarios end; after `timeout_s` it is killed."""
    work.mkdir(parents=True, exist_ok=True)
    disk = input_disk(work, wheel, only)
    results_file, console_file = work / "results.txt", work / "console.log"
    for f in (results_file, console_file):
        f.unlink(missing_ok=True)
    cmd = [*QEMU, "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"), "-append", APPEND,
           "-drive", f"file={image / 'root.ext4'},format=raw,if=virtio,snapshot=on",
           "-drive", f"file={disk},format=raw,if=virtio,readonly=on",
           "-serial", f"file:{console_file}", "-serial", f"file:{results_file}"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
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
