"""A replica's position file: written at once when quiet, at most once an interval under load, and on flush."""

from __future__ import annotations

import asyncio
from pathlib import Path

from atmosphere.service.replica import ReplicaPosition
from atmosphere.testing import wait_until


def on_disk(data: Path) -> int:
    return int((data / "memory.applied").read_text())


async def test_a_save_after_a_quiet_spell_is_written_at_once(tmp_path: Path) -> None:
    position = ReplicaPosition(tmp_path, "memory", save_interval=60)
    position.save(7)
    assert on_disk(tmp_path) == 7
    assert ReplicaPosition(tmp_path, "memory").load() == 7


async def test_saves_within_the_interval_are_written_once_by_the_timer(tmp_path: Path) -> None:
    position = ReplicaPosition(tmp_path, "memory", save_interval=0.05)
    position.save(1)
    for seq in range(2, 50):
        position.save(seq)
    assert on_disk(tmp_path) == 1  # not a write per batch

    async def written() -> bool:
        return on_disk(tmp_path) == 49

    await wait_until(written, timeout=5, interval=0.01, what="the timer's write")
    position.flush()  # nothing left to write, no timer left behind
    assert on_disk(tmp_path) == 49


async def test_flush_writes_what_is_applied_and_stops_the_timer(tmp_path: Path) -> None:
    position = ReplicaPosition(tmp_path, "memory", save_interval=60)
    position.save(3)
    position.save(9)
    assert on_disk(tmp_path) == 3
    position.flush()
    assert on_disk(tmp_path) == 9
    position.save(10)  # the timer was stopped: a save after the flush is written at once
    assert on_disk(tmp_path) == 10
    position.flush()


def test_without_a_loop_every_save_is_written(tmp_path: Path) -> None:
    position = ReplicaPosition(tmp_path, "memory", save_interval=60)
    position.save(1)
    position.save(2)
    assert on_disk(tmp_path) == 2


async def test_in_memory_a_position_is_only_remembered(tmp_path: Path) -> None:
    position = ReplicaPosition(None, "memory", save_interval=0.01)
    position.save(5)
    await asyncio.sleep(0.02)
    assert position.load() == 5
    assert list(tmp_path.iterdir()) == []
