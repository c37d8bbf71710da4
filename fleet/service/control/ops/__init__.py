"""The ops: each op is one class holding all of it (fleetctl's command, the client's
method, the wire request and its check, the loop's half and the served half), and the
registry every side is made from (`OPS`; `fleet.service.control.ops.base`).

Adding an op is one class in one module of this package: fleetctl's command list and
help, `fleet.Client`'s methods, `fleet.Fleet`'s operator methods, the façade over a
supervisor (`Operations`), fleetd's served operations (`ServedOperations`) and the
server's dispatch all come from `OPS`. Its CLI half lives here, not in `fleet.cli` (the
floor above): it needs only argparse and the pure parsing and text of `terminal`.
fleetctl adds what every command shares (``--name``, ``--trust-uid``, ``--json``); the
one reply drawn with the status screen's tables (``admission show``) is drawn by
`fleet.cli.views`, keyed by op name.

The modules register in fleetctl's order: status (ping, status, ledger), posture,
intake (drain, resume, drain_state, reload), units (submit, collect, cancel), admission.
"""
from __future__ import annotations

from fleet.service.control.ops.base import COMMAND_GROUPS, OPS, Op, OpRegistry
from fleet.service.control.ops import status, posture, intake, units, admission  # noqa: F401, E402 - register
from fleet.service.control.ops import why  # noqa: F401, E402 - register (after admission: fleetctl's order)
from fleet.service.control.ops.posture import POSTURE_KEYS
from fleet.service.control.ops.units import (CANCEL_STATES, CANCELLED, COLLECT_MAX_WAIT_S, COLLECT_REPLY_BUDGET,
                                              ENDED, RUNNING, UNKNOWN)

#: The operator ops over a `fleet.runtime.loop.Supervisor` (`fleet.Fleet.operations`), a
#: method per op, made from `OPS`.
Operations = OPS.facade()
#: fleetd's control handler: `Operations` with the ops' served halves, made from `OPS`.
ServedOperations = OPS.served(Operations)

__all__ = ["CANCEL_STATES", "CANCELLED", "COLLECT_MAX_WAIT_S", "COLLECT_REPLY_BUDGET", "COMMAND_GROUPS", "ENDED",
           "OPS", "Op", "OpRegistry", "Operations", "POSTURE_KEYS", "RUNNING", "ServedOperations", "UNKNOWN"]
