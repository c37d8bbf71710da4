"""The numba transition kernels against the pure rule, over the full product of
state x event x role kind x cordon class x posture x role/key arguments, on a real
shared-memory table; plus bad input (indices, events, roles) that must change nothing.
Every test runs on both builds of the kernels: the one built at install
(fleet.shm.table._kernels) and numba's run-time one (fleet.shm.table.kernel_entry), both
called through fleet._table."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from fleet.rules import fsm
from fleet.rules.roles import REFERENCE_ROLES, Role, RoleSet
from fleet.shm.table import SlotTable, TransitionRejected, UnknownEvent
from fleet.shm.table import kernel_load
from fleet.shm.table import layout as L
from fleet.shm.table.kernel_tables import SLOT_FIELDS

KINDS = ("pinned", "pooled", "singleton")
CLASSES = ("never", "floor", "deferrable")
#: one role per (kind, cordon class), so every guard combination is reachable
MATRIX = RoleSet(tuple(Role(name=f"{k}_{c}", kind=k, cordon_class=c) for k in KINDS for c in CLASSES))


@pytest.fixture(params=["built", "jit"])
def table(fleet_name, request):
    t = SlotTable.create(fleet_name, MATRIX, 4)
    try:  # removed however the set-up ends
        t.use_kernels(kernels_of(request.param))
        assert t.kernels.built == (request.param == "built")
        yield t
    finally:
        t.close()
        t.unlink()


def kernels_of(build: str):
    """The kernels `build` names: the ones built at install (which must be there and
    current: tests/shm/test_kernel_build.py says why when not) or numba's."""
    if build == "built":
        module, why = kernel_load.built_module()
        assert module is not None, why
        return kernel_load.built_kernels(module)
    return kernel_load.jit_kernels()


def _force_word(table, slot, word):
    """Test-only: put a slot in an arbitrary state (the runtime never writes words directly)."""
    table.slots[slot * SLOT_FIELDS + L.S_WORD] = word


def _set_posture(table, posture):
    table.set_posture(posture)


def test_kernel_matches_the_pure_rule_over_the_full_product(table):
    cases = 0
    for state, event, slot_role, posture in itertools.product(
        range(fsm.N_STATES), range(fsm.N_EVENTS), range(len(MATRIX)), (fsm.NOMINAL, fsm.CORDONED)
    ):
        _set_posture(table, posture)
        slot_kind = MATRIX.by_code(slot_role).kind_code
        slot_key = 5 if (slot_kind == fsm.KIND_PINNED and state != fsm.IDLE) else 0
        role_in_word = slot_role if state != fsm.IDLE else 0
        key_in_word = slot_key if state != fsm.IDLE else 0
        word = L.pack_word(state, role_in_word, key_in_word, 41)
        role_args = (fsm.ANY_ROLE, slot_role, (slot_role + 1) % len(MATRIX)) if event != fsm.LEASE else tuple(range(len(MATRIX)))
        for role_arg, key_arg in itertools.product(role_args, (0, 5, 6)):
            _force_word(table, 0, word)
            concerned = role_arg if event == fsm.LEASE else role_in_word
            role_obj = MATRIX.by_code(concerned)
            want = fsm.decide(state, role_in_word, key_in_word, event, role_arg, key_arg,
                              role_obj.kind_code, role_obj.class_code, posture)
            reason = table.transition(0, event, role_arg, key_arg)
            assert reason == want[0], (fsm.STATE_NAMES[state], fsm.EVENT_NAMES[event], role_arg, key_arg, posture)
            after = table.word(0)
            if reason == fsm.OK:
                assert L.unpack_word(after) == (want[1], want[2], want[3], 42)
            else:
                assert after == word, "a refused transition changed the word"
            cases += 1
    per_pair = (fsm.N_EVENTS - 1) * 3 + len(MATRIX)  # role arguments tried per (state, role, posture)
    assert cases == fsm.N_STATES * len(MATRIX) * 2 * per_pair * 3


