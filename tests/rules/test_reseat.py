"""The seats follow the quota, the pure part: which booted seats an epoch's quota runs and
on which CPUs (`fleet.rules.seats.place`), what changes from one epoch to the next
(`changes`), and the dispatcher's side of a retired seat (`Dispatcher.set_live`).

`place` is judged against every quota step from a quarter CPU up to the host's CPUs, on
hosts of 1 to 8 CPUs, for several role sets, by what it must hold whatever the layout:
every role runs somewhere, a placed seat runs exactly what the epoch lays out, the
booted quota places every seat as booted, and `changes` carries one placement onto the
next."""
from __future__ import annotations

from admission.records import replace
import itertools

import pytest

from fleet.rules import fsm
from fleet.rules import plan as plan_mod
from fleet.rules import quota as quota_mod
from fleet.rules import seats
from fleet.rules.budget import BudgetOverrides
from fleet.rules.dispatch import Dispatcher, Pending
from fleet.rules.errors import FleetError
from fleet.rules.roles import Role, RoleSet

ROLE_SETS = {
    "one pooled": RoleSet((Role("w", kind="pooled", handler="m:f", slots=4),)),
    "pooled and io": RoleSet((Role("w", kind="pooled", handler="m:f", slots=4),
                              Role("io", kind="pooled", handler="m:f", slots=2, io_bound=True))),
    "keyed and pooled": RoleSet((Role("k", kind="pinned", handler="m:f", slots=2),
                                 Role("w", kind="pooled", handler="m:f", slots=3),
                                 Role("bg", kind="pooled", cordon_class="deferrable", handler="m:f", slots=1))),
    "declared peaks": RoleSet((Role("a", kind="pooled", handler="m:f", slots=2, peak_cpus=1),
                               Role("b", kind="pooled", handler="m:f", slots=2))),
    # 002's roles, each given a handler (declared only, they would lay out no seat)
    "reference": RoleSet(tuple(replace(r, handler="m:f") for r in plan_mod.REFERENCE_ROLES)),
}
LOOPS = ("auto", "priority")
QUOTAS = [q / 4 for q in range(1, 33)]  # 0.25 .. 8 CPUs


def _layout(roles, quota, cpus, loop):
    """The seats `quota` lays out (None when no plan fits it)."""
    try:
        plan = plan_mod.resolve(quota, "auto", roles, BudgetOverrides(loop=loop))
    except FleetError:
        return None
    out = seats.layout(plan, roles, cpus)
    assert out.seats, "a role set with handlers lays out seats"
    return out


def _cases():
    for (name, roles), loop, n in itertools.product(ROLE_SETS.items(), LOOPS, range(1, 9)):
        cpus = list(range(n))
        widest = _layout(roles, float(n), cpus, loop)
        if widest is None:
            continue
        yield name, roles, loop, cpus, widest


CASES = list(_cases())


def test_the_cases_cover_the_tiers():
    """The judged cases include shrinking to the serial tier and growing into the pinned one."""
    bindings = {(_layout(roles, q, cpus, loop) or widest).seats[0].binding
                for _n, roles, loop, cpus, widest in CASES for q in QUOTAS if q <= len(cpus)}
    assert {seats.PINNED, seats.LOGICAL} <= bindings
    assert len(CASES) > 40


@pytest.mark.parametrize("name, roles, loop, cpus, widest", CASES,
                         ids=[f"{c[0]}-{c[2]}-{len(c[3])}cpu" for c in CASES])
def test_placement_holds_for_every_quota(name, roles, loop, cpus, widest):
    assert seats.place(widest, widest) == seats.booted(widest)  # the capacity quota runs every seat as booted
    active = {r.name for r in roles if r.handler is not None}
    placements = []
    for q in QUOTAS:
        if q > len(cpus):
            break
        epoch = _layout(roles, q, cpus, loop)
        if epoch is None:
            continue
        p = seats.place(widest, epoch)
        assert len(p.cpus) == len(widest.seats)
        live = p.live
        # every role with a handler runs on a live seat (its units would wait for ever)
        assert active <= {r for i in live for r in widest.seats[i].roles}, (q, p)
        for i in live:
            assert p.cpus[i] and set(p.cpus[i]) <= set(cpus), (q, p)
        if not p.unplaced:
            # each placed seat runs what an epoch seat lays out: same roles, same CPUs
            placed = sorted((tuple(sorted(widest.seats[i].roles)), tuple(sorted(p.cpus[i]))) for i in live)
            wanted = sorted((tuple(sorted(s.roles)), tuple(sorted(s.cpus))) for s in epoch.seats)
            assert placed == wanted, (q, p, epoch)
        assert len(live) <= max(len(epoch.seats), len(active))
        placements.append(p)
    placements.append(seats.booted(widest))
    for a, b in itertools.product(placements, repeat=2):
        _check_change(a, b)


