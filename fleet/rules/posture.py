"""The fleet posture: Nominal <-> Cordoned, from cgroup throttle counters.

Rules this module keeps (002 §6):

* Enter Cordoned when >= `cordon_enter_events` throttle events fall in the rolling
  `cordon_enter_window_ms`, or throttled duty exceeds `cordon_duty_percent` over the
  trailing `cordon_duty_window_ms`. Defaults: 2 events / 1 s, 2 % / 5 s.
* Leave Cordoned after `cordon_exit_clean_ms` (default 10 s) of clean samples and no
  sticky cause. Any throttled sample restarts the clean clock, so a signal that
  toggles faster than the exit window holds the posture instead of flapping it.
* A sticky cause cordons at once and holds Cordoned until it is released; the clean
  clock restarts on release. The causes are STICKY_CAUSES: ``lane-death`` (a worker
  died: every lane death, 002 §14) and ``operator`` (a manual cordon). Only an
  operator releases them (``fleetctl posture release CAUSE``); a name outside the
  vocabulary is refused (PostureCauseError) and changes nothing; releasing a cause
  that is not held changes nothing.
* Posture changes intake only; this module decides the posture, `fleet.rules.cordon`
  says what it does.

What an "event" is. The kernel does not count throttle events: `nr_throttled`
counts CFS *periods* (100 ms by default) in which the group ran out of quota,
once per period however many CPUs were stalled. We take one throttled period as one
event, so the events between two samples are the growth of `nr_throttled`. With
100 ms periods, "2 events in 1 s" reads "throttled in at least 2 of the last ~10
periods". v1 and v2 count `nr_throttled` the same way.

What "duty" is. Duty is throttled time over wall time in the trailing window:
sum(delta throttled_ns) / duty window. Throttled time (v1 `throttled_time`, ns; v2
`throttled_usec`, µs, normalised to ns by `fleet.host.cgroup`) is summed over per-CPU
run queues, so on a group spread over k CPUs duty can reach k x 100 %. We do not
divide by k: the kernel does not say how many CPUs the group ran on in the window,
and erring wide only makes a multi-CPU group cordon a little sooner.

Counters are cumulative. The first reading is a baseline (lifetime throttles from
before boot are not events), and a reading lower than the last (group recreated)
re-bases instead of producing negative events.

Theory of operation. `observe` turns a reading into a delta, appends it to the
trailing window, classifies the window as one of the EVENTS, and looks the
(posture, event) pair up in TRANSITIONS; a missing pair is illegal and raises
PostureError. Everything here is a pure function of (state, policy, input, now);
`PostureOwner` is the thin mutable shell that holds the live state and policy,
swaps the policy on retune and logs.
"""
from __future__ import annotations

import logging

from admission.records import fields, record, replace
from fleet.rules import cordon
from fleet.rules.errors import EXIT_CONFIG, EXIT_USAGE, FleetError
from fleet.rules.ranges import posture_range
from fleet.rules.vocab import (
    CAUSE_CODES,
    CAUSE_NONE,
    CAUSE_THROTTLE_DUTY,
    CAUSE_THROTTLE_EVENTS,
    CORDONED,
    HELD_CAUSES,
    NOMINAL,
    POSTURE_KEYS,
    POSTURE_NAMES,
    Cause,
    PostureKey,
)
from fleet.rules.vocab import STICKY_CAUSES as STICKY_CAUSES  # re-exported

log = logging.getLogger(__name__)

# --- events the classifier feeds the table --------------------------------------
TRIPPED = "tripped"  # an enter condition holds
UNSETTLED = "unsettled"  # no trip, but not clean long enough (or a cause holds)
SETTLED = "settled"  # clean for the exit window, no cause held
HOLD = "hold"  # a sticky cause was raised
RELEASE = "release"  # a sticky cause was cleared
EVENTS = (TRIPPED, UNSETTLED, SETTLED, HOLD, RELEASE)

# --- causes (fleet.rules.vocab): sticky ones are held until an operator releases them ---
LANE_DEATH = Cause.LANE_DEATH
OPERATOR = Cause.OPERATOR
# Held causes that their own input releases (never an operator): CPU and memory pressure
# on the fleet's own cgroup2 group (fleet.rules.pressure).
CPU_PRESSURE = Cause.CPU_PRESSURE
MEMORY_PRESSURE = Cause.MEMORY_PRESSURE
#: Every cause a posture may hold.
CAUSES = HELD_CAUSES

