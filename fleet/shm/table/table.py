"""SlotTable: the shared table as an object — create or attach, transition, snapshot.

The owner (the supervisor) creates the table from the fleet's roles; workers and
tools attach by name. Transitions go through the transition kernels (loaded lazily by
`kernel_load`: the ones built at install, else numba's), called by `fleet._table` over
the mapping, so an attach-and-snapshot reader such as `fleetctl status` loads neither.
The regions (`slots`, `roles`, `posture`, `ledger`, `bulkheads`) are uint64 memoryviews
of the mapping: no numpy in a process that runs the built kernels.
"""
from __future__ import annotations

import operator
import time
from collections.abc import Iterable

from fleet import _table
from fleet.rules import fsm
from fleet.rules.errors import FleetError
from fleet.rules.roles import RoleSet
from fleet.shm.table import layout as L
from fleet.shm.table import segment as seg
from fleet.shm.table import snapshot as snap

SLOT_FIELDS = L.SLOT_SIZE // L.U64
ROLE_FIELDS = L.ROLE_SIZE // L.U64
DEFAULT_BULKHEADS = 64
#: The ledger's fields in `set_ledger`'s order: the five counters, fsm_refused,
#: stray_results, the five counters in items, then failures by reason.
_LEDGER_FIELDS = tuple([L.L_SUBMITTED, L.L_SOLVED, L.L_SUPPRESSED, L.L_FAILED, L.L_INFLIGHT, L.L_FSM_REFUSED,
                        L.L_STRAY_RESULTS]
                       + [L.L_ITEMS + i for i in range(L.N_ITEM_COUNTS)]
                       + [L.L_FAILED_BY_REASON + i for i in range(L.N_FAILURE_REASONS)])
assert _table.OP_FIELDS == L.OP_FIELDS, "native/fleet_table.c's batch rows are not the layout's"


class TransitionRejected(FleetError):
    """A slot transition the FSM (or its guards) refused; the word is unchanged."""

    def __init__(self, reason: int, slot: int, event: int, word: int | None = None):
        self.reason, self.slot, self.event = reason, slot, event
        ev = fsm.EVENT_NAMES[event] if 0 <= event < fsm.N_EVENTS else f"event {event}"
        where = ""
        if word is not None:
            state = L.unpack_word(word)[0]
            where = f" in state {fsm.STATE_NAMES[state] if state < fsm.N_STATES else state}"
        super().__init__(f"slot {slot}: {ev}{where} refused: {fsm.REASON_NAMES[reason]}")


class UnknownEvent(FleetError, ValueError):
    """An event name that the slot FSM does not define."""


def event_code(event) -> int:
    """Accept an event code or name ('LEASE', 'lease', 'T1'...)."""
    if not isinstance(event, (str, bool)) and hasattr(event, "__index__"):  # an int, a numpy int
        code = operator.index(event)
        if 0 <= code < fsm.N_EVENTS:
            return code
        raise UnknownEvent(f"no such event code {event}; events are 0..{fsm.N_EVENTS - 1}")
    if isinstance(event, str):
        upper = event.upper()
        if upper in fsm.EVENT_NAMES:
            return fsm.EVENT_NAMES.index(upper)
        for (_state, ev), (_to, tid, _k, _g) in fsm.TRANSITIONS.items():
            if tid == upper:
                return ev
    raise UnknownEvent(f"no such event {event!r}; events are {', '.join(fsm.EVENT_NAMES)}")


