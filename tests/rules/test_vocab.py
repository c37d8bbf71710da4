"""Each vocabulary is written once (fleet.rules.vocab, admission.vocab), and its wire codes never move.

The codes are wire and ABI (the table's posture record, the ledger's counters by reason,
the role records): the expected pairs below are written out here, not read from the module.

The literal rule: outside the two vocabulary modules, no module of fleet/ or admission/ spells
a vocabulary word (a failure reason, a posture, a posture cause, a cordon class, a posture key,
a lease state, a bulkhead state, a closure cause) as a string constant used as a value. Not counted: docstrings, and the literal text of
an f-string (a message for people); an expression inside an f-string's braces is code and
counts. A few modules share a word with another vocabulary of their own; those pairs are
listed in OTHER_VOCABULARIES, each with the vocabulary it belongs to.
"""
from __future__ import annotations

import ast
import pathlib

from admission.records import fields
import admission
import fleet
from admission import state as admission_state
from admission import vocab as lease_vocab
from fleet.rules import outcomes, posture, roles, vocab
from fleet.shm.table import bulkheads, layout

PACKAGES = (pathlib.Path(fleet.__file__).parent, pathlib.Path(admission.__file__).parent)
HOMES = {"fleet/rules/vocab.py", "admission/vocab.py"}

#: Wire codes, written out: the ledger's failure reason codes (failed_by_reason).
FAILURE_REASON_CODES = {
    0: "HandlerError", 1: "Timeout", 2: "LaneDeath", 3: "Shutdown", 4: "Refused", 5: "RoleStopped",
    6: "ResultError", 7: "Cancelled", 8: "FsmRefused", 9: "LeaseExpired", 10: "LeaseDenied", 11: "LeasePreempted",
}
#: The table's posture record, P_CAUSE.
POSTURE_CAUSE_CODES = {
    0: "none", 1: "throttle-events", 2: "throttle-duty", 3: "lane-death", 4: "operator", 5: "cpu-pressure",
    6: "memory-pressure",
}
#: The table's role records, R_CLASS.
CORDON_CLASS_CODES = {0: "never", 1: "floor", 2: "deferrable"}
#: The posture word, P_STATE.
POSTURE_CODES = {0: "Nominal", 1: "Cordoned"}
#: Stored in the lease store's tables and read back by every orchestrator.
LEASE_STATES = {"queued", "admitted", "denied", "cancelled", "timed-out", "preempted", "released", "awaiting-approval"}
#: A bulkhead record's state and its closure's cause, B_STATE and B_CAUSE (0: unused, none).
BULKHEAD_STATE_CODES = {1: "open", 2: "backoff", 3: "closed"}
CLOSURE_CAUSE_CODES = {1: "rate-limit", 2: "daily-limit", 3: "credit", 4: "rejected-key", 5: "budget", 6: "operator"}
POSTURE_KEYS = {"cordon_enter_events", "cordon_enter_window_ms", "cordon_duty_percent", "cordon_duty_window_ms",
                "cordon_exit_clean_ms", "cordon_sim_intake_floor"}

#: (module, word): the word belongs to another vocabulary of that module.
OTHER_VOCABULARIES = {
    ("fleet/service/control/errors.py", "Timeout"): "a control error code",
    ("fleet/runtime/future.py", "cancelled"): "a future's state, as concurrent.futures describes it",
    ("fleet/service/control/ops/units.py", "cancelled"): "the cancel op's reply: its field and the unit's state",
    ("fleet/api/client.py", "cancelled"): "the cancel op's reply field",
    ("fleet/service/control/ops/posture.py", "released"): "the posture release reply's field",
    ("fleet/burst/replay.py", "released"): "a replay's counter of released rounds",
    ("fleet/__init__.py", "Refused"): "a public name (the exception a handler raises)",
    ("fleet/__init__.py", "RoleStopped"): "a public name (the error of a unit whose role stopped)",
    ("admission/__init__.py", "Refused"): "a public name (the exception a handler raises)",
    ("fleet/rules/why.py", "queued"): "a why state, and the field of a queued unit's facts",
    ("fleet/runtime/why.py", "queued"): "the field of a queued unit's facts (fleet.rules.why)",
    ("fleet/rules/why.py", "floor"): "a role's room: its intake floor, a count of slots",
    ("fleet/rules/dispatch.py", "floor"): "a role's room: its intake floor, a count of slots",
}


