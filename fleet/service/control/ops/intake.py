"""The ops that change what a fleet takes in: drain, resume (and the drain's state), and a
reload of its config."""
from __future__ import annotations

import argparse
import functools

from admission.records import replace
from fleet.rules.errors import EXIT_FAILURE, EXIT_OK, EXIT_TIMED_OUT
from fleet.service.control.ops.base import OPS, Op


#: How often ``fleetctl drain --wait`` asks whether anything is still owed.
DRAIN_POLL_S = 0.2


@OPS.register
class DrainOp(Op):
    name = "drain"
    mutating = True
    fleet = True
    summary = "Refuse new units (Draining) while queued and in-flight units finish."
    command = ("drain",)
    help = ("Refuse new submits (clients get fleet.Draining, a retryable refusal) while queued and in-flight "
            "units finish; status, top and the log show since when. --wait returns once nothing is queued "
            "or in flight. Undo with `fleetctl resume`.")

    def run(self, sup) -> dict:
        """Refuse new submits with `fleet.Draining` (retryable: submit again after `resume`)
        while queued and in-flight units run to their outcomes. Draining again keeps the
        first drain's start. ``{"draining": True, "since", "since_utc", "owed"}``: ``owed``
        units are queued or in flight; `drain_state` tells when it reaches 0."""
        return sup.call(sup.set_draining, True)

    # -- fleetctl: --wait polls drain_state until nothing is owed (the daemon never blocks on it)
    def add_arguments(self, parser) -> None:
        parser.add_argument("--wait", action="store_true",
                            help="return once nothing is queued or in flight (exit 0), or once --timeout passes "
                                 f"with units still owed (exit {EXIT_TIMED_OUT}); the drain stays either way")
        parser.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                            help="with --wait: give up waiting after this many seconds (default: wait as long as "
                                 "it takes)")

    def cli_call(self, call, args) -> dict:
        if args.timeout is not None and not args.wait:
            raise SystemExit("fleetctl drain: --timeout is for --wait")
        state = call(self.name)
        if not args.wait:
            return state
        import time  # fleetctl's half only

        start = time.monotonic()
        while True:
            if not state["draining"]:
                state["wait"] = "resumed"  # someone resumed meanwhile: nothing to wait for
                break
            if state["owed"] == 0:
                state["wait"] = "drained"
                break
            if args.timeout is not None and time.monotonic() - start >= args.timeout:
                state["wait"] = "timed out"
                break
            time.sleep(DRAIN_POLL_S)
            state = call("drain_state")
        state["waited_s"] = round(time.monotonic() - start, 3)
        return state

    def render(self, result: dict, args) -> str:
        text = f"draining since {result['since_utc']}: new submits are refused (fleet.Draining)"
        wait = result.get("wait")
        if wait == "drained":
            return f"{text}; drained: nothing queued or in flight (waited {result['waited_s']:g} s)\n"
        if wait == "resumed":
            return f"resumed while waiting: not draining, {result['owed']} unit(s) queued or in flight\n"
        tail = f"; {result['owed']} unit(s) queued or in flight still finish"
        if wait == "timed out":
            return f"{text}{tail}: --timeout passed after {result['waited_s']:g} s\n"
        return f"{text}{tail}; fleetctl resume lifts it\n"

    def exit_code(self, result: dict) -> int:
        return {"timed out": EXIT_TIMED_OUT, "resumed": EXIT_FAILURE}.get(result.get("wait"), EXIT_OK)


@OPS.register
class ResumeOp(Op):
    name = "resume"
    mutating = True
    fleet = True
    summary = "Take new units again after a drain."
    command = ("resume",)
    help = "Take new units again after `fleetctl drain`."

    def run(self, sup) -> dict:
        """Take new units again after `drain`. ``{"draining": False, "since": None, "owed"}``."""
        return sup.call(sup.set_draining, False)

    def render(self, result: dict, args) -> str:
        return f"resumed: taking new units ({result['owed']} unit(s) queued or in flight)\n"


@OPS.register
class DrainStateOp(Op):
    name = "drain_state"
    fleet = True
    summary = "Whether the fleet drains, since when, and how many units it still owes."
    no_command = "fleetctl status shows the drain; fleetctl drain --wait polls this op"

    def run(self, sup) -> dict:
        """``draining``, ``since`` (epoch seconds or None), ``since_utc``, ``owed`` (units
        queued or in flight). Read on the caller's thread: the door's flag and the ledger."""
        return sup.drain_state()


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


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
        from fleet.runtime.config import supervisor_limits  # here: the client's import of the ops stays light

        applied, restart = [], []
        old = sup.config
        for field in ("name", "profile", "cpus", "budget", "restart", "memory", "metrics", "store", "saturation"):
            if getattr(config, field) != getattr(old, field):
                restart.append(field)
        if supervisor_limits(config.limits) != supervisor_limits(old.limits):
            restart.append("limits")  # fleetd's own (config.DAEMON_LIMITS) it applies itself, live
        # Compare roles with the one live field masked (1: a Role refuses a bound below 1).
        old_roles = {r.name: replace(r, queue_bound=1) for r in old.roles}
        new_roles = {r.name: replace(r, queue_bound=1) for r in config.roles}
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
