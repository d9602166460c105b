"""The decision log (one row per decision: admissions, tool calls, answers, screens) and the cost ledger, in SQLite.

The cost ledger holds each run's accounted cost once (keyed by run id), so tenants' spend survives a
restart of governance and a run's end reported twice is counted once.

With governance's log (`replication.py`) every row arrives through one apply per log entry: rows
are inserted once by decision id (a repeated apply changes nothing) and keep the log sequence and
what the stateful policies counted, from which a restarted replica rebuilds its counters; the
ends of runs and the kill switch are kept for the same reason.

Each row names the deciding policy (name, source, version, digest), the outcome, how long the
evaluation took, and the seed's context snapshot. Retention is bounded by rows and by age; the
oldest rows go first, checked at open and every `PRUNE_EVERY` appends (never on each one).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiosqlite

from atmosphere.service.sqlite import open_sqlite

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
CREATE INDEX IF NOT EXISTS idx_decision_log_time ON decision_log (decided_at);
CREATE TABLE IF NOT EXISTS cost_ledger (
    run_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    usd REAL NOT NULL,
    accounted_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_cost_ledger_time ON cost_ledger (accounted_at);
CREATE TABLE IF NOT EXISTS run_ends (
    run_id TEXT PRIMARY KEY,
    log_seq INTEGER NOT NULL,
    ended_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_run_ends_time ON run_ends (ended_at);
CREATE TABLE IF NOT EXISTS kill_switch (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    reason TEXT NOT NULL,
    operator TEXT NOT NULL,
    armed_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS policy_swaps (
    swap_name TEXT NOT NULL,
    yaml TEXT NOT NULL
);
"""
COST_WINDOW_DAYS = 30.0
"""How long a run's cost counts towards its tenant's spend (the cost ceiling's rolling window)."""
_ADDED_COLUMNS = (
    ("policy_source", "TEXT NOT NULL DEFAULT ''"),
    ("policy_version", "TEXT NOT NULL DEFAULT ''"),
    ("policy_digest", "TEXT NOT NULL DEFAULT ''"),
    ("outcome", "TEXT NOT NULL DEFAULT ''"),
    ("evaluation_ms", "REAL NOT NULL DEFAULT 0"),
    ("context_json", "TEXT NOT NULL DEFAULT '{}'"),
    ("log_seq", "INTEGER NOT NULL DEFAULT 0"),
    ("counts", "BLOB NOT NULL DEFAULT x''"),
)
"""Columns a log written before policy identities were recorded lacks; added in place at open."""
_COLUMNS = (
    "decision_id, run_id, operation, subject, allowed, policy, reason, principal, decided_at,"
    " policy_source, policy_version, policy_digest, outcome, evaluation_ms, context_json"
)
_STORED_COLUMNS = f"{_COLUMNS}, log_seq, counts"
DEFAULT_MAX_ROWS = 100_000
DEFAULT_MAX_AGE_DAYS = 30.0
PRUNE_EVERY = 500
"""Appends between two retention passes."""


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
    policy_source: str = ""
    policy_version: str = ""
    policy_digest: str = ""
    outcome: str = ""
    """`admit`, `transform`, `deny`, `prefer` or `error`."""
    evaluation_ms: float = 0.0
    context_json: str = "{}"
    """The context snapshot (a JSON object)."""


@dataclass(frozen=True, slots=True)
class CountedRow:
    """What a logged decision counted (a serialized `DecisionCounts`), to rebuild counters from."""

    log_seq: int
    run_id: str
    decided_at: int
    """Epoch milliseconds."""
    counts: bytes


@dataclass(frozen=True, slots=True)
class ArmedSwitch:
    """The kill switch as last armed (a disarmed switch has no row)."""

    reason: str
    operator: str
    armed_at: int
    """Epoch milliseconds."""


@dataclass(frozen=True, slots=True)
class Retention:
    """How much of the log is kept: at most `max_rows` rows, none older than `max_age_days`."""

    max_rows: int = DEFAULT_MAX_ROWS
    max_age_days: float = DEFAULT_MAX_AGE_DAYS


