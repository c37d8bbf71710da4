"""The typed errors of fleet, and the exit codes the binaries map them to.

Every refusal names what was wrong. Errors that end a boot carry a distinct exit
code (`exit_code`) so that an operator, systemd or a wrapper script can tell them
apart without parsing text; the library itself never exits, it raises.
"""
from __future__ import annotations

# The error base and the configuration error (with their codes, 1 and 78) are the
# provider admission's too, so they live below fleet; here they are re-exported.
from admission.errors import EXIT_CONFIG, EXIT_FAILURE, ConfigError, FleetError  # noqa: F401

# Exit codes: every one a fleet process exits with is named here, and nowhere else (the
# host-group store's own, 90-94, are admission.store's: admission stands below fleet).
# 0/1/2 keep their usual meanings (ok, runtime failure, usage); 64-78 follow sysexits.h
# where one fits; the boot-refusal family gets its own.
EXIT_OK = 0
# EXIT_FAILURE = 1 and EXIT_CONFIG = 78: admission.errors, above
EXIT_USAGE = 2
EXIT_DATA = 65  # EX_DATAERR: an argument names nothing there (fleetctl cancel of an unknown unit id)
EXIT_NOT_RUNNING = 69  # EX_UNAVAILABLE: no fleet of that name is running
EXIT_BUSY = 75  # EX_TEMPFAIL: the daemon refused the connection, every one it allows is busy; retry later
EXIT_NO_PERMISSION = 77  # EX_NOPERM: a mutating op from a uid that may not
EXIT_BELOW_HOST_FLOOR = 80  # fewer than 2 CPUs: no tier can host the fleet
EXIT_QUOTA_TOO_SMALL = 81  # the declared peaks do not fit the quota
EXIT_TABLE_IN_USE = 82  # a live fleet of that name owns the shared table
EXIT_FUSE_TRIPPED = 83  # the exactly-one-outcome ledger found a duplicate or a gap
EXIT_BUDGET_OVER_QUOTA = 84  # overrides or fixed shares add up to more than the quota
EXIT_UNTRUSTED_PEER = 85  # a client refused a daemon, table or socket directory of a uid it does not trust
# 86 was a segment of another uid under the fleet's name: boot now steps around it (fleet.shm.segments)
EXIT_TIMED_OUT = 124  # fleetctl drain --wait: its --timeout passed with units still owed (timeout(1)'s code)
EXIT_CLOCK_SKEW = 95  # fleetctl store check: the host and the store's database disagree on the time

# A worker process's own (its supervisor reads them; fleet.worker.prepare).
EXIT_WORKER_BROKEN = 70  # EX_SOFTWARE: the worker crashed out of its run loop
EXIT_INIT_FAILED = 78  # EX_CONFIG: its initializer raised (the supervisor stops its seat's roles)
EXIT_RETIRED = 79  # it ran its max_tasks units (the supervisor forks its seat again)
EXIT_RECYCLED = 76  # its RSS passed its role's max_rss_mib after a unit (the supervisor forks its seat again)

# fleet-burst's own (a program of its own: usage is sysexits' 64 there).
EXIT_BURST_USAGE = 64  # bad arguments (EX_USAGE)
EXIT_BAD_TRACE = 65  # the trace has bad lines (all listed with their line numbers); nothing ran (EX_DATAERR)
EXIT_BAD_REPORT = 66  # show: the report cannot be read
EXIT_NO_FLEET = 69  # record: no fleet of that name is running, or it does not record
EXIT_FLEET_FAILED = 70  # the replay fleet or simulator did not start, or a unit did not get exactly one outcome
EXIT_NO_CGROUP = 91  # --cpu-quota without root or a v1 cpu cgroup hierarchy


class BootRefused(FleetError):
    """The fleet cannot boot as configured; the embedding process survives."""

    exit_code = EXIT_QUOTA_TOO_SMALL


class UnguardedMain(BootRefused, RuntimeError):
    """A fleet was made while fleet's workers imported the program's main module: the
    module makes it at its top level, outside the ``if __name__ == "__main__":`` guard
    (fleet.worker.prepare says why the workers import it). A RuntimeError, as
    multiprocessing's own error for the same mistake is."""

    exit_code = EXIT_CONFIG


class NotRunning(FleetError):
    """No fleet daemon answers under that name: its socket is missing or refuses connections."""

    exit_code = EXIT_NOT_RUNNING
