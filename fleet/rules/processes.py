"""How many worker processes each role runs on, said the way users think of it (pure).

Users read a role's `slots` as "how many of its units run at once"; what runs them
at once is worker processes (seats). A CPU-bound role runs one unit at a time per
seat, so ``slots = 4`` on one seat still runs its units one after another. The
boot log, `fleetctl plan` and `fleetctl status` print one line per role from the
seat layout, e.g. ``w: 4 slots on 1 worker process: at most 1 unit at once``, so the
difference is never hidden.

Works on the layout as the table's boot metadata holds it (`SeatLayout.to_meta()`
plus ``slot_roles``), so a booted fleet, a projection and a dry-run plan share it.
"""
from __future__ import annotations


def role_processes(meta: dict, roles=None) -> list[dict]:
    """One row per role: ``{"role", "slots", "processes", "shared_with", "io_bound"}``.

    Args:
        meta: holds ``seats`` (each with ``roles``) and ``slot_roles`` (a role name
            per slot, in slot order).
        roles: optional `RoleSet`, to mark I/O-bound roles (they run up to their
            slots at once on each seat); None when only the metadata is known.
    Returns:
        Rows in the order roles first hold a slot. ``processes`` counts the seats
        that run the role; ``shared_with`` names the other roles on those seats.
    """
    slots: dict[str, int] = {}
    for role in meta.get("slot_roles", []):
        slots[role] = slots.get(role, 0) + 1
    rows = []
    for name, count in slots.items():
        seats = [s for s in meta.get("seats", []) if name in s.get("roles", ())]
        others = sorted({r for s in seats for r in s.get("roles", ()) if r != name})
        io = bool(roles is not None and name in roles and roles[name].io_bound)
        rows.append({"role": name, "slots": count, "processes": len(seats), "shared_with": others,
                     "io_bound": io})
    return rows


def describe(row: dict) -> str:
    """``"w: 4 slots on 2 worker processes: at most 2 units at once"``; a role whose
    processes also serve other roles reads ``on any of N worker processes shared with ...``
    (so 4 slots on 5 processes is no riddle); a role without processes says why."""
    slots = f"{row['slots']} slot{'s' if row['slots'] != 1 else ''}"
    n = row["processes"]
    if n == 0:
        return f"{row['role']}: {slots}, no worker process (no handler: declared, not run)"
    processes = f"{n} worker process{'es' if n != 1 else ''}"
    if row.get("shared_with"):
        which = f"any of {processes}" if n > 1 else processes
        text = f"{row['role']}: {slots} on {which} shared with {', '.join(row['shared_with'])}"
    else:
        text = f"{row['role']}: {slots} on {processes}"
    if row.get("io_bound"):
        text += f", I/O-bound: up to {row['slots']} unit{'s' if row['slots'] != 1 else ''} at once"
    elif n < row["slots"]:
        text += f": at most {n} unit{'s' if n != 1 else ''} at once (a CPU-bound process runs one at a time)"
    return text
