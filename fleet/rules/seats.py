"""Seats and slots: how a tier plan becomes worker processes and table slots (pure).

A *seat* is one worker process pinned to a CPU set; a *slot* is one row of the shared
table that can hold one lease at a time. Slots are bound to seats; a seat may hold
several slots, and runs the units granted to them in grant order.

Slots switch roles (002 §3.4). A role's ``slots`` is its budget count: the layout lays
out that many slots for it (its *home* slots, `SlotSpec.role`), but an Idle slot is
leased (T1) for whichever role the dispatcher grants next among the roles that may run
on its seat (`Seat.roles`), and goes back to Idle (T5) after the unit. How many slots a
role holds at once is bounded by its count in the dispatcher (`fleet.rules.dispatch`), so a
role never holds more than its count, and the slots of a seat group always suffice for
every role of that group to reach its count. A Pinned slot keeps its role and key
until T9. Every worker loads every role's handler (the zygote imports them all), so a
seat can run whatever lands on it.

Which roles may run on a seat is which CPU share the role may use:

* Serial binding (2-5 CPUs): one seat, ``serial-0``, holds every slot, and every active
  role may run on it; the roles are logical lanes on it (census binding ``logical``).
  When the budget gives the I/O-dominant roles the remainder (the 0.5 of a 4.5-CPU
  quota, and the whole cores serial-0 leaves: 002 §5), each of them gets a seat of
  its own on the remainder's CPUs -- the next ones after serial-0's, as many as the
  remainder needs to be schedulable (its ceiling) -- and holds its slots there
  (binding ``shared``: the I/O roles may run on each other's). Below one CPU,
  serial-0 is the only seat, on one CPU.

Pinned binding: CPUs are laid out in budget order — the reserve, the ambient I/O
runtime, then each role's whole cores (an I/O-dominant role's share rounded up: the
remainder's fraction needs a CPU to be spent on). A role with cores gets one seat per
core (at most one per slot), each pinned to its own core (binding ``pinned``); its
slots are dealt round-robin over its seats, so a keyed role's pins share its cores
("pins are threads, shares are cores"). Only that role runs on those seats: the cores
are its share. A role with no whole core (I/O-dominant, or declared with peak 0) gets
one seat on the shared CPUs — the ambient runtime's, or the reserve's when the ambient
has none (binding ``shared``); every such role may run on every shared seat, since
they all spend the same CPUs. When the quota has
fewer CPUs than the plan lays out (a forced, oversubscribed profile), the layout
wraps around the CPUs it has: the plan already says ``oversubscribed``.

Roles without a handler are declared but not active: they get slots (the census
shows them) but no seat.
"""
from __future__ import annotations

import math
from typing import Sequence

from admission.records import record, replace
from fleet.rules.budget import PINNED, SERIAL
from fleet.rules.plan import TierPlan
from fleet.rules.roles import RoleSet

LOGICAL, SHARED = "logical", "shared"
NO_SEAT = -1


@record
class Seat:
    index: int
    name: str
    #: the roles that may run on the seat's slots (whose CPU share the seat's CPUs are)
    roles: tuple[str, ...]
    cpus: tuple[int, ...]
    binding: str  # pinned | shared | logical

    def to_dict(self) -> dict:
        return {"index": self.index, "name": self.name, "roles": list(self.roles), "cpus": list(self.cpus),
                "binding": self.binding}


@record
class SlotSpec:
    index: int
    #: the role whose budget count laid the slot out (its home role); any role of its
    #: seat may lease it while it is Idle
    role: str
    seat: int  # NO_SEAT for a role without a handler


@record
class SeatLayout:
    seats: tuple[Seat, ...]
    slots: tuple[SlotSpec, ...]
    #: the reserve and ambient I/O CPUs: where the supervisor's own loop runs
    supervisor_cpus: tuple[int, ...] = ()

    def slots_of(self, role: str) -> tuple[int, ...]:
        """The role's home slots (as many as its budget count)."""
        return tuple(s.index for s in self.slots if s.role == role)

    def seats_for(self, role: str) -> tuple[int, ...]:
        """The seats whose slots `role` may lease (empty for a role without a handler)."""
        return tuple(s.index for s in self.seats if role in s.roles)

    def seat_of(self, slot: int) -> int:
        return self.slots[slot].seat

    def to_meta(self) -> dict:
        counts: dict[str, int] = {}  # role -> its budget count (home slots)
        on_seat = [0] * len(self.seats)
        for slot in self.slots:
            counts[slot.role] = counts.get(slot.role, 0) + 1
            if slot.seat != NO_SEAT:
                on_seat[slot.seat] += 1
        seats = [s.to_dict() for s in self.seats]
        for seat in seats:
            # role -> the most of the seat's slots the role may hold at once (a worker
            # sizes its I/O runner from it)
            seat["role_slots"] = {r: min(counts.get(r, 0), on_seat[seat["index"]]) for r in seat["roles"]}
        return {"seats": seats, "slot_seats": [s.seat for s in self.slots]}


