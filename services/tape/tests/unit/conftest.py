"""A tape store in a fresh SQLite file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from atmosphere.tape.store import TapeStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[TapeStore]:
    """A tape store on a fresh database file."""
    async with TapeStore.open(tmp_path / "tape.db") as opened:
        yield opened
