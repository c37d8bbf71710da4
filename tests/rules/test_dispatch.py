"""The dispatcher's pure rules: precedence, pooled grants, pins by key, posture gating."""
from __future__ import annotations

from admission.records import replace

import pytest

from fleet.rules import fsm
from fleet.rules.dispatch import Dispatcher, Pending, precedence
from fleet.rules.roles import Role, RoleSet
from fleet.rules.seats import SeatLayout, Seat, SlotSpec

ROLES = RoleSet(
    (
        Role("bg", kind="pooled", cordon_class="deferrable", handler="m:f", slots=2),
        Role("resolve", kind="pooled", cordon_class="never", handler="m:f", slots=2),
        Role("sim", kind="pooled", cordon_class="floor", handler="m:f", slots=4),
        Role("solver", kind="pinned", cordon_class="never", handler="m:f", slots=2),
        Role("merge", kind="singleton", cordon_class="never", handler="m:f", slots=1),
    )
)


def _layout(roles=ROLES):
    slots, index = [], 0
    for r in roles:
        for _ in range(r.slots):
            slots.append(SlotSpec(index, r.name, 0))
            index += 1
    return SeatLayout((Seat(0, "serial-0", roles.names, (0,), "logical"),), tuple(slots))


@pytest.fixture
def d():
    return Dispatcher(ROLES, _layout(), pin_depth=2)


def _unit(uid, role, key=None, priority=0):
    return Pending(uid, ROLES.code(role), key, priority)


def test_precedence_order():
    assert [precedence(r) for r in ROLES] == [3, 2, 1, 0, 0]


def test_grants_follow_precedence_across_roles(d):
    for uid, role, key in [(1, "bg", None), (2, "resolve", None), (3, "sim", None), (4, "solver", "k"), (5, "merge", None)]:
        d.enqueue(_unit(uid, role, key))
    assert [g.unit_id for g in d.grant()] == [4, 5, 3, 2, 1]


def test_pooled_grant_is_lease_then_start_on_a_free_slot(d):
    d.enqueue(_unit(1, "resolve"))
    (g,) = d.grant()
    assert g.transitions == ((fsm.LEASE, ROLES.code("resolve"), 0),) and g.start_event == fsm.START
    assert d.in_use(ROLES.code("resolve")) == 1


def test_pooled_role_never_holds_more_than_its_slots(d):
    for uid in range(5):
        d.enqueue(_unit(uid, "resolve"))
    granted = d.grant()
    assert len(granted) == 2 and d.queued(ROLES.code("resolve")) == 3
    assert d.grant() == []
    d.complete(granted[0].unit_id, fsm.IDLE)
    (g,) = d.grant()
    assert g.slot == granted[0].slot and g.unit_id == 2


def test_priority_then_submit_order_inside_a_role(d):
    d.enqueue(_unit(1, "resolve", priority=0))
    d.enqueue(_unit(2, "resolve", priority=5))
    d.enqueue(_unit(3, "resolve", priority=5))
    assert [g.unit_id for g in d.grant()] == [2, 3]


@pytest.mark.parametrize("role", ["resolve", "solver"])
def test_a_run_queued_in_one_call_is_granted_as_units_queued_one_by_one(role):
    """`enqueue_many` (a run of submits, accepted in bulk) keeps every order `enqueue` keeps:
    priority first, then submit order, per key for a keyed role."""
    keys = ["a", "b"] if role == "solver" else [None, None]
    run = [_unit(uid, role, keys[uid % 2], priority) for uid, priority in
           enumerate([0, 5, 0, 5, 7, 0, 7, 5, 0], start=1)]
    one_by_one, bulk = Dispatcher(ROLES, _layout(), pin_depth=9), Dispatcher(ROLES, _layout(), pin_depth=9)
    for item in run:
        one_by_one.enqueue(replace(item))
    bulk.enqueue_many([replace(item) for item in run])
    code = ROLES.code(role)
    assert bulk.queued(code) == one_by_one.queued(code) == len(run)
    order = _granted_till_empty(one_by_one)
    assert _granted_till_empty(bulk) == order and sorted(order) == list(range(1, 10))
    if role == "resolve":
        assert order == [5, 7, 2, 4, 8, 1, 3, 6, 9]


