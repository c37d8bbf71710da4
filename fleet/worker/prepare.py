"""What a fleet's worker processes do before their first unit, beyond the handlers.

fleet's workers are forks of its zygote (`fleet.worker.zygote`), a fresh interpreter,
not children of the program that made the fleet. ProcessPoolExecutor's workers are
multiprocessing children, and its users count on three things of them; a fleet asks
for them in its config (`FleetConfig.workers`, a `WorkerSetup`), and the zygote does
them once, so that every worker, at boot and at every restart, inherits them:

* **the main module** (`main`): the program's ``__main__`` is imported in the zygote
  as multiprocessing's spawn start method does (``multiprocessing.spawn.prepare``:
  a script by its path, a ``-m`` module by its name, under the name ``__mp_main__``,
  so the ``if __name__ == "__main__":`` guard holds), so a function defined in the
  script pickles by reference and is found in the worker. While it is imported, the
  zygote counts as bootstrapping (as a spawned child does): a script that would make
  an Executor or a Fleet outside the guard gets fleet's own error, `UnguardedMain`,
  raised in the program that made the fleet, naming the guard and why
  (`fleet.worker.main_guard`);
* **the command line** (`argv`): the parent's ``sys.argv``, which the zygote takes on
  before it imports the main module, as a spawned child does (spawn's ``sys_argv``):
  a script whose top level reads its arguments imports in the workers as in the parent;
* **the authentication key** (`authkey`): the parent's
  ``multiprocessing.current_process().authkey``, so a ``multiprocessing.Manager``
  proxy passed as an argument connects back to its manager from a worker;
* **an initializer** (`initializer`): ``(callable, args)`` pickled in the parent,
  unpickled in the zygote once the main module is there, and called in each worker
  before its first unit. If it raises, the worker logs it (to the
  ``concurrent.futures`` logger, as ProcessPoolExecutor does) and exits with
  EXIT_INIT_FAILED (`fleet.rules.errors`); the supervisor then stops the roles of its seat (their units
  fail RoleStopped), since every worker would fail the same way;
* **retirement** (`max_tasks`): a worker that has run this many units exits with
  EXIT_RETIRED once the last one's result is pushed; the supervisor forks its seat
  again and counts no death (units sent ahead to it go back to their queue, unrun).

Everything here travels in the zygote's JSON boot message (`to_boot`, `from_boot`).
"""
from __future__ import annotations

import base64
import logging
import os
import sys

from admission.records import record
from fleet.worker.main_guard import importing_main


@record
class WorkerSetup:
    """See the module docstring. The default asks for nothing beyond the handlers."""

    #: multiprocessing.spawn's preparation of the main module (``init_main_from_path``
    #: or ``init_main_from_name``), None: the zygote imports no main module
    main: dict | None = None
    #: the parent's multiprocessing authkey, hex (None: the zygote keeps its own)
    authkey: str | None = None
    #: ``(callable, args)`` pickled (None: no initializer)
    initializer: bytes | None = None
    #: units a worker runs before it is replaced (None: no limit)
    max_tasks: int | None = None
    #: the parent's ``sys.argv`` (None: the zygote keeps its own)
    argv: tuple[str, ...] | None = None
    #: results lent: written into parcels the worker keeps warm, copied out by the
    #: supervisor and given back (`fleet.shm.parcels.Lender`). False in service mode:
    #: fleetd hands a result's parcel itself to its client (one copy, the worker's), so
    #: each travels in a parcel of its own
    lend: bool = True

    @classmethod
    def of_this_process(cls, *, initializer=None, initargs=(), max_tasks=None) -> "WorkerSetup":
        """The main module, command line and authkey of this process, and the given initializer.

        Raises PayloadUnpicklable when ``(initializer, initargs)`` cannot be pickled."""
        import multiprocessing
        from multiprocessing import spawn

        from fleet.worker.codec import CodecError, dumps, unpicklable

        prepared = spawn.get_preparation_data("fleet-worker")
        main = {k: prepared[k] for k in ("init_main_from_path", "init_main_from_name") if k in prepared}
        if not os.path.isfile(main.get("init_main_from_path", os.devnull)):
            main.pop("init_main_from_path", None)  # stdin, an interactive session: no script to import
        init = None
        if initializer is not None:
            try:
                init = dumps((initializer, tuple(initargs)), "the initializer and its initargs")
            except CodecError as exc:
                raise unpicklable(exc) from None
        return cls(main or None, bytes(multiprocessing.current_process().authkey).hex(), init, max_tasks,
                   tuple(prepared["sys_argv"]))

    def to_boot(self) -> dict:
        return {"main": self.main, "authkey": self.authkey, "max_tasks": self.max_tasks,
                "initializer": None if self.initializer is None else base64.b64encode(self.initializer).decode(),
                "argv": None if self.argv is None else list(self.argv), "lend": self.lend}

    @classmethod
    def from_boot(cls, doc: dict | None) -> "WorkerSetup":
        doc = doc or {}
        init = doc.get("initializer")
        argv = doc.get("argv")
        return cls(doc.get("main"), doc.get("authkey"), None if init is None else base64.b64decode(init),
                   doc.get("max_tasks"), None if argv is None else tuple(argv), bool(doc.get("lend", True)))


def prepare_zygote(setup: WorkerSetup):
    """In the zygote, before the handlers are imported: the authkey, the command line and
    the main module. Returns the initializer to call in each worker, ``(callable, args)`` or None."""
    from multiprocessing import process, spawn

    from fleet.worker.codec import loads

    if setup.argv is not None:
        sys.argv[:] = setup.argv  # the zygote parsed its own arguments already
    if setup.authkey is not None:
        process.current_process().authkey = process.AuthenticationString(bytes.fromhex(setup.authkey))
    if setup.main:
        with importing_main():
            spawn.prepare(dict(setup.main))
    return None if setup.initializer is None else loads(setup.initializer, "the initializer", "in the worker")


def run_initializer(init) -> bool:
    """Call the initializer in a fresh worker: True if it returned, False if it raised
    (logged as ProcessPoolExecutor logs it)."""
    if init is None:
        return True
    fn, args = init
    try:
        fn(*args)
    except BaseException:  # noqa: BLE001 - whatever it raises, the worker cannot serve
        logging.getLogger("concurrent.futures").critical("Exception in initializer:", exc_info=True)
        return False
    return True
