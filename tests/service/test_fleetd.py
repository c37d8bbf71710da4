"""fleetd as a process: started for real, driven only through its socket, fleetctl and signals.

Each test runs its own fleetd (unique name, its own runtime dir and NOTIFY_SOCKET);
whatever it started is killed and its segments unlinked even when the test fails.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import fleet
from fleet.cli import fleetctl
from fleet.service.control import ControlClient, PermissionDenied
from fleet.rules.errors import (EXIT_CONFIG, EXIT_NO_PERMISSION, EXIT_NOT_RUNNING, EXIT_TABLE_IN_USE, EXIT_TIMED_OUT,
                                EXIT_USAGE)
from tests.daemons import (REPO, BOUND_S, Fleetd, _reap, alive, idle_connections, outcome_of, remove_segments, running_slot,
                           segments, wait_until)
from tests.fleets import role
from tests.uids import as_nobody

NOBODY = 65534


def roles(**extra):
    return {"sq": role("square", slots=2), "hang": role("hang", slots=2), **extra}


@pytest.fixture
def fleetd(fleet_name):
    with Fleetd(fleet_name, roles()) as d:
        yield d


# ---------------------------------------------------------------- status, posture, drain


def test_fleetctl_status_reads_the_running_daemon(fleetd):
    doc = fleetd.ctl_json("status")
    assert doc["fleet"] == fleetd.name and doc["alive"] and not doc["stale"]
    assert doc["mode"] == "service" and doc["creator_pid"] == fleetd.proc.pid
    assert doc["socket"] == fleetd.socket_path
    assert {q["name"] for q in doc["queues"]} == {"sq", "hang"}
    human = fleetd.ctl("status")
    assert human.returncode == 0 and f"fleet {fleetd.name}" in human.stdout and "running" in human.stdout
    # the status op answers the same table, plus the daemon's own view
    with ControlClient(doc["socket"]) as c:
        over_socket = c.call("status")
    assert over_socket["creator_pid"] == fleetd.proc.pid and over_socket["daemon"]["pid"] == fleetd.proc.pid


def test_posture_set_valid_invalid_empty_and_unknown_key(fleetd):
    before = fleetd.ctl_json("posture", "show")["policy"]
    ok = fleetd.ctl("posture", "set", "cordon_enter_events=7", "cordon_duty_percent=3.5", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["policy"]["cordon_enter_events"] == 7
    after = fleetd.ctl_json("posture", "show")["policy"]
    assert after == {**before, "cordon_enter_events": 7, "cordon_duty_percent": 3.5}

    bad = fleetd.ctl("posture", "set", "cordon_enter_events=0", "cordon_duty_percent=4")
    assert bad.returncode == EXIT_CONFIG
    assert "PostureRetuneError" in bad.stderr and "cordon_enter_events" in bad.stderr
    empty = fleetd.ctl("posture", "set")
    assert empty.returncode == EXIT_USAGE and "patch is empty" in empty.stderr
    unknown = fleetd.ctl("posture", "set", "cordon_nonsense=1")
    assert unknown.returncode == EXIT_USAGE and "cordon_nonsense" in unknown.stderr
    # none of the refused patches changed anything, not even their valid keys
    assert fleetd.ctl_json("posture", "show")["policy"] == after


def test_a_worker_death_cordons_until_fleetctl_posture_release(fleet_name):
    with Fleetd(fleet_name, roles(), posture={"cordon_exit_clean_ms": 50}) as d:
        with d.connect() as client:
            assert client.submit("sq", 3).result(BOUND_S) == 9
            pid = next(row["pid"] for row in client.status()["census"] if row.get("pid"))
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: d.ctl_json("posture", "show")["causes"] == ["lane-death"], "the lane-death cordon")
            assert d.ctl_json("status")["posture"]["cause"] == "lane-death"
            bad = d.ctl("posture", "release", "lane_death")
            assert bad.returncode == EXIT_USAGE and "invalid choice" in bad.stderr
            released = d.ctl("posture", "release", "lane-death")
            assert released.returncode == 0 and released.stdout.startswith("lane-death: released"), released.stderr
            wait_until(lambda: d.ctl_json("posture", "show")["posture"] == "Nominal", "Nominal after the release")
            again = d.ctl("posture", "release", "lane-death")
            assert again.returncode == 0 and again.stdout.startswith("lane-death: was not held")
            assert client.submit("sq", 4).result(BOUND_S) == 16


def gated_roles():
    # One slot, nothing sent ahead: a unit held running on its gate file keeps the next one queued.
    return roles(gate=role("wait_for_file", slots=1, io_bound=True, peak_cpus=0, lookahead=0))


def queue_of(d, name: str) -> dict:
    return {q["name"]: q for q in d.ctl_json("status")["queues"]}[name]


def test_fleetctl_drain_shows_refuses_lets_queued_units_finish_waits_and_resumes(fleet_name):
    with Fleetd(fleet_name, gated_roles()) as d, d.connect() as client:
        gate = os.path.join(d.dir, "go")
        try:
            _drain_through_fleetctl(d, client, gate)
        finally:
            open(gate, "a").close()  # never leave the with block waiting on a held unit


def _drain_through_fleetctl(d, client, gate):
    fleet_name = d.name
    first = client.submit("gate", (gate, 2))
    wait_until(lambda: queue_of(d, "gate")["in_use"] == 1, "the first unit to run")
    queued = client.submit("gate", (None, 3))
    wait_until(lambda: queue_of(d, "gate")["queue_depth"] == 1, "the second unit to wait in the queue")

    drained = d.ctl("drain")
    assert drained.returncode == 0, drained.stderr
    assert drained.stdout.startswith("draining since ") and "2 unit(s) queued or in flight" in drained.stdout
    # status (JSON and text), top and fleetd's log show the drain and since when
    doc = d.ctl_json("status")
    since = doc["draining"]["since_utc"]
    assert since.endswith("Z") and client.status()["daemon"]["draining"] is True
    assert f"DRAINING since {since}" in d.ctl("status").stdout
    top = d.ctl("top", "--once")
    assert top.returncode == 0 and f"DRAINING since {since}" in top.stdout.splitlines()[0]
    wait_until(lambda: "INFO fleet.runtime.loop: fleet %s: draining" % fleet_name in d.stderr(), "the drain logged")

    # a new submit is refused, typed and retryable, through fleetd
    with pytest.raises(fleet.Draining) as refused:
        client.submit("sq", 2).result(BOUND_S)  # the refusal comes on the unit's future
    assert isinstance(refused.value, fleet.SubmitRefused) and refused.value.retryable
    assert "draining since" in str(refused.value)
    # --wait gives up at its --timeout while a unit still runs, with its own exit code
    timed = d.ctl("drain", "--wait", "--timeout", "0.3")
    assert timed.returncode == EXIT_TIMED_OUT and "--timeout passed" in timed.stdout, timed
    # --wait returns once the running and the queued unit have finished
    waiter = subprocess.Popen([sys.executable, "-m", "fleet.cli.fleetctl", "drain", "--wait", "--name", d.name],
                              env=d.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        assert waiter.poll() is None  # a unit still holds its gate: nothing can have drained
        open(gate, "w").close()
        out, err = waiter.communicate(timeout=BOUND_S)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 0 and "drained: nothing queued or in flight" in out, (out, err)
    assert first.result(BOUND_S) == 4 and queued.result(BOUND_S) == 9
    assert client.drain_state()["owed"] == 0

    resumed = d.ctl("resume")
    assert resumed.returncode == 0 and resumed.stdout.startswith("resumed"), resumed.stderr
    assert d.ctl_json("status")["draining"] is None and "DRAINING" not in d.ctl("status").stdout
    wait_until(lambda: "INFO fleet.runtime.loop: fleet %s: resumed" % fleet_name in d.stderr(), "the resume logged")
    assert client.submit("sq", 3).result(BOUND_S) == 9
    ledger = client.ledger()
    assert (ledger["submitted"], ledger["solved"]) == (3, 3)  # the refused submit was never queued


def test_leaving_a_clients_with_block_says_what_it_waits_for(fleet_name, caplog):
    with Fleetd(fleet_name, gated_roles()) as d:
        gate = os.path.join(d.dir, "go")

        def open_gate_once_told():
            # Lets the unit finish once the client has said it waits (or after a bound: the
            # test then fails on the missing line instead of hanging).
            deadline = time.monotonic() + BOUND_S
            while time.monotonic() < deadline and not any("waiting for 1 unit(s)" in r.getMessage()
                                                          for r in caplog.records):
                time.sleep(0.02)
            open(gate, "w").close()

        helper = threading.Thread(target=open_gate_once_told)
        with caplog.at_level(logging.WARNING, logger="fleet.api.client"):
            with d.connect() as client:
                fut = client.submit("gate", (gate, 7))
                helper.start()
            helper.join(BOUND_S)
        assert fut.result(0) == 49
        (line,) = [r.getMessage() for r in caplog.records if r.name == "fleet.api.client"]
        assert f"client of fleet {fleet_name!r} closing: waiting for 1 unit(s) still owed" in line


def test_commands_exit_not_running_for_an_unknown_fleet(fleetd):
    for argv in (["posture", "show"], ["drain"], ["resume"], ["status"]):
        out = subprocess.run([sys.executable, "-m", "fleet.cli.fleetctl", *argv, "--name", fleetd.name + "-x"],
                             env=fleetd.env, capture_output=True, text=True, timeout=BOUND_S)
        assert out.returncode == EXIT_NOT_RUNNING, (argv, out.stderr)


# ---------------------------------------------------------------- signals


def test_sigterm_drains_in_flight_units_fails_queued_ones_and_exits_0(fleet_name):
    with Fleetd(fleet_name, roles(), args=("--grace", "0.2")) as d:
        client = d.connect()
        long = [client.submit("hang", 1.5) for _ in range(2)]
        queued = [client.submit("hang", 1.5) for _ in range(6)]
        # every unit admitted first (its reply: a unit id): a submit still on its way when
        # the signal lands is refused FleetClosed, owed nothing, which is not this test's case
        assert all(isinstance(f.unit_id, int) for f in long + queued)
        wait_until(lambda: running_slot(client), "a unit to be running")
        pids = d.descendants()
        d.signal(signal.SIGTERM)
        assert d.wait() == 0, d.stderr()
        outcomes = [outcome_of(f) for f in long + queued]
        # every unit has exactly one outcome: the ones in flight finished, the rest
        # failed Shutdown once the grace ran out
        assert outcomes[0] == ("solved", "woke")
        assert ("failed", "Shutdown") in outcomes
        assert set(outcomes) <= {("solved", "woke"), ("failed", "Shutdown")}
        assert not segments(fleet_name)
        wait_until(lambda: not alive(pids), "zygote and workers to exit")
        assert d.notify.with_key("STOPPING", "1")
        client.close()


def test_sigint_stops_fast_and_everything_owed_fails_shutdown(fleet_name):
    with Fleetd(fleet_name, roles()) as d:
        client = d.connect()
        futs = [client.submit("hang", 3600) for _ in range(4)]
        assert all(isinstance(f.unit_id, int) for f in futs)  # every one admitted (owed) before the signal
        wait_until(lambda: running_slot(client), "a unit to be running")
        d.signal(signal.SIGINT)
        assert d.wait() == 0, d.stderr()
        assert [outcome_of(f) for f in futs] == [("failed", "Shutdown")] * 4
        assert not segments(fleet_name)
        client.close()


def test_sigkill_leaves_no_orphans_and_a_new_fleetd_reclaims_the_name(fleet_name):
    first = Fleetd(fleet_name, roles())
    try:
        first.start()
        client = first.connect()
        client.submit("hang", 3600)
        wait_until(lambda: running_slot(client), "a unit to be running")
        children = first.descendants()
        assert len(children) >= 2  # the zygote and at least one worker
        first.signal(signal.SIGKILL)
        first.wait()
        wait_until(lambda: not alive(children), "the zygote and workers to die with fleetd")
        client.close()
        assert segments(fleet_name)  # the killed daemon's table is still there, stale
        with Fleetd(fleet_name, roles(), base_dir=first.dir) as second:
            doc = second.ctl_json("status")
            assert doc["creator_pid"] == second.proc.pid and doc["alive"]
            with second.connect() as c2:
                assert c2.submit("sq", 9).result(BOUND_S) == 81
    finally:
        first.cleanup()


def test_a_second_fleetd_with_the_same_name_refuses_naming_the_pid(fleetd):
    second = subprocess.run(
        [sys.executable, "-m", "fleet.cli.fleetd", "--config", fleetd.config_path, "--name", fleetd.name],
        env={k: v for k, v in fleetd.env.items() if k != "NOTIFY_SOCKET"},
        capture_output=True, text=True, timeout=BOUND_S,
    )
    assert second.returncode == EXIT_TABLE_IN_USE
    lines = second.stderr.strip().splitlines()
    assert lines[-1].startswith("fleetd: TableInUse:") and f"pid {fleetd.proc.pid}" in lines[-1]
    # the first one still serves
    assert fleetd.ctl_json("status")["creator_pid"] == fleetd.proc.pid


def test_a_bad_config_refuses_boot_with_its_exit_code(fleet_name):
    d = Fleetd(fleet_name, {"sq": role("square", kind="sideways")})
    try:
        d.start(wait_ready=False)
        assert d.wait() == EXIT_CONFIG
        err = d.stderr().strip().splitlines()
        assert err[-1].startswith("fleetd: ConfigError: roles.sq.kind")
        assert not segments(fleet_name) and not d.notify.with_key("READY")
    finally:
        d.cleanup()


def test_sighup_applies_a_new_posture_and_an_invalid_file_changes_nothing(fleet_name):
    with Fleetd(fleet_name, roles(), posture={"cordon_enter_events": 2}) as d:
        d.write_config({**roles(), "sq": role("square", slots=3)}, posture={"cordon_enter_events": 5})
        d.signal(signal.SIGHUP)
        d.wait_ready(count=2)  # READY=1 again once the reload is done
        assert d.notify.with_key("RELOADING", "1")
        assert d.ctl_json("posture", "show")["policy"]["cordon_enter_events"] == 5
        assert "needs a restart to change: roles" in d.stderr()

        d.write_config(roles(), posture={"cordon_enter_events": -1})
        d.signal(signal.SIGHUP)
        d.wait_ready(count=3)
        assert "reload refused, nothing changed: ConfigError: posture.cordon_enter_events" in d.stderr()
        assert d.ctl_json("posture", "show")["policy"]["cordon_enter_events"] == 5
        with d.connect() as client:  # and it still serves
            assert client.submit("sq", 4).result(BOUND_S) == 16


def test_sighup_applies_new_queue_bounds_live(fleet_name):
    with Fleetd(fleet_name, gated_roles()) as d, d.connect() as client:
        gate = os.path.join(d.dir, "go")
        d.write_config({**gated_roles(), "gate": role("wait_for_file", slots=1, io_bound=True, peak_cpus=0,
                                                      lookahead=0, queue_bound=1)})
        d.signal(signal.SIGHUP)
        d.wait_ready(count=2)
        assert "applied roles.*.queue_bound" in d.stderr()
        try:
            blocker = client.submit("gate", (gate, 1))  # holds the one slot: nothing leaves the queue now
            wait_until(lambda: queue_of(d, "gate")["in_use"] == 1, "the blocker to run")
            first = client.submit("gate", (None, 2))
            with pytest.raises(fleet.QueueFull, match="1 units waiting"):
                client.submit("gate", (None, 3)).result(BOUND_S)
        finally:
            open(gate, "a").close()
        assert blocker.result(BOUND_S) == 1 and first.result(BOUND_S) == 4


# ---------------------------------------------------------------- sd_notify


def test_sd_notify_ready_status_watchdog_and_stopping(fleet_name):
    with Fleetd(fleet_name, roles(), env={"WATCHDOG_USEC": "200000"}) as d:
        ready = d.notify.with_key("READY", "1")[0]
        assert "binding" in ready["STATUS"] and "seat(s)" in ready["STATUS"] and "submitted" in ready["STATUS"]
        d.notify.wait_for("WATCHDOG", "1", count=3)  # every 0.1 s: several by now
        with d.connect() as client:
            client.submit("sq", 3).result(BOUND_S)
        d.notify.wait_for("STATUS")
        d.signal(signal.SIGTERM)
        assert d.wait() == 0
        d.notify.wait_for("STOPPING", "1")
        assert "stopping" in d.notify.with_key("STATUS")[-1]["STATUS"]


# ---------------------------------------------------------------- who may do what


def test_an_unprivileged_uid_reads_but_may_not_mutate(fleet_name):
    with Fleetd(fleet_name, roles(), args=("--socket-group", str(NOBODY))) as d:
        def child():
            seen = {}
            client = d.connect()
            seen["status_pid"] = client.status()["creator_pid"]
            seen["ledger"] = client.ledger()["submitted"]
            for op, call in (("submit", lambda: client.submit("sq", 2).result(BOUND_S)),
                             ("posture_set", lambda: client.posture_set(cordon_enter_events=9)),
                             ("drain", lambda: client._call("drain"))):
                try:
                    call()
                    seen[op] = "allowed"
                except PermissionDenied as exc:
                    seen[op] = [type(exc).__name__, exc.exit_code, str(exc)]
            client.close()
            # the CLI too (in this process: uid 65534 cannot exec root's interpreter)
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                seen["cli_drain"] = [fleetctl.main(["drain", "--name", d.name]), err.getvalue()]
            return seen

        os.environ["RUNTIME_DIRECTORY"] = d.runtime_dir  # for the forked child's fleetctl
        try:
            seen = as_nobody(child)
        finally:
            del os.environ["RUNTIME_DIRECTORY"]
        assert seen.get("status_pid") == d.proc.pid, seen
        assert seen["ledger"] == 0
        for op in ("submit", "posture_set", "drain"):
            assert seen[op][:2] == ["PermissionDenied", EXIT_NO_PERMISSION], (op, seen[op])
            assert "uid 65534" in seen[op][2]
        code, err = seen["cli_drain"]
        assert code == EXIT_NO_PERMISSION and "PermissionDenied" in err and "uid 65534" in err
        # nothing changed: the owner still submits and the posture is the default
        assert d.ctl_json("posture", "show")["policy"]["cordon_enter_events"] != 9
        assert d.ctl_json("status")["ledger"]["submitted"] == 0
        with d.connect() as client:
            assert client.submit("sq", 5).result(BOUND_S) == 25


# ---------------------------------------------------------------- a crowded control socket


def test_the_owner_is_served_with_1000_idle_connections_open(fleet_name):
    # 1,000 connections that never send a byte from uid 65534 (in the socket group)
    # and 1,000 more from the owner: posture show and submit still answer the owner.
    # (The holders raise their own RLIMIT_NOFILE; fleetd needs no more descriptors than
    # its connection cap, so its limit is left as it is.)
    with Fleetd(fleet_name, roles(), args=("--socket-group", str(NOBODY))) as d:
        path = d.socket_path
        with idle_connections(path, 1000, NOBODY, NOBODY) as theirs, idle_connections(path, 1000) as ours:
            assert (theirs, ours) == (1000, 1000)
            shown = d.ctl("posture", "show", "--json")
            assert shown.returncode == 0, shown.stderr
            assert "cordon_enter_events" in json.loads(shown.stdout)["policy"]
            with d.connect() as client:
                assert client.submit("sq", 9).result(BOUND_S) == 81
        # the pressure was logged, in a few lines rather than one per connection
        lines = [line for line in d.stderr().splitlines() if "under pressure" in line]
        assert 1 <= len(lines) <= 20, lines
        assert "uid 65534" in "\n".join(lines)


_DIES_WITHOUT_TEARDOWN = """
import json, os, sys
from tests.daemons import Fleetd
from tests.fleets import role
d = Fleetd(sys.argv[1], {"hang": role("hang", slots=1)}, base_dir=sys.argv[2]).start()
# In flight or still queued when the process dies, whichever the race gives: a unit of 2 s, so
# the drain ends either way (in-flight units finish; one of an hour held the test to its bound)
d.connect().submit("hang", 2)
print(json.dumps([d.proc.pid, sorted(d.descendants())]), flush=True)
os._exit(1)  # as pytest-timeout's thread method ends a test process: no teardown runs
"""


def test_a_test_process_that_dies_without_teardown_takes_its_fleetd_along(fleet_name):
    base = tempfile.mkdtemp(prefix="fd-", dir="/tmp")  # short: AF_UNIX paths <= 107 bytes
    daemon = children = None
    try:
        proc = subprocess.run([sys.executable, "-c", _DIES_WITHOUT_TEARDOWN, fleet_name, base],
                              capture_output=True, text=True, timeout=BOUND_S, cwd=REPO)
        assert proc.stdout, proc.stderr
        daemon, children = json.loads(proc.stdout.splitlines()[-1])
        # fleetd got SIGTERM (its parent-death signal): it drains, reaps its workers and
        # unlinks its segments, so a killed test run leaves nothing behind.
        wait_until(lambda: not alive([daemon, *children]), "fleetd and its workers to exit")
        assert not segments(fleet_name)
    finally:
        if daemon is not None:
            _reap([daemon, *children])
        remove_segments(fleet_name)
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------- where fleetd's threads run


def _threads_by_name(pid: int) -> dict:
    out: dict = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                out.setdefault(f.read().strip(), []).append(int(tid))
    return out


def test_the_control_thread_runs_on_the_supervisor_loops_cpus_off_the_workers_seats(fleet_name):
    # One worker of one core on a host of two or more: the budget gives the loop CPUs of its
    # own, and fleetd's control thread belongs there with it, not on the worker's core.
    if len(os.sched_getaffinity(0)) < 2:
        from tests import require
        require.lacking("needs two CPUs: one for the worker's seat, one for the supervisor's loop")
    with Fleetd(fleet_name, {"sq": role("square", slots=1)}) as d, d.connect() as client:
        assert client.submit("sq", 3).result(BOUND_S) == 9
        workers = [row["pid"] for row in client.status()["census"] if row.get("pid")]
        pid = d.proc.pid
        names = _threads_by_name(pid)
        (loop,), (control,) = names["fleet-loop"], names["fleet-control"]
        loop_cpus = os.sched_getaffinity(loop)
        assert loop_cpus != os.sched_getaffinity(pid), "the loop is pinned to the CPUs its budget reserves"
        wait_until(lambda: os.sched_getaffinity(control) == loop_cpus, "the control thread on the loop's CPUs")
        worker_cpus = set().union(*(os.sched_getaffinity(w) for w in workers))
        assert workers and not worker_cpus & loop_cpus
        assert os.sched_getaffinity(pid) == os.sched_getaffinity(0)  # the process's own mask stays whole


# ---------------------------------------------------------------- fleetd's limit on open files


def _nofile(proc) -> tuple:
    import psutil

    return tuple(proc.rlimit(psutil.RLIMIT_NOFILE))


def _fork_server(daemon):
    import psutil

    servers = [p for p in psutil.Process(daemon.proc.pid).children() if p.name() == "fleet-forksrv"]
    return servers[0] if len(servers) == 1 else None


def test_fleetd_raises_its_open_files_limit_and_the_code_it_runs_keeps_the_one_it_found(fleet_name):
    # fleetd holds a descriptor per connection and per large value in flight: the soft limit
    # a service starts with (1024) is raised to the hard one; its fork server and workers,
    # which run user code (select() fails past 1024), keep the soft limit fleetd found.
    with Fleetd(fleet_name, roles(), nofile=(256, 4096)) as d:
        import psutil

        assert _nofile(psutil.Process(d.proc.pid)) == (4096, 4096)
        assert "open files: soft limit raised from 256 to 4096" in d.stderr()
        server = _fork_server(d)
        assert server is not None
        workers = server.children()
        assert workers and {_nofile(p) for p in [server, *workers]} == {(256, 4096)}
        with d.connect() as client:
            assert client.submit("sq", 7).result(BOUND_S) == 49
        # a fork server started again, after the first was killed, runs with it too
        server.kill()
        wait_until(lambda: (s := _fork_server(d)) is not None and s.pid != server.pid and s.children(),
                   "a new fork server and its workers")
        again = _fork_server(d)
        assert {_nofile(p) for p in [again, *again.children()]} == {(256, 4096)}
        with d.connect() as client:
            assert client.submit("sq", 8).result(BOUND_S) == 64


def test_fleetd_leaves_a_limit_already_at_its_hard_one(fleet_name):
    with Fleetd(fleet_name, roles(), nofile=(4096, 4096)) as d:
        import psutil

        server = _fork_server(d)
        assert _nofile(psutil.Process(d.proc.pid)) == (4096, 4096) == _nofile(server)
        assert "soft limit raised" not in d.stderr()