def _granted_till_empty(d) -> list:
    """Every unit's id in grant order, each pass's grants completed before the next pass."""
    order = []
    while grants := d.grant():
        order += [g.unit_id for g in grants]
        for g in grants:
            d.complete(g.unit_id, fsm.IDLE if g.role != ROLES.code("solver") else fsm.PINNED)
    return order


def test_a_grant_carries_what_was_queued(d):
    item = _unit(1, "resolve")
    d.enqueue(item)
    (g,) = d.grant()
    assert g.item is item and g.unit_id == 1


def test_keyed_units_claim_then_resume_their_pin_in_order(d):
    solver = ROLES.code("solver")
    for uid in range(1, 4):
        d.enqueue(_unit(uid, "solver", "a"))
    first, second = d.grant()  # pin depth 2
    assert first.transitions == ((fsm.LEASE, solver, first.key_id),) and first.start_event == fsm.START
    assert second.transitions == () and second.start_event == fsm.RESUME and second.slot == first.slot
    assert d.grant() == []  # the third waits behind the pin's depth
    d.complete(1, fsm.PINNED)
    (third,) = d.grant()
    assert (third.unit_id, third.slot, third.start_event) == (3, first.slot, fsm.RESUME)


def test_distinct_keys_take_distinct_pins_and_then_wait(d):
    for uid, key in [(1, "a"), (2, "b"), (3, "c")]:
        d.enqueue(_unit(uid, "solver", key))
    grants = d.grant()
    assert [g.unit_id for g in grants] == [1, 2] and grants[0].slot != grants[1].slot
    assert d.grant() == []  # both pins busy: c waits


def _elastic():
    roles = RoleSet(tuple(replace(r, elastic_repin=True) if r.name == "solver" else r for r in ROLES))
    return Dispatcher(roles, _layout(roles), pin_depth=2)


def test_a_new_key_waits_for_an_epoch_when_every_pin_is_taken(d):
    solver = ROLES.code("solver")
    for uid, key in [(1, "a"), (2, "b")]:
        d.enqueue(_unit(uid, "solver", key))
    ga, gb = d.grant()
    d.complete(1, fsm.PINNED)
    d.complete(2, fsm.PINNED)
    d.enqueue(_unit(3, "solver", "c"))
    assert d.grant() == []  # no elastic re-pin: both pins stay, c waits (idle slots of other roles notwithstanding)
    assert d.pinned_keys(solver) == {"a": ga.slot, "b": gb.slot} and d.repins[solver] == 0
    d.begin_epoch()
    released = d.take_idle_stale_pins()  # the epoch boundary: T9 for both
    assert released == sorted([ga.slot, gb.slot])
    (gc,) = d.grant()
    assert gc.transitions == ((fsm.LEASE, solver, gc.key_id),)
    assert d.pinned_keys(solver) == {"c": gc.slot}


def test_a_new_key_rekeys_the_least_recently_used_idle_pin():
    d = _elastic()
    solver = ROLES.code("solver")
    for uid, key in [(1, "a"), (2, "b")]:
        d.enqueue(_unit(uid, "solver", key))
    ga, gb = d.grant()
    d.complete(1, fsm.PINNED)
    d.complete(2, fsm.PINNED)
    d.enqueue(_unit(3, "solver", "a"))
    d.grant()
    d.complete(3, fsm.PINNED)
    d.enqueue(_unit(4, "solver", "c"))
    (gc,) = d.grant()
    assert gc.slot == gb.slot  # b was used least recently
    assert gc.transitions[0] == (fsm.UNPIN, solver, gb.key_id)
    assert gc.transitions[1][0] == fsm.LEASE and gc.transitions[1][2] != gb.key_id
    assert d.pinned_keys(solver) == {"a": ga.slot, "c": gb.slot}
    assert d.repins[solver] == 1 and d.held(solver) == 2


def test_singleton_is_one_pin(d):
    for uid in range(1, 4):
        d.enqueue(_unit(uid, "merge"))
    grants = d.grant()
    assert {g.slot for g in grants} == {grants[0].slot} and grants[0].start_event == fsm.START


def test_cordon_holds_deferrable_and_floors_floor_roles(d):
    floors = [0] * len(ROLES)
    floors[ROLES.code("sim")] = 2
    d.set_posture(fsm.CORDONED, floors)
    for uid in range(1, 5):
        d.enqueue(_unit(uid, "sim"))
    d.enqueue(_unit(10, "bg"))
    d.enqueue(_unit(20, "resolve"))
    granted = [g.unit_id for g in d.grant()]
    assert granted == [1, 2, 20]  # sim floored at 2, bg held, resolve (never) untouched
    assert d.suppressed == 2  # one sim unit and the bg unit, once each
    d.grant()
    assert d.suppressed == 2
    d.set_posture(fsm.NOMINAL, floors)
    assert sorted(g.unit_id for g in d.grant()) == [3, 4, 10]


