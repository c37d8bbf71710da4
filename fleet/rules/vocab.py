"""Fleet's vocabularies, each written once: outcomes and failure reasons, postures and their
causes, cordon classes, posture keys, and (re-exported) the lease store's request states.

A word here is read by more than one room and often by more than one process: a code is
stored in the shared table or counted in the ledger, a name is shown by ``fleetctl``,
sent over the control socket or kept in the lease store. So codes are wire and ABI:
append, never renumber. Every other module spells a word of these vocabularies through
the names below, never as a string literal of its own (tests/rules/test_vocab.py), and
no decision is taken by reading a human message: what a rule needs to know travels as
one of these words or codes.

This module imports nothing of fleet: the table, the metrics exporter and ``fleetctl
status`` read it without pulling in the runtime.
"""
from admission import vocab as lease_states  # noqa: F401 - the store's request states, re-exported
# The provider admission's words, re-exported: a bulkhead's state and a closure's cause.
from admission.vocab import BULKHEAD_STATES, CLOSURE_CAUSES, BulkheadState, ClosureCause  # noqa: F401, E402

# --- outcomes: every unit ends with exactly one ------------------------------------
SOLVED = "solved"
SUPPRESSED = "suppressed"
FAILED = "failed"
OUTCOME_KINDS = (SOLVED, SUPPRESSED, FAILED)


# --- failure reasons ------------------------------------------------------------------
class Reason:
    """The name of each failure reason, as a unit's outcome carries it."""

    HANDLER_ERROR = "HandlerError"
    TIMEOUT = "Timeout"
    LANE_DEATH = "LaneDeath"
    SHUTDOWN = "Shutdown"
    REFUSED = "Refused"
    ROLE_STOPPED = "RoleStopped"
    RESULT_ERROR = "ResultError"
    CANCELLED = "Cancelled"
    FSM_REFUSED = "FsmRefused"
    LEASE_EXPIRED = "LeaseExpired"
    LEASE_DENIED = "LeaseDenied"
    LEASE_PREEMPTED = "LeasePreempted"


# A reason's code is its index in FAILURE_REASONS: the table's ledger record keeps one
# counter per code (``failed_by_reason``), so the order is the wire order.
HANDLER_ERROR = 0  # the handler raised, or the worker could not unpickle its payload (the traceback travels)
TIMEOUT = 1  # the unit ran past its timeout
LANE_DEATH = 2  # the worker serving the unit died mid-unit
SHUTDOWN = 3  # the fleet stopped before the unit ran (queued past the drain grace)
# its handler raised a provider's refusal (fleet.Refused: 429/402/403) with no waits left (past its
# lane's limit, or no route to wait on); a full queue is never this outcome: submit raises QueueFull
REFUSED = 4
ROLE_STOPPED = 5  # its role was stopped (restart intensity exceeded)
RESULT_ERROR = 6  # the result could not be returned (not picklable, too large, not unpicklable here)
CANCELLED = 7  # the caller cancelled it before it ran
FSM_REFUSED = 8  # a slot refused its grant, start or completion: a broken FSM rule, never a death
# Its host-group lease ended before its outcome (fleet.runtime.lease_gate): ran out unrenewed, timed out
# in the queue, or was cancelled or released by another. Code 9 was named LeaseLost and
# covered the two below as well; readers older than them show 10 and 11 as ?10 and ?11.
LEASE_EXPIRED = 9
LEASE_DENIED = 10  # the host group's policy refuses its request (not retryable)
LEASE_PREEMPTED = 11  # a higher-priority request displaced its preemptible lease

FAILURE_REASONS = (
    Reason.HANDLER_ERROR,
    Reason.TIMEOUT,
    Reason.LANE_DEATH,
    Reason.SHUTDOWN,
    Reason.REFUSED,
    Reason.ROLE_STOPPED,
    Reason.RESULT_ERROR,
    Reason.CANCELLED,
    Reason.FSM_REFUSED,
    Reason.LEASE_EXPIRED,
    Reason.LEASE_DENIED,
    Reason.LEASE_PREEMPTED,
)
N_FAILURE_REASONS = len(FAILURE_REASONS)
REASON_CODES = {name: code for code, name in enumerate(FAILURE_REASONS)}

#: The failure reason of a unit whose lease request ended in a store state before its outcome;
#: any state not named here (timed out, cancelled, released by another) is LeaseExpired.
LEASE_LOST_REASONS = {lease_states.DENIED: Reason.LEASE_DENIED, lease_states.PREEMPTED: Reason.LEASE_PREEMPTED}

