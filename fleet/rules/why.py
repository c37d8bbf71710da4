"""Why a unit is not running (or is, or ended): one rule from the owners' facts to a
state and the sentence an operator reads (pure).

`fleetctl why UNIT`, `Fleet.why`, `Client.why` and the waiting units `fleetctl status`
lists all answer through `explain`: the loop gathers a unit's facts from the state its
owners hold (`fleet.runtime.why.facts`: the books, the gates, the dispatcher, the seats,
the posture), never from a second account of it, and this rule says what they mean.

What holds a unit, in the order it is asked (the first that holds is its ``state``):

* ``ended``: it has its outcome (solved, or failed / suppressed with its reason);
* ``running``: its seat runs it (worker pid, since its grant);
* ``key``: granted behind its key's pin, after the units sent to the pin before it
  (the first of them runs); or queued while its key's pin is full, drained, or of a
  past epoch; or while every pin of its role is held by another key;
* ``behind``: sent ahead to a seat that runs another unit first (a pooled role's lookahead);
* ``provider``: the provider admission keeps it: its pool is ``closed`` or in
  ``backoff`` (until when, the refusal it met), or it waits for a seat there;
* ``lease``: it waits for its host-group lease: its request's place in the store's
  queue and the quotas with no room for it;
* ``queued``: units are ahead of it in its queue (how many, which) — the rule then
  says what holds the head of the queue too (``held_by``);
* ``cordon``: the posture keeps its role from growing (posture, causes, the role's class);
* ``slot``: its role holds every slot its count allows, or no seat it may use has an
  Idle slot;
* ``next``: nothing holds it: the next dispatch grants it.
"""
from __future__ import annotations

from fleet.rules import cordon
from fleet.rules.errors import EXIT_DATA, FleetError
from fleet.rules.vocab import CLASS_DEFERRABLE, CLASS_FLOOR, CLASS_NAMES, POSTURE_NAMES, BulkheadState, lease_states
from fleet.rules.when import utc

ENDED, RUNNING, KEY, BEHIND, PROVIDER, LEASE = "ended", "running", "key", "behind", "provider", "lease"
QUEUED, CORDON, SLOT, NEXT = "queued", "cordon", "slot", "next"
#: Every state `explain` answers with, in the order they are asked.
STATES = (ENDED, RUNNING, KEY, BEHIND, PROVIDER, LEASE, QUEUED, CORDON, SLOT, NEXT)
#: The states of a unit that waits (what `fleetctl status` lists).
WAITING = frozenset(STATES) - {ENDED, RUNNING}
#: Unit ids a reply names at most in a list (what is ahead, what a pin runs).
NAMED = 5
#: Waiting units `fleetctl status` lists (the oldest first).
OLDEST = 5


class UnknownUnit(FleetError, LookupError):
    """No unit of this fleet has that id (it never handed it out)."""

    exit_code = EXIT_DATA

    def __init__(self, unit_id: int, fleet: str | None = None, message: str | None = None):
        self.unit_id = unit_id
        whose = "this fleet" if fleet is None else f"fleet {fleet!r}"
        super().__init__(message or f"unit {unit_id}: no unit of {whose} has that id")


class BadWhy(FleetError, ValueError):
    """A why asked with an argument that is none (a unit id below 1, a count out of range)."""


def explain(facts: dict) -> dict:
    """The answer for one unit: its facts plus ``state`` (one of `STATES`) and ``text``.

    ``facts`` (`fleet.runtime.why.facts`): ``unit`` and ``role``, and one of
    ``ended`` (its outcome: kind, reason, detail; None when no longer kept), ``granted``
    (slot, seat, pid, since, key, the units sent to its slot in run order), ``gate``
    (what the gate keeping it says: ``kind`` provider or lease) or ``queued`` (key,
    the units ahead, the role's room, its key's pin, the pins of its role, the posture
    and its causes)."""
    unit = facts["unit"]
    if "ended" in facts:
        return _answer(facts, ENDED, _ended_text(unit, facts["ended"]))
    if "granted" in facts:
        return _granted(facts)
    if "gate" in facts:
        gate = facts["gate"]
        if gate["kind"] == "provider":
            return _answer(facts, PROVIDER, _provider_text(unit, gate))
        return _answer(facts, LEASE, _lease_text(unit, gate))
    return _queued(facts)


#: The keys of every answer, whatever its state (`--json`'s stable shape): the unit, its
#: role (None once ended), the state and its sentence; ``position`` in its queue and what
#: holds the queue's head (``held_by``) for a queued unit, the units its seat runs first
#: (``behind``) for one granted behind others; and the facts it was told from, one of
#: ``queued``, ``granted``, ``gate``, ``ended`` (the others None).
KEYS = ("unit", "role", "state", "text", "position", "held_by", "behind", "queued", "granted", "gate", "ended")


def _answer(facts: dict, state: str, text: str, **more) -> dict:
    answer = dict.fromkeys(KEYS)
    answer.update(facts)
    answer.update(more)
    answer["state"], answer["text"] = state, text
    return answer


def _ended_text(unit: int, outcome: dict | None) -> str:
    if outcome is None:
        return f"unit {unit} has ended (its outcome is no longer kept: it was solved or failed long ago)"
    if outcome["kind"] == "solved":
        return f"unit {unit} has ended: solved"
    detail = f": {outcome['detail']}" if outcome.get("detail") else ""
    return f"unit {unit} has ended: {outcome['kind']} {outcome['reason']}{detail}"


