"""Chaos: kill workers with SIGKILL while tens of thousands of units run.

Afterwards every future is resolved, the ledger is exact (solved + failed ==
submitted, nothing in flight), every failure is a LaneDeath, and the fleet still
serves."""
from __future__ import annotations

import collections
import os
import random
import signal
import threading
import time

import pytest

from fleet.rules.unit import RoleStopped
from tests.fleets import config, descendants, role, running, worker_pids

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
            # At least UNITS, and on until the storm has killed a few times: a fast
            # fleet may otherwise finish its load between two kills.
            give_up = time.monotonic() + 120
            while len(futures) < UNITS or (len(kills) < 5 and time.monotonic() < give_up):
                futures.append(f.submit("work", len(futures)))
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
        # A kill fails only the unit its worker had started (one at a time on a CPU seat);
        # what it had been granted but not started runs elsewhere. So a storm of tiny
        # units may fail none at all, and never more than it killed.
        assert outcomes["solved"] > 0 and outcomes["LaneDeath"] <= len(kills), (outcomes, len(kills))
        ledger = f.ledger()
        assert ledger["submitted"] == len(futures) and ledger["inflight"] == 0
        assert ledger["solved"] == outcomes["solved"]
        # failed_by_reason names only the reasons that occurred: a storm that failed none has no LaneDeath
        assert ledger["failed"] == outcomes["LaneDeath"] == ledger["failed_by_reason"].get("LaneDeath", 0)
        # and the fleet still serves, once the last kill is seen: a worker killed while it
        # owed nothing may not be reaped yet, and a unit granted to it would rightly fail.
        deadline = time.monotonic() + 60
        while (set(worker_pids(f)) & set(kills)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert list(f.map("work", range(100))) == [i * i for i in range(100)]


# --- the kill storm: two small roles, restart intensity, kills during shutdown ----------------
#
# Two pooled roles of two slots each on a forced pinned profile; a thread SIGKILLs a
# random worker every 30 ms (and now and then the zygote) from the first submit until
# shutdown has waited a few seconds, so deaths land mid-unit, between units, while a seat is being
# re-forked, after a role was stopped and while shutdown waits for the queues. With the
# default restart intensity the roles are soon stopped (RoleStopped); with a lenient one
# they live, and shutdown must drain their queues through the storm. The first death
# holds a sticky lane-death cordon: when `b` is deferrable it takes nothing new from then
# on, and its units fail Shutdown at close instead of waiting for a release. Whatever
# the kill timing: shutdown returns, every future resolves once, the ledger is exact.

#: (seed, restart intensity, cordon class of role b)
STORM_CASES = [(11, "default", "never"), (23, "default", "deferrable"), (37, "lenient", "never"),
               (41, "lenient", "never"), (53, "lenient", "deferrable")]
STORM_UNITS = 800
STORM_BURST = 1000
STORM_KILL_EVERY_S = 0.03
STORM_ZYGOTE_EVERY_S = 1.0  # at most one zygote kill a second
STORM_DURING_SHUTDOWN_S = 5.0  # how long the storm goes on once shutdown has started
SHUTDOWN_DEADLINE_S = 120  # generous: an "eventually", never a timing assertion


def runs_by_unit(directory: str) -> collections.Counter:
    """{tag: how many times its handler ran}, from the files `tests.handlers.note_run` writes."""
    out = collections.Counter()
    for name in os.listdir(directory):
        if name != "order":
            with open(os.path.join(directory, name)) as f:
                out[int(name)] = len(f.read().splitlines())
    return out


class KillStorm:
    """SIGKILLs a random worker of `f` every `every` seconds, the zygote now and then."""

    def __init__(self, f, seed: int):
        self.f, self.rng = f, random.Random(seed)
        self.stop = threading.Event()
        self.kills = self.zygote_kills = 0
        self._first_done: dict[int, int] = {}  # worker pid -> units its slots had done when first seen
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        next_zygote = time.monotonic() + STORM_ZYGOTE_EVERY_S
        serving_since: dict[int, float] = {}  # zygote pid -> when the storm first saw it serve
        while not self.stop.wait(STORM_KILL_EVERY_S):
            sup = self.f._sup
            zygote, pids = sup.seats.workers.zygote, sorted(sup.pids().values())
            now = time.monotonic()
            if zygote is not None and pids:
                serving_since.setdefault(zygote.pid, now)
            # The zygote only once it has served a while (forked workers, at least a kill
            # period ago): one killed again and again as it comes up is a broken host,
            # and the fleet rightly spends all its time restarting it.
            served = zygote is not None and pids and now - serving_since[zygote.pid] >= STORM_ZYGOTE_EVERY_S
            if now >= next_zygote and served and self.rng.random() < 0.3:
                next_zygote = time.monotonic() + STORM_ZYGOTE_EVERY_S
                victim = zygote.pid
                self.zygote_kills += 1
            else:
                pids = self._served(sup, pids)
                if not pids:
                    continue
                victim = self.rng.choice(pids)
                self.kills += 1
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _served(self, sup, pids: list) -> list:
        """The workers among `pids` that ran a unit since the storm first saw them. Only
        those are killed: on a loaded host a worker can take longer to start than the
        storm takes to kill it, and a storm that kills every worker before its first unit
        starves the fleet (shutdown waits for ever, as it should), which says nothing of
        the runtime. Each worker serves at least one unit, every death still lands
        anywhere after that."""
        table = sup.table
        if table is None:
            return []
        snap = table.snapshot()
        done: dict[int, int] = collections.Counter()
        for i in range(len(sup.layout.slots)):
            row = snap.slot(i)
            done[row["pid"]] += row["done"]
        return [pid for pid in pids if done[pid] > self._first_done.setdefault(pid, done[pid])]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def _wedge_report(f) -> str:
    sup = f._sup

    def ask(fn):
        try:  # a wedged loop may not answer: say so rather than hang the report
            return sup.inspect(fn, timeout=2)
        except TimeoutError:
            return "<the loop did not answer>"

    slots = [(i, sup.table.state(i)) for i in range(len(sup.layout.slots))] if sup.table else None
    return (f"ledger {sup.ledger.counts().to_dict()}; slots (state, role, key, gen) {slots}; pids {ask(lambda s: dict(s.seats.workers.pids))}; "
            f"pending forks {ask(lambda s: s.seats.workers.forking)}; stopped roles {ask(lambda s: set(s.role_stops.view))}; "
            f"queued {ask(lambda s: [s.dispatcher.queued(c) for c in range(len(s.roles))])}; "
            f"zygote {ask(lambda s: s.seats.workers.zygote and s.seats.workers.zygote.pid)}; "
            f"posture {ask(lambda s: sorted(s.posture.causes))}")


def _storm_config(name: str, restart: str, b_class: str) -> dict:
    roles = {"a": role("marked_echo", slots=2), "b": role("marked_echo", slots=2, cordon_class=b_class)}
    lenient = {"max_restarts": 1_000_000, "within_seconds": 1}
    cfg = config(name, roles, profile="pinned", restart=lenient if restart == "lenient" else None)
    cfg["fleet"]["cpus"] = 2
    return cfg


@pytest.mark.parametrize("seed, restart, b_class", STORM_CASES, ids=[f"{s}-{r}-b_{c}" for s, r, c in STORM_CASES])
def test_a_kill_storm_never_wedges_the_fleet(fleet_name, seed, restart, b_class, caplog, tmp_path):
    rng = random.Random(seed)
    marks = str(tmp_path)
    before = descendants()
    with running(_storm_config(fleet_name, restart, b_class)) as f, KillStorm(f, seed) as storm:
        futures, live = [], ["a", "b"]
        # Paced submits (the storm meets a flowing fleet), then a burst (a backlog is
        # queued when shutdown starts, so deaths land while shutdown waits for it).
        for i in range(STORM_UNITS + STORM_BURST):
            if not live:
                break
            name = rng.choice(live)  # (a deferrable b is cordoned from the first death on)
            payload = rng.randbytes(rng.choice((1, 100, 4096, rng.randint(1, 64 * 1024 - 256))))
            try:
                futures.append((f.submit(name, (marks, i, payload)), payload, name))
            except RoleStopped:
                live.remove(name)  # restart intensity stopped it: correct, and final
            if i < STORM_UNITS and rng.random() < 0.05:
                time.sleep(rng.random() * 0.02)
        # Shut down with units still queued, the storm still raging for a while: deaths
        # land while shutdown waits for the queues. Then the storm ends, and shutdown must
        # return: a storm that never ends outpaces any fleet on a host slow enough to fork
        # (each worker serves a unit or two before it dies), which would measure the
        # host's fork rate against the deadline, not whether the runtime wedges.
        closer = threading.Thread(target=f.shutdown, daemon=True)
        closer.start()
        closer.join(STORM_DURING_SHUTDOWN_S)
        storm.stop.set()
        closer.join(SHUTDOWN_DEADLINE_S)
        if closer.is_alive():
            report = _wedge_report(f)
            f._sup.kill()  # so the test ends (and cleans up) instead of hanging with it
            pytest.fail(f"shutdown wedged: {report}")
    outcomes = collections.Counter()
    ran = runs_by_unit(marks)
    assert max(ran.values(), default=0) <= 1, "a unit ran twice"
    for fut, payload, name in futures:
        assert fut.done()
        exc = fut.exception(timeout=0)
        if exc is None:
            assert fut.result() == payload
            outcomes["solved"] += 1
        else:
            allowed = ("LaneDeath", "RoleStopped") + (("Shutdown",) if b_class == "deferrable" else ())
            assert exc.reason in allowed, exc
            assert exc.reason != "Shutdown" or name == "b", exc  # only cordon-deferred work is shed at close
            outcomes[exc.reason] += 1
    ledger = f.ledger()
    assert ledger["submitted"] == len(futures) > 0
    assert ledger["inflight"] == 0
    assert ledger["solved"] + ledger["suppressed"] + ledger["failed"] == ledger["submitted"]
    assert ledger["solved"] == outcomes["solved"]
    assert ledger["failed_by_reason"] == {r: n for r, n in outcomes.items() if r != "solved"}
    assert storm.kills > 0
    assert "supervisor loop crashed" not in caplog.text
    deadline = time.monotonic() + 10
    while descendants() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not descendants() - before, "processes left behind"


# --- deaths in the middle of a flowing load: only units that started fail ---------------------
#
# Now and then a unit kills its own worker (SIGKILL) from inside its handler, after its
# handler noted the run: so at every death the worker is inside a unit that ran, never
# between two (a kill from outside may land after a unit's START and before its handler's
# first line, where the fleet rightly counts it as started but the handler wrote nothing).
# Units pour in while the seats die, and shutdown drains the backlog through the deaths.
# Every unit granted to a dead seat's other slots, or sent ahead to it, never started:
# it must solve, run once, and no LaneDeath may fall on it.

DEATHS_UNITS = 1500
DEATH_EVERY = 30  # about one unit in this many kills its worker


@pytest.mark.parametrize("profile", ["serial", "pinned"])
def test_a_storm_of_deaths_fails_only_the_units_that_started(fleet_name, tmp_path, profile):
    marks = str(tmp_path)
    # b has one slot per seat: its next units are sent ahead, to wait on the ring behind it
    roles = {"a": role("marked_or_die", slots=4), "b": role("marked_or_die", slots=1, lookahead=4)}
    cfg = config(fleet_name, roles, profile=profile, restart={"max_restarts": 1_000_000, "within_seconds": 1})
    cfg["fleet"]["cpus"] = 2
    rng = random.Random(61)
    with running(cfg) as f:
        futures = []
        for tag in range(DEATHS_UNITS):
            die = rng.randrange(DEATH_EVERY) == 0
            futures.append((f.submit(rng.choice("ab"), (marks, tag, die, tag)), tag, die))
        closer = threading.Thread(target=f.shutdown, daemon=True)  # the backlog drains through the deaths
        closer.start()
        closer.join(SHUTDOWN_DEADLINE_S)
        if closer.is_alive():
            report = _wedge_report(f)
            f._sup.kill()
            pytest.fail(f"shutdown wedged: {report}")
    ran = runs_by_unit(marks)
    lane_deaths = [tag for fut, tag, _die in futures if fut.exception(timeout=0) is not None]
    never_started = [tag for tag in lane_deaths if ran[tag] == 0]
    assert never_started == [], f"{len(never_started)} of {len(lane_deaths)} LaneDeaths never ran"
    for fut, tag, die in futures:
        exc = fut.exception(timeout=0)
        if die:
            assert exc is not None and exc.reason == "LaneDeath", (tag, exc)
        else:
            assert exc is None and fut.result() == tag, (tag, exc)
    assert [ran[tag] for _fut, tag, _die in futures] == [1] * DEATHS_UNITS  # every unit ran, and once
    deaths = sum(die for _fut, _tag, die in futures)
    assert deaths > 10
    ledger = f.ledger()
    assert (ledger["submitted"], ledger["solved"], ledger["failed"], ledger["inflight"]) == (
        DEATHS_UNITS, DEATHS_UNITS - deaths, deaths, 0)
    assert ledger["failed_by_reason"] == {"LaneDeath": deaths}
