"""`Mailbox` and `Flag`: the queue and event an open WebSocket holds, without their empty deques."""

from __future__ import annotations

import asyncio
import sys
from collections import deque

import pytest

from atmosphere.ingress.mailbox import Flag, Mailbox


async def test_items_come_out_in_order_and_a_waiting_reader_wakes() -> None:
    box: Mailbox[int] = Mailbox()
    box.put_nowait(1)
    box.put_nowait(2)
    assert (box.qsize(), box.empty()) == (2, False)
    assert [await box.get(), await box.get()] == [1, 2]
    assert box.empty()

    reader = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    assert not reader.done()
    box.put_nowait(3)
    assert await asyncio.wait_for(reader, 5) == 3


async def test_a_cancelled_reader_loses_nothing_and_the_next_one_reads() -> None:
    box: Mailbox[str] = Mailbox()
    reader = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    box.put_nowait("kept")  # wakes the reader, which is cancelled before it runs
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert await asyncio.wait_for(box.get(), 5) == "kept"


async def test_a_second_reader_at_once_is_a_bug_said_plainly() -> None:
    box: Mailbox[int] = Mailbox()
    first = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="one reader at a time"):
        await box.get()
    box.put_nowait(1)
    assert await first == 1


async def test_clear_drops_what_waits() -> None:
    box: Mailbox[int] = Mailbox()
    for item in range(3):
        box.put_nowait(item)
    box.clear()
    assert box.empty()
    box.put_nowait(9)
    assert await box.get() == 9


def test_an_empty_one_is_smaller_than_what_it_replaces() -> None:
    # The point of both: asyncio's allocate a deque each (760 bytes empty) up front.
    assert sys.getsizeof(Mailbox()._items) < sys.getsizeof(deque()) / 5
    assert Flag()._waiters is None


async def test_a_flag_wakes_every_waiter_when_set_and_waits_again_once_cleared() -> None:
    flag = Flag()
    waiters = [asyncio.create_task(flag.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    flag.set()
    assert await asyncio.wait_for(asyncio.gather(*waiters), 5) == [True, True, True]
    assert await flag.wait()  # set: at once

    flag.clear()
    assert not flag.is_set()
    again = asyncio.create_task(flag.wait())
    await asyncio.sleep(0)
    assert not again.done()
    flag.set()
    assert await asyncio.wait_for(again, 5)


async def test_a_cancelled_flag_waiter_is_forgotten() -> None:
    flag = Flag()
    waiter = asyncio.create_task(flag.wait())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not flag._waiters
    flag.set()
    assert Flag(value=True).is_set()