# Written out from 002 §3.3, not derived from fsm.TRANSITIONS: (state, event) -> (next
# state, role kinds it takes, posture-gated). One row per legal edge; a new edge adds a row.
ALL_KINDS = ("pinned", "pooled", "singleton")
LITERAL = {
    (fsm.IDLE, fsm.LEASE): (fsm.LEASED, ALL_KINDS, True),  # T1
    (fsm.LEASED, fsm.START): (fsm.RUNNING, ALL_KINDS, True),  # T2
    (fsm.RUNNING, fsm.PIN_KEYED): (fsm.PINNED, ("pinned",), False),  # T3
    (fsm.RUNNING, fsm.PIN_SINGLETON): (fsm.PINNED, ("singleton",), False),  # T4
    (fsm.RUNNING, fsm.RELEASE): (fsm.IDLE, ("pooled",), False),  # T5
    (fsm.PINNED, fsm.RESUME): (fsm.RUNNING, ("pinned", "singleton"), True),  # T6
    (fsm.RUNNING, fsm.DRAIN): (fsm.DRAINING, ALL_KINDS, False),  # T7
    (fsm.DRAINING, fsm.DRAINED): (fsm.IDLE, ALL_KINDS, False),  # T8
    (fsm.PINNED, fsm.UNPIN): (fsm.IDLE, ("pinned", "singleton"), False),  # T9
}


def test_kernel_follows_the_literal_table_for_every_role_and_posture(table):
    """Each legal edge, for each (kind, cordon class) role, Nominal and Cordoned: the kernel
    applies it exactly when the literal kinds/gated columns say so."""
    for (state, event), (to, kinds, gated) in LITERAL.items():
        for code, posture in itertools.product(range(len(MATRIX)), (fsm.NOMINAL, fsm.CORDONED)):
            role = MATRIX.by_code(code)
            _set_posture(table, posture)
            key = 5 if role.kind == "pinned" else 0
            word = L.pack_word(state, 0 if state == fsm.IDLE else code, 0 if state == fsm.IDLE else key, 7)
            _force_word(table, 0, word)
            reason = table.transition(0, event, code if event == fsm.LEASE else fsm.ANY_ROLE, key)
            if role.kind not in kinds:
                want = fsm.R_WRONG_KIND
            elif gated and role.cordon_class == "deferrable" and posture == fsm.CORDONED:
                want = fsm.R_CORDONED
            else:
                want = fsm.OK
            where = (fsm.STATE_NAMES[state], fsm.EVENT_NAMES[event], role.name, fsm.POSTURE_NAMES[posture])
            assert reason == want, where
            assert L.unpack_word(table.word(0))[0] == (to if want == fsm.OK else state), where


def test_generation_wraps_without_touching_other_fields(table):
    _force_word(table, 1, L.pack_word(fsm.IDLE, 0, 0, L.GEN_MASK))
    pinned = MATRIX.code("pinned_never")
    table.apply(1, "LEASE", pinned, L.KEY_MASK)
    assert table.state(1) == (fsm.LEASED, pinned, L.KEY_MASK, 0)


def test_expected_generation_guards_against_stale_callers(table):
    pooled = MATRIX.code("pooled_never")
    table.apply(2, "LEASE", pooled)
    gen = table.state(2)[3]
    assert table.transition(2, "START", expected_gen=gen - 1) == fsm.R_STALE
    assert table.state(2)[0] == fsm.LEASED
    assert table.transition(2, "START", expected_gen=gen) == fsm.OK


@pytest.mark.parametrize("slot", [-1, 4, 10**9, -(2**40)])
def test_slot_out_of_range_is_a_reason_not_a_segfault(table, slot):
    before = table.segment.mm[:]
    assert table.transition(slot, "LEASE", 0) == fsm.R_BAD_SLOT
    with pytest.raises(TransitionRejected, match="slot out of range"):
        table.apply(slot, "LEASE", 0)
    assert table.segment.mm[:] == before


@pytest.mark.parametrize("role", [-2, len(MATRIX), 254])
def test_role_out_of_range_is_refused(table, role):
    before = table.segment.mm[:]
    assert table.transition(0, "LEASE", role) == fsm.R_BAD_ROLE
    assert table.segment.mm[:] == before


def test_lease_needs_a_role(table):
    assert table.transition(0, "LEASE", fsm.ANY_ROLE) == fsm.R_BAD_ROLE


