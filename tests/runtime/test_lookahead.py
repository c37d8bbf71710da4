"""Seats kept fed: a pooled role's next unit waits on the seat's ring behind the one that
runs (the role's `lookahead`), and still walks the slot FSM (T1, T2, T5) for itself."""
from __future__ import annotations

import os
import signal
import time

import pytest

import fleet
from fleet.rules import fsm
from fleet.rules.dispatch import Dispatcher, Pending
from fleet.rules.roles import Role, RoleSet
from fleet.rules.seats import Seat, SeatLayout, SlotSpec
from tests.fleets import config, running, worker_pids

WAIT_S = 120.0


def _dispatcher(*, slots=2, seats=2, lookahead=1, io_bound=False):
    roles = RoleSet((Role("w", kind="pooled", handler="m:f", slots=slots, lookahead=lookahead, io_bound=io_bound),))
    layout = SeatLayout(tuple(Seat(i, f"w-{i}", ("w",), (i,), "pinned") for i in range(seats)),
                        tuple(SlotSpec(i, "w", i % seats) for i in range(slots)))
    return Dispatcher(roles, layout)


def _fill(d, n, first=1):
    for uid in range(first, first + n):
        d.enqueue(Pending(uid, 0))


# ------------------------------------------------------------------------------ the rules
def test_with_no_idle_slot_the_next_units_are_sent_ahead_behind_the_running_ones():
    d = _dispatcher()
    _fill(d, 6)
    grants = d.grant()
    assert [(g.unit_id, g.start_event, g.transitions, g.ahead) for g in grants] == [
        (1, fsm.START, ((fsm.LEASE, 0, 0),), False),
        (2, fsm.START, ((fsm.LEASE, 0, 0),), False),
        # sent ahead: no transition from the supervisor; the worker LEASEs then STARTs
        (3, fsm.LEASE, (), True),
        (4, fsm.LEASE, (), True),
    ]
    assert {grants[2].slot, grants[3].slot} == {grants[0].slot, grants[1].slot}  # one behind each
    assert d.held(0) == 2 and d.queued(0) == 2  # never more slots than its count
    assert d.grant() == []  # each slot has one running and one ahead: lookahead 1
    # the first unit ends: its slot's unit sent ahead runs now, and the slot takes one more
    d.complete(1, fsm.IDLE)
    (g,) = d.grant()
    assert (g.unit_id, g.slot, g.ahead) == (5, grants[0].slot, True) and d.held(0) == 2


def test_deeper_lookahead_fills_the_shallowest_slot_first_and_never_past_what_is_queued():
    d = _dispatcher(lookahead=3)
    _fill(d, 20)
    grants = d.grant()
    first = {g.slot for g in grants if not g.ahead}
    ahead = [g.slot for g in grants if g.ahead]
    assert len(first) == 2 and len(ahead) == 6  # three behind each slot: its lookahead
    assert ahead[0::2] == [ahead[0]] * 3 and ahead[1::2] == [ahead[1]] * 3 and set(ahead) == first  # in turn
    assert d.queued(0) == 12
    # a short queue: no slot gets more waiting on it than is left queued for the others
    d = _dispatcher(lookahead=3)
    _fill(d, 6)
    assert [g.ahead for g in d.grant()] == [False, False, True, True] and d.queued(0) == 2


def test_nothing_is_sent_ahead_while_the_queue_is_shorter_than_the_slots_held():
    """A unit sent ahead waits behind a running one; with fewer queued than slots held, a
    slot that frees elsewhere would start it at once."""
    d = _dispatcher()
    _fill(d, 3)
    assert [g.ahead for g in d.grant()] == [False, False]  # 1 left < 2 held
    assert d.queued(0) == 1


def test_lookahead_zero_and_several_slots_per_sequential_seat_send_nothing_ahead():
    d = _dispatcher(lookahead=0)
    _fill(d, 10)
    assert [g.ahead for g in d.grant()] == [False, False]
    # 4 slots on 2 seats that run one unit after another: each seat has a unit waiting already
    d = _dispatcher(slots=4)
    _fill(d, 10)
    assert [g.ahead for g in d.grant()] == [False] * 4
    # an I/O-bound role's slots run at once: each is fed, whatever the slots per seat,
    # with one unit ahead (its units wait far longer than a round trip)
    d = _dispatcher(slots=4, io_bound=True, lookahead=3)
    _fill(d, 40)
    assert [g.ahead for g in d.grant()] == [False] * 4 + [True] * 4


