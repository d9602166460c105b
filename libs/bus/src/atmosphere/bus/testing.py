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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf.message import Message

from atmosphere.bus._api import (
    BatchHandler,
    Bus,
    ConnectionLiveness,
    Consumer,
    ConsumerState,
    Envelope,
    PublishAck,
    Subscription,
    WorkHandler,
    WorkItem,
)
from atmosphere.bus._codec import DEFAULT_MAX_PAYLOAD, Headers, check_size, decode, encode, error_reply_too_large
from atmosphere.bus._jetstream import ConsumerSpec, JetStreamLayout, RequiredLayout, Retention, StreamSpec
from atmosphere.bus._provisioning import LayoutNotProvisionedError
from atmosphere.bus._router import Route, Router, run_route
from atmosphere.bus._subscription import QueueSubscription
from atmosphere.bus.errors import (
    BusError,
    ConnectionLostError,
    DecodeError,
    Nak,
    NoRespondersError,
    NoStreamError,
    PayloadTooLargeError,
    RequestTimeoutError,
    Term,
    WrongLastSequenceError,
)
from atmosphere.bus.sizes import MAX_OBJECT_BYTES
from atmosphere.bus.subjects import matches, overlaps

__all__ = ["FakeBus"]

M = TypeVar("M", bound=Message)

log = logging.getLogger("atmosphere.bus")

_Deliver = Callable[[str, bytes, Mapping[str, str] | None, str | None], None]


@dataclass(eq=False)
class _Sub:
    pattern: str
    queue: str | None
    deliver: _Deliver


@dataclass
class _Stored:
    seq: int
    subject: str
    data: bytes
    headers: Mapping[str, str] | None


@dataclass
class _Stream:
    spec: StreamSpec
    messages: dict[int, _Stored] = field(default_factory=dict)
    msg_ids: dict[str, int] = field(default_factory=dict)
    last_seq: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def wake(self) -> None:
        """Wake every worker waiting for a message."""
        self.changed.set()


@dataclass
class _Durable:
    """Server-side state of a durable consumer, shared by every worker pulling from it."""

    spec: ConsumerSpec
    cursor: int = 0
    """The last stream sequence handed out for the first time."""
    redeliver: list[int] = field(default_factory=list)
    delivered: dict[int, int] = field(default_factory=dict)
    """Delivery counts of messages not yet acked or terminated."""