class SlotTable:
    """The shared-memory table of one fleet. Use `create` or `attach`, then `close`."""

    def __init__(self, segment: seg.Segment):
        self.segment = segment
        h = segment.header
        self.name = segment.name
        self.n_slots = int(h["n_slots"])
        self.n_roles = int(h["n_roles"])
        self.n_bulkheads = int(h["n_bulkheads"])
        self.slots = segment.view_u64(int(h["slots_off"]), self.n_slots * SLOT_FIELDS)
        self.roles = segment.view_u64(int(h["roles_off"]), self.n_roles * ROLE_FIELDS)
        self.posture = segment.view_u64(int(h["posture_off"]), L.POSTURE_SIZE // L.U64)
        self.ledger = segment.view_u64(int(h["ledger_off"]), L.LEDGER_SIZE // L.U64)
        self.bulkheads = segment.view_u64(
            int(h["bulkheads_off"]), self.n_bulkheads * (L.BULKHEAD_SIZE // L.U64)
        )
        # (offset, words) of each region, in fleet._table's order (SLOTS ... BULKHEADS)
        self._regions = tuple((int(h[f"{region}_off"]), len(getattr(self, region)))
                              for region in ("slots", "roles", "posture", "ledger", "bulkheads"))
        self.kernels = None  # which build (kernel_load.Kernels), once loaded
        self._k = None  # fleet._table.Calls over this mapping, once loaded

    # --- life cycle -------------------------------------------------------------------
    @classmethod
    def create(
        cls, name: str, roles: RoleSet, n_slots: int, *, n_bulkheads: int = DEFAULT_BULKHEADS, meta: dict | None = None,
        readers_group: int | str | None = None,
    ) -> "SlotTable":
        """Create and initialise the table (reclaiming a stale one); compile the kernels.

        `meta` (JSON-able: plan, budget, seats) is stored once for readers such as
        `fleetctl status`; see `SlotTable.meta`. `readers_group` (a gid or group
        name, e.g. fleetd's ``--socket-group``) may read the table; without it only
        its owner may open it.
        """
        segment = seg.create(name, n_slots, len(roles), n_bulkheads, readers_group=readers_group)
        table = cls(segment)
        try:
            if meta:
                seg.write_meta(segment, meta)
            table._init_roles(roles)
            table._kernels()  # compile (or load) before anybody depends on latency
            seg.publish(segment)
        except BaseException:
            table.close()
            seg.unlink(name)
            raise
        return table

    @classmethod
    def scratch(cls, roles: RoleSet, n_slots: int = 1) -> "SlotTable":
        """A table of this process alone, in anonymous memory (`segment.scratch`), its
        roles set and the process's kernels loaded: the fork server's rehearsal runs a
        worker's loop over it (`fleet.worker.rehearsal`), never over the fleet's table."""
        table = cls(seg.scratch(n_slots, len(roles)))
        try:
            table._init_roles(roles)
            table._kernels()
            seg.publish(table.segment)
        except BaseException:
            table.close()
            raise
        return table

    @classmethod
    def attach(cls, name: str, *, writable: bool = True) -> "SlotTable":
        """Attach to a running fleet's table (read-only: O_RDONLY, PROT_READ). Never resizes it."""
        return cls(seg.attach(name, writable=writable))

    def close(self) -> None:
        """Unmap (the segment stays until `unlink`)."""
        if self._k is not None:
            self._k.release()
            self._k = None
        self.slots = self.roles = self.posture = self.ledger = self.bulkheads = None
        if self.segment is not None:
            self.segment.close()
            self.segment = None

    def unlink(self) -> bool:
        return seg.unlink(self.name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _init_roles(self, roles: RoleSet) -> None:
        for code, role in enumerate(roles):
            base = code * ROLE_FIELDS
            self.roles[base + L.R_KIND] = role.kind_code
            self.roles[base + L.R_CLASS] = role.class_code
            self.roles[base + L.R_QUEUE_BOUND] = role.queue_bound
            self.roles[base + L.R_SLOT_CAP] = role.slots
            name = role.name.encode()[: L.ROLE_NAME_BYTES]
            at = self._regions[_table.ROLES][0] + base * L.U64 + L.R_NAME_BYTE
            self.segment.mm[at : at + len(name)] = name

    def load_kernels(self) -> None:
        """Load the transition kernels now, before anybody depends on latency (a fork
        server does it once, for every fork to inherit): the ones built at install, or
        numba's, compiled or loaded from its cache (fleet.shm.table.kernel_load)."""
        self._kernels()

    def _kernels(self):
        if self._k is None:
            from fleet.shm.table import kernel_load

            self.use_kernels(kernel_load.load())
        return self._k

    def use_kernels(self, kernels) -> None:
        """Run this table's transitions on `kernels` (a kernel_load.Kernels: the process's
        choice by default; a test compares the two builds)."""
        calls = _table.Calls(self.segment.mm, self._regions, self.n_roles, kernels.addresses)
        if self._k is not None:
            self._k.release()
        self.kernels, self._k = kernels, calls

    # --- transitions --------------------------------------------------------------------
    def transition(self, slot: int, event, role: int = fsm.ANY_ROLE, key: int = 0, expected_gen: int = -1) -> int:
        """Apply one event; returns fsm.OK or a reason code. Never raises for a refusal.
        Ints, or anything with ``__index__`` (numpy ints); a float is a TypeError."""
        k = self._k or self._kernels()
        if type(event) is not int or not 0 <= event < fsm.N_EVENTS:
            event = event_code(event)
        return k.transition(slot, event, role, key, expected_gen)

    def apply(self, slot: int, event, role: int = fsm.ANY_ROLE, key: int = 0, expected_gen: int = -1) -> int:
        """Apply one event or raise TransitionRejected naming why; returns the new word."""
        ev = event_code(event)
        reason = self.transition(slot, ev, role, key, expected_gen)
        if reason != fsm.OK:
            word = self.word(slot) if 0 <= slot < self.n_slots else None
            raise TransitionRejected(reason, slot, ev, word)
        return self.word(slot)

    def apply_batch(self, slot_ids, events, role_ids, keys, chained=None) -> list[int]:
        """Apply many events in order, in one kernel call; returns each one's reason.
        `chained[i]` true: event i is tried only if event i-1 was applied (else its
        reason is fsm.R_NOT_TRIED), for a grant of several events on one slot."""
        n = len(slot_ids)
        if chained is None:
            chained = [0] * n
        if not n == len(events) == len(role_ids) == len(keys) == len(chained):
            raise ValueError("apply_batch: slot_ids, events, role_ids, keys and chained must have one length")
        ops = [operator.index(value) for row in zip(slot_ids, events, role_ids, keys, chained) for value in row]
        calls = self._kernels()
        calls.batch(ops)
        return calls.reasons(n)

    def apply_ops(self, ops: list) -> int:
        """The loop's form of `apply_batch`: `ops` a flat list of int rows (slot, event,
        role, key, chained), as `fleet.rules.dispatch.Grant.ops` joined; returns how many
        events were applied. When that is fewer than the rows, `reasons(n)` tells each
        row's reason."""
        return (self._k or self._kernels()).batch(ops)

    def reasons(self, n: int) -> list[int]:
        """The reasons of the last `apply_ops` call's first `n` rows."""
        return self._k.reasons(n)

    def word(self, slot: int) -> int:
        """The slot's current word (see layout.unpack_word)."""
        if not 0 <= slot < self.n_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.n_slots})")
        return int(self.slots[slot * SLOT_FIELDS + L.S_WORD])

    def unit(self, slot: int) -> int:
        """The id of the unit a worker last started on `slot` (0: none yet)."""
        if not 0 <= slot < self.n_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.n_slots})")
        return int(self.slots[slot * SLOT_FIELDS + L.S_UNIT])

    def state(self, slot: int) -> tuple[int, int, int, int]:
        """(state, role, key, generation) of a slot."""
        return L.unpack_word(self.word(slot))

    # --- single-writer records ----------------------------------------------------------
    def _seq_write(self, region: int, seq_idx: int, fields: dict[int, int]) -> None:
        """Seqlocked write of a record's fields (`region`: fleet._table.SLOTS ... BULKHEADS);
        values are kept modulo 2**64."""
        if not self._kernels().seq_write(region, seq_idx, tuple(fields), tuple(map(int, fields.values()))):
            raise IndexError(f"field index out of range: {fields}")

    def set_slot_meta(self, slot: int, *, unit=None, pid=None, cpus: Iterable[int] | None = None, binding=None) -> None:
        """Write a slot's record fields (the supervisor is their single writer)."""
        if not 0 <= slot < self.n_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.n_slots})")
        base = slot * SLOT_FIELDS
        fields = {}
        if unit is not None:
            fields[base + L.S_UNIT] = unit
        if pid is not None:
            fields[base + L.S_PID] = pid
        if cpus is not None:
            mask = 0
            for c in cpus:
                if not 0 <= c < 128:
                    raise ValueError(f"cpu {c} out of range [0, 128)")
                mask |= 1 << c
            fields[base + L.S_CPUS_LO] = mask & 0xFFFFFFFFFFFFFFFF
            fields[base + L.S_CPUS_HI] = mask >> 64
        if binding is not None:
            fields[base + L.S_BINDING] = L.BINDINGS.index(binding)
        if fields:
            self._seq_write(_table.SLOTS, base + L.S_SEQ, fields)

    def start_unit(self, slot: int, event: int, role: int, key: int, unit_id: int) -> int:
        """Worker: START/RESUME the slot and record its unit in one kernel call; returns the reason."""
        return self._k.start_unit(slot, event, role, key, unit_id)

    def finish_unit(self, slot: int, event: int, role: int) -> tuple[int, int]:
        """Worker: end the slot's unit (DRAINED if it was drained meanwhile); (reason, state after)."""
        packed = self._k.finish_unit(slot, event, role)
        return packed >> 4, packed & 15

    def count_ride(self, slot: int) -> None:
        """A child was granted on `slot`, riding its waiting parent's slot (supervisor)."""
        self._kernels().add_field(_table.SLOTS, slot * SLOT_FIELDS + L.S_RIDES, 1)

    def set_contention(self, slot: int, contended: bool, episodes: int) -> None:
        """Publish the contention of `slot`'s seat (fleet.rules.contention): contended now,
        and times found so (seqlocked; its one writer: the loop thread)."""
        if not 0 <= slot < self.n_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.n_slots})")
        base = slot * SLOT_FIELDS
        self._seq_write(_table.SLOTS, base + L.S_SEQ, {base + L.S_CONTENTION: int(bool(contended)) | episodes << 1})

    def contended(self, slot: int) -> bool:
        """Whether `slot`'s seat is contended now (fleet.rules.contention; a worker reads its own)."""
        return bool(self.slots[slot * SLOT_FIELDS + L.S_CONTENTION] & 1)

    def count_done(self, slot: int) -> None:
        self._kernels().add_field(_table.SLOTS, slot * SLOT_FIELDS + L.S_DONE, 1)

    def set_posture(self, state: int, *, cause: int = 0, since_ns: int | None = None, **counters) -> None:
        """Publish the posture (state + record) in one seqlocked write."""
        fields = {L.P_STATE: state, L.P_CAUSE: cause, L.P_SINCE_NS: since_ns if since_ns is not None else time.monotonic_ns()}
        names = {
            "enter_count": L.P_ENTER_COUNT,
            "exit_count": L.P_EXIT_COUNT,
            "cordoned_ns": L.P_CORDONED_NS,
            "suppressed": L.P_SUPPRESSED,
            "enter_events": L.P_ENTER_EVENTS,
            "enter_window_ms": L.P_ENTER_WINDOW_MS,
            "duty_ppm": L.P_DUTY_PPM,
            "duty_window_ms": L.P_DUTY_WINDOW_MS,
            "exit_clean_ms": L.P_EXIT_CLEAN_MS,
            "intake_floor": L.P_INTAKE_FLOOR,
        }
        for key, value in counters.items():
            if key not in names:
                raise TypeError(f"set_posture: unknown field {key!r}")
            fields[names[key]] = value
        self._seq_write(_table.POSTURE, L.P_SEQ, fields)

    def set_quota_epoch(self, epoch: int, detected_cpus: float) -> None:
        """Publish the quota epoch and the detected quota (posture record, seqlocked)."""
        self._seq_write(_table.POSTURE, L.P_SEQ, {L.P_EPOCH: epoch, L.P_QUOTA_UCPU: int(round(detected_cpus * 1e6))})

    def set_ledger(self, *, submitted: int, solved: int, suppressed: int, failed: int, inflight: int = 0,
                   failed_by_reason: Iterable[int] = (), fsm_refused: int = 0, stray_results: int = 0,
                   items: Iterable[int] = ()) -> None:
        """Publish the ledger counters in one seqlocked write (single writer: the ledger).
        ``items``: submitted, solved, suppressed, failed and in flight counted in items
        (fleet.rules.ledger.ITEM_COUNTS); missing ones are 0."""
        # Published after every batch of outcomes: the fields' indices made once, the
        # values a list, not a dict.
        items = tuple(items)
        if len(items) > L.N_ITEM_COUNTS:
            raise ValueError(f"at most {L.N_ITEM_COUNTS} item counts")
        items += (0,) * (L.N_ITEM_COUNTS - len(items))
        values = [submitted, solved, suppressed, failed, inflight, fsm_refused, stray_results, *items,
                  *failed_by_reason]
        n = len(values)
        if n > len(_LEDGER_FIELDS):
            raise ValueError(f"at most {L.N_FAILURE_REASONS} failure reasons")
        if not self._kernels().seq_write(_table.LEDGER, L.L_SEQ, _LEDGER_FIELDS[:n], values):
            raise IndexError("ledger field index out of range")

    def set_worker_exits(self, *, oom_kills: int, recycles: int) -> None:
        """Publish the workers the OOM killer killed and those recycled (ledger record,
        seqlocked; its one writer: the loop thread, as for `set_ledger`)."""
        self._seq_write(_table.LEDGER, L.L_SEQ, {L.L_OOM_KILLS: oom_kills, L.L_RECYCLES: recycles})

    def set_children(self, children: int) -> None:
        """Publish the units submitted from inside running units (ledger record, seqlocked;
        its one writer: the loop thread)."""
        self._seq_write(_table.LEDGER, L.L_SEQ, {L.L_CHILDREN: children})

    def set_queue_depth(self, role: int, depth: int, in_use: int | None = None, repins: int | None = None) -> None:
        base = role * ROLE_FIELDS
        fields = {base + L.R_QUEUE_DEPTH: depth}
        if in_use is not None:
            fields[base + L.R_IN_USE] = in_use
        if repins is not None:
            fields[base + L.R_REPINS] = repins
        self._seq_write(_table.ROLES, base + L.R_SEQ, fields)

    def set_saturation(self, role: int, *, saturated: bool, episodes: int, arrival_rate: float,
                       service_rate: float, pinned_cores: float | None) -> None:
        """Publish a role's saturation reading (fleet.rules.saturation; one writer: the loop)."""
        base = role * ROLE_FIELDS
        self._seq_write(_table.ROLES, base + L.R_SEQ, {
            base + L.R_SATURATION: (int(episodes) << 1) | int(bool(saturated)),
            base + L.R_ARRIVAL_MRATE: round(max(0.0, arrival_rate) * 1000),
            base + L.R_SERVICE_MRATE: round(max(0.0, service_rate) * 1000),
            base + L.R_PINNED_MCORES: round((pinned_cores or 0) * 1000)})

    def write_bulkhead(self, seq_idx: int, fields: dict[int, int]) -> None:
        """Publish one bulkhead record's fields (seqlocked; its one writer:
        fleet.shm.table.bulkheads.BulkheadWriter)."""
        self._seq_write(_table.BULKHEADS, seq_idx, fields)

    def set_flags(self, flags: int) -> None:
        self.segment.header["flags"] = flags

    def set_draining_since(self, since_s: float | None) -> None:
        """Publish a drain's start (epoch seconds), or None once resumed (one aligned
        8-byte field: a reader sees the old value or the new one)."""
        self.segment.header["draining_since_ns"] = 0 if since_s is None else max(1, int(since_s * 1e9))

    # --- reading ---------------------------------------------------------------------------
    @property
    def meta(self) -> dict:
        """The boot metadata stored at creation ({} when none)."""
        return seg.read_meta(self.segment)

    def snapshot(self) -> snap.TableSnapshot:
        return snap.take(self.segment)