def _check_change(a, b):
    change = seats.changes(a, b)
    assert not set(change.retire) & set(change.add) and not set(change.repin) & set(change.add + change.retire)
    # carried out on `a`, the change gives `b`: retired seats stop, added and moved ones take b's CPUs
    after = list(a.cpus)
    for i in change.retire:
        after[i] = None
    for i in change.add + change.repin:
        after[i] = b.cpus[i]
    assert [None if c is None else set(c) for c in after] == [None if c is None else set(c) for c in b.cpus]
    back = seats.changes(b, a)
    assert (back.retire, back.add, back.repin) == (change.add, change.retire, change.repin)
    assert bool(change) == (a.live != b.live or any(set(x) != set(y) for x, y in zip(a.cpus, b.cpus)
                                                     if x is not None and y is not None))


def test_two_cpus_one_worker_per_cpu_shrinks_to_one_and_grows_back():
    """The example of the docs: the loop ahead by priority, w on 2 CPUs runs two workers
    (CPUs 0 and 1); at 1 CPU w-1 retires; back at 2 it is added on CPU 1."""
    roles, cpus = ROLE_SETS["one pooled"], [0, 1]
    widest = _layout(roles, 2.0, cpus, "priority")
    assert [(s.name, s.cpus) for s in widest.seats] == [("w-0", (0,)), ("w-1", (1,))]
    one = seats.place(widest, _layout(roles, 1.0, cpus, "priority"))
    assert one.cpus == ((0,), None)
    assert seats.changes(seats.booted(widest), one) == seats.SeatChange(retire=(1,))
    assert seats.changes(one, seats.booted(widest)) == seats.SeatChange(add=(1,))


def test_a_seat_that_keeps_its_roles_moves_to_the_cpus_of_the_new_layout():
    """With a core reserved for the loop at 2 CPUs, serial-0 runs on CPU 1; at 1 CPU the
    reserve is gone and the one seat runs on CPU 0: the same worker moves."""
    roles, cpus = ROLE_SETS["one pooled"], [0, 1]
    widest = _layout(roles, 2.0, cpus, "auto")
    assert [(s.name, s.cpus) for s in widest.seats] == [("serial-0", (1,))]
    one = seats.place(widest, _layout(roles, 1.0, cpus, "auto"))
    assert one.cpus == ((0,),)
    assert seats.changes(seats.booted(widest), one) == seats.SeatChange(repin=(0,))


def test_a_role_no_epoch_seat_matches_still_runs_on_its_booted_seat():
    """An epoch seat whose roles no booted seat runs alike is named unplaced; each role of
    it runs on the first booted seat that runs it, on the CPUs the epoch gives the role."""
    booted_layout = seats.SeatLayout((seats.Seat(0, "a-0", ("a",), (0,), "pinned"),
                                      seats.Seat(1, "b-0", ("b",), (1,), "pinned")), ())
    epoch = seats.SeatLayout((seats.Seat(0, "serial-0", ("a", "b"), (1,), "logical"),), ())
    p = seats.place(booted_layout, epoch)
    assert p.unplaced == ("serial-0",) and p.cpus == ((1,), (1,))


def test_changes_refuse_placements_of_other_seats():
    with pytest.raises(ValueError, match="not the same booted seats"):
        seats.changes(seats.Placement(((0,),)), seats.Placement(((0,), (1,))))


def test_capacity_is_the_cpus_no_quota_raises():
    def limit(q, affinity=4, cpuset=None):
        return quota_mod.CpuLimit(q, affinity, cpuset, q, "/g")
    assert quota_mod.capacity(quota_mod.choose(None, 1.0, "q"), limit(1.0), [0, 1, 2, 3]) == 4
    assert quota_mod.capacity(quota_mod.choose(None, 1.0, "q"), limit(1.0, cpuset=2), [0, 1, 2, 3]) == 2
    assert quota_mod.capacity(quota_mod.choose(None, 4.0, "q"), limit(4.0), [0, 1, 2, 3]) is None  # booted on all
    assert quota_mod.capacity(quota_mod.choose(2.0, 1.0, "q"), limit(1.0), [0, 1, 2, 3]) is None  # configured: terminal


# --- the dispatcher's side: a retired seat --------------------------------------------------------

