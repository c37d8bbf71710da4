"""The ops that read a fleet whole: ping, status, ledger."""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from fleet.service.control.ops.base import OPS, Op


@OPS.register
class PingOp(Op):
    name = "ping"
    summary = "Check that the daemon's main loop answers."
    no_command = "every fleetctl command that reaches the daemon shows it answers; fleetctl status shows its state"

    def run(self, sup) -> dict:
        """``{"pong": True, "pid"}``: the daemon's loop answers."""
        return {"pong": True, "pid": os.getpid()}

    def execute(self, handler, args: dict[str, Any]) -> Any:
        # No handler method: answering at all proves the owning loop is turning.
        return {"pong": True, "pid": os.getpid()}


@OPS.register
class StatusOp(Op):
    name = "status"
    summary = "Plan, budget, census, posture, ledger counters and queue depths."
    no_command = "fleetctl status reads the fleet's table: it answers for an embedded fleet and a busy daemon too"
    fleet = True

    def run(self, sup) -> dict:
        """What `fleetctl status --json` shows for this fleet, plus ``admission``: the provider
        admission's read model (per bulkhead and per lane x bulkhead rows, closures, the
        starving list, units waiting with their reason and until-when; reference 000 §10).
        A served fleet adds its daemon's own ``daemon`` section."""
        from fleet.shm.status import gather

        doc = gather(sup.name)
        doc["admission"] = sup.call(sup.providers.census, view=True)
        return doc

    def on_daemon(self, daemon) -> dict:
        doc = self.run(daemon.sup)
        doc["daemon"] = {"pid": os.getpid(), "draining": daemon.sup.draining, "stopping": daemon.stopping,
                         "clients": daemon.store.tokens(), "outcomes_held": daemon.store.undelivered()}
        return doc


@OPS.register
class LedgerOp(Op):
    name = "ledger"
    summary = "Ledger counters: submitted, solved, suppressed, failed by reason."
    no_command = "fleetctl status shows the ledger (read from the table)"
    fleet = True

    def run(self, sup) -> dict:
        """submitted, solved, suppressed, failed (+ in flight and failures by reason)."""
        return sup.ledger_counts().to_dict()
