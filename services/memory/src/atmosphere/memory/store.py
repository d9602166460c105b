"""The memory service's SQLite store: conversation history and long-term facts, in one file.

Opened as the tape and governance stores are (`atmosphere.service.sqlite.open_sqlite`: WAL with
synchronous=NORMAL, a committed write survives a crash of this process), one aiosqlite
connection whose users take turns, every write one transaction (`store_connection`). The
tables each have their class: the history's reads in pages (`history_pages`) and its writes
with compaction (`history_store`), the facts (`fact_store`); `MemoryStore` is all of them on
one connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import aiosqlite

from atmosphere.memory.fact_store import (
    DEFAULT_FACTS_RECALLED,
    MAX_FACT_CHARS,
    MAX_FACTS_PER_USER,
    LongTermFacts,
    bound_fact,
)
from atmosphere.memory.history_pages import MIN_PAGE_PIECE, HistoryPage, PageMessage, StalePageTokenError
from atmosphere.memory.history_store import (
    MAX_CONTENT_BYTES,
    SUMMARY_BACKSTOP_FACTOR,
    TRUNCATION_MARKER,
    ConversationHistory,
    bound_content,
)
from atmosphere.service.sqlite import open_sqlite

__all__ = [
    "DEFAULT_FACTS_RECALLED",
    "MAX_CONTENT_BYTES",
    "MAX_FACTS_PER_USER",
    "MAX_FACT_CHARS",
    "MIN_PAGE_PIECE",
    "SCHEMA_VERSION",
    "SUMMARY_BACKSTOP_FACTOR",
    "TRUNCATION_MARKER",
    "HistoryPage",
    "MemoryStore",
    "PageMessage",
    "StalePageTokenError",
    "bound_content",
    "bound_fact",
]

SCHEMA_VERSION: Final = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS conversation_message (
    agent TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    PRIMARY KEY (agent, conversation_id, seq)
);
CREATE TABLE IF NOT EXISTS applied_append (
    -- The `ATMO_MEMORY` sequence of the last turn appended (one row): a turn re-delivered after
    -- a crash between its commit and its acknowledgement is recognised and not appended twice.
    id INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS user_fact (
    user_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    fact TEXT NOT NULL,
    PRIMARY KEY (user_id, seq),
    UNIQUE (user_id, fact)
);
"""


async def _create_schema(db: aiosqlite.Connection, path: Path) -> None:
    """Create the tables (if missing) and check the file's schema version is one this service reads."""
    await db.executescript(_SCHEMA)
    await db.execute("BEGIN IMMEDIATE")
    async with db.execute("SELECT MAX(version) FROM schema_version") as cursor:
        row = await cursor.fetchone()
    version = None if row is None else row[0]
    if version is None:
        await db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
    elif version > SCHEMA_VERSION:
        msg = f"{path}: schema version {version} is newer than this service's {SCHEMA_VERSION}"
        raise RuntimeError(msg)
    await db.commit()


class _Opening:
    """What `MemoryStore.open` returns: await it, or use it as an async context manager."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._store: MemoryStore | None = None

    def __await__(self) -> Generator[Any, None, MemoryStore]:
        return MemoryStore.connect(self._path).__await__()

    async def __aenter__(self) -> MemoryStore:
        self._store = await MemoryStore.connect(self._path)
        return self._store

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._store is not None:
            await self._store.close()


class MemoryStore(ConversationHistory, LongTermFacts):
    """Conversation history per (agent, conversation id) and long-term facts per user id, in one file."""

    @classmethod
    def open(cls, path: Path | str) -> _Opening:
        """Open (creating if needed) the store at `path`.

        `store = await MemoryStore.open(path)` … `await store.close()`, or
        `async with MemoryStore.open(path) as store:`.
        """
        return _Opening(Path(path))

    @classmethod
    async def connect(cls, path: Path) -> MemoryStore:
        """Open the database (WAL, `open_sqlite`) and create or check the schema."""
        # The store outlives this call (`open` may be awaited, not entered): the connection's
        # context stays open on a stack that `close` unwinds.
        closing = contextlib.AsyncExitStack()
        try:
            db = await closing.enter_async_context(open_sqlite(path))
            await _create_schema(db, path)
        except BaseException:
            await closing.aclose()
            raise
        return cls(db, closing=closing)
