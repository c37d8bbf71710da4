"""Large payloads through fleetd: what a client pickles at `fds.MEMFD_MIN` bytes or more
crosses the control socket as a sealed memfd passed with its frame (SCM_RIGHTS), so a
service-mode payload has no size limit below memory. Against a real fleetd and real
sockets: each size class arrives whole; a hostile client's descriptors (unsealed, not a
memory file, of another length, too many, claimed by no unit, left with a frame cut off)
are refused by name, admit nothing, and leave no descriptor open in fleetd; a client of
another uid than fleetd's sends one as well; nothing is left in /dev/shm."""
from __future__ import annotations

import array
import base64
import fcntl
import hashlib
import os
import pickle
import signal
import socket

import pytest

import fleet

from fleet.service import control
from fleet.shm import parcels
from fleet.service.control import fds as fdpass
from fleet.service.control import outcome_record
from fleet.service.control.wire import decode_reply, encode_request
from tests import require
from tests.daemons import BOUND_S, served_fleetd, wait_until
from tests.fleets import role
from tests.handlers import memory_owner
from tests.service.test_submit_batch import all_stopped
from tests.uids import NOBODY

TOKEN = "large-token-0123456789"


def roles():
    plain = {name: {k: v for k, v in role(handler, slots=1).items() if k != "peak_cpus"}
             for name, handler in (("dig", "digest"), ("sq", "square"), ("mk", "make_bytes"), ("arr", "make_array"), ("mem", "payload_memory"), ("fail", "fail"),
                                   ("die", "die"), ("map", "payload_mapping"))}
    # one slot, one unit sent ahead of the one it runs: the next unit waits in its worker
    ahead = {k: v for k, v in role("hold_then_map", slots=1, lookahead=1).items() if k != "peak_cpus"}
    # one slot, nothing sent ahead: a unit held on its gate file keeps the next one queued
    return {**plain, "ahead": ahead,
            "gate": role("wait_for_file", slots=1, io_bound=True, peak_cpus=0, lookahead=0)}


def queue_depth(client, name: str) -> int:
    return {q["name"]: q for q in client.status()["queues"]}[name]["queue_depth"]


@pytest.fixture(scope="module")
def served():
    with served_fleetd("ld", roles()) as d:
        yield d


def open_fds(pid: int) -> int:
    """fleetd's open descriptors but its warm parcels' (`parcels.Warm`: mapped for the next
    payload, bounded by parcels.WARM_MAX bytes); none of them may be a memfd."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue  # closed meanwhile
        if not target.startswith("/dev/shm/fleet.") or parcels.WARM_MARK not in target:
            count += 1
    return count


def memfds(pid: int) -> list[str]:
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        # the values' (a client connection's inlet holds one of its own: fleet.shm.inlet)
        if target.startswith("/memfd:") and not target.startswith("/memfd:fleet-inlet"):
            found.append(target)
    return found


def shm_of(name: str) -> set[str]:
    """The fleet's entries in /dev/shm but its warm parcels (kept for the next payload)."""
    return {entry for entry in os.listdir("/dev/shm") if name in entry and f"{name}{parcels.WARM_MARK}" not in entry}


def settled(d) -> bool:
    with control.ControlClient(d.socket_path) as c:
        return c.call("ledger")["inflight"] == 0


@pytest.fixture
def quiet(served):
    """The daemon's open descriptors and /dev/shm entries before the test; after it, both
    are back where they were (waited for: a descriptor closes on fleetd's control thread)."""
    wait_until(lambda: settled(served), "units of earlier tests to end")
    pid, shm = served.proc.pid, shm_of(served.name)
    base = open_fds(pid)
    yield base
    wait_until(lambda: settled(served), "the test's units to end")
    wait_until(lambda: open_fds(pid) <= base, f"fleetd's descriptors back to {base}")
    assert memfds(pid) == []
    wait_until(lambda: shm_of(served.name) <= shm, "fleetd's /dev/shm entries back to where they were")
    assert "was dropped before its unit's outcome" not in served.stderr()  # each closed by its unit's end


