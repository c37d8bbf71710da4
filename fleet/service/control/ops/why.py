"""The op that says why a unit is not running: `fleetctl why UNIT`, `Fleet.why`, `Client.why`.

Its loop half reads the unit's facts from the state the loop's owners hold
(`fleet.runtime.why`) and answers by the one rule (`fleet.rules.why`); without a unit it
lists the oldest units that wait, each with the same reason (what `fleetctl status` shows).
"""
from __future__ import annotations

from typing import Any

from fleet.rules import ranges, why
from fleet.rules.errors import EXIT_OK
from fleet.service.control.errors import RemoteError
from fleet.service.control.ops.base import OPS, Op, in_range
from fleet.service.control.wire import Arg

#: Most waiting units one answer lists.
OLDEST_MAX = 100


def answerer(sup):
    """The `fleet.runtime.why.Why` over a supervisor's components (on its loop)."""
    from fleet.runtime.why import Why

    return Why(name=sup.name, roles=sup.roles, door=sup.door, books=sup.books, gates=sup.gates,
               dispatcher=sup.dispatcher, seats=sup.seats, posture=sup.posture)


@OPS.register
class WhyOp(Op):
    """Why a unit is not running (or that it runs, or how it ended), from the loop's state.

    With ``unit``: ``{"unit", "state", "text", ...}``, ``state`` one of
    `fleet.rules.why.STATES` and the facts it was told from (``queued``: the units ahead
    and the role's room; ``granted``: slot, seat, pid, since; ``gate``: the provider's hold
    or the lease's place and quotas; ``ended``: the outcome). An id the fleet never handed
    out raises UnknownUnit (fleetctl exits 65). Without: ``{"waiting": [...], "owed"}``,
    the ``oldest`` units that wait, the oldest first, each answered so."""

    name = "why"
    summary = "Why a unit is not running: queued, waiting for a slot, a key, the cordon, its provider or lease; or running, or ended."
    schema = {
        "unit": Arg((int, type(None)), doc="the unit id (submit's reply, Future.unit_id); none: the oldest waiting"),
        "oldest": Arg((int,), default=why.OLDEST, doc=f"without unit: how many waiting units to list, 1-{OLDEST_MAX}"),
    }
    command = ("why",)
    help = "Say why a unit is not running yet (or where it runs, or how it ended); without UNIT, the oldest waiting."
    description = (help + " Exit 0; 65: no unit of this fleet has that id.")
    fleet = True
    view = True

    def on_loop(self, sup, unit: int | None = None, oldest: int = why.OLDEST) -> dict:
        """Why unit ``unit`` is not running: ``{"unit", "state", "text", ...}`` (see the op);
        UnknownUnit for an id this fleet never handed out. Without ``unit``: the ``oldest``
        units that wait, each so answered: ``{"waiting": [...], "owed"}``."""
        if unit is not None:
            self._check_unit(unit)
            return answerer(sup).unit(unit)
        if isinstance(oldest, bool) or not isinstance(oldest, int) or not 1 <= oldest <= OLDEST_MAX:
            raise why.BadWhy(f"oldest must be a whole number 1-{OLDEST_MAX}, got {oldest!r}")
        return {"waiting": answerer(sup).oldest(oldest), "owed": len(sup.books)}

    @staticmethod
    def _check_unit(unit) -> None:
        if isinstance(unit, bool) or not isinstance(unit, int) or not ranges.UNIT_ID.holds(unit):
            raise why.BadWhy(f"unit must be a unit id (a whole number >= 1), got {unit!r}")

    def check(self, args: dict[str, Any]) -> None:
        in_range(self, "unit", args["unit"], ranges.UNIT_ID)
        if not 1 <= args["oldest"] <= OLDEST_MAX:
            raise self.bad(f"oldest must be 1-{OLDEST_MAX}, got {args['oldest']!r}")

    def client(self, call, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().client(call, *args, **kwargs)
        except RemoteError as exc:
            if exc.type == why.UnknownUnit.__name__:
                bound = self.signature.bind(*args, **kwargs)
                raise why.UnknownUnit(bound.arguments.get("unit"), message=exc.message) from None
            raise

    # -- fleetctl
    def add_arguments(self, parser) -> None:
        parser.add_argument("unit", metavar="UNIT", type=int, nargs="?",
                            help="the unit id (submit's reply, Future.unit_id); none: the oldest waiting units")
        parser.add_argument("--oldest", type=int, default=why.OLDEST, metavar="N",
                            help=f"without UNIT: how many of the oldest waiting units to list (default {why.OLDEST})")

    def from_cli(self, args) -> dict[str, Any]:
        return {"unit": args.unit, "oldest": args.oldest}

    def render(self, result: Any, args) -> str:
        if "waiting" in result:
            return render_waiting(result["waiting"], result["owed"])
        return result["text"] + "\n"

    def exit_code(self, result: Any) -> int:
        return EXIT_OK


def render_waiting(waiting: list, owed: int) -> str:
    """The waiting units' lines (the oldest first), as `fleetctl why` and `fleetctl status` print them."""
    if not waiting:
        return f"no unit waits ({owed} owed an outcome, all running)\n"
    return "".join(f"  {w['text']}\n" for w in waiting)
