"""The ops that change what a fleet takes in: drain, resume, and a reload of its config."""
from __future__ import annotations

import dataclasses

from fleet.service.control.ops.base import OPS, Op


@OPS.register
class DrainOp(Op):
    name = "drain"
    mutating = True
    summary = "Stop taking new units; in-flight units finish."
    command = ("drain",)
    help = "Stop taking new units; in-flight units finish (undo with `fleetctl resume`)."

    def run(self, sup) -> dict:
        """Take nothing new from the queues; in-flight units finish (undo with `resume`).
        ``{"draining": True}``."""
        sup.call(sup.set_draining, True)
        return {"draining": True}


@OPS.register
class ResumeOp(Op):
    name = "resume"
    mutating = True
    summary = "Take new units again after a drain."
    command = ("resume",)
    help = "Take new units again after `fleetctl drain`."

    def run(self, sup) -> dict:
        """Take units from the queues again after `drain`. ``{"draining": False}``."""
        sup.call(sup.set_draining, False)
        return {"draining": False}


@OPS.register
class ReloadOp(Op):
    name = "reload"
    no_wire = "a fleet reads its config where it runs: fleetd on SIGHUP, an embedded fleet in Fleet.reload"
    no_command = "systemctl reload (SIGHUP) reloads fleetd"
    method = None
    no_method = "fleetd reloads on SIGHUP; an embedded fleet has Fleet.reload"

    def on_loop(self, sup, config) -> dict:
        """Apply what can change on a live fleet of `config` (a FleetConfig: posture policy,
        queue bounds, the provider catalog); report what needs a restart: ``applied``,
        ``needs_restart``. Nothing is applied if the posture policy is invalid, or if the
        config could not boot on this host now (its typed boot refusal is raised)."""
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
