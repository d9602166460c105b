"""Reading a subject's stored messages by JetStream's batched direct get: no consumer at all.

A replay used to be an ordered consumer, and nats-server refuses more than 1,000 consumers on a
stream (`max consumers`, error 10026; each ordered consumer lingers seconds after use), so a
thousand clients resuming at once could stop every other follower. A direct get is a plain
request to the stream (`$JS.API.DIRECT.GET.<stream>`, the stream needs `allow_direct`): the
server answers `{"seq", "next_by_subj", "batch", "max_bytes"}` with up to `batch` stored
messages (headers `Nats-Sequence`, `Nats-Num-Pending`, ...) and then one status message,
`204 EOB` with `Nats-Num-Pending` (matching messages after the batch); `404` when nothing is
stored at or after `seq`. Nothing is created on the server, so nothing needs releasing.

Every replica of a stream answers direct gets, a follower that may lag the leader by a moment:
the caller names the sequence it must reach (`through`, read from the leader), and a page that
stops short of it is asked again until the replica caught up (or the message is gone).

Pages are read whole before they are handed on, at most `PAGE_MESSAGES` messages and about
`PAGE_BYTES` bytes each, and at most `MAX_PAGES_IN_FLIGHT` at once per connection: a burst of
replays waits its turn instead of growing without bound. Replies come to one wildcard inbox of
the connection, routed by token, so a page costs no subscription either.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from atmosphere.bus.errors import BusError

log = logging.getLogger("atmosphere.bus")

PAGE_MESSAGES = 256
"""Messages asked for per direct get."""
PAGE_BYTES = 1 << 20
"""The server stops a page once it sent this many bytes (it always sends at least one message)."""
MAX_PAGES_IN_FLIGHT = 32
"""Direct gets one connection has waiting for their answer at once (bounds what they buffer)."""
PAGE_TIMEOUT = 2.0
"""Seconds one page may take to arrive whole before it is asked for again."""
READ_PATIENCE = 10.0
"""Seconds a read may go without progress (a broker restarting, a replica catching up) before it fails."""
_API = "$JS.API.DIRECT.GET."
_SEQUENCE = "Nats-Sequence"
_PENDING = "Nats-Num-Pending"
_STATUS = "Status"
_DESCRIPTION = "Description"
_END_OF_BATCH = "204"
_NOTHING_STORED = "404"
_NO_RESPONDERS = "503"
_PENDING_LIMIT = 1 << 16
"""Replies the shared inbox buffers before NATS reports a slow consumer (pages are bounded far below)."""


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One stored message as a direct get returns it."""

    seq: int
    """Its stream sequence."""
    data: bytes
    headers: Mapping[str, str]
    """The headers it was stored with, and the server's `Nats-*` ones about it."""


class _NotAnsweredError(BusError):
    """A page did not come (no replica serves direct gets right now, or no answer in time)."""


@dataclass(eq=False)
class _Page:
    """The answer to one direct get, filled by the inbox callback."""

    done: asyncio.Future[None]
    messages: list[StoredMessage] = field(default_factory=list)
    pending: int = 0
    """Matching messages stored after the last one of the page (when the page was answered)."""

    def offer(self, msg: Msg) -> None:
        if self.done.done():
            return
        headers = msg.headers or {}
        try:
            if _SEQUENCE in headers:
                self.messages.append(StoredMessage(seq=int(headers[_SEQUENCE]), data=msg.data, headers=headers))
                return
            status = headers.get(_STATUS, "")
            if status == _END_OF_BATCH:
                self.pending = int(headers.get(_PENDING, "0"))
                self.done.set_result(None)
            elif status == _NOTHING_STORED:
                self.done.set_result(None)
            elif status == _NO_RESPONDERS:
                # No replica serves direct gets now: JetStream restarting, or a stream not
                # provisioned with `allow_direct` (a layout older than this code).
                self.done.set_exception(_NotAnsweredError("no server answers direct gets on this stream"))
            else:
                reason = f"{status} {headers.get(_DESCRIPTION, '')}".strip() or "a reply without a status"
                self.done.set_exception(BusError(f"direct get refused: {reason}"))
        except ValueError as exc:
            self.done.set_exception(BusError(f"malformed direct get answer: {exc}"))


