"""The shipped traces, generated (seeded) so they are reproducible.

    python -m fleet.burst.gen examples/traces      # writes the three traces

* ``burst-35.jsonl``: 35 pull-request heads pushed within a minute; each head's review
  is two ensemble rounds at once, then a follow-up round after both, on one review pool
  (glm-5.3-review@openrouter-eu, the provider model fitted to 000, K 12) with a declared
  alternative (the same model on azure-eu).
* ``daily-limit-day.jsonl``: reference 000's 2026-10-04: lanes review, triage, bugfix
  and embeddings all day on one OpenRouter key; the key hits its daily limit (403) at
  14:47Z; the review lane is bound to EU/ZDR residency (its model node carries the ``eu``
  mark, the lane requires it) and its only compliant route is that key (no compliant
  alternative); the other lanes' nodes carry no mark and each has the same model declared
  on another provider.
* ``solve-cycle.jsonl``: reference 002 §1's cycle: resolve (12.4 ms CPU), then 6 keyed
  solver bins, ~95 sims of 3.3 ms CPU (85-105 per cycle) spread over the bins, then a
  merge after every sim; 30 cycles at speed 1. 002's survey saw 333 cycles in ~1158 s (one
  every ~3.5 s); the idle time between cycles is compressed to one cycle a second, which
  changes no cycle's tail as long as a cycle ends within its second.
"""
from __future__ import annotations

import json
import os
import random
import sys

from fleet.burst.trace import FORMAT, VERSION, Arrival, Route


def _write(path, header, arrivals):
    header = {"format": FORMAT, "version": VERSION, **header}
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(header, sort_keys=True) + "\n")
        for a in arrivals:
            f.write(json.dumps(a.to_json(), sort_keys=True) + "\n")


def burst_35(seed: int = 35):
    rng = random.Random(seed)
    review = Route("glm-5.3-review", "openrouter-eu", "k-review")
    header = {
        "name": "burst-35", "start": "2026-10-07T09:00:00Z", "seed": seed, "speed": 60, "horizon_s": 1800,
        "modes": ["none", "cap", "admission"], "cap": 8,
        "pools": [
            {"model": "glm-5.3-review", "provider": "openrouter-eu", "k": 12, "retry_after_s": 10,
             "residency": "eu", "alternatives": [{"model": "glm-5.3-review", "provider": "azure-eu"}]},
            {"model": "glm-5.3-review", "provider": "azure-eu", "k": 6, "retry_after_s": 10, "residency": "eu"},
        ],
        "keys": [{"credential": "k-review", "provider": "openrouter-eu"}],
        "lanes": {"review": {"exclude": ["kimi"]}},
    }
    arrivals = []
    t = 0.0
    for head in range(35):
        t += rng.expovariate(35 / 60.0)
        a1 = Arrival(round(t, 3), f"pr{head}-glm", "review", "review", review, "M", None)
        a2 = Arrival(round(t, 3), f"pr{head}-sol", "review", "review", review, "M", None)
        arrivals += [a1, a2]
    follow = []
    for head in range(35):
        first = arrivals[2 * head]
        follow.append(Arrival(first.t, f"pr{head}-followup", "review", "review", review, "M", f"pr{head}-glm",
                              None, (f"pr{head}-glm", f"pr{head}-sol")))
    merged = sorted(arrivals + follow, key=lambda a: a.t)
    # a follow-up must come after the rounds it names: keep stable order, follow-ups after their pair
    order = {a.id: i for i, a in enumerate(arrivals)}
    merged.sort(key=lambda a: (a.t, order.get(a.id, 10 ** 6)))
    return header, merged


