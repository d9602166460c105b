"""The NATS backend of `Bus`: the only module (with `_connect.py`) that imports `nats`."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from google.protobuf.message import Message
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.js import api as js_api
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue
from nats.js.object_store import OBJ_CHUNKS_PRE_TEMPLATE, OBJ_DIGEST_TYPE, OBJ_STREAM_TEMPLATE, ObjectStore

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
from atmosphere.bus._batches import FAILED_HANDLER_REDELIVERY_DELAY, BatchPuller, fetch, settle
from atmosphere.bus._codec import Headers, check_size, decode, encode, error_reply_too_large
from atmosphere.bus._direct import DirectReader
from atmosphere.bus._jetstream import ConsumerSpec, JetStreamLayout, RequiredLayout
from atmosphere.bus._provisioning import (
    LayoutProvisioner,
    WireNames,
    consumer_config,
    patiently,
)
from atmosphere.bus._router import Route, Router, run_route
from atmosphere.bus._subscription import QueueSubscription
from atmosphere.bus.errors import (
    BusError,
    DecodeError,
    Nak,
    NoRespondersError,
    NoStreamError,
    PayloadTooLargeError,
    RequestTimeoutError,
    StreamUnavailableError,
    Term,
    WrongLastSequenceError,
)
from atmosphere.bus.sizes import MAX_OBJECT_BYTES, data_budget

M = TypeVar("M", bound=Message)

log = logging.getLogger("atmosphere.bus")

_WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a publish whose expected last subject sequence did not match."""
# Subscriptions buffer at most this many messages before NATS reports a slow consumer.
_SUBSCRIPTION_PENDING_LIMIT = 65536
# Chunks of an object are at most this large (nats-py's default), and never over the data budget.
_OBJECT_CHUNK_BYTES = 128 * 1024
# Seconds `consume` waits for a provisioned consumer to be readable as it must be, before it fails.
_BIND_PATIENCE = 5.0
# How many times `kv_update` reads and writes again after another writer changed the key first.
_KV_UPDATE_ATTEMPTS = 32