def test_failure_reasons_keep_their_codes():
    assert dict(enumerate(vocab.FAILURE_REASONS)) == FAILURE_REASON_CODES
    assert {code: outcomes.reason_name(code) for code in FAILURE_REASON_CODES} == FAILURE_REASON_CODES
    assert {name: outcomes.reason_code(name) for name in FAILURE_REASON_CODES.values()} == {
        name: code for code, name in FAILURE_REASON_CODES.items()}
    named = {getattr(vocab, attr): getattr(vocab.Reason, attr) for attr in vars(vocab.Reason) if attr.isupper()}
    assert named == FAILURE_REASON_CODES  # vocab.TIMEOUT is the code of vocab.Reason.TIMEOUT, and so on
    assert layout.N_FAILURE_REASONS == len(FAILURE_REASON_CODES)


def test_posture_causes_keep_their_codes():
    assert dict(enumerate(vocab.POSTURE_CAUSES)) == POSTURE_CAUSE_CODES
    assert dict(enumerate(layout.POSTURE_CAUSES)) == POSTURE_CAUSE_CODES
    named = {getattr(vocab, "CAUSE_" + attr): getattr(vocab.Cause, attr)
             for attr in vars(vocab.Cause) if attr.isupper()}
    assert named == POSTURE_CAUSE_CODES
    assert vocab.cause_name(7) == "?7"


def test_cordon_classes_and_postures_keep_their_codes():
    assert dict(enumerate(vocab.CLASS_NAMES)) == CORDON_CLASS_CODES
    named = {getattr(vocab, "CLASS_" + attr): getattr(vocab.CordonClass, attr)
             for attr in vars(vocab.CordonClass) if attr.isupper()}
    assert named == CORDON_CLASS_CODES
    assert {name: roles.Role("r", cordon_class=name).class_code for name in CORDON_CLASS_CODES.values()} == {
        name: code for code, name in CORDON_CLASS_CODES.items()}
    assert dict(enumerate(vocab.POSTURE_NAMES)) == POSTURE_CODES
    assert (vocab.NOMINAL, vocab.CORDONED) == (0, 1)


def test_lease_states_and_posture_keys():
    assert set(lease_vocab.STATES) == LEASE_STATES
    assert vocab.lease_states.STATES == lease_vocab.STATES
    assert set(lease_vocab.LIVE_STATES) | set(lease_vocab.TERMINAL_STATES) == LEASE_STATES
    assert set(vocab.POSTURE_KEYS) == POSTURE_KEYS
    assert tuple(f.name for f in fields(posture.PosturePolicy)) == vocab.POSTURE_KEYS


def test_bulkhead_states_and_closure_causes_keep_their_codes():
    assert dict(enumerate(vocab.BULKHEAD_STATES)) == {0: None, **BULKHEAD_STATE_CODES}
    assert dict(enumerate(vocab.CLOSURE_CAUSES)) == {0: None, **CLOSURE_CAUSE_CODES}
    assert bulkheads.STATES == vocab.BULKHEAD_STATES and bulkheads.CAUSES == vocab.CLOSURE_CAUSES
    named = {getattr(vocab.BulkheadState, attr) for attr in vars(vocab.BulkheadState) if attr.isupper()}
    assert named == set(BULKHEAD_STATE_CODES.values())
    named = {getattr(vocab.ClosureCause, attr) for attr in vars(vocab.ClosureCause) if attr.isupper()}
    assert named == set(CLOSURE_CAUSE_CODES.values())
    # the provider admission's own names are these words
    assert (admission_state.RATE_LIMIT, admission_state.OPERATOR) == ("rate-limit", "operator")
    assert set(admission_state.CLOSING) < set(CLOSURE_CAUSE_CODES.values())


