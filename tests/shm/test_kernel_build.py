"""The transition kernels built at install (fleet.shm.table._kernels: numba's object code of
the entry points in kernel_entry): present and current after an install, the same results
as numba's run-time build on every FSM vector, refused with one WARNING when stale or
missing (numba's build then runs), and a fleet that runs them imports neither numba nor
numpy.

Mutations that turn these red: deleting the built module or editing kernels.py without
reinstalling (the first test); a changed comparison in kernels.py's `_decide` against
the built one (the agreement test); `kernel_load.built_module` skipping its digest check
(the stale test: the old T5 applies); FLEET_KERNELS=jit in the fleet's environment (the
no-numba test)."""
from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fleet import _table
from fleet.rules import fsm
from fleet.rules.roles import Role, RoleSet
from fleet.shm.table import SlotTable, kernel_load
from fleet.shm.table import layout as L
from fleet.shm.table.kernel_tables import SLOT_FIELDS

PACKAGE = Path(kernel_load.__file__).resolve().parents[2]  # .../fleet
ADMISSION = PACKAGE.parent / "admission"
KINDS, CLASSES = ("pinned", "pooled", "singleton"), ("never", "floor", "deferrable")
MATRIX = RoleSet(tuple(Role(name=f"{k}_{c}", kind=k, cordon_class=c) for k in KINDS for c in CLASSES))


def test_the_install_built_current_kernels():
    module, why = kernel_load.built_module()
    assert module is not None, f"{why}: reinstall (pip install -e .) to build them"
    assert kernel_load.built_kernels(module).built


@pytest.fixture
def tables(fleet_name):
    """Two tables of one fleet's shape, one per build: (built kernels, table), (numba's, table)."""
    import importlib

    made = []
    try:  # removed however the set-up ends: a failure before the yield would leave them in /dev/shm
        made += [SlotTable.create(f"{fleet_name}{i}", MATRIX, 4) for i in range(2)]
        built = importlib.import_module(kernel_load.BUILT)  # whatever is built: compared, stale or not
        made[0].use_kernels(kernel_load.built_kernels(built))
        made[1].use_kernels(kernel_load.jit_kernels())
        assert made[0].kernels.built and not made[1].kernels.built
        yield [(made[0]._k, made[0]), (made[1]._k, made[1])]
    finally:
        for t in made:
            t.close()
            t.unlink()


def _outcomes(k, t, word, event, role, key, gen, posture):
    """Every kernel's answer to one vector, from the same starting word, with the word after each."""
    t.set_posture(posture)
    out = []
    t.slots[L.S_WORD] = word
    out += [k.transition(0, event, role, key, gen), int(t.slots[L.S_WORD])]
    t.slots[L.S_WORD] = word
    out += [k.batch([0, event, role, key, 0, 0, fsm.START, fsm.ANY_ROLE, key, 1]), *k.reasons(2), int(t.slots[L.S_WORD])]
    t.slots[L.S_WORD] = word
    out += [k.start_unit(0, event, role, key, 77), int(t.slots[L.S_WORD]), int(t.slots[L.S_UNIT])]
    t.slots[L.S_WORD] = word
    out += [k.finish_unit(0, event, role), int(t.slots[L.S_WORD]), int(t.slots[L.S_DONE])]
    return out


def test_built_and_run_time_kernels_agree_on_every_fsm_vector(tables):
    (built, tb), (jit, tj) = tables
    cases = 0
    for state, event, slot_role, posture in itertools.product(
        range(fsm.N_STATES + 1), range(-1, fsm.N_EVENTS + 1), range(len(MATRIX)), (fsm.NOMINAL, fsm.CORDONED)
    ):
        pinned = MATRIX.by_code(slot_role).kind_code == fsm.KIND_PINNED
        word = L.pack_word(state, slot_role if state != fsm.IDLE else 0, 5 if pinned and state != fsm.IDLE else 0, 41)
        for role, key, gen in itertools.product((fsm.ANY_ROLE, -1, slot_role, (slot_role + 1) % len(MATRIX), 99),
                                                (0, 5, 6, -1), (-1, 41, 40)):
            got = _outcomes(built, tb, word, event, role, key, gen, posture)
            want = _outcomes(jit, tj, word, event, role, key, gen, posture)
            assert got == want, (state, event, slot_role, posture, role, key, gen)
            cases += 1
    assert cases == (fsm.N_STATES + 1) * (fsm.N_EVENTS + 2) * len(MATRIX) * 2 * 5 * 4 * 3


def test_built_and_run_time_field_writers_agree(tables):
    for k, t in tables:
        fields = (L.L_SUBMITTED, L.L_SOLVED)
        assert k.seq_write(_table.LEDGER, L.L_SEQ, fields, (3, -1)) is True  # -1: 2**64 - 1, a word
        assert k.seq_write(_table.LEDGER, L.L_SEQ, (len(t.ledger),), (0,)) is False
        assert k.seq_write(_table.LEDGER, -1, fields, (0, 0)) is False
        assert k.add_field(_table.SLOTS, L.S_DONE, 5) == 0 and k.add_field(_table.SLOTS, L.S_DONE, 1) == 5
        assert k.add_field(_table.SLOTS, len(t.slots), 1) == 0
        assert k.store_field(_table.SLOTS, SLOT_FIELDS + L.S_UNIT, 9) is True
        assert k.store_field(_table.SLOTS, -1, 9) is False
        assert t.ledger[L.L_SOLVED] == 2**64 - 1 and t.slots[SLOT_FIELDS + L.S_UNIT] == 9
    (_, tb), (_, tj) = tables
    assert tb.ledger.tolist() == tj.ledger.tolist() and tb.slots.tolist() == tj.slots.tolist()


