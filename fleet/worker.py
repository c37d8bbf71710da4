"""The worker: one process per seat, running the units granted to its slots in order.

A worker is forked from the fleet's zygote (`fleet.zygote`), which has already
imported numba, loaded the transition kernels, imported every handler module and
attached the shared table and data segment; so a worker starts in milliseconds and
compiles nothing. Construction is inert; `run()` does the work (STYLE item 7).

For each task message: START (T2) or RESUME (T6) its slot, run the handler, end the
slot with the completion its role's kind takes (PIN_KEYED T3, PIN_SINGLETON T4,
RELEASE T5) — or DRAINED (T8) when the supervisor drained the slot meanwhile — and
push the result. A unit of a deferrable role that cordon refuses to start is held
back (not run, not lost) and retried once the posture is Nominal again, while the
seat goes on with other roles' units. If the fleet closes while units are held, the
posture may never clear on its own (a sticky cause): they are handed back unrun
(ST_HELD_AT_CLOSE; the supervisor fails them Shutdown) so shutdown cannot wedge.
"""
from __future__ import annotations

import logging
import os
import pickle
import signal
import time
import traceback

from . import fsm
from . import messages as M
from .table.layout import FLAG_CLOSING
from .unit import Suppress, Unit

log = logging.getLogger("fleet.worker")

EXIT_OK = 0
EXIT_BROKEN = 70  # EX_SOFTWARE: the worker hit a state it cannot continue from

#: How long an idle worker sleeps between checks when units are held back by cordon.
HELD_RETRY_S = 0.05

_COMPLETION = {"pinned": fsm.PIN_KEYED, "singleton": fsm.PIN_SINGLETON, "pooled": fsm.RELEASE}