# --- the table: (posture, event) -> next posture ----------------------------------
TRANSITIONS = {
    (NOMINAL, TRIPPED): CORDONED,
    (NOMINAL, UNSETTLED): NOMINAL,
    (NOMINAL, SETTLED): NOMINAL,
    (NOMINAL, HOLD): CORDONED,
    (CORDONED, TRIPPED): CORDONED,
    (CORDONED, UNSETTLED): CORDONED,
    (CORDONED, SETTLED): NOMINAL,
    (CORDONED, HOLD): CORDONED,
    (CORDONED, RELEASE): CORDONED,
}


class PostureError(FleetError):
    """An illegal (posture, event) pair: a bug in the caller, never bad input."""


class PostureCauseError(FleetError, ValueError):
    """A cause name outside the vocabulary (bad input: nothing changes)."""

    exit_code = EXIT_USAGE

    def __init__(self, cause, vocabulary=STICKY_CAUSES):
        self.cause = cause
        super().__init__(f"unknown posture cause {cause!r}; causes: {', '.join(vocabulary)}")


def check_cause(cause, vocabulary=STICKY_CAUSES) -> str:
    """`cause` if it is in `vocabulary` (by default the causes an operator may hold and
    release), else PostureCauseError."""
    if not isinstance(cause, str) or cause not in vocabulary:
        raise PostureCauseError(cause, vocabulary)
    return cause


class PostureRetuneError(FleetError, ValueError):
    """A posture policy patch was rejected; `problems` maps each bad key to why."""

    exit_code = EXIT_CONFIG

    def __init__(self, problems: dict):
        self.problems = dict(problems)
        super().__init__("; ".join(f"{k}: {v}" for k, v in self.problems.items()))


# --- policy and its validation ------------------------------------------------------


@record
class PosturePolicy:
    """The six tunable keys. `cordon_sim_intake_floor` None means half the slot cap."""

    cordon_enter_events: int = 2
    cordon_enter_window_ms: int = 1000
    cordon_duty_percent: float = 2.0
    cordon_duty_window_ms: int = 5000
    cordon_exit_clean_ms: int = 10000
    cordon_sim_intake_floor: int | None = None

    def __post_init__(self):
        problems = {f.name: why for f in fields(self) if (why := _problem(f.name, getattr(self, f.name)))}
        if problems:
            raise PostureRetuneError(problems)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def intake_floor(self, slot_cap: int) -> int:
        """Most new leases a `floor` role may hold under cordon (fleet.rules.cordon.intake_floor)."""
        return cordon.intake_floor(self.cordon_sim_intake_floor, slot_cap)


#: The policy's keys, in its fields' order (the vocabulary's; tests hold the fields to it).
POLICY_KEYS = POSTURE_KEYS
assert tuple(f.name for f in fields(PosturePolicy)) == POLICY_KEYS, "PosturePolicy's fields drifted from vocab"


def _problem(key: str, value) -> str | None:
    """Why `value` is not acceptable for `key` (None: it is). Never adjusts the value.

    The ranges are fleet.rules.ranges' (the table keeps each threshold in a 64-bit word and the
    duty in millionths, so a value past its range would be stored wrapped or as 0)."""
    if not isinstance(key, str) or key not in POLICY_KEYS:
        return "unknown key; keys: " + ", ".join(POLICY_KEYS)
    if key == PostureKey.INTAKE_FLOOR and value is None:
        return None  # half the slot cap
    return posture_range(key).problem(value)


def validate_patch(policy: PosturePolicy, patch) -> PosturePolicy:
    """The policy with `patch` applied, or PostureRetuneError naming every bad key.

    A patch is a non-empty mapping over POLICY_KEYS; absent keys keep their live value
    and ``cordon_sim_intake_floor: None`` restores half the slot cap. Values are
    rejected, never clamped.
    """
    if not isinstance(patch, dict) or not patch:
        raise PostureRetuneError({"patch": "must be a non-empty mapping of posture keys"})
    problems = {str(k): why for k, v in patch.items() if (why := _problem(k, v))}
    if problems:
        raise PostureRetuneError(problems)
    return replace(policy, **patch)


DEFAULT_POLICY = PosturePolicy()


# --- state and the pure rules ------------------------------------------------------------


@record
class Delta:
    """Throttling seen between two readings, stamped with the later one's time."""

    at_ms: int
    events: int
    throttled_ns: int

    @property
    def clean(self) -> bool:
        return self.events == 0 and self.throttled_ns == 0


@record
class PostureState:
    """Everything the posture rules remember. Build the first one with `initial`."""

    posture: int
    since_ms: int
    clean_since_ms: int
    window: tuple[Delta, ...] = ()
    last: tuple[int, int] | None = None
    causes: frozenset = frozenset()
    enter_count: int = 0
    exit_count: int = 0
    dwell_ms: int = 0  # completed cordoned time; see `cordoned_dwell_ms`


