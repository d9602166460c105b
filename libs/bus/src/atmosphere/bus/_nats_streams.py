"""Reading JetStream streams for `NatsBus`: their state, newest messages, replays and purges.

Replays and stream reads go by batched direct gets (`_direct`), never a consumer: any number
may run at once, and a reader that goes away leaves nothing behind on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors
from google.protobuf.message import Message
from nats.js.client import JetStreamContext

from atmosphere.bus._api import Envelope
from atmosphere.bus._codec import Headers, decode
from atmosphere.bus._direct import DirectReader
from atmosphere.bus._nats_core import NatsCore
from atmosphere.bus.errors import BusError, DecodeError

M = TypeVar("M", bound=Message)

log = logging.getLogger("atmosphere.bus")


class StreamReads:
    """What `NatsBus` reads from (and purges in) a stream, by its logical names."""

    def __init__(self, bus: NatsCore, js: JetStreamContext, direct: DirectReader) -> None:
        """Read through `js` and `direct`, naming streams and subjects as `bus` does."""
        self._bus = bus
        self._js = js
        self._direct = direct
        self._standalone: dict[str, int] = {}
        """Streams found on a server without a cluster, by the connection session that found them."""

    async def stream_last_seq(self, stream: str) -> int:
        """The newest message's sequence in `stream`."""
        try:
            info = await self._js.stream_info(self._bus.stream_name(stream))
        except nats.errors.Error as exc:
            msg = f"reading stream {stream!r} failed: {exc}"
            raise BusError(msg) from exc
        return info.state.last_seq or 0

    async def stream_leader(self, stream: str) -> str:
        """The server leading `stream` and since when (its term), "" without a cluster.

        A stream on a server without a cluster is asked about once per connection session: no
        other server can take it over within the session, and a server restarted into a cluster
        is a new session (`epoch`). Every run's writer asks at each confirmation, and a stream
        info is the broker's dearest read (a kilobyte of JSON each way, and an API advisory).
        """
        epoch = self._bus.epoch
        if self._standalone.get(stream) == epoch:
            return ""
        try:
            info = await self._js.stream_info(self._bus.stream_name(stream))
        except nats.errors.Error as exc:
            msg = f"reading stream {stream!r} failed: {exc}"
            raise BusError(msg) from exc
        if info.cluster is None or info.cluster.name is None:
            # No cluster: one server holds the stream (it names itself its leader, for ever).
            if self._bus.epoch == epoch:  # answered within the session it was asked in
                self._standalone[stream] = epoch
            return ""
        self._standalone.pop(stream, None)
        if not info.cluster.leader:
            return ""
        # With the time it took the lead: a leader that lost it and won it back is another term.
        since = info.cluster.leader_since.isoformat() if info.cluster.leader_since else ""
        return f"{info.cluster.leader}@{since}" if since else info.cluster.leader

    async def last_message(self, stream: str, subject: str, message_type: type[M]) -> M | None:
        """The newest message `stream` holds for `subject`, or None."""
        try:
            raw = await self._js.get_last_msg(self._bus.stream_name(stream), self._bus.wire_subject(subject))
        except nats.js.errors.NotFoundError:
            return None
        except nats.errors.Error as exc:
            msg = f"reading the last message of {subject!r} failed: {exc}"
            raise BusError(msg) from exc
        return decode(raw.data or b"", None, message_type)

    def _more_to_read(self, stream_name: str, wire: str, subject: str) -> Callable[[int], Awaitable[bool]]:
        """Whether the leader holds a message of `subject` at or after a sequence (a reader's stop check)."""

        async def more_to_read(next_seq: int) -> bool:
            try:
                newest = await self._last_seq(stream_name, wire, subject)
            except BusError:
                return True  # the leader does not answer now (a restart): the reader's patience decides
            return newest is not None and newest >= next_seq

        return more_to_read

    async def replay_sequenced(
        self, stream: str, subject: str, message_type: type[M]
    ) -> AsyncGenerator[tuple[int, M], None]:
        """Every message `stream` holds now for `subject`, oldest first, read by batched direct gets.

        No consumer is created (see `_direct`): any number of replays at once costs the server
        a request per page, and a reader that goes away leaves nothing behind. The newest
        message is read from the stream's leader first; the replay goes on until it reached
        it, so a replica that lags cannot cut it short.
        """
        stream_name, wire = self._bus.stream_name(stream), self._bus.wire_subject(subject)
        self._bus._ensure_open(f"replay {subject!r}")
        last = await self._last_seq(stream_name, wire, subject)
        if last is None:
            return

        more_to_read = self._more_to_read(stream_name, wire, subject)
        stored = self._direct.read(stream_name, wire, through=last, more_to_read=more_to_read)
        async with contextlib.aclosing(stored) as messages:
            async for raw in messages:
                try:
                    message = decode(raw.data, raw.headers, message_type)
                except DecodeError as exc:
                    # One bad message (an internal publisher's garbage) must not make every
                    # later one unreadable: left out, as subscriptions leave it out.
                    log.warning("skipping an undecodable message of %s: %s", subject, exc)
                else:
                    yield raw.seq, message
                # A page is in memory: without a turn for the rest of the loop between messages,
                # a reader forwarding them (a socket's writer) would fall a page behind at once.
                await asyncio.sleep(0)

    async def read_stream(
        self, stream: str, subject: str, message_type: type[M], *, after: int, through: int
    ) -> AsyncGenerator[tuple[int, Envelope[M] | None], None]:
        """The messages of `subject` stored after `after`, up to `through`, by batched direct gets."""
        stream_name, wire = self._bus.stream_name(stream), self._bus.wire_subject(subject)
        self._bus._ensure_open(f"read {stream!r}")

        more_to_read = self._more_to_read(stream_name, wire, subject)
        stored = self._direct.read(stream_name, wire, through=through, more_to_read=more_to_read, start=after + 1)
        logical = self._bus._logical
        async with contextlib.aclosing(stored) as messages:
            async for raw in messages:
                subject_of = logical(str(raw.headers.get("Nats-Subject", wire)))
                try:
                    message = decode(raw.data, raw.headers, message_type)
                except DecodeError as exc:
                    log.warning("skipping an undecodable message %d of %s: %s", raw.seq, stream, exc)
                    yield raw.seq, None
                else:
                    yield raw.seq, Envelope(subject_of, message, Headers.from_wire(raw.headers))

    async def _last_seq(self, stream_name: str, wire: str, subject: str) -> int | None:
        """The sequence of the newest message of `wire`, asked of the stream's leader (None: none)."""
        try:
            last = await self._js.get_last_msg(stream_name, wire)
        except nats.js.errors.NotFoundError:
            return None
        except nats.errors.Error as exc:
            msg = f"replaying {subject!r} failed: {exc}"
            raise BusError(msg) from exc
        return last.seq or 0

    async def purge(self, stream: str, subject: str) -> None:
        """Remove every message of `subject` from `stream`."""
        try:
            await self._js.purge_stream(self._bus.stream_name(stream), subject=self._bus.wire_subject(subject))
        except nats.errors.Error as exc:
            msg = f"purging {subject!r} failed: {exc}"
            raise BusError(msg) from exc
