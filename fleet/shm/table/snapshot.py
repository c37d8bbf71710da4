"""Lock-free, consistent, read-only copies of the shared table.

Readers never take a lock and never write. Each record with a seqlock is read as:
sequence (acquire), fields, fence, sequence again; a record whose sequence was odd or
moved is read again (a writer was in the middle of it). Slot words are also whole
64-bit atomic words on their own. The copy runs in C (fleet._native), because the
read must fit between two writes of a busy writer.

This module needs neither numba nor numpy: `fleetctl status` reads a table with the
interpreter, posix_ipc and the cffi module alone. The numpy array views of a
snapshot (`slots`, `roles`, ...) import numpy when first asked for.
"""
from __future__ import annotations

from fleet.rules import fsm, vocab
from fleet.rules.ledger import ITEM_COUNTS
from fleet.rules.vocab import PostureKey as K
from fleet._native import ffi as _ffi
from fleet._native import lib as _lib
from fleet.shm.table import layout as L
from fleet.shm.table.segment import Segment, read_meta

SLOT_FIELDS = L.SLOT_SIZE // L.U64
ROLE_FIELDS = L.ROLE_SIZE // L.U64
#: Spins per record before yielding the CPU to a writer that may be preempted mid-write.
SPINS = 1_000
#: How long a record may stay mid-write before it is reported torn (its writer died).
TORN_TIMEOUT_NS = 50_000_000


