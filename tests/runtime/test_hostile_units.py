"""A unit's data never stops the fleet: results, exceptions and payloads that misbehave
when they are pickled or unpickled (tests.hostile) end as their own unit's outcome
(ResultError, HandlerError), on a plain seat, an I/O seat and through fleetd, and the
next plain unit is served by the same worker with the ledger balanced.

One real fleet per seat kind for the module (`hostile_fleet`); the fuzz test throws
hypothesis-drawn hostile units at it, submitted one by one and mapped in chunks."""
from __future__ import annotations

from concurrent.futures.process import _RemoteTraceback

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.worker import codec
from fleet.shm import dataplane, parcels
from fleet.shm.table import segment
from fleet.rules.unit import PayloadUnpicklable, UnitError, UnitFailed
from tests import hostile as H
from tests.daemons import BOUND_S, Fleetd, wait_until
from tests.fleets import config, running, unique_name


def _roles(io: bool) -> dict:
    hostile = "tests.hostile:hostile_async" if io else "tests.hostile:hostile"
    return {
        "h": {"kind": "pooled", "handler": hostile, "slots": 2, "peak_cpus": 0 if io else 1, "io_bound": io,
              "queue_bound": 1000},
        "echo": {"kind": "pooled", "handler": "tests.hostile:echo", "slots": 1, "peak_cpus": 1, "queue_bound": 1000},
    }


@pytest.fixture(scope="module", params=["plain", "io"])
def hostile_fleet(request):
    """A fleet whose role "h" runs `tests.hostile:hostile` on a plain seat, or its async
    twin on an I/O seat; "echo" returns its payload. With the pids of its workers."""
    name = unique_name("h")
    try:
        with running(config(name, _roles(request.param == "io"))) as f:
            yield f, _workers(f)
    finally:
        segment.unlink(name)
        dataplane.unlink(name)


def _workers(f) -> dict:
    return wait_until(lambda: (pids := f._sup.pids()) and len(pids) == len(f.layout.seats) and dict(pids),
                      "every seat's worker")


def _serves_on(f, pids: dict) -> None:
    """The next plain unit is served, by the same workers (none died), and every unit
    submitted so far has exactly one outcome."""
    assert f.submit("echo", "next").result(BOUND_S) == "next"
    assert f._sup.pids() == pids
    ledger = wait_until(lambda: (c := f.ledger())["inflight"] == 0 and c, "every unit ended")
    assert ledger["submitted"] == ledger["solved"] + ledger["suppressed"] + ledger["failed"]
    assert "LaneDeath" not in ledger["failed_by_reason"]


def _failure(future) -> UnitFailed:
    exc = future.exception(BOUND_S)
    assert isinstance(exc, UnitFailed), exc
    return exc


def _mapped(f, recipes: list, chunksize: int, raises=UnitError) -> tuple[list, BaseException | None]:
    """What a map hands out before it raises, and what it raises (None if it does not)."""
    got = []
    try:
        for value in f.map("h", recipes, chunksize=chunksize, timeout=BOUND_S):
            got.append(value)
    except raises as exc:
        return got, exc
    return got, None


# --- the cases found, one by one ---------------------------------------------------------
def test_an_exception_the_caller_cannot_rebuild_fails_its_unit_handler_error(hostile_fleet):
    f, pids = hostile_fleet
    exc = _failure(f.submit("h", ("raise", "unrebuildable", 0)))
    assert exc.reason == "HandlerError" and exc.original is None
    lines = exc.outcome.detail.splitlines()
    assert lines[0].startswith("the handler's exception cannot be unpickled here: TypeError: ")
    assert lines[-1] == "tests.hostile.Unrebuildable: one and two"  # the handler's own traceback follows
    _serves_on(f, pids)


def test_a_chunk_whose_results_cannot_be_unpickled_fails_that_chunk_result_error(hostile_fleet):
    f, pids = hostile_fleet
    got, exc = _mapped(f, [("return", "plain", 1), ("return", "plain", 2), ("return", "raises_on_load", 0),
                           ("return", "plain", 4)], chunksize=2)
    assert got == [1, 2] and isinstance(exc, UnitFailed) and exc.reason == "ResultError"
    assert exc.outcome.detail == "the chunk's results cannot be unpickled here: ValueError: refuses to be rebuilt"
    _serves_on(f, pids)


