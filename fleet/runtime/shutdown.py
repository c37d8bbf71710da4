"""How a fleet stops: shutdown, stop and kill, posted to the loop; teardown when it exits.

* `shutdown` takes no more units and waits for every unit owed (with `cancel_futures`,
  the queued ones are cancelled). It does not wait for a provider's reopening: a closed
  key may wait until midnight, so units still waiting for provider admission fail
  Shutdown;
* `stop(grace_s)`: queued units fail Shutdown once nothing runs or the grace has
  passed, whichever is first; in-flight ones finish;
* `kill`: workers are killed; every unit still owed fails Shutdown.

Each is posted to the loop (from a future's callback, which runs on the loop, it runs at
once); the loop exits once it is closing and owes nothing, and `teardown` stops the
zygote and the workers and removes the shared segments. A fleet nobody shut down shuts
down at interpreter exit and waits for its units, as ProcessPoolExecutor does.
"""
from __future__ import annotations

import atexit
import functools
import os
import threading
import weakref

from fleet.rules import cordon
from fleet.rules.outcomes import FAILED
from fleet.rules.unit import FleetClosed, Outcome
from fleet.rules.vocab import Reason
from fleet.runtime import seat_deaths
from fleet.shm.table import layout as L


# ---------------------------------------------------------------------- the caller's side
def shutdown(sup, wait: bool = True, cancel_futures: bool = False) -> None:
    """Take no more units; with `cancel_futures`, queued units are cancelled. Returns once
    every unit owed has its outcome and the fleet is torn down (unless `wait` is False)."""
    if wait or sup._on_loop():
        _stop_with(sup, _shutdown_on_loop, cancel_futures, wait=wait)
    elif sup._thread is not None and not sup._stopped.is_set():
        # Executor semantics: once shutdown returns, submit refuses (and the table says
        # closing), so wait for the loop to apply it, not for the units to end.
        try:
            sup.call(_shutdown_on_loop, sup, cancel_futures)
        except FleetClosed:
            pass  # it stopped meanwhile: nothing left to shut


def stop(sup, grace_s: float = 0.0, wait: bool = True) -> None:
    """Stop soon: queued units fail with Shutdown once nothing runs or `grace_s` has
    passed, whichever is first; in-flight ones finish."""
    _stop_with(sup, _stop_on_loop, grace_s, wait=wait)


def kill(sup, wait: bool = True) -> None:
    """Stop now: workers are killed; every unit still owed fails with Shutdown."""
    _stop_with(sup, _kill_on_loop, wait=wait)


def _stop_with(sup, fn, *args, wait: bool) -> None:
    """Post a stop to the loop (a fleet that has stopped already stays stopped)."""
    if sup._thread is None or sup._stopped.is_set():
        return
    if sup._on_loop():
        fn(sup, *args)  # from a future's callback: the loop finishes the stop after this turn
        return
    sup._intake.post(sup._op, fn, sup, *args, refused=_ignore_refusal)
    if wait:
        sup._stopped.wait()


def _ignore_refusal(_error: BaseException, *_args) -> None:
    """A stop the loop never ran (it had stopped): the stop was fire-and-forget."""


# ---------------------------------------------------------------------- the loop's side
def _shutdown_on_loop(sup, cancel_futures: bool) -> None:
    close_intake(sup)
    if cancel_futures:
        _cancel_queued(sup)
        for gate in sup.gates:
            for unit_id, _detail in gate.drop(""):
                sup._forget(unit_id, cancel_future=True)
    # Shutdown waits for queued units, but not for a provider's reopening: a closed
    # key may wait until midnight. Units still waiting for admission fail Shutdown.
    _drop_gates(sup, lambda gate: not gate.queue_like, Reason.SHUTDOWN,
                "the fleet closed while the unit waited for {waits_for}")
    sup._dispatch()


def _drop_gates(sup, which, reason: str, detail: str) -> None:
    """Fail with `reason` every unit the gates `which` picks keep; ``{waits_for}`` in
    `detail` says what the gate's units wait for."""
    for gate in sup.gates:
        if which(gate):
            for unit_id, why in gate.drop(detail.replace("{waits_for}", gate.waits_for)):
                sup._fail_unstarted(unit_id, reason, why)


def _cancel_queued(sup) -> None:
    """Cancel every queued unit, except one whose future runs already (it came back
    unrun from a dead seat): that one cannot be cancelled any more, so it stays first
    in its queue and runs (shutdown waits for it)."""
    running = []
    for item in sup.dispatcher.drain_queue():
        if sup._units[item.unit_id].future.cancel():
            sup._forget(item.unit_id)
        else:
            running.append(item)
    sup.dispatcher.put_back_first(running)


def _stop_on_loop(sup, grace_s: float) -> None:
    close_intake(sup)
    sup._stop_at = sup.host.monotonic() + grace_s
    _drop_gates(sup, lambda gate: not gate.queue_like, Reason.SHUTDOWN,
                "the fleet stopped while the unit waited for {waits_for}")


