"""The main module's guard: no fleet is made while the fork server imports the program's
main module to prepare its workers (`fleet.worker.prepare`, which documents that import).

A script that makes an Executor or a Fleet at its top level, outside the
``if __name__ == "__main__":`` guard, would make another one in the fork server as it
imports the script (and that one's fork server another...). `check_not_importing_main`
refuses it there with fleet's own error, `UnguardedMain`, which the zygote reports and
the program that made the first fleet raises. This module owns the mark it reads, and is
the first thing `Executor()` runs: it imports nothing beyond the standard library's core.
"""
from __future__ import annotations

import contextlib
import sys

#: True while the zygote imports the program's main module (`importing_main`).
_importing_main = False
#: What the main module is called while the zygote imports it (multiprocessing's name).
MAIN_AS = "__mp_main__"


@contextlib.contextmanager
def importing_main():
    """While the zygote imports the main module (`fleet.worker.prepare.prepare_zygote`):
    both fleet's mark and multiprocessing's own "still bootstrapping" one, which its
    guard reads (a script that starts a multiprocessing child at its top level)."""
    import multiprocessing

    global _importing_main
    me = multiprocessing.current_process()
    me._inheriting = _importing_main = True
    try:
        yield
    finally:
        me._inheriting = _importing_main = False


def check_not_importing_main(face: str) -> None:
    """Refuse to make a fleet (`face`: which one, as the user wrote it) while the main
    module is being imported to prepare workers.

    Raises:
        UnguardedMain: the zygote is importing the main module, whose top level makes a
            fleet (the zygote reports it, and the program that made the first fleet
            raises it). In a child multiprocessing's spawn prepares, its own RuntimeError.
    """
    if _importing_main:
        from fleet.rules.errors import UnguardedMain

        raise UnguardedMain(
            f"{face} was made at the top level of this program's main module ({_where_in_main()}), outside "
            "the `if __name__ == \"__main__\":` guard. fleet's workers import the main module, as "
            "multiprocessing's spawn and forkserver start methods do (forkserver is the default on Linux "
            "from Python 3.14), so that the functions it defines can run in them; the guard keeps the rest "
            "of the program, and the fleet it makes, from running there too. Put the code that makes and "
            "uses the fleet under `if __name__ == \"__main__\":`.")
    # A process multiprocessing's spawn is preparing has imported multiprocessing.spawn (it
    # runs from there): one that has not, cannot be one, and need not import it to know.
    spawn = sys.modules.get("multiprocessing.spawn")
    if spawn is not None:
        spawn._check_not_importing_main()


def _where_in_main() -> str:
    """The main module's line that is making the fleet, as the zygote imports it."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") != MAIN_AS:
        frame = frame.f_back
    if frame is None:
        return "its top level"
    return f"{frame.f_code.co_filename}, line {frame.f_lineno}"