# --- the literal rule --------------------------------------------------------------------

WORDS = (set(FAILURE_REASON_CODES.values()) | (set(POSTURE_CAUSE_CODES.values()) - {"none"})
         | set(CORDON_CLASS_CODES.values()) | LEASE_STATES | POSTURE_KEYS | set(POSTURE_CODES.values())
         | set(BULKHEAD_STATE_CODES.values()) | (set(CLOSURE_CAUSE_CODES.values()) - {"budget"}))
# ("none" and "budget" are left out: the one is every empty cell's word, the other the CPU
# budget's, the [budget] section's and its status keys'.)


def _docstrings(tree) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def spelled_words(source: str) -> list[tuple[int, str]]:
    """(line, word) of every vocabulary word `source` spells as a string constant used as a value."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):  # an f-string's literal text is for people
            skip.update(id(v) for v in node.values if isinstance(v, ast.Constant))
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value in WORDS and id(node) not in skip)


def test_no_module_spells_a_vocabulary_word():
    offenders = {}
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            rel = str(path.relative_to(package.parent))
            if rel in HOMES:
                continue
            found = [(line, word) for line, word in spelled_words(path.read_text())
                     if (rel, word) not in OTHER_VOCABULARIES]
            if found:
                offenders[rel] = found
    assert offenders == {}


def test_the_scan_sees_values_and_passes_messages_over():
    source = (
        '"""A docstring naming Timeout and deferrable."""\n'
        'def f(outcome, t):\n'
        '    """Fails LaneDeath."""\n'
        '    if outcome.reason == "Timeout":\n'
        '        return f"timed out: Timeout {t[\'cordon_enter_events\']}"\n'
        '    return {"state": "queued"}.get("x", "deferrable")\n'
    )
    assert spelled_words(source) == [(4, "Timeout"), (5, "cordon_enter_events"), (6, "deferrable"), (6, "queued")]


def test_every_listed_exception_is_still_needed():
    """An entry of OTHER_VOCABULARIES that no longer matches is stale: remove it."""
    seen = set()
    for package in PACKAGES:
        for path in package.rglob("*.py"):
            rel = str(path.relative_to(package.parent))
            seen.update((rel, word) for _line, word in spelled_words(path.read_text()))
    assert set(OTHER_VOCABULARIES) - seen == set()


# --- one exit-code registry ---------------------------------------------------------------

#: Where exit codes are defined: fleet's registry, and admission's own (it stands below fleet).
EXIT_HOMES = {"fleet/rules/errors.py", "admission/errors.py", "admission/store/base.py"}


def exit_codes_defined(source: str) -> list[str]:
    """The ``EXIT_*`` names `source` binds to a number of its own (module, class or function level)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant) \
                and type(node.value.value) is int:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [t.id if isinstance(t, ast.Name) else t.attr for t in targets
                      if isinstance(t, (ast.Name, ast.Attribute))
                      and (t.id if isinstance(t, ast.Name) else t.attr).startswith("EXIT_")]
    return found


def test_every_exit_code_is_defined_in_the_registry():
    offenders = {}
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            rel = str(path.relative_to(package.parent))
            if rel not in EXIT_HOMES and (found := exit_codes_defined(path.read_text())):
                offenders[rel] = found
    assert offenders == {}


def test_the_exit_code_scan_finds_a_code_of_its_own():
    assert sorted(exit_codes_defined("EXIT_OK = 0\nclass Busy:\n    EXIT_BUSY = 75\nself.EXIT_X = 3\n")) == [
        "EXIT_BUSY", "EXIT_OK", "EXIT_X"]
    assert exit_codes_defined("from fleet.rules.errors import EXIT_OK\nEXIT_USAGE = EXIT_OK\ncode = 70\n") == []
