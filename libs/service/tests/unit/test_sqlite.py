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


async def rows(path: Path) -> list[tuple[int, ...]]:
    """What another connection reads: only what was committed."""
    async with aiosqlite.connect(path) as other, other.execute("SELECT x FROM t ORDER BY x") as cursor:
        return [tuple(row) for row in await cursor.fetchall()]


async def test_an_autocommit_write_is_committed_as_it_runs_and_begin_opens_a_transaction(tmp_path: Path) -> None:
    path = tmp_path / "data.db"
    async with open_sqlite(path, autocommit=True) as db:
        await db.execute("CREATE TABLE t (x INTEGER)")
        await db.execute("INSERT INTO t VALUES (1)")
        assert not db.in_transaction
        assert await rows(path) == [(1,)]  # no commit() was needed
        await db.execute("BEGIN")
        await db.execute("INSERT INTO t VALUES (2)")
        await db.execute("INSERT INTO t VALUES (3)")
        assert await rows(path) == [(1,)]  # the transaction's writes are not seen before its commit
        await db.commit()
        assert await rows(path) == [(1,), (2,), (3,)]


async def test_without_autocommit_a_write_waits_for_its_commit(tmp_path: Path) -> None:
    path = tmp_path / "data.db"
    async with open_sqlite(path) as db:
        await db.execute("CREATE TABLE t (x INTEGER)")
        await db.commit()
        await db.execute("INSERT INTO t VALUES (1)")
        assert db.in_transaction
        assert await rows(path) == []
        await db.commit()
        assert await rows(path) == [(1,)]