class FakeBus(ConnectionLiveness, Bus):
    """An in-memory `Bus` with real NATS subject, queue-group and JetStream semantics."""

    def __init__(self, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        """Start empty and connected, with the broker limit `max_payload` (nats-server's default)."""
        super().__init__()
        self._max_payload = max_payload
        self._subs: list[_Sub] = []
        self._rr = itertools.count()
        self._inbox = itertools.count(1)
        self._streams: dict[str, _Stream] = {}
        self._durables: dict[tuple[str, str], _Durable] = {}
        self._buckets: dict[str, dict[str, bytes]] = {}
        self._objects: dict[str, dict[str, bytes]] = {}
        self.connected = True
        """Set to False to make readiness checks see a disconnected bus."""
        self.published: list[tuple[str, Message]] = []
        """Every message published or requested, decoded as sent (for assertions)."""
        self.provisioned_by = ""
        """Who provisioned the layout last (`provision(by=...)`), what `verify` answers."""

    @property
    def is_connected(self) -> bool:
        """Whether the fake is marked connected."""
        return self.connected and not self._lost.is_set()

    @property
    def max_payload(self) -> int:
        """The broker limit this fake enforces."""
        return self._max_payload

    def disconnect(self) -> None:
        """Count a disconnect (what a broker restart does to the connection's epoch)."""
        self.note_disconnected()

    def close_for_good(self) -> None:
        """Behave like a nats-py client that reached CLOSED: nothing can be sent any more."""
        self.mark_lost()

    def _check(self, subject: str, data: bytes, wire: Mapping[str, str] | None) -> None:
        self._ensure_open(f"send on {subject!r}")
        check_size(subject, data, wire, self._max_payload)

    # -- core NATS -------------------------------------------------------------------------

    def _route(self, subject: str, data: bytes, headers: Mapping[str, str] | None, reply: str | None) -> int:
        """Capture into a matching stream, then deliver as core NATS does; return deliveries."""
        stream = self._capturing(subject)
        if stream is not None:
            self._store(stream, subject, data, headers)
        return self._deliver(subject, data, headers, reply)

    def _deliver(self, subject: str, data: bytes, headers: Mapping[str, str] | None, reply: str | None) -> int:
        delivered = 0
        groups: dict[str, list[_Sub]] = {}
        for sub in [s for s in self._subs if matches(s.pattern, subject)]:
            if sub.queue is None:
                sub.deliver(subject, data, headers, reply)
                delivered += 1
            else:
                groups.setdefault(sub.queue, []).append(sub)
        for members in groups.values():
            members[next(self._rr) % len(members)].deliver(subject, data, headers, reply)
            delivered += 1
        return delivered

    async def publish(self, subject: str, message: Message, *, headers: Headers | None = None) -> None:
        """Deliver to every matching subscriber (and capture into matching streams)."""
        wire = (headers.to_wire() or None) if headers else None
        data = message.SerializeToString()
        self._check(subject, data, wire)
        self.published.append((subject, message))
        self._route(subject, data, wire, None)
        await asyncio.sleep(0)

    async def request(
        self,
        subject: str,
        message: Message,
        reply_type: type[M],
        *,
        timeout: float = 5.0,
        headers: Headers | None = None,
    ) -> M:
        """Send a request to one responder and wait for its typed reply."""
        data, wire = encode(message, headers)
        self._check(subject, data, wire)
        self.published.append((subject, message))
        inbox = f"_INBOX.fake.{next(self._inbox)}"
        answer: asyncio.Future[tuple[bytes, Mapping[str, str] | None]] = asyncio.get_running_loop().create_future()

        def on_reply(_s: str, payload: bytes, reply_headers: Mapping[str, str] | None, _r: str | None) -> None:
            if not answer.done():
                answer.set_result((payload, reply_headers))

        reply_sub = _Sub(inbox, None, on_reply)
        self._subs.append(reply_sub)
        try:
            if self._route(subject, data, wire, inbox) == 0:
                raise NoRespondersError(subject)
            try:
                payload, reply_headers = await asyncio.wait_for(answer, timeout)
            except TimeoutError as exc:
                raise RequestTimeoutError(subject, timeout) from exc
        finally:
            self._subs.remove(reply_sub)
        return decode(payload, reply_headers, reply_type)

    @contextlib.asynccontextmanager
    async def subscribe(
        self, subject: str, message_type: type[M], *, queue: str | None = None
    ) -> AsyncIterator[Subscription[M]]:
        """Receive the messages on `subject` while the context is open."""
        subscription = QueueSubscription(message_type)
        sub = _Sub(subject, queue, lambda s, d, h, _r: subscription.offer(s, d, h))
        self._subs.append(sub)
        try:
            yield subscription
        finally:
            self._subs.remove(sub)
            subscription.close()

    @contextlib.asynccontextmanager
    async def serve(self, router: Router, *, queue: str | None = None, max_inflight: int = 256) -> AsyncIterator[None]:
        """Serve every route while the context is open; finish in-flight work on exit."""
        slots = asyncio.Semaphore(max_inflight)
        subs: list[_Sub] = []
        async with asyncio.TaskGroup() as tasks:
            try:
                for route in router.routes:
                    sub = _Sub(route.subject, queue, self._responder(route, slots, tasks))
                    subs.append(sub)
                    self._subs.append(sub)
                yield
            finally:
                for sub in subs:
                    self._subs.remove(sub)

    def _responder(self, route: Route[Any], slots: asyncio.Semaphore, tasks: asyncio.TaskGroup) -> _Deliver:
        async def answer(subject: str, data: bytes, headers: Mapping[str, str] | None, reply: str | None) -> None:
            async with slots:
                result = await run_route(route, subject, data, headers)
            if result is not None and reply is not None:
                try:
                    check_size(subject, result[0], result[1], self._max_payload)
                except PayloadTooLargeError as exc:
                    result = error_reply_too_large(exc)
                self._route(reply, result[0], result[1], None)

        def deliver(subject: str, data: bytes, headers: Mapping[str, str] | None, reply: str | None) -> None:
            tasks.create_task(answer(subject, data, headers, reply))

        return deliver

    # -- JetStream -------------------------------------------------------------------------

    def _capturing(self, subject: str) -> _Stream | None:
        for stream in self._streams.values():
            if any(matches(p, subject) for p in stream.spec.subjects):
                return stream
        return None

    @staticmethod
    def _last_seq_of(stream: _Stream, subject: str) -> int:
        return max((seq for seq, stored in stream.messages.items() if stored.subject == subject), default=0)

    def _store(self, stream: _Stream, subject: str, data: bytes, headers: Mapping[str, str] | None) -> PublishAck:
        msg_id = (headers or {}).get("Nats-Msg-Id", "")
        if msg_id in stream.msg_ids:
            return PublishAck(stream.spec.name, stream.msg_ids[msg_id], duplicate=True)
        stream.last_seq += 1
        if msg_id:
            stream.msg_ids[msg_id] = stream.last_seq
        stream.messages[stream.last_seq] = _Stored(stream.last_seq, subject, data, headers)
        stream.wake()
        return PublishAck(stream.spec.name, stream.last_seq, duplicate=False)

    async def js_publish(
        self, subject: str, message: Message, *, headers: Headers | None = None, timeout: float = 5.0
    ) -> PublishAck:
        """Store in the capturing stream; a repeated `msg_id` is a duplicate."""
        stream = self._capturing(subject)
        if stream is None:
            raise NoStreamError(subject)
        data = message.SerializeToString()
        wire = (headers.to_wire() or None) if headers else None
        self._check(subject, data, wire)
        expected = headers.expected_last_subject_seq if headers else None
        if expected is not None and self._last_seq_of(stream, subject) != expected:
            raise WrongLastSequenceError(subject, expected)
        self.published.append((subject, message))
        ack = self._store(stream, subject, data, wire)
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
        for spec in layout.streams():
            for other in self._streams.values():
                if other.spec.name != spec.name and any(
                    overlaps(a, b) for a in spec.subjects for b in other.spec.subjects
                ):
                    msg = f"stream {spec.name} overlaps {other.spec.name}"
                    raise BusError(msg)
            existing = self._streams.get(spec.name)
            if existing is None:
                self._streams[spec.name] = _Stream(spec)
            else:
                existing.spec = spec
        for bucket in layout.buckets():
            self._buckets.setdefault(bucket.name, {})
        for objects in layout.object_buckets():
            self._objects.setdefault(objects.name, {})
        for consumer in layout.consumers:
            self._durable(dataclasses.replace(consumer, provisioned=False))

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
            *(f"{s} does not exist" for s in required.streams if s not in self._streams),
            *(f"bucket {b} does not exist" for b in required.buckets if b not in self._buckets),
            *(f"object bucket {b} does not exist" for b in required.object_buckets if b not in self._objects),
            *(
                f"consumer {c.durable} of {c.stream} does not exist"
                for c in required.consumers
                if (c.stream, c.durable) not in self._durables
            ),
        ]

    async def consumer_state(self, stream: str, durable: str) -> ConsumerState:
        """Unacknowledged messages (not yet handed out, redelivering, in hand) and the ack floor."""
        found = self._durables.get((stream, durable))
        if found is None:
            msg = f"consumer {durable!r} of {stream!r} not found"
            raise BusError(msg)
        messages = self._streams[stream].messages
        waiting = [
            seq for seq, m in messages.items() if seq > found.cursor and matches(found.spec.filter_subject, m.subject)
        ]
        unacked = sorted({*waiting, *found.redeliver, *found.delivered})
        floor = unacked[0] - 1 if unacked else max(messages, default=0)
        return ConsumerState(pending=len(unacked), ack_floor=floor)

    async def stream_last_seq(self, stream: str) -> int:
        """The newest message's sequence in `stream` (0 when it holds none)."""
        if stream not in self._streams:
            msg = f"stream {stream!r} is not provisioned"
            raise BusError(msg)
        return max(self._streams[stream].messages, default=0)

    async def stream_leader(self, stream: str) -> str:
        """Always "" (one in-process bus, no cluster: no other server can take a stream over)."""
        if stream not in self._streams:
            msg = f"stream {stream!r} is not provisioned"
            raise BusError(msg)
        return ""

    async def last_message(self, stream: str, subject: str, message_type: type[M]) -> M | None:
        """The newest message `stream` holds for `subject`, or None."""
        if stream not in self._streams:
            msg = f"stream {stream!r} is not provisioned"
            raise BusError(msg)
        for _, stored in sorted(self._streams[stream].messages.items(), reverse=True):
            if stored.subject == subject:
                return decode(stored.data, stored.headers, message_type)
        return None

    async def replay_sequenced(
        self, stream: str, subject: str, message_type: type[M]
    ) -> AsyncGenerator[tuple[int, M], None]:
        """Every message `stream` holds now for `subject`, oldest first, with its sequence."""
        if stream not in self._streams:
            msg = f"stream {stream!r} is not provisioned"
            raise BusError(msg)
        snapshot = sorted(self._streams[stream].messages.items())
        for _, stored in snapshot:
            if stored.subject == subject:
                try:
                    message = decode(stored.data, stored.headers, message_type)
                except DecodeError as exc:
                    log.warning("skipping an undecodable message of %s: %s", subject, exc)
                    continue
                yield stored.seq, message
                await asyncio.sleep(0)  # other tasks run between messages, as with `NatsBus`

    async def read_stream(
        self, stream: str, subject: str, message_type: type[M], *, after: int, through: int
    ) -> AsyncGenerator[tuple[int, Envelope[M] | None], None]:
        """The messages of `subject` (wildcards allowed) stored after `after`, up to `through`."""
        if stream not in self._streams:
            msg = f"stream {stream!r} is not provisioned"
            raise BusError(msg)
        snapshot = sorted(self._streams[stream].messages.items())
        for seq, stored in snapshot:
            if not after < seq <= through or not matches(subject, stored.subject):
                continue
            try:
                message = decode(stored.data, stored.headers, message_type)
            except DecodeError as exc:
                log.warning("skipping an undecodable message %d of %s: %s", seq, stream, exc)
                yield seq, None
                continue
            yield seq, Envelope(stored.subject, message, Headers.from_wire(stored.headers))

    async def purge(self, stream: str, subject: str) -> None:
        """Remove every message of `subject` from `stream`."""
        if stream not in self._streams:
            msg = f"stream {stream!r} is not provisioned"
            raise BusError(msg)
        messages = self._streams[stream].messages
        for seq in [seq for seq, stored in messages.items() if stored.subject == subject]:
            del messages[seq]

    def stream_messages(self, stream: str) -> list[tuple[str, bytes]]:
        """The subjects and payloads a stream holds now, in order (for assertions)."""
        return [(m.subject, m.data) for _, m in sorted(self._streams[stream].messages.items())]

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
        stream, durable = self._durable(consumer)
        worker = _FakeWorker(stream, durable, message_type, handler, max_inflight)
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

    def _durable(self, consumer: ConsumerSpec) -> tuple[_Stream, _Durable]:
        stream = self._streams.get(consumer.stream)
        if stream is None:
            msg = f"stream {consumer.stream!r} is not provisioned"
            raise BusError(msg)
        if stream.spec.retention is Retention.WORK_QUEUE:
            for (name, other), existing in self._durables.items():
                sibling = name == consumer.stream and other != consumer.durable
                if sibling and overlaps(existing.spec.filter_subject, consumer.filter_subject):
                    msg = f"consumer {consumer.durable!r}: filtered consumer not unique on workqueue stream"
                    raise BusError(msg)
        if consumer.provisioned and (consumer.stream, consumer.durable) not in self._durables:
            # As on NATS: a provisioned consumer is bound to, never made, by whoever pulls from it.
            msg = f"consumer {consumer.durable} of {consumer.stream} does not exist: run the provisioner"
            raise LayoutNotProvisionedError(msg)
        durable = self._durables.setdefault((consumer.stream, consumer.durable), _Durable(consumer))
        durable.spec = consumer  # create or update, as on a real server
        return stream, durable

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
        stream, durable = self._durable(consumer)
        worker = _FakeBatchWorker(stream, durable, message_type, handler, max_batch=max_batch, linger=linger)
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

    # -- key-value -------------------------------------------------------------------------

    def _bucket(self, bucket: str) -> dict[str, bytes]:
        try:
            return self._buckets[bucket]
        except KeyError:
            msg = f"bucket {bucket!r} is not provisioned"
            raise BusError(msg) from None

    async def kv_put(self, bucket: str, key: str, message: Message) -> None:
        """Store `message` under `key`."""
        data = message.SerializeToString()
        self._check(f"$KV.{bucket}.{key}", data, None)
        self._bucket(bucket)[key] = data

    async def kv_get(self, bucket: str, key: str, message_type: type[M]) -> M | None:
        """The value under `key`, or None."""
        data = self._bucket(bucket).get(key)
        return None if data is None else decode(data, None, message_type)

    async def kv_items(self, bucket: str, message_type: type[M]) -> dict[str, M]:
        """Every key and value of a bucket."""
        return {k: decode(v, None, message_type) for k, v in self._bucket(bucket).items()}

    async def kv_delete(self, bucket: str, key: str) -> None:
        """Remove `key` (nothing happens when it is not there)."""
        self._bucket(bucket).pop(key, None)

    async def kv_update(
        self, bucket: str, key: str, message_type: type[M], change: Callable[[M | None], M | None]
    ) -> M | None:
        """Read, change and write `key` with no await in between: nobody can write meanwhile."""
        values = self._bucket(bucket)
        stored = values.get(key)
        current = None if stored is None else decode(stored, None, message_type)
        new = change(current)
        if new is current:
            return current
        if new is None:
            values.pop(key, None)
            return None
        data = new.SerializeToString()
        self._check(f"$KV.{bucket}.{key}", data, None)
        values[key] = data
        return new

    # -- object store ------------------------------------------------------------------------

    def _object_bucket(self, bucket: str) -> dict[str, bytes]:
        try:
            return self._objects[bucket]
        except KeyError:
            msg = f"object bucket {bucket!r} is not provisioned"
            raise BusError(msg) from None

    async def object_put(self, bucket: str, name: str, data: bytes) -> None:
        """Store `data` under `name` (whole: chunking is the broker's business)."""
        self._ensure_open(f"store {name!r} in {bucket!r}")
        if len(data) > MAX_OBJECT_BYTES:
            raise PayloadTooLargeError(f"object {bucket}/{name}", len(data), MAX_OBJECT_BYTES)
        self._object_bucket(bucket)[name] = bytes(data)
        await asyncio.sleep(0)

    async def object_get(self, bucket: str, name: str) -> bytes | None:
        """The object under `name`, or None."""
        return self._object_bucket(bucket).get(name)

    async def object_delete(self, bucket: str, name: str) -> None:
        """Delete the object under `name` if there is one."""
        self._object_bucket(bucket).pop(name, None)

    def object_names(self, bucket: str) -> list[str]:
        """The names a bucket holds now (for assertions)."""
        return sorted(self._object_bucket(bucket))