class DirectReader:
    """Batched direct gets over one connection, for any number of concurrent readers."""

    def __init__(self, client: Client, *, patience: float = READ_PATIENCE) -> None:
        """Read through `client`; a read fails after `patience` seconds without progress."""
        self._nc = client
        self._patience = patience
        self._prefix = ""
        self._opening = asyncio.Lock()
        self._pages: dict[str, _Page] = {}
        self._tokens = itertools.count()
        self._slots = asyncio.Semaphore(MAX_PAGES_IN_FLIGHT)

    async def read(
        self,
        stream: str,
        subject: str,
        *,
        through: int,
        more_to_read: Callable[[int], Awaitable[bool]],
        start: int = 1,
    ) -> AsyncGenerator[StoredMessage, None]:
        """The messages of `subject` in `stream` (wire names), oldest first, up to sequence `through`.

        `more_to_read(next_seq)` asks the leader whether anything from `next_seq` on is still to
        come; it is asked only when the answering replica has nothing more, to tell a replica
        that lags (ask again) from messages removed meanwhile (a purge: stop).

        Raises:
            BusError: no progress for `patience` seconds, or the server refused the request.
        """
        next_seq = start  # a replica goes on from what it applied (`atmosphere.service.replica`)
        give_up = time.monotonic() + self._patience
        while next_seq <= through:
            page = await self._fetch(stream, subject, next_seq, give_up)
            for message in page.messages:
                if message.seq > through:
                    return
                yield message
            if page.messages:
                next_seq = page.messages[-1].seq + 1
                give_up = time.monotonic() + self._patience
                if page.pending > 0:
                    continue
            if next_seq > through or not await more_to_read(next_seq):
                return
            if time.monotonic() >= give_up:
                msg = f"replaying {subject!r} stalled: stored through {through}, no answer from {next_seq} on"
                raise BusError(msg)
            await asyncio.sleep(0.05)

    async def _fetch(self, stream: str, subject: str, from_seq: int, give_up: float) -> _Page:
        """One page, asked for again while no answer comes, until `give_up`."""
        attempt = 0
        while True:
            try:
                queued = time.monotonic()
                async with self._slots:
                    # Waiting for a slot is this connection's own queue (a burst of replays), not
                    # the broker's silence: it does not count against the patience.
                    give_up += time.monotonic() - queued
                    return await self._page(stream, subject, from_seq, min(PAGE_TIMEOUT, give_up - time.monotonic()))
            except _NotAnsweredError as exc:
                if time.monotonic() >= give_up:
                    msg = f"replaying {subject!r} failed: {exc}"
                    raise BusError(msg) from exc
                log.debug("direct get on %s: %s; asking again", stream, exc)
            attempt += 1
            await asyncio.sleep(min(1.0, 0.05 * 2**attempt, max(0.0, give_up - time.monotonic())))

    async def _page(self, stream: str, subject: str, from_seq: int, timeout: float) -> _Page:
        prefix = await self._inbox()
        token = str(next(self._tokens))
        page = _Page(done=asyncio.get_running_loop().create_future())
        self._pages[token] = page
        request = {"seq": from_seq, "next_by_subj": subject, "batch": PAGE_MESSAGES, "max_bytes": PAGE_BYTES}
        try:
            try:
                await self._nc.publish(_API + stream, json.dumps(request).encode(), reply=prefix + token)
            except nats.errors.ConnectionClosedError as exc:
                msg = f"the connection to nats is closed; cannot replay {subject!r}"
                raise BusError(msg) from exc
            except nats.errors.Error as exc:
                raise _NotAnsweredError(str(exc) or type(exc).__name__) from exc
            try:
                # `asyncio.timeout`, not `wait_for`: on 3.11 `wait_for` can swallow a cancellation
                # that meets the page's answer, and a replica being stopped would then read on.
                async with asyncio.timeout(max(timeout, 0.01)):
                    await page.done
            except TimeoutError as exc:
                raise _NotAnsweredError(f"no answer within {timeout:.1f}s") from exc
            return page
        finally:
            # Whatever still arrives for this token (a page given up on) is dropped.
            del self._pages[token]

    async def _inbox(self) -> str:
        if self._prefix:
            return self._prefix
        async with self._opening:
            if not self._prefix:
                prefix = self._nc.new_inbox() + "."
                await self._nc.subscribe(prefix + "*", cb=self._on_reply, pending_msgs_limit=_PENDING_LIMIT)
                self._prefix = prefix
        return self._prefix

    async def _on_reply(self, msg: Msg) -> None:
        page = self._pages.get(msg.subject[len(self._prefix) :])
        if page is not None:
            page.offer(msg)