# --- a stale or missing build is refused, in one WARNING; numba's kernels run -------------------

FOLLOWS = textwrap.dedent(
    """
    import logging, sys
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    import fleet
    from fleet.rules import fsm
    from fleet.rules.roles import RoleSet, Role
    from fleet.shm.table import SlotTable
    assert fleet.__file__.startswith(sys.argv[1]), fleet.__file__
    t = SlotTable.create(sys.argv[2], RoleSet((Role("pool", kind="pooled"),)), 1)
    t2 = SlotTable.create(sys.argv[2] + "b", RoleSet((Role("pool", kind="pooled"),)), 1)  # chosen once per process
    try:
        got = [t.transition(0, e, 0 if e == fsm.LEASE else fsm.ANY_ROLE, 0) for e in (fsm.LEASE, fsm.START, fsm.RELEASE)]
        print(got[-1], t.kernels.name, "numba" in sys.modules, "numpy" in sys.modules)
    finally:
        for x in (t, t2):
            x.close(); x.unlink()
    """
)


def _run_copy(tmp_path, fleet_name, edit) -> tuple[list[str], list[str]]:
    root = tmp_path / "site"
    shutil.copytree(PACKAGE, root / "fleet", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ADMISSION, root / "admission", ignore=shutil.ignore_patterns("__pycache__"))
    edit(root / "fleet")
    env = {k: v for k, v in os.environ.items() if k != "FLEET_KERNELS"}
    env.update(PYTHONPATH=str(root), NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", FOLLOWS, str(root), fleet_name], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.split(), [line for line in out.stderr.splitlines() if "transition kernels" in line]


def _without_t5(package: Path) -> None:
    fsm_py = package / "rules" / "fsm.py"
    t5 = '    (RUNNING, RELEASE): (IDLE, "T5", frozenset({KIND_POOLED}), False),\n'
    text = fsm_py.read_text()
    assert t5 in text
    fsm_py.write_text(text.replace(t5, ""))


def test_a_build_from_another_fsm_table_is_refused_and_numba_follows_the_new_one(tmp_path, fleet_name):
    out, warnings = _run_copy(tmp_path, fleet_name, _without_t5)
    assert out == [str(fsm.R_ILLEGAL), kernel_load.JIT, "True", "True"]  # T5 is gone: the new rules, not the build's
    assert len(warnings) == 1 and warnings[0].startswith("WARNING") and "stale build" in warnings[0], warnings


def test_an_edited_entry_point_is_a_stale_build(tmp_path, fleet_name):
    # kernel_entry.py is compiled into the build as much as kernels.py is: its digest is the build's
    def edit(package):
        entry = package / "shm" / "table" / "kernel_entry.py"
        entry.write_text(entry.read_text() + "\n# edited\n")

    out, warnings = _run_copy(tmp_path, fleet_name, edit)
    assert out == [str(fsm.OK), kernel_load.JIT, "True", "True"]
    assert len(warnings) == 1 and "stale build" in warnings[0], warnings


def test_a_missing_build_runs_numba_kernels_with_one_warning(tmp_path, fleet_name):
    def remove_build(package):
        for so in (package / "shm" / "table").glob("_kernels*.so"):
            so.unlink()

    out, warnings = _run_copy(tmp_path, fleet_name, remove_build)
    assert out == [str(fsm.OK), kernel_load.JIT, "True", "True"]
    assert len(warnings) == 1 and "cannot be imported" in warnings[0], warnings


def test_an_untouched_copy_runs_the_build_silently(tmp_path, fleet_name):
    out, warnings = _run_copy(tmp_path, fleet_name, lambda package: None)
    assert out == [str(fsm.OK), kernel_load.BUILT, "False", "False"]  # neither numba nor numpy
    assert warnings == []


# --- a fleet on the built kernels imports neither numba nor numpy ----------------------------------

NO_NUMBA = textwrap.dedent(
    """
    import sys
    from fleet import Executor

    def loaded(_):
        return "numba" in sys.modules, "numpy" in sys.modules

    if __name__ == "__main__":
        with Executor(max_workers=2) as ex:
            workers = {str(found).replace(" ", "") for found in ex.map(loaded, range(20))}
        print(sorted(workers), "numba" in sys.modules, "numpy" in sys.modules)
    """
)


def test_an_executor_and_its_workers_import_neither_numba_nor_numpy(tmp_path):
    # numpy costs each process ~0.1 s at start (numba's more): neither the caller, nor the
    # fork server its workers are forks of, loads it for the table or its kernels.
    script = tmp_path / "no_numba.py"
    script.write_text(NO_NUMBA)
    env = {k: v for k, v in os.environ.items() if k != "FLEET_KERNELS"}
    out = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['(False,False)']", "False", "False"], out.stdout