def test_completion_to_idle_releases_the_pin(d):
    solver = ROLES.code("solver")
    d.enqueue(_unit(1, "solver", "a"))
    d.grant()
    d.complete(1, fsm.IDLE)  # drained: the pin is gone
    assert d.pinned_keys(solver) == {}


def test_seat_lost_returns_what_it_owed_in_grant_order_and_forgets_pins(d):
    d.enqueue(_unit(1, "resolve"))
    d.enqueue(_unit(2, "solver", "a"))
    d.enqueue(_unit(3, "solver", "a"))  # behind its key's pin (pin depth 2)
    grants = d.grant()
    owed = d.seat_lost(0)
    assert [(lost.item.unit_id, lost.slot) for lost in owed] == [(g.unit_id, g.slot) for g in grants]
    assert [lost.item.unit_id for lost in owed] == [2, 3, 1]  # keyed first (precedence)
    assert d.inflight_count() == 0 and d.pinned_keys(ROLES.code("solver")) == {}
    assert d.in_use(ROLES.code("resolve")) == 0 and d.held(ROLES.code("resolve")) == 0
    assert d.seat_lost(0) == []  # nothing is owed twice


def test_units_put_back_after_a_seat_death_are_granted_again_first_in_the_order_they_had():
    """Every unit in flight came back unrun: the next grants are the same units in the same
    order, ahead of everything that was queued behind them (priority levels and keys kept)."""
    d = Dispatcher(ROLES, _layout(), pin_depth=2)
    units = [_unit(1, "resolve"), _unit(2, "resolve", priority=2), _unit(3, "resolve"), _unit(4, "solver", "a"),
             _unit(5, "solver", "b"), _unit(6, "solver", "a"), _unit(7, "solver", "a"), _unit(8, "resolve", priority=2)]
    for unit in units:
        d.enqueue(unit)
    first = [g.unit_id for g in d.grant()]
    assert first == [4, 6, 5, 2, 8]  # keyed (a twice: pin depth 2), then resolve by priority
    lost = d.seat_lost(0)
    d.put_back_first([x.item for x in lost])
    again = [g.unit_id for g in d.grant()]
    assert again == first
    # and what waited behind them comes after them, in its own order
    for uid in again:
        d.complete(uid, fsm.PINNED if uid in (4, 5, 6) else fsm.IDLE)
    assert [g.unit_id for g in d.grant()] == [7, 1, 3]


def test_a_unit_put_back_goes_before_the_units_queued_at_its_level_and_its_key_before_other_keys():
    d = Dispatcher(ROLES, _layout(), pin_depth=2)
    d.enqueue(_unit(1, "resolve"))
    d.enqueue(_unit(2, "resolve"))
    d.enqueue(_unit(3, "solver", "a"))
    (g1, g2, g3) = d.grant()
    lost = {x.item.unit_id: x.item for x in d.seat_lost(0)}
    d.enqueue(_unit(4, "resolve"))
    d.enqueue(_unit(5, "resolve", priority=1))
    d.enqueue(_unit(6, "solver", "b"))
    d.put_back_first([lost[3], lost[1]])  # 2 had started (it fails); 1 and 3 had not
    assert [g.unit_id for g in d.grant()] == [3, 6, 5, 1]  # key a first; a higher priority still goes first
    assert d.queued(ROLES.code("resolve")) == 1  # 4 waits for a slot


def test_a_key_no_pin_can_come_to_is_not_taken_up_so_a_cancel_still_takes_it(d):
    """`skip` marks a unit's future running: it is asked only of a unit about to be granted,
    never of a key's head while every pin is another key's (else cancel_futures could not
    cancel it, and shutdown waited for it for ever)."""
    for uid, key in [(1, "a"), (2, "b")]:
        d.enqueue(_unit(uid, "solver", key))
    d.grant()
    d.complete(1, fsm.PINNED)  # a's pin is idle: still a's until an epoch boundary
    asked = []
    d.skip = lambda uid: asked.append(uid) or False
    d.enqueue(_unit(3, "solver", "c"))
    d.enqueue(_unit(4, "solver", "a"))
    d.enqueue(_unit(5, "solver", "b"))
    d.enqueue(_unit(6, "solver", "b"))
    d.enqueue(_unit(7, "solver", "b"))
    assert [g.unit_id for g in d.grant()] == [4, 5]  # b's pin is full at depth 2 (2 and 5)
    assert asked == [4, 5]  # c's head, and b's beyond the pin's depth, were not asked


