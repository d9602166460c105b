"""The bus interface shared by the NATS backend and the in-memory `FakeBus`."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Generic, TypeVar

from google.protobuf.message import Message

from atmosphere.bus._codec import Headers
from atmosphere.bus._jetstream import ConsumerSpec, JetStreamLayout, RequiredLayout
from atmosphere.bus._router import Router
from atmosphere.bus.errors import ConnectionLostError

M = TypeVar("M", bound=Message)


@dataclass(frozen=True, slots=True)
class Envelope(Generic[M]):
    """A received message: its logical subject, decoded payload and headers."""

    subject: str
    message: M
    headers: Headers


@dataclass(frozen=True, slots=True)
class ConsumerState:
    """How far a durable consumer has got through its stream."""

    pending: int
    """Messages of its filter not yet acknowledged: waiting, or handed out and in hand."""
    ack_floor: int
    """Every message of its filter up to this stream sequence is acknowledged."""

    def handled_through(self, seq: int) -> bool:
        """Whether every message of the filter up to stream sequence `seq` is acknowledged."""
        return self.pending == 0 or self.ack_floor >= seq


@dataclass(frozen=True, slots=True)
class PublishAck:
    """JetStream's acknowledgement of a stored message."""

    stream: str
    seq: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class WorkItem(Generic[M]):
    """A JetStream message handed to a work handler."""

    envelope: Envelope[M]
    stream_seq: int
    delivered: int
    """How many times this message has been delivered (1 on the first delivery)."""


WorkHandler = Callable[[WorkItem[M]], Awaitable[None]]
BatchHandler = Callable[[list[WorkItem[M]]], Awaitable[None]]


class Subscription(abc.ABC, Generic[M]):
    """Messages on a subject, in arrival order; iterate with `async for`."""

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[Envelope[M]]:
        """Iterate the decoded messages; undecodable ones are logged and skipped."""

    @abc.abstractmethod
    async def receive(self, timeout: float) -> Envelope[M] | None:
        """The next message, or None when none arrived within `timeout` seconds.

        Raises:
            StopAsyncIteration: the subscription has ended.
        """


class Consumer(abc.ABC):
    """A running JetStream pull consumer."""

    @property
    @abc.abstractmethod
    def active(self) -> bool:
        """Whether the consumer is pulling messages."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop pulling; work in hand goes on, and leaving the context still waits for it.

        A pull ends within its expiry (a second), so a service with several consumers stops
        them all first: their exits then do not wait for one another's pulls in turn.
        """


class ConnectionLiveness:
    """The connection state both backends keep the same way: its epoch and whether it is lost.

    Mixed in before `Bus`, so its members serve `Bus.epoch`, `Bus.lost` and `Bus.wait_lost`.
    """

    def __init__(self) -> None:
        """Connected, in epoch 0."""
        self._epoch = 0
        self._lost = asyncio.Event()

    @property
    def epoch(self) -> int:
        """How many times the connection was lost so far (see `Bus.epoch`)."""
        return self._epoch

    def note_disconnected(self) -> None:
        """A disconnect happened: a new connection session begins."""
        self._epoch += 1

    @property
    def lost(self) -> bool:
        """Whether the connection closed for good without us closing it."""
        return self._lost.is_set()

    def mark_lost(self) -> None:
        """The client reached CLOSED on its own: nothing can be sent any more."""
        self._lost.set()

    async def wait_lost(self) -> None:
        """Return once the connection has closed for good (not by us)."""
        await self._lost.wait()

    def _closed(self) -> bool:
        return self._lost.is_set()

    def _ensure_open(self, what: str) -> None:
        if self._closed():
            msg = f"the connection to nats is closed; cannot {what}"
            raise ConnectionLostError(msg)


