"""Byte layout of the shared-memory table, and the slot word's bit fields.

The table is one POSIX shared-memory segment:

    header      256 B   identity (magic, version, boot id, creator), sizes, region offsets, name
    posture     128 B   posture word + its seqlocked record, then the six live thresholds
    ledger      256 B   outcome counters in units (seqlocked), failures by reason, the counters in items
    roles       128 B each: kind, cordon class, bounds, queue depth, in-use count, name, saturation
    slots       128 B each: the slot word, a seqlocked record (unit, pid, cpu set, binding),
                          then the role census (the role it last served, its role switches)
    bulkheads   192 B each: the provider admission's per-pool counters and the pool's name
    meta         32 KiB   JSON written once before the table is published: the plan,
                          the budget, the seats (what `fleetctl status` shows beside the live state)

Every record starts on a 64-byte boundary so that two processes hammering different
records never share a cache line. All fields are little-endian 64-bit words unless a
name says otherwise; a region is viewed as a flat uint64 array and a field is
``base + record * STRIDE + FIELD``.

The slot word (64 bits) is the slot's whole FSM state, changed only by CAS:

    bits  0..3   state      (fleet.rules.fsm: Idle, Leased, Running, Pinned, Draining)
    bits  4..11  role       (index into the roles region)
    bits 12..35  key        (pin key; 0 when the role takes none)
    bits 36..63  generation (bumped by every accepted transition, wraps at 2**28)

This module is pure: constants and arithmetic, no numba, no shared memory.
"""
from __future__ import annotations


from fleet.rules import vocab
from fleet.shm.header import HeaderLayout
# The table's capacity and a slot-event row's width are agreed with the rules above the table.
from fleet.rules.limits import MAX_BULKHEADS, MAX_ROLES, MAX_SLOTS, OP_FIELDS  # noqa: F401

MAGIC = int.from_bytes(b"FLEETTBL", "little")
#: 2: bulkhead records grew to 3 lines; 3: the ledger record grew a line (more failure reasons,
#: FSM refusals); 4: slot records grew a line (the role census: last role, switches) and role
#: records count elastic re-pins; 5: the ledger record grew a line (the counters in items).
LAYOUT_VERSION = 5
LINE = 64  # cache line: the unit of alignment for every record

# --- slot word ------------------------------------------------------------------
STATE_BITS, ROLE_BITS, KEY_BITS, GEN_BITS = 4, 8, 24, 28
ROLE_SHIFT = STATE_BITS
KEY_SHIFT = ROLE_SHIFT + ROLE_BITS
GEN_SHIFT = KEY_SHIFT + KEY_BITS
STATE_MASK = (1 << STATE_BITS) - 1
ROLE_MASK = (1 << ROLE_BITS) - 1
KEY_MASK = (1 << KEY_BITS) - 1
GEN_MASK = (1 << GEN_BITS) - 1
assert GEN_SHIFT + GEN_BITS == 64


def pack_word(state: int, role: int, key: int, gen: int) -> int:
    """The slot word for (state, role, key, generation); generation wraps."""
    return (
        (state & STATE_MASK)
        | ((role & ROLE_MASK) << ROLE_SHIFT)
        | ((key & KEY_MASK) << KEY_SHIFT)
        | ((gen & GEN_MASK) << GEN_SHIFT)
    )


def unpack_word(word: int) -> tuple[int, int, int, int]:
    """(state, role, key, generation) of a slot word."""
    word = int(word)
    return (
        word & STATE_MASK,
        (word >> ROLE_SHIFT) & ROLE_MASK,
        (word >> KEY_SHIFT) & KEY_MASK,
        (word >> GEN_SHIFT) & GEN_MASK,
    )


# --- header (256 bytes) ------------------------------------------------------------
HEADER_SIZE = 256
#: (name, struct code) in order; little-endian, no implicit padding.
HEADER_FIELDS = (
    ("magic", "Q"),  # written last by the creator: a set magic means "initialised"
    ("version", "I"),
    ("header_size", "I"),
    ("total_size", "Q"),
    ("boot_id", "16s"),
    ("creator_pid", "q"),
    ("creator_start", "Q"),  # /proc/<pid>/stat start time: tells pid reuse apart
    ("created_ns", "Q"),  # CLOCK_REALTIME ns
    ("n_slots", "I"),
    ("n_roles", "I"),
    ("n_bulkheads", "I"),
    ("flags", "I"),
    ("posture_off", "Q"),
    ("ledger_off", "Q"),
    ("roles_off", "Q"),
    ("slots_off", "Q"),
    ("bulkheads_off", "Q"),
    ("name", "64s"),
    ("meta_len", "I"),  # bytes of JSON in the meta region
    ("_pad0", "4x"),
    ("meta_off", "Q"),
    # CLOCK_REALTIME ns a drain began, 0: not draining (the loop's door holds the drain;
    # this is its copy for readers). Once header padding, 0 in every older table: same version.
    ("draining_since_ns", "Q"),
)