class _FakeWorker(Consumer):
    def __init__(
        self,
        stream: _Stream,
        durable: _Durable,
        message_type: type[M],
        handler: WorkHandler[M],
        max_inflight: int,
    ) -> None:
        self._stream = stream
        self._durable = durable
        self._type: type[Message] = message_type
        self._handler: Callable[[WorkItem[Any]], Awaitable[None]] = handler
        self._slots = asyncio.Semaphore(max_inflight)
        self._tasks: set[asyncio.Task[None]] = set()
        self.stopping = False

    @property
    def active(self) -> bool:
        return not self.stopping

    def _next(self) -> _Stored | None:
        durable, stream = self._durable, self._stream
        while durable.redeliver:
            seq = durable.redeliver.pop(0)
            if seq in stream.messages:
                return stream.messages[seq]
        for seq in sorted(s for s in stream.messages if s > durable.cursor):
            durable.cursor = seq
            stored = stream.messages[seq]
            if matches(durable.spec.filter_subject, stored.subject):
                return stored
        return None

    def stop(self) -> None:
        self.stopping = True
        self._stream.wake()

    async def run(self, tasks: asyncio.TaskGroup) -> None:
        while not self.stopping:
            await self._slots.acquire()
            stored = self._next()
            while stored is None:
                # Clear before waiting: a message stored after `_next` sets it again.
                self._stream.changed.clear()
                await self._stream.changed.wait()
                if not self.active:  # stopped while waiting
                    self._slots.release()
                    return
                stored = self._next()
            self._durable.delivered[stored.seq] = self._durable.delivered.get(stored.seq, 0) + 1
            task = tasks.create_task(self._work(stored))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout: float) -> None:
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for task in pending:
                task.cancel()

    async def _work(self, stored: _Stored) -> None:
        try:
            item = self._item(stored)
            if item is not None:
                await self._run(self._handler(item), [stored], stored.subject)
        finally:
            self._slots.release()

    def _item(self, stored: _Stored) -> WorkItem[Any] | None:
        """The work item of `stored`; None (and the message terminated) when it does not decode."""
        try:
            message = decode(stored.data, stored.headers, self._type)
        except (DecodeError, BusError):
            self._settle(stored, ("term", 0.0))
            return None
        envelope = Envelope(stored.subject, message, Headers.from_wire(stored.headers))
        return WorkItem(envelope, stream_seq=stored.seq, delivered=self._durable.delivered[stored.seq])

    async def _run(self, call: Awaitable[None], stored: list[_Stored], what: str) -> None:
        """Await a handler `call`, then settle `stored` by how it ended, as the server would."""
        try:
            await call
        except Nak as nak:
            outcome = ("nak", nak.delay)
        except Term:
            outcome = ("term", 0.0)
        except asyncio.CancelledError:
            for each in stored:
                self._settle(each, ("nak", 0.0))
            raise
        except Exception:
            log.exception("work handler for %s failed; redelivering", what)
            outcome = ("nak", 0.0)
        else:
            outcome = ("ack", 0.0)
        for each in stored:
            self._settle(each, outcome)

    def _settle(self, stored: _Stored, outcome: tuple[str, float]) -> None:
        verb, delay = outcome
        if verb == "nak":
            asyncio.get_running_loop().call_later(delay, self._redeliver, stored.seq)
            return
        self._durable.delivered.pop(stored.seq, None)
        if self._stream.spec.retention is Retention.WORK_QUEUE:
            self._stream.messages.pop(stored.seq, None)

    def _redeliver(self, seq: int) -> None:
        self._durable.redeliver.append(seq)
        self._stream.wake()


