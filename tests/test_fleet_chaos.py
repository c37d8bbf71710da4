"""Chaos: kill workers with SIGKILL while tens of thousands of units run.

Afterwards every future is resolved, the ledger is exact (solved + failed ==
submitted, nothing in flight), every failure is a LaneDeath, and the fleet still
serves."""
from __future__ import annotations

import os
import random
import signal
import threading

from tests.fleets import config, role, running

UNITS = 20_000


def test_sigkill_a_random_worker_every_50ms_under_load(fleet_name):
    cfg = config(fleet_name, {"work": role("square", slots=16, peak_cpus=2)}, profile="pinned",
                 restart={"max_restarts": 1_000_000, "within_seconds": 1})
    with running(cfg) as f:
        stop = threading.Event()
        kills = []

        def chaos():
            rng = random.Random(7)
            while not stop.wait(0.05):
                pids = list(f._sup.pids().values())
                if pids:
                    victim = rng.choice(pids)
                    try:
                        os.kill(victim, signal.SIGKILL)
                        kills.append(victim)
                    except ProcessLookupError:
                        pass

        killer = threading.Thread(target=chaos, daemon=True)
        killer.start()
        try:
            futures = []
            for i in range(UNITS):
                futures.append(f.submit("work", i))
            outcomes = {"solved": 0, "LaneDeath": 0}
            for i, fut in enumerate(futures):
                exc = fut.exception(timeout=300)
                if exc is None:
                    assert fut.result() == i * i
                    outcomes["solved"] += 1
                else:
                    assert exc.reason == "LaneDeath", exc
                    outcomes["LaneDeath"] += 1
        finally:
            stop.set()
            killer.join()
        assert len(kills) >= 5, "the chaos thread never got to kill"
        assert outcomes["LaneDeath"] > 0 and outcomes["solved"] > 0
        ledger = f.ledger()
        assert ledger["submitted"] == UNITS and ledger["inflight"] == 0
        assert ledger["solved"] == outcomes["solved"]
        assert ledger["failed"] == outcomes["LaneDeath"] == ledger["failed_by_reason"]["LaneDeath"]
        # and the fleet still serves
        assert list(f.map("work", range(100))) == [i * i for i in range(100)]