SIZES = {"1KiB": 1 << 10, "1MiB": 1 << 20, "64MiB": 64 << 20}


@pytest.mark.parametrize("size", list(SIZES.values()), ids=list(SIZES))
def test_a_payload_of_each_size_class_arrives_whole_through_fleetd(served, quiet, size):
    data = os.urandom(size)
    with served.connect() as client:
        assert client.submit("dig", data).result(BOUND_S) == (size, hashlib.sha256(data).hexdigest())


def test_a_large_payload_is_reclaimed_whatever_its_unit_ends_by(served, quiet, tmp_path):
    """Failed, its worker killed, cancelled: no memfd stays open in fleetd, nothing stays in
    /dev/shm (the `quiet` fixture checks both)."""
    big = os.urandom(2 << 20)
    with served.connect() as client:
        with pytest.raises(fleet.UnitFailed, match="HandlerError"):
            client.submit("fail", big).result(BOUND_S)
        with pytest.raises(fleet.UnitFailed):
            client.submit("die", big).result(BOUND_S)
        gate = tmp_path / "go"
        try:
            running = client.submit("gate", (str(gate), 3))
            queued = client.submit("gate", (None, big))  # behind it: the role has one slot
            wait_until(lambda: queue_depth(client, "gate") == 1, "the large unit to wait in the queue")
            assert queued.cancel()
        finally:
            gate.touch()
        assert running.result(BOUND_S) == 9
        assert client.submit("sq", 3).result(BOUND_S) == 9


def test_many_large_payloads_in_flight_together_each_arrive_whole(served, quiet):
    blobs = [os.urandom((1 << 20) + i) for i in range(fdpass.MAX_FRAME_FDS + 6)]  # more than one frame's fds
    with served.connect() as client:
        futures = [client.submit("dig", b) for b in blobs]
        assert [f.result(BOUND_S) for f in futures] == [(len(b), hashlib.sha256(b).hexdigest()) for b in blobs]


