"""Children submitted from inside a running unit, on the loop: their submits in, their
outcomes back to the parent's worker (fleet.worker.inside is the worker's end).

A CHILD message from a seat's worker is a running unit's submit: it is taken only from
the seat its parent was sent to while the parent is owed (else it is stray, as a
result would be), and goes through the one submit path (`Submitter.submit`, on the
loop: it never waits for queue room, a full queue is the child's QueueFull) with
``parent`` the running unit, for the gates (a provider child is delegated: 000 §9,
fleet.runtime.provider_gate) and the dispatcher (the parent is parked: its children
are granted first and may ride its slot, fleet.rules.dispatch). A refused submit is
the child future's exception in the worker.

A child's outcome goes back to its parent's worker as a CHILD_DONE message on the
seat's tasks ring, while the parent is owed: a parent that ended (or whose worker
died) has nobody waiting. The value or the exception travels as the caller's side
would see it (fleet.rules.raised applies in the worker; in service mode a value kept
pickled for fleetd's clients is unpickled there too).

Deaths and cancels: a parent that ends without solving (its worker died: LaneDeath;
it failed, timed out, was stopped) takes its children that have not started with it:
their futures are cancelled, and each is recorded Cancelled as it comes up for its
grant (the one path of a cancel). Its children that run finish, each with its own
outcome. A child whose worker died is LaneDeath, which its parent sees as the child's
exception (UnitBroken).

One owner: the loop thread.
"""
from __future__ import annotations

import logging

from fleet.rules.outcomes import FAILED, SOLVED
from fleet.rules.unit import Outcome, UnitError
from fleet.rules.vocab import Reason
from fleet.shm import messages as M
from fleet.shm import parcels
from fleet.worker import codec
from fleet.worker.inside import DONE_CANCELLED, DONE_RAISED, DONE_UNIT_ERROR, DONE_VALUE

_SOLVED = Outcome(SOLVED)

log = logging.getLogger(__name__)