class NatsBus(ConnectionLiveness, Bus):
    """A `Bus` over a connected nats-py client. Create it with `atmosphere.bus.connect`."""

    def __init__(self, client: Client, *, namespace: str = "") -> None:
        """Wrap `client`; every subject is prefixed with `namespace.` on the wire."""
        super().__init__()
        self._nc = client
        self._js: JetStreamContext = client.jetstream()
        self._prefix = f"{namespace}." if namespace else ""
        self._stream_prefix = _stream_prefix(namespace)
        self._kv: dict[str, KeyValue] = {}
        self._objects: dict[str, ObjectStore] = {}
        self._acks: dict[str, asyncio.Future[PublishAck]] = {}
        self._ack_prefix = ""
        self._ack_tokens = itertools.count()
        self._consumer_replicas: int | None = None
        """The replica count of the provisioned layout, for durable consumers (None: the stream's)."""
        self._direct = DirectReader(client)
        self._wire_names = WireNames(stream=self.stream_name, subject=self.wire_subject)
        self._provisioner = LayoutProvisioner(self._js, self._wire_names)
        """Replays: batched direct gets, no consumer per reader."""

    @property
    def client(self) -> Client:
        """The underlying nats-py client (for benchmarks and diagnostics)."""
        return self._nc

    @property
    def is_connected(self) -> bool:
        """Whether the client is connected right now."""
        return bool(self._nc.is_connected)

    @property
    def max_payload(self) -> int:
        """The server's `max_payload` from its INFO (payload plus headers, per message)."""
        return int(self._nc.max_payload)

    def _closed(self) -> bool:
        # Also before `connect`'s callback says so, and after we closed it ourselves.
        return self.lost or bool(self._nc.is_closed)

    def _checked(self, subject: str, data: bytes, wire: dict[str, str] | None) -> None:
        self._ensure_open(f"send on {subject!r}")
        check_size(subject, data, wire, self.max_payload)

    def wire_subject(self, subject: str) -> str:
        """The subject as sent to NATS (with the namespace prefix)."""
        return self._prefix + subject

    def stream_name(self, name: str) -> str:
        """The stream or bucket name as known to JetStream (with the namespace prefix)."""
        return self._stream_prefix + name

    def _logical(self, wire_subject: str) -> str:
        return wire_subject.removeprefix(self._prefix)

    async def publish(self, subject: str, message: Message, *, headers: Headers | None = None) -> None:
        """Publish without waiting (at most once)."""
        data = message.SerializeToString()
        wire = (headers.to_wire() or None) if headers else None
        self._checked(subject, data, wire)
        try:
            await self._nc.publish(self.wire_subject(subject), data, headers=wire)
        except nats.errors.Error as exc:
            msg = f"publish to {subject!r} failed: {exc}"
            raise BusError(msg) from exc

    async def request(
        self,
        subject: str,
        message: Message,
        reply_type: type[M],
        *,
        timeout: float = 5.0,
        headers: Headers | None = None,
    ) -> M:
        """Send a request and wait for its typed reply."""
        data, wire = encode(message, headers)
        self._checked(subject, data, wire)
        try:
            reply = await self._nc.request(self.wire_subject(subject), data, timeout=timeout, headers=wire)
        except nats.errors.NoRespondersError as exc:
            raise NoRespondersError(subject) from exc
        except nats.errors.TimeoutError as exc:
            raise RequestTimeoutError(subject, timeout) from exc
        except nats.errors.Error as exc:
            msg = f"request to {subject!r} failed: {exc}"
            raise BusError(msg) from exc
        return decode(reply.data, reply.headers, reply_type)

    @contextlib.asynccontextmanager
    async def subscribe(
        self, subject: str, message_type: type[M], *, queue: str | None = None
    ) -> AsyncIterator[Subscription[M]]:
        """Receive the messages on `subject` while the context is open."""
        subscription = QueueSubscription(message_type)

        async def on_message(msg: Msg) -> None:
            subscription.offer(self._logical(msg.subject), msg.data, msg.headers)

        sub = await self._nc.subscribe(
            self.wire_subject(subject),
            queue=queue or "",
            cb=on_message,
            pending_msgs_limit=_SUBSCRIPTION_PENDING_LIMIT,
        )
        try:
            yield subscription
        finally:
            subscription.close()
            await _unsubscribe(sub)

    @contextlib.asynccontextmanager
    async def serve(self, router: Router, *, queue: str | None = None, max_inflight: int = 256) -> AsyncIterator[None]:
        """Serve every route of `router`; on exit stop receiving and finish in-flight work."""
        # A fixed pool of workers fed by a bounded queue: cheaper per message than a task per
        # request, and when every worker is busy the queue fills, the subscription callback
        # waits, NATS buffers and finally drops (slow consumer) instead of this process growing.
        inbox: asyncio.Queue[tuple[Route[Any], Msg] | None] = asyncio.Queue(max_inflight)
        subs: list[NatsSubscription] = []
        async with asyncio.TaskGroup() as tasks:
            workers = [tasks.create_task(self._serve_worker(inbox)) for _ in range(max_inflight)]
            try:
                for route in router.routes:
                    subs.append(
                        await self._nc.subscribe(
                            self.wire_subject(route.subject),
                            queue=queue or "",
                            cb=_enqueue(route, inbox),
                            pending_msgs_limit=_SUBSCRIPTION_PENDING_LIMIT,
                        )
                    )
                await self._nc.flush()
                yield
            finally:
                for sub in subs:
                    await _unsubscribe(sub)
                for _ in workers:
                    await inbox.put(None)

    async def _serve_worker(self, inbox: asyncio.Queue[tuple[Route[Any], Msg] | None]) -> None:
        while (item := await inbox.get()) is not None:
            route, msg = item
            try:
                reply = await run_route(route, self._logical(msg.subject), msg.data, msg.headers)
                if reply is not None and msg.reply:
                    reply = self._fitting_reply(msg.subject, reply)
                    await self._nc.publish(msg.reply, reply[0], headers=reply[1])
            except Exception:
                log.exception("answering on %s failed", msg.subject)

    def _fitting_reply(
        self, subject: str, reply: tuple[bytes, dict[str, str] | None]
    ) -> tuple[bytes, dict[str, str] | None]:
        """`reply`, or a typed `Error` in its place when it would exceed the broker's limit.

        Sending it would make the server close this connection; the requester gets a clear
        error instead, and a responder that may answer big (history, files) pages its answers.
        """
        try:
            check_size(subject, reply[0], reply[1], self.max_payload)
        except PayloadTooLargeError as exc:
            log.warning("reply on %s refused: %s", subject, exc)
            return error_reply_too_large(exc)
        return reply

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
            if exc.err_code == _WRONG_LAST_SEQUENCE and headers and headers.expected_last_subject_seq is not None:
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
        inbox = await self._ack_inbox()
        token = str(next(self._ack_tokens))
        ack: asyncio.Future[PublishAck] = asyncio.get_running_loop().create_future()
        self._acks[token] = ack
        ack.add_done_callback(lambda _: self._acks.pop(token, None))
        try:
            await self._nc.publish(self.wire_subject(subject), data, reply=inbox + token, headers=wire)
        except nats.errors.Error as exc:
            ack.cancel()
            msg = f"jetstream publish to {subject!r} failed: {exc}"
            raise BusError(msg) from exc
        return ack

    async def _ack_inbox(self) -> str:
        if not self._ack_prefix:
            prefix = self._nc.new_inbox() + "."
            await self._nc.subscribe(prefix + "*", cb=self._on_ack, pending_msgs_limit=_SUBSCRIPTION_PENDING_LIMIT)
            self._ack_prefix = prefix
        return self._ack_prefix

    async def _on_ack(self, msg: Msg) -> None:
        ack = self._acks.pop(msg.subject[len(self._ack_prefix) :], None)
        if ack is None or ack.done():
            return  # given up on (and sent again), or a duplicate answer
        if (msg.headers or {}).get("Status") == "503":
            # No responders: usually a stream without a leader for a moment (the caller retries).
            ack.set_exception(StreamUnavailableError(msg.subject))
            return
        try:
            answer = json.loads(msg.data)
            if "error" in answer:
                reason = answer["error"].get("description", "refused")
                ack.set_exception(BusError(f"jetstream refused the message: {reason}"))
                return
            stream = str(answer["stream"]).removeprefix(self._stream_prefix)
            ack.set_result(PublishAck(stream=stream, seq=int(answer["seq"]), duplicate=bool(answer.get("duplicate"))))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            ack.set_exception(BusError(f"malformed jetstream acknowledgement: {exc}"))

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
        psub = await self._pull_subscribe(consumer, max_ack_pending=max(1000, max_inflight * 4))
        puller = _Puller(self, consumer, message_type, handler, max_inflight)
        try:
            async with asyncio.TaskGroup() as tasks:
                pull = tasks.create_task(puller.run(psub, tasks))
                heartbeat = tasks.create_task(puller.heartbeat())
                try:
                    yield puller
                finally:
                    puller.stop()
                    await pull
                    await puller.drain(drain_timeout)
                    heartbeat.cancel()
        finally:
            with contextlib.suppress(nats.errors.Error):
                await psub.unsubscribe()

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
        psub = await self._pull_subscribe(consumer, max_ack_pending=max(1000, max_batch * 4))
        puller = BatchPuller(consumer, message_type, handler, max_batch=max_batch, logical=self._logical, linger=linger)
        try:
            # In a task group, like `consume`: a loop that dies takes its service down (and the
            # supervisor or Kubernetes restarts it) rather than silently stopping the recording.
            async with asyncio.TaskGroup() as tasks:
                loop = tasks.create_task(puller.run(psub))
                try:
                    yield puller
                finally:
                    puller.stop()
                    # The fetch in progress ends within its 1 s expiry; the batch in hand may finish.
                    _, pending = await asyncio.wait({loop}, timeout=drain_timeout + 1.0)
                    for task in pending:
                        task.cancel()
        finally:
            with contextlib.suppress(nats.errors.Error):
                await psub.unsubscribe()

    async def _pull_subscribe(
        self, consumer: ConsumerSpec, *, max_ack_pending: int
    ) -> JetStreamContext.PullSubscription:
        stream = self.stream_name(consumer.stream)
        if consumer.provisioned:
            # The provisioner made it; this login may only bind to it (`bus.permissions`). Checked
            # first, as it is, waiting out a leader election (the service's start checked it too).
            await self._provisioner.verify(RequiredLayout(consumers=(consumer,)), timeout=_BIND_PATIENCE)
            return await self._js.pull_subscribe_bind(durable=consumer.durable, stream=stream)
        config = consumer_config(
            consumer,
            self._wire_names,
            max_ack_pending=consumer.max_ack_pending or max_ack_pending,
            replicas=self._consumer_replicas,
        )
        # Create or update: a durable left by an earlier version takes the current settings (its
        # filter above all: consumers of a work-queue stream must not overlap, so a stale filter
        # would keep a new consumer from being created at all).
        what = f"creating or updating consumer {consumer.durable!r} on {consumer.stream!r}"
        try:
            # Patiently, like provisioning: on a cluster that lost a node the meta leader that
            # creates consumers may still be being elected when the stream already takes messages.
            await patiently(lambda: self._js.add_consumer(stream, config), what)
        except nats.errors.Error as exc:
            msg = f"cannot create or update consumer {consumer.durable!r} on {consumer.stream!r}: {exc}"
            raise BusError(msg) from exc
        return await self._js.pull_subscribe_bind(durable=consumer.durable, stream=stream)

    async def consumer_state(self, stream: str, durable: str) -> ConsumerState:
        """How far the durable has got: its unacknowledged messages and its ack floor."""
        try:
            info = await self._js.consumer_info(self.stream_name(stream), durable)
        except nats.errors.Error as exc:
            msg = f"reading consumer {durable!r} of {stream!r} failed: {exc}"
            raise BusError(msg) from exc
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        return ConsumerState(pending=(info.num_pending or 0) + (info.num_ack_pending or 0), ack_floor=floor or 0)

    async def stream_last_seq(self, stream: str) -> int:
        """The newest message's sequence in `stream`."""
        try:
            info = await self._js.stream_info(self.stream_name(stream))
        except nats.errors.Error as exc:
            msg = f"reading stream {stream!r} failed: {exc}"
            raise BusError(msg) from exc
        return info.state.last_seq or 0

    async def stream_leader(self, stream: str) -> str:
        """The server leading `stream` and since when (its term), "" without a cluster."""
        try:
            info = await self._js.stream_info(self.stream_name(stream))
        except nats.errors.Error as exc:
            msg = f"reading stream {stream!r} failed: {exc}"
            raise BusError(msg) from exc
        if info.cluster is None or not info.cluster.leader:
            return ""
        # With the time it took the lead: a leader that lost it and won it back is another term.
        since = info.cluster.leader_since.isoformat() if info.cluster.leader_since else ""
        return f"{info.cluster.leader}@{since}" if since else info.cluster.leader

    async def last_message(self, stream: str, subject: str, message_type: type[M]) -> M | None:
        """The newest message `stream` holds for `subject`, or None."""
        try:
            raw = await self._js.get_last_msg(self.stream_name(stream), self.wire_subject(subject))
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
        stream_name, wire = self.stream_name(stream), self.wire_subject(subject)
        self._ensure_open(f"replay {subject!r}")
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
        stream_name, wire = self.stream_name(stream), self.wire_subject(subject)
        self._ensure_open(f"read {stream!r}")

        more_to_read = self._more_to_read(stream_name, wire, subject)
        stored = self._direct.read(stream_name, wire, through=through, more_to_read=more_to_read, start=after + 1)
        async with contextlib.aclosing(stored) as messages:
            async for raw in messages:
                subject_of = self._logical(str(raw.headers.get("Nats-Subject", wire)))
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
            await self._js.purge_stream(self.stream_name(stream), subject=self.wire_subject(subject))
        except nats.errors.Error as exc:
            msg = f"purging {subject!r} failed: {exc}"
            raise BusError(msg) from exc

    async def provision(self, layout: JetStreamLayout, *, by: str = "") -> None:
        """Create or update every stream, bucket and consumer of `layout`, its replication in place.

        On a cluster that is still electing leaders (just formed, or a node just lost) the
        JetStream API answers "unavailable" or not at all for a few seconds: provisioning is
        idempotent, so it is tried again for up to a minute (`_provisioning.patiently`).
        """
        self._consumer_replicas = layout.replication.replicas
        await self._provisioner.provision(layout, by=by)

    async def verify(self, required: RequiredLayout, *, timeout: float) -> str:
        """Wait until `required` exists, consumers as configured; who provisioned it (`_provisioning`)."""
        return await self._provisioner.verify(required, timeout=timeout)

    async def _bucket(self, bucket: str) -> KeyValue:
        kv = self._kv.get(bucket)
        if kv is None:
            try:
                kv = await self._js.key_value(self.stream_name(bucket))
            except nats.js.errors.BucketNotFoundError as exc:
                msg = f"bucket {bucket!r} is not provisioned"
                raise BusError(msg) from exc
            self._kv[bucket] = kv
        return kv

    async def kv_put(self, bucket: str, key: str, message: Message) -> None:
        """Store `message` under `key`."""
        kv = await self._bucket(bucket)
        data = message.SerializeToString()
        self._checked(f"$KV.{bucket}.{key}", data, None)
        try:
            await kv.put(key, data)
        except nats.errors.Error as exc:  # a broker away or not answering: the caller's BusError
            msg = f"storing {key!r} in bucket {bucket!r} failed: {exc}"
            raise BusError(msg) from exc

    async def kv_get(self, bucket: str, key: str, message_type: type[M]) -> M | None:
        """The value under `key`, or None."""
        kv = await self._bucket(bucket)
        try:
            entry = await kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):  # never written, or deleted
            return None
        return decode(entry.value or b"", None, message_type)

    async def kv_items(self, bucket: str, message_type: type[M]) -> dict[str, M]:
        """Every key and value of a bucket."""
        await self._bucket(bucket)
        # The keys come from the bucket stream's per-subject counts, answered by the server in
        # one reply. nats-py's `keys()` walks a watcher that can report "no more keys" before
        # the first one arrived on a busy machine, which reads as an empty bucket.
        name = self.stream_name(bucket)
        prefix = f"$KV.{name}."
        try:
            info = await self._js.stream_info(f"KV_{name}", subjects_filter=f"{prefix}>")
        except nats.errors.Error as exc:
            msg = f"listing bucket {bucket!r} failed: {exc}"
            raise BusError(msg) from exc
        keys = sorted(subject.removeprefix(prefix) for subject in (info.state.subjects or {}))
        items: dict[str, M] = {}
        for key in keys:
            value = await self.kv_get(bucket, key, message_type)
            if value is not None:
                items[key] = value
        return items

    async def kv_delete(self, bucket: str, key: str) -> None:
        """Remove `key` (a delete marker: readers see no value; nothing happens when it is not there)."""
        kv = await self._bucket(bucket)
        try:
            await kv.delete(key)
        except nats.errors.Error as exc:
            msg = f"deleting {key!r} from bucket {bucket!r} failed: {exc}"
            raise BusError(msg) from exc

    async def kv_update(
        self, bucket: str, key: str, message_type: type[M], change: Callable[[M | None], M | None]
    ) -> M | None:
        """Read the key and its revision, change it, write it only if that revision is still the newest."""
        kv = await self._bucket(bucket)
        for _ in range(_KV_UPDATE_ATTEMPTS):
            try:
                current, revision = await _kv_entry(kv, key, message_type)
                new = change(current)
                if new is current:
                    return current
                if new is None:
                    await kv.delete(key, last=revision)
                    return None
                data = new.SerializeToString()
                self._checked(f"$KV.{bucket}.{key}", data, None)
                await kv.update(key, data, last=revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue  # another writer came first: change its value instead
            except nats.js.errors.APIError as exc:
                if exc.err_code in (_WRONG_LAST_SEQUENCE, 10164):  # 10164: the same, without the sequence
                    continue  # a delete that lost the race (nats-py reports only updates as such)
                msg = f"updating {key!r} in bucket {bucket!r} failed: {exc}"
                raise BusError(msg) from exc
            except nats.errors.Error as exc:
                msg = f"updating {key!r} in bucket {bucket!r} failed: {exc}"
                raise BusError(msg) from exc
            return new
        msg = f"updating {key!r} in bucket {bucket!r} failed: other writers changed it {_KV_UPDATE_ATTEMPTS} times over"
        raise BusError(msg)

    # -- object store ------------------------------------------------------------------------

    async def _object_bucket(self, bucket: str) -> ObjectStore:
        store = self._objects.get(bucket)
        if store is None:
            try:
                store = await self._js.object_store(self.stream_name(bucket))
            except nats.js.errors.BucketNotFoundError as exc:
                msg = f"object bucket {bucket!r} is not provisioned"
                raise BusError(msg) from exc
            self._objects[bucket] = store
        return store

    async def object_put(self, bucket: str, name: str, data: bytes) -> None:
        """Store `data` under `name`, in chunks that each fit in one message."""
        self._ensure_open(f"store {name!r} in {bucket!r}")
        if len(data) > MAX_OBJECT_BYTES:
            raise PayloadTooLargeError(f"object {bucket}/{name}", len(data), MAX_OBJECT_BYTES)
        store = await self._object_bucket(bucket)
        # Each chunk is one message: nats-py's default size may exceed a lowered `max_payload`.
        chunk = min(_OBJECT_CHUNK_BYTES, data_budget(self.max_payload))
        meta = js_api.ObjectMeta(name=name, options=js_api.ObjectMetaOptions(max_chunk_size=chunk))
        try:
            await store.put(name, data, meta=meta)
        except nats.errors.Error as exc:
            msg = f"storing object {name!r} in {bucket!r} failed: {exc}"
            raise BusError(msg) from exc

    async def object_get(self, bucket: str, name: str) -> bytes | None:
        """The whole object under `name`, or None when there is none."""
        store = await self._object_bucket(bucket)
        try:
            info = await store.get_info(name)
        except nats.js.errors.NotFoundError:
            return None
        except nats.errors.Error as exc:
            msg = f"reading object {name!r} of {bucket!r} failed: {exc}"
            raise BusError(msg) from exc
        size = info.size or 0
        if size > MAX_OBJECT_BYTES:
            msg = f"object {name!r} of {bucket!r} is {size} bytes, over the {MAX_OBJECT_BYTES} the bus reads"
            raise BusError(msg)
        if size == 0:
            return b""
        return await self._object_chunks(self.stream_name(bucket), info, size)

    async def _object_chunks(self, bucket_name: str, info: js_api.ObjectInfo, size: int) -> bytes:
        """An object's chunks joined, checked against its size and digest.

        Read by batched direct gets, as replays are: no consumer, so a login that may not create
        one (`atmosphere.bus.permissions`) reads objects all the same. Not with nats-py's
        `ObjectStore.get`, which makes an ordered consumer, waits forever for a chunk that never
        comes and copies everything received so far on every chunk.
        """
        stream = OBJ_STREAM_TEMPLATE.format(bucket=bucket_name)
        chunks = OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=bucket_name, obj=info.nuid)
        data = bytearray()
        digest = hashlib.sha256()

        async def more_to_read(_next_seq: int) -> bool:
            return len(data) < size  # chunks are stored before their object's info: a lagging replica

        # Every chunk is stored before the info that names them, so all of them are at most the
        # stream's newest sequence now.
        through = await self._stream_last_seq_of(stream)
        try:
            read = self._direct.read(stream, chunks, through=through, more_to_read=more_to_read)
            async with contextlib.aclosing(read) as stored:
                async for chunk in stored:
                    data += chunk.data
                    digest.update(chunk.data)
                    if len(data) >= size:
                        break
        except BusError as exc:
            msg = f"reading object {info.name!r} stalled after {len(data)} of {size} bytes ({exc})"
            raise BusError(msg) from exc
        if len(data) != size or not _digest_matches(info.digest or "", digest.digest()):
            msg = f"object {info.name!r} did not arrive whole ({len(data)} of {size} bytes, or a wrong digest)"
            raise BusError(msg)
        return bytes(data)

    async def _stream_last_seq_of(self, stream_name: str) -> int:
        try:
            info = await self._js.stream_info(stream_name)
        except nats.errors.Error as exc:
            msg = f"reading stream {stream_name!r} failed: {exc}"
            raise BusError(msg) from exc
        return info.state.last_seq or 0

    async def object_delete(self, bucket: str, name: str) -> None:
        """Delete the object under `name`; nothing happens when there is none."""
        store = await self._object_bucket(bucket)
        try:
            await store.delete(name)
        except nats.js.errors.NotFoundError:
            return
        except nats.errors.Error as exc:
            msg = f"deleting object {name!r} of {bucket!r} failed: {exc}"
            raise BusError(msg) from exc