#: The table header's fields and offsets (fleet.shm.header): ``HEADER.view(mm)`` reads
#: ``h["n_slots"]`` as an int (bytes for boot_id and name) and writes ``h["flags"] = 1``
#: through to the mapping, no numpy.
HEADER = HeaderLayout(HEADER_FIELDS, HEADER_SIZE)


FLAG_CLOSING = 1  # the owner is shutting down; take nothing new

# --- posture record (2 lines, u64 fields) ------------------------------------------
POSTURE_SIZE = 2 * LINE
P_STATE = 0  # posture word (fleet.rules.fsm.NOMINAL / CORDONED), read by the kernels
P_SEQ = 1  # seqlock over fields 2..15
P_CAUSE = 2
P_SINCE_NS = 3  # CLOCK_MONOTONIC ns of the last change
P_ENTER_COUNT = 4
P_EXIT_COUNT = 5
P_CORDONED_NS = 6  # total time spent Cordoned before the current dwell
P_SUPPRESSED = 7  # intake refused or deferred by posture
# second line: the live thresholds (ints, except duty stored as duty * 1e6)
P_ENTER_EVENTS = 8
P_ENTER_WINDOW_MS = 9
P_DUTY_PPM = 10  # cordon_duty_percent * 10_000 (parts per million of time)
P_DUTY_WINDOW_MS = 11
P_EXIT_CLEAN_MS = 12
P_INTAKE_FLOOR = 13  # 0 = unset (half the slot cap)
P_EPOCH = 14  # quota epoch: 0 at boot, +1 at every change of the quota the plan uses
P_QUOTA_UCPU = 15  # the quota last detected, in millionths of a CPU (0: not detected yet)
POSTURE_CAUSES = vocab.POSTURE_CAUSES  # P_CAUSE holds an index into it

# --- ledger record (4 lines) ---------------------------------------------------------
LEDGER_SIZE = 4 * LINE
L_SEQ = 0
L_SUBMITTED = 1
L_SOLVED = 2
L_SUPPRESSED = 3
L_FAILED = 4
L_INFLIGHT = 5
L_FSM_REFUSED = 6  # transitions the slot FSM refused the runtime (grants, starts, completions, resets)
L_STRAY_RESULTS = 7  # messages from workers that were no owed unit's outcome, dropped (fleet.runtime.results)
L_FAILED_BY_REASON = 8  # second and third lines: counters by fleet failure reason code
N_FAILURE_REASONS = vocab.N_FAILURE_REASONS  # one counter per fleet.rules.vocab.FAILURE_REASONS code
#: Fourth line: submitted, solved, suppressed, failed, in flight again, counted in items (a
#: unit is one submit, or one chunk of a map of many items; fleet.rules.ledger.ITEM_COUNTS).
L_ITEMS = 24
N_ITEM_COUNTS = 5
#: Then the workers that left outside a unit's outcome: killed by the kernel's OOM killer
#: (fleet.rules.oom), recycled over their role's max_rss_mib. Same writer and seqlock; 0 in
#: a table of a fleet that never counted them (the words were padding): same version.
L_OOM_KILLS = 29
L_RECYCLES = 30
#: The last word: units submitted from inside running units (children, fleet.runtime.inside);
#: padding before, so 0 in an older fleet's table: same version.
L_CHILDREN = 31
assert L_FAILED_BY_REASON + N_FAILURE_REASONS <= L_ITEMS, "room for 16 reasons: grow the ledger record"
assert L_ITEMS + N_ITEM_COUNTS <= L_OOM_KILLS and L_CHILDREN < LEDGER_SIZE // 8

