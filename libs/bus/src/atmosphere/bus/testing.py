"""`FakeBus`: the in-memory twin of the NATS bus, for unit tests.

It encodes every message with the real codec and follows NATS semantics: `*` and `>`
wildcards, one delivery per queue group, no-responders and timeouts on requests, JetStream
streams that capture matching subjects and de-duplicate by `Nats-Msg-Id`, work-queue streams
that delete acked messages, durable consumers shared by competing workers, and key-value
buckets. The contract suite in `tests/contract` runs against it and a real nats-server.

It enforces the broker's `max_payload` (payload plus headers) like `NatsBus`, and
`close_for_good()` makes it behave like a nats-py client that reached CLOSED.

What it does not model: network failures, ack-wait expiry (a handler always settles its
message here, so nothing needs a timer), stream size or age limits, and the chunks of an
object-store object (an object is kept whole; its size limit is enforced).

`FakeBus` is core NATS (`_fake_core.FakeCore`, its base) plus JetStream: publishing to streams,
provisioning and consuming are here; the streams and durable consumers (`_fake_streams`), the
buckets (`_fake_buckets`) and the consumers' workers (`_fake_workers`) each have their module.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import TypeVar

from google.protobuf.message import Message

from atmosphere.bus._api import (
    BatchHandler,
    Bus,
    Consumer,
    ConsumerState,
    Envelope,
    PublishAck,
    WorkHandler,
)
from atmosphere.bus._codec import DEFAULT_MAX_PAYLOAD, Headers
from atmosphere.bus._fake_buckets import FakeBuckets
from atmosphere.bus._fake_core import FakeCore
from atmosphere.bus._fake_streams import FakeStreams, Stream
from atmosphere.bus._fake_workers import FakeBatchWorker, FakeWorker
from atmosphere.bus._jetstream import ConsumerSpec, JetStreamLayout, RequiredLayout
from atmosphere.bus._provisioning import LayoutNotProvisionedError
from atmosphere.bus.errors import (
    BusError,
    ConnectionLostError,
    NoStreamError,
    PayloadTooLargeError,
    WrongLastSequenceError,
)

__all__ = ["FakeBus"]

M = TypeVar("M", bound=Message)


class FakeBus(FakeCore, Bus):
    """An in-memory `Bus` with real NATS subject, queue-group and JetStream semantics."""

    def __init__(self, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        """Start empty and connected, with the broker limit `max_payload` (nats-server's default)."""
        super().__init__(max_payload=max_payload)
        self._jetstream = FakeStreams()
        self._buckets = FakeBuckets(self)
        self.provisioned_by = ""
        """Who provisioned the layout last (`provision(by=...)`), what `verify` answers."""

    def _capture(self, subject: str, data: bytes, headers: Mapping[str, str] | None) -> None:
        stream = self._jetstream.capturing(subject)
        if stream is not None:
            self._jetstream.store(stream, subject, data, headers)

    # Tests plant messages (undecodable ones too) straight into a stream through these two.

    @property
    def _streams(self) -> dict[str, Stream]:
        return self._jetstream.streams

    def _store(self, stream: Stream, subject: str, data: bytes, headers: Mapping[str, str] | None) -> PublishAck:
        return self._jetstream.store(stream, subject, data, headers)

    # -- JetStream -------------------------------------------------------------------------

    async def js_publish(
        self, subject: str, message: Message, *, headers: Headers | None = None, timeout: float = 5.0
    ) -> PublishAck:
        """Store in the capturing stream; a repeated `msg_id` is a duplicate."""
        stream = self._jetstream.capturing(subject)
        if stream is None:
            raise NoStreamError(subject)
        data = message.SerializeToString()
        wire = (headers.to_wire() or None) if headers else None
        self._check(subject, data, wire)
        expected = headers.expected_last_subject_seq if headers else None
        if expected is not None and self._jetstream.last_seq_of(stream, subject) != expected:
            raise WrongLastSequenceError(subject, expected)
        self.published.append((subject, message))
        ack = self._jetstream.store(stream, subject, data, wire)
        if not ack.duplicate:
            # Core subscribers see a JetStream publish too, exactly as on NATS.
            self._deliver(subject, data, wire, None)
        await asyncio.sleep(0)
        return ack

    async def js_publish_nowait(
        self, subject: str, message: Message, *, headers: Headers | None = None
    ) -> asyncio.Future[PublishAck]:
        """Store at once; the returned future is already resolved (or failed)."""
        future: asyncio.Future[PublishAck] = asyncio.get_running_loop().create_future()
        try:
            future.set_result(await self.js_publish(subject, message, headers=headers))
        except (PayloadTooLargeError, ConnectionLostError):
            raise  # refused before sending, as `NatsBus` does
        except BusError as exc:
            future.set_exception(exc)
        return future

    async def provision(self, layout: JetStreamLayout, *, by: str = "") -> None:
        """Create the streams, buckets and consumers of `layout` (idempotent; overlaps are refused)."""
        self.provisioned_by = by
        self._jetstream.provision_streams(layout)
        self._buckets.provision(layout)
        self._jetstream.provision_consumers(layout)

    async def verify(self, required: RequiredLayout, *, timeout: float) -> str:
        """Who provisioned `required`, once everything it names exists (else after `timeout`, an error)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while missing := self._missing(required):
            if asyncio.get_running_loop().time() >= deadline:
                msg = f"the JetStream layout is not provisioned: {'; '.join(missing)}"
                raise LayoutNotProvisionedError(msg)
            await asyncio.sleep(0.01)
        return self.provisioned_by

    def _missing(self, required: RequiredLayout) -> list[str]:
        return [
            *self._jetstream.missing_streams(required),
            *self._buckets.missing(required),
            *self._jetstream.missing_consumers(required),
        ]

    @contextlib.asynccontextmanager
    async def consume(
        self,
        consumer: ConsumerSpec,
        message_type: type[M],
        handler: WorkHandler[M],
        *,
        max_inflight: int = 16,
        drain_timeout: float = 10.0,
    ) -> AsyncIterator[Consumer]:
        """Pull work from a durable consumer while the context is open."""
        stream, durable = self._jetstream.durable(consumer)
        worker = FakeWorker(stream, durable, message_type, handler, max_inflight)
        async with asyncio.TaskGroup() as tasks:
            loop = tasks.create_task(worker.run(tasks))
            try:
                yield worker
            finally:
                worker.stopping = True
                loop.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loop
                await worker.drain(drain_timeout)

    @contextlib.asynccontextmanager
    async def consume_batches(
        self,
        consumer: ConsumerSpec,
        message_type: type[M],
        handler: BatchHandler[M],
        *,
        max_batch: int = 256,
        linger: float = 0.0,
        drain_timeout: float = 10.0,
    ) -> AsyncIterator[Consumer]:
        """Pull work from a durable consumer a batch at a time while the context is open."""
        stream, durable = self._jetstream.durable(consumer)
        worker = FakeBatchWorker(stream, durable, message_type, handler, max_batch=max_batch, linger=linger)
        async with asyncio.TaskGroup() as tasks:
            loop = tasks.create_task(worker.run_batches())
            try:
                yield worker
            finally:
                worker.stopping = True
                if not worker.handling:
                    loop.cancel()
                _, pending = await asyncio.wait({loop}, timeout=drain_timeout)
                for task in pending:
                    task.cancel()

    async def consumer_state(self, stream: str, durable: str) -> ConsumerState:
        """Unacknowledged messages (not yet handed out, redelivering, in hand) and the ack floor."""
        return await self._jetstream.consumer_state(stream, durable)

    async def stream_last_seq(self, stream: str) -> int:
        """The newest message's sequence in `stream` (0 when it holds none)."""
        return await self._jetstream.stream_last_seq(stream)

    async def stream_leader(self, stream: str) -> str:
        """Always "" (one in-process bus, no cluster: no other server can take a stream over)."""
        return await self._jetstream.stream_leader(stream)

    async def last_message(self, stream: str, subject: str, message_type: type[M]) -> M | None:
        """The newest message `stream` holds for `subject`, or None."""
        return await self._jetstream.last_message(stream, subject, message_type)

    def replay_sequenced(self, stream: str, subject: str, message_type: type[M]) -> AsyncGenerator[tuple[int, M], None]:
        """Every message `stream` holds now for `subject`, oldest first, with its sequence."""
        return self._jetstream.replay_sequenced(stream, subject, message_type)

    def read_stream(
        self, stream: str, subject: str, message_type: type[M], *, after: int, through: int
    ) -> AsyncGenerator[tuple[int, Envelope[M] | None], None]:
        """The messages of `subject` (wildcards allowed) stored after `after`, up to `through`."""
        return self._jetstream.read_stream(stream, subject, message_type, after=after, through=through)

    async def purge(self, stream: str, subject: str) -> None:
        """Remove every message of `subject` from `stream`."""
        await self._jetstream.purge(stream, subject)

    def stream_messages(self, stream: str) -> list[tuple[str, bytes]]:
        """The subjects and payloads a stream holds now, in order (for assertions)."""
        return self._jetstream.stream_messages(stream)

    # -- key-value and object buckets --------------------------------------------------------

    async def kv_put(self, bucket: str, key: str, message: Message) -> None:
        """Store `message` under `key`."""
        await self._buckets.kv_put(bucket, key, message)

    async def kv_get(self, bucket: str, key: str, message_type: type[M]) -> M | None:
        """The value under `key`, or None."""
        return await self._buckets.kv_get(bucket, key, message_type)

    async def kv_items(self, bucket: str, message_type: type[M]) -> dict[str, M]:
        """Every key and value of a bucket."""
        return await self._buckets.kv_items(bucket, message_type)

    async def kv_delete(self, bucket: str, key: str) -> None:
        """Remove `key` (nothing happens when it is not there)."""
        await self._buckets.kv_delete(bucket, key)

    async def kv_update(
        self, bucket: str, key: str, message_type: type[M], change: Callable[[M | None], M | None]
    ) -> M | None:
        """Read, change and write `key` with no await in between: nobody can write meanwhile."""
        return await self._buckets.kv_update(bucket, key, message_type, change)

    async def object_put(self, bucket: str, name: str, data: bytes) -> None:
        """Store `data` under `name` (whole: chunking is the broker's business)."""
        await self._buckets.object_put(bucket, name, data)

    async def object_get(self, bucket: str, name: str) -> bytes | None:
        """The object under `name`, or None."""
        return await self._buckets.object_get(bucket, name)

    async def object_delete(self, bucket: str, name: str) -> None:
        """Delete the object under `name` if there is one."""
        await self._buckets.object_delete(bucket, name)

    def object_names(self, bucket: str) -> list[str]:
        """The names a bucket holds now (for assertions)."""
        return self._buckets.object_names(bucket)
