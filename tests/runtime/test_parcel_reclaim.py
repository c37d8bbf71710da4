"""What travels beside the rings (fleet.shm.parcels) is reclaimed on every path a unit may
end by: solved (tests/api/test_large_data.py), failed, cancelled, timed out, its worker
killed mid-transfer or while it holds a large payload, and its supervisor killed (the next
boot of the fleet's name, or the next Executor, removes what it left). After each, nothing
of the fleet's is left in /dev/shm (`running` checks every segment of its name at exit)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import fleet
from fleet.shm import parcels
from fleet.shm.segments import SHM_DIR
from tests.daemons import BOUND_S, wait_until
from tests.fleets import config, running, unique_name, worker_pids

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIG = b"\1" * (8 << 20)  # beside the ring


def _role(handler: str, **fields) -> dict:
    spec = {"kind": "pooled", "handler": f"tests.data_calls:{handler}", "slots": 1, "peak_cpus": 1,
            "queue_bound": 100}
    spec.update(fields)
    return spec


def _cfg(name: str, handler: str, **fields) -> dict:
    # a death here is the test's own doing: a restart budget no test exhausts
    return config(name, {"r": _role(handler, **fields)}, restart={"max_restarts": 100, "within_seconds": 60})


def _failure(future):
    exc = future.exception(BOUND_S)
    assert isinstance(exc, fleet.UnitFailed), exc
    return exc


def _no_parcels(name: str) -> None:
    wait_until(lambda: parcels.count(name) == 0, f"fleet {name}'s parcels removed")


def test_a_failed_units_payload_parcel_is_removed():
    name = unique_name("pf")
    with running(_cfg(name, "h_fail")) as f:
        with pytest.raises(ValueError, match="refused 8388608 bytes"):  # the handler's own exception
            f.submit("r", BIG).result(BOUND_S)
        _no_parcels(name)


def test_a_cancelled_units_payload_parcel_is_removed_at_the_cancel(tmp_path):
    name, gate = unique_name("pc"), str(tmp_path / "go")
    with running(_cfg(name, "h_wait_for", lookahead=0)) as f:
        running_one = f.submit("r", (gate, b"small"))
        try:
            wait_until(lambda: f.ledger()["inflight"] == 1 and f._sup.queued("r") == 0, "the first unit running")
            waiting = f.submit("r", (gate, BIG))  # queued behind it: its payload's parcel is made
            assert parcels.count(name) == 1
            assert waiting.cancel()
            assert parcels.count(name) == 0  # gone with the cancel, while the first unit still runs
        finally:
            open(gate, "w").close()
        assert running_one.result(BOUND_S) == 5


def test_a_timed_out_units_payload_parcel_is_removed():
    name = unique_name("pt")
    with running(_cfg(name, "h_hang", timeout_s=0.5)) as f:
        assert _failure(f.submit("r", BIG)).reason == "Timeout"
        _no_parcels(name)


def test_a_worker_killed_mid_transfer_leaves_no_parcel():
    """Killed between writing its result's parcel and sending the message that names it."""
    name = unique_name("pk")
    with running(_cfg(name, "h_parcel_then_die")) as f:
        assert _failure(f.submit("r", (name, 8 << 20))).reason == "LaneDeath"
        _no_parcels(name)


def test_a_worker_killed_holding_a_large_payload_leaves_no_parcel(tmp_path):
    name = unique_name("pw")
    marker = tmp_path / "running"
    with running(_cfg(name, "h_mark_then_wait")) as f:
        pids = worker_pids(f)
        unit = f.submit("r", (str(marker), str(tmp_path / "never"), BIG))
        wait_until(marker.exists, "the unit running")
        assert parcels.count(name) == 1
        os.kill(pids.pop(), signal.SIGKILL)
        assert _failure(unit).reason == "LaneDeath"
        _no_parcels(name)


#: Boots a fleet of the given name whose unit holds a large payload and has written its
#: result's parcel, says so, and waits to be killed.
SUPERVISOR = textwrap.dedent("""
    import sys, time
    import fleet
    from fleet.shm import parcels
    from tests.runtime.test_parcel_reclaim import BIG, _cfg
    name, gate = sys.argv[1], sys.argv[2]
    f = fleet.Fleet.from_config(_cfg(name, "h_parcel_then_wait"), env={})
    f.submit("r", (name, 4 << 20, gate))  # runs: its result's parcel written, then it holds
    f.submit("r", (name, 1, gate, BIG))  # waits: its payload's parcel
    while parcels.count(name) < 2:
        time.sleep(0.01)
    print("ready", flush=True)
    sys.stdin.read()
""")


def test_the_next_boot_of_a_killed_supervisors_fleet_removes_its_parcels(tmp_path):
    name = unique_name("ps")
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR, name, str(tmp_path / "never")], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(BOUND_S)
        left = parcels.count(name)
        assert left >= 2  # a worker's result parcel, and the queued unit's payload parcel
        with running(_cfg(name, "h_fail")) as f:
            assert parcels.count(name) == 0
            with pytest.raises(ValueError, match="refused 1 bytes"):
                f.submit("r", b"x").result(BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        parcels.sweep(name)


#: An executor whose call holds a large argument, killed before its teardown.
EXECUTOR = textwrap.dedent("""
    import os, signal, sys
    import fleet
    from fleet.shm import parcels
    from tests import data_calls as D
    ex = fleet.Executor(max_workers=1)
    ex.submit(D.wait_for, sys.argv[1], b"x" * (8 << 20))
    ex.submit(D.wait_for, sys.argv[1], b"y" * (8 << 20))
    print(ex.fleet.name, parcels.count(ex.fleet.name), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_the_next_executor_removes_a_killed_executors_parcels(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", EXECUTOR, str(tmp_path / "never")], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    name, made = proc.stdout.readline().split()
    assert proc.wait(BOUND_S) == -signal.SIGKILL
    try:
        assert int(made) == 2 and parcels.count(name) == 2
        with fleet.Executor(max_workers=1) as ex:
            assert ex.submit(pow, 2, 5).result(BOUND_S) == 32
            assert parcels.count(name) == 0
    finally:
        parcels.sweep(name)
        for entry in os.listdir(SHM_DIR):
            if entry == f"fleet.{name}" or entry.startswith(f"fleet.{name}."):
                os.unlink(os.path.join(SHM_DIR, entry))