class _Cursor:
    """Hands out CPUs in order, wrapping around when the plan asks for more than exist."""

    def __init__(self, cpus: Sequence[int]):
        if not cpus:
            raise ValueError("no CPUs to lay seats on")
        self.cpus, self.i = list(cpus), 0

    def take(self, n: int) -> tuple[int, ...]:
        out = tuple(self.cpus[(self.i + k) % len(self.cpus)] for k in range(n))
        self.i += n
        return out


def _whole(cores) -> int:
    return math.floor(cores + 1e-9)


def layout(plan: TierPlan, roles: RoleSet, cpus: Sequence[int]) -> SeatLayout:
    """The seats and slots for `plan` over the CPUs this process may use (sorted)."""
    active = [r for r in roles if r.handler is not None]
    if plan.binding == SERIAL:
        return _serial(plan, roles, active, cpus)
    if plan.binding == PINNED:
        return _pinned(plan, roles, active, cpus)
    raise ValueError(f"unknown binding {plan.binding!r}")


def _shares(plan: TierPlan) -> dict:
    return {share.name: share for share in plan.budget.consumers}


def _serial(plan, roles, active, cpus) -> SeatLayout:
    shares, cursor = _shares(plan), _Cursor(cpus)
    own = cursor.take(_whole(shares["reserve"].cores)) + cursor.take(_whole(shares["ambient_io"].cores))
    seat_cpus = cursor.take(max(1, _whole(shares["serial-0"].cores)))
    remainder = {s.name for s in plan.budget.io_shares() if s.cores > 0}
    lanes = tuple(r.name for r in active if r.name not in remainder)
    spenders = tuple(r.name for r in active if r.name in remainder)
    seats, seat_of = [], {}
    if lanes:
        seats.append(Seat(0, "serial-0", lanes, seat_cpus, LOGICAL))
        seat_of.update((name, 0) for name in lanes)
    if spenders:
        io_cpus = cursor.take(max(1, math.ceil(sum(shares[n].cores for n in spenders) - 1e-9)))
        for name in spenders:
            seat_of[name] = len(seats)
            seats.append(Seat(len(seats), f"{name}-0", spenders, io_cpus, SHARED))
    slots, index = [], 0
    for role in roles:
        for _ in range(role.slots):
            slots.append(SlotSpec(index, role.name, seat_of.get(role.name, NO_SEAT)))
            index += 1
    return SeatLayout(tuple(seats), tuple(slots), tuple(dict.fromkeys(own)))


def _pinned(plan, roles, active, cpus) -> SeatLayout:
    cursor = _Cursor(cpus)
    cores_of: dict[str, tuple[int, ...]] = {}
    for share in plan.budget.consumers:  # budget order: reserve, ambient, then the roles
        # An I/O-dominant role's share holds the remainder's fraction: its seats take the
        # CPU that fraction runs on too (its ceiling), or the fraction could not be spent.
        n = math.ceil(share.cores - 1e-9) if share.kind == "io" else _whole(share.cores)
        cores_of[share.name] = cursor.take(n) if n else ()
    shared_cpus = cores_of.get("ambient_io") or cores_of.get("reserve") or tuple(cpus)
    # Every role without whole cores may run on every shared seat: they share those CPUs.
    sharing = tuple(r.name for r in active if not cores_of.get(r.name))
    seats: list[Seat] = []
    seats_of: dict[str, list[int]] = {}
    for role in active:
        role_cpus = cores_of.get(role.name, ())
        if role_cpus:
            for k in range(max(1, min(len(role_cpus), role.slots))):
                seats.append(Seat(len(seats), f"{role.name}-{k}", (role.name,), (role_cpus[k],), PINNED))
                seats_of.setdefault(role.name, []).append(len(seats) - 1)
        else:
            seats.append(Seat(len(seats), f"{role.name}-0", sharing, tuple(shared_cpus), SHARED))
            seats_of[role.name] = [len(seats) - 1]
    slots, index = [], 0
    for role in roles:
        mine = seats_of.get(role.name)
        for k in range(role.slots):
            slots.append(SlotSpec(index, role.name, mine[k % len(mine)] if mine else NO_SEAT))
            index += 1
    own = cores_of.get("reserve", ()) + cores_of.get("ambient_io", ())
    return SeatLayout(tuple(seats), tuple(slots), tuple(dict.fromkeys(own)))


