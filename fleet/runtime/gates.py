"""The gates a unit passes between its accept and its slot: one protocol the loop calls.

A gate may keep a unit before the dispatcher sees it, stop one before or while it runs,
and hears of every unit's start and end. Two gates implement it: the provider admission
(`fleet.runtime.provider_gate.ProviderGate`: a unit with a route starts only when its
pool admits it) and the host-group lease (`fleet.runtime.lease_gate.HostGroupLease`: a
unit of a gated role runs only under a lease of the host group's store). The loop holds
them in a list, in that order, and calls each at the same points, on its own thread:

* `admit(unit)` as the unit comes to the gate (at accept, or when the gate before it
  lets it go): GO, on to the next gate (after the last, the dispatcher's queue), or
  HELD: the gate keeps it, and its `tick` lets it go or ends it later. Raises BadUnit
  for a unit refused on its face (only at accept, from the first gate: nothing counted);
* `started(unit)` when the unit really starts: granted its slot, its task on the way;
* `tick()` each turn: what moved since (`Ticked`), or None;
* `ended(unit, outcome, original, cost)` at the unit's close, exactly once per unit
  (every gate hears of every unit's end, whether it saw the unit or not): None, the end
  stands; or GO / HELD: the gate takes the unit back (a provider refusal within its
  limit), which has no outcome yet and starts again now (from the next gate on) or waits
  in this gate. A gate that may take a unit back comes before those that cannot;
* `drop(detail)` at a stop: the units it keeps, let go, each with its detail for the
  loop to fail or cancel it. `queue_like` says when: a gate whose units wait in line
  for capacity, as in the dispatcher's queue, is dropped with that queue (a stop's
  grace, a kill); one whose waits may outlast the fleet (a provider closed until
  midnight) is dropped as soon as the fleet closes;
* `wake_in(cap)`: the real seconds, at most `cap`, before the gate's tick may have
  news that nothing rings the loop's bell for; `lets_through(role)`: whether every
  unit of that role without a route passes at once (the loop accepts such units in
  bulk, past the gates); `stop()` at teardown.

A gate's news from its own threads (a future cancelled, a lease granted or lost) waits
in the gate until its `tick`: no other thread touches the loop's state.
"""
from __future__ import annotations

from typing import NamedTuple, Protocol

#: What a gate says of a unit it is handed (`admit`) or takes back (`ended`).
GO = "go"  # on to the next gate, then to the dispatcher
HELD = "held"  # the gate keeps it until its tick lets it go, or ends it


class Ticked(NamedTuple):
    """What moved in a gate since its last tick."""

    go: tuple = ()  # units it let go: on to the next gate
    end: tuple = ()  # (unit id, Outcome, original exception or None): units it ends
    forget: tuple = ()  # unit ids it kept whose caller cancelled them: recorded Cancelled
    stop: tuple = ()  # (unit id, reason, detail): units that may not run any more, wherever they are


class Gate(Protocol):
    queue_like: bool
    waits_for: str  # what a unit it keeps waits for, as a detail says it

    def lets_through(self, role: int) -> bool: ...

    def admit(self, unit) -> str: ...

    def started(self, unit) -> None: ...

    def tick(self) -> Ticked | None: ...

    def ended(self, unit, outcome, original=None, cost: float | None = None) -> str | None: ...

    def drop(self, detail: str) -> list[tuple[int, str]]: ...

    def wake_in(self, cap: float) -> float: ...

    def stop(self) -> None: ...


class Gates:
    """The loop's gates, in the order a unit passes them, called at the same points.

    Installed once boot has made them (`install`; until then a unit passes no gate).
    What passes the last gate goes to the dispatcher's queue; a unit a gate takes back
    at its end and lets go at once goes to the head of its queue.
    """

    def __init__(self, dispatcher, n_roles: int):
        self._dispatcher = dispatcher
        self._n_roles = n_roles
        self._gates: list = []
        self._open: frozenset = frozenset()  # roles whose units without a route pass every gate at once

    def install(self, gates: list) -> None:
        """The gates, in the order a unit passes them (a gate that may take a unit back first)."""
        self._gates = list(gates)
        self._open = frozenset(code for code in range(self._n_roles)
                               if all(gate.lets_through(code) for gate in self._gates))

    def open_to(self, unit) -> bool:
        """Whether `unit` passes every gate at once: no route, and a role no gate holds."""
        return unit.route is None and unit.role in self._open

    def lets_role_through(self, code: int) -> bool:
        """Whether every unit of role `code` without a route passes every gate at once."""
        return code in self._open

    def through(self, unit, first: int = 0) -> bool:
        """Hand `unit` to the gates from `first` on: True once it passed them all (on to
        the dispatcher), False if one keeps it. Raises BadUnit from a gate that refuses it
        on its face (the first, at accept)."""
        gates = self._gates
        for i in range(first, len(gates)):
            if gates[i].admit(unit) == HELD:
                return False
        return True

    def started(self, unit) -> None:
        """`unit` runs from here (granted its slot, its task on the way)."""
        for gate in self._gates:
            gate.started(unit)

    def ended(self, unit, outcome, original=None, cost=None) -> bool:
        """Tell every gate of `unit`'s end (each hears of it once); True if one took it
        back instead. A unit taken back starts again now, past the gate that took it (it
        keeps what the gates after it gave it), or waits there."""
        for i, gate in enumerate(self._gates):
            again = gate.ended(unit, outcome, original, cost)
            if again is not None:
                if again == GO and self.through(unit, i + 1):
                    # At the head of its queue, past its bound: it was granted before the units
                    # queued since (the oldest waits least), and a unit granted once is never lost
                    self._dispatcher.enqueue(unit, front=True)
                return True
        return False

    def tick(self):
        """What moved in each gate since its last tick, gate by gate as the caller takes it
        (what one gate let go reaches the next before that one ticks): (its place, what moved)."""
        for i, gate in enumerate(self._gates):
            news = gate.tick()
            if news is not None:
                yield i, news

    def go_on(self, units, after: int) -> None:
        """Units the gate at `after` let go: through the gates after it, then queued."""
        for unit in units:
            if self.through(unit, after + 1):
                self._dispatcher.enqueue(unit)

    def drop(self, queue_like: bool | None, detail: str, end) -> None:
        """Let go of every unit the gates of that kind keep (`Gate.queue_like`; None: every
        gate), each ended at once by ``end(unit_id, why)``, gate by gate: ``{waits_for}`` in
        `detail` says what the gate's units wait for."""
        for gate in self._gates:
            if queue_like is None or gate.queue_like == queue_like:
                for unit_id, why in gate.drop(detail.replace("{waits_for}", gate.waits_for)):
                    end(unit_id, why)

    def standing(self, unit_id: int) -> dict | None:
        """What the gate keeping `unit_id` says of its wait (``kind`` names the gate:
        `fleet.rules.why`), or None when no gate keeps it. A gate tells it by its
        ``standing(unit_id)``."""
        for gate in self._gates:
            look = getattr(gate, "standing", None)
            found = None if look is None else look(unit_id)
            if found is not None:
                return found
        return None

    def wake_in(self, cap: float) -> float:
        """The real seconds, at most `cap`, before a gate's tick may have news nothing rings for."""
        wait = cap
        for gate in self._gates:
            wait = min(wait, gate.wake_in(wait))
        return wait

    def stop(self) -> bool:
        """Stop every gate, the last first (the lease gives back the leases still held; the
        provider writes its closures); False when none was installed. Idempotent."""
        gates, self._gates = self._gates, []
        for gate in reversed(gates):
            gate.stop()
        return bool(gates)
