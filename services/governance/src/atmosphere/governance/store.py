"""The decision log: one row per admission and per tool-call check, in SQLite."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiosqlite

_SCHEMA = """
CREATE TABLE IF NOT EXISTS decision_log (
    decision_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    operation TEXT NOT NULL,
    subject TEXT NOT NULL,
    allowed INTEGER NOT NULL,
    policy TEXT NOT NULL,
    reason TEXT NOT NULL,
    principal TEXT NOT NULL,
    decided_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_decision_log_run ON decision_log (run_id, decided_at);
"""


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """One logged decision."""

    decision_id: str
    run_id: str
    operation: str
    subject: str
    allowed: bool
    policy: str
    reason: str
    principal: str
    decided_at: int
    """Epoch milliseconds."""


class DecisionLog:
    """Append-only storage of decisions."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        """Use an open connection (see `open`)."""
        self._db = db
        self._lock = asyncio.Lock()

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, path: Path) -> AsyncIterator[DecisionLog]:
        """Open (creating if needed) the log at `path`."""
        path.parent.mkdir(parents=True, exist_ok=True)
        async with aiosqlite.connect(path) as db:
            await db.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a committed decision survives a crash of this process; only an OS
            # crash can lose the last moments. An fsync per decision would sit on every run's path.
            await db.execute("PRAGMA synchronous=NORMAL")
            await db.executescript(_SCHEMA)
            await db.commit()
            yield cls(db)

    async def append(self, row: DecisionRow) -> None:
        """Store one decision (committed before the decision is answered)."""
        async with self._lock:
            await self._db.execute(
                "INSERT INTO decision_log VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.decision_id,
                    row.run_id,
                    row.operation,
                    row.subject,
                    int(row.allowed),
                    row.policy,
                    row.reason,
                    row.principal,
                    row.decided_at,
                ),
            )
            await self._db.commit()

    async def recent(self, *, run_id: str, limit: int) -> list[DecisionRow]:
        """Newest first, optionally for one run."""
        async with self._db.execute(
            "SELECT decision_id, run_id, operation, subject, allowed, policy, reason, principal, decided_at"
            " FROM decision_log WHERE (? = '' OR run_id = ?) ORDER BY decided_at DESC, rowid DESC LIMIT ?",
            (run_id, run_id, limit),
        ) as cursor:
            rows = await cursor.fetchall()
        return [DecisionRow(r[0], r[1], r[2], r[3], bool(r[4]), r[5], r[6], r[7], r[8]) for r in rows]
