"""One replay run: every profile x mode of a trace, same trace, same seed; returns the report."""
from __future__ import annotations

import random
import sys

from fleet.burst.clock import ReplayClock
from fleet.burst.replay import Driver, FleetFailed, fleet_config, replay_name
from fleet.burst.report import build, summarize
from fleet.burst.simulator_process import SimulatorProcess
from fleet.burst.stop import deferred
from fleet.burst.trace import Trace

SWITCH_INTERVAL_S = 0.0002


def warm_up(f, trace: Trace) -> None:
    """One unit per role before any mode is measured: workers forked, clients made, code paths warm."""
    futures = []
    for role in dict.fromkeys(a.role for a in trace.arrivals):
        a = next(x for x in trace.arrivals if x.role == role)
        payload = {"warm": True} if a.route is not None else {"id": "warm", "cpu_ms": 0.0}
        futures.append(f.submit(role, payload, key=a.key))
    for future in futures:
        future.result(60)


def replay(trace: Trace, *, modes=None, speed: float = 1.0, seed: int | None = None, cap: int | None = None,
           profiles=None, name: str | None = None, progress: bool = True, cpu_quota: float | None = None,
           realtime: bool = True, say=None) -> dict:
    """Replay `trace` once per profile x mode; raises FleetFailed (the fleet did not boot),
    CpuQuotaUnavailable (`cpu_quota` without root or v1 cpu).

    One fleet per profile, its provider admission on the replay clock (so it scales with
    `speed`) with an RNG seeded by `seed`; only the admission mode submits with a route.

    `cpu_quota`: run inside the tool's own v1 cpu cgroup of that many CPUs (fleet.burst.cpuquota).
    `realtime`: while a mode runs, put this process's threads in the real-time class when the
    host allows it (see replay.urgent_threads); False keeps them in the normal class.
    `say`: called with a line of what the replay is doing before each mode's first round
    (booting the fleet, starting the simulator, warming up: seconds with no round to show).

    Stopped (SIGTERM, SIGINT: fleet.burst.stop) unwinds it: the simulator is stopped and
    the fleet shut down, its units cancelled, before it propagates.
    """
    if cpu_quota is None:
        return _replay(trace, modes, speed, seed, cap, profiles, name, progress, realtime, say)
    from fleet.burst.cpuquota import cpu_quota as group

    with group(cpu_quota) as info:
        rep = _replay(trace, modes, speed, seed, cap, profiles, name, progress, realtime, say)
    rep["cpu_quota"] = {"cpus": cpu_quota, "cgroup": info["path"], "cpu_stat": info["stat"]}
    return rep


def _console(say, bar):
    """`say`, its lines written above the progress bar when there is one (not through it)."""
    if say is None or bar is None:
        return say or (lambda line: None)

    def above_bar(line):
        with bar.external_write_mode(file=sys.stderr):
            say(line)

    return above_bar


def _replay(trace, modes, speed, seed, cap, profiles, name, progress, realtime, say) -> dict:
    import fleet

    header = trace.header
    modes = tuple(modes or header.modes)
    profiles = tuple(profiles or header.profiles)
    seed = header.seed if seed is None else seed
    cap = cap if cap is not None else header.cap
    name = name or replay_name()
    clock = ReplayClock(speed, header.start)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(trace.arrivals) * len(modes) * len(profiles), unit="round", file=sys.stderr,
                   dynamic_ncols=True, desc=header.name)
    say = _console(say, bar)
    sections = []
    # The scheduler thread shares the GIL with the embedded fleet's supervisor threads (the
    # simulator runs in its own process); the default 5 ms switch interval alone would put arrivals milliseconds late.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        for profile in profiles:
            say(f"booting the fleet {name} (profile {profile}) ...")
            try:
                with deferred():  # a stop signal waits for the fleet to be up (then shut down), not a half boot
                    f = fleet.Fleet.from_config(fleet_config(trace, name, profile), admission_clock=clock,
                                                admission_rng=random.Random(seed))
            except fleet.FleetError as exc:
                raise FleetFailed(f"the replay fleet ({profile}) did not boot: {type(exc).__name__}: {exc}") from None
            sim = SimulatorProcess(header, clock, seed=seed)
            try:
                say("starting the provider simulator ...")
                sim.start()
                roles = len(set(a.role for a in trace.arrivals))
                say(f"warming up {roles} role(s): one unit each ...")
                warm_up(f, trace)
                quota = f.status()["quota"]
                for mode in modes:
                    say(f"replaying {len(trace.arrivals)} arrivals: {profile}/{mode} at speed {speed:g} ...")
                    if bar is not None:
                        bar.set_description(f"{header.name} {profile}/{mode}")
                    driver = Driver(trace, f, sim, clock, mode, cap=cap, progress=bar, realtime=realtime)
                    result = driver.run()
                    result.profile = profile
                    section = summarize(result, trace)
                    section["quota"] = quota
                    section["plan"] = {"binding": f.plan.binding, "oversubscribed": f.plan.oversubscribed}
                    sections.append(section)
            finally:  # also when stopped or failed: nothing of this fleet or its simulator is left
                sim.stop()
                f.shutdown(wait=True, cancel_futures=True)
    finally:
        sys.setswitchinterval(switch)
        if bar is not None:
            bar.close()
    return build(trace, sections, speed=speed, seed=seed, fleet_name=name, cap=cap)
