"""The task/result codec (fleet.worker.codec): every result status decodes to its outcome;
a task body is refused, typed, when it cannot be pickled or is too large; whatever a
unit's objects do when they are pickled or unpickled is a CodecError naming why."""
from __future__ import annotations

import os
import pathlib
import pickle
import pickletools
import subprocess
import sys
import threading
import weakref

import pytest

from fleet.worker import codec
from fleet.shm import messages as M
from tests import hostile as H
from fleet.rules.unit import PayloadTooLarge, PayloadUnpicklable


def _dumps(v) -> bytes:
    return pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)


_FAILED_ITEM = (M.ST_HANDLER_ERROR, ("tb", None))


@pytest.mark.parametrize(
    "status, body, kind, reason, value",
    [
        (M.ST_SOLVED, _dumps({"a": 1}), "solved", None, {"a": 1}),
        (M.ST_SOLVED, b"not a pickle", "failed", "ResultError", None),
        (M.ST_SUPPRESSED, b"duplicate", "suppressed", None, None),
        (M.ST_RESULT_ERROR, b"too big", "failed", "ResultError", None),
        (M.ST_START_REFUSED, b"refused", "failed", "FsmRefused", None),
        (M.ST_COMPLETION_REFUSED, b"refused", "failed", "FsmRefused", None),
        (M.ST_HELD_AT_CLOSE, b"closing", "failed", "Shutdown", None),
        (250, b"who knows", "failed", "LaneDeath", None),
        (M.ST_CHUNK, _dumps(([1, 2], {})), "solved", None, ([1, 2], {})),
        (M.ST_CHUNK_SUPPRESSED, _dumps(([1, None], {1: (M.ST_SUPPRESSED, "dup")})), "suppressed", None,
         ([1, None], {1: (M.ST_SUPPRESSED, "dup")})),
        (M.ST_CHUNK_FAILED, _dumps(([None, 2], {0: _FAILED_ITEM})), "failed", "HandlerError",
         ([None, 2], {0: _FAILED_ITEM})),
        (M.ST_CHUNK, b"not a pickle", "failed", "ResultError", None),
    ],
)
def test_each_result_status_decodes_to_its_outcome(status, body, kind, reason, value):
    outcome, got, original = codec.result_outcome(status, memoryview(body))
    assert (outcome.kind, outcome.reason, got, original) == (kind, reason, value, None)


@pytest.mark.parametrize("status", [M.ST_SOLVED, M.ST_CHUNK])
@pytest.mark.parametrize("body, relay", [
    (_dumps({"a": 1}), False),
    (_dumps(None), False),
    (_dumps(([1, 2], {})), False),
    (b"not a pickle", False),
    (b"", False),
    (_dumps(H.ExitsOnLoad()), False),  # raises SystemExit as it is unpickled: the guard's ResultError
    (_dumps([1, 2]), True),  # relayed to fleetd's client: kept pickled
])
def test_the_loops_solved_path_decodes_as_every_result_does(status, body, relay):
    # `solved_outcome` is the loop's one-frame path for solved results (a unit's, a chunk's
    # whose every item solved): what it says of a body is what `result_outcome` says of
    # it, failures and their text included.
    got = codec.solved_outcome(status, memoryview(body), relay)
    want = codec.result_outcome(status, memoryview(body), relay=relay)
    assert got[0] == want[0] and got[2] == want[2]
    assert (type(got[1]), getattr(got[1], "data", got[1])) == (type(want[1]), getattr(want[1], "data", want[1]))


def test_a_handler_error_keeps_its_traceback_and_original_exception():
    body = _dumps(codec.error_parts("Traceback...", KeyError("k")))
    outcome, value, original = codec.result_outcome(M.ST_HANDLER_ERROR, body)
    assert (outcome.kind, outcome.reason, outcome.detail, value) == ("failed", "HandlerError", "Traceback...", None)
    assert isinstance(original, KeyError) and original.args == ("k",)


def test_a_refusal_travels_with_the_instant_it_was_met():
    from fleet.rules.outcomes import Refused

    # the worker's instant when the handler gave none; the handler's own when it did
    for refusal, raised_at, at in ((Refused(429, "slow", 3), 7.5, 7.5), (Refused(429, "slow", 3, at=2.0), 7.5, 2.0)):
        outcome, _value, original = codec.result_outcome(M.ST_REFUSED, codec.refused_body(refusal, raised_at))
        assert (outcome.reason, original.status, original.retry_after, original.at) == ("Refused", 429, 3.0, at)
        assert pickle.loads(pickle.dumps(original)).at == at  # and on to a service-mode client


def test_a_task_body_round_trips_and_a_client_pickled_payload_stays_pickled():
    body = codec.task_body("r", [1, 2], "k", "lane", "req", pickled_payload=None, limit=1 << 20)
    assert pickle.loads(body) == ([1, 2], "k", "lane", "req")
    body = codec.task_body("r", None, None, None, None, pickled_payload=_dumps("remote"), limit=1 << 20)
    payload, *_ = pickle.loads(body)
    assert type(payload).__name__ == "_Pickled" and payload.load() == "remote"


class _WholePath(Exception):
    """Raised where `pack_task`'s whole path would pickle: the relayed path was not taken."""


def _whole_path(*_args, **_kwargs):
    raise _WholePath


