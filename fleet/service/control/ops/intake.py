"""The ops that change what a fleet takes in: drain, resume, and a reload of its config."""
from __future__ import annotations

import dataclasses
import functools

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

    def run(self, sup, config) -> dict:
        """Check `config` as a boot would, then apply it (`on_loop`). A config a restart
        would refuse is refused whole, with that refusal, and changes nothing: accepting
        its live parts would leave a fleet that cannot start again. Boot's checks: the
        budget this host would plan now (BudgetOverQuota, BelowHostFloor, ...), and every
        role's handler resolved in the worker fork server, where the workers get theirs
        (ConfigError naming the role: a module or function missing, not callable, an async
        one on a CPU-bound role, an import that hangs or ends its process).

        The check's request goes out on the loop (the link's owner); its answer is awaited
        here, so the loop dispatches meanwhile."""
        from fleet.runtime.zygote_link import await_check

        await_check(sup.call(functools.partial(self._ask_check, sup, config)))
        return sup.call(functools.partial(self.on_loop, sup, config))

    @staticmethod
    def _ask_check(sup, config):
        sup.project(config)  # the pure budget rule first: a refusal here asks the fork server nothing
        zygote = sup.seats.workers.zygote
        if zygote is None:
            from fleet.runtime.zygote_link import WorkerStartError

            raise WorkerStartError("the worker fork server is not running (it is being replaced): "
                                   "the handlers cannot be checked; reload again")
        return zygote.check(config.roles)

    def on_loop(self, sup, config) -> dict:
        """Apply what can change on a live fleet of `config` (a FleetConfig: posture policy,
        queue bounds, the provider catalog); report what needs a restart: ``applied``,
        ``needs_restart``. Nothing is applied if the posture policy is invalid. `run` has
        checked `config` as a boot would first."""
        applied, restart = [], []
        old = sup.config
        for field in ("name", "profile", "cpus", "budget", "limits", "restart", "metrics", "store",
                      "saturation"):
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
