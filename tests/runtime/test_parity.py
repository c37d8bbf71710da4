"""Parity of the bindings (002 §13): serial and pinned give the same outcomes for the same
input — with keyed roles, a worker death and cordon, not only pooled units.

The corpus runs in phases that wait for each other, so that what a death takes with it
(every unit in flight on the dead seat) is the same on both bindings: only the unit that
kills its worker is in flight then.
"""
from __future__ import annotations

import fleet

import time

from tests.fleets import config, role, running

ROLES = {
    "work": role("sometimes", slots=4, peak_cpus=1),
    "bins": role("keyed_count", kind="pinned", slots=2, peak_cpus=0, elastic_repin=True),
    "bg": role("sometimes", cordon_class="deferrable", slots=1, peak_cpus=0),
    "die": role("die", slots=1, peak_cpus=0),
}
#: a released cause turns the posture Nominal after this clean window
POSTURE = {"cordon_exit_clean_ms": 100}


def _outcome(fut):
    exc = fut.exception(120)
    if exc is None:
        return ("solved", fut.result())
    if isinstance(exc, fleet.UnitError):
        return (exc.outcome.kind, exc.outcome.reason)
    return ("raised", type(exc).__name__)  # the handler's own exception, as itself


def _corpus(name: str, profile: str):
    with running(config(name, ROLES, profile=profile, posture=POSTURE)) as f:
        assert f.plan.binding == profile
        out = []
        # 1. Nominal: pooled, keyed (two keys, each on its pin) and deferrable units together.
        phase = []
        for i in range(90):
            if i % 3 == 0:
                phase.append(f.submit("bins", i, key=f"k{i % 2}"))
            elif i % 5 == 0:
                phase.append(f.submit("bg", i))
            else:
                phase.append(f.submit("work", i))
        out += [_outcome(fut) for fut in phase]
        # 2. A lane death, alone in flight: LaneDeath, and the posture holds Cordoned.
        out.append(_outcome(f.submit("die")))
        assert f.status()["posture"]["state"] == "Cordoned"
        # 3. Cordoned: the deferrable role takes nothing new; the others run. New keys
        #    re-key the pins their predecessors left (serial: the death released them).
        held = [f.submit("bg", i) for i in range(10)]
        phase = [f.submit("bins", i, key=f"k{2 + i // 2 % 2}") if i % 2 else f.submit("work", i) for i in range(40)]
        out += [_outcome(fut) for fut in phase]
        out.append(("held while cordoned", sum(not fut.done() for fut in held)))
        # 4. Released: the held units run.
        f.posture_release("lane-death")
        out += [_outcome(fut) for fut in held]
        deadline = time.monotonic() + 30
        while f.status()["posture"]["state"] != "Nominal" and time.monotonic() < deadline:
            time.sleep(0.02)
        out.append(("posture", f.status()["posture"]["state"]))
        return out, f.ledger()


def test_parity_with_keyed_roles_a_death_and_cordon(fleet_name):
    serial, serial_ledger = _corpus(f"{fleet_name}-serial", "serial")
    pinned, pinned_ledger = _corpus(f"{fleet_name}-pinned", "pinned")
    assert serial == pinned
    assert serial_ledger == pinned_ledger
    assert ("held while cordoned", 10) in serial and ("posture", "Nominal") in serial
    assert serial.count(("failed", "LaneDeath")) == 1
    # every key stayed on one pin: its counts run 1, 2, 3, ... on both bindings
    bins = [value for kind, value in serial if kind == "solved" and isinstance(value, tuple)]
    for key in ("k0", "k1", "k2", "k3"):
        counts = [n for k, n in bins if k == key]
        assert counts == list(range(1, len(counts) + 1)) and counts, key
