"""A submit, on the caller's thread: checked, pickled, given room in its role's queue,
and posted to the loop.

`submit` validates a unit on its face and pickles it here, on the caller's thread (a
provider unit's route too: `ProviderGate.check`), takes room in the role's queue
(`fleet.runtime.intake.QueueRoom`: it waits for room, or refuses with QueueFull), and
posts the unit to the loop (`fleet.runtime.intake.Intake`), which accepts it
(`fleet.runtime.accept`). Nothing here touches the loop's state: it reads only the
supervisor's door (`fleet.runtime.intake.Door`), whose flags are plain attributes the
loop swaps whole, the ledger (thread-safe) and the provider gate's check of a route.
A submit the loop never accepts (it stopped meanwhile) is counted and fails Shutdown
(`turned_away`): the caller holds its future, so it is never an orphan.
"""
from __future__ import annotations

import itertools
from concurrent.futures import Future

from admission.records import record
from fleet.rules import ranges
from fleet.rules.dispatch import Pending
from fleet.rules.outcomes import FAILED
from fleet.rules.unit import BadUnit, Outcome, PayloadTooLarge, QueueFull, error_for
from fleet.rules.vocab import Reason
from fleet.runtime.accept import fail_future
from fleet.runtime.beside import Beside
from fleet.worker import codec
from fleet.runtime.future import UnitFuture
from fleet.shm import messages as M
from fleet.shm import parcels

#: Most units one `submit_many` command carries to the loop: the loop starts on a run
#: while the caller still makes the next.
SUBMIT_RUN = 256

#: A unit's arguments besides its role and payload, with their defaults: the one signature
#: of a submit. `Submitter.submit` takes them by these names (a test holds it to them), and
#: the faces are made with them: `fleet.Fleet.submit` (`submit_signature`), `fleet.Client.submit`
#: and the submit op, which carries each with its wire type.
UNIT_ARGS = {"key": None, "lane": None, "priority": 0, "timeout": None, "request_id": None, "route": None,
             "severity": None, "pinned": False, "parent": None, "tag": None, "age": 0.0}
#: What a caller in the fleet's own process may add: how long it waits for queue room (a
#: served submit never waits: fleetd's loop serves every client).
WAIT_ARGS = {"block": True, "block_timeout": None}


def submit_signature(*extra: dict):
    """A function of signature ``(self, role, payload=None, /, *, <UNIT_ARGS>, <extra>) -> Future``,
    which a face's submit (``def submit(self, role, payload=None, /, **unit)``) takes as its
    ``__wrapped__``: `inspect.signature` and help() follow it and show the arguments by
    name. A function rather than an `inspect.Signature` in ``__signature__``: inspect (with
    ast and dis, ~4 ms) would be imported by every process that imports a face, an
    `Executor()`'s start among them."""
    defaults = {name: default for table in (UNIT_ARGS, *extra) for name, default in table.items()}
    keywords = ", ".join(f"{name}=_defaults[{name!r}]" for name in defaults)
    scope = {"_defaults": defaults, "Future": Future}
    source = f"def submit(self, role, payload=None, /, *, {keywords}) -> Future:\n    pass\n"
    exec(compile(source, __name__, "exec", dont_inherit=True), scope)  # noqa: S102 - Future itself, not its name
    return scope["submit"]


def check_unit_args(given: dict, allowed) -> None:
    """TypeError naming a keyword a face's submit does not take (its signature says which)."""
    if not given.keys() <= allowed:
        raise TypeError(f"submit() got an unexpected keyword argument {sorted(given.keys() - allowed)[0]!r}")


