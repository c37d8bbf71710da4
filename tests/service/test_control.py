"""The control protocol against a real server on a real Unix socket.

Every server runs with a `CallQueue` drained by an owner thread, as in fleetd, so
the tests also show that ops execute on the thread that owns the state.
"""
from __future__ import annotations

import base64
import json
import os
import pickle
import select
import shutil
import socket
import stat
import tempfile
import threading
import time
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.service import control as c
from fleet.rules.errors import EXIT_CONFIG, EXIT_NO_PERMISSION, EXIT_NOT_RUNNING, EXIT_USAGE, ConfigError
from tests.daemons import BOUND_S, idle_connections, wait_until
from tests import require

NOBODY = 65534
NOGROUP = 65534
INITIAL_POLICY = {key: 10 for key in sorted(c.POSTURE_KEYS)}


class Handler:
    """A small real handler: keeps state, records which method ran on which thread."""

    def __init__(self):
        self.calls: list[tuple[str, object]] = []
        self.threads: set[int] = set()
        self.policy = dict(INITIAL_POLICY)
        self.draining = False
        self.units: list[dict] = []

    def _record(self, name, arg=None):
        self.calls.append((name, arg))
        self.threads.add(threading.get_ident())

    def status(self):
        self._record("status")
        return {"draining": self.draining, "units": len(self.units)}

    def posture_show(self):
        self._record("posture_show")
        return {"state": "Nominal", "policy": self.policy}

    def posture_set(self, **patch):
        # Value validation is the handler's: all-or-nothing, typed error.
        for key, value in patch.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"posture.{key}", f"must be a non-negative integer, got {value!r}")
        self._record("posture_set", patch)
        self.policy.update(patch)
        return self.policy

    def drain(self):
        self._record("drain")
        self.draining = True
        return {"draining": True}

    def resume(self):
        self._record("resume")
        self.draining = False
        return {"draining": False}

    def submit(self, **unit):
        self._record("submit", unit)
        self.units.append(unit)
        return {"unit": len(self.units)}

    def submit_batch(self, v, token, units, ack=None, fds=False, parcels=False, stream=None):
        ids = [self.submit(**unit)["unit"] for unit in units]  # each checked, the token in it
        return {"units": ids, "errors": {}, "replayed": [], "roles": {}}

    def ledger(self):
        self._record("ledger")
        return {"submitted": len(self.units), "solved": 0, "suppressed": 0, "failed": {}}


def control_threads():
    return [t for t in threading.enumerate() if t.name.startswith("fleet-control")]


