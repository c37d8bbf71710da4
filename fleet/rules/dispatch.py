"""The dispatcher: per-role bounded queues, grants in precedence order, pins by key.

Pure bookkeeping, no I/O: the supervisor feeds it units, posture and completions,
and carries out the grants it returns (slot transitions on the shared table, then
a message to the slot's seat).

Rules:
* Precedence between roles (002 §4): pinned keyed roles and singletons first, then
  pooled roles that are floored under cordon (sim-like), then other pooled roles
  (resolve-like), deferrable background roles last; declaration order breaks ties.
  Inside a role: higher priority first, then submit order.
* Slots switch roles (002 §3.4). A slot is not a role's for life: an Idle slot of a
  seat the role may use (`fleet.rules.seats`: the seats whose CPU share the role's is) is
  leased (T1, the slot word's role field set to the granted role) for whichever
  role's unit is granted next, and goes back to Idle after it (T5). A role holds at
  most its budget count of slots at once (its `slots`: pooled slots with a unit in
  flight, and claimed pins); this module is where that count is kept and checked.
  An Idle slot goes back to the role it last served when that role asks (its warm
  state), else the slot that went Idle last is taken; the table counts each lease
  for another role than the last as a role switch (status shows it per slot).
* A pooled unit takes an Idle slot within its role's count: the grant is LEASE (T1)
  and the worker STARTs it (T2); the slot is Idle again after the unit (T5). Of the
  role's seats, the one whose slot went Idle last, while nothing runs there (its worker
  may still be looking for its next task, not yet asleep); else the seats take turns.
  Workers that retire after a number of units (`warm_seats` False) always take turns.
* Seats stay fed (the role's `lookahead`, default 16). With no Idle slot left for it,
  a pooled role's next unit is sent to a slot it holds that runs one already, to wait
  on the seat's ring behind it: the worker, once the slot is Idle again (T5), LEASEs
  it (T1) and STARTs it (T2) itself (start event LEASE: both, in one kernel call), so
  the slot walks the FSM for every unit as before and the seat starts its next unit
  without a round trip through the supervisor. The slot stays the role's until its
  last unit ends; it counts once against the role's count. The shallowest slot takes
  the next, and only while the role's queue holds at least as many units as every
  slot of the role would then have waiting: a unit sent ahead waits behind the
  slot's others, and with a shorter queue a slot that frees elsewhere could have
  started it sooner. A seat that runs its
  units one after another needs one unit waiting, not one per slot: a role with two
  or more slots per seat has that already, so only an I/O-bound role, or one with a
  slot per seat (``slots`` = its processes), sends ahead.
* A keyed unit goes to the slot pinned to its key, behind whatever that pin already
  has in flight (at most `pin_depth`), and RESUMEs it (T6); units of one key keep
  their order. A pinned slot keeps its role and key: no other role or key is
  granted it until it is released (T9). A key without a pin claims an Idle slot
  within the role's count (LEASE with the key, then START). With none (every pin of
  the role taken) the key waits for an epoch boundary to release a pin — unless the
  role opted in to `elastic_repin`: then the least recently used pin that has
  nothing in flight is re-keyed (UNPIN T9 then LEASE T1, release before re-lease),
  and counted (`repins`). A singleton is a keyed role with one slot and one key.
  A key's head is taken up (`skip`, which marks its future running) only once a grant
  is sure, so a key waiting for a pin stays cancellable; a closing fleet fails the units
  of keys no pin can come to without an epoch boundary (`drain_unpinnable`).
* Epochs (002 §3.4): at a quota change or a config reload `begin_epoch` marks every
  pin held; a held pin takes no new unit, and is released (T9) once it has nothing
  in flight: by the next unit of its key (UNPIN then LEASE on the same slot: release
  before re-lease) or by `take_idle_stale_pins`, whose caller applies the UNPIN.
* A pin drained at cordon onset (T7, T8) ends Idle with units still sent to it: their
  RESUME is refused, and they come back (`requeue`) to the head of their key's
  queue, in submit order, to be granted anew (a new pin) when posture allows. The
  drained slot takes nothing new, and its key is granted nothing, until every one of
  them is back.
* A seat whose worker died (`seat_lost`) holds nothing any more: its slots, pins and
  units are forgotten, and it says what it owed in grant order. Its owner decides what
  the death means for each (`fleet.runtime.deaths`) and hands those that never started back
  (`put_back_first`): to the head of their queue (of their key's), in grant order, which
  is the order they had in it.
* Children (`fleet.current_fleet()`, issue 47). A unit that submits children is
  *parked* from its first (`park`): its worker serves its seat's ring on another
  thread while it runs and waits (fleet.worker.inside). A parked parent's pooled
  children wait in its own queue, apart from their role's, and are granted before any
  role's units (they are what a waiting parent waits for): an Idle slot within their
  role's count when there is one (as any pooled unit), else they *ride* the parent's
  own slot, at most `RIDERS` at a time — start event RIDE, no slot transition, no
  count taken: the slot's capacity, which the waiting parent does not use, is theirs
  (counted in `rides`). So a fan-out of any depth completes even when every slot holds
  a waiting parent. A keyed child goes to its key's pin as any keyed unit (a pin is
  never another key's); a child of an I/O-bound role, or of an I/O-bound parent, never
  rides (those seats run units at once already). When the parent ends its children
  still queued go to their roles' queues (a failed parent's are cancelled by the
  loop, fleet.runtime.inside), and its riders finish where they are.
* Posture gates intake only: under cordon a deferrable role is granted nothing new,
  a floor role at most its intake floor of slots in use; every grant held back by
  posture is counted once per unit as suppressed intake. In-flight units always
  complete.
"""
from __future__ import annotations

import bisect
import functools
import itertools
from collections import OrderedDict, deque
from typing import Hashable, NamedTuple

