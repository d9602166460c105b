"""`stop_tasks`: a task that swallows a cancel (as a 3.11 `wait_for` can) is cancelled again until it ends."""

from __future__ import annotations

import asyncio

import pytest

from atmosphere.service import tasks
from atmosphere.service.tasks import stop_tasks


async def test_a_task_that_swallows_the_first_cancel_is_stopped_by_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "RECANCEL_EVERY", 0.01)
    cancels = 0

    async def stubborn() -> None:
        nonlocal cancels
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancels += 1
                if cancels > 1:
                    raise  # the second cancel is heeded; the first was swallowed

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(stop_tasks(task), 10)
    assert task.cancelled()
    assert cancels == 2


async def test_ended_and_failed_tasks_are_fine_and_their_errors_dropped() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    done, failed, running = (asyncio.create_task(c) for c in (asyncio.sleep(0), fails(), asyncio.sleep(3600)))
    await asyncio.sleep(0.01)
    await stop_tasks(done, failed, running)
    assert done.done()
    assert isinstance(failed.exception(), RuntimeError)
    assert running.cancelled()