ROLES = RoleSet((Role("w", kind="pooled", handler="m:f", slots=4),
                 Role("k", kind="pinned", handler="m:f", slots=2)))


def _two_seats():
    slots = [seats.SlotSpec(i, "w", i % 2) for i in range(4)] + [seats.SlotSpec(4, "k", 0), seats.SlotSpec(5, "k", 1)]
    return seats.SeatLayout((seats.Seat(0, "s-0", ("w", "k"), (0,), "pinned"),
                             seats.Seat(1, "s-1", ("w", "k"), (1,), "pinned")), tuple(slots))


def test_a_retired_seat_is_granted_nothing_its_units_complete_and_it_empties():
    d = Dispatcher(ROLES, _two_seats())
    w = ROLES.code("w")
    for uid in range(4):
        d.enqueue(Pending(uid, w))
    first = d.grant()
    on_1 = [g.unit_id for g in first if g.seat == 1]
    assert on_1 and {g.seat for g in first} == {0, 1}
    d.set_live(1, False)
    assert not d.seat_empty(1)  # its units are in flight: they complete
    for uid in range(4, 40):
        d.enqueue(Pending(uid, w))
    for g in first:
        d.complete(g.unit_id, fsm.IDLE)
    granted = d.grant()
    assert granted and all(g.seat == 0 for g in granted)
    assert d.seat_empty(1)
    while granted:  # the whole queue runs, on the seat that stays
        for g in granted:
            assert g.seat == 0
            d.complete(g.unit_id, fsm.IDLE)
        granted = d.grant()
    assert d.queued(w) == 0 and d.inflight_count() == 0
    d.set_live(1, True)  # added again: its Idle slots are back
    for uid in range(40, 44):
        d.enqueue(Pending(uid, w))
    assert {g.seat for g in d.grant()} == {0, 1}


def test_a_pin_on_a_retired_seat_is_released_before_its_key_is_leased_elsewhere():
    """T9 at the epoch boundary: the pin is released (UNPIN) once empty, and only then is
    its key claimed again (LEASE), on a seat that runs; never re-leased where it was."""
    d = Dispatcher(ROLES, _two_seats())
    k = ROLES.code("k")
    d.enqueue(Pending(1, k, "a"))
    d.enqueue(Pending(2, k, "b"))
    grants = {g.unit_id: g for g in d.grant()}
    on_1 = next(g for g in grants.values() if g.seat == 1)
    d.begin_epoch()
    d.set_live(1, False)
    d.enqueue(Pending(3, k, on_1.unit_id == 1 and "a" or "b"))
    assert d.grant() == []  # its pin still runs a unit: the key waits
    d.complete(on_1.unit_id, fsm.PINNED)
    assert d.grant() == []  # empty now, but a retired seat's pin is never re-keyed in place
    released = d.take_idle_stale_pins()
    assert on_1.slot in released and d.seat_empty(1)
    other = next(g for g in grants.values() if g.seat == 0)
    d.complete(other.unit_id, fsm.PINNED)
    d.take_idle_stale_pins()
    (g,) = d.grant()
    assert g.unit_id == 3 and g.seat == 0 and g.transitions[-1][0] == fsm.LEASE


def test_the_loop_is_pinned_to_its_reserve_only_where_no_seat_runs():
    roles, cpus = ROLE_SETS["one pooled"], [0, 1]
    assert seats.loop_cpus(_layout(roles, 2.0, cpus, "auto")) == (0,)  # the reserve: serial-0 on CPU 1
    assert seats.loop_cpus(_layout(roles, 1.0, cpus, "auto")) is None  # no reserve at 1 CPU
    assert seats.loop_cpus(_layout(roles, 2.0, cpus, "priority")) is None  # ahead by priority, not by a core
    crowded = seats.SeatLayout((seats.Seat(0, "w-0", ("w",), (0,), "pinned"),), (), supervisor_cpus=(0,))
    assert seats.loop_cpus(crowded) is None  # oversubscribed: a seat runs on its reserve


def test_the_running_seats_are_the_live_ones_on_their_epoch_cpus():
    roles, cpus = ROLE_SETS["one pooled"], [0, 1]
    widest = _layout(roles, 2.0, cpus, "auto")
    one = seats.place(widest, _layout(roles, 1.0, cpus, "auto"))
    assert [(s.name, s.cpus) for s in one.running(widest)] == [("serial-0", (0,))]
    retired = seats.Placement(((0,), None))
    two = _layout(roles, 2.0, cpus, "priority")
    assert [s.name for s in retired.running(two)] == ["w-0"]