from admission.records import field, record
from fleet.rules import cordon, fsm
from fleet.rules.fsm import RIDE  # noqa: F401 - a grant's start event for a riding child, re-exported
from fleet.rules.limits import OP_FIELDS  # a grant's rows are the table's batch rows
from fleet.rules.roles import Role, RoleSet
from fleet.rules.seats import NO_SEAT, SeatLayout
from fleet.rules.vocab import CLASS_DEFERRABLE, CLASS_FLOOR

#: Units queued behind one pin (its seat runs them in order).
DEFAULT_PIN_DEPTH = 16
#: Children in flight on one parked parent's slot at once: one runs, one waits on the
#: seat's ring behind it (no round trip through the supervisor between them).
RIDERS = 2


def precedence(role: Role) -> int:
    """Lower runs first; see the module docstring."""
    if role.kind in ("pinned", "singleton"):
        return 0
    if role.class_code == CLASS_DEFERRABLE:
        return 3
    if role.class_code == CLASS_FLOOR or role.io_bound:
        return 1
    return 2


@record(frozen=False, slots=True)
class Pending:
    """A unit waiting for a grant (the supervisor keeps the rest of it by id)."""

    unit_id: int
    role: int
    key: Hashable | None = None
    priority: int = 0
    held_by_posture: bool = False
    parent: int = 0  # the unit that submitted it from inside (0: none)


class Grant(NamedTuple):
    """Carry out `ops` on the table (in order), then send the unit to `seat`.

    `ops` are the slot events of the grant as rows of the table's batch call
    (`SlotTable.apply_ops`, OP_FIELDS each: slot, event, role, key, chained), so the
    loop applies every grant of a pass in one kernel call by joining them; a grant's
    second event is chained to its first. The worker applies `start_event` (START or
    RESUME) with `key_id` when it begins. (Immutable as a NamedTuple: one is built per
    unit, and a frozen dataclass's __init__ costs several times as much.)
    """

    unit_id: int
    role: int
    slot: int
    seat: int
    start_event: int
    key_id: int
    ops: tuple  # (slot, event, role, key_id, chained) * its events
    ahead: bool = False  # sent behind the slot's running unit (the worker LEASEs the slot)
    item: Pending | None = None  # what was queued (the loop's own record of the unit)

    @property
    def transitions(self) -> tuple:
        """The grant's events as ((event, role, key_id), ...)."""
        ops = self.ops
        return tuple((ops[i + 1], ops[i + 2], ops[i + 3]) for i in range(0, len(ops), OP_FIELDS))


#: A Grant made from its fields in order, every field given: `tuple.__new__` itself, a C
#: call, where `Grant(...)` runs the NamedTuple's Python-level __new__ (one per unit granted).
_new_grant = functools.partial(tuple.__new__, Grant)


class Lost(NamedTuple):
    """A unit a dead seat owed: what was granted (as it was queued), and its slot."""

    item: Pending
    slot: int


def _ops(slot: int, events: tuple) -> tuple:
    """`events` ((event, role, key_id), ...) on `slot` as `Grant.ops` rows, each after
    the first chained to the one before."""
    rows: tuple = ()
    for i, (event, role, key_id) in enumerate(events):
        rows += (slot, event, role, key_id, int(i > 0))
    return rows


@record(frozen=False)
class _Slot:
    index: int
    seat: int
    role: int = -1  # the role that holds the slot now (-1: none; it waits in its seat's idle pool)
    last_role: int = -1  # the role it last served (-1: none yet)
    mark: int = 0  # bumped when it enters or leaves its seat's idle pool (stale pool entries differ)
    inflight: deque = field(default_factory=deque)  # unit ids, in grant order
    pin_key: Hashable | None = None  # user key the slot is pinned (or claimed) for
    key_id: int = 0
    claimed: bool = False  # a pin is claimed or held (Leased/Running/Pinned for the key)
    last_used: int = 0
    stale: bool = False  # a pin from before the current epoch: released once it is empty
    drained: bool = False  # the pin was drained to Idle with units still sent to it (they come back)
    parked: int = 0  # parked parents on it: nothing is sent ahead to it (it would wait behind them)


class _IdlePool:
    """A seat's Idle slots. `take(role)` gives the slot that last served `role` and went
    Idle last (its state is warmest), else the slot that went Idle last of any role.

    Two stacks with lazy removal: a slot taken through one stays in the other as a stale
    entry (its mark no longer matches) until popped, or dropped when a stack outgrows
    twice the seat's slots.
    """

    def __init__(self, size: int):
        self.n = 0
        self._any: list = []  # (mark, slot)
        self._by_role: dict[int, list] = {}
        self._limit = 2 * size + 8

    def put(self, slot: _Slot) -> None:
        slot.mark = mark = slot.mark + 1
        entry = (mark, slot)
        stack = self._any
        stack.append(entry)
        if len(stack) > self._limit:
            self._compact(stack)
        if slot.last_role >= 0:
            stack = self._by_role.get(slot.last_role)
            if stack is None:
                self._by_role[slot.last_role] = [entry]
            else:
                stack.append(entry)
                if len(stack) > self._limit:
                    self._compact(stack)
        self.n += 1

    def take(self, role: int) -> _Slot:
        slot = self._pop(self._by_role.get(role)) or self._pop(self._any)
        slot.mark += 1
        self.n -= 1
        return slot

    @staticmethod
    def _compact(stack: list) -> None:
        stack[:] = [e for e in stack if e[0] == e[1].mark]

    @staticmethod
    def _pop(stack: list | None) -> _Slot | None:
        while stack:
            mark, slot = stack.pop()
            if mark == slot.mark:
                return slot
        return None