# --- role records (2 lines each) -------------------------------------------------------
ROLE_SIZE = 2 * LINE
R_KIND = 0
R_CLASS = 1
R_QUEUE_BOUND = 2
R_QUEUE_DEPTH = 3
R_SLOT_CAP = 4
R_IN_USE = 5
R_SEQ = 6
R_REPINS = 7  # elastic re-pins (T9 then T1 on demand, `elastic_repin`); same writer and seqlock as the rest
R_NAME_BYTE = LINE  # second line: the name, NUL-padded, 32 bytes
ROLE_NAME_BYTES = 32
# Second line, after the name: the role's saturation reading (fleet.rules.saturation; 002 §13
# "named and metered through the census's logical rows"), same writer and seqlock.
R_SATURATION = 12  # bit 0: saturated now; bits 1..: episodes raised so far
R_ARRIVAL_MRATE = 13  # arrival rate over the window, in thousandths of a unit per second
R_SERVICE_MRATE = 14  # service rate (grants) over the window, thousandths of a unit per second
R_PINNED_MCORES = 15  # cores the pinned tier's budget gives the role (declared peak), thousandths; 0: none
assert R_PINNED_MCORES < ROLE_SIZE // 8 and R_SATURATION * 8 >= R_NAME_BYTE + ROLE_NAME_BYTES

# --- slot records (2 lines each) ---------------------------------------------------------

SLOT_SIZE = 2 * LINE
S_WORD = 0  # the FSM word; CAS only
S_SEQ = 1  # seqlock over fields 3..6 (one writer: the supervisor)
S_UNIT = 2  # unit id the slot runs or last ran (one atomic word; its writer: the worker)
S_PID = 3  # worker pid serving the slot (0: none)
S_CPUS_LO = 4  # cpu set bitmask, cpus 0..63
S_CPUS_HI = 5  # cpus 64..127
S_BINDING = 6  # 0 pinned, 1 shared, 2 logical
S_DONE = 7  # units completed on this slot (atomic add)
# second line: the role census, written by the LEASE (T1) kernel only, i.e. by the one
# process that leases slots (the supervisor).
S_LAST_ROLE = 8  # role code + 1 of the role the slot was last leased to (0: never leased)
S_SWITCHES = 9  # leases for a role other than the one before (role switches)
#: Children that rode this slot while its parent waited (fleet.rules.dispatch "Children"):
#: atomic add by the supervisor's loop; padding before, so 0 in an older table: same version.
S_RIDES = 10
#: The seat's contention (fleet.rules.contention), on each of its slots: bit 0 set while
#: its worker is found waiting for its CPUs (and widened to its share's CPUs where it has
#: others); bits 1..: times it was found so. Written under S_SEQ by the loop; padding
#: before, so 0 in an older table: same version.
S_CONTENTION = 11
BINDINGS = ("pinned", "shared", "logical")

# --- bulkhead records (3 lines each; packed by fleet.shm.table.bulkheads) -----------------------
BULKHEAD_SIZE = 3 * LINE
B_STATE = 0  # 0: record unused; else state code | daily-limit flag << 8
B_SEQ = 1  # seqlock over the whole record (one writer: the supervisor)
B_INFLIGHT = 2  # units running on the pool
B_SUCCESSES = 3
B_FAILURES = 4
B_CLOSED_UNTIL_NS = 5  # CLOCK_REALTIME ns (0: not closed)
B_BACKOFF_UNTIL_NS = 6  # CLOCK_REALTIME ns (0: not backing off)
B_WAITING = 7
B_DELEGATED = 8  # second line
B_REFUSALS = 9  # consecutive
B_CAUSE = 10  # closure cause code
B_CARRYING = 11  # the load at the last refusal
B_ESTIMATE = 12  # shown only
B_MEAN_US = 13  # mean round time, µs
B_MEAN_COST_NUSD = 14  # mean cost, nano-USD
B_PROBES = 15
B_NAME_BYTE = 2 * LINE  # third line: the pool name, 64 bytes
BULKHEAD_NAME_BYTES = LINE

U64 = 8  # bytes per field
META_SIZE = 32 * 1024


def _align(n: int) -> int:
    return (n + LINE - 1) // LINE * LINE


def region_offsets(n_slots: int, n_roles: int, n_bulkheads: int) -> dict[str, int]:
    """Byte offsets of each region, and `total_size`; every region starts on a line."""
    off = HEADER_SIZE
    out = {"posture_off": off}
    off += POSTURE_SIZE
    out["ledger_off"] = off
    off += LEDGER_SIZE
    out["roles_off"] = off
    off += _align(n_roles * ROLE_SIZE)
    out["slots_off"] = off
    off += _align(n_slots * SLOT_SIZE)
    out["bulkheads_off"] = off
    off += _align(n_bulkheads * BULKHEAD_SIZE)
    out["meta_off"] = off
    off += META_SIZE
    out["total_size"] = off
    return out