@record(frozen=False, slots=True, kw_only=True)
class LoopUnit(Pending):
    """A unit the loop holds, from its accept to its outcome. It is also what the
    dispatcher queues (a `Pending`): one object per unit on the hot path, not one per
    stage, so a burst of submits leaves the garbage collector fewer objects to track."""

    future: Future
    body: bytes
    flags: int
    timeout: float | None
    queued: bool = True  # holds room in its role's queue (fleet.runtime.intake.QueueRoom) until granted or ended
    due: float | None = None  # when its current run times out (a refused unit runs again: a new deadline)
    route: object = None  # a provider unit's fleet.Route, as submitted
    ask: dict | None = None  # its admission arguments (lane, severity, ...), until the provider gate decides it
    items: int = 1  # what the ledger counts it as in items: a chunk of a map is one unit of many
    since: float = 0.0  # UTC epoch seconds of its (latest) grant: what `fleetctl why` says it runs since
    #: Passed every gate at once at its accept (no route, a role no gate holds, no parent):
    #: no gate ever hears of it, so its start and its solved end take the batch paths
    #: (fleet.runtime.accept `accept_run`, fleet.runtime.results `take`).
    plain: bool = False
    #: Its payload's memfd, handed to each worker that runs it (fleet.shm.handoff.Handed;
    #: a service-mode client's large payload), sent before its task; None for any other.
    handed: object = None


