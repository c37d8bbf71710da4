"""SIGTERM and SIGINT stop a fleet-burst command the way Ctrl-C would, with nothing left behind.

`on_signals()` (the `fleet-burst` command wraps every subcommand in it) turns either signal
into `Stopped`, a KeyboardInterrupt, raised in the main thread: the replay unwinds through
its ``finally`` clauses, which stop the provider simulator and shut the fleet down, so its
workers, zygote and both shared segments are gone before the process exits (the default
SIGTERM ends the process at once, and the segments, uniquely named per run, pile up in
/dev/shm). Further signals are ignored while it unwinds: the unwinding is bounded (the
simulator is killed after a grace, the fleet's units are cancelled), and a second Ctrl-C
would otherwise break off the very cleanup the first one started.

`deferred()` marks a stretch that must not be broken off half way (booting the fleet: an
exception between making its segments and registering their cleanup would leak them); a
signal that arrives meanwhile stops the command when the stretch ends.
"""
from __future__ import annotations

import contextlib
import signal

SIGNALS = (signal.SIGTERM, signal.SIGINT)

_state = {"installed": False, "deferring": 0, "pending": None}


class Stopped(KeyboardInterrupt):
    """The command was asked to stop by `signum`; its exit status is 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _stop(signum, _frame) -> None:
    if _state["deferring"]:
        _state["pending"] = signum
        return
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    raise Stopped(signum)


@contextlib.contextmanager
def on_signals():
    """SIGTERM and SIGINT raise `Stopped` in the main thread while the body runs (even when the
    process started with SIGINT ignored, as a background job of a non-interactive shell does)."""
    previous = {s: signal.signal(s, _stop) for s in SIGNALS}
    _state.update(installed=True, deferring=0, pending=None)
    try:
        yield
    finally:
        _state["installed"] = False
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def deferred():
    """A stretch a stop signal does not break off; one that came meanwhile stops at its end."""
    if not _state["installed"]:
        yield
        return
    _state["deferring"] += 1
    try:
        yield
    finally:
        _state["deferring"] -= 1
        signum = _state["pending"]
        if signum is not None and not _state["deferring"]:
            _state["pending"] = None
            _stop(signum, None)