def _granted(facts: dict) -> dict:
    unit, g = facts["unit"], facts["granted"]
    where = f"seat {g['seat']} (slot {g['slot']}, worker pid {g['pid'] if g['pid'] else 'restarting'})"
    sent = g["inflight"]
    if sent and sent[0] == unit:
        return _answer(facts, RUNNING, f"unit {unit} is running on {where} since {utc(g['since'])}")
    before = sent[:sent.index(unit)] if unit in sent else sent
    first = f"unit {before[0]}" if before else "its seat's unit"
    others = f" and {len(before) - 1} more sent before it" if len(before) > 1 else ""
    if g.get("keyed"):
        return _answer(facts, KEY, f"unit {unit} waits for key {g['key']!r}: its pin on {where} runs {first} "
                                   f"first{others}", behind=before)
    return _answer(facts, BEHIND, f"unit {unit} was sent ahead to {where}: it starts once {first} ends{others}",
                   behind=before)


def _provider_text(unit: int, gate: dict) -> str:
    hold = {BulkheadState.CLOSED: "its provider pool is closed", BulkheadState.BACKOFF: "its provider pool backs off"}.get(
        gate.get("hold"), "its provider admission has no seat for it yet")
    until = f" until {utc(gate['until'])}" if gate.get("until") else ""
    text = f"unit {unit} waits for its provider ({gate['route']}): {hold}{until} ({gate['why']})"
    if gate.get("refused"):
        text += f"; refused {gate['refusals']} time(s), last: {gate['refused']}"
    return text


def _lease_text(unit: int, gate: dict) -> str:
    if gate.get("state") != lease_states.QUEUED:
        return f"unit {unit} waits for its host-group lease: its request is on its way to the store"
    ahead = gate["ahead"]
    text = (f"unit {unit} waits for its host-group lease: request {gate['request']} is number {gate['position']} "
            f"in the host group's queue ({len(ahead)} ahead)")
    quotas = gate.get("quotas") or []
    if quotas:
        text += "; held by " + ", ".join(_quota_text(q) for q in quotas)
    return text


def _quota_text(q: dict) -> str:
    name = "the global limit" if q["level"] == "global" else f"the {q['level']} quota {q['key']!r}"
    held = f", {q['held']} kept for requests ahead" if q.get("held") else ""
    return f"{name} ({q['used']} of {q['limit']} in use{held})"


def _queued(facts: dict) -> dict:
    unit, q = facts["unit"], facts["queued"]
    held_by, text = _head(facts)
    ahead = q["ahead"]
    if ahead:
        named = ", ".join(str(u) for u in ahead[:NAMED]) + (", ..." if len(ahead) > NAMED else "")
        return _answer(facts, QUEUED, f"unit {unit} is queued in role {facts['role']} at position {len(ahead) + 1}: "
                                      f"{len(ahead)} unit(s) ahead of it ({named}); the head of the queue {text}",
                       position=len(ahead) + 1, held_by=held_by)
    return _answer(facts, held_by, f"unit {unit} is first in its queue and {text}", position=1, held_by=held_by)


def _head(facts: dict) -> tuple[str, str]:
    """What holds the head of the unit's queue (its role's, its key's): (state, the words)."""
    q, role = facts["queued"], facts["role"]
    room, pin, key = q["room"], q.get("pin"), q.get("key")
    if pin is not None:
        where = f"key {key!r}'s pin (slot {pin['slot']})"
        if pin["drained"]:
            return KEY, f"waits for {where}: it was drained, and the units sent to it come back first"
        if pin["stale"] and pin["inflight"]:
            return KEY, f"waits for {where} to finish what it took before the epoch changed (unit {pin['inflight'][0]} runs)"
        if len(pin["inflight"]) >= pin["depth"]:
            return KEY, (f"waits for {where}: it has {len(pin['inflight'])} units sent, its most "
                         f"(unit {pin['inflight'][0]} runs)")
    posture, klass = room["posture"], room["class"]
    grows = pin is None or not pin["inflight"]
    if cordon.restricts(posture) and not cordon.admits(posture, klass, grows, room["in_use"], room["floor"]):
        causes = ", ".join(q.get("causes") or ()) or "no cause held"
        why = ("its role is deferrable: it starts nothing new while the fleet is cordoned"
               if klass == CLASS_DEFERRABLE else
               f"its role is at its intake floor ({room['in_use']} of {room['floor']} slots in use)"
               if klass == CLASS_FLOOR else f"its role's class ({CLASS_NAMES[klass]}) grows no more")
        return CORDON, f"is held by the cordon: posture {POSTURE_NAMES[posture]} (causes: {causes}); {why}"
    if pin is None and key is not None:
        if room["held"] >= room["count"] or not room["idle"]:
            pins = q.get("pins") or {}
            named = ", ".join(f"{k!r} on slot {slot}" + (f" (unit {u} runs)" if u is not None else "")
                              for k, (slot, u) in list(pins.items())[:NAMED])
            return KEY, (f"waits for a pin for key {key!r}: every pin role {role} may hold ({room['count']}) "
                         f"is another key's: {named or 'none free'}")
    if room["held"] >= room["count"]:
        running = q.get("running") or []
        named = ", ".join(str(u) for u in running[:NAMED])
        return SLOT, (f"waits for a slot: role {role} holds {room['held']} of its {room['count']} slots"
                      + (f" (running: unit {named})" if named else ""))
    if not room["idle"]:
        return SLOT, f"waits for a slot: no Idle slot on the seats role {role} may use (other roles hold them)"
    return NEXT, "is granted at the next dispatch (nothing holds it)"


def waiting(answers, limit: int = OLDEST) -> list[dict]:
    """The first `limit` of `answers` (in the order given: the oldest first) that wait."""
    out = []
    for answer in answers:
        if answer["state"] in WAITING:
            out.append(answer)
            if len(out) >= limit:
                break
    return out
