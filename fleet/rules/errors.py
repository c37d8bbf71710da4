"""The typed errors of fleet, and the exit codes the binaries map them to.

Every refusal names what was wrong. Errors that end a boot carry a distinct exit
code (`exit_code`) so that an operator, systemd or a wrapper script can tell them
apart without parsing text; the library itself never exits, it raises.
"""
from __future__ import annotations

# The error base and the configuration error (with their codes, 1 and 78) are the
# provider admission's too, so they live below fleet; here they are re-exported.
from admission.errors import EXIT_CONFIG, EXIT_FAILURE, ConfigError, FleetError  # noqa: F401

# Exit codes. 0/1/2 keep their usual meanings (ok, runtime failure, usage);
# 64-78 follow sysexits.h where one fits; the boot-refusal family gets its own.
EXIT_OK = 0
# EXIT_FAILURE = 1 and EXIT_CONFIG = 78: admission.errors, above
EXIT_USAGE = 2
EXIT_DATA = 65  # EX_DATAERR: an argument names nothing there (fleetctl cancel of an unknown unit id)
EXIT_NOT_RUNNING = 69  # EX_UNAVAILABLE: no fleet of that name is running
EXIT_NO_PERMISSION = 77  # EX_NOPERM: a mutating op from a uid that may not
EXIT_BELOW_HOST_FLOOR = 80  # fewer than 2 CPUs: no tier can host the fleet
EXIT_QUOTA_TOO_SMALL = 81  # the declared peaks do not fit the quota
EXIT_TABLE_IN_USE = 82  # a live fleet of that name owns the shared table
EXIT_FUSE_TRIPPED = 83  # the exactly-one-outcome ledger found a duplicate or a gap
EXIT_BUDGET_OVER_QUOTA = 84  # overrides or fixed shares add up to more than the quota
EXIT_UNTRUSTED_PEER = 85  # a client refused a daemon, table or socket directory of a uid it does not trust
# 86 was a segment of another uid under the fleet's name: boot now steps around it (fleet.shm.segments)


class BootRefused(FleetError):
    """The fleet cannot boot as configured; the embedding process survives."""

    exit_code = EXIT_QUOTA_TOO_SMALL


class NotRunning(FleetError):
    """No fleet daemon answers under that name: its socket is missing or refuses connections."""

    exit_code = EXIT_NOT_RUNNING
