"""What a posture does to work: intake, drains and close, by a role's cordon class (pure).

`fleet.rules.posture` decides the posture; this room says what it does. The rules:

* Nominal touches nothing.
* Cordoned, by the role's cordon class (`fleet.rules.vocab.CLASS_NAMES`):

  - ``never``: untouched.
  - ``floor``: new intake is floored: a grant that puts one more of the role's slots
    in use is made only while fewer than its floor are in use (`admits`); the floor is
    ``cordon_sim_intake_floor``, by default half the role's slot cap (`intake_floor`).
  - ``deferrable``: the class yields. It takes no new work: no grant, and its slots
    may not lease (T1), start (T2) or resume (T6) (`halts`); a unit a worker was sent
    but may not start is held back, and tried again once the posture halts nothing
    (`halts_any`). Its units already running are drained at cordon onset (T7: they
    finish, the slot takes nothing new), and so are they at a new quota epoch
    (`yields`). When the fleet closes while the posture halts the class, its units not
    yet started fail Shutdown instead of waiting (`sheds_at_close`): a sticky cause
    never clears without an operator, so waiting could last for ever.

* In-flight work is never touched otherwise: drains and completions stay legal in
  every posture.

The slot FSM's numba kernel cannot call Python: it compiles `HALTS` (and `YIELDING`) in,
so the rule is still written only here.
"""
from __future__ import annotations

from fleet.rules.vocab import CLASS_DEFERRABLE, CLASS_FLOOR, CLASS_NAMES, CORDONED, NOMINAL, POSTURE_NAMES

#: By cordon class code: whether the class yields (under cordon it takes nothing new, and its
#: running units are drained at onset and at a new quota epoch).
YIELDING = tuple(code == CLASS_DEFERRABLE for code in range(len(CLASS_NAMES)))

#: By posture code, then cordon class code: whether a slot of the class may take no new
#: work (no lease T1, start T2 or resume T6). The kernel compiles this table in.
HALTS = tuple(tuple(posture == CORDONED and YIELDING[code] for code in range(len(CLASS_NAMES)))
              for posture in range(len(POSTURE_NAMES)))


def halts(posture: int, klass: int) -> bool:
    """Whether, in `posture`, a slot of cordon class `klass` may take no new work (T1, T2, T6)."""
    return HALTS[posture][klass]


def halts_any(posture: int) -> bool:
    """Whether `posture` halts any class: while it does, units held back stay held. A
    posture word this version does not know halts nothing (as in the kernel)."""
    return 0 <= posture < len(HALTS) and any(HALTS[posture])


def restricts(posture: int) -> bool:
    """Whether `posture` limits intake at all (Nominal grants everything the slots allow)."""
    return posture != NOMINAL


def admits(posture: int, klass: int, grows: bool, in_use: int, floor: int) -> bool:
    """May a unit of a role of cordon class `klass` be granted in `posture`? `grows`: the
    grant puts one more of the role's slots in use, `in_use` of them are, `floor` is its
    intake floor under cordon."""
    if HALTS[posture][klass]:
        return False
    if posture == CORDONED and klass == CLASS_FLOOR:
        return not grows or in_use < floor
    return True


def intake_floor(setting: int | None, slot_cap: int) -> int:
    """Most slots a ``floor`` role may hold new work on under cordon: `setting`
    (``cordon_sim_intake_floor``) when set, else half its slot cap (at least 1)."""
    if setting is not None:
        return setting
    return max(1, slot_cap // 2)


def yields(klass: int) -> bool:
    """Whether running units of class `klass` are drained (T7) at cordon onset and at a new quota epoch."""
    return YIELDING[klass]


def sheds_at_close(posture: int, klass: int) -> bool:
    """Closing in `posture`: do the units of class `klass` not yet started fail Shutdown
    rather than wait for a posture that may never clear?"""
    return HALTS[posture][klass]
