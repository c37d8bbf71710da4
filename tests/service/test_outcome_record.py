"""The outcome record (fleet.service.control.outcome_record): every kind of outcome survives
the trip daemon -> JSON -> client, and a malformed record is a typed error naming
its field, both in the module and in a client served by a real socket."""
from __future__ import annotations

import json
import os
import tempfile
from concurrent.futures import Future

import pytest

from fleet.service import control
from fleet.api.client import Client
from fleet.service.control import outcome_record as rec
from fleet.rules.outcomes import FAILED, FAILURE_REASONS, SUPPRESSED
from fleet.rules.unit import Outcome, UnitFailed, UnitSuppressed, error_for
from tests.daemons import BOUND_S


def ended(unit=7, *, value=None, exc=None, cancel=False) -> Future:
    fut: Future = Future()
    fut.unit_id = unit
    if cancel:
        fut.cancel()
    elif exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)
    return fut


def through_the_wire(records: list[dict]) -> list[dict]:
    return [json.loads(json.dumps(r, allow_nan=False)) for r in records]


def received(fut: Future, role: str = "r"):
    """What a client makes of ``fut``'s records: the value, or the exception raised."""
    held: dict = {}
    outs = []
    for raw in through_the_wire(rec.encode(3, role, fut)):
        record = rec.parse(raw)
        assert record.seq == 3 and record.role == role
        value = rec.join_part(record, held)
        if value is rec.INCOMPLETE:
            continue
        try:
            outs.append(rec.result_of(record, value, role))
        except Exception as exc:  # a UnitError, or a handler's own exception (fleet.rules.raised)
            outs.append(exc)
    assert len(outs) == 1 and held == {}  # one outcome, no part left over
    return outs[0]


def test_a_solved_value_round_trips():
    assert received(ended(value={"a": [1, 2.5, "x"]})) == {"a": [1, 2.5, "x"]}
    assert received(ended(value=None)) is None


def test_a_value_larger_than_a_part_travels_in_parts_and_is_joined():
    big = os.urandom(rec.PART_CHARS)  # base64 of it spans two parts
    records = rec.encode(1, "r", ended(value=big))
    assert [r["part"] for r in records] == [0, 1] and {r["parts"] for r in records} == {2}
    assert received(ended(value=big)) == big


@pytest.mark.parametrize("reason", FAILURE_REASONS)
def test_each_failure_reason_round_trips(reason):
    fut = ended(exc=error_for(7, "r", Outcome(FAILED, reason, f"why: {reason}")))
    out = received(fut)
    assert isinstance(out, UnitFailed)
    assert (out.unit_id, out.role, out.outcome) == (7, "r", Outcome(FAILED, reason, f"why: {reason}"))


def test_a_suppressed_outcome_round_trips():
    out = received(ended(exc=error_for(7, "r", Outcome(SUPPRESSED, None, "not needed"))))
    assert isinstance(out, UnitSuppressed) and out.outcome == Outcome(SUPPRESSED, None, "not needed")


def test_a_unit_cancelled_in_the_daemon_arrives_failed_cancelled():
    out = received(ended(cancel=True))
    assert isinstance(out, UnitFailed) and out.outcome == Outcome(FAILED, "Cancelled", "cancelled in the daemon")


def test_the_handlers_exception_travels_with_a_handler_error_and_is_raised_as_itself():
    original = KeyError("missing key")
    out = received(ended(exc=error_for(7, "r", Outcome(FAILED, "HandlerError", "Traceback ..."), original)))
    assert type(out) is KeyError and out.args == ("missing key",)  # fleet.rules.raised
    assert "Traceback ..." in out.__cause__.tb


def test_an_exception_that_is_not_a_unit_error_arrives_as_a_result_error():
    out = received(ended(exc=RuntimeError("store broke")))
    assert out.outcome.reason == "ResultError"
    assert out.outcome.detail == "the daemon could not deliver the outcome: RuntimeError: store broke"


def test_a_value_the_daemon_cannot_pickle_arrives_as_a_result_error():
    import threading

    out = received(ended(value=threading.Lock()))
    assert out.outcome.reason == "ResultError" and "cannot be pickled" in out.outcome.detail


