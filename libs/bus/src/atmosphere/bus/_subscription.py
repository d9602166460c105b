"""An in-process queue of decoded messages behind `Subscription`, shared by both backends."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import TypeVar

from google.protobuf.message import Message

from atmosphere.bus._api import Envelope, Subscription
from atmosphere.bus._codec import Headers, decode
from atmosphere.bus.errors import BusError

M = TypeVar("M", bound=Message)

log = logging.getLogger("atmosphere.bus")

_CLOSED = object()
_TICK = object()
"""Put by the receive timer: the reader's deadline may have passed."""


class QueueSubscription(Subscription[M]):
    """Decodes offered payloads and hands them to one `async for` reader, in order."""

    def __init__(self, message_type: type[M], *, limit: int = 65536) -> None:
        """Buffer at most `limit` messages; beyond that, messages are dropped and counted."""
        self._type = message_type
        self._queue: asyncio.Queue[Envelope[M] | object] = asyncio.Queue()
        self._limit = limit
        self.dropped = 0
        """Messages dropped because the reader fell `limit` messages behind."""
        self._deadline = 0.0
        self._waiting = False
        self._timer: asyncio.TimerHandle | None = None

    def offer(self, subject: str, data: bytes, wire_headers: Mapping[str, str] | None) -> None:
        """Decode and enqueue one message (never blocks)."""
        try:
            message = decode(data, wire_headers, self._type)
        except BusError as exc:
            log.warning("dropping undecodable message on %s: %s", subject, exc)
            return
        if self._queue.qsize() >= self._limit:
            self.dropped += 1
            return
        self._queue.put_nowait(Envelope(subject, message, Headers.from_wire(wire_headers)))

    def close(self) -> None:
        """End the iteration once the buffered messages are read."""
        self._queue.put_nowait(_CLOSED)

    async def receive(self, timeout: float) -> Envelope[M] | None:
        """The next message, or None when none arrived within `timeout` seconds.

        One lazy timer serves every call: a reader called per event (a run's follower) moves
        its deadline by an assignment, and the timer, when it fires early, re-arms itself for
        the deadline as it is now, instead of one timer armed and cancelled per message.

        Raises:
            StopAsyncIteration: the subscription was closed and every buffered message read.
        """
        item = self._queue.get_nowait() if not self._queue.empty() else _TICK  # under load: no timer at all
        if item is _TICK:  # nothing buffered (or only a tick a timed-out call left behind)
            item = await self._wait(timeout)
            if item is None:
                return None
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # later calls see the end too
            raise StopAsyncIteration
        assert isinstance(item, Envelope)
        return item

    async def _wait(self, timeout: float) -> object | None:
        """The next queued item, or None once `timeout` seconds have passed."""
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + timeout
        if self._timer is None or self._timer.when() > self._deadline:
            self._arm(loop)
        self._waiting = True
        try:
            while True:
                item = await self._queue.get()
                if item is not _TICK:
                    return item
                if loop.time() >= self._deadline:
                    return None
                self._arm(loop)  # a tick meant for an earlier deadline: wait on
        finally:
            self._waiting = False

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(self._deadline, self._on_timer, loop)

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        if not self._waiting:
            return  # nobody waits: the next `receive` arms it again
        if loop.time() >= self._deadline:
            self._queue.put_nowait(_TICK)
        else:
            self._arm(loop)

    async def __aiter__(self) -> AsyncIterator[Envelope[M]]:
        """Yield messages until `close()`."""
        while True:
            item = await self._queue.get()
            if item is _CLOSED:
                return
            if item is _TICK:
                continue  # left by a `receive` that timed out or was cancelled
            assert isinstance(item, Envelope)
            yield item
