"""The loop's half of each operator op: what it does to the loop's state.

The caller's half posts one of these to the loop (`Supervisor.call`; the façade,
`fleet.runtime.facade.LoopOperations`, does it for every op) and waits for its answer:
the loop runs it between turns, the one owner of the state it changes (DESIGN §8); it
works on the supervisor's components (its posture effects, provider gate, dispatcher,
door), never on their insides. A
view (`view=True` when posted) may also read what a stopped loop left; a change to a
stopped fleet raises FleetClosed. A bad argument raises the typed FleetError its rule
raises, and changes nothing.
"""
from __future__ import annotations

import dataclasses
import logging

from fleet.rules import posture as posture_mod

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- posture
def posture_show(sup) -> dict:
    return sup.posture.show()


def posture_set(sup, patch: dict) -> dict:
    """Retune the posture policy live (validated; a bad patch changes nothing)."""
    result = sup.posture.retune(patch)
    sup.dispatch()
    return result


def hold(sup, cause: str = posture_mod.OPERATOR) -> None:
    """Hold the posture Cordoned for `cause` until `release(cause)` (operator cordon)."""
    sup.posture.hold(cause)


def release(sup, cause: str = posture_mod.OPERATOR) -> dict:
    """Release a sticky posture cause (`lane-death`, `operator`); returns the posture view
    with ``released``: whether the cause was held. An unknown cause raises
    PostureCauseError and changes nothing. The posture turns Nominal once the exit
    window is clean and no other cause holds it."""
    held = sup.posture.release(cause)
    if held:
        log.warning("fleet %s: operator released the posture cause %s", sup.name, cause)
    return {**sup.posture.show(), "released": held}


# ---------------------------------------------------------------------- intake
def set_draining(sup, draining: bool) -> None:
    """Drain: take nothing new from the queues (in-flight units complete); or take again."""
    sup.set_draining(draining)


def reload(sup, config) -> dict:
    """Apply what can change on a live fleet (posture policy, queue bounds, the provider
    catalog); report what needs a restart. Nothing is applied if the posture policy is
    invalid, or if the config could not boot on this host now (its typed boot refusal
    is raised)."""
    # A config a restart would refuse (a budget over the quota, no handler) is refused
    # whole: accepting its live parts would leave a fleet that cannot start again.
    sup.project(config)
    applied, restart = [], []
    old = sup.config
    for field in ("name", "profile", "cpus", "budget", "limits", "restart", "metrics", "store"):
        if getattr(config, field) != getattr(old, field):
            restart.append(field)
    # Compare roles with the one live field masked (1: a Role refuses a bound below 1).
    old_roles = {r.name: dataclasses.replace(r, queue_bound=1) for r in old.roles}
    new_roles = {r.name: dataclasses.replace(r, queue_bound=1) for r in config.roles}
    if old_roles != new_roles:
        restart.append("roles")
    policy = sup.posture.policy
    if config.posture != policy:
        patch = {k: v for k, v in config.posture.to_dict().items() if v != getattr(policy, k)}
        if patch:
            sup.posture.retune(patch)
            applied.append("posture")
    if sup.providers.reload(config.admission)[0]:
        applied.append("admission")
    if "roles" not in restart:
        room = sup.door.room
        bounds = [config.roles[r.name].queue_bound for r in sup.roles]
        if bounds != room.bounds():
            room.set_bounds(bounds)
            applied.append("roles.*.queue_bound")
    # A reload is an epoch boundary (002 §3.4): pins are released (T9) once empty.
    if sup.dispatcher.begin_epoch():
        applied.append("pins released")
    sup.dispatch()
    return {"applied": applied, "needs_restart": restart}


# ---------------------------------------------------------------------- provider admission
def admission_census(sup) -> dict:
    """The provider admission's read model: bulkheads, lane x bulkhead rows, closures,
    starving, waiting units with their reason (fleet.runtime.provider_gate)."""
    return sup.providers.census()


def admission_close(sup, pool: str, until: float, message: str = "") -> dict:
    """Close a provider or key (``provider[/credential]``) until `until` (UTC epoch seconds)."""
    result = sup.providers.close(pool, until, message)
    sup.providers.publish(force=True)
    return result


def admission_reopen(sup, pool: str) -> dict:
    """Lift a provider's or key's closure; its waiting units start at the loop's next turn."""
    result = sup.providers.reopen(pool)
    sup.providers.publish(force=True)
    return result


def admission_budget(sup, provider: str, spent: float, limit: float | None) -> dict:
    """The provider's daily budget reading (fleet.runtime.provider_gate.ProviderGate.report_budget)."""
    result = sup.providers.report_budget(provider, spent, limit)
    sup.providers.publish(force=True)
    return result


def admission_ask(sup, question):
    """Answer a coordinator question (``question(gate)``: allowance, plan, starving) on
    the loop, as every other call on the provider gate; it reads the pool and seats nothing."""
    return question(sup.providers)


def admission_reload_refused(sup, why: str) -> None:
    """A reload whose [admission] section did not load: the last good catalog stays; say why."""
    sup.providers.refused_reload(why)
