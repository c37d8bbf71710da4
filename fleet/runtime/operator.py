"""The loop's half of each operator op: what it does to the loop's state.

The caller's half posts one of these to the loop (`Supervisor.call`; the façade,
`fleet.runtime.facade.LoopOperations`, does it for every op) and waits for its answer:
the loop runs it between turns, the one owner of the state it changes (DESIGN §8). A
view (`view=True` when posted) may also read what a stopped loop left; a change to a
stopped fleet raises FleetClosed. A bad argument raises the typed FleetError its rule
raises, and changes nothing.
"""
from __future__ import annotations

import dataclasses
import logging

from fleet.rules import posture as posture_mod
from fleet.rules import quota as quota_mod
from fleet.runtime import posture_effects

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- posture
def posture_show(sup) -> dict:
    return sup.posture.show(sup.host.now_ms())


def posture_set(sup, patch: dict) -> dict:
    """Retune the posture policy live (validated; a bad patch changes nothing)."""
    result = sup.posture.retune(patch, sup.host.now_ms())
    sup.publisher.posture_record()
    sup._dispatch()
    return result


def hold(sup, cause: str = posture_mod.OPERATOR) -> None:
    """Hold the posture Cordoned for `cause` until `release(cause)` (operator cordon)."""
    posture_effects.after_posture_change(sup, sup.posture.hold(cause, sup.host.now_ms()))


def release(sup, cause: str = posture_mod.OPERATOR) -> dict:
    """Release a sticky posture cause (`lane-death`, `operator`); returns the posture view
    with ``released``: whether the cause was held. An unknown cause raises
    PostureCauseError and changes nothing. The posture turns Nominal once the exit
    window is clean and no other cause holds it."""
    held = posture_mod.check_cause(cause) in sup.posture.state.causes
    posture_effects.after_posture_change(sup, sup.posture.release(cause, sup.host.now_ms()))
    if held:
        log.warning("fleet %s: operator released the posture cause %s", sup.name, cause)
    return {**sup.posture.show(sup.host.now_ms()), "released": held}


# ---------------------------------------------------------------------- intake
def set_draining(sup, draining: bool) -> None:
    """Drain: take nothing new from the queues (in-flight units complete); or take again."""
    sup._draining = draining
    sup._dispatch()


def reload(sup, config) -> dict:
    """Apply what can change on a live fleet (posture policy, queue bounds, the provider
    catalog); report what needs a restart. Nothing is applied if the posture policy is
    invalid, or if the config could not boot on this host now (its typed boot refusal
    is raised)."""
    # A config a restart would refuse (a budget over the quota, no handler) is refused
    # whole: accepting its live parts would leave a fleet that cannot start again.
    quota_mod.project(config, sup.host.effective_cpus(), sup._cpus_override or sup.host.affinity())
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
    if config.posture != sup.posture.policy:
        patch = {k: v for k, v in config.posture.to_dict().items() if v != getattr(sup.posture.policy, k)}
        if patch:
            sup.posture.retune(patch, sup.host.now_ms())
            sup.publisher.posture_record()
            applied.append("posture")
    if sup._providers.reload(config.admission)[0]:
        applied.append("admission")
    if "roles" not in restart:
        bounds = [config.roles[r.name].queue_bound for r in sup.roles]
        if bounds != sup._room.bounds():
            sup._room.set_bounds(bounds)
            applied.append("roles.*.queue_bound")
    # A reload is an epoch boundary (002 §3.4): pins are released (T9) once empty.
    if sup.dispatcher.begin_epoch():
        applied.append("pins released")
    sup._dispatch()
    return {"applied": applied, "needs_restart": restart}


# ---------------------------------------------------------------------- provider admission
def admission_census(sup) -> dict:
    """The provider admission's read model: bulkheads, lane x bulkhead rows, closures,
    starving, waiting units with their reason (fleet.runtime.provider_gate)."""
    return sup._providers.census()


def admission_close(sup, pool: str, until: float, message: str = "") -> dict:
    """Close a provider or key (``provider[/credential]``) until `until` (UTC epoch seconds)."""
    result = sup._providers.close(pool, until, message)
    sup._providers.publish(force=True)
    return result


def admission_reopen(sup, pool: str) -> dict:
    """Lift a provider's or key's closure; its waiting units start at the loop's next turn."""
    result = sup._providers.reopen(pool)
    sup._providers.publish(force=True)
    return result


def admission_budget(sup, provider: str, spent: float, limit: float | None) -> dict:
    """The provider's daily budget reading (fleet.runtime.provider_gate.ProviderGate.report_budget)."""
    result = sup._providers.report_budget(provider, spent, limit)
    sup._providers.publish(force=True)
    return result


def admission_ask(sup, question):
    """Answer a coordinator question (``question(gate)``: allowance, plan, starving) on
    the loop, as every other call on the provider gate; it reads the pool and seats nothing."""
    return question(sup._providers)


def admission_reload_refused(sup, why: str) -> None:
    """A reload whose [admission] section did not load: the last good catalog stays; say why."""
    sup._providers.refused_reload(why)
