"""sd_notify messages received on real datagram sockets bound by the test."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid

import pytest

from fleet.service import sdnotify
from fleet.service.sdnotify import NotifyError, WatchdogSchedule


class Receiver:
    """A bound AF_UNIX datagram socket standing in for the service manager."""

    def __init__(self, address: str, env_value: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(30)
        self.env = {"NOTIFY_SOCKET": env_value}

    def message(self) -> list[str]:
        return self.sock.recv(65536).decode().split("\n")

    def nothing_pending(self) -> bool:
        self.sock.setblocking(False)
        try:
            self.sock.recv(65536)
        except BlockingIOError:
            return True
        finally:
            self.sock.settimeout(30)
        return False


@pytest.fixture
def path_receiver():
    tmp = tempfile.mkdtemp(prefix="sdn-", dir="/tmp")
    path = os.path.join(tmp, "notify")
    receiver = Receiver(path, path)
    try:
        yield receiver
    finally:
        receiver.sock.close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def abstract_receiver():
    name = f"fleet-test-{uuid.uuid4().hex}"  # unique per test: no clash under xdist
    receiver = Receiver("\0" + name, "@" + name)
    try:
        yield receiver
    finally:
        receiver.sock.close()


@pytest.fixture(params=["path", "abstract"])
def receiver(request):
    return request.getfixturevalue(f"{request.param}_receiver")


def test_ready_with_status(receiver):
    assert sdnotify.ready("3 workers up", env=receiver.env) is True
    assert receiver.message() == ["READY=1", "STATUS=3 workers up"]


@pytest.mark.parametrize(
    ("send", "expected"),
    [
        (lambda env: sdnotify.ready(env=env), ["READY=1"]),
        (lambda env: sdnotify.status("draining", env=env), ["STATUS=draining"]),
        (lambda env: sdnotify.watchdog(env=env), ["WATCHDOG=1"]),
        (lambda env: sdnotify.stopping(env=env), ["STOPPING=1"]),
        (lambda env: sdnotify.reloading(env=env), ["RELOADING=1"]),
        (lambda env: sdnotify.extend_timeout(1.5, env=env), ["EXTEND_TIMEOUT_USEC=1500000"]),
    ],
)
def test_each_message(receiver, send, expected):
    assert send(receiver.env) is True
    assert receiver.message() == expected


def test_status_text_cannot_inject_fields(receiver):
    sdnotify.status("a\nREADY=1\r\nb", env=receiver.env)
    assert receiver.message() == ["STATUS=a READY=1 b"]


def test_unset_notify_socket_is_a_no_op(receiver):
    assert sdnotify.ready(env={}) is False
    assert sdnotify.watchdog(env={"NOTIFY_SOCKET": ""}) is False
    assert receiver.nothing_pending()


def test_a_process_reads_notify_socket_from_its_environment(receiver):
    env = {**os.environ, **receiver.env}
    code = "from fleet.service import sdnotify; sdnotify.ready('up'); sdnotify.watchdog(); sdnotify.stopping()"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    assert receiver.message() == ["READY=1", "STATUS=up"]
    assert receiver.message() == ["WATCHDOG=1"]
    assert receiver.message() == ["STOPPING=1"]


@pytest.mark.parametrize("value", ["relative/path", "vsock:2:1"])
def test_malformed_notify_socket_is_a_typed_error(value):
    with pytest.raises(NotifyError, match="NOTIFY_SOCKET"):
        sdnotify.ready(env={"NOTIFY_SOCKET": value})


def test_unreachable_notify_socket_names_it():
    missing = f"/tmp/fleet-no-such-{uuid.uuid4().hex}"
    with pytest.raises(NotifyError, match=missing):
        sdnotify.ready(env={"NOTIFY_SOCKET": missing})


def test_extend_timeout_rejects_non_positive():
    with pytest.raises(NotifyError):
        sdnotify.extend_timeout(0, env={})


# --------------------------------------------------------------------- watchdog


def test_watchdog_interval_is_half_the_period():
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "1000"}) == 0.0005


def test_watchdog_interval_none_when_unset_or_meant_for_another_pid():
    assert sdnotify.watchdog_interval({}) is None
    env = {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}
    assert sdnotify.watchdog_interval(env, pid=4243) is None
    assert sdnotify.watchdog_interval(env, pid=4242) == 15.0
    own = {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}
    assert sdnotify.watchdog_interval(own) == 15.0


@pytest.mark.parametrize(
    "env",
    [
        {"WATCHDOG_USEC": "soon"},
        {"WATCHDOG_USEC": "0"},
        {"WATCHDOG_USEC": "-5"},
        {"WATCHDOG_USEC": "100", "WATCHDOG_PID": "x"},
    ],
)
def test_watchdog_interval_rejects_malformed_values(env):
    with pytest.raises(NotifyError, match="WATCHDOG_"):
        sdnotify.watchdog_interval(env, pid=1)


def test_schedule_first_ping_is_due_at_once():
    schedule = WatchdogSchedule(15.0, now=100.0)
    assert schedule.due(100.0)
    assert schedule.remaining(100.0) == 0.0


def test_schedule_next_ping_one_interval_after_the_last():
    schedule = WatchdogSchedule(15.0, now=100.0)
    schedule.pinged(101.0)
    assert not schedule.due(115.9)
    assert schedule.remaining(110.0) == 6.0
    assert schedule.due(116.0)


def test_schedule_after_a_stall_resumes_from_the_late_ping():
    schedule = WatchdogSchedule(10.0, now=0.0)
    schedule.pinged(0.0)
    assert schedule.due(95.0) and schedule.remaining(95.0) == 0.0
    schedule.pinged(95.0)  # one ping, not nine to catch up
    assert not schedule.due(104.0)
    assert schedule.due(105.0)


@pytest.mark.parametrize("interval", [0, -1.0])
def test_schedule_rejects_non_positive_interval(interval):
    with pytest.raises(NotifyError):
        WatchdogSchedule(interval, now=0.0)