@pytest.mark.parametrize("kind, why", [("exits_on_load", "SystemExit: 7"), ("interrupts_on_load", "KeyboardInterrupt"),
                                       ("recurses_on_load", "RecursionError: ")])
def test_a_result_that_exits_or_interrupts_while_unpickled_fails_result_error(hostile_fleet, kind, why):
    f, pids = hostile_fleet
    exc = _failure(f.submit("h", ("return", kind, 0)))
    assert exc.reason == "ResultError" and exc.outcome.detail.startswith(f"the result cannot be unpickled here: {why}")
    _serves_on(f, pids)


def test_a_chunk_items_exception_the_caller_cannot_rebuild_fails_at_that_item(hostile_fleet):
    f, pids = hostile_fleet
    before = f.ledger()["failed_by_reason"].get("HandlerError", 0)
    got, exc = _mapped(f, [("return", "plain", 1), ("raise", "exits_on_load", 0), ("return", "plain", 3)],
                       chunksize=3)
    assert got == [1] and isinstance(exc, UnitFailed) and exc.reason == "HandlerError" and exc.original is None
    assert exc.outcome.detail.startswith("the handler's exception cannot be unpickled here: SystemExit: 8")
    assert f.ledger()["failed_by_reason"]["HandlerError"] == before + 1  # the chunk is one unit, failed
    _serves_on(f, pids)


# --- the worker's side ----------------------------------------------------------------------
def test_a_payload_that_exits_while_unpickled_in_the_worker_fails_its_unit(hostile_fleet):
    f, pids = hostile_fleet
    exc = _failure(f.submit("echo", H.ExitsOnLoad()))
    assert exc.reason == "HandlerError"
    assert exc.outcome.detail.endswith("the payload cannot be unpickled in the worker: SystemExit: 7\n")
    _serves_on(f, pids)


@pytest.mark.parametrize("kind, why", [
    ("raises_on_dump", "ValueError: refuses to be pickled"),
    ("exits_on_dump", "SystemExit: 5"),
    ("interrupts_on_dump", "KeyboardInterrupt"),
])
def test_a_result_that_fails_to_pickle_fails_result_error_and_the_worker_serves_on(hostile_fleet, kind, why):
    f, pids = hostile_fleet
    exc = _failure(f.submit("h", ("return", kind, 0)))
    assert (exc.reason, exc.outcome.detail) == ("ResultError", f"the result cannot be pickled: {why}")
    _serves_on(f, pids)


def test_a_result_larger_than_the_ring_arrives_whole_beside_it(hostile_fleet):
    f, pids = hostile_fleet
    assert f.submit("h", ("return", "huge", 8 << 20)).result(BOUND_S) == b"x" * (8 << 20)
    assert parcels.count(f.name) == 0  # the supervisor took the result's parcel
    _serves_on(f, pids)


def test_an_exception_that_exits_when_pickled_fails_its_unit_and_the_worker_serves_on(hostile_fleet):
    f, pids = hostile_fleet
    exc = _failure(f.submit("h", ("raise", "exits_on_dump", 0)))
    assert exc.reason == "HandlerError" and exc.original is None
    lines = exc.outcome.detail.splitlines()
    assert lines[0] == "the handler's exception cannot be pickled: SystemExit: 6"
    assert lines[-1] == "tests.hostile.ExitsOnDumpError: exits when pickled"
    _serves_on(f, pids)


def test_a_huge_exception_fails_handler_error_with_its_text_cut(hostile_fleet):
    f, pids = hostile_fleet
    exc = _failure(f.submit("h", ("raise", "huge", 8 << 20)))
    assert exc.reason == "HandlerError" and exc.original is None
    assert exc.outcome.detail.startswith("the handler's exception is ")
    assert len(exc.outcome.detail) < 2 * codec.MAX_DETAIL_CHARS
    _serves_on(f, pids)


def test_a_payload_that_cannot_be_pickled_is_refused_at_submit_and_nothing_is_queued(hostile_fleet):
    f, pids = hostile_fleet
    before = f.ledger()["submitted"]
    for hostile in (H.ExitsOnDump(), H.InterruptsOnDump(), H.nested(5000)):
        with pytest.raises(PayloadUnpicklable, match="payload for role 'echo' cannot be pickled: "):
            f.submit("echo", hostile)
    assert f.ledger()["submitted"] == before
    _serves_on(f, pids)


