"""Replies of the daemon's ops that fleetctl draws with the status screen's tables
(`fleet.cli.cmd_status`), keyed by op name (`RENDER`); every other op renders its own
reply (`fleet.service.control.ops.Op.render`). They live here, not in the op, because
those tables are the command line's (the floor above the ops')."""
from __future__ import annotations

from fleet.cli.cmd_status import _dash, _table, render_admission, render_bulkheads, utc


def admission_show(doc: dict, args=None) -> str:
    """``admission show``: every bulkhead (state, closure cause and end, counters), the
    lane x bulkhead rows, live closures, the starving list and the units waiting."""
    lines = render_bulkheads(doc.get("bulkheads", [])) or ["bulkheads none yet (no unit has asked for a provider)"]
    lanes = [(_dash(r["lane"]), r["pool"], str(r["running"]), str(r["waiting"]), str(r["delegated"]),
              str(r["moved_in"]), str(r["refused"]), f"${r['spent_today']:.4f}") for r in doc.get("lanes", [])]
    if lanes:
        lines += ["lanes"] + _table(("lane", "pool", "running", "waiting", "delegated", "moved in", "refused",
                                     "spent today"), lanes)
    for b in doc.get("bulkheads", []):
        if b.get("pinned_wait"):
            lines.append(f"pinned    {b['pool']}: {b['pinned_wait']}")
    for c in doc.get("closures", []):
        who = c["provider"] + (f"/{c['credential']}" if c.get("credential") else "")
        lines.append(f"closed    {who}: {c['cause']}{' (daily limit)' if c['daily'] else ''} until {utc(c['until'])}"
                     + (f": {c['message']}" if c.get("message") else ""))
    lines += render_admission(doc)
    return "\n".join(lines) + "\n"


#: op name -> its renderer ``(reply, parsed args) -> text``.
RENDER = {"admission_show": admission_show}