class _PriorityQueue:
    """FIFO per priority level; higher levels first. O(1) for the common single level."""

    def __init__(self):
        self.levels: dict[int, deque] = {}
        self.order: list[int] = []  # priorities, descending
        self.n = 0

    def push(self, item: Pending, front: bool = False) -> None:
        level = self.levels.get(item.priority)
        if level is None:
            level = self.levels[item.priority] = deque()
            bisect.insort(self.order, -item.priority)
        (level.appendleft if front else level.append)(item)
        self.n += 1

    def extend(self, items: list) -> None:
        """`push` each of `items` at the back, in order (a run of one level costs one
        lookup of it, not one call per unit)."""
        levels, last, level = self.levels, None, None
        for item in items:
            priority = item.priority
            if priority != last:
                level = levels.get(priority)
                if level is None:
                    level = levels[priority] = deque()
                    bisect.insort(self.order, -priority)
                last = priority
            level.append(item)
        self.n += len(items)

    def head(self) -> deque | None:
        """The highest priority level that holds a unit (its first is the queue's head), or None.
        A grant pass takes units off it directly, `n` kept by the taker, until it is
        empty: nothing is queued during a pass."""
        for neg in self.order:
            level = self.levels[-neg]
            if level:
                return level
        return None

    def pop(self) -> Pending:
        for neg in self.order:
            level = self.levels[-neg]
            if level:
                self.n -= 1
                return level.popleft()
        raise IndexError("pop from an empty queue")

    def put_back(self, item: Pending) -> None:
        """Insert a unit that was granted and came back, in submit (unit id) order."""
        self.push(item)
        level = self.levels[item.priority]
        level.pop()
        at = next((i for i, other in enumerate(level) if other.unit_id > item.unit_id), len(level))
        level.insert(at, item)

    def drain(self) -> list[Pending]:
        out = [item for neg in self.order for item in self.levels[-neg]]
        self.levels.clear()
        self.order.clear()
        self.n = 0
        return out

    def __len__(self) -> int:
        return self.n


class _RoleQueue:
    """A role's waiting units: one queue (pooled), or one per key in arrival order (keyed)."""

    def __init__(self, keyed: bool):
        self.keyed = keyed
        self.plain = _PriorityQueue()
        self.by_key: OrderedDict[Hashable, _PriorityQueue] = OrderedDict()
        self.n = 0

    def key_queue(self, key) -> _PriorityQueue:
        """The queue of `key`'s units (a keyed role's), made on its first unit, after the
        keys already waiting."""
        q = self.by_key.get(key)
        if q is None:
            q = self.by_key[key] = _PriorityQueue()
        return q

    def push(self, item: Pending, front: bool = False) -> None:
        if self.keyed:
            self.key_queue(item.key).push(item, front)
        else:
            self.plain.push(item, front)
        self.n += 1

    def extend(self, items: list) -> None:
        """`push` each of `items` (units of this role) at the back, in order."""
        if self.keyed:
            for item in items:
                self.push(item)
            return
        self.plain.extend(items)
        self.n += len(items)

    def push_first(self, item: Pending) -> None:
        """`item`, granted and never started, goes back ahead of its priority level's units
        submitted after it (of its key's queue, and that key first of all). In submit order
        with the others put back, whichever seat's death put them back first: units of
        two seats that died one after the other go back in the order they had."""
        if self.keyed:
            self.key_queue(item.key).put_back(item)
            self.by_key.move_to_end(item.key, last=False)
        else:
            self.plain.put_back(item)
        self.n += 1

    def drain(self) -> list[Pending]:
        out = self.plain.drain()
        for q in self.by_key.values():
            out.extend(q.drain())
        self.by_key.clear()
        self.n = 0
        return out

    def __len__(self) -> int:
        return self.n


