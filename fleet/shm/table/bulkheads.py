"""Bulkhead records in the shared table: pack a pool's counters, write them, read them back.

The provider admission (the `admission` package) keeps one bulkhead per pool. Its
single owner (the supervisor) publishes each bulkhead's census row into one record
of the table's bulkhead region with one seqlocked write (`BulkheadWriter.publish`);
any process reads them lock-free from a snapshot (`read`), so `fleetctl status`
shows them with no round trip, even while the supervisor is busy.

A record (fleet.shm.table.layout, ``B_*``) holds 16 words and the pool's name:

    state     open / backoff / closed (0: record unused), | 0x100 when a daily limit closed it
    counts    running, waiting, delegated, successes, failures, consecutive refusals, probes
    until     closed-until and backoff-until as CLOCK_REALTIME ns (0: none)
    cause     of the closure (CAUSES)
    capacity  carrying capacity (load at the last refusal) and the shown-only estimate
    means     round time in µs and cost in nano-USD (integers: a reader needs no float bits)
    name      ``model@provider[/credential]``, UTF-8, NUL-padded to 64 bytes (cut at 64)

`pack` / `unpack` are pure; this module needs neither numpy nor numba to read.
"""
from __future__ import annotations

from fleet.rules.vocab import BULKHEAD_STATES, CLOSURE_CAUSES, BulkheadState
from fleet.shm.table import layout as L

STATES = BULKHEAD_STATES  # by code: 0 is an unused record
CAUSES = CLOSURE_CAUSES  # by code: 0 is none
DAILY_FLAG = 0x100
FIELDS = L.BULKHEAD_SIZE // L.U64
NAME_WORDS = L.BULKHEAD_NAME_BYTES // L.U64
_U64 = (1 << 64) - 1


def _ns(seconds) -> int:
    return 0 if not seconds else max(0, int(round(seconds * 1e9)))


def _count(value) -> int:
    return max(0, int(value or 0)) & _U64


def pack(row: dict) -> list[int]:
    """A census row (admission.pool.bulkhead_row) as the record's FIELDS words, seq word 0."""
    words = [0] * FIELDS
    state = STATES.index(row["state"])
    if state == 0:
        raise ValueError("a published bulkhead is open, backoff or closed")
    words[L.B_STATE] = state | (DAILY_FLAG if row.get("closed_by_daily_limit") else 0)
    words[L.B_INFLIGHT] = _count(row.get("running"))
    words[L.B_WAITING] = _count(row.get("waiting"))
    words[L.B_DELEGATED] = _count(row.get("delegated"))
    words[L.B_SUCCESSES] = _count(row.get("successes"))
    words[L.B_FAILURES] = _count(row.get("failures"))
    words[L.B_REFUSALS] = _count(row.get("refusals"))
    words[L.B_PROBES] = _count(row.get("probes"))
    words[L.B_CLOSED_UNTIL_NS] = _ns(row.get("closed_until"))
    words[L.B_BACKOFF_UNTIL_NS] = _ns(row.get("backoff_until"))
    cause = row.get("cause")
    words[L.B_CAUSE] = CAUSES.index(cause) if cause in CAUSES else 0
    words[L.B_CARRYING] = _count(row.get("carrying_capacity"))
    words[L.B_ESTIMATE] = _count(row.get("estimate"))
    words[L.B_MEAN_US] = _count(round((row.get("mean_seconds") or 0.0) * 1e6))
    words[L.B_MEAN_COST_NUSD] = _count(round((row.get("mean_cost") or 0.0) * 1e9))
    name = _name_bytes(row["pool"])
    first = L.B_NAME_BYTE // L.U64
    for i in range(NAME_WORDS):
        words[first + i] = int.from_bytes(name[i * 8 : i * 8 + 8], "little")
    return words


def _name_bytes(pool: str) -> bytes:
    raw = pool.encode()[: L.BULKHEAD_NAME_BYTES]
    raw = raw.decode("utf-8", "ignore").encode()  # never cut a character in half
    return raw.ljust(L.BULKHEAD_NAME_BYTES, b"\0")


def unpack(words) -> dict | None:
    """A record's words as a row (None for an unused record); the inverse of `pack`."""
    state_word = int(words[L.B_STATE])
    state = state_word & 0xFF
    if state == 0:
        return None
    first = L.B_NAME_BYTE // L.U64
    name = b"".join(int(words[first + i]).to_bytes(8, "little") for i in range(NAME_WORDS)).rstrip(b"\0").decode(
        "utf-8", "replace")
    cause = int(words[L.B_CAUSE])
    closed_ns, backoff_ns = int(words[L.B_CLOSED_UNTIL_NS]), int(words[L.B_BACKOFF_UNTIL_NS])
    return {
        "pool": name,
        "state": STATES[state] if state < len(STATES) else f"?{state}",
        "closed_by_daily_limit": bool(state_word & DAILY_FLAG),
        "running": int(words[L.B_INFLIGHT]),
        "waiting": int(words[L.B_WAITING]),
        "delegated": int(words[L.B_DELEGATED]),
        "successes": int(words[L.B_SUCCESSES]),
        "failures": int(words[L.B_FAILURES]),
        "refusals": int(words[L.B_REFUSALS]),
        "probes": int(words[L.B_PROBES]),
        "closed_until": closed_ns / 1e9 if closed_ns else None,
        "backoff_until": backoff_ns / 1e9 if backoff_ns else None,
        "cause": CAUSES[cause] if cause < len(CAUSES) else f"?{cause}",
        "carrying_capacity": int(words[L.B_CARRYING]),
        "estimate": int(words[L.B_ESTIMATE]),
        "mean_seconds": int(words[L.B_MEAN_US]) / 1e6,
        "mean_cost": int(words[L.B_MEAN_COST_NUSD]) / 1e9,
    }


def read(snapshot) -> list[dict]:
    """Every published bulkhead of a table snapshot (fleet.shm.table.snapshot), in record order."""
    rows = []
    for i in range(snapshot.n_bulkheads):
        row = unpack(snapshot.bulkhead_words(i))
        if row is not None:
            rows.append(row)
    return rows


class BulkheadWriter:
    """The single writer of a table's bulkhead records (the supervisor's loop owns it).

    A pool keeps the record it was first given for the life of the table; pools
    beyond the table's room are not published and counted in `overflow`.
    """

    def __init__(self, table):
        self.table = table
        self._records: dict[str, int] = {}
        self.overflow: set[str] = set()

    def record_of(self, pool: str) -> int | None:
        rec = self._records.get(pool)
        if rec is None and pool not in self.overflow:
            if len(self._records) < self.table.n_bulkheads:
                rec = self._records[pool] = len(self._records)
            else:
                self.overflow.add(pool)
        return rec

    def publish(self, rows) -> int:
        """Write each census row into its record (one seqlocked write each); returns how many."""
        written = 0
        for row in rows:
            rec = self.record_of(row["pool"])
            if rec is None:
                continue
            base = rec * FIELDS
            words = pack(row)
            fields = {base + i: w for i, w in enumerate(words) if i != L.B_SEQ}
            self.table.write_bulkhead(base + L.B_SEQ, fields)
            written += 1
        return written


def held_until(row: dict) -> float | None:
    """When a bulkhead row's hold ends (UTC epoch seconds): its closure's end when
    closed, its backoff's when backing off; None when open."""
    if row["state"] == BulkheadState.CLOSED:
        return row["closed_until"]
    if row["state"] == BulkheadState.BACKOFF:
        return row["backoff_until"]
    return None
