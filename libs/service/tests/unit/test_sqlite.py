"""`open_sqlite`: the directory made, WAL and synchronous=NORMAL set, the connection closed on exit."""

from __future__ import annotations

from pathlib import Path

import aiosqlite
import pytest

from atmosphere.service.sqlite import open_sqlite


async def pragma(db: aiosqlite.Connection, name: str) -> object:
    async with db.execute(f"PRAGMA {name}") as cursor:
        row = await cursor.fetchone()
    assert row is not None
    return row[0]


async def test_a_new_database_is_made_in_wal_mode_with_its_directory(tmp_path: Path) -> None:
    path = tmp_path / "volume" / "store" / "data.db"
    async with open_sqlite(path) as db:
        journal = await pragma(db, "journal_mode")
        synchronous = await pragma(db, "synchronous")
        await db.execute("CREATE TABLE t (x INTEGER)")
        await db.execute("INSERT INTO t VALUES (1)")
        await db.commit()
    assert (journal, synchronous) == ("wal", 1)  # 1: NORMAL
    assert path.is_file()


async def test_what_was_committed_is_there_when_opened_again(tmp_path: Path) -> None:
    path = tmp_path / "data.db"
    async with open_sqlite(path) as db:
        await db.execute("CREATE TABLE t (x INTEGER)")
        await db.execute("INSERT INTO t VALUES (7)")
        await db.commit()
    async with open_sqlite(path) as db, db.execute("SELECT x FROM t") as cursor:
        assert await cursor.fetchall() == [(7,)]


async def test_the_connection_is_closed_on_exit_also_after_an_error(tmp_path: Path) -> None:
    opened: list[aiosqlite.Connection] = []

    async def fail_inside() -> None:
        async with open_sqlite(tmp_path / "data.db") as db:
            opened.append(db)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await fail_inside()
    with pytest.raises(ValueError, match="no active connection"):
        await opened[0].execute("SELECT 1")
