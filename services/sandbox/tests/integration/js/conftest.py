"""`eval` test support: small limits, real worker processes, and a check that none is left behind."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from atmosphere.sandbox.js.pool import EvalPool
from atmosphere.sandbox.js.settings import MIB, EvalSettings

TIMEOUT_MS = 1000
HEAP_BYTES = 32 * MIB
OUTPUT_CHARS = 200
SMALL = EvalSettings(enabled=True, timeoutMillis=TIMEOUT_MS, maxMemoryBytes=HEAP_BYTES, maxOutputChars=OUTPUT_CHARS)
"""Limits small enough for the bad cases to end quickly."""


def running(pid: int) -> bool:
    """A process with this id exists, a zombie included (it was not reaped)."""
    return Path(f"/proc/{pid}").exists()


def children() -> set[int]:
    """The ids of this test process's child processes."""
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread (asyncio's child watchers) that just ended
            found.update(int(pid) for pid in (task / "children").read_text().split())
    return found


async def closed_without_leftovers(pool: EvalPool) -> None:
    """Close `pool`, then check that no worker it ever ran is still there."""
    pids = set(pool.worker_pids())
    await pool.close()
    assert pool.worker_pids() == []
    assert not {pid for pid in pids if running(pid)}
    assert not pids & children()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared_pool() -> AsyncIterator[EvalPool]:
    """One started pool for a whole module (its tests run on the module's loop)."""
    pool = EvalPool(SMALL)
    assert await pool.start() == "ACTIVE(mini-racer)"
    yield pool
    await closed_without_leftovers(pool)


@pytest_asyncio.fixture
async def pool() -> AsyncIterator[EvalPool]:
    """A started pool of its own for one test."""
    pool = EvalPool(SMALL)
    assert await pool.start() == "ACTIVE(mini-racer)"
    yield pool
    await closed_without_leftovers(pool)


def rss_kib(pid: int) -> int:
    """`VmRSS` of `pid`, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def environment_of(pid: int) -> dict[str, str]:
    """The environment `pid` was started with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in os.fsdecode(raw).split("\0") if "=" in entry)