def test_units_of_a_key_no_pin_can_come_to_are_the_unpinnable_ones(d):
    solver = ROLES.code("solver")
    for uid, key in [(1, "a"), (2, "b")]:
        d.enqueue(_unit(uid, "solver", key))
    d.grant()
    d.complete(1, fsm.PINNED)
    for uid, key in [(3, "c"), (4, "a"), (5, "c"), (6, "d")]:
        d.enqueue(_unit(uid, "solver", key))
    assert sorted(p.unit_id for p in d.drain_unpinnable()) == [3, 5, 6]
    assert d.queued(solver) == 1 and [g.unit_id for g in d.grant()] == [4]
    assert d.drain_unpinnable() == []


def test_no_unit_is_unpinnable_while_a_pin_may_still_come_free(d):
    solver = ROLES.code("solver")
    d.enqueue(_unit(1, "solver", "a"))
    d.grant()
    d.enqueue(_unit(2, "solver", "c"))
    assert d.drain_unpinnable() == []  # the role holds one pin of its two: c gets the other
    d.enqueue(_unit(3, "solver", "b"))
    d.grant()  # c takes the second pin; b waits without one
    d.enqueue(_unit(4, "solver", "d"))
    d.begin_epoch()  # every pin is to be released once empty: d gets one then
    assert d.drain_unpinnable() == [] and d.queued(solver) == 2
    e = _elastic()
    for uid, key in [(1, "a"), (2, "b"), (3, "c")]:
        e.enqueue(_unit(uid, "solver", key))
    e.grant()
    assert e.drain_unpinnable() == []  # elastic: c re-keys a pin once one is idle


def test_skip_drops_cancelled_units(d):
    d.skip = lambda uid: uid == 2
    for uid in (1, 2, 3):
        d.enqueue(_unit(uid, "resolve"))
    assert [g.unit_id for g in d.grant()] == [1, 3]
    assert d.take_skipped() == [2] and d.take_skipped() == []


def test_a_run_queued_in_one_call_is_sent_ahead_as_one_by_one():
    grants = []
    for bulk in (False, True):
        roles, d = _two(Role("a", handler="m:f", slots=1, lookahead=4), Role("b", handler="m:f", slots=1))
        run = [Pending(uid, roles.code("a")) for uid in range(1, 6)]
        if bulk:
            d.enqueue_many(run)
        else:
            for item in run:
                d.enqueue(item)
        grants.append([(g.unit_id, g.ahead) for g in d.grant()])
    assert grants[0] == grants[1] == [(1, False), (2, True), (3, True)]  # then 2 queued < 1 held x 3 in flight


def test_a_unit_cancelled_as_it_would_be_sent_ahead_is_dropped_and_the_next_goes():
    roles, d = _two(Role("a", handler="m:f", slots=1, lookahead=4), Role("b", handler="m:f", slots=1))
    a = roles.code("a")
    d.skip = lambda uid: uid in (2, 3)
    for uid in range(1, 6):
        d.enqueue(Pending(uid, a))
    grants = d.grant()
    assert [(g.unit_id, g.ahead) for g in grants] == [(1, False), (4, True)]  # 5 waits: 1 queued < 1 held x 2
    assert d.take_skipped() == [2, 3] and d.queued(a) == 1


def test_drain_queue_returns_queued_units(d):
    d.enqueue(_unit(1, "bg"))
    d.enqueue(_unit(2, "solver", "x"))
    assert sorted(p.unit_id for p in d.drain_queue()) == [1, 2]
    assert d.grant() == []


# --- epochs: pins are released (T9) at a quota change, release before re-lease --------------


def test_an_epoch_releases_idle_pins_at_once(d):
    solver = ROLES.code("solver")
    d.enqueue(_unit(1, "solver", "a"))
    (g,) = d.grant()
    d.complete(1, fsm.PINNED)
    assert d.take_idle_stale_pins() == []  # no epoch yet: a pin is kept
    assert d.begin_epoch() == 1
    assert d.take_idle_stale_pins() == [g.slot] and d.pinned_keys(solver) == {}
    assert d.take_idle_stale_pins() == []  # once


