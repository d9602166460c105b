"""The memory store's one SQLite connection: whose users take turns, and its write transactions.

Every write is ONE `BEGIN IMMEDIATE … COMMIT` transaction, rolled back on any exception or
cancellation, so a crash never leaves half a turn or a half-applied compaction. Reads take
the same turn: on a shared connection a reader could otherwise see another coroutine's
uncommitted half-written turn. `BEGIN IMMEDIATE` also makes a second process writing the same
file wait for the lock (busy timeout) instead of failing on a read-to-write upgrade.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Self

import aiosqlite


class StoreConnection:
    """One open connection shared by the store's tables, used one operation at a time."""

    def __init__(self, db: aiosqlite.Connection, *, closing: contextlib.AsyncExitStack | None = None) -> None:
        """Use an open connection; `closing` closes it (None: `close` closes `db` itself)."""
        self._db = db
        self._lock = asyncio.Lock()
        self._closed = False
        self._closing = closing

    async def close(self) -> None:
        """Wait for the operation in progress, then close the database (idempotent)."""
        async with self._lock:
            if not self._closed:
                self._closed = True
                if self._closing is None:
                    await self._db.close()
                else:
                    await self._closing.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """One write transaction: committed if the body returns, rolled back otherwise."""
        async with self._lock:
            try:
                # Inside the try: a cancellation while BEGIN is queued must still roll back.
                await self._db.execute("BEGIN IMMEDIATE")
                yield self._db
            except BaseException:
                await self._db.rollback()
                raise
            await self._db.commit()
