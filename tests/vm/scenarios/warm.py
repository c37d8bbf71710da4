"""Run on the host in a chroot of the run's root (tests/vm/machine.py), natively: fill
numba's cache for the guest, where compiling fleet's kernels under emulation would take
minutes (longer than systemd's start timeout). When the wheel carries the kernels built at
install (`fleet.shm.table.kernel_load`), no guest process compiles any and there is nothing
to fill: the run only checks that a fleet serves.

It runs a fleet once, as the guest will (fleetd, fleetctl status, a client's unit), with
the cache in one folder, then copies that folder to every place a guest process looks
(`fleet.shm.table.numba_env`): the unit's CacheDirectory and each user's ~/.cache. The
kernels are compiled for NUMBA_CPU_NAME=generic, which the guest's processes are given
too: a kernel compiled for the host's CPU would not be taken on the emulated one.
"""
import os
import pathlib
import pwd
import shutil
import subprocess
import sys
import time

VENV = "/opt/fleet-venv"
WARM = pathlib.Path("/var/cache/fleet-vm-warm")
CONFIG = """\
[fleet]
name = "vmwarm"

[roles.square]
kind = "pooled"
handler = "fleet.api.examples:square"
slots = 1
"""


def main() -> int:
    env = {**os.environ, "NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": str(WARM)}
    os.environ.update(env)
    conf = pathlib.Path("/tmp/vmwarm.toml")
    conf.write_text(CONFIG)
    daemon = subprocess.Popen([f"{VENV}/bin/fleetd", "--config", str(conf)], env=env)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if subprocess.run([f"{VENV}/bin/fleetctl", "status", "--name", "vmwarm"], env=env,
                              capture_output=True).returncode == 0:
                break
            if daemon.poll() is not None:
                raise SystemExit(f"fleetd exited {daemon.returncode} while warming")
            time.sleep(0.5)
        import fleet

        with fleet.connect("vmwarm", timeout=60) as f:
            assert f.submit("square", 7).result(timeout=120) == 49
    finally:
        daemon.terminate()
        daemon.wait(120)
    from fleet.shm.table import kernel_load

    built, why = kernel_load.built_module()
    if built is not None:
        print("kernels built at install: the guest loads them without numba, no cache to warm")
        return 0
    print(f"kernels not built at install ({why}): warming numba's cache")
    from fleet.shm.table.numba_env import installed_key

    key = installed_key()
    targets = [(pathlib.Path("/var/cache/fleet/numba") / key, 0, 0),
               (pathlib.Path("/root/.cache/fleet/numba") / key, 0, 0)]
    for user in ("member", "outsider"):
        pw = pwd.getpwnam(user)
        targets.append((pathlib.Path(pw.pw_dir) / ".cache/fleet/numba" / key, pw.pw_uid, pw.pw_gid))
    for path, uid, gid in targets:
        shutil.copytree(WARM, path, dirs_exist_ok=True)
        for p in [path, *path.rglob("*")]:
            os.chown(p, uid, gid)
        up = path.parent
        while uid and up != pathlib.Path(pwd.getpwuid(uid).pw_dir):  # the user's .cache/fleet/numba too
            os.chown(up, uid, gid)
            up = up.parent
    shutil.rmtree(WARM)
    print(f"numba cache warmed: {key}, {len(list(targets[0][0].rglob('*.nbi')))} kernels' indexes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