class Bus(abc.ABC):
    """Publish, request, subscribe and serve protobuf messages on logical subjects.

    The NATS backend comes from `atmosphere.bus.connect`; `atmosphere.bus.testing.FakeBus` is
    the in-memory twin with the same wildcard, queue-group and JetStream semantics.
    """

    @property
    @abc.abstractmethod
    def is_connected(self) -> bool:
        """Whether the bus currently has a live connection."""

    @property
    @abc.abstractmethod
    def max_payload(self) -> int:
        """The broker's per-message limit, counting the payload and the headers.

        Every send checks it first and raises `PayloadTooLargeError` instead of sending: the
        server would close the connection. Edges that admit data size it below this limit with
        room for the envelope; a responder whose answer would not fit replies with an `Error`
        (`bus.payload_too_large`) instead.
        """

    @property
    @abc.abstractmethod
    def epoch(self) -> int:
        """A counter that moves on every disconnect.

        Two messages sent with the same epoch went over one connection session, in order; so
        the acknowledgement of a JetStream publish whose epoch did not move between send and
        ack proves the server processed everything sent before it in that session.
        """

    @property
    @abc.abstractmethod
    def lost(self) -> bool:
        """Whether the connection closed for good, not by us (nothing can be sent any more)."""

    @abc.abstractmethod
    async def wait_lost(self) -> None:
        """Return once the connection has closed for good (see `lost`)."""

    @abc.abstractmethod
    async def publish(self, subject: str, message: Message, *, headers: Headers | None = None) -> None:
        """Publish without waiting for anything (at most once).

        Raises:
            PayloadTooLargeError: payload + headers exceed `max_payload` (nothing was sent).
            ConnectionLostError: the connection closed for good.
        """

    @abc.abstractmethod
    async def request(
        self,
        subject: str,
        message: Message,
        reply_type: type[M],
        *,
        timeout: float = 5.0,
        headers: Headers | None = None,
    ) -> M:
        """Send a request and wait for its typed reply.

        Raises:
            PayloadTooLargeError: the request exceeds `max_payload` (nothing was sent).
            RequestTimeoutError: no reply in time.
            NoRespondersError: nobody serves the subject.
            RemoteError: the responder answered with an `Error`.
            DecodeError: the reply is not a `reply_type`.
        """

    @abc.abstractmethod
    def subscribe(
        self, subject: str, message_type: type[M], *, queue: str | None = None, confirmed: bool = True
    ) -> AbstractAsyncContextManager[Subscription[M]]:
        """Receive the messages on `subject` (wildcards allowed) while the context is open.

        Once entered, the broker knows the subscription: whatever is published after, by any
        client, is delivered. `confirmed=False` enters without asking the broker (a round trip
        or two): for a subscriber that only needs what follows its own next publish on this bus
        (a run's events, after it submits the run), since the broker takes one client's
        messages in the order sent.
        """

    @abc.abstractmethod
    def serve(
        self, router: Router, *, queue: str | None = None, max_inflight: int = 256, confirmed: bool = True
    ) -> AbstractAsyncContextManager[None]:
        """Serve every route of `router` while the context is open.

        With `queue`, each message goes to one member of the queue group. On exit the
        subscriptions stop and in-flight handlers finish before the context returns. Once
        entered the broker knows the routes, unless `confirmed=False` (as for `subscribe`):
        then it knows them before whatever this client publishes next.
        """

    @abc.abstractmethod
    async def js_publish(
        self, subject: str, message: Message, *, headers: Headers | None = None, timeout: float = 5.0
    ) -> PublishAck:
        """Publish to a JetStream stream and wait until it is stored.

        `headers.msg_id` de-duplicates: a second publish with the same id is acknowledged
        with `duplicate=True` and not stored again.
        """

    @abc.abstractmethod
    async def js_publish_nowait(
        self, subject: str, message: Message, *, headers: Headers | None = None
    ) -> asyncio.Future[PublishAck]:
        """Publish to a JetStream stream; the returned future resolves once it is stored.

        For many small messages in order (a run's events): no round trip per message. The
        future may never resolve if the connection dies with the message in flight; whoever
        waits on it bounds the wait and cancels it, then publishes again (with the same
        `msg_id`, so a message that was stored after all is not stored twice).
        """

    @abc.abstractmethod
    def consume(
        self,
        consumer: ConsumerSpec,
        message_type: type[M],
        handler: WorkHandler[M],
        *,
        max_inflight: int = 16,
        drain_timeout: float = 10.0,
    ) -> AbstractAsyncContextManager[Consumer]:
        """Pull work from a durable consumer while the context is open.

        At most `max_inflight` handlers run at once. While a handler runs, the message is kept
        alive (in-progress acks); when it returns the message is acked. `Nak` redelivers it
        later, `Term` drops it, any other exception is logged and redelivered after a delay.
        On exit, in-flight handlers get `drain_timeout` seconds to finish; the rest are
        cancelled and their messages nak'ed for another worker.
        """

    @abc.abstractmethod
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
        """Pull work from a durable consumer a batch at a time while the context is open.

        For cheap, idempotent work on a stream of many small messages (recording events):
        the handler gets every message one fetch returned (at most `max_batch`, in stream
        order, one batch at a time) and when it returns all of them are acked; `Nak`, `Term`
        or any other exception settles the whole batch the way `consume` settles one item.
        Undecodable messages are terminated and left out. While the handler runs, the batch
        is kept alive (in-progress acks). On exit the batch in hand gets `drain_timeout`
        seconds to finish; if cancelled, its messages are nak'ed for redelivery.

        After a batch smaller than `max_batch` the consumer waits `linger` seconds before the
        next fetch, so that under load messages arrive in fewer, larger batches (a delay of at
        most `linger` traded for far less work per message).
        """

    @abc.abstractmethod
    async def consumer_state(self, stream: str, durable: str) -> ConsumerState:
        """How far the durable consumer has got through `stream`."""

    @abc.abstractmethod
    async def stream_last_seq(self, stream: str) -> int:
        """The sequence of the newest message `stream` holds (0 when it never held one)."""

    @abc.abstractmethod
    async def stream_leader(self, stream: str) -> str:
        """Who leads `stream` now, and since when: a different answer means another server took over.

        "" where no other server can take over (one server).
        """

    @abc.abstractmethod
    async def last_message(self, stream: str, subject: str, message_type: type[M]) -> M | None:
        """The newest message `stream` holds for the exact `subject`, or None."""

    async def replay(self, stream: str, subject: str, message_type: type[M]) -> AsyncGenerator[M, None]:
        """Every message `stream` holds now for the exact `subject`, oldest first; then stop.

        Undecodable messages are logged and left out, as subscriptions leave them out.

        Messages stored after the call started may or may not be included; follow a live
        subscription for those.

        A replay holds nothing on the broker (the NATS backend reads by batched direct gets,
        never a consumer, so the stream needs `StreamSpec.allow_direct`): any number may run
        at once, and one abandoned halfway leaves nothing to clean up.
        """
        async for _, message in self.replay_sequenced(stream, subject, message_type):
            yield message

    @abc.abstractmethod
    def replay_sequenced(self, stream: str, subject: str, message_type: type[M]) -> AsyncGenerator[tuple[int, M], None]:
        """`replay`, each message with its stream sequence (what `expected_last_subject_seq` names)."""

    @abc.abstractmethod
    async def purge(self, stream: str, subject: str) -> None:
        """Remove every message `stream` holds for the exact `subject`."""

    @abc.abstractmethod
    async def provision(self, layout: JetStreamLayout, *, by: str = "") -> None:
        """Create or update the streams, buckets and consumers of `layout` (idempotent).

        Each stream and bucket is stamped as provisioned `by` (a login or a process), what
        `verify` answers. Only an unrestricted login or the provisioner's may do this
        (`atmosphere.bus.permissions`).
        """

    @abc.abstractmethod
    async def verify(self, required: RequiredLayout, *, timeout: float) -> str:
        """Wait until everything `required` names exists, its consumers as configured; who provisioned it.

        What a service with a login does at start instead of provisioning. Returns the name the
        provisioner stamped ("" when there is none).

        Raises:
            LayoutNotProvisionedError: still missing after `timeout` seconds, naming what.
        """

    @abc.abstractmethod
    def read_stream(
        self, stream: str, subject: str, message_type: type[M], *, after: int, through: int
    ) -> AsyncGenerator[tuple[int, Envelope[M] | None], None]:
        """The messages of `subject` (wildcards allowed) stored after sequence `after`, up to `through`.

        Oldest first, each with its stream sequence; None for one that does not decode (logged).
        Reading creates nothing on the broker (the NATS backend reads by direct gets), so a
        reader with no right to create a consumer can apply a whole stream
        (`atmosphere.service.replica`). Messages removed meanwhile (age, size) are skipped.
        """

    @abc.abstractmethod
    async def kv_put(self, bucket: str, key: str, message: Message) -> None:
        """Store `message` under `key` in a provisioned bucket."""

    @abc.abstractmethod
    async def kv_get(self, bucket: str, key: str, message_type: type[M]) -> M | None:
        """The value under `key`, or None."""

    @abc.abstractmethod
    async def kv_items(self, bucket: str, message_type: type[M]) -> dict[str, M]:
        """Every key and value of a bucket."""

    @abc.abstractmethod
    async def kv_delete(self, bucket: str, key: str) -> None:
        """Remove `key` from a provisioned bucket (nothing happens when it is not there)."""

    @abc.abstractmethod
    async def kv_update(
        self, bucket: str, key: str, message_type: type[M], change: Callable[[M | None], M | None]
    ) -> M | None:
        """Change the value under `key` as one compare-and-set: no other writer's change is lost.

        `change` gets the current value (None: there is none) and returns the new one, None to
        delete it, or the very object it got to leave the key as it is. When another writer
        changed the key between the read and the write, the write is refused and `change` runs
        again on the newer value: it may run more than once, and only its last run took effect
        (so it decides, and does nothing a repeat could double).

        Returns:
            What the key holds afterwards (None: nothing).

        Raises:
            BusError: the bucket is not provisioned, the broker did not answer, or other writers
                changed the key every time through the retries.
        """

    @abc.abstractmethod
    async def object_put(self, bucket: str, name: str, data: bytes) -> None:
        """Store `data` under `name` in a provisioned object bucket (replacing what was there).

        For data too large for one message: it travels in chunks that each fit in one, so its
        size is bounded only by `sizes.MAX_OBJECT_BYTES` and the bucket's own limit.

        Raises:
            PayloadTooLargeError: `data` exceeds `sizes.MAX_OBJECT_BYTES` (nothing was sent).
            ConnectionLostError: the connection closed for good.
            BusError: the bucket is not provisioned, is full, or the broker did not store it.
        """

    @abc.abstractmethod
    async def object_get(self, bucket: str, name: str) -> bytes | None:
        """The whole object under `name`, or None when there is none (never stored, deleted, expired).

        Raises:
            BusError: the bucket is not provisioned, the object is larger than
                `sizes.MAX_OBJECT_BYTES`, or its chunks did not arrive whole.
        """

    @abc.abstractmethod
    async def object_delete(self, bucket: str, name: str) -> None:
        """Delete the object under `name`; nothing happens when there is none."""