# --- postures ---------------------------------------------------------------------------
NOMINAL = 0
CORDONED = 1
POSTURE_NAMES = ("Nominal", "Cordoned")


# --- posture causes ---------------------------------------------------------------------
class Cause:
    """The name of each posture cause (what an operator types, what `fleetctl status` shows)."""

    NONE = "none"  # Nominal: nothing holds the posture
    THROTTLE_EVENTS = "throttle-events"  # too many throttled CFS periods in the enter window
    THROTTLE_DUTY = "throttle-duty"  # throttled duty over the limit in the duty window
    LANE_DEATH = "lane-death"  # a worker (a lane) died; its owed units failed LaneDeath
    OPERATOR = "operator"  # an operator's manual cordon
    CPU_PRESSURE = "cpu-pressure"  # CPU pressure (PSI) on the fleet's own cgroup2 group
    MEMORY_PRESSURE = "memory-pressure"  # memory pressure (PSI) on the fleet's own cgroup2 group


# A cause's code is its index in POSTURE_CAUSES: the table's posture record stores it
# (`fleet.shm.table.layout.P_CAUSE`), so the order is the wire order.
CAUSE_NONE = 0
CAUSE_THROTTLE_EVENTS = 1
CAUSE_THROTTLE_DUTY = 2
CAUSE_LANE_DEATH = 3
CAUSE_OPERATOR = 4
CAUSE_CPU_PRESSURE = 5
CAUSE_MEMORY_PRESSURE = 6
POSTURE_CAUSES = (
    Cause.NONE,
    Cause.THROTTLE_EVENTS,
    Cause.THROTTLE_DUTY,
    Cause.LANE_DEATH,
    Cause.OPERATOR,
    Cause.CPU_PRESSURE,
    Cause.MEMORY_PRESSURE,
)
CAUSE_CODES = {name: code for code, name in enumerate(POSTURE_CAUSES)}

#: Held until an operator releases them (``fleetctl posture release CAUSE``).
STICKY_CAUSES = (Cause.LANE_DEATH, Cause.OPERATOR)
#: Every cause a posture may hold; CPU and memory pressure are released by their own input,
#: never an operator.
HELD_CAUSES = STICKY_CAUSES + (Cause.CPU_PRESSURE, Cause.MEMORY_PRESSURE)


def cause_name(code: int) -> str:
    """The name of posture cause ``code``; ``"?<code>"`` for a code this version does not know."""
    return POSTURE_CAUSES[code] if 0 <= code < len(POSTURE_CAUSES) else f"?{code}"


# --- cordon classes: what cordon does to a role's intake (fleet.rules.cordon) -----------
class CordonClass:
    """The name of each cordon class, as a role declares it."""

    NEVER = "never"  # never shed
    FLOOR = "floor"  # intake floored under cordon
    DEFERRABLE = "deferrable"  # takes nothing new under cordon


# A class's code is its index in CLASS_NAMES: the table's role record stores it (`R_CLASS`).
CLASS_NEVER = 0
CLASS_FLOOR = 1
CLASS_DEFERRABLE = 2
CLASS_NAMES = (CordonClass.NEVER, CordonClass.FLOOR, CordonClass.DEFERRABLE)
CLASS_CODES = {name: code for code, name in enumerate(CLASS_NAMES)}


# --- posture keys: the tunable thresholds (fleet.rules.posture.PosturePolicy) -----------
class PostureKey:
    """The name of each posture threshold, as the config, a retune patch and the status spell it."""

    ENTER_EVENTS = "cordon_enter_events"
    ENTER_WINDOW_MS = "cordon_enter_window_ms"
    DUTY_PERCENT = "cordon_duty_percent"
    DUTY_WINDOW_MS = "cordon_duty_window_ms"
    EXIT_CLEAN_MS = "cordon_exit_clean_ms"
    INTAKE_FLOOR = "cordon_sim_intake_floor"


POSTURE_KEYS = (
    PostureKey.ENTER_EVENTS,
    PostureKey.ENTER_WINDOW_MS,
    PostureKey.DUTY_PERCENT,
    PostureKey.DUTY_WINDOW_MS,
    PostureKey.EXIT_CLEAN_MS,
    PostureKey.INTAKE_FLOOR,
)
