"""A second process that watches a running fleet's slot words while a stress runs.

Run as ``python -m tests.role_census_sampler FLEET_NAME COUNTS_JSON`` (COUNTS_JSON maps
role name -> its budget count). It attaches read-only, prints ``ready``, then samples
until a line arrives on stdin, and prints one JSON report:

* ``samples``: consistent samples taken; ``max_held``: the most slots each role held
  in one sample; ``over_count``: samples in which a role held more than its count;
* ``pin_switches``: slots that were seen Pinned for (role, key) and later seen serving
  another role or key, or Idle (no epoch, no death happens during the stress).

A sample is consistent when every slot word read twice in a row is unchanged: then all
words held those values at one instant (the generation bits rule out an A-B-A).
"""
from __future__ import annotations

import json
import select
import sys

from fleet.rules import fsm
from fleet.shm.table import SlotTable
from fleet.shm.table import layout as L
from fleet.shm.table.kernels import SLOT_FIELDS


def watch(name: str, counts: dict) -> dict:
    table = SlotTable.attach(name, writable=False)
    try:
        names = table.snapshot().role_names
        count_of = [counts.get(n, 0) for n in names]
        words = table.slots[L.S_WORD :: SLOT_FIELDS]
        samples, max_held, over, pinned, switches = 0, [0] * len(names), [], {}, []
        print("ready", flush=True)
        while not select.select([sys.stdin], [], [], 0.0005)[0]:  # a breath: this host has 2 cores
            first = words.tolist()
            second = words.tolist()
            if first != second:
                continue  # a word moved while we read: not one instant
            samples += 1
            held = [0] * len(names)
            for slot, word in enumerate(first):
                state, role, key, _gen = L.unpack_word(word)
                if state != fsm.IDLE:
                    held[role] += 1
                seen = pinned.get(slot)
                if seen is not None and (state == fsm.IDLE or (role, key) != seen):
                    switches.append({"slot": slot, "pinned": [names[seen[0]], seen[1]],
                                     "then": [fsm.STATE_NAMES[state], names[role], key]})
                    pinned.pop(slot)
                elif state == fsm.PINNED:
                    pinned[slot] = (role, key)
            for code, n in enumerate(held):
                max_held[code] = max(max_held[code], n)
                if n > count_of[code]:
                    over.append({"role": names[code], "held": n, "count": count_of[code]})
        return {"samples": samples, "max_held": dict(zip(names, max_held)), "over_count": over[:20],
                "pin_switches": switches[:20], "pins_seen": len(pinned)}
    finally:
        table.close()


if __name__ == "__main__":
    report = watch(sys.argv[1], json.loads(sys.argv[2]))
    print(json.dumps(report), flush=True)