class TableSnapshot:
    """A consistent copy of the table at one moment (per record).

    Holds one private copy of the segment's words; the region arrays are views of
    that copy, made on first use. Holding a snapshot keeps nothing of the mapping.
    """

    __slots__ = ("_reader", "_data", "_w", "flags", "torn", "draining_since_ns")

    def __init__(self, reader: "Reader", data: bytearray, flags: int, torn: tuple[str, ...] = (),
                 draining_since_ns: int = 0):
        self._reader, self._data, self.flags = reader, data, flags
        self.draining_since_ns = draining_since_ns
        self._w = memoryview(data).cast("Q")  # the copy as 64-bit words
        #: records (e.g. "slots[3]") whose writer never finished a write while we read:
        #: their values are the last copy, possibly mixed. Empty in a healthy fleet.
        self.torn = torn

    name = property(lambda self: self._reader.name)
    boot_id = property(lambda self: self._reader.boot_id)
    creator_pid = property(lambda self: self._reader.creator_pid)
    created_ns = property(lambda self: self._reader.created_ns)
    role_names = property(lambda self: self._reader.role_names)
    #: boot metadata (plan, budget, seats), parsed once per attach
    meta = property(lambda self: self._reader.meta)
    n_slots = property(lambda self: self._reader.n_slots)

    # numpy views of the copy, for code that wants arrays (imports numpy on first use)
    #: (n_slots, 16) uint64: word, seq, unit, pid, cpus lo/hi, binding, done, last role + 1, switches
    slots = property(lambda self: self._array("slots"))
    #: (n_roles, 16) uint64
    roles = property(lambda self: self._array("roles"))
    #: (16,) uint64
    posture = property(lambda self: self._array("posture")[0])
    #: (16,) uint64
    ledger = property(lambda self: self._array("ledger")[0])
    #: (n_bulkheads, 24) uint64
    bulkheads = property(lambda self: self._array("bulkheads"))

    def _array(self, key: str):
        import numpy as np

        first, stride, count, _seq = self._reader.regions[key]
        words = np.frombuffer(self._data, dtype="<u8")
        return words[first : first + stride * count].reshape(count, stride)

    def _field(self, key: str, record: int, field: int) -> int:
        first, stride, _count, _seq = self._reader.regions[key]
        return self._w[first + record * stride + field]

    def slot(self, i: int) -> dict:
        """One slot as plain values (state and role by name)."""
        if not 0 <= i < self.n_slots:
            raise IndexError(f"slot {i} out of range [0, {self.n_slots})")
        first, stride, _count, _seq = self._reader.regions["slots"]
        base = first + i * stride
        w = self._w
        state, role, key, gen = L.unpack_word(w[base + L.S_WORD])
        cpus = w[base + L.S_CPUS_LO] | (w[base + L.S_CPUS_HI] << 64)
        binding = w[base + L.S_BINDING]
        held = state != fsm.IDLE
        known = held and role < len(self.role_names)
        # Only a pinned-kind role is keyed; the key field of any other slot means nothing.
        keyed = known and self._field("roles", role, L.R_KIND) == fsm.KIND_PINNED
        return {
            "slot": i,
            "state": fsm.STATE_NAMES[state] if state < fsm.N_STATES else f"?{state}",
            "role": self.role_names[role] if known else None,
            "key": key if keyed else None,
            "generation": gen,
            "unit": w[base + L.S_UNIT],
            "pid": w[base + L.S_PID],
            "cpus": [c for c in range(128) if cpus >> c & 1],
            "binding": L.BINDINGS[binding] if binding < len(L.BINDINGS) else "?",
            "done": w[base + L.S_DONE],
            "last_role": self._role_name(w[base + L.S_LAST_ROLE] - 1) if w[base + L.S_LAST_ROLE] else None,
            "switches": w[base + L.S_SWITCHES],
            "rides": w[base + L.S_RIDES],
            # its seat's worker waits for its CPUs now (fleet.rules.contention), and how often it was found so
            "contended": bool(w[base + L.S_CONTENTION] & 1),
            "contentions": w[base + L.S_CONTENTION] >> 1,
        }

    def _role_name(self, code: int) -> str:
        return self.role_names[code] if code < len(self.role_names) else f"?{code}"

    @property
    def n_bulkheads(self) -> int:
        return self._reader.n_bulk

    def bulkhead_words(self, i: int) -> memoryview:
        """The words of bulkhead record `i` (fleet.shm.table.bulkheads.unpack reads them)."""
        first, stride, count, _seq = self._reader.regions["bulkheads"]
        if not 0 <= i < count:
            raise IndexError(f"bulkhead {i} out of range [0, {count})")
        return self._w[first + i * stride : first + (i + 1) * stride]

    def posture_view(self) -> dict:
        p = _Record(self, "posture", 0)
        cause = int(p[L.P_CAUSE])
        return {
            "state": fsm.POSTURE_NAMES[int(p[L.P_STATE]) & 1],
            "cause": vocab.cause_name(cause),
            "since_ns": int(p[L.P_SINCE_NS]),
            "enter_count": int(p[L.P_ENTER_COUNT]),
            "exit_count": int(p[L.P_EXIT_COUNT]),
            "cordoned_ns": int(p[L.P_CORDONED_NS]),
            "suppressed": int(p[L.P_SUPPRESSED]),
            "thresholds": {
                K.ENTER_EVENTS: int(p[L.P_ENTER_EVENTS]),
                K.ENTER_WINDOW_MS: int(p[L.P_ENTER_WINDOW_MS]),
                K.DUTY_PERCENT: int(p[L.P_DUTY_PPM]) / 10_000,
                K.DUTY_WINDOW_MS: int(p[L.P_DUTY_WINDOW_MS]),
                K.EXIT_CLEAN_MS: int(p[L.P_EXIT_CLEAN_MS]),
                K.INTAKE_FLOOR: int(p[L.P_INTAKE_FLOOR]) or None,
            },
            "epoch": int(p[L.P_EPOCH]),
            "detected_cpus": int(p[L.P_QUOTA_UCPU]) / 1e6 if int(p[L.P_QUOTA_UCPU]) else None,
        }

    def ledger_view(self) -> dict:
        g = _Record(self, "ledger", 0)
        return {
            "submitted": int(g[L.L_SUBMITTED]),
            "solved": int(g[L.L_SOLVED]),
            "suppressed": int(g[L.L_SUPPRESSED]),
            "failed": int(g[L.L_FAILED]),
            "inflight": int(g[L.L_INFLIGHT]),
            "fsm_refused": int(g[L.L_FSM_REFUSED]),
            "stray_results": int(g[L.L_STRAY_RESULTS]),
            "failed_by_reason": [g[L.L_FAILED_BY_REASON + i] for i in range(L.N_FAILURE_REASONS)],
            "items": dict(zip(ITEM_COUNTS, (int(g[L.L_ITEMS + i]) for i in range(L.N_ITEM_COUNTS)))),
            "oom_kills": int(g[L.L_OOM_KILLS]),
            "worker_recycles": int(g[L.L_RECYCLES]),
            "children": int(g[L.L_CHILDREN]),
        }

    def role_view(self, code: int) -> dict:
        r = _Record(self, "roles", code)
        return {
            "name": self.role_names[code],
            "kind": fsm.KIND_NAMES[int(r[L.R_KIND])],
            "cordon_class": fsm.CLASS_NAMES[int(r[L.R_CLASS])],
            "queue_bound": int(r[L.R_QUEUE_BOUND]),
            "queue_depth": int(r[L.R_QUEUE_DEPTH]),
            "slot_cap": int(r[L.R_SLOT_CAP]),
            "in_use": int(r[L.R_IN_USE]),
            "repins": int(r[L.R_REPINS]),
            "saturation": _saturation(r),
        }


def _saturation(r) -> dict:
    """A role's saturation fields as published (fleet.rules.saturation); the status document
    adds what follows from them (fleet.shm.status.saturation)."""
    word = int(r[L.R_SATURATION])
    pinned = int(r[L.R_PINNED_MCORES])
    return {"saturated": bool(word & 1), "episodes": word >> 1,
            "arrival_rate": int(r[L.R_ARRIVAL_MRATE]) / 1000, "service_rate": int(r[L.R_SERVICE_MRATE]) / 1000,
            "pinned_cores": pinned / 1000 if pinned else None}


