"""Opening a service's SQLite store: the one way governance, memory and the tape open theirs.

Every store is one file on the service's volume, opened by one aiosqlite connection whose users
take turns. WAL with `synchronous=NORMAL`: a committed write survives a crash of the process
(only an OS crash can lose its last moments), readers do not wait for a writer, and no write
pays an fsync, which would sit on every run's path. A second process writing the same file
waits for the lock up to aiosqlite's busy timeout (5 seconds) instead of failing.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiosqlite


@contextlib.asynccontextmanager
async def open_sqlite(path: Path, *, autocommit: bool = False) -> AsyncIterator[aiosqlite.Connection]:
    """The database at `path` (created, with its directory, if missing), in WAL mode; closed on exit.

    The store creates or migrates its own schema on the connection. `autocommit`: each statement
    commits as it runs, unless a transaction was opened with `BEGIN` (then `commit()` ends it) —
    for a store whose writes are single statements, one call on the database's thread each
    instead of two (the statement, then `commit()`).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # sqlite3's own default (""): a transaction opens implicitly before a write, until commit().
    async with aiosqlite.connect(path, isolation_level=None if autocommit else "") as db:
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute("PRAGMA synchronous=NORMAL")
        yield db
