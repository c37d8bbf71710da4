"""Naming this process and its threads where operators look (the names: fleet.rules.titles).

`setproctitle` rewrites the command line the kernel shows (``/proc/<pid>/cmdline``)
in place, as PostgreSQL and gunicorn name their processes; the command name
(``/proc/<pid>/comm``, 15 bytes) is the main thread's name, set with
``prctl(PR_SET_NAME)`` through `setproctitle.setthreadtitle`. A process that cannot
be renamed (a platform without /proc, a seccomp filter) keeps its name: it is said
in the log at DEBUG and costs nothing else.
"""
from __future__ import annotations

import logging

from fleet.rules.titles import COMM_BYTES, Title

log = logging.getLogger(__name__)


def name_process(title: Title) -> None:
    """Give this process `title`: its command line, and (on the calling thread, which
    should be the main one) its command name."""
    try:
        import setproctitle

        setproctitle.setproctitle(title.cmdline)
        setproctitle.setthreadtitle(title.comm)
    except Exception as exc:  # noqa: BLE001 - a name is for operators; never a reason to fail
        log.debug("cannot name this process %r: %s", title.cmdline, exc)


def mark_child(suffix: str = "-child") -> None:
    """In a child forked off a named process: its command line gets `suffix`, so that
    ``ps`` tells it from the process it was forked off (its command name stays)."""
    try:
        import setproctitle

        setproctitle.setproctitle(setproctitle.getproctitle() + suffix)
    except Exception as exc:  # noqa: BLE001
        log.debug("cannot mark this child's name: %s", exc)


def name_thread(name: str) -> None:
    """Give the calling thread `name` (``top -H``, ``/proc/<pid>/task/<tid>/comm``)."""
    try:
        import setproctitle

        setproctitle.setthreadtitle(name[:COMM_BYTES])
    except Exception as exc:  # noqa: BLE001
        log.debug("cannot name this thread %r: %s", name, exc)
