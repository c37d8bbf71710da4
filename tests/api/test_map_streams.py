"""map and map_unordered: results as units complete, errors where the iteration meets
them, a bounded window, and a 10-million-item generator mapped in bounded memory."""
from __future__ import annotations

import functools
import itertools
import operator
import time

import psutil
import pytest

from fleet import UnitSuppressed
from fleet.worker.mapping import MAP_REFILL, MAP_WINDOW, MAP_WINDOW_ITEMS, _Feeder, map_window
from fleet.worker.calls import Calls

from ..fleets import config, role, running

MILLIONS = 10_000_000


class Counted:
    """A lazy iterable that counts how many items the map has pulled."""

    def __init__(self, it):
        self.it, self.pulled = iter(it), 0

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self.it)
        self.pulled += 1
        return item


def held_role(**fields):
    # an I/O-bound role runs up to its slots at once on its one seat: a held unit
    # does not stop the others from running
    spec = {"io_bound": True, "peak_cpus": 0, "slots": 8}
    spec.update(fields)
    return role("wait_for_file", **spec)


def settled(f, submitted):
    """The ledger once every one of `submitted` units has its outcome."""
    deadline = time.monotonic() + 60
    while True:
        ledger = f.ledger()
        done = ledger["solved"] + ledger["suppressed"] + ledger["failed"]
        if (done == submitted and not ledger["inflight"]) or time.monotonic() > deadline:
            return ledger
        time.sleep(0.01)


# --- map_unordered ------------------------------------------------------------------------


def test_a_held_first_item_does_not_hold_back_the_ones_behind_it(fleet_name, tmp_path):
    release = tmp_path / "release"
    with running(config(fleet_name, {"w": held_role()})) as f:
        items = [(str(release), 10)] + [(None, i) for i in range(1, 6)]
        # the first unit runs until the test creates `release`; an ordered map would wait
        # for it and time out here, an unordered one hands the other five out first
        it = f.map_unordered("w", items, timeout=120)
        first_five = [next(it) for _ in range(5)]
        assert sorted(first_five) == [1, 4, 9, 16, 25]
        release.touch()
        assert list(it) == [100]


def test_the_ordered_map_waits_for_the_held_item(fleet_name, tmp_path):
    # the control for the test above: the same input through map stops at the held item
    release = tmp_path / "release"
    with running(config(fleet_name, {"w": held_role()})) as f:
        it = f.map("w", [(str(release), 10)] + [(None, i) for i in range(1, 6)], timeout=1)
        with pytest.raises(TimeoutError):
            next(it)
        release.touch()


def test_chunks_complete_out_of_order_and_keep_their_items_in_order(fleet_name, tmp_path):
    release = tmp_path / "release"
    with running(config(fleet_name, {"w": held_role()})) as f:
        items = [(str(release), 7), (None, 8)] + [(None, i) for i in range(4)]
        it = f.map_unordered("w", items, chunksize=2, timeout=120)
        assert sorted([next(it), next(it), next(it), next(it)]) == [0, 1, 4, 9]
        release.touch()
        assert list(it) == [49, 64]


def test_an_item_that_failed_raises_when_the_iteration_reaches_it(fleet_name):
    with running(config(fleet_name, {"work": role("sometimes")})) as f:
        it = f.map_unordered("work", [2])  # submitted, not yet raised
        with pytest.raises(RuntimeError, match="two: 2"):  # the handler's own exception
            next(it)
        got = []
        with pytest.raises(UnitSuppressed):
            for value in f.map_unordered("work", [0, 3, 1], chunksize=1):
                got.append(value)
        assert set(got) <= {0, 6}
        with pytest.raises(UnitSuppressed):
            list(f.map_unordered("work", [0, 3, 6, 1], chunksize=2))
        assert sorted(f.map_unordered("work", [0, 3, 6, 9, 12], chunksize=2)) == [0, 6, 12, 18, 24]


@pytest.mark.parametrize("ordered", [True, False], ids=["map", "map_unordered"])
def test_a_failed_chunk_item_ends_the_iteration_after_the_items_before_it(fleet_name, ordered):
    with running(config(fleet_name, {"work": role("sometimes")})) as f:
        mapper = f.map if ordered else f.map_unordered
        # chunks [0, 3] [6, 4] [9, 12] [15, 18]: 4 % 3 == 1 is suppressed
        it = mapper("work", [0, 3, 6, 4, 9, 12, 15, 18], chunksize=2)
        got = []
        with pytest.raises(UnitSuppressed):
            for value in it:
                got.append(value)
        assert 12 in got  # 6, the item before the failed one in its chunk, came first
        if ordered:
            assert got == [0, 6, 12]
        assert list(it) == []  # nothing after it is handed out: the map is over
        it = mapper("work", [2, 0], chunksize=2)  # the first item fails
        with pytest.raises(RuntimeError, match="two: 2"):
            next(it)
        assert list(it) == []


