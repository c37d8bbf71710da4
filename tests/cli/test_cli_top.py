"""fleetctl top, driven in a real terminal (tmux) against a real fleetd with work flowing:
the screen follows the fleet, q quits with exit 0, a 20x5 terminal draws without a
traceback, and a member of fleetd's --socket-group (uid 65534) watches it too."""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import uuid

import pytest

from fleet.cli import cmd_top, fleetctl
from fleet.rules.errors import EXIT_NOT_RUNNING
from tests.daemons import BOUND_S, REPO, Fleetd, wait_until
from tests.uids import as_nobody_argv, unused_gid

ROLES = {"sq": {"kind": "pooled", "handler": "tests.handlers:nap_whoami", "slots": 2, "peak_cpus": 1,
                "queue_bound": 100_000}}
OUTCOMES = re.compile(r"^outcomes\s+(\d+) units", re.M)


class Tmux:
    """One tmux server of its own (-L), one session running ``argv`` in a WxH pane."""

    def __init__(self, argv: list[str], width: int = 120, height: int = 40):
        self.socket = f"fleet-top-{uuid.uuid4().hex[:8]}"
        top = " ".join(shlex.quote(a) for a in ["env", f"PYTHONPATH={REPO}", *argv])
        # the shell reports the exit status on the pane (kept by remain-on-exit), where the test reads it
        command = f"sh -c {shlex.quote(top + '; echo top exited $?')}"
        self.tmux("new-session", "-d", "-s", "top", "-x", str(width), "-y", str(height), command)
        self.tmux("set-option", "-t", "top", "remain-on-exit", "on")  # keep the pane to read its exit status
        self.tmux("set-option", "-t", "top", "window-size", "manual")

    def tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, f"tmux {args}: {out.stderr}"
        return out.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top")

    def history(self) -> str:
        return self.tmux("capture-pane", "-p", "-S", "-", "-t", "top")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "top", *keys)

    def resize(self, width: int, height: int) -> None:
        self.tmux("resize-window", "-t", "top", "-x", str(width), "-y", str(height))

    def size(self) -> tuple[int, int]:
        width, height = self.tmux("display-message", "-p", "-t", "top", "#{pane_width} #{pane_height}").split()
        return int(width), int(height)

    def exit_status(self) -> int | None:
        """The command's exit status once it ended (the pane's shell prints it), else None."""
        found = re.search(r"^top exited (\d+)$", self.history(), re.M)
        return int(found.group(1)) if found else None

    def close(self) -> None:
        """Kill the server and remove its socket file (tmux leaves it behind)."""
        path = self.tmux("display-message", "-p", "#{socket_path}").strip()
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@contextlib.contextmanager
def work_flowing(d: Fleetd):
    """A client submitting short units to ``d`` until the block ends."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def feed():
        try:
            with d.connect() as client:
                while not stop.is_set():
                    futures = [client.submit("sq", 0.02) for _ in range(8)]
                    for f in futures:
                        f.result(BOUND_S)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=feed, name="feed", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(BOUND_S)
    assert errors == []


def outcomes_on(screen: str) -> int | None:
    found = OUTCOMES.search(screen)
    return int(found.group(1)) if found else None


def watch(tmux: Tmux, fleet: str) -> None:
    """The live view follows the fleet: two captures apart, more outcomes; then 20x5
    draws without a traceback, a full size again draws everything, and q quits, exit 0."""
    first = wait_until(lambda: outcomes_on(tmux.screen()), f"top's outcomes line for {fleet}")
    later = wait_until(lambda: (n := outcomes_on(tmux.screen())) and n > first and n, "the outcomes to grow")
    assert later > first
    screen = tmux.screen()
    for section in (f"fleet {fleet}  running", "posture   ", "slots     2: Idle", "sq ", "bulkheads", "leases"):
        assert section in screen, screen

    tmux.resize(20, 5)
    wait_until(lambda: tmux.size() == (20, 5), "the pane to be 20x5")
    time.sleep(0.5)  # a few refreshes at that size
    small = tmux.screen()
    assert small.startswith("fleet ") and "Traceback" not in small, small
    assert len(small.rstrip("\n").splitlines()) <= 5 and max(len(line) for line in small.splitlines()) <= 20
    assert tmux.exit_status() is None, "top died on a small terminal"
    tmux.resize(120, 40)
    wait_until(lambda: "leases" in tmux.screen(), "the full-size redraw")

    tmux.keys("q")
    wait_until(lambda: tmux.exit_status() is not None, "top to quit")
    assert tmux.exit_status() == 0 and "Traceback" not in tmux.history(), tmux.history()


def test_top_follows_a_fleet_with_work_flowing_and_q_quits(fleet_name):
    with Fleetd(fleet_name, ROLES) as d, work_flowing(d):
        tmux = Tmux([sys.executable, "-m", "fleet.cli.fleetctl", "--name", d.name, "top", "--interval", "0.2"])
        try:
            watch(tmux, d.name)
        finally:
            tmux.close()


@pytest.mark.root
def test_a_socket_group_member_watches_read_only(fleet_name):
    gid = unused_gid()
    with Fleetd(fleet_name, ROLES, args=("--socket-group", str(gid))) as d, work_flowing(d):
        argv = [sys.executable, "-m", "fleet.cli.fleetctl", "--name", d.name, "top", "--interval", "0.2"]
        tmux = Tmux(as_nobody_argv(argv, groups=(gid,)))
        try:
            watch(tmux, d.name)
        finally:
            tmux.close()


def test_a_fleet_that_is_not_running_is_refused_before_the_screen_is_taken(fleet_name, capsys):
    assert fleetctl.main(["top", "--name", fleet_name]) == EXIT_NOT_RUNNING
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and f"/dev/shm/fleet.{fleet_name}" in err


def test_once_prints_one_frame_with_rates(fleet_name, capsys):
    with Fleetd(fleet_name, ROLES) as d, work_flowing(d):
        wait_until(lambda: d.ctl_json("status")["ledger"]["solved"] > 0, "the first outcome")
        assert fleetctl.main(["top", "--name", d.name, "--once", "--interval", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"fleet {d.name}  running") and re.search(r"\d+\.\d outcomes/s", out), out
    (row,) = [line for line in out.splitlines() if line.startswith("  sq ")]
    assert float(row.split()[-1]) > 0, row


# --- the frame (pure) ---------------------------------------------------------------------------


def _doc(done: int, solved: int, boot="b1", role="sq", state="Running"):
    census = [{"slot": 0, "state": state, "role": role, "last_role": "sq", "key": None, "unit": 7, "pid": 42,
               "done": done}]
    return {"fleet": "f", "stale": False, "closing": False, "creator_pid": 1, "uptime_s": 5.0, "boot_id": boot,
            "ledger": {"solved": solved, "failed": 0, "suppressed": 0, "inflight": 1,
                       "items": {"submitted": 64 * (solved + 1), "solved": 64 * solved, "suppressed": 0, "failed": 0,
                                 "inflight": 64}},
            "posture": {"state": "Nominal", "cause": "none", "dwell_s": 5.0, "enter_count": 0, "cordoned_s": 0.0,
                        "suppressed": 0},
            "census": census, "queues": [{"name": "sq", "kind": "pooled", "in_use": 1, "slot_cap": 2,
                                          "queue_depth": 3, "queue_bound": 10}],
            "bulkheads": [], "torn": []}


def _role_rate(lines):
    (row,) = [line for line in lines if line.startswith("  sq ")]
    return row.split()[-1]


def test_rates_are_outcomes_between_two_snapshots_per_second():
    lines = cmd_top.frame(_doc(30, 30), _doc(10, 10), 2.0, wall_s=0)
    assert _role_rate(lines) == "10.0" and "10.0 outcomes/s" in lines[1]
    assert lines[1].startswith("outcomes  30 units (1,920 items): solved 30  failed 0  suppressed 0  in flight 1")
    # an idle slot's units count for the role it last served
    assert _role_rate(cmd_top.frame(_doc(30, 30, role=None, state="Idle"), _doc(10, 10), 2.0, wall_s=0)) == "10.0"


def test_no_rate_across_a_restart_or_without_a_previous_snapshot():
    assert _role_rate(cmd_top.frame(_doc(3, 3, boot="b2"), _doc(10, 10), 2.0, wall_s=0)) == "-"
    assert _role_rate(cmd_top.frame(_doc(3, 3), None, None, wall_s=0)) == "-"


def test_a_fleet_that_stopped_while_watched_says_so():
    lines = cmd_top.frame(None, _doc(1, 1), 1.0, "fleet 'f' is not running (no table /dev/shm/fleet.f)", wall_s=0)
    assert lines[1] == "NOT RUNNING: fleet 'f' is not running (no table /dev/shm/fleet.f)"
