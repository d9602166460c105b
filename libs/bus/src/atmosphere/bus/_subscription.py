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


class QueueSubscription(Subscription[M]):
    """Decodes offered payloads and hands them to one `async for` reader, in order."""

    def __init__(self, message_type: type[M], *, limit: int = 65536) -> None:
        """Buffer at most `limit` messages; beyond that, messages are dropped and counted."""
        self._type = message_type
        self._queue: asyncio.Queue[Envelope[M] | object] = asyncio.Queue()
        self._limit = limit
        self.dropped = 0
        """Messages dropped because the reader fell `limit` messages behind."""

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

        Raises:
            StopAsyncIteration: the subscription was closed and every buffered message read.
        """
        if not self._queue.empty():
            item = self._queue.get_nowait()  # the common case under load: no timer to arm
        else:
            try:
                # `asyncio.timeout`, not `wait_for`: on 3.11 `wait_for` can swallow a
                # cancellation of the caller that arrives just as the queue yields an item.
                async with asyncio.timeout(timeout):
                    item = await self._queue.get()
            except TimeoutError:
                return None
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # later calls see the end too
            raise StopAsyncIteration
        assert isinstance(item, Envelope)
        return item

    async def __aiter__(self) -> AsyncIterator[Envelope[M]]:
        """Yield messages until `close()`."""
        while True:
            item = await self._queue.get()
            if item is _CLOSED:
                return
            assert isinstance(item, Envelope)
            yield item
