"""The tape's SQLite schema, and bringing a database made by an older tape up to it.

It follows Atmosphere's `SqliteTapeStore` (`tape_run`, `tape_step`, epoch-millisecond
timestamps, steps keyed by (run_id, seq)) plus what recording from a stream needs: per run the
last event seq seen (a redelivered event is recognised), the seq of the text step still being
coalesced, the payload bytes it holds (retention), when the tape last heard of it (the idle
sweep); and `tape_gap`, the seqs a run's stream skipped that may still arrive late.

A database made by an older tape lacks some columns: `migrate` adds each one missing
(`ALTER TABLE ... ADD COLUMN`) and fills it in from the steps already stored, once. `owner`
cannot be: steps do not store it, so a run recorded before it existed stays ownerless (`''`)
until an event of it names its owner, and with auth on an ownerless run is nobody's.
"""

from __future__ import annotations

import aiosqlite

_TABLES = """
CREATE TABLE IF NOT EXISTS tape_run (
    run_id TEXT PRIMARY KEY,
    tape_id TEXT,
    session_id TEXT,
    agent TEXT,
    status TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    ended_at INTEGER,
    step_count INTEGER NOT NULL DEFAULT 0,
    parent_run_id TEXT
);
CREATE TABLE IF NOT EXISTS tape_step (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    ts INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS tape_gap (
    run_id TEXT NOT NULL,
    from_seq INTEGER NOT NULL,
    to_seq INTEGER NOT NULL,
    PRIMARY KEY (run_id, from_seq)
);
"""

RUN_COLUMNS: dict[str, str] = {
    "model": "TEXT",
    "runtime": "TEXT",
    "endpoint": "TEXT",
    "dropped_steps": "INTEGER NOT NULL DEFAULT 0",
    "truncated": "INTEGER NOT NULL DEFAULT 0",
    "last_event_seq": "INTEGER NOT NULL DEFAULT 0",
    "open_seq": "INTEGER NOT NULL DEFAULT 0",
    "round_seq": "INTEGER NOT NULL DEFAULT 0",
    "terminal_seq": "INTEGER NOT NULL DEFAULT 0",
    "payload_bytes": "INTEGER NOT NULL DEFAULT 0",
    "touched_at": "INTEGER NOT NULL DEFAULT 0",
    "owner": "TEXT NOT NULL DEFAULT ''",
}
"""Columns of `tape_run` added after the first schema, with their declarations."""

_INDEXES = """
CREATE INDEX IF NOT EXISTS idx_tape_run_status_started ON tape_run (status, started_at);
CREATE INDEX IF NOT EXISTS idx_tape_run_ended_started ON tape_run (started_at) WHERE status != 'OPEN';
CREATE INDEX IF NOT EXISTS idx_tape_run_parent ON tape_run (parent_run_id, started_at);
CREATE INDEX IF NOT EXISTS idx_tape_run_owner_started ON tape_run (owner, started_at);
"""
# `idx_tape_run_owner_started` serves a user's own runs, newest first (`TapeStore.runs` with an owner).

# Runs recorded before these columns existed: every stored seq counts as seen, the first
# terminal step is the terminal, the payload bytes are what the steps hold.
_BACKFILL = """
UPDATE tape_run SET
    last_event_seq = COALESCE((SELECT MAX(seq) FROM tape_step s WHERE s.run_id = tape_run.run_id), 0),
    terminal_seq = COALESCE((SELECT MIN(seq) FROM tape_step s WHERE s.run_id = tape_run.run_id
                             AND s.kind IN ('complete', 'error')), 0),
    payload_bytes = COALESCE((SELECT SUM(LENGTH(CAST(payload AS BLOB))) FROM tape_step s
                              WHERE s.run_id = tape_run.run_id), 0),
    touched_at = COALESCE(ended_at, started_at)
"""


async def _columns(db: aiosqlite.Connection, table: str) -> set[str]:
    async with db.execute(f"PRAGMA table_info({table})") as cursor:
        return {str(row[1]) for row in await cursor.fetchall()}


async def migrate(db: aiosqlite.Connection) -> list[str]:
    """Create what is missing (tables, columns, indexes); the columns it added, in order."""
    await db.executescript(_TABLES)
    present = await _columns(db, "tape_run")
    added = [name for name in RUN_COLUMNS if name not in present]
    for name in added:
        await db.execute(f"ALTER TABLE tape_run ADD COLUMN {name} {RUN_COLUMNS[name]}")
    if "last_event_seq" in added:
        await db.execute(_BACKFILL)
    await db.executescript(_INDEXES)
    await db.commit()
    return added