@record
class Transition:
    """A posture change: from, to, when, the rule that fired (for people) and its cause
    (a code of fleet.rules.vocab.POSTURE_CAUSES, for the table; none when it leaves Cordoned)."""

    old: int
    new: int
    at_ms: int
    reason: str
    cause: int = CAUSE_NONE

    def __str__(self):
        return f"{POSTURE_NAMES[self.old]} -> {POSTURE_NAMES[self.new]} at {self.at_ms} ms: {self.reason}"


def initial(now_ms: int) -> PostureState:
    """A Nominal posture whose clean clock starts at `now_ms`."""
    return PostureState(NOMINAL, now_ms, now_ms)


def _delta(state: PostureState, now_ms, nr_throttled, throttled_ns) -> Delta | None:
    if state.last is None:
        return None
    d_events, d_ns = nr_throttled - state.last[0], throttled_ns - state.last[1]
    if d_events < 0 or d_ns < 0:
        return None  # counters went back: the group was recreated; re-base
    return Delta(now_ms, d_events, d_ns)


def _trim(window, policy, now_ms):
    horizon = now_ms - max(policy.cordon_enter_window_ms, policy.cordon_duty_window_ms)
    return tuple(d for d in window if d.at_ms > horizon)


def window_figures(window, policy: PosturePolicy, now_ms: int) -> tuple[int, float]:
    """(events in the enter window, duty percent over the duty window)."""
    events = sum(d.events for d in window if d.at_ms > now_ms - policy.cordon_enter_window_ms)
    throttled = sum(d.throttled_ns for d in window if d.at_ms > now_ms - policy.cordon_duty_window_ms)
    return events, 100.0 * throttled / (policy.cordon_duty_window_ms * 1_000_000)


def classify(state: PostureState, policy: PosturePolicy, now_ms: int) -> tuple[str, int, str]:
    """(event, cause code, reason) for the current window and clean clock."""
    events, duty = window_figures(state.window, policy, now_ms)
    if events >= policy.cordon_enter_events:
        limit, span = policy.cordon_enter_events, policy.cordon_enter_window_ms
        return TRIPPED, CAUSE_THROTTLE_EVENTS, f"{events} throttled periods >= {limit} in {span} ms"
    if duty > policy.cordon_duty_percent:
        limit, span = policy.cordon_duty_percent, policy.cordon_duty_window_ms
        return TRIPPED, CAUSE_THROTTLE_DUTY, f"throttled duty {duty:.2f}% > {limit}% over {span} ms"
    clean_for = now_ms - state.clean_since_ms
    if state.causes or clean_for < policy.cordon_exit_clean_ms:
        why = "held by " + ",".join(sorted(state.causes)) if state.causes else "not clean long enough"
        return UNSETTLED, CAUSE_NONE, why
    return SETTLED, CAUSE_NONE, f"clean for {clean_for} ms >= {policy.cordon_exit_clean_ms} ms"


def _apply(state: PostureState, event: str, reason: str, now_ms: int, cause: int = CAUSE_NONE):
    """Look (posture, event) up in the table and account for a change."""
    nxt = TRANSITIONS.get((state.posture, event))
    if nxt is None:
        raise PostureError(f"illegal posture event {event!r} in {POSTURE_NAMES[state.posture]}")
    old = state.posture
    if nxt == old:
        return state, None
    if nxt == CORDONED:
        state = replace(state, posture=nxt, since_ms=now_ms, clean_since_ms=now_ms, enter_count=state.enter_count + 1)
    else:
        dwell = state.dwell_ms + (now_ms - state.since_ms)
        state = replace(state, posture=nxt, since_ms=now_ms, exit_count=state.exit_count + 1, dwell_ms=dwell)
    return state, Transition(old, nxt, now_ms, reason, cause if nxt == CORDONED else CAUSE_NONE)


def observe(state: PostureState, policy: PosturePolicy, now_ms: int, nr_throttled: int, throttled_ns: int):
    """Feed one cumulative cpu.stat reading. Returns (state, Transition or None)."""
    delta = _delta(state, now_ms, nr_throttled, throttled_ns)
    window = state.window + ((delta,) if delta is not None else ())
    clean_since = state.clean_since_ms if delta is None or delta.clean else now_ms
    state = replace(
        state, window=_trim(window, policy, now_ms), last=(nr_throttled, throttled_ns), clean_since_ms=clean_since
    )
    event, cause, reason = classify(state, policy, now_ms)
    return _apply(state, event, reason, now_ms, cause)


