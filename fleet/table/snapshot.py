"""Lock-free, consistent, read-only copies of the shared table.

Readers never take a lock and never write. Each record with a seqlock is read as:
sequence (acquire), fields, fence, sequence again; a record whose sequence was odd or
moved is read again (a writer was in the middle of it). Slot words are also whole
64-bit atomic words on their own. The copy runs in C (fleet._native), because the
read must fit between two writes of a busy writer.

This module imports numpy and the cffi module only: `fleetctl status` reads a table
without numba.
"""
from __future__ import annotations

import numpy as np

from .. import fsm
from .._native import ffi as _ffi
from .._native import lib as _lib
from . import layout as L
from .segment import Segment, read_meta

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

    __slots__ = ("_reader", "_data", "flags", "torn")

    def __init__(self, reader: "Reader", data: np.ndarray, flags: int, torn: tuple[str, ...] = ()):
        self._reader, self._data, self.flags = reader, data, flags
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
    #: (n_slots, 8) uint64: word, seq, unit, pid, cpus lo/hi, binding, done
    slots = property(lambda self: self._reader.region(self._data, "slots"))
    #: (n_roles, 16) uint64
    roles = property(lambda self: self._reader.region(self._data, "roles"))
    #: (16,) uint64
    posture = property(lambda self: self._reader.region(self._data, "posture")[0])
    #: (16,) uint64
    ledger = property(lambda self: self._reader.region(self._data, "ledger")[0])
    #: (n_bulkheads, 16) uint64
    bulkheads = property(lambda self: self._reader.region(self._data, "bulkheads"))

    @property
    def n_slots(self) -> int:
        return self.slots.shape[0]

    def words(self) -> np.ndarray:
        return self.slots[:, L.S_WORD]

    def slot(self, i: int) -> dict:
        """One slot as plain values (state and role by name)."""
        state, role, key, gen = L.unpack_word(self.slots[i, L.S_WORD])
        rec = self.slots[i]
        cpus = int(rec[L.S_CPUS_LO]) | (int(rec[L.S_CPUS_HI]) << 64)
        held = state != fsm.IDLE
        return {
            "slot": i,
            "state": fsm.STATE_NAMES[state] if state < fsm.N_STATES else f"?{state}",
            "role": self.role_names[role] if held and role < len(self.role_names) else None,
            "key": key if held else None,
            "generation": gen,
            "unit": int(rec[L.S_UNIT]),
            "pid": int(rec[L.S_PID]),
            "cpus": [c for c in range(128) if cpus >> c & 1],
            "binding": L.BINDINGS[int(rec[L.S_BINDING])] if int(rec[L.S_BINDING]) < len(L.BINDINGS) else "?",
            "done": int(rec[L.S_DONE]),
        }

    def posture_view(self) -> dict:
        p = self.posture
        cause = int(p[L.P_CAUSE])
        return {
            "state": fsm.POSTURE_NAMES[int(p[L.P_STATE]) & 1],
            "cause": L.POSTURE_CAUSES[cause] if cause < len(L.POSTURE_CAUSES) else f"?{cause}",
            "since_ns": int(p[L.P_SINCE_NS]),
            "enter_count": int(p[L.P_ENTER_COUNT]),
            "exit_count": int(p[L.P_EXIT_COUNT]),
            "cordoned_ns": int(p[L.P_CORDONED_NS]),
            "suppressed": int(p[L.P_SUPPRESSED]),
            "thresholds": {
                "cordon_enter_events": int(p[L.P_ENTER_EVENTS]),
                "cordon_enter_window_ms": int(p[L.P_ENTER_WINDOW_MS]),
                "cordon_duty_percent": int(p[L.P_DUTY_PPM]) / 10_000,
                "cordon_duty_window_ms": int(p[L.P_DUTY_WINDOW_MS]),
                "cordon_exit_clean_ms": int(p[L.P_EXIT_CLEAN_MS]),
                "cordon_sim_intake_floor": int(p[L.P_INTAKE_FLOOR]) or None,
            },
        }

    def ledger_view(self) -> dict:
        g = self.ledger
        return {
            "submitted": int(g[L.L_SUBMITTED]),
            "solved": int(g[L.L_SOLVED]),
            "suppressed": int(g[L.L_SUPPRESSED]),
            "failed": int(g[L.L_FAILED]),
            "inflight": int(g[L.L_INFLIGHT]),
            "failed_by_reason": [int(x) for x in g[L.L_FAILED_BY_REASON : L.L_FAILED_BY_REASON + L.N_FAILURE_REASONS]],
        }

    def role_view(self, code: int) -> dict:
        r = self.roles[code]
        return {
            "name": self.role_names[code],
            "kind": fsm.KIND_NAMES[int(r[L.R_KIND])],
            "cordon_class": fsm.CLASS_NAMES[int(r[L.R_CLASS])],
            "queue_bound": int(r[L.R_QUEUE_BOUND]),
            "queue_depth": int(r[L.R_QUEUE_DEPTH]),
            "slot_cap": int(r[L.R_SLOT_CAP]),
            "in_use": int(r[L.R_IN_USE]),
        }