def _enqueue(route: Route[Any], inbox: asyncio.Queue[tuple[Route[Any], Msg] | None]) -> Callable[[Msg], Any]:
    async def on_message(msg: Msg) -> None:
        await inbox.put((route, msg))

    return on_message


class _Puller(Consumer):
    """The fetch loop of one durable pull consumer and the lifecycle of each work item."""

    def __init__(
        self,
        bus: NatsBus,
        spec: ConsumerSpec,
        message_type: type[M],
        handler: WorkHandler[M],
        max_inflight: int,
    ) -> None:
        self._bus = bus
        self._spec = spec
        self._type: type[Message] = message_type
        self._handler: WorkHandler[Any] = handler
        self._slots = asyncio.Semaphore(max_inflight)
        self._max_inflight = max_inflight
        self._inflight = 0
        self._stopping = asyncio.Event()
        self._active = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._started: dict[int, tuple[Msg, float]] = {}
        """In-flight messages and when their handler started (for the heartbeat)."""

    @property
    def active(self) -> bool:
        return self._active and not self._stopping.is_set()

    async def heartbeat(self) -> None:
        """Keep long-running items alive: one loop for all of them, not a task per message."""
        interval = self._spec.heartbeat_seconds or max(0.5, self._spec.ack_wait_seconds / 3)
        while True:
            await asyncio.sleep(interval)
            due = time.monotonic() - interval
            for msg, started in list(self._started.values()):
                if started <= due:
                    with contextlib.suppress(nats.errors.Error):
                        await msg.in_progress()

    def stop(self) -> None:
        self._stopping.set()

    async def run(self, psub: JetStreamContext.PullSubscription, tasks: asyncio.TaskGroup) -> None:
        self._active = True
        failures = 0
        while not self._stopping.is_set():
            # Wait for at least one free slot, then ask for as many messages as there are.
            await self._slots.acquire()
            self._slots.release()
            free = self._max_inflight - self._inflight if self._spec.batch_fetch else 1
            msgs, failures = await fetch(
                psub, free, durable=self._spec.durable, stopping=self._stopping, failures=failures
            )
            for msg in msgs:
                await self._slots.acquire()
                self._inflight += 1
                work = tasks.create_task(self._work(msg))
                self._tasks.add(work)
                work.add_done_callback(self._tasks.discard)
        self._active = False

    async def drain(self, timeout: float) -> None:
        """Let in-flight handlers finish for `timeout` seconds, then cancel them.

        A cancelled handler's message is nak'ed, so another worker takes it over at once.
        """
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for task in pending:
                task.cancel()

    async def _work(self, msg: Msg) -> None:
        self._started[id(msg)] = (msg, time.monotonic())
        try:
            await self._run_handler(msg)
        finally:
            self._started.pop(id(msg), None)
            self._inflight -= 1
            self._slots.release()

    async def _run_handler(self, msg: Msg) -> None:
        meta = msg.metadata
        try:
            message = decode(msg.data, msg.headers, self._type)
        except (DecodeError, BusError) as exc:
            log.error("terminating undecodable work item on %s: %s", msg.subject, exc)
            await settle(msg.term())
            return
        envelope = Envelope(self._bus._logical(msg.subject), message, Headers.from_wire(msg.headers))
        item = WorkItem(envelope, stream_seq=meta.sequence.stream, delivered=meta.num_delivered)
        try:
            await self._handler(item)
        except Nak as nak:
            await settle(msg.nak(delay=nak.delay))
        except Term as term:
            log.warning("terminating work item on %s: %s", msg.subject, term.reason)
            await settle(msg.term())
        except asyncio.CancelledError:
            await settle(msg.nak())
            raise
        except Exception:
            log.exception("work handler for %s failed; redelivering", msg.subject)
            await settle(msg.nak(delay=FAILED_HANDLER_REDELIVERY_DELAY))
        else:
            await settle(msg.ack_sync(timeout=5.0) if self._spec.confirm_ack else msg.ack())