def test_a_client_pickled_payload_alone_is_relayed_as_it_is(monkeypatch):
    """fleetd's common unit (a client's pickled bytes, nothing beside them, inline) is
    pickled as it is: the same body the whole path makes, none of its steps taken; the
    payload limit still holds. Anything else beside it, or bytes that do not go inline,
    take the whole path."""
    raw = _dumps({"x": [1, 2]})
    whole = codec.task_body("r", None, None, None, None, pickled_payload=raw, limit=None)
    monkeypatch.setattr(codec, "_set_aside", _whole_path)
    assert codec.pack_task("r", None, None, None, None, pickled_payload=raw, limit=None,
                           fleet="f") == (whole, None, 0)
    with pytest.raises(PayloadTooLarge, match="limits.max_payload_bytes is 10"):
        codec.pack_task("r", None, None, None, None, pickled_payload=raw, limit=10, fleet="f")
    for key, lane, request_id in (("k", None, None), (None, "io", None), (None, None, "req")):
        with pytest.raises(_WholePath):
            codec.pack_task("r", None, key, lane, request_id, pickled_payload=raw, limit=None, fleet="f")
    with pytest.raises(_WholePath):  # not plain bytes (a memfd's mapping is laid out)
        codec.pack_task("r", None, None, None, None, pickled_payload=bytearray(raw), limit=None, fleet="f")
    with pytest.raises(_WholePath):  # too large to go inline: a parcel
        codec.pack_task("r", None, None, None, None, pickled_payload=raw, limit=None, fleet="f",
                        inline_max=len(raw))


def test_a_task_body_is_refused_typed():
    with pytest.raises(PayloadUnpicklable, match="role 'r'.*lock"):
        codec.task_body("r", threading.Lock(), None, None, None, pickled_payload=None, limit=1 << 20)
    with pytest.raises(PayloadUnpicklable, match="role 'r' cannot be pickled: SystemExit: 5"):
        codec.task_body("r", H.ExitsOnDump(), None, None, None, pickled_payload=None, limit=1 << 20)
    with pytest.raises(PayloadTooLarge, match="limits.max_payload_bytes is 100"):
        codec.task_body("r", b"x" * 200, None, None, None, pickled_payload=None, limit=100)


def test_a_relayed_value_stays_pickled_for_the_client():
    body = _dumps({"a": 1})
    outcome, value, _ = codec.result_outcome(M.ST_SOLVED, memoryview(body), relay=True)
    assert outcome.kind == "solved" and type(value).__name__ == "_Pickled" and value.data == body
    assert value.load() == {"a": 1}


def test_a_relayed_chunk_and_handler_exception_stay_pickled_for_the_client():
    # fleetd runs no code of a unit's: a chunk whose values would exit when unpickled
    # is relayed unread (its status says how it ended), and so is a handler's exception.
    body = _dumps(([H.ExitsOnLoad()], {}))
    outcome, value, _ = codec.result_outcome(M.ST_CHUNK, memoryview(body), relay=True)
    assert outcome.kind == "solved" and type(value).__name__ == "_Pickled" and value.data == body
    body = _dumps(codec.error_parts("tb", H.ExitsOnLoadError("x")))
    outcome, _, original = codec.result_outcome(M.ST_HANDLER_ERROR, memoryview(body), relay=True)
    assert (outcome.reason, outcome.detail, type(original).__name__) == ("HandlerError", "tb", "_Pickled")


@pytest.mark.parametrize("hostile, why", [
    (H.ExitsOnLoad(), "SystemExit: 7"),
    (H.InterruptsOnLoad(), "KeyboardInterrupt"),
    (H.RaisesOnLoad(), "ValueError: refuses to be rebuilt"),
    (H.RunsOutOfMemoryOnLoad(), "MemoryError: pretend"),
    (H.RecursesOnLoad(), "RecursionError: maximum recursion depth exceeded"),
])
def test_whatever_unpickling_raises_is_a_codec_error_naming_it(hostile, why):
    with pytest.raises(codec.CodecError, match=f"^the thing cannot be unpickled in the test: {why}"):
        codec.loads(_dumps(hostile), "the thing", "in the test")


@pytest.mark.parametrize("hostile, why", [
    (H.ExitsOnDump(), "SystemExit: 5"),
    (H.InterruptsOnDump(), "KeyboardInterrupt"),
    (H.RaisesOnDump(), "ValueError: refuses to be pickled"),
    (H.nested(5000), "RecursionError: maximum recursion depth exceeded while pickling"),
    (threading.Lock(), "TypeError: cannot pickle '_thread.lock' object"),
])
def test_whatever_pickling_raises_is_a_codec_error_naming_it(hostile, why):
    with pytest.raises(codec.CodecError, match=f"^the thing cannot be pickled: {why}"):
        codec.dumps(hostile, "the thing")


@pytest.mark.parametrize("status", [M.ST_SOLVED, M.ST_CHUNK, M.ST_CHUNK_SUPPRESSED, M.ST_CHUNK_FAILED,
                                    M.ST_HANDLER_ERROR, M.ST_REFUSED])
def test_a_result_body_that_exits_when_unpickled_is_a_result_error(status):
    outcome, value, original = codec.result_outcome(status, memoryview(_dumps(H.ExitsOnLoad())))
    assert (outcome.kind, outcome.reason, value, original) == ("failed", "ResultError", None, None)
    assert outcome.detail.endswith("cannot be unpickled here: SystemExit: 7")


def test_an_exception_that_cannot_be_rebuilt_here_leaves_its_text_and_says_why():
    body = _dumps(codec.error_parts("Traceback...\nUnrebuildable: one and two", H.Unrebuildable("one", "two")))
    outcome, _, original = codec.result_outcome(M.ST_HANDLER_ERROR, body)
    assert (outcome.reason, original) == ("HandlerError", None)
    first, *rest = outcome.detail.splitlines()
    assert first.startswith("the handler's exception cannot be unpickled here: TypeError: ")
    assert rest == ["Traceback...", "Unrebuildable: one and two"]  # its last line is still the handler's