class Inside:
    """The children of running units: submitted, tracked, and answered to their parents."""

    def __init__(self, name: str, roles, submitter, books, dispatcher, seats, sent_to):
        self._name, self._roles, self._submitter = name, roles, submitter
        self._books, self._dispatcher, self._seats, self._sent_to = books, dispatcher, seats, sent_to
        self._kids: dict[int, tuple] = {}  # child -> (parent, seat, its id in the parent's worker, role name)
        self._of: dict[int, set] = {}  # parent -> its children owed
        self.submitted = 0  # children submitted from inside, all told
        self.publisher = None  # fleet.runtime.publish: the count in the table

    def __len__(self) -> int:
        """Children owed an outcome."""
        return len(self._kids)

    def child(self, seat: int, view) -> None:
        """A CHILD message from `seat`'s worker: the child submitted, or its refusal sent back."""
        if len(view) < M.CHILD_HEAD.size:
            self._books.stray(self._seats.name(seat), f"a child's submit too short ({len(view)} bytes)")
            return
        parent, local, code, flags = M.CHILD_HEAD.unpack_from(view)
        try:
            args, body, parcel, items, size = codec.loads(view[M.CHILD_HEAD.size:], "a child's submit")
        except codec.CodecError as exc:
            self._answer(seat, local, DONE_RAISED, (RuntimeError(str(exc)), None))
            return
        if self._books.get(parent) is None or not self._sent_to(parent, seat):
            if parcel is not None:
                parcels.remove(parcel)
            self._books.stray(self._seats.name(seat), f"a child's submit from unit {parent}, which does not run there")
            return
        self._dispatcher.park(parent)  # first: the child is accepted within the submit, into its parent's queue
        try:
            role = self._roles.by_code(code).name
            # the caller's limits hold for a child's payload too: its size, and its parcel's room
            self._submitter.room_for_child(role, body, parcel, size)
        except BaseException as exc:  # noqa: BLE001 - refused: the child's outcome in the worker
            if parcel is not None:
                parcels.remove(parcel)
            self._answer(seat, local, DONE_RAISED, (exc, None))
            return
        try:  # from here on a refusal removes the parcel and gives its room back (Submitter)
            route = args.get("route")
            future = self._submitter.submit(
                role, key=args.get("key"), lane=args.get("lane"), priority=args.get("priority", 0),
                timeout=args.get("timeout"), request_id=args.get("request_id"), route=route,
                severity=args.get("severity"), pinned=args.get("pinned", False),
                parent=parent if route is not None else None, tag=args.get("tag"), age=args.get("age", 0.0),
                block=False, chunk=bool(flags & M.F_CHUNK), items=items, packed=(body, parcel, size if parcel else 0),
                child_of=parent)
        except BaseException as exc:  # noqa: BLE001 - a refused submit is the child's outcome in the worker
            self._answer(seat, local, DONE_RAISED, (exc, None))
            return
        kid = future.unit_id
        self.submitted += 1
        if self.publisher is not None:
            self.publisher.child_submitted(self.submitted)
        self._kids[kid] = (parent, seat, local, role)
        self._of.setdefault(parent, set()).add(kid)
        future.add_done_callback(lambda f, kid=kid: self._done(kid, f))

    def ended(self, unit_id: int, outcome) -> None:
        """A unit ended (the books' one end): a parent that did not solve takes its children
        that have not started with it (their futures cancelled: Cancelled at their grant)."""
        kids = self._of.pop(unit_id, None)
        if kids and outcome.kind != SOLVED:
            self._cancel(kids)

    def solved(self, unit_ids: list) -> None:
        """`ended` of each of `unit_ids`, all solved (a slice's plain units), in one call:
        a call each only while some unit has children."""
        if self._of:
            for unit_id in unit_ids:
                self.ended(unit_id, _SOLVED)

    def cancel_children(self, unit_id: int) -> int:
        """The operator cancelled running unit `unit_id` (the cancel op): its children that
        have not started are cancelled, by the rule of a parent that ends without solving;
        those that run finish. The parent itself runs on and hears Cancelled as their
        outcomes. How many were cancelled."""
        return self._cancel(self._of.get(unit_id, ()))

    def _cancel(self, kids) -> int:
        cancelled = 0
        for kid in list(kids):
            unit = self._books.get(kid)
            # refused (False) once it runs: it finishes
            if unit is not None and unit.future.cancel():
                cancelled += 1
        return cancelled

    def unorphaned(self, items: list) -> list:
        """Of the units a dead seat owed that never started (going back to their queues), those
        whose parent ended without solving end Cancelled here (their futures run already: they
        had been granted); the others, returned, go back."""
        back = []
        for item in items:
            ended = self._books.ended(item.parent) if item.parent and item.parent not in self._books else None
            if ended is not None and ended.kind != SOLVED:
                self._books.close(item.unit_id, Outcome(FAILED, Reason.CANCELLED,
                                                        f"its parent, unit {item.parent}, ended {ended.reason}"))
            else:
                back.append(item)
        return back

    def _done(self, kid: int, future) -> None:
        """A child's future resolved (on the loop, at delivery): its outcome to its parent's worker."""
        parent, seat, local, role = self._kids.pop(kid)
        kids = self._of.get(parent)
        if kids is not None:
            kids.discard(kid)
        if self._books.get(parent) is None or not self._sent_to(parent, seat):
            return  # the parent ended, or its worker died: nobody waits on this outcome
        if future.cancelled():
            self._answer(seat, local, DONE_CANCELLED, (kid, role, "the child was cancelled"))
            return
        exc = future.exception()
        if exc is None:
            self._answer(seat, local, DONE_VALUE, future.result())
        elif isinstance(exc, UnitError):
            self._answer(seat, local, DONE_UNIT_ERROR, (exc.unit_id, exc.role, exc.outcome, exc.original))
        else:  # the child's own exception, its worker's traceback as its cause
            self._answer(seat, local, DONE_RAISED, (exc, getattr(exc.__cause__, "tb", None)))

    def _answer(self, seat: int, local: int, kind: int, what) -> None:
        """Send a CHILD_DONE to `seat`'s worker: `what` pickled (beside the ring when large);
        one that cannot be pickled is sent as the text of why."""
        ring_max = self._seats.task_max(seat) - M.CHILD_DONE_HEAD.size
        try:
            body, _parcel = codec.pack((what if kind != DONE_RAISED else _raised(what)), "a child's outcome",
                                       self._name, take=True, inline_max=min(codec.INLINE_MAX, ring_max))
        except (codec.CodecError, parcels.ParcelError) as exc:
            kind = DONE_RAISED
            body, _parcel = codec.pack((RuntimeError(f"the child's outcome cannot reach its parent: {exc}"), None),
                                       "a child's outcome", self._name, take=True)
        self._seats.send_message(seat, M.CHILD_DONE, M.CHILD_DONE_HEAD.pack(local, kind) + body)


def _raised(what: tuple) -> tuple:
    """(exception, traceback text): the exception itself when it pickles, else its text."""
    exc, text = what
    try:
        codec.dumps(exc, "the child's exception")
    except codec.CodecError as err:
        return RuntimeError(f"{codec.describe(exc)} (it cannot reach the parent: {err})"), text
    return exc, text
