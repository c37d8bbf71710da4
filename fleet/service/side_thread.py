"""A thread of fleetd's beside its loop and its control thread, for work that copies
large data: writing a result out for its client (`OutcomeStore.deliver`, the
``fleet-outcomes`` thread) and taking in a large payload (`with_blocking_ops`, the
``fleet-intake`` thread). Either would otherwise hold a thread that serves everyone else
for as long as a copy of up to gigabytes takes.

One thread per `SideThread`, started at its first job, running jobs in the order given.
It takes the process's CPUs and niceness (those of its main thread), not those of the
thread that started it: that is the supervisor's loop or the control thread, pinned to
the loop's reserve at a higher priority, which a copy must not compete with.
"""
from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

from fleet.host import affinity, priority
from fleet.host.proctitle import name_thread

log = logging.getLogger(__name__)


class SideThread:
    def __init__(self, name: str):
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, job: Callable[[], None]) -> None:
        """Run ``job()`` on the thread, after the jobs given before it (an exception it
        raises is logged)."""
        self._jobs.put(job)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._thread.start()

    def submit(self, fn: Callable[[], object]) -> Future:
        """``fn()`` run on the thread (`run`): a Future of what it returns, or raises."""
        fut: Future = Future()

        def job() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - the caller's to see, on the future
                fut.set_exception(exc)
            else:
                fut.set_result(result)

        self.run(job)
        return fut

    def _serve(self) -> None:
        name_thread(self.name)  # top -H
        with contextlib.suppress(OSError):  # a mask or niceness it may not take: it keeps its own
            os.sched_setaffinity(0, affinity.process_cpus())
            priority.set_this_thread(os.getpriority(os.PRIO_PROCESS, os.getpid()))  # the main thread's nice
        while True:
            job = self._jobs.get()
            try:
                job()
            except Exception:  # noqa: BLE001 - one job's bug must not stop the others
                log.exception("%s: a job failed", self.name)
            # What the job held (a unit's future, its value's parcel) goes now, not when
            # the next job comes.
            del job
