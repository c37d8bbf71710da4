"""How a fleet stops: shutdown, stop and kill, on the loop; the interpreter-exit hook.

* `shutdown` takes no more units and waits for every unit owed (with `cancel_futures`,
  the queued ones are cancelled). It does not wait for a provider's reopening: a closed
  key may wait until midnight, so units still waiting for provider admission fail
  Shutdown; nor for an epoch boundary: units of a key whose role's every pin is another
  key's (no `elastic_repin`) fail Shutdown (`Stops.fail_unpinnable`);
* `stop(grace_s)`: queued units fail Shutdown once nothing runs or the grace has
  passed, whichever is first; in-flight ones finish;
* `kill`: workers are killed; every unit still owed fails Shutdown.

The caller's half (`Supervisor.shutdown`, `stop`, `kill`) posts these to the loop (from
a future's callback, which runs on the loop, they run at once); the loop exits once it
is closing and owes nothing, and boot's rig is torn down (`fleet.runtime.boot.Rig`). A
fleet nobody shut down shuts down at interpreter exit and waits for its units, as
ProcessPoolExecutor does (`close_at_exit`).

One owner: the loop thread.
"""
from __future__ import annotations

import atexit
import functools
import os
import threading
import weakref

from fleet.rules import cordon
from fleet.rules.outcomes import FAILED
from fleet.rules.unit import Outcome
from fleet.rules.vocab import Reason
from fleet.shm.table import layout as L


class Stops:
    """The loop's half of each stop, and when a stop's grace ends (`due`). It closes the
    door, fails or cancels what the books, the dispatcher's queues and the gates still
    hold, and kills the seats' workers. `dispatch` grants what may still run (the loop's)."""

    def __init__(self, *, door, books, gates, dispatcher, seats, results, posture, roles, table, host, dispatch,
                 recorder=None):
        self._door, self._books, self._gates, self._dispatcher = door, books, gates, dispatcher
        self._seats, self._results, self._posture, self._roles = seats, results, posture, roles
        self._table, self._host, self._dispatch, self._recorder = table, host, dispatch, recorder
        #: stop(grace): when queued units fail Shutdown (None: no stop's grace runs); the
        #: loop reads it to skip `due` and `wake_in` on every turn while none runs
        self.stop_at: float | None = None

    # ------------------------------------------------------------------ the three stops
    def shutdown(self, cancel_futures: bool) -> None:
        self.close_intake()
        if cancel_futures:
            self._cancel_queued()
            self._gates.drop(None, "", lambda unit_id, _why: self._books.forget(unit_id, cancel_future=True))
        # Shutdown waits for queued units, but not for a provider's reopening: a closed
        # key may wait until midnight. Units still waiting for admission fail Shutdown.
        self._drop_gates(False, Reason.SHUTDOWN, "the fleet closed while the unit waited for {waits_for}")
        self._dispatch()

    def stop(self, grace_s: float) -> None:
        self.close_intake()
        self.stop_at = self._host.monotonic() + grace_s
        self._drop_gates(False, Reason.SHUTDOWN, "the fleet stopped while the unit waited for {waits_for}")

    def kill(self) -> None:
        self.close_intake()
        self.fail_everything(Reason.SHUTDOWN, "the fleet was stopped")

    # ------------------------------------------------------------------ a stop's grace
    def due(self, now: float) -> None:
        """Once a stop's grace has passed, every unit not yet granted fails Shutdown."""
        if self.stop_at is not None and now >= self.stop_at:
            self.stop_at = None
            self.fail_queued(Reason.SHUTDOWN, "the fleet stopped before it ran")

    def wake_in(self, now: float, cap: float) -> float:
        """Seconds, at most `cap`, until a stop's grace ends."""
        return cap if self.stop_at is None else min(cap, max(0.0, self.stop_at - now))

    # ------------------------------------------------------------------ what they do
    def close_intake(self) -> None:
        """Refuse new units from here on; readers of the table see it too."""
        if self._door.closing:
            return
        self._door.close()
        if self._recorder is not None:
            self._recorder.close()
        if self._table is not None:
            self._table.set_flags(L.FLAG_CLOSING)

    def fail_queued(self, reason: str, detail: str) -> None:
        """Every unit not yet granted a slot fails with `reason`: those queued, and those a
        gate whose units wait in line with them keeps (the host-group lease)."""
        for item in self._dispatcher.drain_queue():
            self._books.fail_unstarted(item.unit_id, reason, detail)
        self._drop_gates(True, reason, detail)

    def fail_everything(self, reason: str, detail: str) -> None:
        """Kill the workers, keep what they delivered, fail everything else with `reason`."""
        self.fail_queued(reason, detail)
        self._drop_gates(False, reason, detail)
        workers = self._seats.workers
        pids = dict(workers.pids)
        for pid in pids.values():
            workers.kill(pid)
        for pid in pids.values():
            self._host.wait_gone(pid)
        for seat in range(self._seats.count):
            self._results.take_delivered(seat)
            for item, _slot in self._dispatcher.seat_lost(seat):  # started or not: nothing will run it now
                self._books.close(item.unit_id, Outcome(FAILED, reason, detail))
        # Submits posted but not yet accepted are counted and fail Shutdown (see fleet.runtime.accept).
        self._door.intake.drain()
        self._books.deliver()

    def shed_deferred_at_close(self) -> None:
        """Closing while Cordoned: deferrable units not yet started fail Shutdown.

        Shutdown waits for every queued unit, but cordon holds deferrable intake, and a
        sticky cause (lane-death, operator) never clears without an operator: waiting
        could last forever. (Units a worker holds back come home the same way.)
        """
        posture = self._posture
        for code, spec in enumerate(self._roles):
            if not cordon.sheds_at_close(posture.posture, spec.class_code) or not self._dispatcher.queued(code):
                continue
            held_by = ", ".join(sorted(posture.causes)) or "throttling"
            for item in self._dispatcher.drain_queue(code):
                self._books.fail_unstarted(item.unit_id, Reason.SHUTDOWN,
                                           f"the fleet closed while cordoned ({held_by}); it never ran")

    def fail_unpinnable(self) -> None:
        """Closing: units of a key no pin can come to fail Shutdown, naming why.

        A key whose role's every pin is another key's waits for an epoch boundary to
        re-key one (002 §3.4, T9; `elastic_repin` off), and a closing fleet reaches
        none: shutdown would wait for ever (`Dispatcher.drain_unpinnable`).
        """
        for item in self._dispatcher.drain_unpinnable():
            role = self._roles.by_code(item.role)
            self._books.fail_unstarted(
                item.unit_id, Reason.SHUTDOWN,
                f"the fleet closed while the unit waited for a pin for key {item.key!r}: every pin role "
                f"{role.name} may hold ({role.slots}) is another key's, and without elastic_repin a pin "
                f"is re-keyed only at an epoch boundary; it never ran")

    def _drop_gates(self, queue_like: bool, reason: str, detail: str) -> None:
        """Fail with `reason` every unit the gates of that kind keep (`Gate.queue_like`);
        ``{waits_for}`` in `detail` says what the gate's units wait for."""
        self._gates.drop(queue_like, detail, lambda unit_id, why: self._books.fail_unstarted(unit_id, reason, why))

    def _cancel_queued(self) -> None:
        """Cancel every queued unit, except one whose future runs already (it came back
        unrun from a dead seat): that one cannot be cancelled any more, so it stays first
        in its queue and runs (shutdown waits for it)."""
        running = [item for item in self._dispatcher.drain_queue() if not self._books.cancel(item.unit_id)]
        self._dispatcher.put_back_first(running)