class Reader:
    """Precomputed views of one mapped segment, for repeated snapshots.

    A snapshot is: gather every record's sequence, copy the whole segment once,
    gather the sequences again; records whose sequence was odd or moved are re-read
    one by one. Role names never change after creation, so they are decoded once.
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
        self.full = segment.view_u64(0, segment.size // L.U64)
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
        self.seq_idx = np.asarray(seq_idx, dtype=np.int64)
        self.rec_start = np.asarray(starts, dtype=np.int64)
        self.rec_len = np.asarray(strides, dtype=np.int64)
        self.rec_names = tuple(names)
        # C does the copy: a seqlock read must fit between two writes, and Python is
        # too slow to win that race against a busy writer.
        self._src = _ffi.from_buffer("uint64_t[]", self.full)
        self._starts = _ffi.from_buffer("int64_t[]", self.rec_start)
        self._lens = _ffi.from_buffer("int64_t[]", self.rec_len)
        self._seqs = _ffi.from_buffer("int64_t[]", self.seq_idx)
        roles_first = self.regions["roles"][0]
        raw = self.full[roles_first : roles_first + self.n_roles * ROLE_FIELDS].copy().reshape(self.n_roles, ROLE_FIELDS)
        self.role_names = tuple(
            bytes(raw[i].view(np.uint8)[L.R_NAME_BYTE : L.R_NAME_BYTE + L.ROLE_NAME_BYTES]).rstrip(b"\0").decode()
            for i in range(self.n_roles)
        )

    def _copy(self) -> np.ndarray:
        data = np.empty_like(self.full)
        unsettled = np.zeros(self.seq_idx.size, dtype=np.uint8)
        n = _lib.fleet_snapshot_copy(
            self._src, _ffi.from_buffer("uint64_t[]", data), data.size,
            self._starts, self._lens, self._seqs, self.seq_idx.size, SPINS, TORN_TIMEOUT_NS,
            _ffi.from_buffer("uint8_t[]", unsettled),
        )
        torn = () if n == 0 else tuple(self.rec_names[i] for i in np.flatnonzero(unsettled))
        return data, torn

    def region(self, data: np.ndarray, key: str) -> np.ndarray:
        first, stride, count, _seq = self.regions[key]
        return data[first : first + stride * count].reshape(count, stride)

    def take(self) -> TableSnapshot:
        data, torn = self._copy()
        return TableSnapshot(self, data, int(self.header["flags"]), torn)


def take(segment: Segment) -> TableSnapshot:
    """A consistent snapshot of `segment` (see `Reader`)."""
    reader = getattr(segment, "_reader", None)
    if reader is None:
        reader = Reader(segment)
        segment._reader = reader
    return reader.take()