def pattern(n: int) -> bytes:
    """What `tests.handlers.make_bytes` returns for ``n``."""
    return (bytes(range(251)) * (n // 251 + 1))[:n]


@pytest.mark.parametrize("size", list(SIZES.values()), ids=list(SIZES))
def test_a_result_of_each_size_class_comes_back_whole_through_fleetd(served, quiet, size):
    with served.connect() as client:
        assert client.submit("mk", size).result(BOUND_S) == pattern(size)
        # the next submit acknowledges that outcome: fleetd lets go of it (and of its memfd)
        assert client.submit("sq", 3).result(BOUND_S) == 9
        wait_until(lambda: memfds(served.proc.pid) == [], "fleetd to close the acknowledged value's memfd")


def test_a_512_mib_result_comes_back_whole_through_fleetd(served, quiet):
    size = 512 << 20
    with served.connect() as client:
        value = client.submit("mk", size).result(BOUND_S)
        assert len(value) == size and value == pattern(size)
        del value
        assert client.submit("sq", 3).result(BOUND_S) == 9
        wait_until(lambda: memfds(served.proc.pid) == [], "fleetd to close the acknowledged value's memfd")


def test_many_large_results_in_flight_together_each_come_back_whole(served, quiet):
    sizes = [(300 << 10) + i if i % 3 else 7 for i in range(fdpass.MAX_FRAME_FDS + 12)]  # large and small, mixed
    with served.connect() as client:
        futures = [client.submit("mk", n) for n in sizes]
        assert [f.result(BOUND_S) for f in futures] == [pattern(n) for n in sizes]
        assert client.submit("sq", 3).result(BOUND_S) == 9
        wait_until(lambda: memfds(served.proc.pid) == [], "fleetd to close the acknowledged values' memfds")


def test_a_large_array_result_is_built_over_its_workers_parcel_with_no_copy_on_the_way(served, quiet):
    """fleetd hands the client a read-only descriptor of the parcel the worker wrote (no
    memfd, no copy of its own); the client's array is a writable view of its private
    mapping of it, and its writes stay its own."""
    import numpy as np

    size = 8 << 20
    with served.connect() as client:
        value = client.submit("arr", size).result(BOUND_S)
        assert memfds(served.proc.pid) == []  # held for the client still (until acknowledged): no memfd made
        assert value.flags.writeable and np.array_equal(value, np.arange(size // 8, dtype=np.float64))
        assert type(memory_owner(value)).__name__ == "mmap"  # not a bytearray the client copied into
        value[:] = -1.0
        again = client.submit("arr", size).result(BOUND_S)
        assert again[0] == 0.0 and again[-1] == size // 8 - 1 and value[0] == -1.0
        assert client.submit("sq", 3).result(BOUND_S) == 9  # acknowledges both: fleetd lets their parcels go


def test_a_large_array_payload_is_built_over_the_workers_task_parcel_with_no_copy_of_its_own(served, quiet):
    """The client lays its payload out in the memfd as a parcel (its pickle, then each large
    buffer); fleetd packs each part as it is, and the worker's array is a writable view of
    its task parcel's mapping, not a bytearray copied from an in-band pickle."""
    import numpy as np

    value = np.arange(1 << 20, dtype=np.float64)  # 8 MiB
    with served.connect() as client:
        writable, owner, total = client.submit("mem", {"a": value, "b": b"q" * (1 << 19)}).result(BOUND_S)
    assert writable is True and owner == "mmap" and total == float(value.sum())


@pytest.fixture
def client_memfds(monkeypatch):
    """The inode of each memfd this process's client seals a payload into."""
    inodes, real = [], fdpass.sealed

    def recording(data, name="fleet-data"):
        fd = real(data, name)
        inodes.append(os.fstat(fd).st_ino)
        return fd

    monkeypatch.setattr(fdpass, "sealed", recording)
    return inodes


def test_a_large_payload_reaches_its_worker_in_the_clients_own_memfd_never_copied_by_fleetd(served, quiet,
                                                                                           client_memfds):
    """fleetd hands the worker the very memfd the client wrote (`fleet.shm.handoff`): the
    worker's array is a writable private mapping of it (its inode), not of a parcel fleetd
    copied the payload into. And fleetd lets it go at the outcome (`quiet`)."""
    import numpy as np

    value = np.arange(1 << 20, dtype=np.float64)  # 8 MiB
    with served.connect() as client:
        writable, path, inode, total = client.submit("map", value).result(BOUND_S)
    assert path.startswith("/memfd:") and inode in client_memfds, (path, inode, client_memfds)
    assert writable is True and total == float(value.sum())


def test_a_handed_payload_sent_ahead_to_a_worker_that_is_killed_runs_on_its_successor(served, quiet,
                                                                                    client_memfds, tmp_path):
    """A unit sent ahead to a worker (its payload's memfd handed with it) that is SIGKILLed
    before it starts goes to the seat's next worker, through that worker's new channel,
    and runs there over the same memfd; the unit that was running fails; nothing is left
    open in fleetd or in /dev/shm (`quiet`)."""
    import numpy as np

    pid_file, gate = tmp_path / "pid", tmp_path / "gate"
    value = np.full(1 << 20, 2.0)  # 8 MiB
    with served.connect() as client:
        running = client.submit("ahead", (str(pid_file), str(gate), None))
        wait_until(pid_file.exists, "the first unit to run")
        sent = client.submit("ahead", (None, None, value))
        wait_until(lambda: queue_depth(client, "ahead") == 0, "the second unit to be sent ahead to the worker")
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        with pytest.raises(fleet.UnitFailed):
            running.result(BOUND_S)
        writable, path, inode, total = sent.result(BOUND_S)
    assert path.startswith("/memfd:") and inode in client_memfds
    assert writable is True and total == float(value.sum())


def test_a_client_that_takes_parcels_gets_the_workers_parcel_unlinked_one_that_does_not_a_memfd(served, quiet):
    size = 3 << 20
    with control.ControlClient(served.socket_path) as c:
        token = "parcel-client-0123456789"  # a token's own: what its client takes is said at its submit
        submit_v1(c, token, size, parcels=True)
        (record,) = collect_all(c, token, 1, fds=True, parcels=True)
        held = record[outcome_record.VALUE_FD]
        assert isinstance(held, fdpass.Held), record
        target = os.readlink(f"/proc/self/fd/{held.fd}")
        assert target.startswith(f"/dev/shm/fleet.{served.name}") and target.endswith("(deleted)"), target
        assert outcome_record.result_of(outcome_record.parse(record), held, "mk") == pattern(size)
        assert held.fd == -1  # closed once the value is built
        token = "memfd-client-0123456789"
        submit_v1(c, token, size)
        (record,) = collect_all(c, token, 1, fds=True)
        assert isinstance(record[outcome_record.VALUE_FD], fdpass.Mapped)
        record[outcome_record.VALUE_FD].close()


def collect_all(c, token: str, n: int, **args) -> list:
    records, ack = [], 0
    while len(records) < n:
        reply = c.call("collect", token=token, timeout=5.0, ack=ack, **args)
        records += reply["outcomes"]
        ack = reply["first"] + len(reply["outcomes"])
    c.call("collect", token=token, timeout=0.0, ack=ack, **args)  # lets go of them
    return records


def submit_v1(c, token: str, *sizes, parcels: bool = False) -> None:
    units = [{"role": "mk", "payload": base64.b64encode(pickle.dumps(n)).decode(), "encoding": "pickle",
              "seq": i} for i, n in enumerate(sizes)]
    reply = c.call("submit_batch", v=1, token=token, units=units, fds=True, parcels=parcels)
    assert all(isinstance(u, int) for u in reply["units"]), reply


def test_a_large_result_comes_by_collect_in_a_memfd_and_base64_to_a_client_that_did_not_ask(served, quiet):
    size = 3 << 20
    with control.ControlClient(served.socket_path) as c:
        submit_v1(c, TOKEN, size)
        (record,) = collect_all(c, TOKEN, 1, fds=True)
        assert isinstance(record[outcome_record.VALUE_FD], fdpass.Mapped)
        assert outcome_record.result_of(outcome_record.parse(record), record[outcome_record.VALUE_FD], "mk") == \
            pattern(size)
        # a client of the last release asks no fds: the value comes base64, in parts
        token = "old-client-0123456789"
        c.call("submit_batch", v=1, token=token, units=[{"role": "mk", "payload": base64.b64encode(
            pickle.dumps(size)).decode(), "encoding": "pickle", "seq": 0}])
        records = collect_all(c, token, 1)
        records += collect_all(c, token, records[0]["parts"] - 1) if records[0].get("parts", 1) > 1 else []
        assert all(outcome_record.VALUE_FD not in r for r in records)
        assert base64.b64decode("".join(r["value"] for r in records)) == pickle.dumps(pattern(size), protocol=5) or \
            pickle.loads(base64.b64decode("".join(r["value"] for r in records))) == pattern(size)
    wait_until(lambda: memfds(served.proc.pid) == [], "fleetd to close the collected value's memfd")


def test_outcomes_past_the_held_bound_are_a_named_failure_or_dropped_and_their_memfds_closed():
    """limits.max_held_outcome_bytes: one value over it fails its unit ResultError naming the
    key; values held past it (nobody collects) are dropped, OutcomesDropped, memfds closed."""
    bound = 8 << 20
    with served_fleetd("ldh", roles(), limits={"max_held_outcome_bytes": bound}) as d:
        with d.connect() as client:
            with pytest.raises(fleet.UnitFailed, match=f"more than fleetd holds for one client: "
                                                       f"limits.max_held_outcome_bytes is {bound}"):
                client.submit("mk", 9 << 20).result(BOUND_S)
            assert client.submit("mk", 5 << 20).result(BOUND_S) == pattern(5 << 20)
            assert client.submit("sq", 3).result(BOUND_S) == 9  # acknowledges the value: its memfd goes
            wait_until(lambda: memfds(d.proc.pid) == [], "fleetd to close the acknowledged value's memfd")
        with control.ControlClient(d.socket_path) as c:
            token = "never-collects-0123456789"
            submit_v1(c, token, 5 << 20)
            wait_until(lambda: memfds(d.proc.pid), "the first value held in a memfd")
            submit_v1(c, token, 5 << 20)  # together past the bound: the token's outcomes go
            wait_until(lambda: memfds(d.proc.pid) == [], "fleetd to close the dropped values' memfds")
            with pytest.raises(control.RemoteError, match=f"more than {bound} bytes of uncollected") as raised:
                c.call("collect", token=token, timeout=0.0, fds=True)
            assert raised.value.type == "OutcomesDropped"


def test_an_unheard_clients_outcomes_go_after_held_outcome_ttl_s_and_the_refusal_names_the_key():
    with served_fleetd("ldt", roles(), limits={"held_outcome_ttl_s": 1}) as d, \
            control.ControlClient(d.socket_path) as c:
        token = "goes-quiet-0123456789"
        submit_v1(c, token, 300 << 10)  # held in a memfd: its closing tells that the outcome went
        wait_until(lambda: memfds(d.proc.pid), "the value held in a memfd")
        wait_until(lambda: memfds(d.proc.pid) == [], "fleetd to drop what nobody asked for within 1 s")
        with pytest.raises(control.RemoteError, match=r"nobody collected them for 1s \(limits.held_outcome_ttl_s\)") \
                as raised:
            c.call("collect", token=token, timeout=0.0, fds=True)
        assert raised.value.type == "OutcomesDropped"


def test_sighup_applies_fleetds_own_limits_live_and_only_them():
    bound = 8 << 20
    with served_fleetd("ldr", roles(), limits={"max_held_outcome_bytes": bound}) as d:
        with d.connect() as client:
            assert client.submit("mk", 5 << 20).result(BOUND_S) == pattern(5 << 20)
            d.write_config(roles(), limits={"max_held_outcome_bytes": 4 << 20, "held_outcome_ttl_s": 30})
            d.signal(signal.SIGHUP)
            d.wait_ready(count=2)
            assert any("applied limits.max_held_outcome_bytes, limits.held_outcome_ttl_s; needs a restart to "
                       "change: nothing" in line for line in d.stderr().splitlines()), d.stderr()[-2000:]
            with pytest.raises(fleet.UnitFailed, match=f"limits.max_held_outcome_bytes is {4 << 20}"):
                client.submit("mk", 5 << 20).result(BOUND_S)
            # the supervisor's limits still need a restart, and say so
            d.write_config(roles(), limits={"max_held_outcome_bytes": 4 << 20, "held_outcome_ttl_s": 30,
                                            "max_payload_bytes": 1 << 20})
            d.signal(signal.SIGHUP)
            d.wait_ready(count=3)
            assert any("applied nothing; needs a restart to change: limits" in line
                       for line in d.stderr().splitlines()), d.stderr()[-2000:]
            assert client.submit("sq", 3).result(BOUND_S) == 9


# --------------------------------------------------------------------------- hostile clients

def memfd(data: bytes, seals: int) -> int:
    fd = os.memfd_create("hostile", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


PAYLOAD = pickle.dumps(b"x" * 1000)
SEALED = fdpass.REQUIRED_SEALS | fcntl.F_SEAL_SEAL


def fd_unit(seq: int, index: int = 0, length: int = len(PAYLOAD)) -> dict:
    return {"role": "dig", "payload": None, "payload_fd": index, "payload_len": length, "encoding": "pickle",
            "seq": seq}


def b64_unit(seq: int) -> dict:
    return {"role": "sq", "payload": base64.b64encode(pickle.dumps(3)).decode(), "encoding": "pickle", "seq": seq}


def raw_call(d, frame: bytes, fds: list[int], *, close_after: bool = False):
    """Send ``frame`` with ``fds`` (one sendmsg) on a new connection; its reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(BOUND_S)
        sock.connect(d.socket_path)
        sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else [])
        if close_after:
            return None
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = sock.recv(65536)
            assert chunk, "fleetd closed the connection without a reply"
            buf += chunk
        return decode_reply(buf)


def batch(*units) -> bytes:
    return encode_request("submit_batch", {"v": 1, "token": TOKEN, "units": list(units)}, 7)


def pipe_fd() -> list[int]:
    r, w = os.pipe()
    os.close(w)
    return [r]


HOSTILE = {
    "unsealed": (lambda: [memfd(PAYLOAD, 0)], batch(fd_unit(1)),
                 "units[0]: payload_fd 0: the memfd is not sealed against shrinking, growing, writing"),
    "not sealed against writing": (lambda: [memfd(PAYLOAD, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)],
                                   batch(fd_unit(1)), "the memfd is not sealed against writing"),
    "a pipe": (pipe_fd, batch(fd_unit(1)), "units[0]: payload_fd 0: the descriptor is not a regular file"),
    "a wrong length": (lambda: [memfd(PAYLOAD, SEALED)], batch(fd_unit(1, length=len(PAYLOAD) + 1)),
                       f"the memfd holds {len(PAYLOAD)} bytes, the frame says {len(PAYLOAD) + 1}"),
    "more than a frame may carry": (lambda: [memfd(PAYLOAD, SEALED) for _ in range(fdpass.MAX_FRAME_FDS + 1)],
                                    batch(fd_unit(1)), f"a frame carries at most {fdpass.MAX_FRAME_FDS} file "
                                                       "descriptors; this one brought 65"),
    "more than a recvmsg takes": (lambda: [memfd(PAYLOAD, SEALED) for _ in range(100)], batch(fd_unit(1)),
                                  "and more, cut"),  # what one recvmsg's room took, and the flag that more came
    "claimed by no unit": (lambda: [memfd(PAYLOAD, SEALED), memfd(PAYLOAD, SEALED)], batch(fd_unit(1), b64_unit(2)),
                           "the frame brought 2 file descriptor(s); no unit names 1"),
    "named twice": (lambda: [memfd(PAYLOAD, SEALED)], batch(fd_unit(1), fd_unit(2)),
                    "units[1]: payload_fd 0 is named by units[0] too"),
    "named but not sent": (lambda: [], batch(b64_unit(1), fd_unit(2)),
                           "units[1]: payload_fd 0 names no descriptor: the frame brought 0"),
    "sent to an op that takes none": (lambda: [memfd(PAYLOAD, SEALED)], encode_request("ledger", {}, 7),
                                      "ledger: it carries no file descriptors; the frame brought 1"),
    "with a payload besides": (lambda: [memfd(PAYLOAD, SEALED)],
                               batch({**fd_unit(1), "payload": "eA=="}), "payload null"),
    # a laid-out payload's spans: all fleetd reads of the memfd, so each must stay within it
    "a span past its end": (lambda: [memfd(PAYLOAD, SEALED)],
                            batch({**fd_unit(1), "payload_spans": [[0, len(PAYLOAD) + 1]], "payload_oob": 0}),
                            f"payload_spans[0] [0, {len(PAYLOAD) + 1}] must follow the part before it (at 0) and "
                            f"end within the memfd's {len(PAYLOAD)} bytes"),
    "spans overlapping": (lambda: [memfd(PAYLOAD, SEALED)],
                          batch({**fd_unit(1), "payload_spans": [[0, 10], [5, 10]], "payload_oob": 1}),
                          "payload_spans[1] [5, 10] must follow the part before it (at 10)"),
    "a span not a pair": (lambda: [memfd(PAYLOAD, SEALED)],
                          batch({**fd_unit(1), "payload_spans": [[0, 10, 3]], "payload_oob": 0}),
                          "payload_spans[0] must be [offset, bytes], integers >= 0"),
    "more buffers than parts": (lambda: [memfd(PAYLOAD, SEALED)],
                                batch({**fd_unit(1), "payload_spans": [[0, 10]], "payload_oob": 1}),
                                "payload_oob must be 0-0 (the parts but the pickle), got 1"),
    "spans without a count": (lambda: [memfd(PAYLOAD, SEALED)],
                              batch({**fd_unit(1), "payload_spans": [[0, 10]]}),
                              "payload_spans and payload_oob go together"),
    "spans without a memfd": (lambda: [], batch({**b64_unit(1), "payload_spans": [[0, 1]], "payload_oob": 0}),
                              "payload_spans and payload_oob lay out a memfd: give payload_fd and payload_len too"),
}


@pytest.mark.parametrize("make, frame, needle", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_descriptor_is_refused_by_name_admits_nothing_and_leaves_nothing_open(served, quiet, make,
                                                                                       frame, needle):
    base = served.submitted()
    fds = make()
    try:
        reply = raw_call(served, frame, fds)
    finally:
        fdpass.close_all(fds)
    assert not reply.ok and reply.error_type == control.E_INVALID_ARGS, reply
    assert needle in reply.error_message, reply.error_message
    assert served.submitted() == base  # not even the frame's good units


def test_descriptors_belong_to_their_own_frame_when_frames_before_it_arrive_in_the_same_read(served, quiet):
    """fleetd stopped while a plain frame and then one with a memfd are written: its first read
    takes both (Linux glues plain bytes in front of a message with descriptors), and the
    descriptor still belongs to the second frame."""
    base = served.submitted()
    fd = memfd(PAYLOAD, SEALED)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(BOUND_S)
        sock.connect(served.socket_path)
        served.signal(signal.SIGSTOP)
        try:
            wait_until(lambda: all_stopped(served.proc.pid), "every thread of fleetd to stop")
            sock.sendall(encode_request("submit_batch", {"v": 1, "token": TOKEN, "units": [b64_unit(1)]}, 1))
            sock.sendmsg([encode_request("submit_batch", {"v": 1, "token": TOKEN, "units": [fd_unit(2)]}, 2)],
                         [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        finally:
            os.close(fd)
            served.signal(signal.SIGCONT)
        buf = b""
        while buf.count(b"\n") < 2:
            chunk = sock.recv(65536)
            assert chunk, "fleetd closed the connection"
            buf += chunk
    replies = [decode_reply(line) for line in buf.splitlines()]
    assert [r.ok for r in replies] == [True, True], replies
    assert served.submitted() == base + 2
    with control.ControlClient(served.socket_path) as c:
        outcomes = collect_all(c, TOKEN, 2)
    assert sorted((r["seq"], pickle.loads(base64.b64decode(r["value"]))) for r in outcomes) == [
        (1, 9), (2, (1000, hashlib.sha256(b"x" * 1000).hexdigest()))]


def test_descriptors_with_a_frame_cut_off_by_a_disconnect_are_closed_and_admit_nothing(served, quiet):
    base = served.submitted()
    fds = [memfd(PAYLOAD, SEALED) for _ in range(3)]
    frame = batch(fd_unit(1, 0), fd_unit(2, 1), fd_unit(3, 2))
    try:
        raw_call(served, frame[:-10], fds, close_after=True)
    finally:
        fdpass.close_all(fds)
    wait_until(lambda: open_fds(served.proc.pid) <= quiet, "fleetd to close the descriptors of the cut frame")
    assert served.submitted() == base


def test_a_connection_holding_too_many_unclaimed_descriptors_is_refused_and_closed(served, quiet):
    base = served.submitted()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(BOUND_S)
        sock.connect(served.socket_path)
        frame = batch(fd_unit(1))
        fds = [memfd(PAYLOAD, SEALED) for _ in range(fdpass.MAX_FRAME_FDS)]
        try:
            for k in range(3):  # no newline yet: the descriptors pile up, unclaimed
                sock.sendmsg([frame[k:k + 1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        finally:
            fdpass.close_all(fds)
        buf = b""
        while chunk := sock.recv(65536):
            buf += chunk
    reply = decode_reply(buf.split(b"\n")[0])
    assert reply.error_type == control.E_INVALID_ARGS and reply.id is None
    assert f"no frame has claimed (at most {fdpass.MAX_HELD_FDS})" in reply.error_message
    assert served.submitted() == base


def test_a_large_payload_of_a_client_of_another_uid_than_fleetds_arrives(tmp_path):
    """fleetd runs as uid 65534; this client (root, which may submit to it) trusts that uid:
    the memfd crosses whatever the uids."""
    if os.geteuid() != 0:
        require.lacking("root, to run fleetd as uid 65534")
    data = os.urandom(3 << 20)
    with served_fleetd("ldn", roles(), as_nobody=True) as d:
        name = d.name
        shm = shm_of(name)
        with d.connect(trust_uids=(NOBODY,)) as client:
            assert client.submit("dig", data).result(BOUND_S) == (len(data), hashlib.sha256(data).hexdigest())
        wait_until(lambda: shm_of(name) <= shm, "no parcel left in /dev/shm")


def test_a_limit_that_stays_is_a_typed_error_naming_the_size_and_its_key():
    """What fleetd is configured to refuse: a payload over limits.max_payload_bytes, or one
    alone over limits.max_parcel_bytes (the payload bytes held beside the rings at once)."""
    with served_fleetd("ldl", roles(), limits={"max_payload_bytes": 6 << 20, "max_parcel_bytes": 4 << 20}) as d:
        shm = shm_of(d.name)
        with d.connect() as client:
            with pytest.raises(fleet.PayloadTooLarge, match=r"is \d+ bytes pickled; limits.max_payload_bytes is "
                                                            f"{6 << 20}"):
                client.submit("dig", bytes(7 << 20)).result(BOUND_S)
            with pytest.raises(fleet.PayloadTooLarge, match=r"is \d+ bytes pickled, beside the ring; "
                                                            f"limits.max_parcel_bytes is {4 << 20}"):
                client.submit("dig", bytes(5 << 20)).result(BOUND_S)
            data = bytes(3 << 20)
            assert client.submit("dig", data).result(BOUND_S) == (len(data), hashlib.sha256(data).hexdigest())
        wait_until(lambda: settled(d), "the units to end")
        wait_until(lambda: shm_of(d.name) <= shm, "no parcel left in /dev/shm")


def own_memfds() -> int:
    return len(memfds(os.getpid()))


def test_a_memfd_outcome_let_go_at_the_ttl_or_past_the_bound_closes_its_descriptor():
    """The outcome store alone, its clock faked: a value held in a memfd for a client that
    never takes it is closed when the token expires, and when the token's outcomes pass the
    byte bound (its memfd's bytes counted)."""
    from concurrent.futures import Future

    from fleet.service.daemon import OutcomeStore
    from fleet.worker.codec import _Pickled

    def solved(n: int) -> Future:
        fut: Future = Future()
        fut.set_result(_Pickled(b"x" * n))
        return fut

    now = [0.0]
    store = OutcomeStore(max_bytes=3 << 20, ttl_s=10.0, clock=lambda: now[0])
    base = own_memfds()
    store.hold("expires-0123456789", fds=True)
    store.put("expires-0123456789", store.record("expires-0123456789", 1, "r", solved(1 << 20)))
    assert own_memfds() == base + 1
    now[0] = 11.0
    store.expire()
    assert own_memfds() == base
    store.hold("overflows-0123456789", fds=True)
    store.put("overflows-0123456789", store.record("overflows-0123456789", 1, "r", solved(2 << 20)))
    assert own_memfds() == base + 1
    store.put("overflows-0123456789", store.record("overflows-0123456789", 2, "r", solved(2 << 20)))
    assert own_memfds() == base
    with pytest.raises(control.OutcomesDropped, match="more than 3145728 bytes"):
        store.hold("overflows-0123456789")
