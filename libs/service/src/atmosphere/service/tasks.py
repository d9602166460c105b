"""Stopping a task for sure.

On Python 3.11 a cancel that lands just as an inner `asyncio.wait_for` completes is swallowed
(nats-py's requests use one; so does code a task may call), and the task goes on: a caller that
cancels once and then awaits the task can wait forever. `stop_tasks` cancels until each ends.
"""

from __future__ import annotations

import asyncio
import contextlib

RECANCEL_EVERY = 0.5
"""Seconds between cancels of a task that did not end at the previous one."""


async def stop_tasks(*tasks: asyncio.Task[object]) -> None:
    """Cancel `tasks` until every one has ended; their results and errors are dropped."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_EVERY)
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            task.result()