class _FakeBatchWorker(_FakeWorker):
    """`consume_batches`: everything available (up to `max_batch`) handed over and settled at once."""

    def __init__(
        self,
        stream: _Stream,
        durable: _Durable,
        message_type: type[M],
        handler: BatchHandler[M],
        *,
        max_batch: int,
        linger: float,
    ) -> None:
        super().__init__(stream, durable, message_type, _never, 1)
        self._batch_handler: BatchHandler[Any] = handler
        self._max_batch = max_batch
        self._linger = linger
        self.handling = False

    async def run_batches(self) -> None:
        while not self.stopping:
            batch = self._take()
            while not batch:
                self._stream.changed.clear()
                await self._stream.changed.wait()
                if not self.active:  # stopped while waiting
                    return
                batch = self._take()
            self.handling = True
            try:
                await self._handle(batch)
            finally:
                self.handling = False
            if len(batch) < self._max_batch and self._linger:
                await asyncio.sleep(self._linger)

    def _take(self) -> list[_Stored]:
        batch: list[_Stored] = []
        while len(batch) < self._max_batch and (stored := self._next()) is not None:
            self._durable.delivered[stored.seq] = self._durable.delivered.get(stored.seq, 0) + 1
            batch.append(stored)
        return batch

    async def _handle(self, batch: list[_Stored]) -> None:
        items = {stored.seq: item for stored in batch if (item := self._item(stored)) is not None}
        if items:
            kept = [stored for stored in batch if stored.seq in items]
            await self._run(self._batch_handler(list(items.values())), kept, self._durable.spec.durable)


async def _never(item: WorkItem[Any]) -> None:
    raise AssertionError("a batch worker hands out batches only")  # pragma: no cover
