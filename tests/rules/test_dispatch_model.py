"""The dispatcher (`fleet.rules.dispatch`) against a plain Python model, step by step (hypothesis).

The model holds what the rules promise, written the obvious way: which role holds each
slot and which (role, key) each pin serves, the role counts, the queue order inside a
role (and inside a key), posture intake, and the slot words as the pure FSM rule
(`fsm.decide`) walks them. Every grant the dispatcher returns is checked against it:

* a role never holds more slots than its count, and a pooled role with units waiting
  holds its whole count (on its seats: the slots of a seat group suffice);
* a slot is leased (T1, role field set to the granted role) only while Idle; a pinned
  slot keeps its role and key: it takes only RESUMEs of its key, until T9 at an epoch
  boundary, or an elastic re-pin of a role that opted in;
* units of a role (of a key) are granted by priority, then submit order;
* under cordon a deferrable role is granted nothing new and a floor role grows to its
  floor at most;
* every transition a grant, a start, a completion or a reset walks is legal;
* a unit is sent ahead (lookahead) only to a pooled slot its role holds that has a
  unit in flight, with no transition of its own (the worker LEASEs and STARTs it), and
  only while the role's queue holds as many units as the role holds slots; a dead
  seat's units that never started go back to the head of their queue, and are granted
  again in the order they had there.
"""
from __future__ import annotations

import collections

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fleet.rules import fsm
from fleet.rules.dispatch import Dispatcher, Pending
from fleet.rules.roles import Role, RoleSet
from fleet.rules.seats import Seat, SeatLayout, SlotSpec

ROLES = RoleSet((
    Role("solver", kind="pinned", handler="m:f", slots=1, elastic_repin=True),
    Role("bins", kind="pinned", handler="m:f", slots=1),
    Role("merge", kind="singleton", handler="m:f", slots=1),
    Role("sim", kind="pooled", cordon_class="floor", handler="m:f", slots=3),
    Role("bg", kind="pooled", cordon_class="deferrable", handler="m:f", slots=1),
    Role("resolve", kind="pooled", handler="m:f", slots=2, io_bound=True),  # sends ahead on its slots
))
#: Three seat groups: every role but resolve shares seat 0 (serial-like); resolve has
#: seats 1 and 2, a slot on each (its lone units go to the seat that went Idle last).
GROUPS = {0: ("solver", "bins", "merge", "sim", "bg"), 1: ("resolve",), 2: ("resolve",)}
FLOOR = 1  # sim's intake floor under cordon
KEYS = ("a", "b", "c")
PIN_DEPTH = 2


def _layout() -> SeatLayout:
    slots = []
    for role in ROLES:
        seats = [s for s, names in GROUPS.items() if role.name in names]
        for k in range(role.slots):  # a role's slots spread over its seats
            slots.append(SlotSpec(len(slots), role.name, seats[k % len(seats)]))
    seats = tuple(Seat(s, f"seat-{s}", names, (s,), "logical") for s, names in GROUPS.items())
    return SeatLayout(seats, tuple(slots))


LAYOUT = _layout()
SEAT_OF = [s.seat for s in LAYOUT.slots]


class DispatcherMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.d = Dispatcher(ROLES, LAYOUT, pin_depth=PIN_DEPTH)
        self.ids = 0
        self.queued: dict[int, Pending] = {}  # unit id -> what was submitted, while queued
        self.items: dict[int, Pending] = {}  # unit id -> what was submitted, once granted
        self.inflight: dict[int, collections.deque] = collections.defaultdict(collections.deque)  # slot -> (uid, start event)
        self.holder: dict[int, int] = {}  # slot -> role holding it
        self.pins: dict[tuple, int] = {}  # (role, key) -> slot
        self.pin_of: dict[int, tuple] = {}  # slot -> (role, key)
        self.stale: set[int] = set()  # pins of a past epoch
        self.words = {i: (fsm.IDLE, 0, 0) for i in range(len(LAYOUT.slots))}  # state, role, key
        self.posture = fsm.NOMINAL
        self.floors = [FLOOR if r.name == "sim" else 0 for r in ROLES]
        self.repins = [0] * len(ROLES)  # elastic re-pins

    # --- the pure FSM over the model's words ------------------------------------------
    def _step(self, slot, event, role=fsm.ANY_ROLE, key=0) -> int:
        state, slot_role, slot_key = self.words[slot]
        concerned = ROLES.by_code(role if event == fsm.LEASE else slot_role)
        reason, nxt, nrole, nkey = fsm.decide(state, slot_role, slot_key, event, role, key, concerned.kind_code,
                                              concerned.class_code, self.posture)
        if reason == fsm.OK:
            self.words[slot] = (nxt, nrole, nkey)
        return reason

    def _walk(self, slot, event, role=fsm.ANY_ROLE, key=0) -> None:
        reason = self._step(slot, event, role, key)
        assert reason == fsm.OK, (slot, fsm.EVENT_NAMES[event], fsm.REASON_NAMES[reason], self.words[slot])

    def _release(self, slot) -> None:
        role = self.holder.pop(slot)
        if slot in self.pin_of:
            del self.pins[self.pin_of.pop(slot)]
        self.stale.discard(slot)
        assert self.words[slot][0] == fsm.IDLE and role is not None

    # --- rules --------------------------------------------------------------------------
    @rule(role=st.sampled_from(ROLES.names), key=st.sampled_from(KEYS), priority=st.integers(0, 2))
    def submit(self, role, key, priority):
        self.ids += 1
        spec = ROLES[role]
        item = Pending(self.ids, ROLES.code(role), key if spec.kind == "pinned" else None, priority)
        self.queued[self.ids] = item
        self.d.enqueue(Pending(item.unit_id, item.role, item.key, item.priority))
        self.grant()  # the supervisor dispatches after every submit

    @rule()
    def grant(self):
        in_use_before = [self.d.in_use(c) for c in range(len(ROLES))]
        for g in self.d.grant():
            self._check_grant(g, in_use_before)
        self._check_no_idle_capacity_left()

    def _check_grant(self, g, in_use_before) -> None:
        item = self.queued.pop(g.unit_id)
        spec = ROLES.by_code(item.role)
        assert g.role == item.role and g.seat == SEAT_OF[g.slot]
        assert spec.name in GROUPS[g.seat], "a role leased a slot of a seat it may not use"
        # Order: the head of its role (its key), by priority then submit order.
        rivals = [p for p in self.queued.values() if p.role == item.role and (spec.kind == "pooled" or p.key == item.key)]
        assert all((-item.priority, item.unit_id) < (-p.priority, p.unit_id) for p in rivals), "granted out of order"
        # Posture: nothing new for a deferrable role under cordon; a floor role grows to its floor.
        grows = not self.inflight[g.slot]
        if self.posture == fsm.CORDONED and spec.cordon_class == "deferrable":
            raise AssertionError("a deferrable unit was granted under cordon")
        if self.posture == fsm.CORDONED and spec.cordon_class == "floor" and grows:
            assert in_use_before[item.role] < self.floors[item.role]
            in_use_before[item.role] += 1
        events = [e for e, _r, _k in g.transitions]
        pin = self.pin_of.get(g.slot)
        if pin is not None:
            # A pinned slot keeps its role and key: RESUME for its key, or T9 first.
            assert pin[0] == item.role, "a pinned slot served another role"
            if not events:
                assert pin == (item.role, item.key) and g.start_event == fsm.RESUME, "a pin switched its key"
                assert g.slot not in self.stale, "an old epoch's pin took a new unit"
            else:
                assert events == [fsm.UNPIN, fsm.LEASE] and not self.inflight[g.slot]
                epoch = g.slot in self.stale and pin == (item.role, item.key)
                assert epoch or spec.elastic_repin, "a pin was re-keyed without an epoch or elastic_repin"
                self.repins[item.role] += not epoch
                del self.pins[self.pin_of.pop(g.slot)]
                self.stale.discard(g.slot)
        elif g.ahead:
            assert spec.kind == "pooled" and self.holder.get(g.slot) == item.role, "sent ahead to a slot not its role's"
            assert self.inflight[g.slot], "sent ahead to a slot that runs nothing"
            assert events == [] and g.start_event == fsm.LEASE
            waiting = 1 + sum(1 for p in self.queued.values() if p.role == item.role)
            depth = len(self.inflight[g.slot])  # units on the slot before this one
            assert waiting >= self.d.held(item.role) * depth, "sent ahead with fewer queued than would wait on slots"
            assert all(len(self.inflight[s]) >= depth for s, r in self.holder.items()
                       if r == item.role and 1 <= len(self.inflight[s]) <= spec.lookahead), "not the shallowest slot"
        else:
            assert g.slot not in self.holder, "a held slot was leased again"
            assert events == [fsm.LEASE] and g.start_event == fsm.START
            self.holder[g.slot] = item.role
        if spec.kind != "pooled" and events:  # a new pin (a RESUME keeps the one it has)
            assert (item.role, item.key) not in self.pins, "a key holds two pins"
            self.pins[(item.role, item.key)] = g.slot
            self.pin_of[g.slot] = (item.role, item.key)
        for event, role, key_id in g.transitions:
            self._walk(g.slot, event, role, key_id)
        if not g.ahead:
            assert self.words[g.slot][1] == item.role  # T1 set the slot's role field to the granted role
        self.inflight[g.slot].append((g.unit_id, g.start_event, g.key_id))
        self.items[g.unit_id] = item
        assert len(self.inflight[g.slot]) <= (1 + spec.lookahead if spec.kind == "pooled" else PIN_DEPTH)

    def _check_no_idle_capacity_left(self) -> None:
        """A pooled role with units waiting got its whole count, unless posture held it."""
        if self.posture != fsm.NOMINAL:
            return
        for code, spec in enumerate(ROLES):
            if spec.kind == "pooled" and any(p.role == code for p in self.queued.values()):
                assert self.d.held(code) == spec.slots, f"{spec.name} waits below its count"

    @precondition(lambda self: any(self.inflight.values()))
    @rule(data=st.data())
    def complete(self, data):
        """The worker runs the head unit of a slot: START/RESUME, then its completion."""
        slots = sorted(s for s, q in self.inflight.items() if q)
        slot = data.draw(st.sampled_from(slots))
        uid, start, key_id = self.inflight[slot][0]
        if start == fsm.LEASE:  # sent ahead: the worker leases the slot (T1), then STARTs it
            if self._step(slot, fsm.LEASE, self.holder[slot], key_id) == fsm.R_CORDONED:
                return
            start = fsm.START
        if self._step(slot, start, fsm.ANY_ROLE, key_id) == fsm.R_CORDONED:
            return  # held back by cordon (the worker retries it once Nominal)
        assert self.words[slot][0] == fsm.RUNNING
        self.inflight[slot].popleft()
        kind = ROLES.by_code(self.words[slot][1]).kind_code
        self._walk(slot, fsm.COMPLETION[kind])
        self.d.complete(uid, self.words[slot][0])
        if kind == fsm.KIND_POOLED and not self.inflight[slot]:
            self._release(slot)  # the slot stays its role's while a unit sent ahead waits on it
        self.grant()  # and after every batch of results

    @rule()
    def epoch(self):
        """A quota change or a reload: every pin is released once empty (T9)."""
        assert self.d.begin_epoch() == len(self.pin_of)
        self.stale = set(self.pin_of)
        self.release_stale()

    @rule()
    def release_stale(self):
        released = self.d.take_idle_stale_pins()
        assert released == sorted(s for s in self.stale if not self.inflight[s])
        for slot in released:
            self._walk(slot, fsm.UNPIN)
            self._release(slot)

    @rule(seat=st.sampled_from(sorted(GROUPS)))
    def seat_lost(self, seat):
        # In the model a unit starts and ends in one step: whatever is in flight never
        # started, so all of it goes back to the head of its queue (fleet.runtime.deaths).
        owed = self.d.seat_lost(seat)
        lost = [(uid, s) for s in range(len(SEAT_OF)) if SEAT_OF[s] == seat for uid, _e, _k in self.inflight[s]]
        assert sorted((x.item.unit_id, x.slot) for x in owed) == sorted(lost)
        self.d.put_back_first([x.item for x in owed])
        for uid, _s in lost:
            self.queued[uid] = self.items[uid]
        for slot in [s for s in range(len(SEAT_OF)) if SEAT_OF[s] == seat]:
            self.inflight[slot].clear()
            for event in fsm.RESET_PATHS.get(self.words[slot][0], ()):
                self._walk(slot, event)
            if slot in self.holder:
                self._release(slot)

    @rule(cordoned=st.booleans())
    def posture_changes(self, cordoned):
        self.posture = fsm.CORDONED if cordoned else fsm.NOMINAL
        self.d.set_posture(self.posture, self.floors)

    # --- invariants ---------------------------------------------------------------------
    @invariant()
    def counts_hold(self):
        held = collections.Counter(self.holder.values())
        for code, spec in enumerate(ROLES):
            assert held[code] <= spec.slots, f"{spec.name} holds {held[code]} slots, its count is {spec.slots}"
            assert self.d.held(code) == held[code]
            assert self.d.in_use(code) == sum(1 for s, r in self.holder.items() if r == code and self.inflight[s])
            assert self.d.queued(code) == sum(1 for p in self.queued.values() if p.role == code)
            assert self.d.repins[code] == self.repins[code]
            if spec.kind != "pooled":
                assert self.d.pinned_keys(code) == {k: s for (r, k), s in self.pins.items() if r == code}

    @invariant()
    def words_agree(self):
        for slot, (state, role, key) in self.words.items():
            if slot in self.holder:
                # Idle while held only when what it holds next is a unit sent ahead (not yet leased)
                ahead_next = bool(self.inflight[slot]) and self.inflight[slot][0][1] == fsm.LEASE
                assert (state != fsm.IDLE and role == self.holder[slot]) or (state == fsm.IDLE and ahead_next)
            else:
                assert state == fsm.IDLE
            if slot in self.pin_of and ROLES.by_code(role).kind == "pinned" and state == fsm.PINNED:
                assert self.pin_of[slot][0] == role


TestDispatcherModel = DispatcherMachine.TestCase
TestDispatcherModel.settings = settings(max_examples=300, stateful_step_count=60, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])
