"""The numbers two wings must agree on, held below both: the shared table's capacity, the
width of a row of slot events, and the range of a nice.

The table (`fleet.shm.table`) is laid out for these; the config's ranges and the role set
(`fleet.rules.ranges`, `fleet.rules.roles`) refuse what the table could not hold, and the
dispatcher (`fleet.rules.dispatch`) writes its grants as rows the table's kernels apply.
Dispatch priority (`fleet.host.priority`) moves threads within the nice range. This
module is pure: constants only.
"""

#: Limits a table header must satisfy to be believed (a corrupt header names the field):
#: slots, roles and provider bulkheads in one table. A role index must also fit the slot
#: word's 8-bit role field, below ANY_ROLE; a fleet declaring more roles is refused.
MAX_SLOTS = 4096
MAX_ROLES = 64
MAX_BULKHEADS = 4096

#: Fields of one row of a batch of slot events (`SlotTable.apply_batch`/`apply_ops`):
#: slot, event, role, key, chained (tried only if the row before it was applied).
OP_FIELDS = 5

#: Units sent ahead to a pooled slot beyond the one it runs, unless a role says
#: (`fleet.rules.roles.Role.lookahead`); the Executor feeds its workers as deep.
DEFAULT_LOOKAHEAD = 16

#: Linux nice values, and the most levels apart two nices can be.
NICE_MIN, NICE_MAX = -20, 19
LEVELS_MAX = NICE_MAX - NICE_MIN
