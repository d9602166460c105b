"""`QueueSubscription.receive`: one lazy timer for a reader that waits with a timeout per message."""

from __future__ import annotations

import asyncio

import pytest

from atmosphere.bus._subscription import _TICK, QueueSubscription
from atmosphere.contracts.common.v1.common_pb2 import Error


def _offer(sub: QueueSubscription[Error], code: str) -> None:
    sub.offer("s", Error(code=code).SerializeToString(), None)


async def test_nothing_within_the_timeout_is_none() -> None:
    sub = QueueSubscription(Error)
    assert await sub.receive(0.01) is None
    _offer(sub, "late")
    received = await sub.receive(1.0)
    assert received is not None
    assert received.message.code == "late"


async def test_a_message_arriving_while_waiting_is_received() -> None:
    sub = QueueSubscription(Error)
    asyncio.get_running_loop().call_later(0.01, _offer, sub, "a")
    received = await sub.receive(30.0)
    assert received is not None
    assert received.message.code == "a"


async def test_an_earlier_deadline_is_kept_although_a_later_timer_is_armed() -> None:
    sub = QueueSubscription(Error)
    waiting = asyncio.ensure_future(sub.receive(30.0))
    await asyncio.sleep(0)
    _offer(sub, "first")
    assert (await waiting) is not None
    # The timer of the 30 s wait is still armed; a shorter wait must not wait for it.
    assert await asyncio.wait_for(sub.receive(0.02), 5.0) is None


async def test_a_reader_that_keeps_receiving_never_times_out_early() -> None:
    sub = QueueSubscription(Error)
    loop = asyncio.get_running_loop()
    codes = [str(i) for i in range(20)]
    for index, code in enumerate(codes):
        loop.call_later(0.005 * (index + 1), _offer, sub, code)
    got = []
    for _ in codes:
        received = await sub.receive(0.05)  # each wait is shorter than all twenty together
        assert received is not None
        got.append(received.message.code)
    assert got == codes


async def test_a_cancelled_receive_leaves_no_false_timeout_behind() -> None:
    sub = QueueSubscription(Error)
    waiting = asyncio.ensure_future(sub.receive(0.01))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.sleep(0.03)  # the old deadline passes with nobody waiting
    asyncio.get_running_loop().call_later(0.02, _offer, sub, "b")
    received = await sub.receive(5.0)
    assert received is not None
    assert received.message.code == "b"


async def test_a_tick_left_behind_is_skipped_by_receive_and_by_iteration() -> None:
    # A timer that fires in the same loop pass as a message arrives leaves its tick queued
    # behind the message: a later wait must not take it for its own timeout.
    sub = QueueSubscription(Error)
    sub._queue.put_nowait(_TICK)
    asyncio.get_running_loop().call_later(0.02, _offer, sub, "c")
    received = await sub.receive(5.0)
    assert received is not None
    assert received.message.code == "c"
    sub._queue.put_nowait(_TICK)
    _offer(sub, "d")
    sub.close()
    assert [envelope.message.code async for envelope in sub] == ["d"]


async def test_closed_and_drained_ends_every_later_receive() -> None:
    sub = QueueSubscription(Error)
    _offer(sub, "x")
    sub.close()
    assert await sub.receive(1.0) is not None
    for _ in range(2):
        with pytest.raises(StopAsyncIteration):
            await sub.receive(1.0)
