"""How much the tape keeps: at most `max_runs` runs, `max_bytes` payload bytes, runs `max_age` old.

Only ended runs are evicted (COMPLETED, ERROR, CANCELLED, ABANDONED), oldest first, with their
steps: an open run is still being recorded. The bounds are checked after every batch without a
scan: the run count and the payload bytes are kept as running totals (read once at start, then
moved by what each batch adds), and eviction runs only when a total is over its bound, inside
the batch's own transaction, so every committed state is within bounds. It then evicts down to
1% below the bound, so that a tape at its bound evicts once per hundredth of it, not per batch.
The age limit is enforced by the periodic sweep (`expire`).
"""

from __future__ import annotations

from dataclasses import dataclass

import aiosqlite

_CHUNK = 512
"""Runs looked at per eviction query."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """What the tape may hold; 0 for `max_bytes` or `max_age_ms` means no bound."""

    max_runs: int
    max_bytes: int = 0
    max_age_ms: int = 0


@dataclass(frozen=True, slots=True)
class Totals:
    """What the tape holds: runs, and payload bytes over all their steps."""

    runs: int = 0
    payload_bytes: int = 0

    def plus(self, runs: int, payload_bytes: int) -> Totals:
        """These totals moved by `runs` and `payload_bytes` (negative: removed)."""
        return Totals(self.runs + runs, self.payload_bytes + payload_bytes)


def _below(bound: int) -> int:
    """Where eviction stops once `bound` was passed."""
    return bound - bound // 100


async def delete_runs(db: aiosqlite.Connection, run_ids: list[str]) -> None:
    """Remove runs with their steps and gaps (inside the caller's transaction)."""
    rows = [(run_id,) for run_id in run_ids]
    await db.executemany("DELETE FROM tape_step WHERE run_id = ?", rows)
    await db.executemany("DELETE FROM tape_gap WHERE run_id = ?", rows)
    await db.executemany("DELETE FROM tape_run WHERE run_id = ?", rows)


class Retention:
    """The bounds, the running totals, and eviction."""

    def __init__(self, bounds: Bounds) -> None:
        """Keep the tape within `bounds`."""
        self.bounds = bounds
        self.totals = Totals()
        self.evicted = 0
        """Runs evicted since start."""

    async def load(self, db: aiosqlite.Connection) -> None:
        """Read the totals (once, at start)."""
        async with db.execute("SELECT COUNT(*), COALESCE(SUM(payload_bytes), 0) FROM tape_run") as cursor:
            row = await cursor.fetchone()
        self.totals = Totals(int(row[0]), int(row[1])) if row else Totals()

    def over(self, totals: Totals) -> bool:
        """Whether `totals` pass a bound."""
        bounds = self.bounds
        return totals.runs > bounds.max_runs or (bounds.max_bytes > 0 and totals.payload_bytes > bounds.max_bytes)

    async def enforce(self, db: aiosqlite.Connection, totals: Totals) -> Totals:
        """Evict inside the caller's transaction until `totals` are within bounds; the totals after."""
        if not self.over(totals):
            return totals
        runs_goal = _below(self.bounds.max_runs) if totals.runs > self.bounds.max_runs else totals.runs
        bytes_goal = _below(self.bounds.max_bytes) if self.bounds.max_bytes else totals.payload_bytes
        while totals.runs > runs_goal or totals.payload_bytes > bytes_goal:
            async with db.execute(
                "SELECT run_id, payload_bytes FROM tape_run WHERE status != 'OPEN' ORDER BY started_at LIMIT ?",
                (_CHUNK,),
            ) as cursor:
                candidates = [(str(r[0]), int(r[1])) for r in await cursor.fetchall()]
            chosen: list[str] = []
            for run_id, size in candidates:
                if totals.runs <= runs_goal and totals.payload_bytes <= bytes_goal:
                    break
                chosen.append(run_id)
                totals = totals.plus(-1, -size)
            if not chosen:
                break  # only open runs are left: they are kept whatever the bounds say
            await delete_runs(db, chosen)
            self.evicted += len(chosen)
        return totals

    async def expire(self, db: aiosqlite.Connection, totals: Totals, *, now_ms: int) -> Totals:
        """Evict ended runs older than `max_age` (inside the caller's transaction); the totals after."""
        if not self.bounds.max_age_ms:
            return totals
        while True:
            async with db.execute(
                "SELECT run_id, payload_bytes FROM tape_run WHERE status != 'OPEN' AND started_at < ?"
                " ORDER BY started_at LIMIT ?",
                (now_ms - self.bounds.max_age_ms, _CHUNK),
            ) as cursor:
                expired = [(str(r[0]), int(r[1])) for r in await cursor.fetchall()]
            if not expired:
                return totals
            await delete_runs(db, [run_id for run_id, _ in expired])
            self.evicted += len(expired)
            totals = totals.plus(-len(expired), -sum(size for _, size in expired))