class _Record:
    """Fields of one record of a snapshot, by index (what the views read)."""

    __slots__ = ("_w", "_base")

    def __init__(self, snap: TableSnapshot, key: str, record: int):
        first, stride, _count, _seq = snap._reader.regions[key]
        self._w, self._base = snap._w, first + record * stride

    def __getitem__(self, field: int) -> int:
        return self._w[self._base + field]


class Reader:
    """Precomputed geometry of one mapped segment, for repeated snapshots.

    A snapshot is one call into C that copies the whole segment and re-reads every
    seqlocked record until it is consistent (see the module docstring). Role names
    and the boot metadata never change after creation, so they are read once.
    """

    def __init__(self, segment: Segment):
        h = segment.header
        self.name = bytes(h["name"]).rstrip(b"\0").decode()
        self.boot_id = bytes(h["boot_id"]).hex()
        self.creator_pid = int(h["creator_pid"])
        self.created_ns = int(h["created_ns"])
        self.header = h
        self.meta = read_meta(segment)
        self.n_slots, self.n_roles, self.n_bulk = int(h["n_slots"]), int(h["n_roles"]), int(h["n_bulkheads"])
        self.n_words = segment.size // L.U64
        w = L.U64
        bulk_fields = L.BULKHEAD_SIZE // w
        # (first word, record stride, record count, seq field) of each seqlocked region
        self.regions = {
            "slots": (int(h["slots_off"]) // w, SLOT_FIELDS, self.n_slots, L.S_SEQ),
            "roles": (int(h["roles_off"]) // w, ROLE_FIELDS, self.n_roles, L.R_SEQ),
            "posture": (int(h["posture_off"]) // w, L.POSTURE_SIZE // w, 1, L.P_SEQ),
            "ledger": (int(h["ledger_off"]) // w, L.LEDGER_SIZE // w, 1, L.L_SEQ),
            "bulkheads": (int(h["bulkheads_off"]) // w, bulk_fields, self.n_bulk, L.B_SEQ),
        }
        seq_idx, starts, strides, names = [], [], [], []
        for region, (first, stride, count, seq_field) in self.regions.items():
            for rec in range(count):
                names.append(f"{region}[{rec}]")
                seq_idx.append(first + rec * stride + seq_field)
                starts.append(first + rec * stride)
                strides.append(stride)
        self.rec_names = tuple(names)
        self.rec_start = starts
        # C does the copy: a seqlock read must fit between two writes, and Python is
        # too slow to win that race against a busy writer.
        self._src = _ffi.from_buffer("uint64_t[]", segment.mm)
        self._starts = _ffi.new("int64_t[]", starts)
        self._lens = _ffi.new("int64_t[]", strides)
        self._seqs = _ffi.new("int64_t[]", seq_idx)
        names_at = int(h["roles_off"]) + L.R_NAME_BYTE
        self.role_names = tuple(
            bytes(segment.mm[names_at + i * L.ROLE_SIZE : names_at + i * L.ROLE_SIZE + L.ROLE_NAME_BYTES])
            .rstrip(b"\0")
            .decode()
            for i in range(self.n_roles)
        )

    def _copy(self) -> tuple[bytearray, tuple]:
        data = bytearray(self.n_words * L.U64)
        unsettled = bytearray(len(self.rec_names))
        n = _lib.fleet_snapshot_copy(
            self._src, _ffi.from_buffer("uint64_t[]", data), self.n_words,
            self._starts, self._lens, self._seqs, len(self.rec_names), SPINS, TORN_TIMEOUT_NS,
            _ffi.from_buffer("uint8_t[]", unsettled),
        )
        torn = () if n == 0 else tuple(name for name, bad in zip(self.rec_names, unsettled) if bad)
        return data, torn

    def take(self) -> TableSnapshot:
        data, torn = self._copy()
        return TableSnapshot(self, data, int(self.header["flags"]), torn, int(self.header["draining_since_ns"]))


def read(name: str, *, trust: frozenset[int] | None = None) -> tuple[TableSnapshot, bool]:
    """Attach read-only (O_RDONLY, PROT_READ) to fleet `name`'s table, take one snapshot, detach.

    Returns (snapshot, creator alive). Raises TableNotFound, TableCorrupt,
    TableAccessDenied, InvalidFleetName, UntrustedPeer (the table belongs to a uid
    outside ``trust``; default: ours and root).
    """
    from fleet.shm.table import segment as seg

    segment = seg.attach(name, writable=False, trust=trust)
    try:
        h = segment.header
        alive = seg.creator_alive(int(h["creator_pid"]), int(h["creator_start"]))
        return Reader(segment).take(), alive
    finally:
        segment.close()


def take(segment: Segment) -> TableSnapshot:
    """A consistent snapshot of `segment` (see `Reader`)."""
    reader = getattr(segment, "_reader", None)
    if reader is None:
        reader = Reader(segment)
        segment._reader = reader
    return reader.take()
