"""A unit's facts for `fleet.rules.why`, read on the loop from the state its owners hold.

Nothing here keeps an account of its own: each fact is a view of the owner that holds it
(the books: owed units, the outcomes kept, a unit's grant time; the gates: what the gate
keeping a unit says; the dispatcher: the queue ahead of it, its slot, its key's pin, its
role's room; the seats: the worker's pid; the posture: its causes). `fleet.rules.why`
says what they mean. One owner: the loop thread calls it (an op's loop half).
"""
from __future__ import annotations

from fleet.rules import why
from fleet.rules.outcomes import FAILED, SOLVED
from fleet.rules.vocab import Reason


class Why:
    """Answers `fleetctl why` from the loop's components (handed in, never the supervisor)."""

    def __init__(self, *, name, roles, door, books, gates, dispatcher, seats, posture):
        self._name, self._roles, self._door, self._books = name, roles, door, books
        self._gates, self._dispatcher, self._seats, self._posture = gates, dispatcher, seats, posture

    def unit(self, unit_id: int) -> dict:
        """The answer for `unit_id`; UnknownUnit for an id this fleet never handed out."""
        return why.explain(self.facts(unit_id))

    def oldest(self, limit: int = why.OLDEST) -> list[dict]:
        """The answers of the `limit` oldest units that wait (accept order: the oldest first)."""
        return why.waiting((why.explain(self._owed(u)) for u in self._books.owed()
                            if self._dispatcher.slot_of(u.unit_id) is None), limit)

    def facts(self, unit_id: int) -> dict:
        unit = self._books.get(unit_id)
        if unit is None:
            if not self._door.issued(unit_id):
                raise why.UnknownUnit(unit_id, self._name)
            outcome = self._books.ended(unit_id)
            ended = None if outcome is None else {"kind": outcome.kind, "reason": outcome.reason,
                                                  "detail": outcome.detail}
            if ended is not None and outcome.kind == SOLVED:
                ended = {"kind": SOLVED, "reason": None, "detail": None}
            return {"unit": unit_id, "ended": ended}
        if unit.future.cancelled():
            # Its caller cancelled it before it ran: that is its outcome, though the loop
            # records it only as the unit comes up for its grant (or a gate lets go of it).
            return {"unit": unit_id, "role": self._roles.by_code(unit.role).name,
                    "ended": {"kind": FAILED, "reason": Reason.CANCELLED, "detail": "cancelled before it ran"}}
        return self._owed(unit)

    def _owed(self, unit) -> dict:
        """The facts of a unit on the books: granted, kept by a gate, or queued."""
        unit_id, dispatcher = unit.unit_id, self._dispatcher
        base = {"unit": unit_id, "role": self._roles.by_code(unit.role).name}
        keyed = self._roles.by_code(unit.role).kind in ("pinned", "singleton")
        slot = dispatcher.slot_of(unit_id)
        if slot is not None:
            seats = self._seats
            return {**base, "granted": {"slot": slot, "seat": seats.name(seats.seat_of(slot)),
                                        "pid": seats.pid_of_slot(slot), "since": unit.since,
                                        "keyed": keyed, "key": _shown(unit.key),
                                        "inflight": dispatcher.in_flight(slot)}}
        gate = self._gates.standing(unit_id)
        if gate is not None:
            return {**base, "gate": gate}
        ahead = dispatcher.place(unit_id, unit.role, unit.key)
        return {**base, "queued": {
            "key": _shown(unit.key) if keyed else None,
            "ahead": ahead if ahead is not None else [],
            "room": dispatcher.room(unit.role),
            "pin": dispatcher.pin(unit.role, unit.key) if keyed else None,
            "pins": {_shown(k): v for k, v in dispatcher.pins(unit.role).items()} if keyed else {},
            "running": dispatcher.running(unit.role),
            "causes": sorted(str(c) for c in self._posture.causes),
        }}


def _shown(key):
    """A key as JSON carries it (a str or int stays; any other hashable is shown)."""
    return key if key is None or isinstance(key, (str, int)) else repr(key)