class Worker:
    """Runs one seat. `handlers[role code]` is the callable for that role (or None)."""

    def __init__(self, seat: int, table, data, roles, handlers: list):
        self.seat = seat
        self.table = table
        self.roles = roles
        self.handlers = handlers
        self.tasks = data.tasks(seat)
        self.results = data.results(seat)
        self.bell = data.bell
        self.held: list[tuple] = []  # (head tuple, body) refused by cordon, in order
        self._completion = [_COMPLETION[r.kind] for r in roles]

    # --- the loop ---------------------------------------------------------------------
    def run(self) -> int:
        while True:
            if self.held and self.table.posture[0] == fsm.NOMINAL:
                self._retry_held()
            elif self.held and int(self.table.segment.header["flags"]) & FLAG_CLOSING:
                self._hand_back_held()
            batch = self.tasks.pop_many()
            if not batch:
                self.tasks.wait(HELD_RETRY_S if self.held else None)
                continue
            for tag, view in batch:
                if tag == M.TASK:
                    self._task(M.TASK_HEAD.unpack_from(view), view[M.TASK_HEAD.size :])

    def _hand_back_held(self) -> None:
        held, self.held = self.held, []
        for (unit_id, slot, *_rest), _body in held:
            text = b"the fleet closed while cordon held this unit back; it never ran"
            self._send(unit_id, slot, M.ST_HELD_AT_CLOSE, self._state(slot), 0.0, text)

    def _retry_held(self) -> None:
        held, self.held = self.held, []
        for head, body in held:
            self._task(head, body)

    # --- one unit ---------------------------------------------------------------------
    def _task(self, head: tuple, body) -> None:
        unit_id, slot, key_id, role, start_event, flags = head
        if any(held[0][1] == slot for held in self.held):
            # Behind a unit cordon held back on the same slot: keep their order (its
            # RESUME could not apply before the held START anyway).
            self.held.append((head, bytes(body)))
            return
        reason = self.table.start_unit(slot, start_event, role, key_id, unit_id)
        if reason == fsm.R_CORDONED:
            self.held.append((head, bytes(body)))
            return
        if reason != fsm.OK:
            text = f"slot {slot} refused {fsm.EVENT_NAMES[start_event]}: {fsm.REASON_NAMES[reason]}"
            # A RESUME on an Idle slot is expected once cordon drained its pin (the supervisor
            # requeues the unit); any other refusal is a broken rule.
            drained = start_event == fsm.RESUME and self._state(slot) == fsm.IDLE
            log.log(logging.INFO if drained else logging.ERROR, "unit %d: %s", unit_id, text)
            self._send(unit_id, slot, M.ST_START_REFUSED, self._state(slot), 0.0, text.encode())
            return
        if flags & M.F_TIMED:
            self.results.send(M.STARTED, M.STARTED_HEAD.pack(unit_id, slot))
            self.bell.ring()
        t0 = time.perf_counter()
        if flags & M.F_CHUNK:
            status, out = self._run_chunk(unit_id, role, body)
        else:
            status, out = self._run_one(unit_id, role, body)
        elapsed = time.perf_counter() - t0
        reason, final = self.table.finish_unit(slot, self._completion[role], role)
        if reason != fsm.OK:
            # A broken FSM rule, not a result to trust: the unit fails FsmRefused.
            text = f"slot {slot} refused {fsm.EVENT_NAMES[self._completion[role]]}: {fsm.REASON_NAMES[reason]}"
            log.error("unit %d: %s", unit_id, text)
            status, out = M.ST_COMPLETION_REFUSED, text.encode()
        self._send(unit_id, slot, status, final, elapsed, out)

    def _unit(self, unit_id: int, role: int, payload, key, lane, request_id) -> Unit:
        return Unit(unit_id, self.roles.by_code(role).name, payload, key, lane, request_id)

    def _run_one(self, unit_id: int, role: int, body) -> tuple[int, bytes]:
        try:
            payload, key, lane, request_id = pickle.loads(body)
            if type(payload).__name__ == "_Pickled":
                payload = payload.load()  # a service-mode client's payload, pickled at its end
            value = self.handlers[role](self._unit(unit_id, role, payload, key, lane, request_id))
        except Suppress as exc:
            return M.ST_SUPPRESSED, str(exc.reason).encode()
        except BaseException as exc:  # noqa: BLE001 - every handler failure is an outcome
            return M.ST_HANDLER_ERROR, _error_body(exc)
        return _result_body(value)

    def _run_chunk(self, unit_id: int, role: int, body) -> tuple[int, bytes]:
        """Run every item of a chunk: (values, {index: (status, detail)} for items that did
        not solve). A flat list of values pickles far faster than per-item tuples."""
        try:
            payloads, key, lane, request_id = pickle.loads(body)
            if type(payloads).__name__ == "_Pickled":
                payloads = payloads.load()  # a service-mode client's chunk, pickled at its end
        except BaseException as exc:  # noqa: BLE001
            return M.ST_HANDLER_ERROR, _error_body(exc)
        handler, name = self.handlers[role], self.roles.by_code(role).name
        values, failures = [], {}
        for i, payload in enumerate(payloads):
            try:
                values.append(handler(Unit(unit_id, name, payload, key, lane, request_id)))
            except Suppress as exc:
                values.append(None)
                failures[i] = (M.ST_SUPPRESSED, str(exc.reason))
            except BaseException as exc:  # noqa: BLE001
                values.append(None)
                failures[i] = (M.ST_HANDLER_ERROR, (_traceback(exc), _picklable(exc)))
        status, out = _result_body((values, failures))
        return (M.ST_CHUNK, out) if status == M.ST_SOLVED else (status, out)

    def _state(self, slot: int) -> int:
        return self.table.state(slot)[0]

    def _send(self, unit_id, slot, status, final_state, elapsed, body) -> None:
        head = M.RESULT_HEAD.pack(unit_id, slot, status, final_state, elapsed)
        if len(head) + len(body) > self.results.max_message:
            status = M.ST_RESULT_ERROR
            body = f"result is {len(body)} bytes; the result ring takes {self.results.max_message}".encode()
            head = M.RESULT_HEAD.pack(unit_id, slot, status, final_state, elapsed)
        while not self.results.push2(M.RESULT, head, body):
            self.bell.ring()  # the supervisor may be asleep with a full ring to drain
            self.results.wait_space(len(head) + len(body), 1.0)
        self.bell.ring()


def _traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _picklable(exc: BaseException):
    try:
        pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        return exc
    except Exception:  # noqa: BLE001 - an exception we cannot send back travels as text only
        return None


def _error_body(exc: BaseException) -> bytes:
    return pickle.dumps((_traceback(exc), _picklable(exc)), protocol=pickle.HIGHEST_PROTOCOL)


def _result_body(value) -> tuple[int, bytes]:
    try:
        return M.ST_SOLVED, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as exc:  # noqa: BLE001 - an unpicklable result is the unit's outcome
        return M.ST_RESULT_ERROR, f"result of type {type(value).__name__} cannot be pickled: {exc}".encode()


def child_setup(cpus) -> None:
    """Process-wide set-up of a fresh worker (after fork, before run)."""
    from ._native import lib

    lib.fleet_set_pdeathsig(signal.SIGKILL)  # never outlive the zygote (and so fleetd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when work stops
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:  # a CPU outside our cgroup's cpuset: run unpinned, say so
            log.warning("cannot pin worker to cpus %s: %s", list(cpus), exc)
