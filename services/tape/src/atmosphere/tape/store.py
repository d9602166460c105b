"""The tape's SQLite store: one row per run, one row per recorded step.

The schema follows Atmosphere's `SqliteTapeStore`: epoch-millisecond timestamps, steps keyed
by (run_id, seq) so a redelivered event is stored once, each write one transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiosqlite

_SCHEMA = """
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
CREATE INDEX IF NOT EXISTS idx_tape_run_status_started ON tape_run (status, started_at);
"""


@dataclass(frozen=True, slots=True)
class Step:
    """One recorded step."""

    run_id: str
    seq: int
    kind: str
    payload: str
    ts: int


@dataclass(frozen=True, slots=True)
class RunRow:
    """One recorded run."""

    run_id: str
    tape_id: str
    session_id: str
    agent: str
    status: str
    started_at: int
    ended_at: int | None
    step_count: int
    parent_run_id: str


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What the recorder writes for one event."""

    step: Step
    tape_id: str
    session_id: str
    agent: str
    parent_run_id: str
    terminal_status: str | None
    """"COMPLETED" or "ERROR" when the step ends the run."""


class TapeStore:
    """Append-only storage of runs and their steps."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        """Use an open connection (see `open`)."""
        self._db = db
        # One aiosqlite connection runs statements in order, but two coroutines could still
        # interleave their statements inside one transaction; writes take turns.
        self._write_lock = asyncio.Lock()

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, path: Path) -> AsyncIterator[TapeStore]:
        """Open (creating if needed) the database at `path`."""
        path.parent.mkdir(parents=True, exist_ok=True)
        async with aiosqlite.connect(path) as db:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute("PRAGMA synchronous=NORMAL")
            await db.executescript(_SCHEMA)
            await db.commit()
            yield cls(db)

    async def record(self, record: StepRecord) -> None:
        """Store one step and update its run, in one transaction."""
        await self.record_many([record])

    async def record_many(self, records: list[StepRecord]) -> None:
        """Store steps in one transaction: a handful of statements per batch, not per step.

        A step already stored (same run and seq) is ignored. Each run's step count is recounted
        and its earliest timestamp kept; the lowest-seq terminal step sets the status, once.
        """
        if not records:
            return
        first_of_run: dict[str, StepRecord] = {}
        for record in records:
            first_of_run.setdefault(record.step.run_id, record)
        terminals = sorted((r for r in records if r.terminal_status), key=lambda r: r.step.seq)
        async with self._write_lock:
            try:
                await self._db.executemany(
                    "INSERT INTO tape_run (run_id, tape_id, session_id, agent, status, started_at, parent_run_id)"
                    " VALUES (?, ?, ?, ?, 'OPEN', ?, ?) ON CONFLICT (run_id) DO NOTHING",
                    [
                        (r.step.run_id, r.tape_id, r.session_id, r.agent, r.step.ts, r.parent_run_id)
                        for r in first_of_run.values()
                    ],
                )
                await self._db.executemany(
                    "INSERT OR IGNORE INTO tape_step (run_id, seq, kind, payload, ts) VALUES (?, ?, ?, ?, ?)",
                    [(r.step.run_id, r.step.seq, r.step.kind, r.step.payload, r.step.ts) for r in records],
                )
                await self._db.executemany(
                    "UPDATE tape_run SET step_count = (SELECT COUNT(*) FROM tape_step WHERE tape_step.run_id = ?),"
                    " started_at = MIN(started_at, (SELECT MIN(ts) FROM tape_step WHERE tape_step.run_id = ?))"
                    " WHERE run_id = ?",
                    [(run_id, run_id, run_id) for run_id in first_of_run],
                )
                # The first terminal wins: a run that already ended keeps its status.
                await self._db.executemany(
                    "UPDATE tape_run SET status = ?, ended_at = ? WHERE run_id = ? AND status = 'OPEN'",
                    [(r.terminal_status, r.step.ts, r.step.run_id) for r in terminals],
                )
            except BaseException:
                await self._db.rollback()
                raise
            await self._db.commit()

    async def run(self, run_id: str) -> RunRow | None:
        """The run `run_id`, or None."""
        async with self._db.execute(
            "SELECT run_id, tape_id, session_id, agent, status, started_at, ended_at, step_count,"
            " parent_run_id FROM tape_run WHERE run_id = ?",
            (run_id,),
        ) as cursor:
            row = await cursor.fetchone()
        return None if row is None else RunRow(*row)

    async def steps(self, run_id: str, *, from_seq: int, limit: int) -> list[Step]:
        """Up to `limit` steps of `run_id` with seq >= `from_seq`, in order."""
        async with self._db.execute(
            "SELECT run_id, seq, kind, payload, ts FROM tape_step WHERE run_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
            (run_id, from_seq, limit),
        ) as cursor:
            rows = await cursor.fetchall()
        return [Step(*row) for row in rows]

    async def runs(self, *, tape_id: str, status: str, limit: int) -> list[RunRow]:
        """Newest runs first, optionally filtered by tape id and status."""
        query = (
            "SELECT run_id, tape_id, session_id, agent, status, started_at, ended_at, step_count,"
            " parent_run_id FROM tape_run WHERE (? = '' OR tape_id = ?) AND (? = '' OR status = ?)"
            " ORDER BY started_at DESC LIMIT ?"
        )
        async with self._db.execute(query, (tape_id, tape_id, status, status, limit)) as cursor:
            rows = await cursor.fetchall()
        return [RunRow(*row) for row in rows]