def test_a_long_traceback_keeps_its_tail():
    detail = "head\n" + "x" * rec.MAX_DETAIL_CHARS + "\nlast line"
    out = received(ended(exc=error_for(7, "r", Outcome(FAILED, "HandlerError", detail))))
    assert out.outcome.detail.startswith("[... cut ...]\n") and out.outcome.detail.endswith("\nlast line")
    assert "head" not in out.outcome.detail


def test_records_carry_the_version_and_one_without_it_reads_as_version_1():
    (record,) = rec.encode(1, "r", ended(value=5))
    assert record["v"] == rec.VERSION == 1
    del record["v"]
    assert rec.result_of(rec.parse(record), record["value"], "r") == 5


GOOD = rec.encode(1, "r", ended(value=5))[0]


@pytest.mark.parametrize("change, field", [
    ({"v": 2}, "v"),
    ({"kind": "won"}, "kind"),
    ({"kind": None}, "kind"),
    ({"seq": "1"}, "seq"),
    ({"seq": True}, "seq"),
    ({"unit": 1.5}, "unit"),
    ({"role": 3}, "role"),
    ({"value": None}, "value"),
    ({"value": 12}, "value"),
    ({"kind": FAILED, "reason": 4}, "reason"),
    ({"kind": FAILED, "detail": ["x"]}, "detail"),
    ({"kind": FAILED, "error": 1}, "error"),
    ({"part": 0}, "parts"),
    ({"parts": 2}, "part"),
    ({"part": 0, "parts": 0}, "parts"),
    ({"part": 2, "parts": 2}, "part"),
    ({"part": -1, "parts": 2}, "part"),
    ({"kind": FAILED, "part": 0, "parts": 2}, "parts"),
])
def test_a_malformed_record_is_a_protocol_error_naming_its_field(change, field):
    with pytest.raises(control.ProtocolError) as err:
        rec.parse({**GOOD, **change})
    assert isinstance(err.value, rec.BadOutcomeRecord) and err.value.field == field
    assert err.value.code == control.E_INVALID_REPLY and f"field {field!r}" in str(err.value)


def test_a_record_that_is_not_an_object_is_a_protocol_error():
    for bad in ([], "solved", None, 3):
        with pytest.raises(rec.BadOutcomeRecord, match="must be a JSON object"):
            rec.parse(bad)


def test_the_good_record_parses():  # the control of the malformed cases above
    assert rec.parse(GOOD) == rec.Record(1, 7, "r", "solved", value=GOOD["value"])


# ------------------------------------------------------------------- in a client


class OneRecord:
    """A daemon that admits units and answers every collect with the records it is given."""

    def __init__(self, records):
        self.records, self.sent = records, False

    def submit(self, **kwargs):
        return {"unit": 7}

    def submit_batch(self, v, token, units, ack=None, fds=False, parcels=False, stream=None):
        return {"units": [7] * len(units), "errors": {}, "replayed": [], "roles": {}}

    def collect(self, *, token, timeout, ack=None, fds=False, parcels=False):
        fut: Future = Future()
        records, self.sent = ([] if self.sent else self.records), True
        fut.set_result({"outcomes": records, "more": False, "closing": False})
        return fut


def serve(handler):
    run = tempfile.TemporaryDirectory(dir="/tmp")
    path = os.path.join(run.name, "f.sock")
    server = control.ControlServer(path, control.with_blocking_ops(handler, control.inline_dispatch(handler)))
    server.start()
    return run, server, path


@pytest.mark.parametrize("seq_of_bad, expect", [(1, rec.BadOutcomeRecord), ("nobody", control.FleetConnectionLost)])
def test_a_client_fails_the_unit_a_malformed_record_names_or_all_when_it_names_none(seq_of_bad, expect):
    handler = OneRecord([{**GOOD, "seq": seq_of_bad, "kind": "won"}])
    run, server, path = serve(handler)
    client = Client("f", path, timeout=BOUND_S)
    try:
        fut = client.submit("r", 1)
        with pytest.raises(expect) as err:
            fut.result(BOUND_S)
        assert "'kind'" in str(err.value)
    finally:
        client.close()
        server.close()
        run.cleanup()


