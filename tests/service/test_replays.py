"""`fleet.service.replays`: a request id stands for the unit first admitted under it, while the
unit is owed and for the ttl after it ended (within a bound), on a fake clock."""
from __future__ import annotations

from concurrent.futures import Future

import pytest

from fleet.service.replays import Replays, RequestIdReused, identity


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def unit(unit_id: int) -> Future:
    fut = Future()
    fut.unit_id = unit_id
    return fut


SAME = identity("r", b"payload", None, None, False, None)


def test_a_request_id_answers_with_its_unit_while_owed_and_for_the_ttl_after():
    clock = Clock()
    replays = Replays(ttl_s=60, clock=clock)
    fut = unit(1)
    replays.admitted("a", SAME, fut)
    clock.now += 3600  # owed: an unended unit is never forgotten
    assert replays.find("a", SAME) is fut
    fut.set_result(1)
    clock.now += 59
    assert replays.find("a", SAME) is fut
    clock.now += 2
    assert replays.find("a", SAME) is None and len(replays) == 0


def test_the_same_id_with_other_arguments_is_refused():
    replays = Replays(clock=Clock())
    replays.admitted("a", SAME, unit(1))
    for other in (identity("r", b"other", None, None, False, None), identity("s", b"payload", None, None, False, None),
                  identity("r", b"payload", 7, None, False, None), identity("r", b"payload", None, "l", False, None)):
        with pytest.raises(RequestIdReused, match="'a' was given to unit 1"):
            replays.find("a", other)
    assert replays.find("b", SAME) is None


def test_past_the_bound_the_oldest_ended_ids_go_first():
    replays = Replays(ttl_s=60, max_ended=2, clock=Clock())
    futs = [unit(i) for i in range(3)]
    for i, fut in enumerate(futs):
        replays.admitted(f"id{i}", SAME, fut)
    live = unit(9)
    replays.admitted("live", SAME, live)
    for fut in futs:
        fut.set_result(None)
    assert replays.find("id0", SAME) is None
    assert replays.find("id1", SAME) is futs[1] and replays.find("id2", SAME) is futs[2]
    assert replays.find("live", SAME) is live