def daily_limit_day(seed: int = 1004):
    rng = random.Random(seed)
    key = "k-control"
    routes = {
        "review": Route("glm-5.3-review", "openrouter-eu", key),
        "triage": Route("deepseek-v4-flash", "openrouter-eu", key),
        "bugfix": Route("glm-5.3-coding", "openrouter-eu", key),
        "embeddings": Route("text-embed-3", "openrouter-eu", key),
    }
    header = {
        "name": "daily-limit-day", "start": "2026-10-04T00:00:00Z", "seed": seed, "speed": 1440, "horizon_s": 86400,
        "modes": ["none", "cap", "admission"], "cap": 8,
        "pools": [
            {"model": "glm-5.3-review", "provider": "openrouter-eu", "k": 12, "residency": "eu"},
            {"model": "deepseek-v4-flash", "provider": "openrouter-eu", "k": 12,
             "latency": {"median_s": 4.0, "sigma": 0.3},
             "alternatives": [{"model": "deepseek-v4-flash", "provider": "deepinfra"}]},
            {"model": "deepseek-v4-flash", "provider": "deepinfra", "k": 12, "latency": {"median_s": 4.0, "sigma": 0.3}},
            {"model": "glm-5.3-coding", "provider": "openrouter-eu", "k": 12, "latency": {"median_s": 20.0, "sigma": 0.5},
             "alternatives": [{"model": "glm-5.3-coding", "provider": "zai"}]},
            {"model": "glm-5.3-coding", "provider": "zai", "k": 8, "latency": {"median_s": 20.0, "sigma": 0.5}},
            {"model": "text-embed-3", "provider": "openrouter-eu", "k": 40,
             "latency": {"median_s": 0.4, "sigma": 0.2},
             "alternatives": [{"model": "text-embed-3", "provider": "openai"}]},
            {"model": "text-embed-3", "provider": "openai", "k": 40, "latency": {"median_s": 0.4, "sigma": 0.2}},
        ],
        "keys": [{"credential": key, "provider": "openrouter-eu", "daily_limit_at": [14 * 3600 + 47 * 60],
                  "reset": "midnight"},
                 {"credential": "k-deepinfra", "provider": "deepinfra"}],
        "lanes": {"review": {"residency": "eu", "exclude": ["kimi"]}},
        "admission": {"daily_limit_probe_every": 600},
    }
    every = {"review": 240.0, "triage": 180.0, "bugfix": 600.0, "embeddings": 60.0}
    arrivals = []
    for lane, mean in every.items():
        t = 0.0
        n = 0
        while True:
            t += rng.expovariate(1.0 / mean)
            if t >= 86400 - 1800:
                break
            sev = rng.choice(["B", "H", "M", "L", None]) if lane == "bugfix" else None
            arrivals.append(Arrival(round(t, 3), f"{lane}-{n}", lane, lane, routes[lane], sev))
            n += 1
    arrivals.sort(key=lambda a: (a.t, a.id))
    return header, arrivals


def solve_cycle(seed: int = 2, cycles: int = 30, period_s: float = 1.0):
    rng = random.Random(seed)
    header = {"name": "solve-cycle", "start": "2026-09-08T00:00:00Z", "seed": seed, "speed": 1, "horizon_s": cycles * period_s + 30,
              "modes": ["none"], "profiles": ["auto", "pinned"]}
    arrivals = []
    for c in range(cycles):
        t0 = round(c * period_s, 3)
        resolve = Arrival(t0, f"c{c}-resolve", "resolve", "cycle", None, None, None, None, (), 12.4, None, c)
        arrivals.append(resolve)
        bins = []
        for b in range(6):
            bins.append(Arrival(t0, f"c{c}-bin{b}", "solver", "cycle", None, None, None, f"bin-{b}",
                                (resolve.id,), 2.0, None, c))
        arrivals += bins
        n_sims = rng.randint(85, 105)
        sims = [Arrival(t0, f"c{c}-sim{i}", "sim", "cycle", None, None, bins[i % 6].id, None, (bins[i % 6].id,), 3.3,
                        None, c) for i in range(n_sims)]
        arrivals += sims
        arrivals.append(Arrival(t0, f"c{c}-merge", "merge", "cycle", None, None, None, None,
                                tuple(s.id for s in sims), 2.0, None, c))
    return header, arrivals


TRACES = {"burst-35.jsonl": burst_35, "daily-limit-day.jsonl": daily_limit_day, "solve-cycle.jsonl": solve_cycle}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    folder = argv[0] if argv else "examples/traces"
    os.makedirs(folder, exist_ok=True)
    for name, make in TRACES.items():
        header, arrivals = make()
        _write(os.path.join(folder, name), header, arrivals)
        print(f"{name}: {len(arrivals)} arrivals")
    return 0


if __name__ == "__main__":
    sys.exit(main())
