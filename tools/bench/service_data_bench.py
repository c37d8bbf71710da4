#!/usr/bin/env python3
"""Large data through fleetd: MiB/s of bytes payloads in and bytes results out, one call at
a time, a service-mode client (`fleet.connect`) against the embedded `fleet.Executor` in the
same run.

    python tools/bench/service_data_bench.py [--json] [--sizes 512K,1M,64M] [--repeat R] [--calls N]

  in   ``submit(nbytes, <size bytes>)``: the payload crosses, a few bytes come back
  in-array  ``submit(nbytes, <a float64 array of size bytes>)``: the same with an array
  out  ``submit(make, ("bytes", size))``: a few bytes cross, the result (bytes) comes back
  out-array  ``submit(make, ("array", size))``: the same with a float64 array of that size
Each figure is size * calls / seconds (calls one after another, each waited for), the
median of --repeat rounds; the service and the Executor interleave round by round. A call
that fails is reported by its error's type and text (a limit), not timed.

Run it against another tree (the code before a change) with that tree first on the path:
``PYTHONPATH=/path/to/tree python tools/bench/service_data_bench.py`` (fleetd is started
with the same path)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_handlers as H  # noqa: E402

import fleet  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20
SIZES = {"512K": 512 * KIB, "1M": MIB, "64M": 64 * MIB, "512M": 512 * MIB}
DEFAULT_SIZES = "512K,1M,64M"
BOOT_S = 60.0


class Fleetd:
    """A fleetd of two roles (bench_handlers unit_nbytes and unit_make, one worker each) in a
    temporary folder; stopped (SIGTERM, then SIGKILL) and its folder removed on the way out."""

    def __init__(self):
        self.name = f"bench-data-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.dir = tempfile.mkdtemp(prefix="fd-", dir="/tmp")
        config = os.path.join(self.dir, "fleet.toml")
        with open(config, "w") as f:
            f.write(f'[fleet]\nname = "{self.name}"\n')
            for role in ("nbytes", "make"):
                f.write(f'\n[roles.{role}]\nkind = "pooled"\nhandler = "bench_handlers:unit_{role}"\nslots = 1\n'
                        'peak_cpus = 1\n')
        path = [HERE, *filter(None, [os.environ.get("PYTHONPATH")])]
        self.env = {**os.environ, "RUNTIME_DIRECTORY": os.path.join(self.dir, "run"),
                    "STATE_DIRECTORY": os.path.join(self.dir, "state"), "PYTHONPATH": os.pathsep.join(path)}
        for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "FLEET_NAME"):
            self.env.pop(key, None)
        self.stderr = open(os.path.join(self.dir, "fleetd.stderr"), "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "fleet.cli.fleetd", "--config", config, "--name",
                                      self.name], env=self.env, cwd=self.dir, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.stderr)

    def connect(self):
        deadline = time.monotonic() + BOOT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fleetd exited {self.proc.returncode}")
            try:
                return fleet.connect(self.name, env=self.env, timeout=120.0)
            except fleet.FleetError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(BOOT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def timed(submit, direction: str, size: int, calls: int):
    """MiB/s of `calls` calls one after another, or the error that stopped the first."""
    data = b"\1" * size
    if direction == "in-array":
        import numpy as np

        data = np.ones(size // 8)
    start = time.perf_counter()
    try:
        for _ in range(calls):
            if direction in ("in", "in-array"):
                assert submit("nbytes", data).result(600) == size
            elif direction == "out":
                assert len(submit("make", ("bytes", size)).result(600)) == size
            else:
                assert submit("make", ("array", size)).result(600).nbytes == size
    except Exception as exc:  # noqa: BLE001 - a limit is a figure too
        return f"{type(exc).__name__}: {str(exc)[:120]}"
    return size * calls / MIB / (time.perf_counter() - start)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help=f"comma-separated, of {','.join(SIZES)} (default {DEFAULT_SIZES})")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; a figure is their median (default 3)")
    ap.add_argument("--calls", type=int, default=0, help="calls per measure (default: ~256 MiB moved, 2..64)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    sizes = [(s, SIZES[s]) for s in args.sizes.split(",")]
    results: dict = {}
    with Fleetd() as d, fleet.Executor(max_workers=1) as ex:
        client = d.connect()
        try:
            sides = {"fleetd": lambda role, x: client.submit(role, x),
                     "executor": lambda role, x: ex.submit(getattr(H, role), x)}
            for label, size in sizes:
                calls = args.calls or max(2, min(64, (256 * MIB) // size))
                for direction in ("in", "in-array", "out", "out-array"):
                    rounds: dict = {side: [] for side in sides}
                    for _ in range(args.repeat):
                        for side, submit in sides.items():
                            rounds[side].append(timed(submit, direction, size, calls))
                    for side, got in rounds.items():
                        numbers = [g for g in got if not isinstance(g, str)]
                        value = round(statistics.median(numbers), 1) if len(numbers) == len(got) else next(
                            g for g in got if isinstance(g, str))
                        results[f"{side} {direction} {label}"] = value
        finally:
            client.close()
    results["load"] = open("/proc/loadavg").read().split()[:3]
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for key, value in results.items():
            print(f"{key:24} {value if isinstance(value, str) else value}{'' if isinstance(value, (str, list)) else ' MiB/s'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
