"""The NATS backend of `Bus`: `NatsBus`, which `atmosphere.bus.connect` makes.

`NatsBus` is core NATS (`_nats_core.NatsCore`, its base) plus JetStream: publishing to streams
is here, and the rest is each in its own module, an object the bus owns and hands the call to:
acknowledgements of unawaited publishes (`_nats_acks`), durable consumers (`_nats_consumers`),
stream reads (`_nats_streams`), key-value buckets (`_nats_kv`), object buckets
(`_nats_objects`) and the layout (`_provisioning`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

import nats.errors
import nats.js.errors
from google.protobuf.message import Message
from nats.aio.client import Client
from nats.js import api as js_api
from nats.js.client import JetStreamContext

from atmosphere.bus._api import (
    BatchHandler,
    Bus,
    Consumer,
    ConsumerState,
    Envelope,
    PublishAck,
    WorkHandler,
)
from atmosphere.bus._codec import Headers
from atmosphere.bus._direct import DirectReader
from atmosphere.bus._jetstream import ConsumerSpec, JetStreamLayout, RequiredLayout
from atmosphere.bus._nats_acks import AckInbox
from atmosphere.bus._nats_consumers import PullConsumers
from atmosphere.bus._nats_core import WRONG_LAST_SEQUENCE, NatsCore
from atmosphere.bus._nats_kv import KeyValueBuckets
from atmosphere.bus._nats_objects import ObjectBuckets
from atmosphere.bus._nats_streams import StreamReads
from atmosphere.bus._provisioning import LayoutProvisioner, WireNames
from atmosphere.bus.errors import (
    BusError,
    NoStreamError,
    RequestTimeoutError,
    StreamUnavailableError,
    WrongLastSequenceError,
)

M = TypeVar("M", bound=Message)

log = logging.getLogger("atmosphere.bus")


class NatsBus(NatsCore, Bus):
    """A `Bus` over a connected nats-py client. Create it with `atmosphere.bus.connect`."""

    def __init__(self, client: Client, *, namespace: str = "") -> None:
        """Wrap `client`; every subject is prefixed with `namespace.` on the wire."""
        super().__init__(client, namespace=namespace)
        self._js: JetStreamContext = client.jetstream()
        self._acks = AckInbox(client, self._stream_prefix)
        direct = DirectReader(client)  # replays and objects: batched direct gets, no consumer per reader
        names = WireNames(stream=self.stream_name, subject=self.wire_subject)
        self._provisioner = LayoutProvisioner(self._js, names)
        self._consumers = PullConsumers(self._js, names, self._logical, self._provisioner)
        self._streams = StreamReads(self, self._js, direct)
        self._kv = KeyValueBuckets(self, self._js)
        self._objects = ObjectBuckets(self, self._js, direct)

    async def js_publish(
        self, subject: str, message: Message, *, headers: Headers | None = None, timeout: float = 5.0
    ) -> PublishAck:
        """Publish to JetStream and wait until stored."""
        data = message.SerializeToString()
        wire = (headers.to_wire() or None) if headers else None
        self._checked(subject, data, wire)
        try:
            ack = await self._js.publish(self.wire_subject(subject), data, timeout=timeout, headers=wire)
        except nats.js.errors.NoStreamResponseError as exc:
            raise await self._no_stream_or_no_leader(subject) from exc
        except nats.js.errors.APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE and headers and headers.expected_last_subject_seq is not None:
                raise WrongLastSequenceError(subject, headers.expected_last_subject_seq) from exc
            msg = f"jetstream publish to {subject!r} failed: {exc}"
            raise BusError(msg) from exc
        except nats.errors.TimeoutError as exc:
            raise RequestTimeoutError(subject, timeout) from exc
        except nats.errors.Error as exc:
            msg = f"jetstream publish to {subject!r} failed: {exc}"
            raise BusError(msg) from exc
        return self._ack(ack)

    async def _no_stream_or_no_leader(self, subject: str) -> BusError:
        """Why a JetStream publish got no answer: no stream, or a stream without a leader right now.

        No stream capturing `subject` is a setup error (final); a stream with no leader is a cluster
        electing one (retryable). Only the JetStream API saying "no stream" makes it final; an API that does not answer
        either (no meta leader, or a login that may not ask) leaves it retryable.
        """
        try:
            await self._js.find_stream_name_by_subject(self.wire_subject(subject))
        except nats.js.errors.NotFoundError:
            return NoStreamError(subject)
        except nats.errors.Error as exc:
            log.debug("could not tell whether a stream captures %s: %s", subject, exc)
        return StreamUnavailableError(subject)

    def _ack(self, ack: js_api.PubAck) -> PublishAck:
        stream = ack.stream.removeprefix(self._stream_prefix)
        return PublishAck(stream=stream, seq=ack.seq, duplicate=bool(ack.duplicate))

    async def js_publish_nowait(
        self, subject: str, message: Message, *, headers: Headers | None = None
    ) -> asyncio.Future[PublishAck]:
        """Publish to JetStream without waiting; the future resolves with the acknowledgement.

        Acknowledgements come to one inbox of this bus, matched by token; the caller cancels
        a future it gave up on (which forgets it). Nothing is handed to the client while it is
        disconnected: a publish buffered across a reconnect could be stored after messages
        published later, so the caller sends it again once connected instead.
        """
        data = message.SerializeToString()
        wire = (headers.to_wire() or None) if headers else None
        self._checked(subject, data, wire)
        if not self._nc.is_connected:
            msg = f"not connected; {subject!r} not sent"
            raise BusError(msg)
        reply, ack = await self._acks.expect()
        try:
            await self._nc.publish(self.wire_subject(subject), data, reply=reply, headers=wire)
        except nats.errors.Error as exc:
            ack.cancel()
            msg = f"jetstream publish to {subject!r} failed: {exc}"
            raise BusError(msg) from exc
        return ack

    # -- consumers -----------------------------------------------------------------------------

    def consume(
        self,
        consumer: ConsumerSpec,
        message_type: type[M],
        handler: WorkHandler[M],
        *,
        max_inflight: int = 16,
        drain_timeout: float = 10.0,
    ) -> AbstractAsyncContextManager[Consumer]:
        """Pull work from a durable consumer while the context is open."""
        return self._consumers.consume(
            consumer, message_type, handler, max_inflight=max_inflight, drain_timeout=drain_timeout
        )

    def consume_batches(
        self,
        consumer: ConsumerSpec,
        message_type: type[M],
        handler: BatchHandler[M],
        *,
        max_batch: int = 256,
        linger: float = 0.0,
        drain_timeout: float = 10.0,
    ) -> AbstractAsyncContextManager[Consumer]:
        """Pull work from a durable consumer a batch at a time while the context is open."""
        return self._consumers.consume_batches(
            consumer, message_type, handler, max_batch=max_batch, linger=linger, drain_timeout=drain_timeout
        )

    async def consumer_state(self, stream: str, durable: str) -> ConsumerState:
        """How far the durable has got: its unacknowledged messages and its ack floor."""
        return await self._consumers.consumer_state(stream, durable)

    # -- stream reads ----------------------------------------------------------------------------

    async def stream_last_seq(self, stream: str) -> int:
        """The newest message's sequence in `stream`."""
        return await self._streams.stream_last_seq(stream)

    async def stream_leader(self, stream: str) -> str:
        """The server leading `stream` and since when (its term), "" without a cluster."""
        return await self._streams.stream_leader(stream)

    async def last_message(self, stream: str, subject: str, message_type: type[M]) -> M | None:
        """The newest message `stream` holds for `subject`, or None."""
        return await self._streams.last_message(stream, subject, message_type)

    def replay_sequenced(self, stream: str, subject: str, message_type: type[M]) -> AsyncGenerator[tuple[int, M], None]:
        """Every message `stream` holds now for `subject`, oldest first (`_nats_streams`)."""
        return self._streams.replay_sequenced(stream, subject, message_type)

    def read_stream(
        self, stream: str, subject: str, message_type: type[M], *, after: int, through: int
    ) -> AsyncGenerator[tuple[int, Envelope[M] | None], None]:
        """The messages of `subject` stored after `after`, up to `through`, by batched direct gets."""
        return self._streams.read_stream(stream, subject, message_type, after=after, through=through)

    async def purge(self, stream: str, subject: str) -> None:
        """Remove every message of `subject` from `stream`."""
        await self._streams.purge(stream, subject)

    # -- the layout ------------------------------------------------------------------------------

    async def provision(self, layout: JetStreamLayout, *, by: str = "") -> None:
        """Create or update every stream, bucket and consumer of `layout`, its replication in place.

        On a cluster that is still electing leaders (just formed, or a node just lost) the
        JetStream API answers "unavailable" or not at all for a few seconds: provisioning is
        idempotent, so it is tried again for up to a minute (`_provisioning.patiently`).
        """
        self._consumers.replicas = layout.replication.replicas
        await self._provisioner.provision(layout, by=by)

    async def verify(self, required: RequiredLayout, *, timeout: float) -> str:
        """Wait until `required` exists, consumers as configured; who provisioned it (`_provisioning`)."""
        return await self._provisioner.verify(required, timeout=timeout)

    # -- key-value and object buckets ------------------------------------------------------------

    async def kv_put(self, bucket: str, key: str, message: Message) -> None:
        """Store `message` under `key`."""
        await self._kv.put(bucket, key, message)

    async def kv_get(self, bucket: str, key: str, message_type: type[M]) -> M | None:
        """The value under `key`, or None."""
        return await self._kv.get(bucket, key, message_type)

    async def kv_items(self, bucket: str, message_type: type[M]) -> dict[str, M]:
        """Every key and value of a bucket."""
        return await self._kv.items(bucket, message_type)

    async def kv_delete(self, bucket: str, key: str) -> None:
        """Remove `key` (a delete marker: readers see no value; nothing happens when it is not there)."""
        await self._kv.delete(bucket, key)

    async def kv_update(
        self, bucket: str, key: str, message_type: type[M], change: Callable[[M | None], M | None]
    ) -> M | None:
        """Read the key and its revision, change it, write it only if that revision is still the newest."""
        return await self._kv.update(bucket, key, message_type, change)

    async def object_put(self, bucket: str, name: str, data: bytes) -> None:
        """Store `data` under `name`, in chunks that each fit in one message."""
        await self._objects.put(bucket, name, data)

    async def object_get(self, bucket: str, name: str) -> bytes | None:
        """The whole object under `name`, or None when there is none."""
        return await self._objects.get(bucket, name)

    async def object_delete(self, bucket: str, name: str) -> None:
        """Delete the object under `name`; nothing happens when there is none."""
        await self._objects.delete(bucket, name)
