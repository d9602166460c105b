"""The periodic sweep: open runs that went quiet become ABANDONED, ended runs past `max_age` go.

A run is abandoned when the tape has heard nothing of it for `idle_timeout` (by the tape's own
clock, at recording: a worker's clock does not matter). It is a guess, not a terminal the run
sent: the run's next event reopens it (a tape that was down sees old runs idle until it has
caught up with the stream).
"""

from __future__ import annotations

from dataclasses import dataclass

from atmosphere.tape import metrics
from atmosphere.tape.retention import Retention
from atmosphere.tape.store import TapeStore


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one sweep did."""

    abandoned: int
    expired: int


async def sweep(store: TapeStore, retention: Retention, *, idle_timeout_ms: int, now_ms: int) -> SweepResult:
    """Mark idle open runs ABANDONED and evict ended runs past the age limit, in one transaction."""
    async with store.transaction() as db:
        evicted_before = retention.evicted
        cursor = await db.execute(
            "UPDATE tape_run SET status = 'ABANDONED', ended_at = ? WHERE status = 'OPEN' AND touched_at < ?",
            (now_ms, now_ms - idle_timeout_ms),
        )
        abandoned = cursor.rowcount
        await cursor.close()
        totals = await retention.expire(db, retention.totals, now_ms=now_ms)
        totals = await retention.enforce(db, totals)
    retention.totals = totals
    result = SweepResult(abandoned=max(0, abandoned), expired=retention.evicted - evicted_before)
    metrics.RUNS_SWEPT.labels("abandoned").inc(result.abandoned)
    metrics.RUNS_SWEPT.labels("expired").inc(result.expired)
    return result