def test_a_map_can_be_closed_before_it_is_iterated_and_again(fleet_name):
    with running(config(fleet_name, {"work": role("sometimes")})) as f:
        it = f.map("work", range(100), chunksize=10)
        it.close()
        it.close()
        assert list(it) == []
        ledger = settled(f, 10)
        assert ledger["solved"] + ledger["suppressed"] + ledger["failed"] == ledger["submitted"] == 10


def test_unordered_keeps_at_most_a_window_of_units_submitted(fleet_name, tmp_path):
    release = tmp_path / "release"
    # the window is the role's queue bound when that is smaller than MAP_WINDOW
    with running(config(fleet_name, {"w": held_role(queue_bound=6)})) as f:
        items = Counted((str(release), i) for i in range(40))
        it = f.map_unordered("w", items, timeout=120)
        assert items.pulled == 6 and f.ledger()["submitted"] == 6  # every unit held running
        release.touch()
        assert sorted(it) == [i * i for i in range(40)]
        assert items.pulled == 40


@pytest.mark.parametrize("chunksize, bound, slots, window", [
    (1, 10_000, 2, MAP_WINDOW),          # small units: the unit window
    (1, 6, 2, 6),                        # a smaller queue bound
    (64, 10_000, 2, MAP_WINDOW_ITEMS // 64),
    (1000, 10_000, 2, MAP_WINDOW_ITEMS // 1000),  # big chunks: the item window
    (1000, 10_000, 64, 128),             # ... never fewer than two per slot
    (1000, 100, 64, 100),                # ... nor more than the queue holds
    (10 ** 6, 10_000, 0, 1),
])
def test_the_map_window(chunksize, bound, slots, window):
    assert map_window(chunksize, bound, slots) == window


def test_the_feeder_reads_its_window_once_a_top_up_and_tops_up_in_runs():
    """A map looks at its window (the role's bound, which a reload may change) when a
    top-up may be due, not after every result; it tops up in runs of MAP_REFILL, never
    past the window, and a smaller window holds from the next top-up on."""
    windows = {"now": 256, "looks": 0}

    def window():
        windows["looks"] += 1
        return windows["now"]

    submitted, runs = [], []

    def submit_many(payloads, _chunk):
        assert len(feeder.pending) + len(payloads) <= windows["now"]  # never past the window it read
        runs.append((len(payloads), windows["now"]))
        submitted.extend(payloads)
        return list(payloads)  # stand-ins for futures: the feeder only tracks them

    feeder = _Feeder(None, iter(range(5_000)), 1, window, ordered=True, submit_many=submit_many)
    feeder.fill()
    assert runs == [(256, 256)] and windows["looks"] == 1
    taken = []
    while feeder.pending:
        taken.append(feeder.pending.popleft())
        feeder.fill()
        if len(taken) == 2_000:
            windows["now"] = 100  # a reload shrank the role's bound
    assert taken == list(range(5_000)) == submitted  # every item once, in order
    assert all(n >= min(MAP_REFILL, w // 4) for n, w in runs[1:-1])  # in runs, not one by one
    assert {w for _n, w in runs} == {256, 100}
    assert windows["looks"] <= len(runs) + 2  # once a top-up, not once a result (5,000)


@pytest.mark.parametrize("ordered", [True, False])
def test_a_map_of_big_chunks_reads_at_most_the_item_window_ahead(fleet_name, tmp_path, ordered):
    release = tmp_path / "release"
    chunk = 20_000  # three chunks make the item window; the unit window would take all ten
    with running(config(fleet_name, {"w": held_role(slots=1)})) as f:
        items = Counted((str(release), i % 7) for i in range(10 * chunk))
        it = (f.map if ordered else f.map_unordered)("w", items, chunksize=chunk, timeout=120)
        window = map_window(chunk, f._sup.roles["w"].queue_bound, 1)
        try:
            assert window == 3 and items.pulled == window * chunk and f.ledger()["submitted"] == window
        finally:
            release.touch()  # a failed check must not leave the units held until their timeout
        assert sum(it) == sum((i % 7) ** 2 for i in range(10 * chunk))
        assert items.pulled == 10 * chunk


def test_closing_an_unordered_map_early_cancels_what_has_not_started(fleet_name, tmp_path):
    release = tmp_path / "release"
    with running(config(fleet_name, {"w": held_role(queue_bound=20, slots=2)})) as f:
        items = Counted([(None, 0)] + [(str(release), i) for i in range(1, 100)])
        it = f.map_unordered("w", items, timeout=120)
        assert next(it) == 0
        it.close()
        release.touch()
        pulled = items.pulled
        assert pulled <= 21
        ledger = settled(f, pulled)
        assert ledger["submitted"] == pulled
        assert ledger["solved"] + ledger["failed"] == pulled
        assert ledger["failed"] == ledger["failed_by_reason"].get("Cancelled", 0) > 0


# --- map over ten million items ------------------------------------------------------------


@pytest.mark.parametrize("ordered", [True, False], ids=["map", "map_unordered"])
def test_a_ten_million_item_generator_is_read_only_a_window_ahead(fleet_name, ordered):
    window, taken = 64, 5_000
    with running(config(fleet_name, {"work": role("square", queue_bound=window)})) as f:
        items = Counted(range(MILLIONS))
        mapper = f.map if ordered else f.map_unordered
        it = mapper("work", items)
        results = []
        for value in itertools.islice(it, taken):
            results.append(value)
            # never more than one window of units between what was read and what was handed out
            assert items.pulled - len(results) <= window
        it.close()
        assert items.pulled <= taken + window
        if ordered:
            assert results == [i * i for i in range(taken)]
        else:
            assert len(set(results)) == taken
        # the rest of the ten million was never read, so never pickled nor submitted
        assert next(items.it) == items.pulled
        ledger = settled(f, items.pulled)
        assert ledger["submitted"] == items.pulled
        # every unit the map submitted has exactly one outcome: solved, or cancelled by close()
        assert ledger["solved"] + ledger["failed"] == items.pulled
        assert ledger["failed"] == ledger["failed_by_reason"].get("Cancelled", 0)


def test_all_ten_million_items_in_chunks_stream_through_in_bounded_memory(fleet_name):
    # every item runs (10,000 chunks of 1,000); the iterable is never more than a window
    # of chunks ahead of the results, and the results are not held anywhere: the process
    # grows by far less than ten million results would take (> 300 MiB as Python ints)
    window, chunk = 64, 1000
    with running(config(fleet_name, {"work": role("square", queue_bound=window)})) as f:
        items = Counted(range(MILLIONS))
        rss_before = psutil.Process().memory_info().rss
        rss_peak, total, seen = rss_before, 0, 0
        for value in f.map("work", items, chunksize=chunk):
            total += value
            seen += 1
            assert items.pulled - seen <= (window + 1) * chunk
            if seen % 500_000 == 0:
                rss_peak = max(rss_peak, psutil.Process().memory_info().rss)
        assert seen == MILLIONS and total == (MILLIONS - 1) * MILLIONS * (2 * MILLIONS - 1) // 6
        assert rss_peak - rss_before < 128 << 20
        assert f.ledger()["submitted"] == MILLIONS // chunk


# --- the ledger counts units and items ------------------------------------------------------


def test_the_ledger_counts_a_map_in_units_and_items(fleet_name, capsys):
    import json

    from fleet.cli import fleetctl

    with running(config(fleet_name, {"sq": role("square", slots=2)}, profile="serial")) as f:
        assert list(f.map("sq", range(1000), chunksize=64)) == [i * i for i in range(1000)]
        ledger = settled(f, 16)  # 15 chunks of 64 and one of 40
        assert (ledger["submitted"], ledger["solved"], ledger["inflight"]) == (16, 16, 0)
        assert ledger["items"] == {"submitted": 1000, "solved": 1000, "suppressed": 0, "failed": 0, "inflight": 0}
        f.submit("sq", 3).result(60)  # a plain submit: one unit of one item
        assert (f.ledger()["submitted"], f.ledger()["items"]["submitted"]) == (17, 1001)
        # what a person reads, from the table (published by the loop: wait for it)
        deadline = time.monotonic() + 60
        while True:
            assert fleetctl.main(["status", "--name", fleet_name, "--json"]) == 0
            doc = json.loads(capsys.readouterr().out)["ledger"]
            if doc["solved"] == 17:
                break
            assert time.monotonic() < deadline, doc
            time.sleep(0.05)
        assert doc["items"] == {"submitted": 1001, "solved": 1001, "suppressed": 0, "failed": 0, "inflight": 0}
        assert fleetctl.main(["status", "--name", fleet_name]) == 0
        out = capsys.readouterr().out
        assert "units submitted 17  solved 17  suppressed 0  failed 0  in flight 0" in out
        assert "items submitted 1,001  solved 1,001  suppressed 0  failed 0  in flight 0" in out


def test_a_chunk_of_executor_calls_runs_only_on_the_call_role(fleet_name):
    # A Calls chunk runs its own function: a role whose handler is not the call refuses it
    # (a TypeError naming why) rather than running a function its handler never chose.
    with running(config(fleet_name, {"work": role("sometimes")})) as f:
        chunk_of = functools.partial(Calls, operator.neg)
        with pytest.raises(TypeError, match="role 'work' got a chunk of executor calls"):
            list(f._map("work", range(2), 2, 120, None, True, chunk_of=chunk_of))  # one chunk
        assert f.ledger()["failed_by_reason"] == {"HandlerError": 1}
        assert list(f.map("work", [0, 3], chunksize=2)) == [0, 6]  # the role goes on
