"""Provider closures as rows of the store (the store's ``closures`` table), for `SqlStore`.

A closure is keyed by its scope (provider, credential; ``''`` for the whole provider).
Writes merge: a later `until` wins, so no fleet shortens what another wrote, and only
`reopen_closure` ends one early. Each call is one short transaction of its own; none
takes the store lock (a closure decides no quota).
"""
from __future__ import annotations

import math

from admission.store.base import BadRequest, Closure, checked_text as _text
from admission.vocab import CLOSURE, REOPENED


class ClosureRows:
    """The closure calls of the SQL store (`admission.store.base.AdmissionStore`'s), written once."""

    def put_closures(self, closures) -> list[Closure]:
        try:
            given = list(closures)
        except TypeError:
            raise BadRequest("closures", f"must be an iterable of closures, got {closures!r}") from None
        rows = [_closure_row(c) for c in given]  # every one checked before anything is written
        with self._guard() as conn:
            cur = conn.cursor()
            now = self.clock()
            self._begin(cur)
            out = []
            for row in rows:
                cur.execute(self._sql(_PUT_CLOSURE_SQL), (*row, now, self.actor))
                written = cur.fetchone()
                if written is not None:
                    c = _closure(written)
                    reason = f"until {c.until:.3f}{' (daily limit)' if c.daily else ''}: {c.cause}"
                    cur.execute(self._event_sql, (now, CLOSURE, c.scope, self.actor,
                                                  f"{reason}: {c.message}" if c.message else reason))
                cur.execute(self._sql(_GET_CLOSURE_SQL), row[:2])
                out.append(_closure(cur.fetchone()))
            self._commit(conn, cur)
            return out

    def closures(self, now: float | None = None) -> list[Closure]:
        now = self.clock() if now is None else now
        with self._read() as cur:
            cur.execute(self._sql(f"SELECT {_CLOSURE_COLS} FROM closures WHERE until > ? ORDER BY provider, credential"),
                        (now,))
            return [_closure(row) for row in cur.fetchall()]

    def reopen_closure(self, provider: str, credential: str | None = None, reason: str = REOPENED) -> bool:
        provider, credential = _closure_scope(provider, credential)
        if not isinstance(reason, str) or "\x00" in reason:
            raise BadRequest("reason", f"must be a string without NUL, got {reason!r}")
        with self._guard() as conn:
            cur = conn.cursor()
            now = self.clock()
            self._begin(cur)
            cur.execute(self._sql("DELETE FROM closures WHERE provider = ? AND credential = ? RETURNING until"),
                        (provider, credential))
            gone = cur.fetchone()
            lifted = gone is not None and gone[0] > now
            if gone is not None:
                scope = Closure(provider, credential or None, 0.0, "").scope
                cur.execute(self._event_sql, (now, REOPENED, scope, self.actor, reason))
            self._commit(conn, cur)
            return lifted


_CLOSURE_COLS = "provider, credential, until, cause, daily, since, message, written_at, written_by"
_GET_CLOSURE_SQL = f"SELECT {_CLOSURE_COLS} FROM closures WHERE provider = ? AND credential = ?"
# A later `until` wins; an earlier one leaves the stored closure as it is (and returns no row).
_PUT_CLOSURE_SQL = (
    f"INSERT INTO closures ({_CLOSURE_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (provider, credential) DO UPDATE SET until = excluded.until, cause = excluded.cause, "
    "daily = excluded.daily, since = excluded.since, message = excluded.message, "
    "written_at = excluded.written_at, written_by = excluded.written_by "
    f"WHERE excluded.until > closures.until RETURNING {_CLOSURE_COLS}")


def _closure(row) -> Closure:
    provider, credential, until, cause, daily, since, message, at, by = row
    return Closure(provider, credential or None, until, cause, bool(daily), since, message, at, by)



def _epoch(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(name, f"must be a finite time in UTC epoch seconds, got {value!r}")
    return float(value)


def _closure_scope(provider, credential) -> tuple[str, str]:
    """(provider, credential) as stored: the whole provider is credential ''."""
    _text("provider", provider)
    if credential is not None:
        _text("credential", credential)
    return provider, credential or ""


def _closure_row(c) -> tuple:
    """The stored fields of closure `c` (anything with the `Closure` fields), checked."""
    provider, credential = _closure_scope(getattr(c, "provider", None), getattr(c, "credential", None))
    daily = getattr(c, "daily", None)
    if not isinstance(daily, bool):
        raise BadRequest("daily", f"must be true or false, got {daily!r}")
    return (provider, credential, _epoch("until", getattr(c, "until", None)), _text("cause", getattr(c, "cause", None)),
            int(daily), _epoch("since", getattr(c, "since", None)),
            _text("message", getattr(c, "message", None), empty_ok=True))
