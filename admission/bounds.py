"""The range of every number the host-group store takes: one table, quoted by the store's
checks (admission.store) and by fleet's config table for its ``[store]`` section; and how
an error message shows a value that is out of range (`shown`), for both.

A leaf: it imports only the standard library, so reading a figure costs nothing. Each
figure fits a 64-bit column and a PostgreSQL ``bigint`` with room for the sums it is part
of, so both backends take exactly the same range.
"""
import math

DAY_S = 86_400
#: A quota or limit: leases admitted at once (no host group holds a million).
MAX_LEASES = 1_000_000
#: A request's base priority: a signed 32-bit level (higher first).
PRIORITY_MIN, PRIORITY_MAX = -(1 << 31), (1 << 31) - 1
#: Seconds: a lease's ttl and a heartbeat's window at most a day, the aging interval a
#: week, a queue timeout 30 days.
MAX_LEASE_TTL_S = DAY_S
MAX_HEARTBEAT_S = DAY_S
MAX_AGING_S = 7 * DAY_S
MAX_QUEUE_TIMEOUT_S = 30 * DAY_S


def shown(value) -> str:
    """`value` for an error message: a huge int by its size (its digits could fill a
    screen, and past 4300 digits `repr` refuses), anything else by a bounded repr."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