@pytest.mark.parametrize("event", ["LAUNCH", "T11", 10, -1, None, 2.5])
def test_unknown_event_is_a_typed_error(table, event):
    before = table.segment.mm[:]
    with pytest.raises(UnknownEvent):
        table.transition(0, event, 0)
    assert table.segment.mm[:] == before


def test_bad_event_code_inside_the_kernel(table):
    assert table._k.transition(0, 42, 0, 0, -1) == fsm.R_BAD_EVENT


def test_events_by_transition_id_and_name(table):
    pooled = MATRIX.code("pooled_never")
    table.apply(0, "T1", pooled)
    table.apply(0, "start")
    table.apply(0, "T5")
    assert table.state(0)[0] == fsm.IDLE


def test_rejection_message_names_slot_event_state_and_reason(table):
    with pytest.raises(TransitionRejected) as info:
        table.apply(3, "START")
    assert info.value.reason == fsm.R_ILLEGAL
    assert "slot 3" in str(info.value) and "START" in str(info.value) and "Idle" in str(info.value)


def test_batch_applies_in_order_and_reports_each_reason(table):
    pooled = MATRIX.code("pooled_never")
    any_ = fsm.ANY_ROLE
    reasons = table.apply_batch(
        [0, 0, 0, 0, 9, 1],
        [fsm.LEASE, fsm.START, fsm.START, fsm.RELEASE, fsm.LEASE, fsm.START],
        [pooled, any_, any_, any_, pooled, any_],
        [0, 0, 0, 0, 0, 0],
    )
    assert reasons == [fsm.OK, fsm.OK, fsm.R_ILLEGAL, fsm.OK, fsm.R_BAD_SLOT, fsm.R_ILLEGAL]
    assert table.state(0) == (fsm.IDLE, 0, 0, 3)


def test_a_chained_event_is_not_tried_after_a_refusal(table):
    """A grant of two events (UNPIN then LEASE, as a re-key does) never half-happens: on
    an Idle slot the UNPIN is refused, so the chained LEASE must not lease it."""
    pinned, pooled = MATRIX.code("pinned_never"), MATRIX.code("pooled_never")
    before = table.word(1)
    reasons = table.apply_batch([1, 1, 2], [fsm.UNPIN, fsm.LEASE, fsm.LEASE], [fsm.ANY_ROLE, pinned, pooled],
                                [0, 3, 0], chained=[0, 1, 0])
    assert reasons == [fsm.R_ILLEGAL, fsm.R_NOT_TRIED, fsm.OK]  # the next grant is its own
    assert table.word(1) == before
    assert table.state(2)[:2] == (fsm.LEASED, pooled)
    assert fsm.REASON_NAMES[fsm.R_NOT_TRIED].startswith("not tried")


def test_a_chained_event_runs_after_an_applied_one(table):
    pinned = MATRIX.code("pinned_never")
    table.apply(0, "LEASE", pinned, 3)
    table.apply(0, "START")
    table.apply(0, "PIN_KEYED")
    reasons = table.apply_batch([0, 0], [fsm.UNPIN, fsm.LEASE], [fsm.ANY_ROLE, pinned], [0, 4], chained=[0, 1])
    assert reasons == [fsm.OK, fsm.OK]
    assert table.state(0)[:3] == (fsm.LEASED, pinned, 4)


def test_apply_ops_applies_rows_and_tells_reasons_only_when_asked(table):
    pooled = MATRIX.code("pooled_never")
    ops = [0, fsm.LEASE, pooled, 0, 0, 0, fsm.START, fsm.ANY_ROLE, 0, 1, 3, fsm.START, fsm.ANY_ROLE, 0, 0]
    assert table.apply_ops(ops) == 2
    assert table.reasons(3) == [fsm.OK, fsm.OK, fsm.R_ILLEGAL]
    assert table.state(0)[0] == fsm.RUNNING
    assert table.apply_ops([1, fsm.LEASE, pooled, 0, 0]) == 1  # one row: the one-event kernel
    assert table.state(1)[:2] == (fsm.LEASED, pooled)
    assert table.apply_ops([1, fsm.LEASE, pooled, 0, 0]) == 0  # Leased: no second lease
    assert table.reasons(1) == [fsm.R_ILLEGAL]
    many = [5, fsm.LEASE, pooled, 0, 0] * 40  # more rows than its first reasons buffer: it grows
    assert table.apply_ops(many) == 0
    assert table.reasons(40) == [fsm.R_BAD_SLOT] * 40


