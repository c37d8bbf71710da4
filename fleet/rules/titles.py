"""What fleet's own processes are called where operators look (pure).

``ps``, ``top``, ``htop``, ``pgrep`` and the journal show a process by one of two names:
its command line (``/proc/<pid>/cmdline``: ``ps -f``, ``ps aux``, htop, ``pgrep -f``) and
its command name (``/proc/<pid>/comm``, at most 15 bytes: ``ps -e``, top, ``pgrep``, the
journal's ``_COMM``). Every process fleet starts carries a name of its own in both, so
that one fleet's workers are told from another's, and a worker from its fork server:

=============  ================================  ================================
process        command line                      command name (15 bytes)
=============  ================================  ================================
a worker       ``fleet-<fleet>-<seat>``           ``fleet-<seat>``
fork server    ``fleet-<fleet>-forkserver``       ``fleet-forksrv``
its checker    ``fleet-<fleet>-forkserver-check`` ``fleet-fscheck``
fleetd         ``fleetd-<fleet> <its arguments>``  ``fleetd-<fleet>``
=============  ================================  ================================

``<seat>`` is the seat's name as ``fleetctl status`` shows it: ``<role>-<n>`` for the
n-th seat of a role that has cores of its own; ``serial-0`` for the serial tier's one
seat, which runs every role's units; a shared seat (the roles without whole cores
share the spare ones) is named after the role it was made for, ``<role>-0``, and also
runs the other roles without cores. A command name too long for 15 bytes keeps its
``fleet-`` and the seat's number and shortens the role between them
(``fleet-pool_st-3``). Every name starts with ``fleet``, so ``pgrep -l fleet`` lists
them all; a fleet's full name is in the command line (``pgrep -af fleet-<fleet>-``).

An embedded fleet's supervisor is the user's own program: its name stays the
program's. Only its loop thread is named (``fleet-loop``, in ``top -H``).
"""
from __future__ import annotations

from admission.records import record


#: The kernel keeps a command name of at most 15 bytes (TASK_COMM_LEN 16, with its NUL).
COMM_BYTES = 15
#: What every name starts with.
PREFIX = "fleet-"
#: The supervisor loop thread's name (the program that embeds fleet keeps its own).
LOOP_THREAD = "fleet-loop"
#: fleetd's control thread's name (it serves the control socket, beside the loop).
CONTROL_THREAD = "fleet-control"
#: fleetd's thread that writes large outcomes out for their clients, off the loop.
OUTCOME_THREAD = "fleet-outcomes"
#: fleetd's thread that takes in large payloads (copies them beside the rings), off the
#: control thread.
INTAKE_THREAD = "fleet-intake"


@record
class Title:
    """A process's two names: its command line and its command name (<= COMM_BYTES)."""

    cmdline: str
    comm: str


def worker(fleet: str, seat: str) -> Title:
    """A worker's names: fleet `fleet`, seat `seat` (``<role>-<n>`` or ``serial-0``)."""
    return Title(f"{PREFIX}{fleet}-{seat}", _short(PREFIX, seat))


def fork_server(fleet: str) -> Title:
    return Title(f"{PREFIX}{fleet}-forkserver", f"{PREFIX}forksrv")


def fork_server_check(fleet: str) -> Title:
    """The process a fork server forks to check a reload's handlers (fleet.worker.zygote):
    never taken for a second fork server while an import runs in it."""
    return Title(f"{PREFIX}{fleet}-forkserver-check", f"{PREFIX}fscheck")


def daemon(fleet: str, args=()) -> Title:
    """fleetd's names: its fleet, then the arguments it was started with."""
    name = f"fleetd-{fleet}"
    return Title(" ".join([name, *args]), name[:COMM_BYTES])


def _short(prefix: str, seat: str) -> str:
    """``prefix + seat`` in COMM_BYTES: the seat's last ``-<n>`` kept whole, the rest cut."""
    whole = prefix + seat
    if len(whole) <= COMM_BYTES:
        return whole
    head, dash, number = seat.rpartition("-")
    if not dash or not number.isdigit():
        return whole[:COMM_BYTES]
    room = COMM_BYTES - len(prefix) - len(dash) - len(number)
    return f"{prefix}{head[:max(room, 0)]}{dash}{number}"[:COMM_BYTES]