def _kill_on_loop(sup) -> None:
    close_intake(sup)
    fail_everything(sup, Reason.SHUTDOWN, "the fleet was stopped")


def fail_queued(sup, reason: str, detail: str) -> None:
    """Every unit not yet granted a slot fails with `reason`: those queued, and those a
    gate whose units wait in line with them keeps (the host-group lease)."""
    for item in sup.dispatcher.drain_queue():
        sup._fail_unstarted(item.unit_id, reason, detail)
    _drop_gates(sup, lambda gate: gate.queue_like, reason, detail)


def close_intake(sup) -> None:
    """Refuse new units from here on; readers of the table see it too."""
    if sup._closing:
        return
    sup._closing = True
    if sup.recorder is not None:
        sup.recorder.close()
    if sup.table is not None:
        sup.table.set_flags(L.FLAG_CLOSING)


def fail_everything(sup, reason: str, detail: str) -> None:
    """Kill the workers, keep what they delivered, fail everything else with `reason`."""
    fail_queued(sup, reason, detail)
    _drop_gates(sup, lambda gate: not gate.queue_like, reason, detail)
    workers = sup.workers
    pids = dict(workers.pids)
    for pid in pids.values():
        workers.kill(pid)
    for pid in pids.values():
        sup.host.wait_gone(pid)
    for seat in range(len(sup.layout.seats)):
        seat_deaths.take_delivered(sup, seat)
        for item, _slot in sup.dispatcher.seat_lost(seat):  # started or not: nothing will run it now
            sup._close(item.unit_id, Outcome(FAILED, reason, detail))
    # Submits posted but not yet accepted are counted and fail Shutdown (see accept.accept).
    sup._intake.drain()
    sup._deliver()


def shed_deferred_at_close(sup) -> None:
    """Closing while Cordoned: deferrable units not yet started fail Shutdown.

    Shutdown waits for every queued unit, but cordon holds deferrable intake, and a
    sticky cause (lane-death, operator) never clears without an operator: waiting
    could last forever. (Units a worker holds back come home the same way.)
    """
    for code, spec in enumerate(sup.roles):
        if not cordon.sheds_at_close(sup.posture.posture, spec.class_code) or not sup.dispatcher.queued(code):
            continue
        held_by = ", ".join(sorted(sup.posture.state.causes)) or "throttling"
        for item in sup.dispatcher.drain_queue(code):
            sup._fail_unstarted(item.unit_id, Reason.SHUTDOWN,
                                f"the fleet closed while cordoned ({held_by}); it never ran")


# ---------------------------------------------------------------------- the end
def teardown(sup, kill: bool = False) -> None:
    """Stop the zygote and workers; remove the shared segments. Idempotent."""
    gates, sup.gates = sup.gates, []
    for gate in reversed(gates):
        gate.stop()  # the lease gives back the leases still held; the provider writes its closures
    if not gates and sup._providers is not None:
        sup._providers.stop()  # a boot that failed before its gates were listed
    if sup.workers is not None:
        sup.workers.exit(timeout=5 if not kill else 0.5)
    publisher = sup.publisher
    if publisher is not None and publisher.metrics is not None:
        publisher.metrics.close()
        publisher.metrics = None
    if sup.quota_watcher is not None:
        sup.quota_watcher.close()  # its PSI trigger's file descriptor
        sup.quota_watcher = None
    if sup.table is not None:
        sup.ledger.publish(sup.table)
        sup.table.unlink()
        sup.table.close()
        sup.table = None
    if sup.data is not None:
        sup.data.unlink()
        sup.data.close()
        sup.data = None
    if kill is False and sup.ledger.tripped is None:
        sup.ledger.close()


def close_at_exit(sup) -> None:
    """Shut `sup` down as the interpreter exits (see `_atexit_close`); it is held weakly,
    so a fleet nobody refers to any more can still be collected."""
    sup._owner_pid = os.getpid()  # a fork of this process (a multiprocessing child) inherits the exit hook
    _at_interpreter_exit(functools.partial(_atexit_close, weakref.ref(sup)))


def _atexit_close(ref) -> None:
    """At interpreter exit, the work submitted finishes, as with ProcessPoolExecutor:
    a fleet nobody shut down (or shut down without waiting) shuts down now and waits
    for every unit owed (units `shutdown(cancel_futures=True)` cancelled stay so).
    Only in the process that started the fleet: a fork of it (a multiprocessing
    child, which runs these hooks as it ends) has no loop to wait for."""
    sup = ref()
    if sup is None or os.getpid() != sup._owner_pid:
        return
    if not sup._stopped.is_set() and sup._thread is not None:
        shutdown(sup, wait=True)


def _at_interpreter_exit(fn) -> None:
    """Call `fn` as the interpreter exits, before it joins its threads (where
    concurrent.futures hooks its own executors' exits): the loop and the zygote's
    spawner thread still run then, so the units still owed can finish. Inside an
    exit already under way, an `atexit` hook is the only one left."""
    try:
        threading._register_atexit(fn)
    except RuntimeError:  # "can't register atexit after shutdown"
        atexit.register(fn)