# --- the fuzz -------------------------------------------------------------------------------
#: Sizes a recipe takes: the depth of a nesting or the bytes of a blob. SMALL and MID travel;
#: BIG nests past the recursion limit and outgrows the rings (it travels beside them).
SMALL, MID, BIG = 3, 300, 6 << 20
_sizes = st.sampled_from([SMALL, MID, BIG])
_values = st.tuples(st.just("return"), st.sampled_from(sorted(H.VALUES)), _sizes)
_errors = st.tuples(st.just("raise"), st.sampled_from(sorted(H.ERRORS)), _sizes)
_recipes = st.one_of(_values, _errors).map(lambda r: (r[0], r[1], _size_for(r[1], r[2])))


def _size_for(kind: str, size: int) -> int:
    if kind == "nested":
        return {SMALL: SMALL, MID: MID, BIG: 3000}[size]
    if kind == "huge":
        return {SMALL: SMALL, MID: 600_000, BIG: BIG}[size]
    return size


def _value_fails(kind: str, size: int) -> bool:
    """A returned value that cannot come back: it fails to pickle or unpickle, or is too big."""
    return kind not in ("plain", "nested", "huge", "outside_fleetd") or _too_deep(kind, size)


def _too_deep(kind: str, size: int) -> bool:
    return kind == "nested" and size >= 3000


def _expected_value(kind: str, size: int):
    return H.make("return", kind, size)


def _check_one(f, recipe) -> None:
    how, kind, size = recipe
    future = f.submit("h", recipe)
    if how == "raise":
        _assert_handler_error(future.exception(BOUND_S), kind, size)
    elif _value_fails(kind, size):
        assert _failure(future).reason == "ResultError"
    else:
        assert future.result(BOUND_S) == _expected_value(kind, size)


def _assert_handler_error(exc: BaseException, kind: str, size: int) -> None:
    """The rule (fleet.rules.raised) for a handler that raised: its own exception as
    itself, the worker's traceback its cause; or, when it cannot be rebuilt here, a
    UnitFailed with reason HandlerError and no original."""
    if isinstance(exc, UnitError):
        assert isinstance(exc, UnitFailed) and exc.reason == "HandlerError" and exc.original is None, exc
    else:
        assert type(exc) is type(H.make("raise", kind, size)) and type(exc.__cause__) is _RemoteTraceback, exc


def _check_payload(f, recipe) -> None:
    """The recipe's value (or exception object) as a payload, echoed back: refused at
    submit when it cannot be pickled (whatever its size, it travels), HandlerError when it cannot be
    unpickled in the worker (the handler never saw it)."""
    how, kind, size = recipe
    payload = H.make(how, kind, size)
    if kind.endswith("_on_dump") or _too_deep(kind, size):
        with pytest.raises(PayloadUnpicklable):
            f.submit("echo", payload)
    elif kind.endswith("_on_load") or kind in ("unrebuildable", "carries_hostile"):
        assert _failure(f.submit("echo", payload)).reason == "HandlerError"
    elif how == "return":
        assert f.submit("echo", payload).result(BOUND_S) == _expected_value(kind, size)
    else:
        assert type(f.submit("echo", payload).result(BOUND_S)) is type(payload)  # an exception object, echoed


def _check_map(f, recipes: list, chunksize: int) -> None:
    """A map of the recipes in chunks: each chunk's values in order until the first item
    that did not solve, which raises: HandlerError for a raising item, ResultError for a
    value that cannot be pickled in the worker (its own item's, after the values before
    it). A chunk holding a value that cannot be rebuilt here raises ResultError whole:
    its values come unpickled together."""
    want, error, raised_kind = [], None, None
    for start in range(0, len(recipes), chunksize):
        chunk = recipes[start : start + chunksize]
        if any(how == "return" and kind.endswith("_on_load") for how, kind, _ in chunk):
            error = "ResultError"
            break
        stops = [i for i, (how, kind, size) in enumerate(chunk) if how == "raise" or _value_fails(kind, size)]
        upto = stops[0] if stops else len(chunk)
        want += [_expected_value(kind, size) for _, kind, size in chunk[:upto]]
        if stops:
            how, kind, size = chunk[stops[0]]
            if how == "raise":
                error, raised_kind = "HandlerError", (kind, size)
            else:
                error = "ResultError"
            break
    got, exc = _mapped(f, recipes, chunksize, raises=BaseException)
    assert got == want
    if error == "HandlerError":
        _assert_handler_error(exc, *raised_kind)
    else:
        assert (exc.reason if exc is not None else None) == error