def test_a_busy_pin_takes_nothing_new_after_an_epoch_then_is_released(d):
    solver = ROLES.code("solver")
    d.enqueue(_unit(1, "solver", "a"))
    (g,) = d.grant()
    d.begin_epoch()
    assert d.take_idle_stale_pins() == []  # busy: released when it is empty
    d.enqueue(_unit(2, "solver", "a"))
    assert d.grant() == []  # not RESUMEd on the old epoch's pin
    d.complete(1, fsm.PINNED)
    (g2,) = d.grant()  # the key's next unit: UNPIN (T9) then LEASE (T1) on the same slot
    assert g2.slot == g.slot and g2.start_event == fsm.START
    assert g2.transitions[0] == (fsm.UNPIN, solver, g.key_id) and g2.transitions[1][0] == fsm.LEASE
    assert d.pinned_keys(solver) == {"a": g.slot} and d.take_idle_stale_pins() == []


def test_a_pin_drained_to_idle_is_not_released_twice(d):
    d.enqueue(_unit(1, "merge"))
    (g,) = d.grant()
    d.begin_epoch()
    d.complete(1, fsm.IDLE)  # T7/T8 took it to Idle: the pin is already gone
    assert d.take_idle_stale_pins() == [] and d.units_in_flight(g.slot) == 0


def test_pooled_slots_hold_no_pin_to_release(d):
    d.enqueue(_unit(1, "resolve"))
    (g,) = d.grant()
    assert d.begin_epoch() == 0 and d.units_in_flight(g.slot) == 1


# --- a pin drained with units sent behind it --------------------------------------------------


def test_units_behind_a_drained_pin_come_back_in_submit_order(d):
    solver = ROLES.code("solver")
    d.posture = fsm.CORDONED  # solver is never shed: cordon does not hold its grants
    for uid in (1, 2, 3, 4):
        d.enqueue(_unit(uid, "solver", "k"))
    first, second = d.grant()  # 1 claims the pin, 2 is sent behind it (RESUME); pin depth 2
    assert second.start_event == fsm.RESUME and first.slot == second.slot
    d.complete(1, fsm.IDLE)  # cordon drained the pin: the slot ended Idle with 2 sent to it
    assert d.grant() == []  # 3 is not sent behind the drained pin, nor elsewhere before 2
    assert d.requeue(2)
    assert d.queued(solver) == 3 and d.inflight_count() == 0
    regrant = d.grant()
    assert [g.unit_id for g in regrant] == [2, 3]  # submit order kept: 2 first, then 3 (pin depth 2)
    assert regrant[0].transitions[-1][0] == fsm.LEASE  # a new pin, claimed afresh
    assert regrant[1].start_event == fsm.RESUME


def test_a_drained_pin_takes_nothing_new_until_its_units_are_back(d):
    for uid in (1, 2):
        d.enqueue(_unit(uid, "solver", "k"))
    first, _ = d.grant()
    d.complete(1, fsm.IDLE)
    d.enqueue(_unit(3, "solver", "k"))
    d.enqueue(_unit(4, "solver", "j"))
    (g,) = d.grant()  # another key may claim a pin; the drained one takes nothing new
    assert (g.unit_id, g.transitions[-1][0]) == (4, fsm.LEASE) and g.slot != first.slot
    assert d.requeue(2)
    assert [g.unit_id for g in d.grant()] == [2, 3]
    assert d.pinned_keys(ROLES.code("solver")) == {"k": first.slot, "j": g.slot}


def test_requeue_refuses_what_was_not_behind_a_drained_pin(d):
    d.enqueue(_unit(1, "solver", "k"))
    d.enqueue(_unit(2, "resolve"))
    d.grant()
    assert not d.requeue(1)  # its pin was not drained
    assert not d.requeue(2)  # pooled: never behind a pin
    assert not d.requeue(99)  # unknown
    assert d.inflight_count() == 2 and d.queued(ROLES.code("solver")) == 0


# --- role switching (002 §3.4): an Idle slot serves whichever role comes next --------------------


def _two(*roles):
    """Roles on one seat (serial), and their dispatcher."""
    roles = RoleSet(roles)
    return roles, Dispatcher(roles, _layout(roles), pin_depth=2)


