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
