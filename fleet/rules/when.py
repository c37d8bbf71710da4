"""Wall-clock times as people read them: UTC, ISO 8601 (pure).

Every time fleet prints for a person (store events, leases, closures, status) goes
through `utc`; JSON output keeps the epoch number and may carry this text beside it.
"""
from __future__ import annotations

import time


def utc(epoch_s, *, ms: bool = False) -> str:
    """UTC epoch seconds as ``2026-10-05T00:00:00Z`` (``...00.166Z`` with ``ms``); ``"-"`` for none."""
    if not epoch_s:
        return "-"
    if not ms:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))
    whole, millis = divmod(round(epoch_s * 1000), 1000)  # 20.9996 s is 21.000, not 20.000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{millis:03d}Z"