def hold(state: PostureState, cause: str, now_ms: int):
    """Raise a sticky cause: cordon now and stay until it is released."""
    state = replace(state, causes=state.causes | {check_cause(cause, CAUSES)})
    return _apply(state, HOLD, f"held by {cause}", now_ms, CAUSE_CODES[cause])


def release(state: PostureState, cause: str, now_ms: int):
    """Clear a sticky cause; the clean clock restarts. Clearing an absent cause changes
    nothing; an unknown one raises PostureCauseError."""
    if check_cause(cause, CAUSES) not in state.causes:
        return state, None
    state = replace(state, causes=state.causes - {cause}, clean_since_ms=now_ms)
    return _apply(state, RELEASE, f"released {cause}", now_ms)


def cause_code(state: PostureState, change: Transition | None) -> int:
    """The code (fleet.rules.vocab.POSTURE_CAUSES) of what holds the posture now: a held
    cause, the earliest of HELD_CAUSES first; none when Nominal; otherwise (released,
    or throttled, and still in the exit window) the cause of `change`, the transition
    that cordoned it (throttle events if there was none)."""
    for cause in HELD_CAUSES:
        if cause in state.causes:
            return CAUSE_CODES[cause]
    if state.posture != CORDONED:
        return CAUSE_NONE
    return change.cause if change is not None else CAUSE_THROTTLE_EVENTS


def cordoned_dwell_ms(state: PostureState, now_ms: int) -> int:
    """Total time spent Cordoned, including the current stay."""
    return state.dwell_ms + (now_ms - state.since_ms if state.posture == CORDONED else 0)


def describe(state: PostureState, policy: PosturePolicy, now_ms: int) -> dict:
    """The effective policy, the posture and its counters, as plain data."""
    events, duty = window_figures(state.window, policy, now_ms)
    return {
        "posture": POSTURE_NAMES[state.posture],
        "policy": policy.to_dict(),
        "since_ms": state.since_ms,
        "causes": sorted(state.causes),
        "enter_count": state.enter_count,
        "exit_count": state.exit_count,
        "cordoned_dwell_ms": cordoned_dwell_ms(state, now_ms),
        "window_events": events,
        "window_duty_percent": round(duty, 4),
    }


# --- the thin shell --------------------------------------------------------------------


class PostureOwner:
    """Holds the live posture and policy; the one place they change.

    One thread owns it (a fleet's: the supervisor's loop, which takes the readings
    (`observe`), the operator's holds, releases and retunes alike), so it takes no lock.
    """

    def __init__(self, policy: PosturePolicy = DEFAULT_POLICY, now_ms: int = 0, logger=log):
        self._policy = policy
        self._state = initial(now_ms)
        self._log = logger

    @property
    def policy(self) -> PosturePolicy:
        return self._policy

    @property
    def state(self) -> PostureState:
        return self._state

    @property
    def posture(self) -> int:
        return self._state.posture

    def observe(self, now_ms: int, nr_throttled: int, throttled_ns: int) -> Transition | None:
        """Feed one reading; log and return the transition, if any."""
        self._state, change = observe(self._state, self._policy, now_ms, nr_throttled, throttled_ns)
        return self._report(change)

    def hold(self, cause: str, now_ms: int) -> Transition | None:
        self._state, change = hold(self._state, cause, now_ms)
        return self._report(change)

    def release(self, cause: str, now_ms: int) -> Transition | None:
        self._state, change = release(self._state, cause, now_ms)
        return self._report(change)

    def retune(self, patch, now_ms: int) -> dict:
        """Apply a partial policy patch; keeps posture and window; returns `describe`.

        Raises PostureRetuneError (nothing changes) for an empty patch, an unknown
        key or a bad value. Logs one warning line listing old -> new per changed key.
        """
        new = validate_patch(self._policy, patch)
        old, self._policy = self._policy, new
        view = describe(self._state, new, now_ms)
        changed = [
            f"{k} {getattr(old, k)!r} -> {getattr(new, k)!r}" for k in POLICY_KEYS if getattr(old, k) != getattr(new, k)
        ]
        if changed:
            self._log.warning("[fleet-posture] operator retune: %s", "; ".join(changed))
        return view

    def show(self, now_ms: int) -> dict:
        return describe(self._state, self._policy, now_ms)

    def _report(self, change: Transition | None) -> Transition | None:
        if change is not None:
            self._log.warning("[fleet-posture] %s", change)
        return change
