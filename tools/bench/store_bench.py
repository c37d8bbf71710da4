"""Benchmark the host-group admission store: admit+release cycles per second.

    python tools/bench/store_bench.py [--json] [--seconds 3] [--rounds 3] [--pg-dsn URI]

Measures, in one run on one machine:

- ``sqlite_1_per_s`` / ``sqlite_4_per_s``: cycles/s with 1 and 4 orchestrator
  processes sharing one SQLite store (WAL). A cycle is one ``submit`` that is
  admitted at once plus one ``release`` of its lease, each a durable store
  transaction with its audit rows. The requests are of the ``container`` tier under a
  policy without quotas, the case the store admits without its lock.
- ``pg_1_per_s`` / ``pg_4_per_s``: the same on PostgreSQL.
- ``pg_4_quota_per_s``: the same with 4 processes, but every request counts against an
  environment quota (never full), so every submit takes the store lock and counts the
  live requests: the serialized path quotas need (on PostgreSQL one call of the store's
  admission function, the lock held only inside the server).
- ``pg_bare_skip_locked_per_s``: the peer. 4 processes on the same PostgreSQL run
  the classic job-queue claim — ``UPDATE ... WHERE id = (SELECT id ... FOR UPDATE SKIP
  LOCKED LIMIT 1)`` marking a pre-filled row claimed, one transaction — and then complete
  it in a second transaction: two synchronously committed transactions per cycle like
  ours, without quotas, audit rows or inserts.
- ``ratio_pg4_over_bare`` = pg_4_per_s / pg_bare_skip_locked_per_s, and
  ``ratio_pg4_quota_over_bare`` likewise; ``ratio_pg4_over_bare_per_round`` shows its spread.

The three 4-process PostgreSQL cases take turns in ``--rounds`` rounds (each round
``--seconds / --rounds`` long per case), so a neighbour's load on a shared machine lands
on all of them alike; each key is the mean over rounds.

PostgreSQL comes from ``--pg-dsn``, else ``$FLEET_PG_DSN``, else the local server
at ``postgresql://postgres@127.0.0.1:5432/test``; the bench works in schemas of its
own and drops them afterwards. Without a reachable PostgreSQL the pg keys are null.
Targets on a 2-core machine: sqlite_1_per_s >= 2000, ratio_pg4_over_bare >= 0.5,
ratio_pg4_quota_over_bare >= 0.5.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from admission.store import Policy, Request, open_store  # noqa: E402

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"


def _with_schema(dsn: str, schema: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}options=-csearch_path%3D{schema}"


def _store_worker(url: str, actor: str, seconds: float, start, out) -> None:
    store = open_store(url, actor=actor)
    start.wait()
    n, i = 0, 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(20):
            rec = store.submit(Request(f"{actor}-{i}", actor, "bench", "local", "container", lease_ttl=60.0))
            if rec.state != "admitted":
                raise SystemExit(f"{rec.id} was {rec.state}, expected admitted")
            store.release(rec.id, rec.revision)
            i += 1
            n += 1
    out.put(n)
    store.close()


def _bare_worker(url: str, seconds: float, start, out) -> None:
    import psycopg

    conn = psycopg.connect(url)
    start.wait()
    n = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(20):
            with conn.transaction():
                row = conn.execute(
                    "UPDATE bare_jobs SET state = 'claimed' WHERE id = (SELECT id FROM bare_jobs WHERE state = 'ready' "
                    "ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id").fetchone()
            if row is None:
                raise SystemExit("bare queue ran dry; raise --bare-rows")
            with conn.transaction():
                conn.execute("UPDATE bare_jobs SET state = 'done' WHERE id = %s", (row[0],))
            n += 1
    out.put(n)
    conn.close()


def _run_procs(target, args_of, procs: int, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    workers = [ctx.Process(target=target, args=(*args_of(k), seconds, start, out)) for k in range(procs)]
    for w in workers:
        w.start()
    time.sleep(1.0)  # let every process connect before the clock starts
    t0 = time.perf_counter()
    start.set()
    total = sum(out.get(timeout=seconds + 120) for _ in workers)
    elapsed = time.perf_counter() - t0
    for w in workers:
        w.join(30)
        if w.exitcode != 0:
            raise RuntimeError(f"a bench process failed (exit {w.exitcode})")
    return total / elapsed


#: The policy of the ``*_quota_*`` cases: the bench environment has a quota it never reaches,
#: so every submit is counted against it under the store lock.
QUOTED = {"environments": {"bench": 1_000_000}}


def _open_policy(url: str, policy: dict | None = None) -> None:
    with open_store(url, actor="bench-setup") as s:
        s.set_policy(Policy.build(policy, aging_interval=60))  # container tier: every submit admits


def bench_sqlite(seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = {}
        for procs in (1, 4):
            url = f"sqlite://{d}/store-{procs}.db"
            _open_policy(url)
            out[f"sqlite_{procs}_per_s"] = _run_procs(_store_worker, lambda k: (url, f"o{k}"), procs, seconds)
        return out


def _pg_schema(admin, dsn: str, schemas: list) -> str:
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    schemas.append(schema)
    admin.execute(f"CREATE SCHEMA {schema}")
    return _with_schema(dsn, schema)


def bench_pg(dsn: str, seconds: float, bare_rows: int, rounds: int) -> dict:
    import psycopg

    admin = psycopg.connect(dsn, autocommit=True, connect_timeout=5)
    schemas: list[str] = []
    try:
        out = {}
        url = _pg_schema(admin, dsn, schemas)
        _open_policy(url)
        out["pg_1_per_s"] = _run_procs(_store_worker, lambda k: (url, f"o{k}"), 1, seconds)
        store_url = _pg_schema(admin, dsn, schemas)
        _open_policy(store_url)
        bare_url = _pg_schema(admin, dsn, schemas)
        with psycopg.connect(bare_url, autocommit=True) as c:
            c.execute("CREATE TABLE bare_jobs (id BIGSERIAL PRIMARY KEY, state TEXT NOT NULL)")
            c.execute("CREATE INDEX bare_ready ON bare_jobs (id) WHERE state = 'ready'")
            c.execute("INSERT INTO bare_jobs (state) SELECT 'ready' FROM generate_series(1, %s)", (bare_rows,))
            c.execute("ANALYZE bare_jobs")
        locked_url = _pg_schema(admin, dsn, schemas)
        _open_policy(locked_url, QUOTED)
        # The 4-process cases take turns, `rounds` times, so that each sees the same machine:
        # a neighbour's load lands on all of them.
        store_rates, locked_rates, bare_rates = [], [], []
        for r in range(rounds):
            store_rates.append(_run_procs(_store_worker, lambda k: (store_url, f"o{k}r{r}"), 4, seconds / rounds))
            bare_rates.append(_run_procs(_bare_worker, lambda k: (bare_url,), 4, seconds / rounds))
            locked_rates.append(_run_procs(_store_worker, lambda k: (locked_url, f"o{k}r{r}"), 4, seconds / rounds))
        out["pg_4_per_s"] = sum(store_rates) / rounds
        out["pg_4_quota_per_s"] = sum(locked_rates) / rounds
        out["pg_bare_skip_locked_per_s"] = sum(bare_rates) / rounds
        out["ratio_pg4_over_bare"] = out["pg_4_per_s"] / out["pg_bare_skip_locked_per_s"]
        out["ratio_pg4_quota_over_bare"] = out["pg_4_quota_per_s"] / out["pg_bare_skip_locked_per_s"]
        out["ratio_pg4_over_bare_per_round"] = [s / b for s, b in zip(store_rates, bare_rates)]
        return out
    finally:
        for schema in schemas:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        admin.close()


def _rounded(v):
    if isinstance(v, float):
        return round(v, 3)
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    return v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--seconds", type=float, default=3.0, help="measuring time per case (default 3)")
    ap.add_argument("--pg-dsn", default=os.environ.get("FLEET_PG_DSN") or DEFAULT_PG)
    ap.add_argument("--rounds", type=int, default=3, help="turns of pg_4 and bare, sharing --seconds (default 3)")
    ap.add_argument("--bare-rows", type=int, default=400_000, help="rows queued for the bare claim")
    args = ap.parse_args(argv)
    result = {"cpus": os.cpu_count(), "seconds_per_case": args.seconds}
    result.update(bench_sqlite(args.seconds))
    try:
        result.update(bench_pg(args.pg_dsn, args.seconds, args.bare_rows, args.rounds))
    except Exception as exc:  # no PostgreSQL here: report it, keep the SQLite figures
        result.update(pg_1_per_s=None, pg_4_per_s=None, pg_4_quota_per_s=None, pg_bare_skip_locked_per_s=None,
                      ratio_pg4_over_bare=None, ratio_pg4_quota_over_bare=None, pg_error=f"{type(exc).__name__}: {exc}")
    result["targets"] = {"sqlite_1_per_s": 2000, "ratio_pg4_over_bare": 0.5, "ratio_pg4_quota_over_bare": 0.5}
    if args.json:
        print(json.dumps(_rounded(result), indent=2))
    else:
        for k, v in result.items():
            print(f"{k:30} {v:,.3f}" if isinstance(v, float) else f"{k:30} {_rounded(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