@pytest.mark.parametrize("exc, why", [
    (H.ExitsOnDumpError("x"), "the handler's exception cannot be pickled: SystemExit: 6"),
    (ValueError(b"x" * codec.MAX_ERROR_BYTES), "the handler's exception is "),
])
def test_an_exception_that_cannot_travel_goes_as_its_text_saying_why(exc, why):
    text, raw = codec.error_parts("tb", exc)
    assert raw is None and text.startswith(why) and text.endswith("\ntb")


def test_a_failure_is_named_even_when_its_text_cannot_be_read_or_runs_long():
    assert codec.describe(H.UnprintableError()) == "UnprintableError: (the text of a UnprintableError cannot be read)"
    long = codec.describe(ValueError("x" * 10_000))
    assert long == "ValueError: " + "x" * codec.MAX_WHY_CHARS + "..."


_DEEP_UNDER_A_RAISED_LIMIT = """
import sys
from fleet.worker import codec
from tests.hostile import nested
sys.setrecursionlimit(10**7)
deep = nested(200_000)
try:
    codec.dumps(deep, "the deep value")
except codec.CodecError as exc:
    print(exc)
print(sys.getrecursionlimit())
"""


def test_the_guard_bounds_recursion_where_the_limit_was_raised():
    # Pickled under a limit of 10**7, this value overflows the C stack: the process dies.
    run = subprocess.run([sys.executable, "-c", _DEEP_UNDER_A_RAISED_LIMIT], capture_output=True, text=True,
                         timeout=120, cwd=pathlib.Path(__file__).parent.parent.parent)
    assert run.returncode == 0, run.stderr[-2000:]
    failure, limit = run.stdout.splitlines()
    assert failure.startswith("the deep value cannot be pickled: RecursionError")
    assert limit == str(10**7)  # and the process's own limit is given back


# --- beside the ring: parcels ------------------------------------------------------------------
@pytest.fixture
def fleet_name():
    from fleet.shm import parcels
    from tests.fleets import unique_name

    name = unique_name("cd")
    yield name
    parcels.sweep(name)