def test_a_client_resolves_a_good_record():  # the control of the test above
    run, server, path = serve(OneRecord([GOOD]))
    client = Client("f", path, timeout=BOUND_S)
    try:
        assert client.submit("r", 1).result(BOUND_S) == 5
    finally:
        client.close()
        server.close()
        run.cleanup()


# ---------------------------------------------------------------- values in memfds (claim_values)

VALUE = b"v" * 4096


def _memfd(data: bytes = VALUE, sealed: bool = True) -> int:
    import fcntl

    from fleet.service.control import fds as fdpass

    fd = os.memfd_create("value", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if sealed:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fdpass.REQUIRED_SEALS)
    return fd


def _inodes(fds) -> set:
    return {(st.st_dev, st.st_ino) for st in map(os.fstat, fds)}


def _held(inodes: set) -> set:
    """Which of ``inodes`` a descriptor of this process still refers to (a mapping's own
    duplicate included: mmap keeps one)."""
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            st = os.stat(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, gone
        if (st.st_dev, st.st_ino) in inodes:
            out.add((st.st_dev, st.st_ino))
    return out


def _fd_record(seq: int, index, length=len(VALUE)) -> dict:
    return {rec.V: rec.VERSION, rec.SEQ: seq, rec.KIND: rec.SOLVED, rec.VALUE_FD: index, rec.VALUE_LEN: length}


def test_values_in_memfds_are_mapped_in_their_records_places():
    other = b"w" * 100
    fds = [_memfd(), _memfd(other)]
    records = [_fd_record(1, 1, len(other)), {rec.V: rec.VERSION, rec.SEQ: 2, rec.KIND: rec.SOLVED, rec.VALUE: "eA=="},
               _fd_record(3, 0)]
    inodes = _inodes(fds)
    rec.claim_values(records, fds)
    try:
        assert bytes(records[0][rec.VALUE_FD].view) == other and bytes(records[2][rec.VALUE_FD].view) == VALUE
        assert rec.VALUE_FD not in records[1]
    finally:
        for r in (records[0], records[2]):
            r[rec.VALUE_FD].close()
    assert not _held(inodes)  # the frame's descriptors closed, and the mappings' own with them


@pytest.mark.parametrize("records, nfds, field, needle", [
    ([_fd_record(1, 2)], 1, rec.VALUE_FD, "outcome of seq 1: value_fd 2 names no descriptor: the frame brought 1"),
    ([_fd_record(1, 0), _fd_record(2, 0)], 1, rec.VALUE_FD, "value_fd 0 is named by seq 1 too"),
    ([_fd_record(1, 0)], 2, rec.VALUE_FD, "the frame brought 2 file descriptor(s); no record names 1"),
    ([], 1, rec.VALUE_FD, "no record names 0"),
    ([_fd_record(1, -1)], 1, rec.VALUE_FD, "must be a descriptor's index"),
    ([_fd_record(1, "0")], 1, rec.VALUE_FD, "must be a descriptor's index"),
    ([_fd_record(1, 0, 0)], 1, rec.VALUE_LEN, "must be an integer >= 1"),
    ([_fd_record(1, 0, len(VALUE) + 1)], 1, rec.VALUE_FD, f"the memfd holds {len(VALUE)} bytes"),
], ids=["past the frame's", "named twice", "named by none", "no record", "negative", "a string", "no length",
        "a wrong length"])
def test_a_value_fd_that_does_not_fit_is_a_bad_record_naming_it_and_every_descriptor_is_closed(records, nfds, field,
                                                                                              needle):
    fds = [_memfd() for _ in range(nfds)]
    inodes = _inodes(fds)
    with pytest.raises(rec.BadOutcomeRecord) as err:
        rec.claim_values(records, fds)
    assert err.value.field == field and needle in err.value.message, err.value.message
    assert not _held(inodes)


def test_an_unsealed_value_memfd_is_refused_and_the_ones_mapped_before_it_are_released():
    fds = [_memfd(), _memfd(sealed=False)]
    inodes = _inodes(fds)
    records = [_fd_record(1, 0), _fd_record(2, 1)]
    with pytest.raises(rec.BadOutcomeRecord, match="value_fd 1: the memfd is not sealed") as err:
        rec.claim_values(records, fds)
    assert err.value.field == rec.VALUE_FD
    assert not _held(inodes)  # the first one's mapping was released too
    assert records[0][rec.VALUE_FD] == 0  # nothing was put in a record's place


# ---------------------------------------------------------------- values in their workers' parcels

def _relayed_from_a_parcel(value, *, lend: bool = False):
    """A relayed value as fleetd holds it: pickled by a worker into a parcel (lent or taken)
    and opened by the supervisor (`codec.result_outcome` with relay)."""
    import numpy as np  # noqa: F401 - the values below may be arrays

    from fleet.shm import messages as M
    from fleet.shm import parcels
    from fleet.worker import codec

    fleet = f"rec-{os.getpid()}"
    lender = parcels.Lender(fleet) if lend else None
    body, name = codec.pack(value, "v", fleet, take=True, inline_max=0,
                            writer=None if lender is None else lender.write, lend=lend)
    outcome, relayed, _ = codec.result_outcome(M.ST_SOLVED, memoryview(body), relay=True)
    return relayed, name, fleet, lender


def _parcel_records(value, **kw):
    from fleet.shm import parcels

    relayed, name, fleet, _lender = _relayed_from_a_parcel(value, **kw)
    try:
        return relayed, rec.encode(3, "r", ended(value=relayed), fds=True, parcels=True), fleet
    finally:
        parcels.sweep(fleet)  # a lent one's warm name, once given back, too


def test_a_value_in_its_workers_parcel_goes_as_a_read_only_descriptor_of_that_parcel_and_arrives_writable():
    import fcntl

    import numpy as np

    from fleet.service.control import fds as fdpass

    value = {"a": np.arange(1 << 17, dtype=np.float64), "b": b"z" * (300 << 10)}
    relayed, (record,), _fleet = _parcel_records(value)
    held = record[rec.VALUE_FD]
    assert type(held) is fdpass.Held and record[rec.VALUE_LEN] == held.size
    assert record[rec.VALUE_OOB] == 1 and len(record[rec.VALUE_SPANS]) == 3  # the pickle, the array, the blob
    # the very parcel the worker wrote (no copy made), and read-only for the client
    assert os.fstat(held.fd).st_ino == os.fstat(relayed._fd).st_ino and os.fstat(held.fd).st_nlink == 0
    assert fcntl.fcntl(held.fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    wire = json.loads(json.dumps({**record, rec.VALUE_FD: 0}))
    fds = [os.dup(held.fd)]
    held.close()
    relayed.close()
    rec.claim_values([wire], fds)
    parsed = rec.parse(wire)
    got = rec.result_of(parsed, rec.join_part(parsed, {}), "r")
    assert got["b"] == value["b"] and np.array_equal(got["a"], value["a"])
    assert got["a"].flags.writeable
    got["a"][0] = -1.0  # the client's own pages (copy on write): the parcel is not written
    from tests.handlers import memory_owner

    assert type(memory_owner(got["a"])).__name__ == "mmap"  # built over the mapping: no copy on the client's side


def test_a_lent_parcels_value_and_one_for_a_client_without_parcels_go_in_a_memfd():
    import numpy as np

    from fleet.service.control import fds as fdpass

    from fleet.shm import parcels

    value = np.ones(1 << 16)
    relayed, (record,), fleet = _parcel_records(value, lend=True)  # its writer writes it again once given back
    try:
        assert type(record[rec.VALUE_FD]) is fdpass.Sealed
        record[rec.VALUE_FD].close()
    finally:
        relayed.close()  # given back: under its warm name
        parcels.sweep(fleet)
    relayed, name, fleet, _ = _relayed_from_a_parcel(value)
    try:
        (record,) = rec.encode(3, "r", ended(value=relayed), fds=True)
        assert type(record[rec.VALUE_FD]) is fdpass.Sealed
        record[rec.VALUE_FD].close()
    finally:
        relayed.close()
        parcels.sweep(fleet)


def _parcel_fd(data: bytes = VALUE, *, unlinked: bool = True) -> int:
    path = f"/dev/shm/rec-parcel-{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    if unlinked:
        os.unlink(path)
    return fd


def _parcel_record(seq: int, index: int, spans, oob=0, length=len(VALUE)) -> dict:
    return {**_fd_record(seq, index, length), rec.VALUE_SPANS: spans, rec.VALUE_OOB: oob}


@pytest.mark.parametrize("change, field, needle", [
    ({rec.VALUE_SPANS: []}, rec.VALUE_SPANS, "non-empty list of [offset, bytes] pairs"),
    ({rec.VALUE_SPANS: [[0]]}, rec.VALUE_SPANS, "non-empty list of [offset, bytes] pairs"),
    ({rec.VALUE_SPANS: [[0, -1]]}, rec.VALUE_SPANS, "non-empty list of [offset, bytes] pairs"),
    ({rec.VALUE_SPANS: [["0", 1]]}, rec.VALUE_SPANS, "non-empty list of [offset, bytes] pairs"),
    ({rec.VALUE_OOB: 1}, rec.VALUE_OOB, "must be an integer from 0 to 0"),
    ({rec.VALUE_OOB: None}, rec.VALUE_OOB, "must be an integer from 0 to 0"),
], ids=["no span", "half a pair", "negative", "a string", "more buffers than parts", "no buffer count"])
def test_a_parcel_record_with_a_bad_layout_is_a_bad_record_naming_its_field(change, field, needle):
    raw = {**_parcel_record(1, 0, [[0, len(VALUE)]]), **change}
    rec.claim_values([raw], [_parcel_fd()])
    try:
        with pytest.raises(rec.BadOutcomeRecord) as err:
            rec.parse(raw)
        assert err.value.field == field and needle in err.value.message, err.value.message
    finally:
        raw[rec.VALUE_FD].close()


def test_a_layout_past_the_parcels_end_fails_its_unit_result_error_not_the_client():
    import pickle

    data = pickle.dumps(b"x" * 100)
    raw = _parcel_record(1, 0, [[0, len(data) + 1]], length=len(data))
    rec.claim_values([raw], [_parcel_fd(data)])
    record = rec.parse(raw)
    with pytest.raises(UnitFailed, match="does not fit its parcel") as err:
        rec.result_of(record, rec.join_part(record, {}), "r")
    assert err.value.outcome.reason == "ResultError"


def test_a_parcel_with_a_name_or_of_another_size_is_refused_and_every_descriptor_closed():
    named = _parcel_fd(unlinked=False)
    try:
        inodes = _inodes([named])
        with pytest.raises(rec.BadOutcomeRecord, match=r"value_fd 0: the file still has a name \(1 link") as err:
            rec.claim_values([_parcel_record(1, 0, [[0, len(VALUE)]])], [named])
        assert err.value.field == rec.VALUE_FD and not _held(inodes)
    finally:
        os.unlink(f"/dev/shm/rec-parcel-{os.getpid()}")
    fds = [_parcel_fd()]
    inodes = _inodes(fds)
    with pytest.raises(rec.BadOutcomeRecord, match=f"the parcel holds {len(VALUE)} bytes, the record says 5"):
        rec.claim_values([_parcel_record(1, 0, [[0, 5]], length=5)], fds)
    assert not _held(inodes)


def test_a_layout_without_a_parcels_descriptor_is_a_bad_record():
    raw = {rec.V: rec.VERSION, rec.SEQ: 1, rec.KIND: rec.SOLVED, rec.VALUE: "eA==", rec.VALUE_SPANS: [[0, 1]]}
    with pytest.raises(rec.BadOutcomeRecord, match="a layout comes only with a parcel's descriptor"):
        rec.parse(raw)
