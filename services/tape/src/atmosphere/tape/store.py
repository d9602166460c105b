"""The tape's SQLite store: opening it (schema and migration), its transactions, and its reads.

What is written, and how, belongs to the recorder (`recorder.py`) and to retention
(`retention.py`); both write inside `transaction()`, one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

import aiosqlite

from atmosphere.bus.runs import ANSWER_REWOUND_METADATA_KEY
from atmosphere.service.sqlite import open_sqlite
from atmosphere.tape.schema import migrate


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
    model: str = ""
    runtime: str = ""
    endpoint: str = ""
    dropped_steps: int = 0
    truncated: bool = False
    owner: str = ""
    """The user id of the principal that started the run ("" when anonymous or not known)."""


@dataclass(frozen=True, slots=True)
class RunFilter:
    """Which runs a list holds: every filter given must hold (empty or 0: not filtered)."""

    tape_id: str = ""
    status: str = ""
    owner: str = ""
    agent: str = ""
    started_after: int = 0
    """Epoch milliseconds, inclusive."""
    started_before: int = 0
    """Epoch milliseconds, exclusive."""


RUN_COLUMNS = (
    "run_id, COALESCE(tape_id, ''), COALESCE(session_id, ''), COALESCE(agent, ''), status, started_at,"
    " ended_at, step_count, COALESCE(parent_run_id, ''), COALESCE(model, ''), COALESCE(runtime, ''),"
    " COALESCE(endpoint, ''), dropped_steps, truncated, owner"
)
"""The `tape_run` columns a `RunRow` is made of, in its field order."""
_TRUNCATED = 13
"""`truncated`'s place in `RUN_COLUMNS` (stored as 0 or 1)."""


# Each query is made once from constants (no input is ever formatted into SQL).
_RUN_BY_ID = f"SELECT {RUN_COLUMNS} FROM tape_run WHERE run_id = ?"  # noqa: S608 - constants only
_RUNS = f"SELECT {RUN_COLUMNS} FROM tape_run"  # noqa: S608 - constants only
# One condition per filter given, so that SQLite plans each list with the index it can use
# (`(? = '' OR owner = ?)` would hide `idx_tape_run_owner_started` from the planner).
_RUN_CONDITIONS = {
    "tape_id": "tape_id = ?",
    "status": "status = ?",
    "owner": "owner = ?",
    "agent": "agent = ?",
    "started_after": "started_at >= ?",
    "started_before": "started_at < ?",
}
_CHILDREN = (
    f"SELECT {RUN_COLUMNS} FROM tape_run WHERE parent_run_id = ? AND (? = '' OR owner = ?)"  # noqa: S608 - constants only
    " ORDER BY started_at, run_id LIMIT ?"
)
_CHILD_COUNT = "SELECT COUNT(*) FROM tape_run WHERE parent_run_id = ? AND (? = '' OR owner = ?)"
REPLAYED_STEPS = (
    "SELECT run_id, seq, kind, payload, ts FROM tape_step WHERE run_id = ?"
    " AND (kind IN ('input', 'text', 'tool-start') OR (kind = 'metadata' AND json_extract(payload, '$.key') = ?))"
    " ORDER BY seq"
)
"""The steps a replay reads: inputs, text, tool starts, and a resumed answer's rewind marker."""


def replayed_steps_parameters(run_id: str) -> tuple[str, str]:
    """The parameters of `REPLAYED_STEPS` for `run_id`."""
    return run_id, ANSWER_REWOUND_METADATA_KEY


def run_row(row: Iterable[object]) -> RunRow:
    """A `RunRow` from a row selected with `RUN_COLUMNS`."""
    values = list(row)
    values[_TRUNCATED] = bool(values[_TRUNCATED])
    return RunRow(*values)  # type: ignore[arg-type]


def runs_query(where: RunFilter, limit: int) -> tuple[str, list[object]]:
    """The statement listing the runs `where` selects, newest first, and its parameters.

    Made of constants only (`_RUN_CONDITIONS`): the filters' values are parameters, never SQL.
    """
    conditions: list[str] = []
    parameters: list[object] = []
    for name, condition in _RUN_CONDITIONS.items():
        value = getattr(where, name)
        if value:
            conditions.append(condition)
            parameters.append(value)
    sql = _RUNS + (" WHERE " + " AND ".join(conditions) if conditions else "") + " ORDER BY started_at DESC LIMIT ?"
    return sql, [*parameters, limit]


class TapeStore:
    """Runs and their steps in one SQLite database."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        """Use an open, migrated connection (see `open`)."""
        self.db = db
        # One aiosqlite connection runs statements in order, but two coroutines could still
        # interleave their statements inside one transaction; writers take turns.
        self._write_lock = asyncio.Lock()

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, path: Path) -> AsyncIterator[TapeStore]:
        """Open (creating or migrating if needed) the database at `path`."""
        async with open_sqlite(path) as db:
            await migrate(db)
            yield cls(db)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """The connection, for one writer's statements: committed on exit, rolled back on error."""
        async with self._write_lock:
            try:
                yield self.db
            except BaseException:
                await self.db.rollback()
                raise
            await self.db.commit()

    async def run(self, run_id: str, *, owner: str = "") -> RunRow | None:
        """The run `run_id`, or None; with `owner`, None too unless the run is that owner's."""
        async with self.db.execute(_RUN_BY_ID, (run_id,)) as cursor:
            row = await cursor.fetchone()
        run = None if row is None else run_row(row)
        if run is None or (owner and run.owner != owner):
            return None
        return run

    async def steps(self, run_id: str, *, from_seq: int, limit: int) -> list[Step]:
        """Up to `limit` steps of `run_id` with seq >= `from_seq`, in order."""
        async with self.db.execute(
            "SELECT run_id, seq, kind, payload, ts FROM tape_step WHERE run_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
            (run_id, from_seq, limit),
        ) as cursor:
            rows = await cursor.fetchall()
        return [Step(*row) for row in rows]

    async def replayed_steps(self, run_id: str) -> list[Step]:
        """The steps of `run_id` that a replay reads (see `REPLAYED_STEPS`), in order."""
        async with self.db.execute(REPLAYED_STEPS, replayed_steps_parameters(run_id)) as cursor:
            rows = await cursor.fetchall()
        return [Step(*row) for row in rows]

    async def runs(self, where: RunFilter, *, limit: int) -> list[RunRow]:
        """Up to `limit` of the runs `where` selects, newest first."""
        sql, parameters = runs_query(where, limit)
        async with self.db.execute(sql, parameters) as cursor:
            rows = await cursor.fetchall()
        return [run_row(row) for row in rows]

    async def children(self, parent_run_id: str, *, limit: int, owner: str = "") -> tuple[list[RunRow], int]:
        """Up to `limit` runs started by `parent_run_id`, oldest first, and how many there are.

        With `owner`, only that owner's (the others are neither listed nor counted).
        """
        async with self.db.execute(_CHILDREN, (parent_run_id, owner, owner, limit)) as cursor:
            rows = [run_row(row) for row in await cursor.fetchall()]
        async with self.db.execute(_CHILD_COUNT, (parent_run_id, owner, owner)) as cursor:
            count = await cursor.fetchone()
        return rows, int(count[0]) if count else 0