def test_batch_refuses_floats(table):
    with pytest.raises(TypeError):
        table.apply_batch([0.0], [fsm.LEASE], [0], [0])
    assert table.state(0)[0] == fsm.IDLE


def test_batch_rejects_ragged_input(table):
    with pytest.raises(ValueError):
        table.apply_batch([0, 1], [0], [0], [0])


def test_word_index_checked(table):
    with pytest.raises(IndexError):
        table.word(4)
    with pytest.raises(IndexError):
        table.set_slot_meta(-1, pid=1)


def test_cordon_read_from_the_table_gates_deferrable_roles(table):
    deferrable = MATRIX.code("pooled_deferrable")
    floor = MATRIX.code("pooled_floor")
    table.set_posture(fsm.CORDONED)
    assert table.transition(0, "LEASE", deferrable) == fsm.R_CORDONED
    assert table.transition(0, "LEASE", floor) == fsm.OK
    table.set_posture(fsm.NOMINAL)
    assert table.transition(1, "LEASE", deferrable) == fsm.OK


def test_meta_and_counters_land_in_the_snapshot(table):
    table.set_slot_meta(2, unit=77, pid=4242, cpus=[0, 65], binding="logical")
    table.count_done(2)
    table.set_ledger(submitted=5, solved=3, suppressed=1, failed=1, inflight=0, failed_by_reason=[0, 1])
    table.set_queue_depth(MATRIX.code("pooled_floor"), 7, in_use=2)
    snap = table.snapshot()
    row = snap.slot(2)
    assert (row["unit"], row["pid"], row["cpus"], row["binding"], row["done"]) == (77, 4242, [0, 65], "logical", 1)
    assert snap.ledger_view()["submitted"] == 5 and snap.ledger_view()["failed_by_reason"][1] == 1
    assert snap.role_view(MATRIX.code("pooled_floor"))["queue_depth"] == 7
    assert snap.role_names == MATRIX.names
    with pytest.raises(ValueError):
        table.set_slot_meta(0, cpus=[128])


def test_snapshot_is_a_private_copy(table):
    snap = table.snapshot()
    table.apply(0, "LEASE", MATRIX.code("pooled_never"))
    assert snap.slot(0)["state"] == "Idle"
    assert table.snapshot().slot(0)["state"] == "Leased"


def test_reference_profile_table(fleet_name):
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 8) as t:
        names = t.snapshot().role_names
        assert names == REFERENCE_ROLES.names
        assert t.snapshot().role_view(REFERENCE_ROLES.code("merge"))["kind"] == "singleton"


def test_snapshot_is_word_aligned(table):
    h = table.segment.header
    for region in ("slots", "roles", "posture", "ledger", "bulkheads"):
        assert h[f"{region}_off"] % L.LINE == 0, region  # the mapping itself starts on a page


@pytest.mark.parametrize("bad", [1.5, "0", None])
def test_non_integer_arguments_are_refused(table, bad):
    before = table.segment.mm[:]
    with pytest.raises(TypeError):
        table.transition(bad, "LEASE", 0)
    with pytest.raises(TypeError):
        table.transition(0, "LEASE", bad)
    assert table.segment.mm[:] == before
    assert table.transition(np.int64(0), "LEASE", np.int32(MATRIX.code("pooled_never"))) == fsm.OK


def test_snapshot_shows_a_key_only_for_keyed_roles(table):
    table.apply(0, "LEASE", MATRIX.code("pinned_never"), 9)
    table.apply(1, "LEASE", MATRIX.code("pooled_never"))
    snap = table.snapshot()
    assert snap.slot(0)["key"] == 9 and snap.slot(1)["key"] is None and snap.slot(2)["key"] is None


# --- the role census: the LEASE kernel records the role a slot serves and counts switches ---


def _serve(table, slot, role):
    for event in ("LEASE", "START", "RELEASE"):
        table.apply(slot, event, role if event == "LEASE" else fsm.ANY_ROLE)