def loop_cpus(seats: SeatLayout) -> tuple[int, ...] | None:
    """The CPUs the supervisor's loop is pinned to under `seats` (None: not pinned): the
    reserve and ambient CPUs the budget set aside for it, when no seat runs there (an
    oversubscribed layout has seats on them too: then the scheduler places the loop
    better than a pin would)."""
    own = seats.supervisor_cpus
    on_seats = {c for seat in seats.seats for c in seat.cpus}
    return tuple(own) if own and not on_seats & set(own) else None


# --------------------------------------------------------------------------- epochs


@record
class Placement:
    """Which of the booted seats run in an epoch, and on which CPUs (002 §3.4, T9).

    The seats a fleet can ever run are laid out once, at boot, for the most CPUs it may
    be given (its affinity and cpuset: what no quota change can raise); their rings
    and slots exist for the fleet's life. An epoch's quota lays out its own seats
    (`layout`), and each is *placed* on a booted seat that runs the same roles: that
    booted seat runs in the epoch, on the epoch seat's CPUs. A booted seat no epoch
    seat takes is retired for the epoch (its worker leaves once its units are done).

    `cpus[i]` is booted seat i's CPUs in the epoch, or None when it is retired;
    `unplaced` names the epoch seats no booted seat runs the same roles as (a
    restart would lay them out).
    """

    cpus: tuple[tuple[int, ...] | None, ...]
    unplaced: tuple[str, ...] = ()

    @property
    def live(self) -> tuple[int, ...]:
        """The booted seats that run in the epoch."""
        return tuple(i for i, c in enumerate(self.cpus) if c is not None)

    def running(self, seats: SeatLayout) -> tuple[Seat, ...]:
        """The booted `seats` that run in the epoch, each on its CPUs in the epoch."""
        return tuple(replace(s, cpus=self.cpus[s.index]) for s in seats.seats if self.cpus[s.index] is not None)


@record
class SeatChange:
    """What an epoch boundary does to the seats: `retire` (their workers leave once
    nothing is in flight on them), `add` (a worker is forked, on its CPUs), `repin`
    (the running worker's affinity moves to its new CPUs); seat indices, ascending."""

    retire: tuple[int, ...] = ()
    add: tuple[int, ...] = ()
    repin: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.retire or self.add or self.repin)


def booted(seats: SeatLayout) -> Placement:
    """Every booted seat on its own CPUs: the placement of the quota the seats were laid out for."""
    return Placement(tuple(s.cpus for s in seats.seats))


def place(seats: SeatLayout, epoch: SeatLayout) -> Placement:
    """The placement of `epoch`'s seats (laid out for an epoch's quota) on the booted `seats`.

    Each epoch seat, in order, takes the first booted seat not yet taken that runs the
    same roles. A role with a handler must run somewhere (its units would wait for
    ever): a role no placed seat runs gets the first booted seat that runs it, on the
    CPUs of the epoch seats that run it (all of the epoch's seat CPUs when none does).
    """
    cpus: list[tuple[int, ...] | None] = [None] * len(seats.seats)
    unplaced = []
    for seat in epoch.seats:
        want = frozenset(seat.roles)
        match = next((b.index for b in seats.seats if cpus[b.index] is None and frozenset(b.roles) == want), None)
        if match is None:
            unplaced.append(seat.name)
        else:
            cpus[match] = tuple(seat.cpus)
    every = tuple(sorted({c for s in epoch.seats for c in s.cpus}))
    for b in seats.seats:
        for role in b.roles:
            if any(c is not None and role in seats.seats[i].roles for i, c in enumerate(cpus)):
                continue
            first = next(s for s in seats.seats if role in s.roles)
            if cpus[first.index] is None:
                theirs = tuple(sorted({c for s in epoch.seats if role in s.roles for c in s.cpus}))
                cpus[first.index] = theirs or every or first.cpus
    return Placement(tuple(cpus), tuple(unplaced))


def changes(old: Placement, new: Placement) -> SeatChange:
    """From one epoch's placement to the next's: which seats retire, which are added,
    which move to other CPUs (a seat that stays on the same CPUs is left alone)."""
    if len(old.cpus) != len(new.cpus):
        raise ValueError(f"placements of {len(old.cpus)} and {len(new.cpus)} seats: not the same booted seats")
    pairs = list(enumerate(zip(old.cpus, new.cpus)))
    return SeatChange(
        retire=tuple(i for i, (a, b) in pairs if a is not None and b is None),
        add=tuple(i for i, (a, b) in pairs if a is None and b is not None),
        repin=tuple(i for i, (a, b) in pairs if a is not None and b is not None and set(a) != set(b)),
    )