def test_a_small_value_travels_inline_and_a_large_buffer_beside_the_ring(fleet_name):
    import numpy as np
    from fleet.shm import parcels

    body, parcel = codec.pack({"a": np.arange(10.0)}, "the result", fleet_name, take=True)
    assert parcel is None and body[0] == 0x80 and parcels.count(fleet_name) == 0
    big = np.arange(codec.OOB_MIN // 8, dtype=np.float64)
    body, parcel = codec.pack({"a": big, "b": b"x"}, "the result", fleet_name, take=True)
    assert parcel is not None and len(body) < 200 and parcels.count(fleet_name) == 1
    name, size = codec.parcel_of(body)
    assert name == parcel and size > big.nbytes
    value = codec.loads(body, "the result")
    assert parcels.count(fleet_name) == 0  # a result's parcel is taken by its receiver
    assert value["b"] == b"x" and np.array_equal(value["a"], big)
    assert value["a"].flags.writeable  # the receiver's own, over its mapping
    value["a"][0] = -1.0
    assert value["a"][0] == -1.0 and big[0] == 0.0


def test_a_pickle_too_large_for_the_ring_travels_whole_beside_it(fleet_name):
    from fleet.shm import parcels

    data = b"y" * (codec.INLINE_MAX + 1)  # bytes pickle in band: the pickle itself is large
    body, parcel = codec.pack(data, "the result", fleet_name, take=True, inline_max=codec.INLINE_MAX)
    assert parcel is not None and codec.parcel_of(body)[1] > codec.INLINE_MAX
    assert codec.loads(body, "the result") == data and parcels.count(fleet_name) == 0


@pytest.mark.parametrize("value", [None, True, 7, -(1 << 70), 2.5, 1j, "", "é" * 10, "s" * (codec.INLINE_MAX + 1)],
                         ids=["None", "bool", "int", "bigint", "float", "complex", "empty", "text", "long text"])
def test_an_atom_result_travels_as_any_value_does(fleet_name, value):
    # `pack`'s shortcut for values with nothing to set aside (no buffer_callback, no scan):
    # the same pickle, inline up to inline_max and beside the ring past it.
    from fleet.shm import parcels

    body, parcel = codec.pack(value, "the result", fleet_name, take=True, inline_max=codec.INLINE_MAX)
    long = type(value) is str and len(value) > codec.INLINE_MAX
    assert (parcel is not None) == long and parcels.count(fleet_name) == int(long)
    if not long:
        assert bytes(body) == pickle.dumps(value, protocol=5)
    assert codec.loads(body, "the result") == value and parcels.count(fleet_name) == 0


def test_a_large_bytes_result_alone_is_set_aside_not_copied_into_the_pickle(fleet_name):
    # No atom: pickle would copy a bytes into the pickle before it went beside the ring.
    from fleet.shm import parcels

    data = b"x" * codec.OOB_MIN
    body, parcel = codec.pack(data, "the result", fleet_name, take=True)
    name, _offsets, sizes, n_oob = pickle.loads(bytes(body[2:]))
    assert name == parcel and n_oob == 0 and sizes[0] < 100 and list(sizes[1:]) == [len(data)]
    assert codec.loads(body, "the result") == data and parcels.count(fleet_name) == 0


def test_only_a_body_naming_a_parcel_or_routed_is_lent_for_its_run(fleet_name):
    # What a worker's run wraps in `lending` (the mappings its payload's unpickling makes,
    # given back at its end): a body naming a parcel, or one whose route hides its start.
    import numpy as np

    inline = codec.task_body("r", (abs, (-1,), {}), None, None, None, pickled_payload=None, limit=None)
    beside, parcel = codec.pack_task("r", np.zeros(codec.OOB_MIN), None, None, None, pickled_payload=None,
                                     limit=None, fleet=fleet_name)[:2]
    assert not codec.names_parcel(inline) and not codec.names_parcel(memoryview(b""))
    assert codec.names_parcel(beside) and codec.names_parcel(memoryview(beside))
    assert codec.names_parcel(inline, routed=True)
    from fleet.shm import parcels

    parcels.remove(parcel)


def test_a_task_body_beside_the_ring_stays_for_its_sender_to_remove(fleet_name):
    import numpy as np
    from fleet.shm import parcels

    arg = np.ones(1 << 18)
    body, parcel, size = codec.pack_task("r", arg, None, None, None, pickled_payload=None, limit=None,
                                         fleet=fleet_name)
    assert size == codec.parcel_of(body)[1] > arg.nbytes
    for _ in range(2):  # a unit run again (a provider's refusal) reads the payload as it was sent
        payload, *_rest = codec.loads(body, "the payload", "in the worker")
        assert payload.flags.writeable and payload.sum() == arg.size
        payload[:] = 0  # the worker's own copy-on-write mapping
    assert parcels.count(fleet_name) == 1 and parcels.remove(parcel)
    with pytest.raises(codec.CodecError, match="the payload cannot be unpickled in the worker: ParcelError"):
        codec.loads(body, "the payload", "in the worker")


def test_a_configured_payload_cap_refuses_a_parcel_by_size_and_key_and_leaves_nothing(fleet_name):
    from fleet.shm import parcels

    with pytest.raises(PayloadTooLarge, match=r"is \d+ bytes pickled; limits.max_payload_bytes is 1048576"):
        codec.pack_task("r", bytearray(2 << 20), None, None, None, pickled_payload=None, limit=1 << 20,
                        fleet=fleet_name)
    assert parcels.count(fleet_name) == 0


def test_a_relayed_value_beside_the_ring_stays_in_its_parcel_until_written_out_whole(fleet_name):
    import numpy as np
    from fleet.shm import parcels

    value = {"array": np.arange(codec.OOB_MIN, dtype=np.int32), "bytes": b"z" * (codec.INLINE_MAX + 1)}
    body, _ = codec.pack(value, "the result", fleet_name, take=True)
    outcome, relayed, _ = codec.result_outcome(M.ST_SOLVED, memoryview(body), relay=True)
    assert outcome.kind == "solved" and isinstance(relayed, codec._Pickled)
    assert parcels.count(fleet_name) == 0  # taken by the supervisor as it opened it
    pieces = relayed.pieces()
    # the large parts are views of the parcel, not copies: nothing large was copied to compose it
    assert [type(p) for p in pieces if memoryview(p).nbytes >= codec.OOB_MIN] == [memoryview, memoryview]
    sent = b"".join(pickle.PickleBuffer(p) if isinstance(p, memoryview) else p for p in pieces)  # a memfd's bytes
    del pieces
    # the array's buffer goes as a bytearray (the client's array is built over it as it is);
    # the bytes value and the pickle as bytes
    ops = [op.name for op, _, _ in pickletools.genops(sent) if "BYTE" in op.name]
    assert ops[1:] == ["BYTEARRAY8", "BINBYTES"] and ops[0].endswith("BINBYTES"), ops
    relayed.release()
    assert relayed.data == sent  # read again (a retry of the same request id is answered with it)
    back = pickle.loads(sent)  # as a client of fleetd gets it
    assert back["bytes"] == value["bytes"] and np.array_equal(back["array"], value["array"])
    assert back["array"].flags.writeable
    assert type(_base(back["array"])) is bytearray  # its buffer travelled as one (see below)
    relayed.close()
    with pytest.raises(codec.CodecError, match="closed before it was read"):
        relayed.pieces()


def _base(array):
    """What an array's memory belongs to, through the arrays and the memoryview between."""
    while isinstance(getattr(array, "base", None), type(array)):
        array = array.base
    base = array.base
    return base.obj if isinstance(base, memoryview) else base


def test_a_client_builds_a_relayed_array_over_the_bytearray_it_received_without_a_copy():
    import numpy as np

    buffers: list = []
    stream = pickle.dumps(np.arange(1000), protocol=5, buffer_callback=buffers.append)
    received = bytearray(buffers[0].raw())  # as fleetd sends an out-of-band buffer now
    array = codec._from_parts(stream, [received])
    assert _base(array) is received and array.flags.writeable
    array[0] = 7
    assert received[0] == 7
    older = codec._from_parts(stream, [bytes(buffers[0].raw())])  # an older fleetd sent bytes: copied, writable
    assert older.flags.writeable and older[1] == 1


def test_a_lent_relayed_value_goes_back_to_its_worker_once_dropped(fleet_name):
    import numpy as np
    from fleet.shm import parcels

    lender = parcels.Lender(fleet_name)
    value = np.arange(1 << 18, dtype=np.int64)
    for let_go in ("data", "drop"):
        body, name = codec.pack(value, "the result", fleet_name, take=True, writer=lender.write, lend=True)
        outcome, relayed, _ = codec.result_outcome(M.ST_SOLVED, memoryview(body), relay=True)
        assert outcome.kind == "solved" and parcels.count(fleet_name) == 1  # lent: still its worker's
        assert parcels.count(fleet_name, warm=True) == 0
        if let_go == "data":
            assert np.array_equal(pickle.loads(relayed.data), value)  # base64's path
            assert parcels.count(fleet_name) == 1  # read, still held while the value lives
        del relayed
        assert parcels.count(fleet_name) == 0 and parcels.count(fleet_name, warm=True) == 1
        # the worker writes its next result into the parcel given back
        body, again = codec.pack(value, "the result", fleet_name, take=True, writer=lender.write, lend=True)
        assert again != name and parcels.count(fleet_name) == 1
        codec.result_outcome(M.ST_SOLVED, memoryview(body), relay=True)[1].close()
    parcels.sweep(fleet_name)


def test_a_stray_results_parcel_is_dropped_and_text_bodies_are_left_alone(fleet_name):
    from fleet.shm import parcels

    body, _ = codec.pack(bytearray(2 << 20), "the result", fleet_name, take=True)
    codec.drop_parcel(M.ST_SUPPRESSED, body)  # not a value's status: never read as a parcel's name
    assert parcels.count(fleet_name) == 1
    codec.drop_parcel(M.ST_SOLVED, b"Plain words")  # looks like one, is not: nothing happens
    codec.drop_parcel(M.ST_SOLVED, body)
    assert parcels.count(fleet_name) == 0


def test_a_large_bytes_is_set_aside_from_the_pickle_and_read_back_as_bytes(fleet_name):
    from fleet.shm import parcels

    blob = bytes(range(256)) * (codec.OOB_MIN // 256)
    value = ((blob, [b"small", blob]), {"k": blob + b"!"})
    body, parcel = codec.pack(value, "the result", fleet_name, take=True)
    _name, _offsets, sizes, n_oob = pickle.loads(body[2:])
    # the pickle holds none of them (no copy into it); the same object twice is set aside once
    assert n_oob == 0 and sizes[0] < 1000 and sizes[1:] == [len(blob), len(blob) + 1]
    back = codec.loads(body, "the result")
    assert back == value and type(back[0][0]) is bytes and back[0][0] is back[0][1][1]
    assert parcels.count(fleet_name) == 0


def test_a_map_chunks_large_bytes_are_set_aside_too(fleet_name):
    from fleet.shm import parcels
    from fleet.worker.calls import Calls

    blob = bytes(range(256)) * (codec.OOB_MIN // 256)
    chunk = Calls(len, [blob, b"small", blob + b"!"])  # a batching map's unit of calls
    body, parcel = codec.pack((chunk, None, None, 0), "the payload", fleet_name, take=False)
    _name, _offsets, sizes, n_oob = pickle.loads(body[2:])
    assert n_oob == 0 and sizes[0] < 1000 and sizes[1:] == [len(blob), len(blob) + 1]
    back = codec.loads(body, "the payload")[0]
    assert back.items == chunk.items and type(back.items[0]) is bytes
    parcels.remove(parcel)
    assert parcels.count(fleet_name) == 0


def test_an_executor_chunk_by_name_has_its_large_bytes_set_aside_as_deep_as_a_chunk(fleet_name):
    """A chunk that travels by its function's name (`Calls.wire`, one level deeper than the
    chunk) is looked at for large `bytes` as the chunk itself is: an argument's list holds one."""
    from fleet.shm import parcels
    from fleet.worker.calls import Calls

    blob = bytes(range(256)) * (codec.OOB_MIN // 256)
    chunk = Calls(len, [([blob],), (b"small",)], star=True)
    assert chunk.wire[0] == "fleet.calls"
    body, parcel, _size = codec.pack_task("call", chunk, None, None, None, pickled_payload=None, limit=None,
                                          fleet=fleet_name)
    _name, _offsets, sizes, n_oob = pickle.loads(body[2:])
    assert n_oob == 0 and sizes[0] < 1000 and sizes[1:] == [len(blob)]
    wire = codec.loads(body, "the payload")[0]
    back = Calls.from_wire(wire)
    assert back.fn is len and back.items == chunk.items and back.items[0][0][0] == blob
    parcels.remove(parcel)
    assert parcels.count(fleet_name) == 0


# --- the staging buffer: large pickles made in pages that stay ------------------------------
@pytest.fixture
def staging(monkeypatch):
    """`codec`'s staging state as a fresh process has it, on every thread this test runs
    (whatever buffers the tests before it left in this process)."""
    import gc

    monkeypatch.setattr(codec, "_stage_next", False)
    monkeypatch.setattr(codec, "_stages", threading.local())
    monkeypatch.setattr(codec, "_stagings", weakref.WeakSet())
    yield codec
    codec._stages = threading.local()  # this test's buffers let go, counted off before the state goes back
    gc.collect()


def _medium(tag: int, n: int = 20) -> list:
    """A value whose pickle passes STAGE_MIN in band: `n` bytes of 64 KiB (below OOB_MIN)."""
    return [bytes([tag % 251, i]) * (32 << 10) for i in range(n)]


def test_after_a_large_pickle_the_next_are_made_in_a_staging_buffer_and_each_travels_intact(fleet_name, staging):
    from fleet.shm import parcels

    first = _medium(1)
    assert len(pickle.dumps(first, protocol=5)) >= staging.STAGE_MIN
    bodies = [codec.pack(first, "the result", fleet_name, take=True)[0]]
    assert staging._stage_next and getattr(staging._stages, "staging", None) is None  # made by pickle.dumps
    values = [first, _medium(2), _medium(3, 40)]
    for value in values[1:]:
        bodies.append(codec.pack(value, "the result", fleet_name, take=True)[0])
    stage = staging._stages.staging
    assert stage is not None and len(stage.buf) >= len(pickle.dumps(values[2], protocol=5))
    # each parcel holds its own pickle: the buffer written again did not change the ones before
    assert [codec.loads(b, "the result") for b in bodies] == values
    # a small one after them, staged too: its body is its own bytes, and it ends the staging
    small = codec.pack(["s"] * 10, "the result", fleet_name, take=True)[0]
    assert type(small) is bytes and not staging._stage_next
    codec.pack(_medium(4), "the result", fleet_name, take=True)  # by pickle.dumps: staging again from here
    big = codec.pack(_medium(5), "the result", fleet_name, take=True)[0]  # staged: the buffer written again
    assert codec.loads(small, "the result") == ["s"] * 10 and codec.loads(big, "the result") == _medium(5)
    parcels.sweep(fleet_name)


def test_a_staged_task_goes_inline_or_beside_the_ring_as_any_other(fleet_name, staging):
    from fleet.shm import parcels

    staging._stage_next = True
    body, parcel, size = codec.pack_task("r", _medium(6), None, None, None, pickled_payload=None, limit=None,
                                         fleet=fleet_name)
    assert parcel is not None and size > staging.STAGE_MIN
    assert codec.loads(body, "the payload", "in the worker")[0] == _medium(6)
    inline = codec.pack_task("r", _medium(7, 2), None, None, None, pickled_payload=None, limit=None,
                             fleet=fleet_name)
    assert inline[1] is None and type(inline[0]) is bytes
    assert codec.loads(inline[0], "the payload", "in the worker")[0] == _medium(7, 2)
    parcels.remove(parcel)


def test_staged_pickles_on_threads_and_within_a_pickle_each_travel_intact(fleet_name, staging):
    from fleet.shm import parcels

    class Submits:
        """Packs a large value of its own while it is being pickled (a `__reduce__` that submits)."""

        inner = []

        def __reduce__(self):
            Submits.inner.append(codec.pack(_medium(99), "the result", fleet_name, take=True)[0])
            return (list, ((1, 2),))

    staging._stage_next = True
    outer = codec.pack([*_medium(8), Submits()], "the result", fleet_name, take=True)[0]
    assert codec.loads(outer, "the result") == [*_medium(8), [1, 2]]
    assert codec.loads(Submits.inner[0], "the result") == _medium(99)

    got, errors = {}, []

    def packs(k: int) -> None:
        try:
            staging._stage_next = True
            got[k] = [codec.pack(_medium(10 * k + i), "the result", fleet_name, take=True)[0] for i in range(4)]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=packs, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k, bodies in got.items():
        assert [codec.loads(b, "the result") for b in bodies] == [_medium(10 * k + i) for i in range(4)]
    parcels.sweep(fleet_name)


def test_a_staged_pickle_that_fails_leaves_the_buffer_ready_for_the_next(fleet_name, staging):
    staging._stage_next = True
    with pytest.raises(codec.CodecError, match="the result cannot be pickled"):
        codec.pack([*_medium(11), lambda: 0], "the result", fleet_name, take=True)
    stage = staging._stages.staging
    assert not stage.busy and stage.end == 0
    body = codec.pack(_medium(12), "the result", fleet_name, take=True)[0]
    assert codec.loads(body, "the result") == _medium(12)


def test_staging_buffers_past_their_keep_are_let_go(fleet_name, staging, monkeypatch):
    monkeypatch.setattr(codec, "STAGE_KEEP", 2 << 20)
    held = codec.staged_bytes()
    staging._stage_next = True
    body = codec.pack(_medium(13, 60), "the result", fleet_name, take=True)[0]  # ~3.75 MiB
    assert getattr(staging._stages, "staging", "unset") is None and codec.staged_bytes() == held
    assert codec.loads(body, "the result") == _medium(13, 60)
    # and pickles that large are made by pickle.dumps from here (it grows its block in place)
    assert not staging._stage_next
    codec.pack(_medium(13, 60), "the result", fleet_name, take=True)
    assert getattr(staging._stages, "staging", "unset") is None and not staging._stage_next
    staging._stage_next = True
    body = codec.pack(_medium(14), "the result", fleet_name, take=True)[0]
    assert len(staging._stages.staging.buf) <= 2 << 20 and codec.loads(body, "the result") == _medium(14)
    kept = codec.staged_bytes() - held
    assert 0 < kept <= 2 << 20
    # the keep is every thread's together: another thread's buffer is let go while this one's stays
    bodies, let_go = [], []

    def packs() -> None:
        bodies.append(codec.pack(_medium(15), "the result", fleet_name, take=True)[0])
        let_go.append(getattr(codec._stages, "staging", "unset") is None)  # before its thread ends

    for _ in range(2):
        thread = threading.Thread(target=packs)
        thread.start()
        thread.join()
    assert let_go == [True, True] and codec.staged_bytes() - held == kept
    assert [codec.loads(b, "the result") for b in bodies] == [_medium(15)] * 2
    staging._stages = threading.local()  # this thread's buffer let go: its bytes are counted off
    import gc

    gc.collect()
    assert codec.staged_bytes() == held


class _FortranBuffer:
    """Pickles as a PickleBuffer over a Fortran-ordered array (as a library may hand one out)."""

    def __init__(self, array):
        self.array = array

    def __reduce_ex__(self, protocol):
        return (bytes, (pickle.PickleBuffer(self.array),))


def test_in_band_arrays_of_any_layout_are_staged_as_pickle_writes_them(fleet_name, staging):
    import numpy as np

    # 128 KiB each: past pickle's frame (64 KiB), so written to the buffer as they are (a
    # PickleBuffer, in their own layout), below OOB_MIN, so in band
    arrays = [np.arange(1 << 14, dtype=np.float64).reshape(128, 128) + i for i in range(12)]
    arrays += [np.asfortranarray(a) for a in arrays[:4]] + [np.arange(1000, dtype=np.int16)]
    staging._stage_next = True
    body = codec.pack(arrays, "the result", fleet_name, take=True)[0]
    assert staging._stages.staging is not None
    back = codec.loads(body, "the result")
    assert all(np.array_equal(a, b) and a.dtype == b.dtype and a.flags.f_contiguous == b.flags.f_contiguous
               for a, b in zip(arrays, back)) and len(back) == len(arrays)
    fortran = np.asfortranarray(arrays[0])
    body = codec.pack([_FortranBuffer(fortran)] * 12, "the result", fleet_name, take=True)[0]
    assert codec.loads(body, "the result") == [fortran.tobytes(order="A")] * 12


def test_lending_unmaps_a_task_parcel_at_the_end_and_makes_one_still_used_its_own(fleet_name):
    import numpy as np
    from fleet.shm import parcels

    warm = parcels.Warm(fleet_name)
    try:
        sent = np.full(1 << 17, 3.0)  # 1 MiB
        body, name, _size = codec.pack_task("r", sent, None, None, None, pickled_payload=None, limit=None,
                                            fleet=fleet_name, writer=warm.write)
        with codec.lending():
            kept = codec.loads(body, "the payload", "in the worker")[0]
            dropped = codec.loads(body, "the payload", "in the worker")[0]
            del dropped  # its mapping is unmapped at the end; `kept`'s is still used
        assert kept.flags.writeable and kept.sum() == 3.0 * kept.size
        warm.end(name, reuse=True)
        body, again, _size = codec.pack_task("r", np.full(1 << 17, 4.0), None, None, None, pickled_payload=None,
                                             limit=None, fleet=fleet_name, writer=warm.write)
        assert parcels.count(fleet_name, warm=True) == 0  # the same warm parcel, written again
        assert kept.sum() == 3.0 * kept.size  # what was kept is its own: not the next payload
        assert codec.loads(body, "the payload", "in the worker")[0].sum() == 4.0 * kept.size
        warm.end(again, reuse=False)
    finally:
        warm.close()


def test_a_client_lays_out_a_payload_as_a_parcel_by_reference_and_the_worker_builds_it_over_its_parcel(fleet_name):
    """A service-mode client's payload (`lay_out`): its large buffers and bytes are pieces of
    their own, the caller's memory by reference (writing them out is their one copy), at a
    parcel's aligned offsets; fleetd cuts the memfd at the spans (`_Laid`) and packs each
    part as it is, out of band; the worker's array is built over its task parcel's mapping,
    writable, with no copy of its own."""
    import mmap

    import numpy as np

    from fleet.service.control import fds as fdpass
    from fleet.shm import parcels

    array, blob = np.arange(1 << 16, dtype=np.float64), b"b" * codec.OOB_MIN
    value = {"array": array, "blob": blob, "small": [1, 2, 3]}
    pieces, spans, n_oob = codec.lay_out(value, "payload")
    large = [p for p in pieces if memoryview(p).nbytes >= codec.OOB_MIN]
    assert len(large) == 2 and any(p is blob for p in large)  # the caller's own objects and memory
    assert any(np.shares_memory(np.frombuffer(p, np.uint8), array.view(np.uint8)) for p in large)
    assert n_oob == 1 and len(spans) == 3 and [o for o, _ in spans] == parcels.layout([n for _, n in spans])[0]
    fd = fdpass.sealed(pieces)  # what the client sends
    size = os.fstat(fd).st_size
    mm = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)  # what fleetd maps
    os.close(fd)
    laid = codec._Laid(memoryview(mm), [tuple(x) for x in spans], n_oob)
    body, name, _size = codec.pack_task("r", None, None, None, None, pickled_payload=laid, limit=None,
                                        fleet=fleet_name)
    back, *_rest = codec.loads(body, "the payload", "in the worker")  # as the worker unpickles its task
    assert np.array_equal(back["array"], array) and back["array"].flags.writeable
    assert type(_base(back["array"])).__name__ == "mmap"  # over the task parcel's mapping: no copy of its own
    assert back["blob"] == blob and type(back["blob"]) is bytes and back["small"] == [1, 2, 3]
    assert parcels.remove(name)
    # nothing that large: one piece, the pickle `dumps` makes
    assert codec.lay_out({"small": [1, 2, 3]}, "payload") == ([codec.dumps({"small": [1, 2, 3]}, "payload")],
                                                              [[0, len(codec.dumps({"small": [1, 2, 3]}, "p"))]], 0)
    with pytest.raises(codec.CodecError, match="payload cannot be pickled"):
        codec.lay_out(threading.Lock(), "payload")


# -- the look for large bytes before pickling (fleet._codec.BlobScan) ---------------------------
class _BlobModel:
    """The rule BlobScan carries (native/fleet_codec.c), written out as its documentation
    says, on a small scale: bytes of MIN or more are large; containers are looked into
    DEPTH levels deep, each of at most LEN items; types match exactly."""

    MIN, LEN, DEPTH = 4, 3, 2

    def holds(self, obj, depth=None) -> bool:
        from fleet.worker.calls import Calls

        depth = self.DEPTH if depth is None else depth
        kind = type(obj)
        if kind is bytes:
            return len(obj) >= self.MIN
        if kind is codec._Pickled:
            return len(obj.data) >= self.MIN
        if not depth:
            return False
        if kind is dict:
            items = list(obj.values())
        elif kind is Calls:
            items = obj.items
        elif kind in (tuple, list):
            items = obj
        else:
            return False
        return len(items) <= self.LEN and any(self.holds(item, depth - 1) for item in items)

    def plain(self, obj, depth=None) -> bool:
        """Small atoms alone: None, bool, int, float, complex, str and bytes under MIN,
        in tuples, lists and dicts (keys and values) of DEPTH levels of at most LEN items."""
        depth = self.DEPTH if depth is None else depth
        kind = type(obj)
        if obj is None or kind in (bool, int, float, complex):
            return True
        if kind in (str, bytes):
            return len(obj) < self.MIN
        if not depth or kind not in (tuple, list, dict):
            return False
        items = [x for pair in obj.items() for x in pair] if kind is dict else obj
        return len(obj) <= self.LEN and all(self.plain(item, depth - 1) for item in items)


class _Bytes(bytes):
    """A bytes subclass: pickle sees an object like any other, and so does the scan."""


def _values():
    from hypothesis import strategies as st

    from fleet.worker.calls import Calls

    leaves = st.one_of(st.binary(max_size=6), st.integers(), st.text(max_size=6), st.none(), st.booleans(),
                       st.floats(allow_nan=False), st.complex_numbers(allow_nan=False),
                       st.binary(max_size=6).map(_Bytes), st.binary(max_size=6).map(codec._Pickled),
                       st.binary(max_size=6).map(bytearray))
    def containers(kids):
        lists = st.lists(kids, max_size=4)
        return st.one_of(lists, lists.map(tuple), st.dictionaries(st.text(max_size=2), kids, max_size=4),
                         lists.map(lambda items: Calls(len, items)))

    return st.recursive(leaves, containers, max_leaves=12)


@pytest.mark.parametrize("look", ["holds", "plain"])
def test_each_look_of_the_blob_scan_answers_exactly_as_its_rule_says(look):
    """`holds` finds large bytes, `plain` passes small atoms alone: each as `_BlobModel` writes it."""
    from hypothesis import given, settings

    from fleet._codec import BlobScan
    from fleet.worker.calls import Calls

    model = _BlobModel()
    scan = getattr(BlobScan(model.MIN, model.LEN, model.DEPTH, codec._Pickled, Calls), look)
    rule = getattr(model, look)

    @settings(max_examples=600, deadline=None)
    @given(_values())
    def agrees(value):
        assert scan(value) is rule(value), value

    agrees()


def test_the_plain_look_passes_small_atoms_alone_and_nothing_else():
    from fleet._codec import BlobScan
    from fleet.worker.calls import Calls

    plain = BlobScan(4, 3, 2, codec._Pickled, Calls).plain
    assert codec._plain(("m", "f", (1, 2.5, None, True, 1j, b"x"), {"k": "v"})) and plain({1: (2,)})
    assert not plain("1234") and not plain(b"1234") and not plain([1, 2, 3, 4]) and not plain(((([1],),),))
    assert not plain(_Bytes(b"")) and not plain(bytearray()) and not plain(len) and not plain(Calls(len, [1]))
    assert not plain({(): frozenset()}) and not plain({frozenset(): 1})  # a dict's keys count too


def test_small_atoms_alone_are_pickled_as_they_are_and_the_rest_takes_the_whole_path(monkeypatch):
    """`_pickled`'s plain path: what it makes is what the whole path makes; a value it does
    not pass (a function by reference, a large bytes) takes the guarded path, as before."""
    whole = []
    set_aside = codec._set_aside

    def watched(value, *args):
        whole.append(value)
        return set_aside(value, *args)

    monkeypatch.setattr(codec, "_set_aside", watched)
    call = (("tests.executor_calls", "add", (1, 2.5, "x", b"y", None), {"k": True}), None, None, None)
    monkeypatch.setattr(codec, "_stage_next", True)
    data, aside, blobs = codec._pickled(call, "the payload")
    assert (data, aside, blobs, whole) == (pickle.dumps(call, protocol=5), (), (), [])
    assert codec._stage_next is False  # as the whole path leaves it after a pickle this small
    assert pickle.loads(data) == call
    for atom in (None, True, 10**40, 1.5, 2j, "x", "x" * codec.OOB_MIN):  # a lone atom: as it is, no look
        assert type(atom) in codec._ATOMS
        assert codec._pickled(atom, "the value") == (pickle.dumps(atom, protocol=5), (), ())
    assert whole == []
    for value in ((len, (1,), {}), (b"x" * codec.OOB_MIN,), ("x" * codec.OOB_MIN,), [bytearray(b"x")]):
        codec._pickled(value, "the payload")
        assert whole[-1] is value  # not plain: the guarded whole path
    monkeypatch.setattr(codec, "STAGE_MIN", 16)  # a plain pickle this large is staged as before
    codec._pickled(call, "the payload")
    assert whole[-1] is call
    # a service client's payload, laid out for its memfd: the same look
    del whole[:]
    assert codec.lay_out(call[0], "the payload") == ([pickle.dumps(call[0], protocol=5)],
                                                     [[0, len(pickle.dumps(call[0], protocol=5))]], 0)
    assert whole == []
    codec.lay_out((len,), "the payload")
    assert whole == [(len,)]


def test_the_blob_scan_stops_at_its_depth_and_length_and_passes_subclasses_by():
    from fleet._codec import BlobScan
    from fleet.worker.calls import Calls

    scan = BlobScan(4, 3, 2, codec._Pickled, Calls).holds
    big = b"1234"
    assert scan(big) and not scan(b"123") and not scan(_Bytes(big))
    assert scan([big]) and scan(([big],)) and not scan((([big],),))  # two levels in, not three
    assert scan({"k": big}) and not scan({big: 1})  # a dict's values, not its keys
    assert scan([1, 2, big]) and not scan([1, 2, 3, big])  # at most three items looked at
    assert scan(Calls(len, [b"", big])) and scan(codec._Pickled(big)) and scan([codec._Pickled(big)])
    assert not scan(frozenset([big])) and not scan(bytearray(big))  # only the kinds named
    # The executor's own: a call's (fn, args, kwargs) with a large bytes argument is found.
    assert codec._holds_blob((len, (b"x" * codec.OOB_MIN,), {}))
    assert not codec._holds_blob((len, (b"x" * (codec.OOB_MIN - 1),), {}))


def test_the_blob_scan_refuses_a_bad_configuration():
    from fleet._codec import BlobScan

    with pytest.raises(ValueError, match="depth"):
        BlobScan(4, 3, -1, codec._Pickled, list)
    with pytest.raises(TypeError, match="classes"):
        BlobScan(4, 3, 2, "not a class", list)