class Dispatcher:
    """Queues and grants for one fleet. Not thread-safe: its owner serialises calls."""

    def __init__(self, roles: RoleSet, seat_layout: SeatLayout, *, pin_depth: int = DEFAULT_PIN_DEPTH,
                 ahead_off=(), warm_seats: bool = True):
        self.roles = roles
        self.pin_depth = pin_depth
        n_seats = len(seat_layout.seats)
        self._slots = [_Slot(s.index, s.seat) for s in seat_layout.slots]
        self._seat_slots = [[s.index for s in self._slots if s.seat == seat] for seat in range(n_seats)]
        #: the seats each role may lease slots of, and where the next search starts (so
        #: a role's grants alternate over its seats)
        self._seats_for = [seat_layout.seats_for(r.name) for r in roles]
        self._may_use = [frozenset(seats) for seats in self._seats_for]
        self._next_seat = [0] * len(roles)
        #: the seat whose slot went Idle last: its worker ran out of work last, and may
        #: still be looking for its next task (`_idle_seat`). Not kept when workers retire
        #: after a number of units (`warm_seats` False: `max_tasks`): a worker's last unit
        #: leaves its seat to a successor still starting, and the seat that ran it last
        #: would then be the one whose worker is sure to be gone.
        self._warm_seat = -1
        self._keeps_warm = warm_seats
        #: Idle slots per seat (see _IdlePool): O(1) grants, and a role gets back a slot it
        #: served before when there is one (no switch).
        self._idle = [_IdlePool(len(slots)) for slots in self._seat_slots]
        #: the seats that run in this epoch (`set_live`): a retired seat's Idle slots wait outside every pool
        self._live = [True] * n_seats
        for slot in reversed(self._slots):  # so that the lowest slots are leased first
            if slot.seat != NO_SEAT:
                self._park(slot)
        self._count = [r.slots for r in roles]  # the budget count: most slots a role holds at once
        self._held = [0] * len(roles)
        self._pooled = [r.kind == "pooled" for r in roles]
        #: units sent ahead per slot: an I/O-bound role's slots run at once, so each is fed,
        #: with one (its units wait far longer than a round trip through the supervisor);
        #: a seat that runs its units one after another is fed by a role's other slots when
        #: it has two or more there (their units wait on the ring), so only a role with one
        #: slot per seat sends ahead on such seats, up to its lookahead
        #: (`ahead_off`: roles that send nothing ahead, e.g. those gated by a host-group lease).
        #: That is the most; the loop paces it down to what the units' run time calls for
        #: (`pace`, `fleet.rules.pace`).
        self._ahead_cap = [0 if c in ahead_off else min(r.ahead, 1) if r.io_bound
                           else r.ahead if r.slots <= len(self._seats_for[c]) else 0
                           for c, r in enumerate(roles)]
        self._ahead = list(self._ahead_cap)
        #: per role: indices of the slots it holds that may take a unit ahead
        #: (1 <= in flight <= ahead), as an insertion-ordered set
        self._feedable: list[dict] = [{} for _ in roles]
        self._sent_ahead: set[int] = set()  # units sent ahead, until they end or come back
        self.sent_ahead_total = 0  # units sent ahead so far
        self._pins: list[dict] = [{} for _ in roles]  # keyed roles: user key -> claimed slot
        self.repins = [0] * len(roles)  # elastic re-pins per role (`elastic_repin`)
        self._queues = [_RoleQueue(keyed=r.kind in ("pinned", "singleton")) for r in roles]
        self._order = sorted(range(len(roles)), key=lambda c: (precedence(roles.by_code(c)), c))
        self._in_use = [0] * len(roles)
        self._where: dict[int, int] = {}  # unit id -> its slot's index, while in flight
        #: slot_of(unit_id) -> the slot a unit in flight was granted, or None: the dict's own
        #: get (the loop asks it of every result; `_where` is never replaced)
        self.slot_of = self._where.get
        #: every unit in flight, in grant order: what goes back to a queue when its pin
        #: drains or its seat dies before it started
        self._granted: dict[int, Pending] = {}
        self._clock = itertools.count(1)
        self._key_ids = itertools.count(1)
        self.suppressed = 0  # units held back by posture (counted once each)
        self.posture = fsm.NOMINAL
        self.floors = [0] * len(roles)  # intake floors per role under cordon
        self._classes = roles.class_codes()  # cordon class code per role
        #: skip(unit id) -> True drops a unit as it is about to be granted (cancelled by
        #: its caller); dropped ids are collected by `take_skipped`.
        self.skip = None
        self._skipped: list[int] = []
        # Children (see the module doc): parked parents and their slots, their children
        # queued apart, the children riding a parent's slot and how many per parent.
        self._parked: dict[int, _Slot] = {}
        self._kids: dict[int, deque] = {}
        self._kids_n = [0] * len(roles)
        self._riding: dict[int, int] = {}  # child -> parent
        self._riders: dict[int, int] = {}  # parent -> its riders in flight
        self._rode: set[int] = set()  # riders whose worker said they started (a seat death reads it)
        self.rides = [0] * len(roles)  # children granted on their parent's slot, per role

    # --- holding slots: the budget count ---------------------------------------------
    def _park(self, slot: _Slot) -> None:
        """`slot` is Idle: it waits in its seat's pool for any role that may run there
        (none, while its seat is retired: `set_live`)."""
        slot.role = -1
        if self._live[slot.seat]:
            self._idle[slot.seat].put(slot)
            if self._keeps_warm:
                self._warm_seat = slot.seat

    def _under_count(self, code: int) -> bool:
        """May `code` hold one more slot? Its budget count bounds the slots it holds at once."""
        return self._held[code] < self._count[code]

    def _idle_seat(self, code: int) -> int:
        """A seat of `code`'s with an Idle slot, when the role may hold one more slot (else
        -1). The seat whose slot went Idle last, when nothing runs there: its worker ran
        out of work last, and a worker looks for its next task a while before it sleeps
        (`fleet.worker.process.IDLE_SPIN_S`), so a unit sent there is taken at once where
        a sleeping worker is woken tens of microseconds later (one unit at a time, the
        seats taking turns put every unit on a worker that had slept). Else the role's
        seats take turns, so its units spread over them."""
        if not self._under_count(code):
            return -1
        seats = self._seats_for[code]
        if len(seats) == 1:
            return seats[0] if self._idle[seats[0]].n else -1
        warm = self._warm_seat
        if warm >= 0 and self._idle[warm].n == len(self._seat_slots[warm]) and warm in self._may_use[code]:
            return warm
        n, first = len(seats), self._next_seat[code]
        for k in range(n):
            seat = seats[(first + k) % n]
            if self._idle[seat].n:
                return seat
        return -1

    def _lease_on(self, seat: int, code: int) -> _Slot:
        """Take an Idle slot of `seat` (from `_idle_seat`) for `code`: it now counts for the role."""
        slot = self._idle[seat].take(code)
        slot.role = code
        self._held[code] += 1
        seats = self._seats_for[code]
        if len(seats) > 1:
            self._next_seat[code] = (seats.index(seat) + 1) % len(seats)
        return slot

    def _unhold(self, slot: _Slot) -> None:
        """`slot` is Idle again (T5, T8, T9 or a reset): it no longer counts for its role."""
        code = slot.role
        self._held[code] -= 1
        if slot.claimed:
            del self._pins[code][slot.pin_key]
        slot.claimed, slot.stale, slot.pin_key, slot.drained, slot.key_id = False, False, None, False, 0
        slot.last_role = code
        self._park(slot)

    def held(self, role: int) -> int:
        """Slots `role` holds now (pooled slots with a unit, claimed pins): never above its count."""
        return self._held[role]

    def slot_role(self, slot: int) -> int | None:
        """The role holding `slot` now (None: Idle)."""
        code = self._slots[slot].role
        return None if code < 0 else code

    # --- intake -------------------------------------------------------------------
    def queued(self, role: int) -> int:
        return len(self._queues[role]) + self._kids_n[role]

    def in_use(self, role: int) -> int:
        """Slots of `role` with something in flight."""
        return self._in_use[role]

    def enqueue(self, item: Pending, front: bool = False) -> None:
        if item.parent and item.parent in self._parked and not self._queues[item.role].keyed:
            self._kids.setdefault(item.parent, deque()).append(item)
            self._kids_n[item.role] += 1
            return
        self._queues[item.role].push(item, front)

    def enqueue_many(self, items: list) -> None:
        """`enqueue` each of `items` (units of one role), in order."""
        if items:
            self._queues[items[0].role].extend(items)

    def drain_queue(self, role: int | None = None) -> list[Pending]:
        """Remove and return queued (not granted) units, of one role or all."""
        codes = range(len(self.roles)) if role is None else (role,)
        out = []
        for code in codes:
            out.extend(self._queues[code].drain())
        for parent, kids in list(self._kids.items()):
            keep = deque(item for item in kids if item.role not in codes)
            out.extend(item for item in kids if item.role in codes)
            for item in kids:
                if item.role in codes:
                    self._kids_n[item.role] -= 1
            if keep:
                self._kids[parent] = keep
            else:
                del self._kids[parent]
        return out

    # --- children ---------------------------------------------------------------------
    def park(self, parent: int) -> bool:
        """`parent` submitted a child: its children are granted first, and may ride its
        slot (see the module doc). False when it is not in flight here."""
        index = self._where.get(parent)  # a rider's is the slot it rides: its children ride it too
        if index is None:
            return False
        slot = self._slots[index]
        if parent not in self._parked:
            self._parked[parent] = slot
            slot.parked += 1
            if slot.role >= 0 and self._pooled[slot.role]:
                self._update_feedable(slot)
        return True

    def rode(self, unit_id: int) -> None:
        """A rider's worker said it started."""
        if unit_id in self._riding:
            self._rode.add(unit_id)

    def took_ride(self, unit_id: int) -> bool:
        """Whether `unit_id` rode a slot and started there (asked once, at its seat's death)."""
        if unit_id in self._rode:
            self._rode.discard(unit_id)
            return True
        return False

    def _unpark(self, parent: int) -> None:
        """`parent` ended (or its seat died): its children still queued go to their roles' queues."""
        slot = self._parked.pop(parent, None)
        if slot is None:
            return
        slot.parked -= 1
        for item in self._kids.pop(parent, ()):
            self._kids_n[item.role] -= 1
            self._queues[item.role].push(item)

    def _grant_kids(self, out: list) -> None:
        """The parked parents' children: an Idle slot within their role's count, else a
        ride on the parent's slot (at most RIDERS at once)."""
        for parent, kids in list(self._kids.items()):
            slot = self._parked.get(parent)
            rides = slot is not None and slot.role >= 0 and not self.roles.by_code(slot.role).io_bound
            while kids:
                item = kids[0]
                code = item.role
                seat = self._idle_seat(code)
                lease = seat >= 0 and self._posture_allows(code, item, True)
                ride = (not lease and rides and self._riders.get(parent, 0) < RIDERS
                        and not self.roles.by_code(code).io_bound)
                if not (lease or ride):
                    break
                kids.popleft()
                self._kids_n[code] -= 1
                if self.skip is not None and self.skip(item.unit_id):
                    self._skipped.append(item.unit_id)
                    continue
                if lease:
                    leased = self._lease_on(seat, code)
                    out.append(self._take(leased, item, fsm.START, (leased.index, fsm.LEASE, code, 0, 0)))
                    continue
                self._where[item.unit_id] = slot.index
                self._granted[item.unit_id] = item
                self._riding[item.unit_id] = parent
                self._riders[parent] = self._riders.get(parent, 0) + 1
                self.rides[code] += 1
                out.append(_new_grant((item.unit_id, code, slot.index, slot.seat, RIDE, 0, (), False, item)))
            if not kids:
                self._kids.pop(parent, None)

    def set_posture(self, posture: int, floors: list[int]) -> None:
        self.posture, self.floors = posture, list(floors)

    # --- grants ----------------------------------------------------------------------
    def grant(self) -> list[Grant]:
        """Every grant possible now, in precedence order."""
        out: list[Grant] = []
        if self._kids:
            self._grant_kids(out)
        for code in self._order:
            queue = self._queues[code]
            if not queue.n:
                continue
            if queue.keyed:
                self._grant_keyed(code, queue, out)
            else:
                self._grant_pooled(code, queue, out)
        return out

    def _posture_allows(self, code: int, item: Pending, grows: bool) -> bool:
        """May `item` be granted now? `grows`: the grant puts one more slot of the role in use."""
        if not cordon.restricts(self.posture):
            return True
        allowed = cordon.admits(self.posture, self._classes[code], grows, self._in_use[code], self.floors[code])
        if not allowed and not item.held_by_posture:
            item.held_by_posture = True
            self.suppressed += 1
        return allowed

    def _grant_pooled(self, code: int, queue: _RoleQueue, out: list) -> None:
        while (seat := self._idle_seat(code)) >= 0:
            item = self._next_live(queue.plain, queue)
            if item is None or not self._posture_allows(code, item, True):
                return
            slot = self._lease_on(seat, code)
            queue.plain.pop()
            queue.n -= 1
            out.append(self._take(slot, item, fsm.START, (slot.index, fsm.LEASE, code, 0, 0)))
        feedable, plain = self._feedable[code], queue.plain
        # Fixed for this loop (it leases nothing, and posture changes between grants only):
        held, shallow, nominal = self._held[code], self._ahead[code] > 1, not cordon.restricts(self.posture)
        skip, slots, sent_ahead, take = self.skip, self._slots, self._sent_ahead, self._take
        level = None  # the queue's head level, taken from directly (`_PriorityQueue.head`)
        while feedable:
            # The shallowest slot first, so the role's seats fill evenly; and only while
            # the queue holds at least as many units as every slot would then have ahead
            # of it: a unit never waits behind more than is left for the other slots.
            slot = slots[self._shallowest(feedable) if shallow and len(feedable) > 1 else next(iter(feedable))]
            if plain.n < held * len(slot.inflight):
                return
            if not level:
                level = plain.head()
                if level is None:
                    return
            item = level[0]
            if skip is not None and skip(item.unit_id):
                self._drop_head(level, plain, queue)
                continue
            if not (nominal or self._posture_allows(code, item, False)):
                return
            level.popleft()
            plain.n -= 1
            queue.n -= 1
            sent_ahead.add(item.unit_id)
            self.sent_ahead_total += 1
            out.append(take(slot, item, fsm.LEASE, (), True))

    def _shallowest(self, feedable: dict) -> int:
        """The feedable slot with the fewest units in flight (the first of them on a tie)."""
        slots, best, depth = self._slots, -1, 1 << 30
        for index in feedable:
            n = len(slots[index].inflight)
            if n < depth:
                best, depth = index, n
        return best

    def _grant_keyed(self, code: int, queue: _RoleQueue, out: list) -> None:
        pins = self._pins[code]
        for key in list(queue.by_key):
            slot = pins.get(key)
            if slot is not None and slot.drained:
                # Its drained pin still has units out: they come back and go first, so
                # the key's units keep their order.
                continue
            q = queue.by_key[key]
            while q.n:
                # Whether the key may be granted anything is settled before its head is
                # taken up: `_next_live` marks the head's future running, and from then on
                # no cancel (shutdown's cancel_futures included) can take it back.
                slot = pins.get(key)
                if slot is None:
                    if not self._claimable(code):
                        break  # every pin is another key's: it waits for one (T9)
                elif slot.inflight if slot.stale else len(slot.inflight) >= self.pin_depth:
                    break  # the old epoch's pin finishes what it has first; or the pin is full
                elif slot.stale and not self._live[slot.seat]:
                    break  # a retired seat's: released (`take_idle_stale_pins`), then claimed elsewhere
                item = self._next_live(q, queue)
                if item is None:
                    break
                if slot is not None and slot.stale:
                    if not self._posture_allows(code, item, True):
                        return
                    q.pop()
                    queue.n -= 1
                    out.append(self._take(slot, item, fsm.START, _ops(slot.index, self._repin(code, slot, key))))
                    continue
                if slot is not None:
                    # RESUME (T6) is posture-gated like a new lease (for deferrable roles).
                    if not self._posture_allows(code, item, not slot.inflight):
                        return
                    q.pop()
                    queue.n -= 1
                    out.append(self._take(slot, item, fsm.RESUME, ()))
                    continue
                if not self._posture_allows(code, item, True):
                    return
                slot, transitions = self._claim(code, key)
                q.pop()
                queue.n -= 1
                out.append(self._take(slot, item, fsm.START, _ops(slot.index, transitions)))
            if not q.n:
                del queue.by_key[key]

    def _next_live(self, q: _PriorityQueue, queue: _RoleQueue) -> Pending | None:
        """The head of `q`, dropping units `skip` says were cancelled."""
        while True:
            level = q.head()
            if level is None:
                return None
            item = level[0]
            if self.skip is None or not self.skip(item.unit_id):
                return item
            self._drop_head(level, q, queue)

    def _drop_head(self, level: deque, q: _PriorityQueue, queue: _RoleQueue) -> None:
        """`skip` said the head of `level` (`q`'s head level) was cancelled: it leaves the
        queue, and is collected for `take_skipped`."""
        item = level.popleft()
        q.n -= 1
        queue.n -= 1
        self._skipped.append(item.unit_id)

    def take_skipped(self) -> list[int]:
        out, self._skipped = self._skipped, []
        return out

    def _claimable(self, code: int) -> bool:
        """Would `_claim` find a pin for a key of `code` that has none (changing nothing)?"""
        if self._idle_seat(code) >= 0:
            return True
        return self.roles.by_code(code).elastic_repin and any(
            not s.inflight and not s.drained for s in self._pins[code].values())

    def drain_unpinnable(self) -> list[Pending]:
        """Remove and return the queued units of keys no pin can come to without an epoch
        boundary: the key has no pin, its role holds every pin it may (its count), none of
        them is to be released (stale) or drained, and the role does not re-key idle pins
        (`elastic_repin`). A pin is re-keyed only at an epoch boundary (002 §3.4, T9), and a
        closing fleet waits for none, so these would wait for ever (the caller fails them)."""
        out = []
        for code, queue in enumerate(self._queues):
            if not queue.keyed or not queue.n or self.roles.by_code(code).elastic_repin:
                continue
            pins = self._pins[code]
            if self._under_count(code) or any(s.stale or s.drained for s in pins.values()):
                continue
            for key in [k for k in queue.by_key if k not in pins]:
                items = queue.by_key.pop(key).drain()
                queue.n -= len(items)
                out.extend(items)
        return out

    def _claim(self, code: int, key) -> tuple[_Slot | None, tuple]:
        """A pin for a key that has none: an Idle slot within the role's count (T1); at its
        count, with `elastic_repin`, the least recently used pin with nothing in flight
        is re-keyed (T9 then T1); otherwise the key waits for a pin to be released."""
        pins = self._pins[code]
        seat = self._idle_seat(code)
        slot = self._lease_on(seat, code) if seat >= 0 else None
        transitions: tuple = ()
        if slot is None:
            if not self.roles.by_code(code).elastic_repin:
                return None, ()
            spare = [s for s in pins.values() if not s.inflight and not s.drained]
            if not spare:
                return None, ()
            slot = min(spare, key=lambda s: s.last_used)
            del pins[slot.pin_key]
            transitions = ((fsm.UNPIN, code, slot.key_id),)
            self.repins[code] += 1
        slot.claimed, slot.stale, slot.pin_key = True, False, key
        slot.key_id = self._new_key_id(code) if self.roles.by_code(code).kind == "pinned" else 0
        pins[key] = slot
        return slot, transitions + ((fsm.LEASE, code, slot.key_id),)

    def _repin(self, code: int, slot: _Slot, key) -> tuple:
        """Release `slot`'s pin (T9) and claim it again for `key` (T1): the transitions."""
        old_key_id = slot.key_id
        slot.stale = False
        slot.key_id = self._new_key_id(code) if self.roles.by_code(code).kind == "pinned" else 0
        return ((fsm.UNPIN, code, old_key_id), (fsm.LEASE, code, slot.key_id))

    # --- epochs ----------------------------------------------------------------------
    def begin_epoch(self) -> int:
        """A new epoch: every pin held now is to be released. Returns how many."""
        held = [s for pins in self._pins for s in pins.values()]
        for slot in held:
            slot.stale = True
        return len(held)

    def take_idle_stale_pins(self) -> list[int]:
        """Pins of a past epoch with nothing in flight, forgotten here; the caller applies
        UNPIN (T9) to each returned slot (before anything else is granted)."""
        out = []
        for pins in self._pins:
            for slot in [s for s in pins.values() if s.stale and not s.inflight]:
                self._unhold(slot)
                out.append(slot.index)
        return sorted(out)

    def set_live(self, seat: int, live: bool) -> None:
        """Whether `seat` runs in this epoch (`fleet.rules.seats.Placement`). A retired seat
        is granted nothing new: its Idle slots leave the pool, and each slot that ends
        Idle stays out of it (units in flight there complete; its pins are released as
        any stale pin). A seat that runs again has its Idle slots back in the pool."""
        if self._live[seat] == live:
            return
        self._live[seat] = live
        if not live:
            self._idle[seat] = _IdlePool(len(self._seat_slots[seat]))
            return
        for index in reversed(self._seat_slots[seat]):
            slot = self._slots[index]
            if slot.role < 0:
                self._idle[seat].put(slot)

    def live(self, seat: int) -> bool:
        return self._live[seat]

    def seat_empty(self, seat: int) -> bool:
        """Nothing is held on `seat`'s slots: no unit in flight, no pin (a retired seat's
        worker may leave)."""
        return all(self._slots[i].role < 0 and not self._slots[i].inflight for i in self._seat_slots[seat])

    def units_in_flight(self, slot: int) -> int:
        """Units granted to `slot` and not yet ended."""
        return len(self._slots[slot].inflight)

    def _new_key_id(self, code: int) -> int:
        in_use = {s.key_id for s in self._pins[code].values()}
        while True:
            kid = next(self._key_ids) % (fsm.MAX_KEY + 1)
            if kid and kid not in in_use:
                return kid

    def _take(self, slot: _Slot, item: Pending, start_event: int, ops: tuple, ahead: bool = False) -> Grant:
        if not slot.inflight:
            self._in_use[slot.role] += 1
        slot.inflight.append(item.unit_id)
        slot.last_used = next(self._clock)
        self._where[item.unit_id] = slot.index
        self._granted[item.unit_id] = item
        if self._pooled[slot.role]:
            self._update_feedable(slot)
        return _new_grant((item.unit_id, slot.role, slot.index, slot.seat, start_event, slot.key_id, ops, ahead, item))

    def ahead_caps(self) -> list[int]:
        """Per role: the most units sent ahead to one of its slots (0: none ever)."""
        return list(self._ahead_cap)

    def pace(self, code: int, depth: int) -> None:
        """Send role `code` at most `depth` units ahead per slot from here on (never more
        than its cap: `ahead_caps`). Units already sent stay where they are."""
        depth = max(0, min(depth, self._ahead_cap[code]))
        if depth == self._ahead[code]:
            return
        self._ahead[code] = depth
        for slot in self._slots:
            if slot.role == code:
                self._update_feedable(slot)

    def _update_feedable(self, slot: _Slot) -> None:
        """A pooled slot may take a unit ahead while 1 <= its units in flight <= the role's lookahead."""
        feedable = self._feedable[slot.role]
        if 1 <= len(slot.inflight) <= self._ahead[slot.role] and not slot.parked:
            feedable[slot.index] = None
        else:
            feedable.pop(slot.index, None)

    # --- completions and deaths ------------------------------------------------------
    def complete(self, unit_id: int, final_state: int) -> int:
        """A unit's outcome arrived; `final_state` is its slot's state after it. Returns the slot."""
        if self._parked:
            self._unpark(unit_id)
        parent = self._riding.pop(unit_id, None)
        if parent is not None:  # a rider: its parent's slot is as it was
            self._rode.discard(unit_id)
            del self._granted[unit_id]
            left = self._riders.pop(parent) - 1
            if left:
                self._riders[parent] = left
            return self._where.pop(unit_id)
        slot = self._slots[self._where.pop(unit_id)]
        del self._granted[unit_id]
        self._sent_ahead.discard(unit_id)
        if slot.inflight and slot.inflight[0] == unit_id:
            slot.inflight.popleft()
        else:
            slot.inflight.remove(unit_id)
        if not slot.inflight:
            self._in_use[slot.role] -= 1
        if self._pooled[slot.role]:
            self._update_feedable(slot)
            if not slot.inflight:
                self._unhold(slot)  # T5 (or T8): back to the seat's pool, for any role
        elif final_state == fsm.IDLE:
            if slot.inflight:
                slot.drained = True  # the pin was drained: what was sent behind it comes back (requeue)
            else:
                self._unhold(slot)  # drained or released: the pin is gone
        return slot.index

    def requeue(self, unit_id: int) -> bool:
        """A unit sent behind a pin that was drained to Idle came back unstarted: put it at
        the head of its key's queue again (submit order kept). False (nothing changed)
        when it was not such a unit."""
        index = self._where.get(unit_id)
        if index is None or not self._slots[index].drained:
            return False
        item = self._granted[unit_id]
        self.complete(unit_id, fsm.IDLE)
        queue = self._queues[item.role]
        fresh = item.key not in queue.by_key
        queue.key_queue(item.key).put_back(item)
        if fresh:
            queue.by_key.move_to_end(item.key, last=False)  # it was waiting before newer keys
        queue.n += 1
        return True

    def seat_lost(self, seat: int) -> list[Lost]:
        """The seat's worker died: forget its slots, pins and units in flight. Returns the
        units it owed, in grant order; its owner decides what the death means for each
        (`fleet.runtime.deaths`) and gives back those that never started (`put_back_first`)."""
        slot_of: dict[int, int] = {}  # unit id -> slot, for the seat's units in flight
        for child, parent in list(self._riding.items()):
            if self._slots[self._where[child]].seat == seat:
                slot_of[child] = self._where.pop(child)
                del self._riding[child]
                left = self._riders.pop(parent) - 1
                if left:
                    self._riders[parent] = left
        for parent in [p for p, s in self._parked.items() if s.seat == seat]:
            self._unpark(parent)
        for index in self._seat_slots[seat] if 0 <= seat < len(self._seat_slots) else ():
            slot = self._slots[index]
            for unit_id in slot.inflight:
                del self._where[unit_id]
                self._sent_ahead.discard(unit_id)
                slot_of[unit_id] = index
            if slot.inflight:
                self._in_use[slot.role] -= 1
            slot.inflight.clear()
            if slot.role >= 0:
                self._feedable[slot.role].pop(slot.index, None)
                self._unhold(slot)
        self._cool(seat)  # its slots are Idle again, but its worker is gone
        if not slot_of:
            return []
        lost = [Lost(item, slot_of[unit_id]) for unit_id, item in self._granted.items() if unit_id in slot_of]
        for item, _slot in lost:
            del self._granted[item.unit_id]
        return lost

    def _cool(self, seat: int) -> None:
        """`seat`'s worker is gone: no unit goes there for its warmth (`_idle_seat`) until
        one of its slots goes Idle again (its successor ran a unit)."""
        if self._warm_seat == seat:
            self._warm_seat = -1

    def put_back_first(self, items: list[Pending]) -> None:
        """Units granted that never started (their seat died): back in their queues ahead
        of every unit submitted after them, in submit order with the units put back
        before (by this death or an earlier one), which is the order they had there; a
        keyed unit's key goes before its role's other keys (it was waiting before them; the
        last key moved to the front is the first unit's, so the keys keep their order too)."""
        for item in reversed(items):
            self._queues[item.role].push_first(item)

    def sent_ahead(self, unit_id: int) -> bool:
        """Whether `unit_id` was sent behind a running unit and has not ended."""
        return unit_id in self._sent_ahead

    def slots_of_seat(self, seat: int) -> list[int]:
        return list(self._seat_slots[seat]) if 0 <= seat < len(self._seat_slots) else []

    def pinned_keys(self, role: int) -> dict:
        """{user key: slot index} for the role's claimed pins (for status and tests)."""
        return {key: s.index for key, s in self._pins[role].items()}

    def inflight_count(self) -> int:
        return len(self._where)

    # --- views for `fleet.rules.why` (read on the owner's thread; nothing changes) -------
    def place(self, unit_id: int, role: int, key=None) -> list[int] | None:
        """The units granted before `unit_id` in its queue, in the order they come up (for a
        keyed role, its key's queue: other keys wait on pins of their own), or None when it
        is not queued here. An operator's look: a scan of the queue."""
        queue = self._queues[role]
        q = queue.by_key.get(key) if queue.keyed else queue.plain
        if q is None:
            return None
        ahead = []
        for neg in q.order:
            for item in q.levels[-neg]:
                if item.unit_id == unit_id:
                    return ahead
                ahead.append(item.unit_id)
        return None

    def in_flight(self, slot: int) -> list[int]:
        """The units granted to `slot`, in the order its seat runs them (the first runs)."""
        return list(self._slots[slot].inflight)

    def room(self, role: int) -> dict:
        """What stands between `role`'s next unit and a slot: the slots it holds against its
        count, whether one of its seats has an Idle slot, and what posture lets it grow."""
        return {"held": self._held[role], "count": self._count[role], "idle": self._idle_seat_any(role),
                "in_use": self._in_use[role], "class": self._classes[role], "floor": self.floors[role],
                "posture": self.posture}

    def _idle_seat_any(self, role: int) -> bool:
        return any(self._idle[seat].n for seat in self._seats_for[role])

    def running(self, role: int) -> list[int]:
        """The unit each slot `role` holds runs (the first sent to it), by slot."""
        return [s.inflight[0] for s in self._slots if s.role == role and s.inflight]

    def pin(self, role: int, key) -> dict | None:
        """The pin of `key` in a keyed role: its slot, the units sent to it (the first runs),
        whether it is of a past epoch or drained; None when the key has none."""
        slot = self._pins[role].get(key)
        if slot is None:
            return None
        return {"slot": slot.index, "inflight": list(slot.inflight), "stale": slot.stale, "drained": slot.drained,
                "depth": self.pin_depth}

    def pins(self, role: int) -> dict:
        """{key: (slot, the unit it runs or None)} of a keyed role's pins."""
        return {key: (s.index, s.inflight[0] if s.inflight else None) for key, s in self._pins[role].items()}