async def _unsubscribe(sub: NatsSubscription) -> None:
    with contextlib.suppress(nats.errors.Error):
        await sub.unsubscribe()


async def _kv_entry(kv: KeyValue, key: str, message_type: type[M]) -> tuple[M | None, int]:
    """The value under `key` (None: none) and the revision a write after it must name."""
    try:
        entry = await kv.get(key)
    except nats.js.errors.KeyNotFoundError as exc:
        # A deleted key's marker is its newest revision (what the next write follows); a key
        # never written (or expired) has none, and a write naming revision 0 creates it.
        marker = exc.entry
        return None, (marker.revision or 0) if marker is not None else 0
    return decode(entry.value or b"", None, message_type), entry.revision or 0


def _stream_prefix(namespace: str) -> str:
    if not namespace:
        return ""
    return namespace.upper().replace(".", "_").replace("-", "_") + "_"


def _digest_matches(recorded: str, sha256: bytes) -> bool:
    """Whether an object's recorded digest (`SHA-256=<url-safe base64>`) is `sha256`."""
    if not recorded.upper().startswith(OBJ_DIGEST_TYPE):
        return False
    try:
        return base64.urlsafe_b64decode(recorded[len(OBJ_DIGEST_TYPE) :]) == sha256
    except ValueError:
        return False