class Submitter:
    """The caller's half of a submit, for one fleet: checks, pickles, takes queue room
    and posts to the loop's `accept` (or `accept_many`). Any thread may call it."""

    def __init__(self, door, roles, ledger, limits, recorder=None, handoff: bool = False):
        self._door, self._roles, self._ledger, self._recorder = door, roles, ledger, recorder
        #: fleetd's fleet: a payload a client sent in a memfd is handed to its worker as it
        #: is, never copied here (fleet.shm.handoff)
        self.handoff = handoff
        self._room, self._intake = door.room, door.intake
        self._max_payload = limits.max_payload_bytes
        self.beside = Beside(limits.max_parcel_bytes)  # payload bytes in parcels, capped (backpressure)
        # the parcels payloads travel in, kept warm between units (fleet.shm.parcels.Warm)
        self.warm = parcels.Warm(door.name, keep=min(parcels.WARM_MAX, self.beside.cap // 4))
        self._providers = None  # the provider gate (its `check` of a route), once boot made it
        self._accept = self._accept_many = None  # the loop's half, once composed
        self._plain_specs: dict = {}  # role code -> its spec, once it took a unit with no arguments (submit_plain)

    def connect(self, accept, accept_many, providers) -> None:
        """Where submits go: the loop's `accept` and `accept_many`; `providers`: the
        provider gate whose `check` judges a route here, on the caller's thread."""
        self._accept, self._accept_many, self._providers = accept, accept_many, providers

    def submit(self, role: str, payload=None, *, key=None, lane=None, priority: int = 0, timeout=None,
               request_id=None, chunk: bool = False, pickled_payload: bytes | None = None, route=None,
               severity=None, pinned: bool = False, parent=None, tag=None, age: float = 0.0, block: bool = True,
               block_timeout: float | None = None, items: int | None = None, packed: tuple | None = None,
               child_of: int = 0) -> Future:
        """Queue a unit (see Fleet.submit). `pickled_payload`: the payload already pickled
        by a service-mode client; it travels to the worker as it is, never unpickled here.
        `items`: how many items a chunk holds, for the ledger (a pickled chunk's client
        says; a chunk given as a list is counted here).
        A unit with a `route` asks the provider admission first (fleet.runtime.provider_gate).
        `packed`: the task body already made (`codec.pack_task`'s triple) by the running unit
        `child_of` that submits it from inside (fleet.runtime.inside).

        A full queue makes the caller wait for room (at most `block_timeout` seconds),
        or refuses at once with QueueFull when `block` is False. (A future's callback,
        which runs on the loop thread, never waits: it would wait for itself.)"""
        code = self._roles.code(role)
        spec = self._roles.by_code(code)
        _check_unit(spec, key, lane, priority, timeout, request_id)
        if block_timeout is not None and (isinstance(block_timeout, bool) or not isinstance(block_timeout, (int, float))
                                          or block_timeout < 0):
            raise BadUnit(f"block_timeout must be a number of seconds >= 0, got {block_timeout!r}")
        if route is None:
            if severity is not None or pinned or parent is not None or tag is not None or age:
                raise BadUnit("severity, pinned, parent, tag and age are provider admission arguments: give route= too")
            admission = None
        else:
            if chunk:
                raise BadUnit("a chunk of items takes no route: submit provider calls one by one")
            admission = {"lane": lane, "severity": severity, "pinned": pinned, "parent": parent, "tag": tag,
                         "age": age}
            if parent is not None and (type(parent) is not int or not self._ledger.is_open(parent)):
                # 000 §9: only a unit of this fleet that is still owed may delegate (the loop
                # then grants the privilege only while the parent holds a seat)
                raise BadUnit(f"parent {parent!r} is no unit running in fleet {self._door.name!r}: "
                              "only a running unit delegates")
            if self._providers is not None:
                # The one check of its ask (the loop checks again only after a reload)
                admission["checked"] = self._providers.check(route, **admission)
        if packed is not None:
            parcel = packed
        else:
            parcel = codec.pack_task(role, payload, key, lane, request_id, pickled_payload=pickled_payload,
                                     limit=self._max_payload, fleet=self._door.name, room=self.beside,
                                     block=block and not self._door.on_loop(), block_timeout=block_timeout,
                                     writer=self.warm.write, handoff=self.handoff)
        body = parcel[0]
        timeout = timeout if timeout is not None else spec.timeout_s
        flags = _task_flags(chunk, timeout, self._recorder is not None)
        unit, on_loop = self._queued(code, role, key, priority, body, flags, timeout, block, block_timeout, parcel,
                                     child=bool(child_of))
        unit.route, unit.ask, unit.parent = route, admission, child_of
        if chunk:
            unit.items = items if items is not None else len(payload) if pickled_payload is None else 1
        return self._post(unit, on_loop, role, payload, key, lane, hand_over=block)

    def room_for_child(self, role: str, body: bytes, parcel: str | None, size: int) -> None:
        """A running unit's child, packed in its worker (`codec.pack_task`): held to
        limits.max_payload_bytes as a caller's payload is, and its parcel's bytes take room
        beside the rings without waiting (on the loop). Raises PayloadTooLarge or QueueFull."""
        n = size if parcel is not None else len(body)
        if self._max_payload is not None and n > self._max_payload:
            raise PayloadTooLarge(f"payload for role {role!r} is {n} bytes pickled; limits.max_payload_bytes is "
                                  f"{self._max_payload}")
        if parcel is not None:
            self.beside.take(size, f"payload for role {role!r}", block=False)

    def submit_plain(self, role: str, payload) -> Future:
        """``submit(role, payload)`` with every other argument at its default (`Fleet.submit`
        with none given, the common call), by `submit_call`'s path: the checks of arguments
        not given are skipped (about a microsecond of a submit's five). The role's own check
        (`_check_unit` with the defaults: a role without a handler, or a pinned one, refuses
        such a unit) is made once per spec (a reload makes new ones), not at every submit."""
        code = self._roles.code(role)
        spec = self._roles.by_code(code)
        if self._plain_specs.get(code) is not spec:
            _check_unit(spec, None, None, 0, None, None)
            self._plain_specs[code] = spec
        return self.submit_call(code, role, payload)

    def submit_call(self, code: int, role: str, payload) -> Future:
        """Queue one plain unit of role `code`, as ``submit(role, payload)`` would: the
        Executor's calls, whose role (pooled, with a handler) its executor made, so none
        of the arguments `submit` checks is given (no key, lane, route or priority; the
        role's own timeout; waits for room). A tenth of a submit's cost is those checks,
        on a path that runs once per call."""
        timeout = self._roles.by_code(code).timeout_s  # read each time: a reload may change it
        door = self._door
        on_loop = door.on_loop()
        parcel = codec.pack_task(role, payload, None, None, None, pickled_payload=None, limit=self._max_payload,
                                 fleet=door.name, room=self.beside, block=not on_loop, writer=self.warm.write)
        # `_queued` and `_post`, written out: this path runs once per call
        try:
            door.refuse_if_closed(code, role)
            self._room.take(code, role, block=not on_loop)
        except BaseException:
            self._unpack([parcel])
            raise
        unit = self._new_unit(code, None, 0, parcel[0], _task_flags(False, timeout, self._recorder is not None),
                              timeout, parcel)
        arrival = (unit.unit_id, role, payload, None, None) if self._recorder is not None else None
        self._intake.post(self._accept, unit, arrival, refused=self._turned_away, pace=not on_loop,
                          hand_over=not on_loop)
        return unit.future

    def submit_many(self, role: str, payloads: list, *, lane=None, chunk: bool = False) -> list[Future]:
        """Queue one unit per payload, as `submit(role, payload, lane=lane, chunk=chunk)`
        would each (map's batches): the checks made once, and one command to the loop per
        run of queue room taken, not one per unit. Waits for room as long as it takes, as
        `submit` does by default. Raises what `submit` raises; an unpicklable or too large
        payload raises before any unit of the batch is queued."""
        code = self._roles.code(role)
        spec = self._roles.by_code(code)
        _check_unit(spec, None, lane, 0, None, None)
        timeout = spec.timeout_s
        flags = _task_flags(chunk, timeout, self._recorder is not None)
        door = self._door
        door.refuse_if_closed(code, role)
        on_loop = door.on_loop()
        futures, at = [], 0
        while at < len(payloads):
            packed = self._pack_run(role, payloads, at, lane, on_loop)
            self._post_run(code, role, packed, payloads[at:at + len(packed)], lane, chunk, flags, timeout, on_loop,
                           futures)
            at += len(packed)
        return futures

    def submit_pickled(self, role: str, pickled: list[bytes]) -> list[Future]:
        """Queue plain units of `role` whose payloads a service-mode client pickled (relayed
        as they are; no key, lane, route or priority; the role's timeout), as
        ``submit(role, pickled_payload=p, block=False)`` would each, `submit_many`'s way:
        one room take and one command to the loop per run. Never waits (fleetd's control
        thread calls it): it returns the futures of the units it queued, the first of
        `pickled` in order, and stops at the first that is not queued at once (a full
        queue, a payload over a bound, a closed fleet, an unknown role: any refusal).
        The caller submits the rest one by one, so each gets its own refusal."""
        futures: list[Future] = []
        if self._recorder is not None:
            return futures  # the arrival log records each submit as `submit` does
        try:
            code = self._roles.code(role)
            spec = self._roles.by_code(code)
            _check_unit(spec, None, None, 0, None, None)
            timeout = spec.timeout_s
            flags = _task_flags(False, timeout, False)
            self._door.refuse_if_closed(code, role)
            at = 0
            while at < len(pickled):
                # on_loop=True: nothing waits; queue room and parcel room are taken only if free now
                packed = self._pack_run(role, pickled, at, None, True, pickled=True)
                self._post_run(code, role, packed, pickled[at:at + len(packed)], None, False, flags, timeout, True,
                               futures)
                at += len(packed)
        except Exception:  # noqa: BLE001 - refused: the caller's one-by-one submits say why, unit by unit
            pass
        return futures

    def _pack_run(self, role: str, payloads: list, at: int, lane, on_loop: bool, pickled: bool = False) -> list:
        """The task bodies of `payloads` from `at` on (see `codec.pack_task`), as many as
        there is room for beside the rings: every one, unless the cap on payload bytes in
        parcels is reached, when the run stops before the payload that would pass it (it
        waits for room only as the run's first, so the units packed before it are posted and
        can give room back). At least one. A refusal removes the run's parcels."""
        limit, fleet, beside, packed = self._max_payload, self._door.name, self.beside, []
        try:
            for payload in itertools.islice(payloads, at, None):
                first = not packed
                try:
                    if pickled:
                        payload, raw = None, payload
                    else:
                        raw = None
                    packed.append(codec.pack_task(role, payload, None, lane, None, pickled_payload=raw, limit=limit,
                                                  fleet=fleet, room=beside, block=first and not on_loop,
                                                  writer=self.warm.write, handoff=self.handoff))
                except QueueFull:
                    if first:
                        raise
                    break
        except BaseException:
            self._unpack(packed)
            raise
        return packed

    def _post_run(self, code: int, role: str, packed: list, payloads: list, lane, chunk: bool, flags: int, timeout,
                  on_loop: bool, futures: list) -> None:
        """Queue the units of a packed run (room taken in its role's queue, SUBMIT_RUN units
        at a time), their futures onto `futures`. A refusal removes the parcels not queued."""
        start = 0
        while start < len(packed):
            try:
                took = self._room.take(code, role, block=not on_loop, n=min(len(packed) - start, SUBMIT_RUN))
            except BaseException:
                self._unpack(packed[start:])
                raise
            units = [self._new_unit(code, None, 0, p[0], flags, timeout, p) for p in packed[start:start + took]]
            if chunk:
                for unit, payload in zip(units, payloads[start:start + took]):
                    unit.items = len(payload)
            arrivals = None
            if self._recorder is not None:
                arrivals = [(u.unit_id, role, p, None, lane) for u, p in zip(units, payloads[start:start + took])]
            self._intake.post(self._accept_many, units, arrivals, refused=self._turned_away_many, pace=not on_loop,
                              hand_over=not on_loop)
            futures.extend([u.future for u in units])
            start += took

    def _unpack(self, packed: list, reuse: bool = True) -> None:
        """End the parcels of task bodies, their room given back: of units never queued (no
        worker saw them), or at a unit's outcome, kept warm for the next payload only when
        `reuse` (fleet.shm.parcels.Warm), else removed."""
        for _body, name, size in packed:
            if name is not None:
                if type(name) is str:
                    self.warm.end(name, reuse)
                else:
                    name.close()  # a handed memfd (fleet.shm.handoff.Handed): the worker's mapping is its own
                self.beside.give(size)

    def _queued(self, code: int, role: str, key, priority: int, body: bytes, flags: int, timeout, block: bool,
                block_timeout, parcel: tuple = (None, None, 0), child: bool = False) -> tuple[LoopUnit, bool]:
        """A checked unit's room in its role's queue, taken (waiting for it unless `block` is
        False, and never on the loop's own thread: it would wait for itself), once the fleet
        and the role are seen open; the unit made, and whether this is the loop's thread.
        A refusal removes the unit's parcel (it never became a unit). A running unit's `child`
        is refused only by its role's stop (fleet.runtime.inside).
        """
        door = self._door
        try:
            if child:
                door.refuse_if_role_stopped(code, role)
            else:
                door.refuse_if_closed(code, role)
            on_loop = door.on_loop()
            self._room.take(code, role, block=block and not on_loop, timeout=block_timeout)
        except BaseException:
            self._unpack([parcel])
            raise
        return self._new_unit(code, key, priority, body, flags, timeout, parcel), on_loop

    def _post(self, unit: LoopUnit, on_loop: bool, role: str, payload, key=None, lane=None,
              hand_over: bool = False) -> Future:
        """Hand a queued unit to the loop (paced, off the loop's thread); its future.
        `hand_over`: a caller's own submit (one that may wait: not fleetd's control thread),
        whose caller watches for the result next (`Intake.post`)."""
        arrival = (unit.unit_id, role, payload, key, lane) if self._recorder is not None else None
        if unit.parent and on_loop:
            # a running unit's child, on the loop (fleet.runtime.inside): accepted now, also
            # while the fleet closes and its intake takes no more posts
            self._accept(unit, arrival)
            return unit.future
        self._intake.post(self._accept, unit, arrival, refused=self._turned_away, pace=not on_loop,
                          hand_over=hand_over and not on_loop)
        return unit.future

    def _new_unit(self, code: int, key, priority: int, body: bytes, flags: int, timeout,
                  parcel: tuple = (None, None, 0)) -> LoopUnit:
        future = UnitFuture()  # a Future without the cost of building a Condition nobody waits on
        unit_id = self._door.new_id()
        future.unit_id = unit_id  # fleetd replies to a remote submit with it
        handed = None
        if parcel[1] is not None:
            # The unit owns the parcel its payload travels in: every outcome resolves the
            # future (solved, failed, cancelled, timed out, its worker dead, shut down),
            # and the parcel goes with it, its room given back. A worker that mapped it
            # keeps its own mapping. Solved, its worker gave the mapping back before it
            # answered (fleet.worker.codec.lending): the parcel may be written again.
            future.add_done_callback(lambda f, p=parcel: self._unpack([p], _solved(f)))
            if type(parcel[1]) is not str:
                handed = parcel[1]  # a memfd its worker is handed (fleet.shm.handoff), not a parcel's name
        return LoopUnit(unit_id, code, key, priority, future=future, body=body, flags=flags, timeout=timeout,
                        handed=handed)

    def _turned_away(self, error: BaseException, unit: LoopUnit, *_rest) -> None:
        """A submit the loop never accepted: it had stopped as the caller posted (this runs
        on the poster's thread, or the loop's as it closes the intake). The caller holds
        the future, so the unit is counted and fails Shutdown, as the units queued at the
        stop did. Only the ledger is touched (it is thread-safe; the rest is the loop's)."""
        self._ledger.submitted(unit.unit_id, unit.items)
        self._ledger.record(unit.unit_id, FAILED, Reason.SHUTDOWN)
        role = self._roles.by_code(unit.role).name
        fail_future(unit.future, error_for(unit.unit_id, role, Outcome(
            FAILED, Reason.SHUTDOWN, f"{error}: the unit was never queued")))

    def _turned_away_many(self, error: BaseException, units: list, *_rest) -> None:
        """A `submit_many` run the loop never accepted: each unit as `_turned_away`."""
        for unit in units:
            self._turned_away(error, unit)


def _solved(future: Future) -> bool:
    """Whether a done unit's future holds a value: its worker ran it to its end and answered."""
    return not future.cancelled() and future.exception() is None


def _check_unit(spec, key, lane, priority, timeout, request_id) -> None:
    """A submit's arguments, on their face (pure: the caller's thread)."""
    if spec.handler is None:
        raise BadUnit(f"role {spec.name!r} has no handler configured")
    if spec.kind == "pinned" and key is None:
        raise BadUnit(f"role {spec.name!r} is pinned by key: submit needs key=")
    if spec.kind != "pinned" and key is not None:
        raise BadUnit(f"role {spec.name!r} is {spec.kind}: it takes no key")
    if key is not None:
        try:
            hash(key)
        except TypeError:
            raise BadUnit(f"key must be hashable, got {type(key).__name__}") from None
    if lane is not None and not isinstance(lane, str):
        raise BadUnit(f"lane must be a name (str), got {type(lane).__name__}")
    if not ranges.PRIORITY.holds(priority):
        raise BadUnit(f"priority {ranges.PRIORITY.problem(priority)}")
    if timeout is not None and not ranges.UNIT_TIMEOUT_S.holds(timeout):
        raise BadUnit(f"timeout {ranges.UNIT_TIMEOUT_S.problem(timeout)}")
    if request_id is not None and not isinstance(request_id, str):
        raise BadUnit(f"request_id must be a str, got {type(request_id).__name__}")


def _task_flags(chunk: bool, timeout, recorded: bool) -> int:
    """A task's flags: a chunk of items, a run time limit the loop must watch, and
    whether the worker measures the handler's CPU (only the arrival log reads it)."""
    return (M.F_CHUNK if chunk else 0) | (M.F_TIMED if timeout is not None else 0) | (M.F_CPU if recorded else 0)

