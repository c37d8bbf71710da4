"""fleet.host.system.Host against the real kernel: what the process may run on is the
process's mask, whichever of its threads asks."""
from __future__ import annotations

import os
import threading

from fleet.host.system import Host
from tests import require


def test_affinity_is_the_processs_mask_even_asked_from_a_thread_pinned_narrower():
    mask = sorted(os.sched_getaffinity(os.getpid()))
    if len(mask) < 2:
        require.lacking(f"needs two CPUs to pin a thread narrower than its process (it may use {mask})")
    seen = {}

    def pinned():
        Host().pin_this_thread({mask[0]})
        seen["thread"] = sorted(os.sched_getaffinity(0))
        seen["affinity"] = Host().affinity()

    t = threading.Thread(target=pinned)
    t.start()
    t.join()
    assert seen["thread"] == [mask[0]]  # the thread itself is pinned ...
    assert seen["affinity"] == mask  # ... and the process still may run on all it could
    assert sorted(os.sched_getaffinity(os.getpid())) == mask