# ---------------------------------------------------------------------- interpreter exit
def close_at_exit(sup) -> None:
    """Shut `sup` down as the interpreter exits (see `_atexit_close`); it is held weakly,
    so a fleet nobody refers to any more can still be collected. Only in the process that
    started it: a fork of this process (a multiprocessing child) inherits the exit hook."""
    _at_interpreter_exit(functools.partial(_atexit_close, weakref.ref(sup), os.getpid()))


def _atexit_close(ref, owner_pid: int) -> None:
    """At interpreter exit, the work submitted finishes, as with ProcessPoolExecutor:
    a fleet nobody shut down (or shut down without waiting) shuts down now and waits
    for every unit owed (units `shutdown(cancel_futures=True)` cancelled stay so).
    Only in the process that started the fleet: a fork of it (a multiprocessing
    child, which runs these hooks as it ends) has no loop to wait for."""
    sup = ref()
    if sup is None or os.getpid() != owner_pid:
        return
    sup.close_at_exit()


def _at_interpreter_exit(fn) -> None:
    """Call `fn` as the interpreter exits, before it joins its threads (where
    concurrent.futures hooks its own executors' exits): the loop and the zygote's
    spawner thread still run then, so the units still owed can finish. Inside an
    exit already under way, an `atexit` hook is the only one left."""
    try:
        threading._register_atexit(fn)
    except RuntimeError:  # "can't register atexit after shutdown"
        atexit.register(fn)
