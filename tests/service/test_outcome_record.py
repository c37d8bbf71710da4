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

    def submit_batch(self, v, token, units, ack=None, fds=False, stream=None):
        return {"units": [7] * len(units), "errors": {}, "replayed": [], "roles": {}}

    def collect(self, *, token, timeout, ack=None, fds=False):
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