def test_an_idle_slot_is_leased_for_another_role_after_its_unit():
    roles, d = _two(Role("a", handler="m:f"), Role("b", handler="m:f"))
    d.enqueue(Pending(1, roles.code("a")))
    (ga,) = d.grant()
    d.complete(1, fsm.IDLE)  # T5: back to Idle
    d.enqueue(Pending(2, roles.code("b")))
    (gb,) = d.grant()
    assert gb.slot == ga.slot and gb.transitions == ((fsm.LEASE, roles.code("b"), 0),)  # T1 for role b
    assert d.slot_role(gb.slot) == roles.code("b") and d.held(roles.code("a")) == 0


def test_an_idle_slot_goes_back_to_the_role_it_last_served_first():
    roles, d = _two(Role("a", handler="m:f", slots=2), Role("b", handler="m:f", slots=2))
    a, b = roles.code("a"), roles.code("b")
    d.enqueue(Pending(1, a))
    d.enqueue(Pending(2, b))
    ga, gb = d.grant()
    d.complete(1, fsm.IDLE)
    d.complete(2, fsm.IDLE)  # b's slot went Idle last
    d.enqueue(Pending(3, a))
    (g,) = d.grant()
    assert g.slot == ga.slot  # a gets its own slot back, not the one idle last


def test_a_role_holds_at_most_its_count_whatever_is_idle():
    roles, d = _two(Role("a", handler="m:f", slots=1), Role("b", handler="m:f", slots=5))
    for uid in range(1, 4):
        d.enqueue(Pending(uid, roles.code("a")))
    grants = d.grant()
    # five Idle slots are left, but a's count is 1 (its next unit is sent ahead to that slot)
    assert [(g.unit_id, g.ahead) for g in grants] == [(1, False), (2, True)] and grants[1].slot == grants[0].slot
    assert d.held(roles.code("a")) == 1 and d.queued(roles.code("a")) == 1


def test_a_pinned_slot_keeps_its_role_and_key_while_others_wait():
    roles, d = _two(Role("k", kind="pinned", handler="m:f", slots=1), Role("p", handler="m:f", slots=1))
    k, p = roles.code("k"), roles.code("p")
    d.enqueue(Pending(1, k, "x"))
    (gk,) = d.grant()
    d.complete(1, fsm.PINNED)
    for uid in (2, 3):
        d.enqueue(Pending(uid, p))
    gp, behind = d.grant()  # p's second unit is sent ahead to the one slot p holds
    assert behind.ahead and behind.slot == gp.slot
    assert gp.slot != gk.slot and d.grant() == []  # the Pinned slot is not p's, though it runs nothing
    d.enqueue(Pending(4, k, "y"))
    assert d.grant() == []  # nor another key's (no elastic_repin): it waits for an epoch
    assert d.pinned_keys(k) == {"x": gk.slot} and d.slot_role(gk.slot) == k


def test_a_role_leases_only_slots_of_seats_it_may_use():
    roles = RoleSet((Role("a", handler="m:f", slots=1), Role("b", handler="m:f", slots=1)))
    seats = (Seat(0, "a-0", ("a",), (0,), "pinned"), Seat(1, "b-0", ("b",), (1,), "pinned"))
    d = Dispatcher(roles, SeatLayout(seats, (SlotSpec(0, "a", 0), SlotSpec(1, "b", 1))))
    d.enqueue(Pending(1, roles.code("b")))
    (g,) = d.grant()
    d.complete(1, fsm.IDLE)
    d.enqueue(Pending(2, roles.code("a")))
    (ga,) = d.grant()
    assert (g.slot, g.seat, ga.slot, ga.seat) == (1, 1, 0, 0)  # b's cores are not a's share


def _seats(n_seats: int, per_seat: int, slots: int | None = None, warm_seats: bool = True):
    """One pooled role over `n_seats` seats of `per_seat` slots each."""
    roles = RoleSet((Role("a", handler="m:f", slots=slots or n_seats * per_seat, lookahead=0),))
    seats = tuple(Seat(s, f"a-{s}", ("a",), (s,), "pinned") for s in range(n_seats))
    specs = tuple(SlotSpec(s * per_seat + k, "a", s) for s in range(n_seats) for k in range(per_seat))
    return roles.code("a"), Dispatcher(roles, SeatLayout(seats, specs), warm_seats=warm_seats)