def test_a_dead_seats_units_sent_ahead_are_owed_in_grant_order_and_go_back_first_when_unstarted():
    d = _dispatcher()
    _fill(d, 6)
    grants = {g.unit_id: g for g in d.grant()}  # 1, 2 run; 3, 4 sent ahead; 5, 6 queued
    seat = grants[1].seat
    behind = next(u for u in (3, 4) if grants[u].seat == seat)
    lost = d.seat_lost(seat)
    assert [(x.item.unit_id, x.slot) for x in lost] == [(1, grants[1].slot), (behind, grants[1].slot)]
    assert not d.sent_ahead(behind) and d.queued(0) == 2
    d.put_back_first([x.item for x in lost if x.item.unit_id == behind])  # 1 had started; it fails
    assert d.queued(0) == 3
    # it comes back first, before the units that were still queued
    d.complete(2, fsm.IDLE)
    order = [g.unit_id for g in d.grant()]
    assert order[0] == behind and set(order) <= {behind, 5, 6}


def test_pacing_a_role_down_stops_sending_ahead_and_up_resumes_within_its_lookahead():
    d = _dispatcher(lookahead=3)
    assert d.ahead_caps() == [3]
    d.pace(0, 0)  # long units: nothing ahead
    _fill(d, 20)
    assert [g.ahead for g in d.grant()] == [False, False] and d.queued(0) == 18
    d.pace(0, 1)  # the slots that run one take one more each, now
    assert [g.ahead for g in d.grant()] == [True, True]
    d.pace(0, 99)  # never past the role's lookahead
    assert len(d.grant()) == 4 and d.queued(0) == 12
    d.pace(0, 0)  # what was sent stays; nothing more goes
    d.complete(1, fsm.IDLE)
    assert d.grant() == []


# ------------------------------------------------------------------------------ real workers
def _one_seat(name, handler, **fields):
    spec = {"kind": "pooled", "handler": f"tests.handlers:{handler}", "slots": 1, "peak_cpus": 1,
            "queue_bound": 10_000, "lookahead": 1}
    spec.update(fields)
    return config(name, {"w": spec}, profile="pinned")


def test_a_slot_walks_lease_start_release_for_every_unit_sent_ahead(fleet_name):
    """`slots` = processes: the seat's next unit is sent ahead; the worker LEASEs (T1) and
    STARTs (T2) it itself, and RELEASEs (T5) it: three generations per unit, as without."""
    with running(_one_seat(fleet_name, "square")) as f:
        slot = f.layout.slots_of("w")[0]
        gen0 = f._sup.table.snapshot().slot(slot)["generation"]
        assert [x.result(WAIT_S) for x in [f.submit("w", i) for i in range(500)]] == [i * i for i in range(500)]
        row = f._sup.table.snapshot().slot(slot)
        assert row["state"] == "Idle" and row["generation"] - gen0 == 3 * 500 and row["done"] >= 500
        sent_ahead = f._sup.inspect(lambda sup: sup.dispatcher.sent_ahead_total)
        assert sent_ahead > 0, "no unit was sent ahead: the seat waited a round trip for each"
        ledger = f.ledger()
        assert (ledger["submitted"], ledger["solved"], ledger["inflight"]) == (500, 500, 0)


def test_a_unit_sent_ahead_of_a_killed_worker_runs_on_its_successor_and_solves(fleet_name):
    with running(_one_seat(fleet_name, "hang")) as f:
        long = f.submit("w", 30.0)
        behind = f.submit("w", 0.0)  # queued 1 >= held 1: sent ahead, behind the long one
        deadline = time.monotonic() + WAIT_S
        while not f._sup.inspect(lambda sup: sup.dispatcher.sent_ahead(behind.unit_id)):
            assert time.monotonic() < deadline, "the second unit was never sent ahead"
            time.sleep(0.01)
        slot = f.layout.slots_of("w")[0]
        while f._sup.table.unit(slot) != long.unit_id:  # the worker has started the long one
            assert time.monotonic() < deadline, "the worker never started the first unit"
            time.sleep(0.01)
        (pid,) = worker_pids(f)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(fleet.UnitFailed) as err:
            long.result(WAIT_S)
        assert err.value.outcome.reason == "LaneDeath"
        assert behind.result(WAIT_S) == "woke"  # it never ran: it went back to the queue, not to LaneDeath
        ledger = f.ledger()
        assert (ledger["submitted"], ledger["solved"], ledger["failed"], ledger["inflight"]) == (2, 1, 1, 0)