class DecisionLog:
    """Append-only storage of decisions, pruned to its retention."""

    def __init__(self, db: aiosqlite.Connection, retention: Retention | None = None) -> None:
        """Use an open connection (see `open`)."""
        self._db = db
        self._lock = asyncio.Lock()
        self.retention = retention or Retention()
        self._since_prune = 0

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, path: Path, retention: Retention | None = None) -> AsyncIterator[DecisionLog]:
        """Open (creating or upgrading if needed) the log at `path`."""
        # WAL + NORMAL (`open_sqlite`): a committed decision survives a crash of this process.
        # Autocommit: each write is one statement, committed as it runs — one call on the
        # database's thread instead of two on the path of every admission and every run's end.
        # A write of several statements opens its own transaction (`save_switch`); the upgrade's
        # columns are each added once, whatever stopped it midway.
        async with open_sqlite(path, autocommit=True) as db:
            await db.executescript(_SCHEMA)
            async with db.execute("PRAGMA table_info(decision_log)") as cursor:
                present = {row[1] for row in await cursor.fetchall()}
            for name, declaration in _ADDED_COLUMNS:
                if name not in present:
                    await db.execute(f"ALTER TABLE decision_log ADD COLUMN {name} {declaration}")
            log = cls(db, retention)
            await log.prune()
            yield log

    async def append(self, row: DecisionRow, *, log_seq: int = 0, counts: bytes = b"") -> bool:
        """Store one decision once (by its id); False when it was stored already (nothing changes).

        `log_seq` is the log entry it came from, `counts` what it counted (see `counted`).
        """
        async with self._lock:
            cursor = await self._db.execute(
                f"INSERT OR IGNORE INTO decision_log ({_STORED_COLUMNS})"  # noqa: S608 - constant columns
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                    row.policy_source,
                    row.policy_version,
                    row.policy_digest,
                    row.outcome,
                    row.evaluation_ms,
                    row.context_json,
                    log_seq,
                    counts,
                ),
            )
            stored = cursor.rowcount == 1
            self._since_prune += int(stored)
            due = self._since_prune >= PRUNE_EVERY
        if due:
            await self.prune()
        return stored

    async def prune(self) -> int:
        """Remove what the retention no longer keeps; how many rows went."""
        cutoff = int((time.time() - self.retention.max_age_days * 86_400) * 1000)
        async with self._lock:
            self._since_prune = 0
            aged = await self._db.execute("DELETE FROM decision_log WHERE decided_at < ?", (cutoff,))
            # Beyond the row bound: the oldest go (by time, then insertion order).
            extra = await self._db.execute(
                "DELETE FROM decision_log WHERE rowid IN (SELECT rowid FROM decision_log"
                " ORDER BY decided_at DESC, rowid DESC LIMIT -1 OFFSET ?)",
                (self.retention.max_rows,),
            )
            spent = int((time.time() - COST_WINDOW_DAYS * 86_400) * 1000)
            await self._db.execute("DELETE FROM cost_ledger WHERE accounted_at < ?", (spent,))
            await self._db.execute("DELETE FROM run_ends WHERE ended_at < ?", (cutoff,))
            return max(aged.rowcount, 0) + max(extra.rowcount, 0)

    async def record_cost(self, run_id: str, tenant: str, usd: float, *, at_ms: int) -> bool:
        """Note what run `run_id` cost its tenant; False when it was already noted (nothing changes)."""
        async with self._lock:
            cursor = await self._db.execute(
                "INSERT OR IGNORE INTO cost_ledger VALUES (?, ?, ?, ?)", (run_id, tenant, usd, at_ms)
            )
            return cursor.rowcount == 1

    async def record_end(self, run_id: str, *, log_seq: int, at_ms: int) -> None:
        """Note that run `run_id` ended (the newest end wins), so a rebuild holds no slot for it."""
        async with self._lock:
            await self._db.execute(
                "INSERT INTO run_ends VALUES (?, ?, ?) ON CONFLICT (run_id)"
                " DO UPDATE SET log_seq = excluded.log_seq, ended_at = excluded.ended_at",
                (run_id, log_seq, at_ms),
            )

    async def run_ends(self) -> dict[str, int]:
        """Each ended run's log sequence (of its newest end)."""
        async with self._db.execute("SELECT run_id, log_seq FROM run_ends") as cursor:
            rows = await cursor.fetchall()
        return {str(run_id): int(seq) for run_id, seq in rows}

    async def counted(self) -> list[CountedRow]:
        """The decisions that counted something, in log order (oldest first)."""
        async with self._db.execute(
            "SELECT log_seq, run_id, decided_at, counts FROM decision_log WHERE length(counts) > 0"
            " ORDER BY log_seq, rowid"
        ) as cursor:
            rows = await cursor.fetchall()
        return [CountedRow(int(seq), str(run_id), int(at), bytes(counts)) for seq, run_id, at, counts in rows]

    async def save_switch(self, armed: ArmedSwitch | None) -> None:
        """Keep the kill switch's state (None: disarmed)."""
        async with self._lock:
            await self._db.execute("BEGIN")  # the old state goes only with the new one in place
            try:
                await self._db.execute("DELETE FROM kill_switch")
                if armed is not None:
                    await self._db.execute(
                        "INSERT INTO kill_switch VALUES (1, ?, ?, ?)", (armed.reason, armed.operator, armed.armed_at)
                    )
            except BaseException:
                # Left open, the transaction would hold every later write uncommitted (autocommit
                # commits nothing inside one): the old state stays, and the writes go on committing.
                await self._db.rollback()
                raise
            await self._db.commit()

    async def switch(self) -> ArmedSwitch | None:
        """The kill switch as kept (None: disarmed)."""
        async with self._db.execute("SELECT reason, operator, armed_at FROM kill_switch") as cursor:
            row = await cursor.fetchone()
        return ArmedSwitch(str(row[0]), str(row[1]), int(row[2])) if row else None

    async def save_swap(self, *, swap_name: str, text: str) -> None:
        """Keep a policy swap, re-applied over the files at the next start; no name: forget every swap."""
        async with self._lock:
            if swap_name:
                await self._db.execute("INSERT INTO policy_swaps VALUES (?, ?)", (swap_name, text))
            else:
                await self._db.execute("DELETE FROM policy_swaps")

    async def swaps(self) -> list[tuple[str, str]]:
        """The kept swaps (name, YAML), in the order they were made."""
        async with self._db.execute("SELECT swap_name, yaml FROM policy_swaps ORDER BY rowid") as cursor:
            rows = await cursor.fetchall()
        return [(str(name), str(text)) for name, text in rows]

    async def spend_since(self, cutoff_ms: int) -> dict[str, float]:
        """Each tenant's accounted spend since `cutoff_ms` (epoch milliseconds)."""
        async with self._db.execute(
            "SELECT tenant, SUM(usd) FROM cost_ledger WHERE accounted_at >= ? GROUP BY tenant", (cutoff_ms,)
        ) as cursor:
            rows = await cursor.fetchall()
        return {str(tenant): float(usd) for tenant, usd in rows}

    async def count(self) -> int:
        """Rows held."""
        async with self._db.execute("SELECT COUNT(*) FROM decision_log") as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def recent(self, *, run_id: str, limit: int) -> list[DecisionRow]:
        """Newest first, optionally for one run."""
        async with self._db.execute(
            f"SELECT {_COLUMNS} FROM decision_log WHERE (? = '' OR run_id = ?)"  # noqa: S608 - constant columns
            " ORDER BY decided_at DESC, rowid DESC LIMIT ?",
            (run_id, run_id, limit),
        ) as cursor:
            rows = await cursor.fetchall()
        return [
            DecisionRow(
                r[0],
                r[1],
                r[2],
                r[3],
                bool(r[4]),
                r[5],
                r[6],
                r[7],
                r[8],
                r[9],
                r[10],
                r[11],
                r[12],
                float(r[13]),
                r[14],
            )
            for r in rows
        ]
