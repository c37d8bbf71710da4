"""The store's schema: its version and the migrations that reach it, shared by both backends.

A store records the version it is at (``schema_version``); opening it runs the
migrations above that version in one transaction, under the migration lock, and code
older than the store refuses to touch it (SchemaTooNew).
"""
from __future__ import annotations

#: The schema this code writes. Bump it and append to MIGRATIONS together.
SCHEMA_VERSION = 4
# {serial} and {float} are filled in per dialect, {now} and {lapses} with the migrating
# handle's clock (now, and one heartbeat window later); everything else is common SQL. A
# migration is history: its text never changes (a state list in it is the list of its day).
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE requests (
            id TEXT PRIMARY KEY,
            orchestrator TEXT NOT NULL,
            environment TEXT NOT NULL,
            provider TEXT NOT NULL,
            tier TEXT NOT NULL,
            priority BIGINT NOT NULL,
            queue_timeout {float},
            preemptible INTEGER NOT NULL,
            lease_ttl {float} NOT NULL,
            submitted_at {float} NOT NULL,
            state TEXT NOT NULL,
            revision BIGINT NOT NULL,
            lease_expires {float},
            decided_at {float},
            reason TEXT NOT NULL)""",
        "CREATE INDEX requests_live ON requests (state) WHERE state IN ('queued', 'admitted')",
        """CREATE TABLE events (
            seq {serial},
            at {float} NOT NULL,
            kind TEXT NOT NULL,
            request_id TEXT NOT NULL,
            actor TEXT NOT NULL,
            reason TEXT NOT NULL)""",
        "CREATE INDEX events_request ON events (request_id)",
        """CREATE TABLE policy (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            body TEXT NOT NULL,
            updated_at {float} NOT NULL,
            updated_by TEXT NOT NULL)""",
        """CREATE TABLE closures (
            key TEXT PRIMARY KEY,
            until {float} NOT NULL,
            reason TEXT NOT NULL,
            daily INTEGER NOT NULL,
            recorded_at {float} NOT NULL,
            recorded_by TEXT NOT NULL)""",
    ),
    # Provider closures by scope (provider, credential; '' = the whole provider), in the
    # provider admission's own terms. A version-1 closure keyed by one string becomes the
    # closure of the provider of that name.
    2: (
        """CREATE TABLE closures_v2 (
            provider TEXT NOT NULL,
            credential TEXT NOT NULL,
            until {float} NOT NULL,
            cause TEXT NOT NULL,
            daily INTEGER NOT NULL,
            since {float} NOT NULL,
            message TEXT NOT NULL,
            written_at {float} NOT NULL,
            written_by TEXT NOT NULL,
            PRIMARY KEY (provider, credential))""",
        """INSERT INTO closures_v2 (provider, credential, until, cause, daily, since, message, written_at, written_by)
            SELECT key, '', until, reason, daily, recorded_at, reason, recorded_at, recorded_by FROM closures""",
        "DROP TABLE closures",
        "ALTER TABLE closures_v2 RENAME TO closures",
    ),
    # Orchestrator heartbeats. A store of version 2 had none: its orchestrators are judged
    # by heartbeat from their first beat on.
    3: (
        """CREATE TABLE orchestrators (
            id TEXT PRIMARY KEY,
            beat_at {float} NOT NULL,
            lapses_at {float} NOT NULL,
            started_at {float} NOT NULL)""",
    ),
    # The runtime as a request named it (its tier is stored normalized), approval waits (a
    # new live state, so the partial index of the live rows is made again), and a heartbeat
    # for every orchestrator with live requests that has none: from now on every call beats,
    # so one that never calls again lapses one window after the migration, as if it beat then.
    4: (
        "ALTER TABLE requests ADD COLUMN runtime TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE requests ADD COLUMN approval INTEGER NOT NULL DEFAULT 0",
        "DROP INDEX requests_live",
        "CREATE INDEX requests_live ON requests (state) WHERE state IN ('queued', 'admitted', 'awaiting-approval')",
        """INSERT INTO orchestrators (id, beat_at, lapses_at, started_at)
            SELECT DISTINCT orchestrator, {now}, {lapses}, {now} FROM requests
            WHERE state IN ('queued', 'admitted') AND orchestrator NOT IN (SELECT id FROM orchestrators)""",
    ),
}
