#!/usr/bin/env python3
"""Benchmark the provider admission: pure decisions, and the live pool's admit + report.

    python tools/bench/admission_bench.py [--json] [--decisions N] [--rounds N]

Figures (all measured in this run, best of three repetitions):
  decisions_per_s            admission.scheduler.decide_batch over a catalog of 50 pools and
                             10 lanes (a tenth of the pools backing off, one provider closed,
                             a tenth of the units delegated, two lanes pinned)
  decisions_per_s_single     the same asks through one `decide` call each (the peer)
  batch_vs_single            decisions_per_s / decisions_per_s_single
  us_per_admit_report        one admit + report(clean) round trip from Python in the live
                             AdmissionPool on an open pool (the common case; real clocks)
  us_per_admit_report_moved  the same when the unit's pool backs off and it moves
Targets (issue 11): decisions_per_s >= 200,000; us_per_admit_report <= 10.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from admission import scheduler as S  # noqa: E402
from admission import state as T  # noqa: E402
from admission.policy import Policy  # noqa: E402
from admission.pool import AdmissionPool, signal_for  # noqa: E402
from admission.route import Route  # noqa: E402

N_PROVIDERS, N_MODELS, N_LANES = 10, 5, 10


def catalog() -> dict:
    """10 providers x 5 models = 50 pools; every model on every provider; 2 tiers; 10 lanes."""
    providers = {}
    for p in range(N_PROVIDERS):
        marks = {"residency": "eu"} if p % 2 == 0 else {}
        providers[f"prov{p}"] = {"models": {f"model{m}-v{p % 3}": marks for m in range(N_MODELS)}}
    lanes = {f"lane{i}": {"exclude": ["model4"]} if i % 3 == 0 else {} for i in range(N_LANES)}
    lanes["lane8"] = {"pinned": True}
    lanes["lane9"] = {"pinned": True}
    return {
        "providers": providers,
        "tiers": {"fast": ["model0", "model1", "model2"], "slow": ["model3", "model4"]},
        "lanes": lanes,
    }


def scene(policy: Policy, seed: int = 1):
    """A state with history: every pool ran; 5 pools back off; provider 3 is closed."""
    rng = random.Random(seed)
    now = T.Now(1_790_000_000.0, 10_000.0)
    state = T.AdmissionState.empty()
    routes = [Route(m, p) for (m, p) in policy.nodes]
    for r in routes:
        for _ in range(rng.randint(1, 20)):
            state = T.seat(state, r, now)
            state = T.report(state, r, T.Signal.clean(rng.uniform(1, 30), rng.uniform(0.001, 0.05)), now, policy)
    for r in rng.sample([r for r in routes if r.provider != "prov3"], 5):
        state = T.seat(state, r, now)
        state = T.report(state, r, T.Signal.refused(429, retry_after=600), now, policy)
    closer = next(r for r in routes if r.provider == "prov3")
    state = T.seat(state, closer, now)
    state = T.report(state, closer, T.Signal.refused(402), now, policy)
    asks = []
    for i in range(20_000):
        asks.append(S.Ask(i, rng.choice(routes), f"lane{rng.randrange(N_LANES)}", rng.choice(("B", "L", None)),
                          parent=i - 1 if rng.random() < 0.1 else None, since=now.mono))
    return state, asks, now


def bench_decisions(n: int):
    policy = Policy.from_dict(catalog())
    state, asks, now = scene(policy)
    reps = max(1, n // len(asks))
    rng = random.Random(2)
    S.decide_batch(asks, state, policy, now, rng)  # warm the policy's alternatives cache
    best_batch = best_single = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            S.decide_batch(asks, state, policy, now, rng)
        best_batch = min(best_batch, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(reps):
            probed: set = set()
            for a in asks:
                S.decide(a, state, policy, now, rng, probed=probed)
        best_single = min(best_single, time.perf_counter() - t0)
    decisions = reps * len(asks)
    actions = S.decide_batch(asks, state, policy, now, rng)
    mix = {k: sum(d.action == k for d in actions) for k in (S.ADMIT, S.MOVE, S.WAIT)}
    return decisions / best_batch, decisions / best_single, mix


def bench_round_trip(rounds: int, moved: bool) -> float:
    policy = Policy.from_dict(catalog())
    pool = AdmissionPool(policy, rng=random.Random(3))
    route = Route("model0-v0", "prov0")
    if moved:
        pool.admit(-1, route)
        pool.report(-1, T.Signal.refused(429, retry_after=3600))
    clean = signal_for(None, seconds=1.0, cost=0.01)
    admit, report = pool.admit, pool.report
    best = float("inf")
    for rep in range(3):
        base = (rep + 1) * rounds
        t0 = time.perf_counter()
        for u in range(base, base + rounds):
            admit(u, route, lane="lane1")
            report(u, clean)
        best = min(best, time.perf_counter() - t0)
    return best / rounds * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--decisions", type=int, default=400_000, help="decisions per timed repetition")
    parser.add_argument("--rounds", type=int, default=50_000, help="admit+report round trips per repetition")
    args = parser.parse_args(argv)
    batch, single, mix = bench_decisions(args.decisions)
    out = {
        "decisions_per_s": round(batch),
        "decisions_per_s_single": round(single),
        "batch_vs_single": round(batch / single, 2),
        "decision_mix": mix,
        "us_per_admit_report": round(bench_round_trip(args.rounds, moved=False), 3),
        "us_per_admit_report_moved": round(bench_round_trip(args.rounds, moved=True), 3),
        "pools": N_PROVIDERS * N_MODELS,
        "lanes": N_LANES,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:28s} {value}")


if __name__ == "__main__":
    main()