def _lone_units(a, d, n: int) -> list[int]:
    """The seats of `n` units granted and completed one at a time."""
    seats = []
    for uid in range(1, n + 1):
        d.enqueue(Pending(uid, a))
        (g,) = d.grant()
        seats.append(g.seat)
        d.complete(uid, fsm.IDLE)
    return seats


def test_one_unit_at_a_time_goes_to_the_worker_that_ran_out_of_work_last():
    # Its worker may still be looking for its next task; the seats taking turns would
    # put every such unit on a worker that had gone to sleep.
    a, d = _seats(3, 1)
    assert _lone_units(a, d, 5) == [0] * 5


def test_lone_units_take_turns_when_no_seat_is_kept_warm():
    # Workers that retire after max_tasks: the seat that ran the last unit is the one
    # whose worker may be leaving.
    a, d = _seats(3, 1, warm_seats=False)
    assert _lone_units(a, d, 5) == [0, 1, 2, 0, 1]


def test_the_warm_seat_is_the_one_whose_slot_went_idle_last():
    a, d = _seats(3, 1)
    for uid in (1, 2, 3):
        d.enqueue(Pending(uid, a))
    first = {g.unit_id: g.seat for g in d.grant()}
    assert sorted(first.values()) == [0, 1, 2]
    d.complete(1, fsm.IDLE)
    d.complete(2, fsm.IDLE)  # unit 2's seat ran out of work last (taking turns would give unit 1's)
    d.enqueue(Pending(4, a))
    (g,) = d.grant()
    assert g.seat == first[2]


def test_a_burst_still_spreads_over_the_seats_of_many_slots():
    # The warm seat is taken only while nothing runs there: a burst's units take turns.
    a, d = _seats(2, 4)
    d.enqueue(Pending(1, a))
    (g,) = d.grant()
    d.complete(1, fsm.IDLE)
    for uid in range(2, 6):
        d.enqueue(Pending(uid, a))
    assert sorted(x.seat for x in d.grant()) == [0, 0, 1, 1]


def test_the_warm_seat_is_not_taken_by_a_role_that_may_not_use_it():
    roles = RoleSet((Role("a", handler="m:f", slots=1), Role("b", handler="m:f", slots=2)))
    seats = (Seat(0, "a-0", ("a",), (0,), "pinned"), Seat(1, "b-0", ("b",), (1,), "pinned"),
             Seat(2, "b-1", ("b",), (2,), "pinned"))
    d = Dispatcher(roles, SeatLayout(seats, (SlotSpec(0, "a", 0), SlotSpec(1, "b", 1), SlotSpec(2, "b", 2))))
    d.enqueue(Pending(1, roles.code("a")))
    (g,) = d.grant()
    d.complete(1, fsm.IDLE)  # seat 0 is warm, but it is a's alone
    d.enqueue(Pending(2, roles.code("b")))
    (gb,) = d.grant()
    assert g.seat == 0 and gb.seat in (1, 2)


def test_a_seat_whose_worker_died_is_not_kept_warm():
    # Its slots are Idle again at once, but its successor is still starting.
    a, d = _seats(2, 1)
    assert _lone_units(a, d, 2) == [0, 0]
    d.enqueue(Pending(10, a))
    (g,) = d.grant()
    assert g.seat == 0
    d.seat_lost(0)  # its worker died running unit 10
    d.enqueue(Pending(11, a))
    (g,) = d.grant()
    assert g.seat == 1
    d.complete(11, fsm.IDLE)
    d.seat_lost(1)  # a worker that died with nothing to run
    d.enqueue(Pending(12, a))
    (g,) = d.grant()
    assert g.seat == 0


def test_units_put_back_by_two_seat_deaths_are_granted_again_in_submit_order():
    # Unit 1 put back by one seat's death, granted again elsewhere, put back by a second
    # death after unit 2 was: each death's units went to the head, so unit 2 went first.
    a, d = _seats(2, 1)
    d.enqueue(Pending(1, a))
    (g1,) = d.grant()
    d.put_back_first([x.item for x in d.seat_lost(g1.seat)])
    (g1,) = d.grant()
    d.enqueue(Pending(2, a))
    (g2,) = d.grant()
    assert g1.seat != g2.seat
    d.put_back_first([x.item for x in d.seat_lost(g1.seat)])
    d.put_back_first([x.item for x in d.seat_lost(g2.seat)])
    assert [g.unit_id for g in d.grant()] == [1, 2]