@pytest.fixture
def sockdir():
    # Short paths under /tmp: AF_UNIX paths are limited to 107 bytes and pytest's
    # tmp_path can be longer. mkdtemp makes each worker's path unique.
    path = tempfile.mkdtemp(prefix="fc-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def serving(sockdir, handler=None, *, owner=True, **server_kwargs):
    """A ControlServer whose calls run on an owner thread draining a CallQueue."""
    handler = handler or Handler()
    queue = c.CallQueue()
    path = os.path.join(sockdir, "t.sock")
    owner_thread = None
    if owner:
        def loop():
            while queue.wait():
                queue.run_pending(handler)

        owner_thread = threading.Thread(target=loop, name="test-owner")
        owner_thread.start()
    server = c.ControlServer(path, queue.submit, **server_kwargs)
    try:
        server.start()
        yield _Served(server, path, handler, queue, owner_thread)
    finally:
        server.close()
        queue.close()
        if owner_thread is not None:
            owner_thread.join()
    assert control_threads() == []
    assert not os.path.exists(path)


class _Served:
    def __init__(self, server, path, handler, queue, owner_thread):
        self.server, self.path, self.handler, self.queue = server, path, handler, queue
        self.owner_thread = owner_thread

    def client(self, **kw):
        return c.ControlClient(self.path, **kw)

    def raw(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(self.path)
        return sock


@pytest.fixture
def served(sockdir):
    with serving(sockdir) as s:
        yield s


def read_reply(sock, buf=None):
    buf = bytearray() if buf is None else buf
    while b"\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise EOFError("server closed the connection")
        buf += data
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return json.loads(line)


# ------------------------------------------------------------------- round trips


def test_read_only_ops_round_trip(served):
    with served.client() as client:
        assert client.call("ping") == {"pong": True, "pid": os.getpid()}
        assert client.call("status") == {"draining": False, "units": 0}
        assert client.call("posture_show") == {"state": "Nominal", "policy": INITIAL_POLICY}
        assert client.call("ledger")["submitted"] == 0
    assert [name for name, _ in served.handler.calls] == ["status", "posture_show", "ledger"]


def test_ops_run_on_the_owner_thread_not_a_server_thread(served):
    with served.client() as client:
        client.call("status")
        client.call("drain")
        client.call("resume")
    assert served.handler.threads == {served.owner_thread.ident}


def test_posture_set_applies_the_patch_and_echoes_the_policy(served):
    with served.client() as client:
        policy = client.call("posture_set", patch={"cordon_duty_percent": 55})
    assert policy == {**INITIAL_POLICY, "cordon_duty_percent": 55}
    assert served.handler.policy == policy


def test_posture_value_refused_by_the_daemon_is_a_typed_error_and_changes_nothing(served):
    with served.client() as client:
        with pytest.raises(c.RemoteError) as err:
            client.call("posture_set", patch={"cordon_duty_percent": 50, "cordon_enter_events": -1})
        assert client.call("ping")["pong"] is True
    assert err.value.type == "ConfigError"
    assert "posture.cordon_enter_events" in err.value.message
    assert err.value.exit_code == EXIT_CONFIG
    assert served.handler.policy == INITIAL_POLICY


def test_drain_and_resume(served):
    with served.client() as client:
        assert client.call("drain") == {"draining": True}
        assert client.call("status")["draining"] is True
        assert client.call("resume") == {"draining": False}


def test_submit_pickled_payload_reaches_the_handler_as_pickled_bytes(served):
    payload = {"rows": [1, 2, 3], "blob": b"\x00\xff"}
    with served.client() as client:
        assert client.call("submit", role="solver", payload=payload, key="bin-7", priority=3) == {"unit": 1}
    (_, unit), = served.handler.calls
    assert unit["encoding"] == "pickle"
    assert isinstance(unit["payload"], bytes) and pickle.loads(unit["payload"]) == payload
    assert (unit["role"], unit["key"], unit["priority"]) == ("solver", "bin-7", 3)
    assert (unit["lane"], unit["timeout"], unit["request_id"]) == (None, None, None)


def test_submit_json_payload_reaches_the_handler_as_json(served):
    with served.client() as client:
        client.call("submit", role="merge", payload=[1, "two"], encoding="json", timeout=2.5,
                    lane="batch", request_id="r-1")
    (_, unit), = served.handler.calls
    assert unit["payload"] == [1, "two"] and unit["encoding"] == "json"
    assert (unit["timeout"], unit["lane"], unit["request_id"]) == (2.5, "batch", "r-1")


def test_several_requests_in_one_write_are_answered_in_order(served):
    frames = b"".join(c.encode_request(op, {}, i) for i, op in enumerate(["ping", "status", "nope", "ledger"]))
    with served.raw() as sock:
        sock.sendall(frames)
        buf = bytearray()
        replies = [read_reply(sock, buf) for _ in range(4)]
    assert [r["id"] for r in replies] == [0, 1, 2, 3]
    assert [r["ok"] for r in replies] == [True, True, False, True]


# ------------------------------------------------------------------- bad requests

BAD_FRAMES = [
    (b"{not json", "MalformedRequest", "invalid JSON"),
    (b"\xff\xfe{}", "MalformedRequest", "UTF-8"),
    (b'{"op":"ping","id":NaN}', "MalformedRequest", "NaN"),
    (b"[" * 100_000, "MalformedRequest", ""),
    (b"[1,2]", "InvalidRequest", "object"),
    (b'{"op":"ping","x":1}', "InvalidRequest", "x"),
    (b'{"op":"ping","id":[1]}', "InvalidRequest", "id"),
    (b'{"args":{}}', "InvalidRequest", "op"),
    (b'{"op":"ping","args":[]}', "InvalidRequest", "args"),
    (b'{"op":"nope"}', "UnknownOp", "'nope'"),
    (b'{"op":"status","args":{"verbose":true}}', "InvalidArgs", "unknown argument(s) verbose"),
    (b'{"op":"submit","args":{"role":5,"payload":1}}', "InvalidArgs", "role must be string, got integer"),
    (b'{"op":"submit","args":{"payload":1}}', "InvalidArgs", "missing required argument role"),
    (b'{"op":"submit","args":{"role":"s","payload":1,"priority":true}}', "InvalidArgs",
     "priority must be integer, got boolean"),
    (b'{"op":"submit","args":{"role":"s","payload":"@@","encoding":"pickle"}}', "InvalidArgs", "base64"),
    (b'{"op":"submit","args":{"role":"s","payload":1,"encoding":"xml"}}', "InvalidArgs", "encoding"),
    (b'{"op":"submit","args":{"role":"s","payload":1,"timeout":0}}', "InvalidArgs", "timeout"),
    (b'{"op":"submit","args":{"role":"s","payload":1,"items":3}}', "InvalidArgs", "give chunk too"),
    (b'{"op":"submit","args":{"role":"s","payload":"gA==","encoding":"pickle","chunk":true,"items":0}}',
     "InvalidArgs", "items"),
    (b'{"op":"posture_set","args":{"patch":{}}}', "InvalidArgs", "patch is empty"),
    (b'{"op":"posture_set","args":{"patch":{"cordon_bogus":1,"cordon_duty_percent":5}}}', "InvalidArgs",
     "unknown posture key(s) cordon_bogus"),
    (b'{"op":"posture_set","args":{"patch":[1]}}', "InvalidArgs", "patch must be object"),
    (b'{"op":"posture_set","args":{}}', "InvalidArgs", "missing required argument patch"),
]


@pytest.mark.parametrize(("frame", "error_type", "needle"), BAD_FRAMES)
def test_bad_request_gets_an_error_reply_changes_nothing_and_serving_goes_on(served, frame, error_type, needle):
    with served.raw() as sock:
        sock.sendall(frame + b"\n")
        buf = bytearray()
        reply = read_reply(sock, buf)
        sock.sendall(c.encode_request("ping", {}, "after"))
        after = read_reply(sock, buf)
    assert reply["ok"] is False
    assert reply["error"]["type"] == error_type
    assert needle in reply["error"]["message"]
    assert served.handler.calls == []
    assert after == {"id": "after", "ok": True, "result": {"pong": True, "pid": os.getpid()}}


def test_error_reply_echoes_the_request_id_once_known(served):
    with served.raw() as sock:
        sock.sendall(b'{"id":7,"op":"nope"}\n')
        assert read_reply(sock)["id"] == 7


def test_client_checks_args_before_sending(served):
    with served.client() as client:
        with pytest.raises(c.ProtocolError) as err:
            client.call("posture_set", patch={"cordon_bogus": 1})
    assert err.value.code == "InvalidArgs" and err.value.exit_code == EXIT_USAGE
    assert served.server.connections == 0  # nothing was sent, no connection made


def test_frame_of_exactly_max_size_is_served(served):
    body = b'{"op":"ping","id":1}'
    with served.raw() as sock:
        sock.sendall(body + b" " * (c.MAX_FRAME - len(body)) + b"\n")
        assert read_reply(sock)["ok"] is True


@pytest.mark.parametrize("newline", [b"", b"\n"])
def test_oversized_frame_gets_an_error_and_its_connection_is_closed(served, newline):
    with served.raw() as sock:
        sock.sendall(b"x" * (c.MAX_FRAME + 1) + newline)
        reply = read_reply(sock)
        with pytest.raises(EOFError):
            read_reply(sock)
    assert reply["error"]["type"] == "FrameTooLarge"
    with served.client() as client:
        assert client.call("ping")["pong"] is True


def test_frame_cut_off_at_end_of_stream_gets_an_error(served):
    with served.raw() as sock:
        sock.sendall(b'{"op":"drain"')
        sock.shutdown(socket.SHUT_WR)
        assert read_reply(sock)["error"]["type"] == "MalformedRequest"
    assert served.handler.calls == []


def test_handler_crash_is_an_internal_error_and_serving_goes_on(sockdir):
    class Crashing(Handler):
        def status(self):
            raise KeyError("boom")

        def ledger(self):
            return {"not json": object()}

    with serving(sockdir, Crashing()) as s, s.client() as client:
        with pytest.raises(c.RemoteError) as err:
            client.call("status")
        assert err.value.type == "InternalError" and "KeyError" in err.value.message
        with pytest.raises(c.RemoteError) as err:
            client.call("ledger")
        assert err.value.type == "InternalError" and "not JSON" in err.value.message
        assert client.call("ping")["pong"] is True


# -------------------------------------------------------------- queue and timeouts


def test_request_not_taken_in_time_times_out_and_never_runs(sockdir):
    with serving(sockdir, owner=False, reply_timeout=0.2) as s, s.client() as client:
        with pytest.raises(c.RemoteError) as err:
            client.call("drain")
        assert err.value.type == "Timeout" and "not executed" in err.value.message
        assert s.queue.run_pending(s.handler) == 0  # the cancelled call is skipped
    assert s.handler.calls == []


def test_a_submit_still_running_at_its_deadline_is_uncertain_not_a_timeout(sockdir):
    import fleet

    class SlowSubmit(Handler):
        def submit(self, **unit):
            time.sleep(0.6)  # on the owner thread, past the reply deadline
            return super().submit(**unit)

    with serving(sockdir, SlowSubmit(), reply_timeout=0.2) as s:
        with s.client() as client:
            with pytest.raises(c.RemoteError) as err:
                client.call("submit", role="r", payload=1)
        assert err.value.type == c.E_OUTCOME_UNKNOWN and "its outcome is unknown" in err.value.message
        wait_for(lambda: len(s.handler.units) == 1)  # it ran: the reply said it might have
        remote = fleet.Client("t", s.path, timeout=5)
        try:
            with pytest.raises(fleet.SubmitUncertain, match="may have been admitted") as err:
                remote.submit("r", 2, request_id="job-7").result(30)  # its future says it
            assert err.value.request_id == "job-7" and err.value.role == "r"
        finally:
            remote.close()
        wait_for(lambda: len(s.handler.units) == 2)


def test_a_direct_op_is_served_on_the_server_thread_while_the_owner_loop_is_stalled(sockdir):
    """A submit crosses no loop it does not need: with the owner's loop taking nothing, a
    batch is still served (on the control thread), while an op of the loop times out; once
    the queue refuses calls (the daemon shuts down) the batch is refused too."""
    handler, queue = Handler(), c.CallQueue()
    path = os.path.join(sockdir, "t.sock")
    batch = {"v": 1, "token": "token-0123456789",
             "units": [{"role": "r", "payload": "gAVLAy4=", "encoding": "pickle", "seq": 1}]}
    with c.ControlServer(path, c.with_blocking_ops(handler, queue.submit, queue.refusal), reply_timeout=0.3), \
            c.ControlClient(path) as client:
        assert client.call("submit_batch", **batch)["units"] == [1]
        assert handler.calls[0][0] == "submit" and handler.units[0]["payload"] == b"\x80\x05K\x03."
        assert [t.name for t in threading.enumerate() if t.ident in handler.threads] == ["fleet-control"]
        with pytest.raises(c.RemoteError) as err:
            client.call("drain")  # the owner's loop takes nothing: its ops wait, and time out
        assert err.value.type == "Timeout"
        queue.close("the test is closing")
        with pytest.raises(c.RemoteError) as err:
            client.call("submit_batch", **batch)
        assert err.value.type == c.E_SHUTTING_DOWN and "the test is closing" in err.value.message
    assert len(handler.units) == 1


def test_closed_queue_answers_shutting_down(sockdir):
    with serving(sockdir) as s, s.client() as client:
        s.queue.close()
        with pytest.raises(c.RemoteError) as err:
            client.call("status")
    assert err.value.type == "ShuttingDown"


def test_close_releases_a_request_waiting_on_the_queue(sockdir):
    outcome = {}
    # A reply timeout far beyond the test: close() must cancel the wait, not sit it out.
    with serving(sockdir, owner=False, reply_timeout=3600) as s:
        def ask():
            try:
                with s.client() as client:
                    outcome["result"] = client.call("drain")
            except (c.RemoteError, c.NotRunning) as exc:
                outcome["error"] = exc

        asker = threading.Thread(target=ask)
        asker.start()
        try:
            assert s.queue.wait(timeout=30)
            closer = threading.Thread(target=s.server.close, daemon=True)
            closer.start()
            closer.join(timeout=60)
            assert not closer.is_alive(), "close() waited for the queued request"
        finally:
            asker.join()
        assert s.queue.run_pending(s.handler) == 0
    assert "result" not in outcome
    err = outcome["error"]
    assert isinstance(err, c.NotRunning) or err.type == "ShuttingDown"


def test_call_queue_close_fails_pending_calls():
    queue = c.CallQueue()
    call = c.Call(c.OPS.get("drain"), {}, c.Peer(1, 0, 0))
    fut = queue.submit(call)
    queue.close("stopping for test")
    with pytest.raises(c.ShuttingDown, match="stopping for test"):
        fut.result(timeout=0)
    assert queue.wait(timeout=0) is False
    with pytest.raises(c.ShuttingDown):
        queue.submit(call).result(timeout=0)


def test_call_queue_wakeup_is_called_on_submit():
    woken = []
    queue = c.CallQueue(wakeup=lambda: woken.append(1))
    queue.submit(c.Call(c.OPS.get("ping"), {}, c.Peer(1, 0, 0)))
    assert woken == [1] and len(queue) == 1


def test_a_direct_op_is_answered_on_the_spot_and_never_queued():
    """A direct op (a submit) runs on the server's thread as it is routed: its answer is
    known when `route` returns (`calls.Answered`: no Future made and settled per frame),
    the op's value or the error it raised, and a callback asked of it runs at once; a
    daemon shutting down refuses it as the queue would, ShuttingDown."""
    from fleet.rules.unit import Draining
    from fleet.service.control.calls import Answered

    class Handler:
        def __init__(self):
            self.error = None

        def submit_batch(self, v, token, units, ack=None, fds=False, parcels=False, stream=None):
            if self.error is not None:
                raise self.error
            return {"units": [], "errors": {}, "replayed": [], "roles": {}, "token": token}

    handler, closing = Handler(), []
    route = c.with_blocking_ops(handler, lambda call: pytest.fail(f"{call.op.name} was queued"),
                                lambda: closing[0] if closing else None)
    args = c.OPS.get("submit_batch").validate({"v": 2, "token": "direct-token", "units": [
        {"role": "r", "payload": base64.b64encode(pickle.dumps(1)).decode(), "encoding": "pickle", "seq": 1}]})
    call = c.Call(c.OPS.get("submit_batch"), args, c.Peer(1, 0, 0))
    answer = route(call)
    assert type(answer) is Answered and answer.done() and not answer.cancel()
    assert answer.result(timeout=0)["token"] == "direct-token" and answer.exception() is None
    seen = []
    answer.add_done_callback(seen.append)
    assert seen == [answer]
    handler.error = Draining("draining since now")
    answer = route(call)
    with pytest.raises(Draining, match="draining since now"):
        answer.result(timeout=0)
    assert answer.exception() is handler.error
    closing.append("the daemon is stopping")
    with pytest.raises(c.ShuttingDown, match="the daemon is stopping"):
        route(call).result(timeout=0)


def test_a_connection_refused_for_want_of_room_raises_control_busy(sockdir):
    # The only connection root may hold is busy (its request waits on a queue nobody
    # drains), so it cannot be closed to make room: the next one is refused as busy.
    with serving(sockdir, owner=False, max_connections=1, reserved=0, reply_timeout=3600) as s:
        with s.raw() as first:
            first.sendall(c.encode_request("status", {}, 1))
            assert s.queue.wait(timeout=30)  # the request is in flight
            with s.client() as second, pytest.raises(c.ControlBusy) as err:
                second.call("ping")
            assert err.value.type == "Busy" and "busy" in err.value.message
            assert err.value.exit_code == 75
            assert isinstance(err.value, c.RemoteError)  # callers catching RemoteError still do
            with s.raw() as third:
                assert read_reply(third)["error"]["type"] == "Busy"
        assert s.handler.calls == []


# ---------------------------------------------------------------- socket lifecycle


def test_socket_file_has_mode_0660_and_the_given_group(sockdir):
    with serving(sockdir, group=NOGROUP) as s:
        st_ = os.stat(s.path)
        assert stat.S_IMODE(st_.st_mode) == 0o660
        assert st_.st_gid == NOGROUP
        assert stat.S_ISSOCK(st_.st_mode)


def test_not_running_when_socket_is_missing_or_refused(sockdir):
    missing = os.path.join(sockdir, "missing.sock")
    with pytest.raises(c.NotRunning) as err:
        c.ControlClient(missing).call("ping")
    assert err.value.exit_code == EXIT_NOT_RUNNING and missing in str(err.value)
    stale = os.path.join(sockdir, "stale.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(stale)  # bound, never listening: connect is refused
    with pytest.raises(c.NotRunning):
        c.ControlClient(stale).call("ping")


def test_stale_socket_is_replaced_at_start(sockdir):
    path = os.path.join(sockdir, "t.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(path)
    with serving(sockdir) as served, served.client() as client:
        assert client.call("ping")["pong"] is True


def test_live_socket_and_non_socket_are_never_taken_over(sockdir):
    with serving(sockdir) as served:
        with pytest.raises(c.ControlError, match="another daemon"):
            c.ControlServer(served.path, served.queue.submit).start()
        with served.client() as client:
            assert client.call("ping")["pong"] is True
    path = os.path.join(sockdir, "t.sock")
    with open(path, "w") as f:
        f.write("not a socket")
    with pytest.raises(c.ControlError, match="not a socket"):
        c.ControlServer(path, c.CallQueue().submit).start()
    assert os.path.isfile(path)
    assert control_threads() == []


# --------------------------------------------------------- peer credentials (root)

# Switching uid needs root. CI runs as root, so it never skips there (CI=true makes
# a non-root run fail loudly rather than pass on skips).
needs_root = pytest.mark.skipif(os.geteuid() != 0 and not require.required(), reason="switching uid needs root")


def as_uid(uid, gid, fn):
    """Run ``fn()`` in a forked child with ``uid``/``gid``; return what it returned (JSON)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            out = json.dumps(fn()).encode()
            os.write(w, out)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    try:
        chunks = []
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(b"".join(chunks))


def attempt(path, op, **args):
    try:
        return {"ok": c.ControlClient(path, timeout=30).call(op, **args)}
    except c.RemoteError as exc:
        return {"error": exc.type, "class": type(exc).__name__, "exit": exc.exit_code, "message": exc.message}


@pytest.fixture
def open_sockdir(sockdir):
    os.chmod(sockdir, 0o711)  # let another uid reach the socket inside
    return sockdir


@needs_root
def test_other_uid_may_read_but_not_mutate(open_sockdir):
    with serving(open_sockdir, group=NOGROUP) as s:
        def child():
            return {
                "ping": attempt(s.path, "ping"),
                "status": attempt(s.path, "status"),
                "posture_set": attempt(s.path, "posture_set", patch={"cordon_duty_percent": 1}),
                "drain": attempt(s.path, "drain"),
                "resume": attempt(s.path, "resume"),
                "submit": attempt(s.path, "submit", role="solver", payload=1),
                "submit_batch": attempt(s.path, "submit_batch", v=1, token="token-0123456789", units=[
                    {"role": "solver", "payload": "gAVLAS4=", "encoding": "pickle", "seq": 1}]),
                "cancel": attempt(s.path, "cancel", unit=1),
            }

        seen = as_uid(NOBODY, NOGROUP, child)
        assert seen["ping"]["ok"]["pong"] is True
        assert seen["status"] == {"ok": {"draining": False, "units": 0}}
        for op in ("posture_set", "drain", "resume", "submit", "submit_batch", "cancel"):
            assert seen[op]["error"] == "PermissionDenied", op
            assert seen[op]["class"] == "PermissionDenied"
            assert seen[op]["exit"] == EXIT_NO_PERMISSION
            assert "uid 65534" in seen[op]["message"]
        assert [name for name, _ in s.handler.calls] == ["status"]
        # root may mutate
        with s.client() as client:
            assert client.call("drain") == {"draining": True}


@needs_root
def test_the_owner_uid_may_mutate(open_sockdir):
    with serving(open_sockdir, group=NOGROUP, owner_uid=NOBODY) as s:
        seen = as_uid(NOBODY, NOGROUP, lambda: attempt(s.path, "drain"))
    assert seen == {"ok": {"draining": True}}


@needs_root
def test_uid_outside_the_socket_group_cannot_connect(open_sockdir):
    with serving(open_sockdir) as s:  # group: root's, mode 0660
        seen = as_uid(NOBODY, NOGROUP, lambda: attempt(s.path, "ping"))
    assert seen["error"] == "PermissionDenied" and "may not connect" in seen["message"]
    assert s.handler.calls == []


# ------------------------------------------------------------------------- fuzzing

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
requests = st.fixed_dictionaries(
    {"op": st.sampled_from(c.OPS.names() + ["nope", ""])},
    optional={
        "id": st.none() | st.integers() | st.text(max_size=5) | st.lists(st.integers(), max_size=1),
        "args": st.dictionaries(
            st.sampled_from(["patch", "role", "payload", "encoding", "key", "priority", "timeout", "x"]),
            json_values, max_size=4,
        ) | json_values,
        "extra": json_values,
    },
)


def test_fuzzed_frames_always_get_one_well_formed_reply_each(sockdir):
    with serving(sockdir) as s:
        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.one_of(st.binary(max_size=300), requests.map(lambda r: json.dumps(r).encode())))
        def exchange(data):
            frames = data.split(b"\n")
            with s.raw() as sock:
                sock.sendall(data + b"\n")
                buf = bytearray()
                for _ in frames:
                    reply = read_reply(sock, buf)
                    assert set(reply) in ({"id", "ok", "result"}, {"id", "ok", "error"})
                    if not reply["ok"]:
                        assert set(reply["error"]) == {"type", "message"} and reply["error"]["message"]
                # a valid request still works on the same connection afterwards
                sock.sendall(c.encode_request("ping", {}, "probe"))
                assert read_reply(sock, buf)["result"]["pong"] is True

        exchange()
        with s.client() as client:
            assert client.call("ping")["pong"] is True
        # only requests that passed validation reached the handler, and the
        # handler's own checks kept the policy sane
        assert all(isinstance(v, int) and v >= 0 for v in s.handler.policy.values())


# ---------------------------------------------------------------- pure wire, ops


def test_request_encoding_round_trips():
    frame = c.encode_request("posture_set", {"patch": {"cordon_duty_percent": 5}}, 9)
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1
    assert c.decode_request(frame) == c.Request(9, "posture_set", {"patch": {"cordon_duty_percent": 5}})


def test_replies_round_trip_and_bad_replies_are_typed():
    assert c.decode_reply(c.encode_reply(3, {"a": 1})) == c.Reply(3, True, {"a": 1})
    assert c.decode_reply(c.encode_error(None, "X", "y")) == c.Reply(None, False, None, "X", "y")
    for bad in (b"nope", b"[]", b'{"ok":1}', b'{"id":1,"ok":false,"error":"x"}'):
        with pytest.raises(c.ProtocolError) as err:
            c.decode_reply(bad)
        assert err.value.code == "InvalidReply"


def test_decode_request_enforces_the_frame_limit():
    with pytest.raises(c.ProtocolError) as err:
        c.decode_request(b'{"op":"ping"}    ', max_frame=15)
    assert err.value.code == "FrameTooLarge"
    assert c.decode_request(b'{"op":"ping"}  ', max_frame=15).op == "ping"


def test_exactly_the_changing_ops_are_mutating():
    mutating = {name for name in c.OPS.names() if c.OPS.get(name).mutating}
    # collect consumes the outcomes held for a token, and only a uid that may submit has any;
    # an inlet is a way to submit
    assert mutating == {"posture_set", "posture_release", "drain", "resume", "submit", "submit_batch", "open_inlet",
                        "collect", "cancel", "admission_close", "admission_reopen", "admission_budget"}
    assert set(c.OPS.names()) == {"ping", "status", "posture_show", "posture_set", "posture_release", "drain",
                                  "drain_state", "resume", "submit", "submit_batch", "open_inlet", "ledger", "collect",
                                  "cancel", "admission_show",
                                  "admission_close", "admission_reopen", "admission_allowance", "admission_plan",
                                  "admission_starving", "admission_budget", "why"}
    assert {name for name in c.OPS.names() if c.OPS.get(name).blocking} == {"collect"}


def test_registry_rejects_a_duplicate_op():
    registry = c.OpRegistry([c.OPS.get("ping").__class__])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(c.OPS.get("ping").__class__)


def test_check_args_names_every_problem():
    schema = {"a": c.Arg((int,), required=True), "b": c.Arg((float, type(None)))}
    assert c.check_args("op", schema, {"a": 1}) == {"a": 1, "b": None}
    assert c.check_args("op", schema, {"a": 1, "b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(c.ProtocolError) as err:
        c.check_args("op", schema, {"b": "x", "zz": 1})
    assert "unknown argument(s) zz" in err.value.message
    assert "missing required argument a" in err.value.message
    assert "b must be number or null, got string" in err.value.message


def test_submit_to_wire_pickles_by_default():
    wire = c.OPS.get("submit").to_wire(role="r", payload={1, 2})
    assert wire["encoding"] == "pickle"
    assert pickle.loads(base64.b64decode(wire["payload"])) == {1, 2}


# ------------------------------------------------------------------ names, paths


@pytest.mark.parametrize("name", ["fleet", "a", "Fleet_2-x", "9" * 63])
def test_valid_fleet_names(name):
    assert c.validate_fleet_name(name) == name


@pytest.mark.parametrize("name", ["", "-x", "_x", "a/b", "..", "a.b", "a b", "é", "9" * 64, 5, None])
def test_invalid_fleet_names_are_refused(name):
    with pytest.raises(c.InvalidFleetName):
        c.validate_fleet_name(name)


def test_runtime_dir_order():
    never = lambda path, mode: False  # noqa: E731
    always = lambda path, mode: True  # noqa: E731
    env = {"RUNTIME_DIRECTORY": "/run/fleet-x:/run/other", "XDG_RUNTIME_DIR": "/run/user/5"}
    assert str(c.runtime_dir(env, euid=5, access=never)) == "/run/fleet-x"
    env.pop("RUNTIME_DIRECTORY")
    assert str(c.runtime_dir(env, euid=0, access=never)) == "/run/fleet"
    assert str(c.runtime_dir(env, euid=5, access=always)) == "/run/fleet"
    assert str(c.runtime_dir(env, euid=5, access=never)) == "/run/user/5/fleet"
    assert str(c.runtime_dir({}, euid=5, access=never)) == "/tmp/fleet-5"
    assert str(c.socket_path("f1", {}, euid=5, access=never)) == "/tmp/fleet-5/f1.sock"
    with pytest.raises(c.InvalidFleetName):
        c.socket_path("../x", {}, euid=5, access=never)


def test_find_socket_takes_the_first_existing_candidate(sockdir):
    env = {"XDG_RUNTIME_DIR": sockdir}
    candidates = c.socket_candidates("f1", env, euid=5)
    assert [str(p) for p in candidates] == [
        "/run/fleet/f1.sock", f"{sockdir}/fleet/f1.sock", "/tmp/fleet-5/f1.sock"]
    with pytest.raises(c.NotRunning, match="f1"):
        c.find_socket("f1", env, euid=5)
    os.makedirs(f"{sockdir}/fleet")
    open(f"{sockdir}/fleet/f1.sock", "w").close()
    assert str(c.find_socket("f1", env, euid=5)) == f"{sockdir}/fleet/f1.sock"


def test_prepare_runtime_dir_refuses_unsafe_directories(sockdir):
    ok = c.prepare_runtime_dir(os.path.join(sockdir, "a", "b"))
    assert stat.S_IMODE(os.stat(ok).st_mode) & 0o022 == 0
    loose = os.path.join(sockdir, "loose")
    os.mkdir(loose)
    os.chmod(loose, 0o777)
    with pytest.raises(c.ControlError, match="writable by group or others"):
        c.prepare_runtime_dir(loose)
    os.chmod(loose, 0o1777)  # sticky, like /tmp: others may still add a socket our clients would find
    with pytest.raises(c.ControlError, match="writable by group or others"):
        c.prepare_runtime_dir(loose)
    below = os.path.join(loose, "below")  # ours, in a sticky directory: nobody else may rename it
    assert str(c.prepare_runtime_dir(below)) == below
    os.chmod(loose, 0o777)  # not sticky: anyone may swap `below` for their own
    with pytest.raises(c.ControlError, match=f"{loose} is writable by group or others"):
        c.prepare_runtime_dir(below)
    link = os.path.join(sockdir, "link")
    os.symlink(ok, link)
    with pytest.raises(c.ControlError, match="not a directory"):
        c.prepare_runtime_dir(link)
    theirs = os.path.join(sockdir, "theirs")
    os.mkdir(theirs)
    if os.geteuid() == 0:
        os.chown(theirs, NOBODY, NOGROUP)  # root: someone else's directory
        euid = 0
    else:
        euid = os.geteuid() + 1  # not root: pretend to be someone else
    with pytest.raises(c.ControlError, match="owned by uid"):
        c.prepare_runtime_dir(theirs, euid=euid)


# ------------------------------------------- many, idle and hostile connections (one loop)


def owner_is_served(s):
    """posture_show and submit, as the owner (root here), each on a new connection."""
    with s.client(timeout=30) as client:
        assert client.call("posture_show")["state"] == "Nominal"
    with s.client(timeout=30) as client:
        assert client.call("submit", role="solver", payload=7) == {"unit": len(s.handler.units)}
    assert s.handler.units[-1]["role"] == "solver"


@needs_root
def test_owner_is_served_with_1000_idle_connections_of_another_uid_open(open_sockdir):
    with serving(open_sockdir, group=NOGROUP) as s:
        with idle_connections(s.path, 1000, NOBODY, NOGROUP) as connected:
            assert connected == 1000
            owner_is_served(s)
            # Idle sockets of one uid only ever replace each other: it never holds more than its cap.
            assert s.server.connections_by_uid()[NOBODY] <= s.server.max_per_uid
        owner_is_served(s)


def test_owner_is_served_with_1000_of_its_own_idle_connections_open(sockdir):
    with serving(sockdir) as s:
        with idle_connections(s.path, 1000) as connected:
            assert connected == 1000
            owner_is_served(s)
            assert s.server.connections <= s.server.max_connections


@needs_root
def test_a_uid_at_its_cap_of_busy_connections_is_refused_and_the_owner_still_served(open_sockdir, caplog):
    # Half a frame each and a long frame deadline: these connections are not idle, so
    # none can be closed to make room; the 33rd and later are refused as busy.
    caplog.set_level("WARNING", logger="fleet.service.control")
    with serving(open_sockdir, group=NOGROUP, frame_timeout=3600) as s:
        with idle_connections(s.path, 100, NOBODY, NOGROUP, send=b'{"op":"pi') as connected:
            assert connected == 100
            wait_for(lambda: s.server.connections_by_uid().get(NOBODY) == s.server.max_per_uid)
            seen = as_uid(NOBODY, NOGROUP, lambda: attempt(s.path, "ping"))
            assert seen["class"] == "ControlBusy" and f"uid {NOBODY}" in seen["message"]
            owner_is_served(s)
    pressure = [r for r in caplog.records if "under pressure" in r.getMessage()]
    # ~70 refusals, at most one line per interval (the first at once, maybe one summary).
    assert 1 <= len(pressure) <= 2, [r.getMessage() for r in pressure]
    assert f"uid {NOBODY}" in pressure[0].getMessage()


@needs_root
def test_the_reserve_is_left_for_the_owner_when_other_uids_fill_the_rest(open_sockdir):
    # 4 connections, 2 of them reserved: uid 65534 (cap 4) gets only the other 2 even
    # with busy ones (half frames), and the owner still gets in.
    with serving(open_sockdir, group=NOGROUP, max_connections=4, reserved=2, max_per_uid=4,
                 frame_timeout=3600) as s:
        with idle_connections(s.path, 3, NOBODY, NOGROUP, send=b'{"op":"pi') as connected:
            assert connected == 3
            wait_for(lambda: s.server.connections_by_uid() == {NOBODY: 2})
            assert as_uid(NOBODY, NOGROUP, lambda: attempt(s.path, "ping"))["class"] == "ControlBusy"
            owner_is_served(s)


def test_an_idle_connection_makes_room_for_a_new_one_of_its_uid(sockdir):
    with serving(sockdir, max_connections=3, reserved=0) as s:
        idle = [s.raw() for _ in range(3)]
        try:
            wait_for(lambda: s.server.connections == 3)
            with s.client() as client:
                assert client.call("ping")["pong"] is True
            idle[0].settimeout(30)
            assert idle[0].recv(1) == b""  # the oldest idle one was closed for it
        finally:
            for sock in idle:
                sock.close()


def wait_for(predicate, timeout=30.0):
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_half_a_frame_then_silence_is_closed_after_the_frame_deadline_and_others_are_served(sockdir):
    with serving(sockdir, frame_timeout=1.0) as s, s.raw() as stalled, s.raw() as silent:
        stalled.sendall(b'{"op":"drain","id":1')
        with s.client() as client:
            assert client.call("ping")["pong"] is True  # served while the other stalls
        for sock in (stalled, silent):
            reply = read_reply(sock)  # within the deadline, well inside the socket's 30 s
            assert reply["error"]["type"] == "Timeout" and "no complete request frame" in reply["error"]["message"]
            with pytest.raises(EOFError):
                read_reply(sock)
    assert s.handler.calls == []


def test_a_never_ending_line_is_refused_and_others_are_served(sockdir):
    with serving(sockdir) as s, s.raw() as endless:
        chunk = b"x" * 65536
        sent = 0
        try:
            while sent <= c.MAX_FRAME + len(chunk):
                endless.sendall(chunk)
                sent += len(chunk)
                if sent % (4 * len(chunk)) == 0:
                    with s.client() as client:
                        assert client.call("ping")["pong"] is True
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed it once the frame passed the limit
        assert read_reply(endless)["error"]["type"] == "FrameTooLarge"
        with s.client() as client:
            assert client.call("ping")["pong"] is True


def test_a_trickled_line_that_never_ends_meets_the_frame_deadline(sockdir):
    with serving(sockdir, frame_timeout=1.0) as s, s.raw() as trickle:
        import time

        try:
            for _ in range(300):  # 1 byte / 10 ms for up to 3 s: never a newline
                trickle.sendall(b"x")
                time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert read_reply(trickle)["error"]["type"] == "Timeout"


def test_frames_that_each_end_in_time_meet_no_deadline_though_every_read_ends_mid_frame(sockdir):
    # Each write ends one frame and starts the next, for 2.5 times the frame deadline: the
    # deadline runs from each frame's start, not from the first partial frame the server saw.
    with serving(sockdir, frame_timeout=1.0) as s, s.raw() as streaming:
        import time

        frame = c.encode_request("ping", {}, 1)
        half = len(frame) // 2
        streaming.sendall(frame[:half])
        buf = bytearray()
        end = time.monotonic() + 2.5
        n = 0
        while time.monotonic() < end:
            streaming.sendall(frame[half:] + frame[:half])
            assert read_reply(streaming, buf)["result"]["pong"] is True
            n += 1
            time.sleep(0.01)
        streaming.sendall(frame[half:])
        assert read_reply(streaming, buf)["result"]["pong"] is True and n > 10


class StreamKeeper(Handler):
    """Keeps the push side of the connection a ``submit_batch`` came on."""

    def __init__(self):
        super().__init__()
        self.stream = None

    def submit_batch(self, v, token, units, ack=None, fds=False, parcels=False, stream=None):
        self.stream = stream
        return super().submit_batch(v, token, units, ack, fds=fds, parcels=parcels, stream=stream)


def test_pushes_made_on_two_threads_go_out_in_the_order_they_were_made(sockdir):
    import sys

    keeper = StreamKeeper()
    unit = {"role": "r", "payload": base64.b64encode(pickle.dumps(1)).decode(), "encoding": "pickle", "seq": 1}
    with serving(sockdir, keeper) as s, s.raw() as peer:
        peer.sendall(c.encode_request("submit_batch", {"v": 2, "token": "order-token-01", "units": [unit]}, 1))
        buf = bytearray()
        assert read_reply(peer, buf)["ok"] is True
        stream, made, lock = keeper.stream, [0], threading.Lock()

        def pull():  # numbers the frames in the order they are made
            with lock:
                made[0] += 1
                return c.encode_push("order-token-01", made[0], [])

        def writer():
            for _ in range(400):
                stream.write(pull)

        switch = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # the two writers interleave as finely as they can
        try:
            threads = [threading.Thread(target=writer) for _ in range(2)]
            for t in threads:
                t.start()
            got = [read_reply(peer, buf)["push"]["first"] for _ in range(800)]
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(switch)
        assert got == list(range(1, 801))


def test_a_peer_that_never_reads_its_replies_does_not_stop_the_others(sockdir):
    with serving(sockdir, write_timeout=5.0) as s, s.raw() as deaf:
        deaf.settimeout(2.0)
        request = c.encode_request("status", {}, 1)
        sent = 0
        try:
            while sent < 64 << 20:  # far more requests than any socket buffer holds
                deaf.sendall(request * 1024)
                sent += len(request) * 1024
        except TimeoutError:
            pass  # the server stopped reading it: its replies are not being taken
        # It was read only while its replies could be sent: what it got in is bounded by
        # the socket buffers and one frame, not by how much it wanted to send.
        assert sent < 16 << 20, sent
        with s.client() as client:
            assert client.call("ping")["pong"] is True
        # It is closed once its reply sat unread past the write deadline.
        wait_for(lambda: s.server.connections == 0)
    assert len(s.handler.calls) < sent // len(request)


def test_a_busy_reply_is_read_even_when_sending_the_request_fails(sockdir):
    # The server refuses the connection (Busy) and closes it before the client's request
    # goes out: the send fails (EPIPE), and the reply waiting in the socket still says why.
    with serving(sockdir, owner=False, max_connections=1, reserved=0, reply_timeout=3600) as s:
        with s.raw() as first:
            first.sendall(c.encode_request("status", {}, 1))
            assert s.queue.wait(timeout=30)  # in flight: the one place is taken
            client = c.ControlClient(s.path, timeout=30)
            client.connect()
            wait_for(lambda: select.select([client._sock], [], [], 0)[0])  # refused and closed
            client._still_open = lambda sock: True  # as if the close came just after the check
            with pytest.raises(c.ControlBusy):
                client.call("ping")
            client.close()


def test_running_out_of_descriptors_pauses_accepting_and_serving_resumes(sockdir):
    # The server runs in a forked child whose RLIMIT_NOFILE leaves room for a few
    # connections only: accept() fails with EMFILE. The server must not spin on the
    # readable listener: it tries again once its clock (a fake one the test moves, in
    # memory both processes share) says the pause is over, and serves again once
    # descriptors are free. The child counts its failed accepts in the same memory.
    import errno
    import mmap
    import resource
    import struct

    shared = mmap.mmap(-1, 16, mmap.MAP_SHARED)  # [clock seconds (double), EMFILE accepts (u64)]
    struct.pack_into("dQ", shared, 0, 1000.0, 0)

    def move_clock(by: float) -> None:
        struct.pack_into("d", shared, 0, struct.unpack_from("d", shared, 0)[0] + by)

    def emfiles() -> int:
        return struct.unpack_from("Q", shared, 8)[0]

    path = os.path.join(sockdir, "t.sock")
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            os.close(ready_r)
            os.close(go_w)
            real_accept = socket.socket.accept

            def accept(sock):
                try:
                    return real_accept(sock)
                except OSError as exc:
                    if exc.errno == errno.EMFILE:
                        struct.pack_into("Q", shared, 8, emfiles() + 1)
                    raise

            socket.socket.accept = accept
            server = c.ControlServer(path, c.inline_dispatch(object()),
                                     clock=lambda: struct.unpack_from("d", shared, 0)[0]).start()
            used = len(os.listdir("/proc/self/fd"))
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (used + 3, hard))
            os.write(ready_w, b"r")
            os.read(go_r, 1)
            server.close()
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(go_r)
    try:
        assert os.read(ready_r, 1) == b"r"
        held = []
        for _ in range(12):  # more than the child can accept
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            held.append(sock)
        wait_for(lambda: emfiles() >= 1)  # out of descriptors: it pauses accepting
        time.sleep(0.5)  # the listener stays readable while the clock stands still
        assert emfiles() == 1, "the server spun on its readable listener at EMFILE"
        move_clock(0.5)  # past the pause: it tries again, still out of descriptors, and pauses again
        wait_for(lambda: emfiles() >= 2)
        time.sleep(0.5)
        assert emfiles() == 2
        for sock in held:
            sock.close()
        # From here the clock runs (a pause that meets EMFILE once more, before the closed
        # connections are dropped, ends too), and serving resumes.
        ticking = threading.Event()

        def tick():
            while not ticking.wait(0.02):
                move_clock(0.1)

        ticker = threading.Thread(target=tick)
        ticker.start()
        try:
            with c.ControlClient(path, timeout=30) as client:
                assert client.call("ping")["pong"] is True  # serving again
        finally:
            ticking.set()
            ticker.join()
        os.write(go_w, b"g")
    finally:
        os.close(go_w)
        os.close(ready_r)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_pressure_log_is_rate_limited():
    now = [100.0]
    records = []
    plog = c._PressureLog(every_s=10.0, clock=lambda: now[0])
    peer = c.Peer(pid=1, uid=NOBODY, gid=NOGROUP)
    import logging

    class Catch(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Catch()
    c.log.addHandler(handler)
    try:
        for _ in range(100):
            plog.refused(peer, "busy")
        assert len(records) == 1 and "refused 1 " in records[0]
        now[0] += 5
        plog.flush()
        assert len(records) == 1
        now[0] += 5
        plog.evicted(peer)
        assert len(records) == 2
        assert "refused 99 " in records[1] and "closed 1 idle" in records[1] and f"uid {NOBODY}: 99" in records[1]
        now[0] += 60
        plog.flush()
        assert len(records) == 2  # nothing new: nothing to say
    finally:
        c.log.removeHandler(handler)


# ---------------------------------------------------------------- where the server's thread runs


def _allowed(tid: int) -> set:
    return os.sched_getaffinity(tid)


def test_the_server_thread_runs_where_cpus_names_and_follows_each_change(sockdir):
    mask = sorted(os.sched_getaffinity(os.getpid()))
    if len(mask) < 2:
        require.lacking(f"needs two CPUs to tell a pinned thread from a free one (this process may use {mask})")
    where = [(mask[0],)]
    with serving(sockdir, cpus=lambda: where[0]) as s:
        tid = s.server._thread.native_id
        wait_until(lambda: comm_of(tid) == "fleet-control", "the server thread named (top -H)")
        wait_until(lambda: _allowed(tid) == {mask[0]}, "the server thread on the first CPU")
        where[0] = (mask[-1],)
        with c.ControlClient(s.path) as cl:
            cl.call("status")  # any pass of the server's loop looks again
        wait_until(lambda: _allowed(tid) == {mask[-1]}, "the server thread moved to the last CPU")
        where[0] = None  # nowhere in particular: wherever the process may run
        with c.ControlClient(s.path) as cl:
            cl.call("status")
        wait_until(lambda: _allowed(tid) == set(mask), "the server thread free again")
        assert os.sched_getaffinity(os.getpid()) == set(mask)  # the process's own mask is untouched


def test_without_cpus_the_server_thread_stays_where_it_was_started(sockdir):
    with serving(sockdir) as s:
        with c.ControlClient(s.path) as cl:
            cl.call("status")
        assert _allowed(s.server._thread.native_id) == os.sched_getaffinity(os.getpid())


def comm_of(tid: int) -> str:
    with open(f"/proc/{os.getpid()}/task/{tid}/comm") as f:
        return f.read().strip()


def test_a_direct_op_bringing_a_large_payload_runs_beside_the_server_thread_which_serves_on(sockdir):
    """A submit whose memfds hold SIDE_MIN_BYTES or more (a copy beside the rings that may
    take a second) runs on the side thread: while it runs, every other connection is
    served; its own waits for its reply. A small one still runs on the server's thread."""
    from fleet.api.client import Client
    from fleet.rules import titles
    from fleet.service.side_thread import SideThread

    entered, release = threading.Event(), threading.Event()

    class Slow(Handler):
        def __init__(self):
            super().__init__()
            self.ran_on: list[tuple[int, str]] = []

        def submit_batch(self, v, token, units, ack=None, fds=False, parcels=False, stream=None):
            size = sum(memoryview(getattr(u["payload"], "data", u["payload"])).nbytes for u in units)  # laid out
            self.ran_on.append((size, threading.current_thread().name))
            if size >= c.SIDE_MIN_BYTES:
                entered.set()
                assert release.wait(BOUND_S), "the test never released the large submit"
            return super().submit_batch(v, token, units, ack, fds=fds, parcels=parcels, stream=stream)

    handler = Slow()
    path = os.path.join(sockdir, "t.sock")
    side = SideThread(titles.INTAKE_THREAD)
    with c.ControlServer(path, c.with_blocking_ops(handler, c.inline_dispatch(handler), side=side)):
        big, small = Client("f", path, timeout=BOUND_S), Client("f", path, timeout=BOUND_S)
        try:
            fut = big.submit("r", b"x" * c.SIDE_MIN_BYTES)
            assert entered.wait(BOUND_S)
            with c.ControlClient(path) as other:  # served while the large one holds the side thread
                assert other.call("status")["units"] == 0
            assert small.submit("r", 1).unit_id == 1  # a small submit: on the server's thread, at once
            release.set()
            assert fut.unit_id == 2  # its reply, once its op ended
        finally:
            release.set()
            big.close()
            small.close()
    assert [name for _size, name in handler.ran_on] == [titles.INTAKE_THREAD, "fleet-control"]