def test_a_lease_records_the_role_and_counts_a_switch_only_for_another_role(table):
    a, b = MATRIX.code("pooled_never"), MATRIX.code("pooled_floor")
    census = lambda: (table.snapshot().slot(0)["last_role"], table.snapshot().slot(0)["switches"])  # noqa: E731
    assert census() == (None, 0)
    _serve(table, 0, a)
    assert census() == ("pooled_never", 0)  # a first lease is no switch
    _serve(table, 0, a)
    assert census() == ("pooled_never", 0)
    _serve(table, 0, b)
    assert census() == ("pooled_floor", 1)
    table.apply(0, "LEASE", a)
    assert census() == ("pooled_never", 2)  # counted at the lease (T1), before the unit runs
    assert table.snapshot().slot(1)["switches"] == 0  # per slot


def test_a_refused_lease_leaves_the_census_alone(table):
    a, b = MATRIX.code("pooled_never"), MATRIX.code("pooled_floor")
    table.apply(0, "LEASE", a)
    assert table.transition(0, "LEASE", b) == fsm.R_ILLEGAL  # Leased: no second lease
    assert table.transition(1, "LEASE", b, 5) == fsm.R_BAD_KEY
    snap = table.snapshot()
    assert (snap.slot(0)["last_role"], snap.slot(0)["switches"]) == ("pooled_never", 0)
    assert (snap.slot(1)["last_role"], snap.slot(1)["switches"]) == (None, 0)


def test_a_batch_lease_counts_switches_too(table):
    a, b = MATRIX.code("pooled_never"), MATRIX.code("pinned_never")
    reasons = table.apply_batch([0, 0, 0, 0, 0, 0], [fsm.LEASE, fsm.START, fsm.RELEASE, fsm.LEASE, fsm.START, fsm.PIN_KEYED],
                                [a, fsm.ANY_ROLE, fsm.ANY_ROLE, b, fsm.ANY_ROLE, fsm.ANY_ROLE], [0, 0, 0, 3, 0, 0])
    assert list(reasons) == [fsm.OK] * 6
    slot = table.snapshot().slot(0)
    assert (slot["state"], slot["role"], slot["key"], slot["last_role"], slot["switches"]) == (
        "Pinned", "pinned_never", 3, "pinned_never", 1)


# --- fleet._table: the calls over one mapping -------------------------------------------------------

def test_closing_the_table_gives_its_mapping_back_and_its_calls_refuse(fleet_name):
    t = SlotTable.create(fleet_name, MATRIX, 2)
    try:
        calls, mm = t._kernels(), t.segment.mm
        t.close()
        assert mm.closed  # the calls held the mapping's buffer: released, it unmaps at once
        with pytest.raises(ValueError, match="released"):
            calls.transition(0, fsm.LEASE, 0, 0, -1)
    finally:
        t.close()
        t.unlink()


def test_the_calls_refuse_bad_arguments_with_a_typed_error_and_change_nothing(table):
    from fleet import _table

    calls, before = table._k, table.segment.mm[:]
    with pytest.raises(ValueError, match="no such table region 5"):
        calls.add_field(5, 0, 1)
    with pytest.raises(TypeError):
        calls.seq_write(_table.LEDGER, L.L_SEQ, [L.L_SOLVED], [1.5])
    with pytest.raises(ValueError, match="2 fields but 1 values"):
        calls.seq_write(_table.LEDGER, L.L_SEQ, [L.L_SOLVED, L.L_FAILED], [1])
    with pytest.raises(TypeError, match="takes 5 arguments"):
        calls.transition(0, fsm.LEASE)
    with pytest.raises(TypeError):
        calls.batch([0, fsm.LEASE, 0, 0, "0"])
    assert table.segment.mm[:] == before
    regions = ((0, 8),) * 5
    with pytest.raises(ValueError, match="not within"):
        _table.Calls(table.segment.mm, ((0, 8),) * 4 + ((len(table.segment.mm), 1),), 1, table.kernels.addresses)
    with pytest.raises(TypeError, match="tuple of 7"):
        _table.Calls(table.segment.mm, regions, 1, table.kernels.addresses[:6])
    with pytest.raises(TypeError, match="5 \\(offset, words\\) pairs"):
        _table.Calls(table.segment.mm, regions[:4], 1, table.kernels.addresses)
