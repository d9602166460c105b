"""Streams that stay open honestly: keep-alives while a run is quiet, an early end when ingress drains.

A run may be silent for minutes (a long tool call, an approval wait); proxies cut a stream that
sends nothing for a while, so a quiet SSE stream gets a comment now and then. When ingress
stops (SIGTERM), every open stream ends at once with word of where to resume, instead of
holding the process past Kubernetes' grace.

Two shapes, one per kind of reader:

- `PacedResponse`, for SSE: the body is sent by the response's own task exactly as a plain
  `StreamingResponse` sends it (no hop between tasks per event: this is every token's path);
  a second task per stream wakes once per keep-alive interval, or on drain, and writes between
  two events under a lock.
- `paced`, for a reader that pulls (a long-poll): the source is read by a task of its own
  through a one-item queue, so the reader can wait with a timeout without cancelling the source.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, cast

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Send

from atmosphere.service.tasks import stop_tasks

T = TypeVar("T")

log = logging.getLogger("atmosphere.ingress")

KEEP_ALIVE_COMMENT = b": keep-alive\n\n"
"""An SSE comment: every client ignores it, every proxy sees bytes flow."""
CLOSE_TIMEOUT = 5.0
"""Seconds a finished stream's source gets to close (unsubscribe) before it is left to the collector."""


class Pause(enum.Enum):
    """What `paced` yields instead of an item."""

    DRAINING = "draining"
    """Ingress is stopping: the stream ends here (always the last item)."""


class Drainable(Protocol):
    """An open WebSocket connection that can be told to resume elsewhere."""

    def drain(self) -> None:
        """Close with 1012, naming the runs to resume."""


@dataclass
class Drain:
    """Whether ingress is stopping, and the open connections to tell when it does."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    _sockets: dict[int, Drainable] = field(default_factory=dict)
    """By identity: a connection is a dataclass, equal to another with the same fields."""

    @property
    def draining(self) -> bool:
        """Whether ingress has begun to stop."""
        return self.event.is_set()

    def start(self) -> None:
        """Begin draining: every open connection and stream is told to resume elsewhere."""
        if self.draining:
            return
        log.info("ingress draining: %d WebSocket connection(s) told to resume elsewhere", len(self._sockets))
        self.event.set()
        for socket in list(self._sockets.values()):
            socket.drain()

    @contextlib.contextmanager
    def tracking(self, socket: Drainable) -> Iterator[None]:
        """Keep `socket` informed while it is open (one that opens while draining is told at once)."""
        self._sockets[id(socket)] = socket
        try:
            if self.draining:
                socket.drain()
            yield
        finally:
            del self._sockets[id(socket)]


class PacedResponse(StreamingResponse):
    """An SSE response with keep-alive comments while it is quiet and last words when ingress drains.

    `last_words()` gives the bytes that end a drained stream (it may act first, e.g. cancel a
    run nobody can resume); the body is closed after them. `on_close()` runs once the stream
    is over, however it ended, even when the client left before the body's first chunk (the
    body's own `finally` never runs then).
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        keep_alive: float | None,
        draining: asyncio.Event,
        last_words: Callable[[], Awaitable[bytes]],
        on_close: Callable[[], Awaitable[None]] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Stream `content`; a comment after each `keep_alive` seconds without bytes (None: never)."""
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._content = content
        self._on_close = on_close
        self._keep_alive = keep_alive
        self._draining = draining
        self._last_words = last_words
        self._lock = asyncio.Lock()
        self._last_sent = 0.0
        self._ended = False

    async def stream_response(self, send: Send) -> None:
        """Send the head, then every chunk, with the pacer writing between chunks."""
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        self._last_sent = time.monotonic()
        body = anyio.CancelScope()
        pacer = asyncio.create_task(self._pace(send, body))
        try:
            with body:
                async for chunk in self._content:
                    async with self._lock:
                        if self._ended:
                            break
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    self._last_sent = time.monotonic()
        finally:
            pacer.cancel()
            with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):  # also when the client went away
                await asyncio.gather(pacer, return_exceptions=True)
                if isinstance(self._content, AsyncGenerator):
                    with contextlib.suppress(Exception):
                        await self._content.aclose()
                if self._on_close is not None:
                    await self._on_close()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pace(self, send: Send, body: anyio.CancelScope) -> None:
        while True:
            quiet = None if self._keep_alive is None else self._last_sent + self._keep_alive - time.monotonic()
            if quiet is None or quiet > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(quiet):
                        await self._draining.wait()
            async with self._lock:
                if self._draining.is_set():
                    self._ended = True
                    words = await self._last_words()
                    await send({"type": "http.response.body", "body": words, "more_body": True})
                    body.cancel()
                    return
                if self._keep_alive is not None and time.monotonic() - self._last_sent >= self._keep_alive:
                    await send({"type": "http.response.body", "body": KEEP_ALIVE_COMMENT, "more_body": True})
                    self._last_sent = time.monotonic()


@dataclass
class _Failed:
    error: Exception


_END = object()


async def paced(source: AsyncIterator[T], *, draining: asyncio.Event) -> AsyncGenerator[T | Pause, None]:
    """Yield `source`'s items until it ends, or `Pause.DRAINING` (the last item) once ingress drains.

    `source` is read by a task of its own through a one-item queue, so a slow reader still
    holds it back (nothing is read ahead without bound), while a reader's wait with a timeout
    never cancels the source (cancelling a wait inside it would break it). Closing this stream
    closes `source`.
    """
    queue: asyncio.Queue[object] = asyncio.Queue(1)
    reader = asyncio.create_task(_read_into(source, queue))
    watcher = asyncio.create_task(_wake_on_drain(queue, draining))
    try:
        while True:
            item = await queue.get()
            if draining.is_set():
                yield Pause.DRAINING
                return
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield cast("T", item)  # the sentinels are handled above
    finally:
        # Cancelled until they end: a reader whose cancel a 3.11 `wait_for` in `source` swallowed
        # would block on the full queue, and this stream (a long poll's answer) would never close.
        await stop_tasks(watcher, reader)
        if isinstance(source, AsyncGenerator):
            with contextlib.suppress(Exception):
                await source.aclose()


async def _read_into(source: AsyncIterator[T], queue: asyncio.Queue[object]) -> None:
    try:
        async for item in source:
            await queue.put(item)
    except Exception as exc:  # handed to the reader, who raises it where it reads
        await queue.put(_Failed(exc))
        return
    await queue.put(_END)


async def _wake_on_drain(queue: asyncio.Queue[object], draining: asyncio.Event) -> None:
    await draining.wait()
    # A full queue means the reader is not waiting: it checks `draining` at its next item.
    if not queue.full():
        queue.put_nowait(Pause.DRAINING)