_examples = st.one_of(
    st.tuples(st.just("submit"), _recipes),
    st.tuples(st.just("payload"), _recipes),
    st.tuples(st.just("map"), st.lists(_recipes, min_size=1, max_size=5), st.integers(2, 3)),
)


def test_hostile_units_each_end_as_their_own_outcome_and_the_next_unit_is_served(hostile_fleet):
    f, pids = hostile_fleet

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(_examples)
    def throw(example):
        mode, *args = example
        {"submit": _check_one, "payload": _check_payload, "map": _check_map}[mode](f, *args)
        _serves_on(f, pids)

    throw()


# --- through fleetd: the daemon relays, the client decodes ----------------------------------
@pytest.fixture(scope="module")
def hostile_service():
    name = unique_name("hd")
    try:
        with Fleetd(name, _roles(False)) as d:
            client = d.connect()
            try:
                yield d, client
            finally:
                client.shutdown(wait=True, cancel_futures=True)
    finally:
        segment.unlink(name)
        dataplane.unlink(name)


def _service_serves_on(d, client) -> None:
    assert client.submit("echo", "next").result(BOUND_S) == "next"
    assert d.proc.poll() is None
    ledger = wait_until(lambda: (c := client.ledger())["inflight"] == 0 and c, "every unit ended")
    assert ledger["submitted"] == ledger["solved"] + ledger["suppressed"] + ledger["failed"]
    assert "LaneDeath" not in ledger["failed_by_reason"]


def test_through_fleetd_an_exception_the_client_cannot_rebuild_fails_handler_error(hostile_service):
    d, client = hostile_service
    exc = _failure(client.submit("h", ("raise", "unrebuildable", 0)))
    assert exc.reason == "HandlerError" and exc.original is None
    assert exc.outcome.detail.startswith("the handler's exception cannot be unpickled here: TypeError: ")
    _service_serves_on(d, client)


@pytest.mark.parametrize("kind, why", [("exits_on_load", "SystemExit: 7"), ("interrupts_on_load", "KeyboardInterrupt")])
def test_through_fleetd_a_result_that_exits_in_the_client_fails_result_error(hostile_service, kind, why):
    d, client = hostile_service
    exc = _failure(client.submit("h", ("return", kind, 0)))
    assert (exc.reason, exc.outcome.detail) == ("ResultError", f"the result cannot be unpickled here: {why}")
    _service_serves_on(d, client)


def test_through_fleetd_chunks_come_to_the_client_unread(hostile_service):
    d, client = hostile_service
    got, exc = _mapped(client, [("return", "plain", 1), ("return", "plain", 2), ("return", "exits_on_load", 0)],
                       chunksize=2)
    assert got == [1, 2] and exc.reason == "ResultError"
    assert exc.outcome.detail == "the result cannot be unpickled here: SystemExit: 7"
    got, exc = _mapped(client, [("return", "plain", 1), ("raise", "unrebuildable", 0)], chunksize=2)
    assert got == [1] and exc.reason == "HandlerError" and exc.original is None
    assert exc.outcome.detail.startswith("the handler's exception cannot be unpickled here: TypeError: ")
    _service_serves_on(d, client)


def test_through_fleetd_values_and_exceptions_are_relayed_unread(hostile_service):
    # Rebuilding these inside fleetd raises: the client gets them only if fleetd never
    # unpickled them (it runs no code of a unit's), one by one and in chunks.
    d, client = hostile_service
    assert client.submit("h", ("return", "outside_fleetd", 3)).result(BOUND_S) == H.OutsideFleetd(3)
    exc = client.submit("h", ("raise", "outside_fleetd", 4)).exception(BOUND_S)
    assert isinstance(exc, H.OutsideFleetdError)  # rebuilt at the client, raised as itself
    got, exc = _mapped(client, [("return", "outside_fleetd", 1), ("raise", "outside_fleetd", 2)], chunksize=2,
                       raises=H.OutsideFleetdError)
    assert got == [H.OutsideFleetd(1)] and isinstance(exc, H.OutsideFleetdError)
    _service_serves_on(d, client)
